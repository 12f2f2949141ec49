//! Issue 42, hints that hid a refusal: `list_files` without a `session_id` from a client that
//! keeps no connection between calls (MCP 2026-07-28 over HTTP) answered an empty listing
//! with `isError: false`, which a model may take for "no files". Through the real server and
//! raw 2026-07-28 requests: it is now a refusal naming the argument, and with the
//! `session_id` a listing as before.

use crate::mcp_support;

use serde_json::{json, Value};

/// One `tools/call` at 2026-07-28 (no protocol session): the result.
async fn call(url: &str, tool: &str, args: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": args,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "hints", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    }});
    let text = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", tool)
        .body(body.to_string())
        .send()
        .await
        .expect("the server answers")
        .text()
        .await
        .unwrap();
    let msg: Value = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or_else(|| panic!("no response: {text}"))
    });
    assert!(
        msg.get("error").is_none(),
        "a tool result, not a protocol error: {msg}"
    );
    msg["result"].clone()
}

fn text_of(r: &Value) -> String {
    r["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn list_files_without_a_session_is_a_refusal_naming_session_id() {
    let tenant = "t-hints-list";
    let _clean = mcp_support::common::remove_on_drop(tenant);
    let s = mcp_support::server(tenant).await;
    let url = s.url("/mcp");

    let r = call(&url, "list_files", json!({})).await;
    let text = text_of(&r);
    assert_eq!(r["isError"], true, "a refusal, not an empty listing: {r}");
    assert!(
        text.contains("`session_id`") && text.contains("not an empty listing"),
        "{text}"
    );
    assert!(r.get("structuredContent").is_none(), "no listing: {r}");

    // With the session_id write_file returned: the listing, not an error.
    let w = call(
        &url,
        "write_file",
        json!({"path": "a.txt", "content": "hi"}),
    )
    .await;
    assert_ne!(w["isError"], true, "{w}");
    let sid = w["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a session_id: {w}"))
        .to_string();
    let r = call(&url, "list_files", json!({"session_id": sid})).await;
    assert_ne!(r["isError"], true, "{r}");
    assert_eq!(r["structuredContent"]["files"][0]["path"], "a.txt", "{r}");
    assert_eq!(r["structuredContent"]["session_id"], sid.as_str());
    s.finish().await;
}
