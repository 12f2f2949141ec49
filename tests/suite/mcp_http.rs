//! The MCP tools over Streamable HTTP, through rmcp's real client, against a real server with
//! the real Docker backend. Every test checks at the end that none of its containers is left.

use crate::mcp_support;

use std::time::Duration;

use mcp_support::{call, is_error, server, structured, text, try_call};
use serde_json::json;

#[tokio::test]
async fn tools_are_listed_with_schemas_and_server_info() {
    let s = server("t-mcp-list").await;
    let client = s.client().await;
    let info = client.peer_info().expect("server info");
    assert_eq!(info.server_info.as_ref().unwrap().name, "mcp-code-executor");
    assert!(info
        .instructions
        .as_deref()
        .unwrap_or("")
        .contains("initialize_code_file"));
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for (tool, required) in [
        ("execute_code", vec!["code"]),
        ("initialize_code_file", vec!["content"]),
        ("append_to_code_file", vec!["file_path", "content"]),
        ("execute_code_file", vec!["file_path"]),
        ("read_code_file", vec!["file_path"]),
        ("install_dependencies", vec!["packages"]),
        ("install_package", vec!["package"]),
        ("check_installed_packages", vec!["packages"]),
        ("configure_environment", vec!["type"]),
        ("get_environment_config", vec![]),
    ] {
        let t = tools
            .iter()
            .find(|t| t.name == tool)
            .unwrap_or_else(|| panic!("{tool} missing from {names:?}"));
        assert!(
            t.description.as_deref().unwrap_or("").len() > 40,
            "{tool} has a real description"
        );
        let schema = serde_json::Value::Object((*t.input_schema).clone());
        let req: Vec<&str> = schema["required"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        assert_eq!(req, required, "{tool}: {schema}");
    }
    assert_eq!(tools.len(), 15, "{names:?}");
    let exec = tools.iter().find(|t| t.name == "execute_code").unwrap();
    let schema = serde_json::Value::Object((*exec.input_schema).clone());
    for arg in ["code", "filename", "timeout"] {
        assert!(schema["properties"][arg].is_object(), "{arg}: {schema}");
    }
    let out =
        serde_json::Value::Object((**exec.output_schema.as_ref().expect("outputSchema")).clone());
    // Every outcome field of the engine, and the stored file_path.
    for field in [
        "exit_code",
        "signal",
        "timed_out",
        "oom_killed",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "duration_ms",
        "cpu_ms",
        "peak_memory_bytes",
        "file_path",
    ] {
        assert!(out["properties"][field].is_object(), "{field}: {out}");
    }
    let cfg = tools
        .iter()
        .find(|t| t.name == "configure_environment")
        .unwrap();
    let schema = serde_json::Value::Object((*cfg.input_schema).clone());
    for arg in ["type", "conda_name", "venv_path", "uv_venv_path"] {
        assert!(schema["properties"][arg].is_object(), "{arg}: {schema}");
    }
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn execute_code_runs_numpy_and_stores_the_code() {
    let s = server("t-mcp-numpy").await;
    let client = s.client().await;
    let r = call(
        &client,
        "execute_code",
        json!({"code": "import numpy as np; print(np.random.rand(3,3))", "filename": "matrix_gen"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["success"], true);
    let rows: Vec<&str> = v["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(rows.len(), 3, "{v}");
    assert!(rows[0].starts_with("[["), "{v}");
    assert!(text(&r).starts_with("exit code 0"), "{}", text(&r));
    let path = v["file_path"].as_str().unwrap();
    let name = std::path::Path::new(path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    assert!(
        name.starts_with("matrix_gen_") && name.ends_with(".py"),
        "{path}"
    );
    assert!(path.starts_with(s.storage_dir.canonicalize().unwrap().to_str().unwrap()));
    let stored = std::fs::read_to_string(path).unwrap();
    assert!(stored.contains("np.random.rand"));
    // the stored copy runs again by file_path
    let again = call(&client, "execute_code_file", json!({"file_path": path})).await;
    assert!(!is_error(&again), "{}", text(&again));
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn incremental_flow_initialize_append_read_execute() {
    let s = server("t-mcp-incr").await;
    let client = s.client().await;
    let r = call(
        &client,
        "initialize_code_file",
        json!({"content": "def main():\n    total = 0\n", "filename": "my_script"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let path = structured(&r)["file_path"].as_str().unwrap().to_string();
    let r = call(
        &client,
        "append_to_code_file",
        json!({"file_path": path, "content": "    for i in range(10):\n        total += i\n"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    // a bare file name works as well as the full path
    let name = std::path::Path::new(&path)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let r = call(
        &client,
        "append_to_code_file",
        json!({"file_path": name, "content": "    print('total', total)\n\nmain()\n"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&client, "read_code_file", json!({"file_path": path})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let content = structured(&r)["content"].as_str().unwrap().to_string();
    assert_eq!(
        content,
        "def main():\n    total = 0\n    for i in range(10):\n        total += i\n    print('total', total)\n\nmain()\n"
    );
    let r = call(&client, "execute_code_file", json!({"file_path": path})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "total 45\n");
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn paths_outside_the_storage_dir_are_refused() {
    let s = server("t-mcp-trav").await;
    let client = s.client().await;
    // a symlink planted inside the storage directory, pointing at a file outside it
    let secret = s.storage_dir.with_extension("secret");
    std::fs::write(&secret, "print('top secret')\n").unwrap();
    std::os::unix::fs::symlink(&secret, s.storage_dir.join("planted.py")).unwrap();
    let planted = s.storage_dir.join("planted.py").display().to_string();
    for (tool, path, want) in [
        (
            "read_code_file",
            "/etc/passwd",
            "outside the code storage directory",
        ),
        ("read_code_file", "../../x", "not allowed"),
        ("read_code_file", planted.as_str(), "symbolic link"),
        ("read_code_file", "planted.py", "symbolic link"),
        ("execute_code_file", "/etc/passwd", "outside"),
        ("execute_code_file", "planted.py", "symbolic link"),
        ("append_to_code_file", "/etc/passwd", "outside"),
        ("append_to_code_file", "../../x", "not allowed"),
        ("append_to_code_file", "planted.py", "symbolic link"),
        ("read_code_file", "x\u{0}.py", "NUL"),
    ] {
        // Only append_to_code_file takes `content` (an unknown argument is a protocol error).
        let args = if tool == "append_to_code_file" {
            json!({"file_path": path, "content": "print(1)\n"})
        } else {
            json!({ "file_path": path })
        };
        let r = call(&client, tool, args).await;
        assert!(
            is_error(&r),
            "{tool} {path:?} was not refused: {}",
            text(&r)
        );
        assert!(text(&r).contains(want), "{tool} {path:?}: {}", text(&r));
        assert!(!text(&r).contains("root:"), "leaked /etc/passwd");
    }
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "print('top secret')\n"
    );
    let _ = std::fs::remove_file(&secret);
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn failures_of_the_code_are_tool_errors_with_output() {
    let s = server("t-mcp-fail").await;
    let client = s.client().await;
    let r = call(
        &client,
        "execute_code",
        json!({"code": "import sys\nprint('partial')\nprint('bad', file=sys.stderr)\nsys.exit(3)\n"}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stdout"], "partial\n");
    assert_eq!(v["stderr"], "bad\n");
    assert!(text(&r).starts_with("exit code 3"), "{}", text(&r));
    assert!(text(&r).contains("--- stderr ---\nbad"), "{}", text(&r));

    let r = call(
        &client,
        "execute_code",
        json!({"code": "import time; time.sleep(30)", "timeout": 1.5}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["timed_out"], true, "{}", text(&r));
    assert!(text(&r).starts_with("timed out"), "{}", text(&r));

    // a timeout above the server's maximum is capped, and the result says so
    let r = call(
        &client,
        "execute_code",
        json!({"code": "print('ok')", "timeout": 1e6}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["timeout_seconds"], 300.0);
    assert!(
        text(&r).contains("capped at the server maximum"),
        "{}",
        text(&r)
    );
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn protocol_errors_for_unknown_tools_and_malformed_arguments() {
    let s = server("t-mcp-proto").await;
    let client = s.client().await;
    let e = try_call(&client, "no_such_tool", json!({}))
        .await
        .unwrap_err();
    assert!(
        format!("{e}").contains("-32602")
            || format!("{e:?}").contains("INVALID_PARAMS")
            || format!("{e}").contains("not found"),
        "{e:?}"
    );
    for (tool, args, want) in [
        ("execute_code", json!({}), "code"),
        ("execute_code", json!({"code": 42}), "`code`"),
        (
            "execute_code",
            json!({"code": "print(1)", "timeout": "soon"}),
            "`timeout`",
        ),
        (
            "execute_code",
            json!({"code": "print(1)", "timeout": -1}),
            "`timeout`",
        ),
        (
            "append_to_code_file",
            json!({"file_path": "x.py"}),
            "content",
        ),
        (
            "check_installed_packages",
            json!({"packages": "numpy"}),
            "`packages`",
        ),
        (
            "check_installed_packages",
            json!({"packages": ["numpy; rm -rf /"]}),
            "packages[0]",
        ),
        ("configure_environment", json!({"type": "docker"}), "`type`"),
        // Unknown (misspelt) arguments are refused, naming them and the accepted ones.
        (
            "execute_code",
            json!({"code": "print(1)", "timout": 5}),
            "unknown argument `timout`; it accepts `code`, `filename`, `session_id`, `timeout`",
        ),
        (
            "execute_python",
            json!({"code": "1", "cwd": "/"}),
            "unknown argument `cwd`",
        ),
        (
            "write_file",
            json!({"path": "a", "content": "b", "mode": "append"}),
            "`mode`",
        ),
        (
            "get_environment_config",
            json!({"verbose": true}),
            "takes no arguments",
        ),
    ] {
        let e = try_call(&client, tool, args.clone()).await.unwrap_err();
        let msg = format!("{e}");
        match e {
            rmcp::ServiceError::McpError(d) => {
                assert_eq!(
                    d.code,
                    rmcp::model::ErrorCode::INVALID_PARAMS,
                    "{tool} {args}: {msg}"
                );
                assert!(d.message.contains(want), "{tool} {args}: {}", d.message);
            }
            other => panic!("{tool} {args}: expected invalid_params, got {other:?}"),
        }
    }
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn environment_tools_answer_for_the_default_environment() {
    let s = server("t-mcp-http-env").await;
    let client = s.client().await;
    let r = call(&client, "get_environment_config", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["type"], "default");
    assert_eq!(v["python"], "/usr/bin/python3");
    assert_eq!(v["read_only"], true);
    assert!(
        v["image"].as_str().unwrap().contains("mcp-code-executor"),
        "{v}"
    );

    let r = call(
        &client,
        "check_installed_packages",
        json!({"packages": ["numpy", "non_existent_package"]}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["packages"][0]["name"], "numpy");
    assert_eq!(v["packages"][0]["installed"], true, "{v}");
    assert!(v["packages"][0]["version"].as_str().unwrap().contains('.'));
    assert_eq!(v["packages"][1]["installed"], false, "{v}");
    assert!(
        text(&r).contains("non_existent_package: not installed"),
        "{}",
        text(&r)
    );

    let r = call(
        &client,
        "install_dependencies",
        json!({"packages": ["pandas"]}),
    )
    .await;
    assert!(is_error(&r), "install must not pretend to succeed");
    assert!(text(&r).contains("not available"), "{}", text(&r));
    let r = call(
        &client,
        "configure_environment",
        json!({"type": "conda", "conda_name": "x"}),
    )
    .await;
    assert!(is_error(&r));
    assert!(text(&r).contains("not available"), "{}", text(&r));
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn twenty_concurrent_calls_are_all_answered() {
    let s = server("t-mcp-conc").await;
    let client = std::sync::Arc::new(s.client().await);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            call(
                &client,
                "execute_code",
                json!({"code": format!("print({i} * {i})")}),
            )
            .await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let r = t.await.unwrap();
        assert!(!is_error(&r), "{}", text(&r));
        assert_eq!(structured(&r)["stdout"], format!("{}\n", i * i));
    }
    s.finish().await;
}

#[tokio::test]
async fn oversized_and_malformed_http_requests_are_refused_cleanly() {
    let s = server("t-mcp-body").await;
    let http = reqwest::Client::new();
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"execute_code","arguments":{{"code":"{}"}}}}}}"#,
        "x".repeat(10 << 20)
    );
    let r = http
        .post(s.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413, "{:?}", r.text().await);
    let r = http
        .post(s.url("/messages?sessionId=none"))
        .header("content-type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // not JSON at all: a JSON-RPC parse error
    let r = http
        .post(s.url("/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    // DNS-rebinding guard
    let r = http
        .get(s.url("/sse"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = http
        .post(s.url("/mcp"))
        .header("host", "evil.example")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "{:?}", r.text().await);
    // the server still works after all that
    let client = s.client().await;
    let r = call(
        &client,
        "execute_code",
        json!({"code": "print('still here')"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "still here\n");
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn cancelling_a_call_stops_the_run_and_leaves_no_container() {
    let s = server("t-mcp-cancel").await;
    let recorder = mcp_support::ProgressRecorder::default();
    let client = rmcp::ServiceExt::serve(
        recorder.clone(),
        rmcp::transport::StreamableHttpClientTransport::from_uri(s.url("/mcp")),
    )
    .await
    .unwrap();
    let params = rmcp::model::CallToolRequestParams::new("execute_code").with_arguments(
        json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(120)\n"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let handle = client
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(params)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    // wait until the code runs, then cancel
    recorder.wait_for("started", Duration::from_secs(30)).await;
    assert!(!mcp_support::common::containers_of(&s.tenant).is_empty());
    handle.cancel(Some("test".into())).await.unwrap();
    s.sandbox_drained_within(Duration::from_secs(20)).await;
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn browser_origins_are_checked_by_default_on_both_transports() {
    let opts = mcp_code_executor::mcp::transports::http::HttpOptions {
        allowed_hosts: vec![
            "localhost".into(),
            "127.0.0.1".into(),
            "::1".into(),
            "mcp.example.com".into(),
        ],
        allowed_origins: vec!["https://app.example.com".into()],
        ..Default::default()
    };
    let s = mcp_support::server_custom(
        "t-mcp-origin",
        mcp_code_executor::app::Settings::default(),
        None,
        &opts,
        |s| s,
    )
    .await;
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "browser", "version": "1"}}})
    .to_string();
    let post_mcp = |origin: Option<&'static str>| {
        let mut req = http
            .post(s.url("/mcp"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init.clone());
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    let get_sse = |origin: Option<&'static str>| {
        let mut req = http.get(s.url("/sse"));
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send()
    };
    // A page elsewhere (a DNS-rebinding attack, or any site): refused, with the fix named.
    for evil in [
        "http://evil.example",
        "http://localhost.evil.example:4000",
        "null",
    ] {
        for r in [
            post_mcp(Some(evil)).await.unwrap(),
            get_sse(Some(evil)).await.unwrap(),
            http.post(s.url("/messages?sessionId=x"))
                .header("origin", evil)
                .body("{}")
                .send()
                .await
                .unwrap(),
        ] {
            assert_eq!(r.status(), 403, "{evil}");
            let v: serde_json::Value = r.json().await.unwrap();
            assert_eq!(v["error"], "forbidden", "{v}");
            assert!(
                v["message"].as_str().unwrap().contains("--allowed-origins"),
                "{v}"
            );
        }
    }
    // Loopback pages (the MCP Inspector), hosts of --allowed-hosts, --allowed-origins, and
    // clients that send no Origin at all pass.
    for ok in [
        None,
        Some("http://localhost:6274"),
        Some("http://127.0.0.1:6274"),
        Some("http://[::1]:6274"),
        Some("https://mcp.example.com"),
        Some("https://app.example.com"),
    ] {
        let r = post_mcp(ok).await.unwrap();
        assert_eq!(r.status(), 200, "{ok:?}: {:?}", r.text().await);
        let r = get_sse(ok).await.unwrap();
        assert_eq!(r.status(), 200, "{ok:?}");
        drop(r);
    }
    s.finish().await;
}

/// The MCP tests' server is the binary's: `tests/mcp_support` starts it through
/// `server::run`, the very function `serve` calls (both sources checked here), and it
/// answers as that server does: `/healthz` at once, `/readyz` once serving, `/metrics`.
#[tokio::test]
async fn the_test_server_is_started_by_the_same_server_run_as_the_binary() {
    let support = include_str!("../mcp_support/mod.rs");
    let serve = include_str!("../../src/commands/serve.rs");
    assert!(
        support.contains("tokio::spawn(server::run(config, shutdown.clone()))"),
        "tests/mcp_support no longer starts its server through server::run"
    );
    assert!(
        serve.contains("server::run(config, shutdown).await"),
        "the binary's serve no longer calls server::run"
    );
    let s = server("t-mcp-server-run").await;
    let http = reqwest::Client::new();
    let health = http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let ready = http.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let ready: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(ready["phase"], "serving", "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    let metrics = http.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    let client = s.client().await;
    let r = call(&client, "execute_code", json!({"code": "print(6 * 7)"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("42"), "{}", text(&r));
    client.cancel().await.unwrap();
    s.finish().await;
}
