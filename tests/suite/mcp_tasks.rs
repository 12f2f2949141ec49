//! Long runs as MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663), driven
//! over raw Streamable HTTP at protocol 2026-07-28 (no protocol session: every request on its
//! own, the client's capabilities in each request's `_meta`), as a client that declares the
//! extension does. The official Python SDK (2.3.0) has no client side for tasks, hence raw
//! HTTP. A task-augmented `execute_code` of `time.sleep(90)` ends as a completed task whose
//! `tasks/get` inlines the result; `tasks/cancel` stops the run and its container; a task
//! run may take a timeout over the server's maximum for calls (up to 30 minutes); a client
//! that does not declare the extension gets a plain result.

use crate::mcp_support;

use std::time::Duration;

use mcp_code_executor::app::Settings;
use mcp_support::*;
use serde_json::{json, Value};

const TASKS: &str = "io.modelcontextprotocol/tasks";

/// One JSON-RPC request at 2026-07-28, with `caps` as the client's capabilities; the
/// response's `result` or `error` object.
async fn rpc(url: &str, method: &str, params: Value, caps: Value) -> Value {
    crate::mcp_support::raw_2026(url, method, params, caps, &[]).await
}

fn with_tasks() -> Value {
    json!({ "extensions": { TASKS: {} } })
}

/// Poll tasks/get until the task is terminal (bounded), returning the last answer.
async fn wait_terminal(url: &str, id: &str, limit: Duration) -> Value {
    let t0 = std::time::Instant::now();
    loop {
        let t = rpc(url, "tasks/get", json!({ "taskId": id }), with_tasks()).await;
        let status = t["status"]
            .as_str()
            .unwrap_or_else(|| panic!("tasks/get: {t}"));
        if ["completed", "failed", "cancelled"].contains(&status) {
            return t;
        }
        assert_eq!(status, "working", "{t}");
        assert!(
            t0.elapsed() < limit,
            "task {id} still {status} after {limit:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn result_text(r: &Value) -> String {
    r["content"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_long_run_as_a_task_completes_past_the_call_maximum() {
    // Calls may ask for at most 10 s here; a task run may ask for more (it sleeps twice
    // that: the call maximum is what it outlives, not a wall-clock figure; it was 60 s and
    // a 90 s sleep, a minute and a half of CI spent waiting).
    let settings = Settings {
        max_timeout: Duration::from_secs(10),
        ..Settings::default()
    };
    let s = server_with("t-task-long", settings).await;
    let url = s.url("/mcp");

    // The server says it offers the extension.
    let d = rpc(&url, "server/discover", json!({}), with_tasks()).await;
    assert!(d["capabilities"]["extensions"][TASKS].is_object(), "{d}");

    let code = "import time\nprint('started', flush=True)\ntime.sleep(20)\nprint('slept 20 s')";
    let created = rpc(
        &url,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": code, "timeout": 40}}),
        with_tasks(),
    )
    .await;
    assert_eq!(created["resultType"], "task", "{created}");
    assert_eq!(created["status"], "working", "{created}");
    let id = created["taskId"].as_str().expect("taskId").to_string();
    // The result is kept past the run: the TTL covers the timeout and then some.
    assert!(created["ttlMs"].as_u64().unwrap() >= 40_000, "{created}");

    let done = wait_terminal(&url, &id, Duration::from_secs(400)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let r = &done["result"];
    assert_eq!(r["isError"], false, "{done}");
    let text = result_text(r);
    assert!(text.contains("slept 20 s"), "{text}");
    assert!(!text.contains("capped"), "a task may run 40 s: {text}");
    assert_eq!(r["structuredContent"]["timeout_seconds"], 40.0, "{r}");
    // Polling again after the end still answers (the result stays for its TTL).
    let again = rpc(&url, "tasks/get", json!({ "taskId": id }), with_tasks()).await;
    assert_eq!(again["status"], "completed", "{again}");

    // The same call without the extension is a plain result, its timeout capped at 10 s.
    let plain = rpc(
        &url,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": "print(1)", "timeout": 40}}),
        json!({}),
    )
    .await;
    assert!(plain.get("taskId").is_none(), "{plain}");
    assert!(
        result_text(&plain).contains("capped at the server maximum of 10 s"),
        "{plain}"
    );
    // And tasks/* without the extension is refused (-32021), an unknown task id is -32602.
    let refused = rpc(&url, "tasks/get", json!({ "taskId": id }), json!({})).await;
    assert_eq!(refused["error"]["code"], -32021, "{refused}");
    let unknown = rpc(&url, "tasks/get", json!({ "taskId": "nope" }), with_tasks()).await;
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    s.finish().await;
}

#[tokio::test]
async fn cancelling_a_task_stops_the_run_and_removes_its_container() {
    let s = server("t-task-cancel").await;
    let url = s.url("/mcp");
    let created = rpc(&url,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": "import time\ntime.sleep(600)", "timeout": 900}}),
        with_tasks(),
    )
    .await;
    let id = created["taskId"].as_str().expect("taskId").to_string();
    // Wait until the run's container exists.
    let t0 = std::time::Instant::now();
    while common::containers_of("t-task-cancel").is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no container started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ack = rpc(&url, "tasks/cancel", json!({ "taskId": id }), with_tasks()).await;
    assert_eq!(ack["resultType"], "complete", "{ack}");
    let done = wait_terminal(&url, &id, Duration::from_secs(60)).await;
    assert_eq!(done["status"], "cancelled", "{done}");
    // The container went with it (well before the 600 s sleep could end).
    s.sandbox_drained_within(Duration::from_secs(30)).await;
    s.finish().await;
}

#[tokio::test]
async fn execute_python_as_a_task_keeps_its_session() {
    let s = server("t-task-py").await;
    let url = s.url("/mcp");
    let created = rpc(
        &url,
        "tools/call",
        json!({"name": "execute_python", "arguments": {"code": "x = 41"}}),
        with_tasks(),
    )
    .await;
    let id = created["taskId"].as_str().expect("taskId").to_string();
    let done = wait_terminal(&url, &id, Duration::from_secs(120)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let sid = done["result"]["structuredContent"]["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let next = rpc(
        &url,
        "tools/call",
        json!({"name": "execute_python", "arguments": {"code": "x + 1", "session_id": sid}}),
        json!({}),
    )
    .await;
    assert_eq!(next["structuredContent"]["stdout"], "42\n", "{next}");
    // install_dependencies is a task too (here refused: this server has no managed
    // environment). A tool error is a completed task whose result has isError, not a failed
    // task (failed is for protocol errors).
    let created = rpc(
        &url,
        "tools/call",
        json!({"name": "install_dependencies", "arguments": {"packages": ["six"]}}),
        with_tasks(),
    )
    .await;
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().unwrap().to_string();
    let done = wait_terminal(&url, &id, Duration::from_secs(300)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"]["isError"], true, "{done}");
    assert!(
        result_text(&done["result"]).contains("Nothing was installed"),
        "{done}"
    );
    s.finish().await;
}
