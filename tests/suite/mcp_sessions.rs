//! Issue 7 through rmcp's real client over Streamable HTTP, against a real server with the
//! real Docker backend: stateful sessions, figures as images, workspace files. Every test
//! checks at the end that none of its containers is left.

use crate::mcp_support;

use std::time::Duration;

use base64::Engine as _;
use mcp_code_executor::app::Settings;
use mcp_support::{call, common, is_error, server, server_with, structured, text};
use serde_json::json;

/// Width and height from a PNG's IHDR, after checking the signature.
fn png_size(data: &[u8]) -> (u32, u32) {
    assert_eq!(&data[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&data[12..16], b"IHDR");
    let w = u32::from_be_bytes(data[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(data[20..24].try_into().unwrap());
    assert_eq!(&data[data.len() - 8..data.len() - 4], b"IEND", "PNG ends");
    (w, h)
}

fn images(r: &rmcp::model::CallToolResult) -> Vec<(Vec<u8>, String)> {
    r.content
        .iter()
        .filter_map(|c| c.as_image())
        .map(|i| {
            (
                base64::engine::general_purpose::STANDARD
                    .decode(&i.data)
                    .expect("base64"),
                i.mime_type.clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn state_persists_and_sessions_are_separate() {
    let s = server("t-s7-state").await;
    let a = s.client().await;
    let b = s.client().await;
    let r = call(&a, "execute_python", json!({"code": "x = 41\nimport math"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&a, "execute_python", json!({"code": "x + 1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "42\n", "{}", text(&r));
    assert!(text(&r).contains("42"));
    // The other MCP session has its own interpreter.
    let r = call(&b, "execute_python", json!({"code": "x"})).await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(
        structured(&r)["stderr"]
            .as_str()
            .unwrap()
            .contains("NameError"),
        "{}",
        text(&r)
    );
    // An exception keeps the session.
    let r = call(&a, "execute_python", json!({"code": "1/0"})).await;
    assert!(
        is_error(&r) && text(&r).contains("ZeroDivisionError"),
        "{}",
        text(&r)
    );
    let r = call(
        &a,
        "execute_python",
        json!({"code": "print(x, math.pi > 3)"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "41 True\n", "{}", text(&r));
    // reset_session drops it.
    let r = call(&a, "reset_session", json!({})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&a, "execute_python", json!({"code": "'x' in globals()"})).await;
    assert_eq!(structured(&r)["stdout"], "False\n", "{}", text(&r));
    // Closing a client's MCP session removes its container.
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    s.sandbox_drained_within(Duration::from_secs(20)).await;
    s.finish().await;
}

#[tokio::test]
async fn figures_come_back_as_png_images() {
    let s = server("t-s7-fig").await;
    let c = s.client().await;
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()";
    for tool in ["execute_python", "execute_code"] {
        let r = call(&c, tool, json!({ "code": code })).await;
        assert!(!is_error(&r), "{tool}: {}", text(&r));
        let imgs = images(&r);
        assert_eq!(imgs.len(), 1, "{tool}: {}", text(&r));
        assert_eq!(imgs[0].1, "image/png");
        assert_eq!(png_size(&imgs[0].0), (640, 480), "{tool}");
        assert!(text(&r).contains("figure-001.png"), "{tool}: {}", text(&r));
        let v = structured(&r);
        assert_eq!(v["figures"][0]["name"], "figure-001.png", "{v}");
        assert_eq!(v["figures"][0]["downscaled"], false, "{v}");
        assert_eq!(v["figures_dropped"], 0);
    }
    // A huge figure is downscaled and the text says so.
    let r = call(
        &c,
        "execute_code",
        json!({"code": "import matplotlib.pyplot as plt\nplt.figure(figsize=(40, 40), dpi=100)\nplt.plot([1,2])\nplt.show()"}),
    )
    .await;
    assert!(text(&r).contains("downscaled"), "{}", text(&r));
    let (w, h) = png_size(&images(&r)[0].0);
    assert!(w as u64 * h as u64 <= 4_000_000 + 10_000, "{w}x{h}");
    c.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn workspace_files_reach_the_code_and_traversal_is_refused() {
    let s = server("t-s7-ws").await;
    let c = s.client().await;
    // A session opened before the file was written still sees it.
    let r = call(&c, "execute_python", json!({"code": "y = 1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &c,
        "write_file",
        json!({"path": "data.csv", "content": "a,b\n1,2\n3,4\n"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("/workspace/data.csv"), "{}", text(&r));
    let code = "import pandas\ndf = pandas.read_csv('/workspace/data.csv')\nint(df['b'].sum())";
    let r = call(&c, "execute_python", json!({ "code": code })).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "6\n", "{}", text(&r));
    // One-shot runs see it too.
    let r = call(
        &c,
        "execute_code",
        json!({"code": "print(open('/workspace/data.csv').read().count('\\n'))"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "3\n", "{}", text(&r));
    // Binary round trip through base64, listing, reading.
    let bin = base64::engine::general_purpose::STANDARD.encode([0u8, 255, 1, 254]);
    let r = call(
        &c,
        "write_file",
        json!({"path": "/workspace/blob.bin", "content": bin, "encoding": "base64"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&c, "read_file", json!({"path": "blob.bin"})).await;
    let v = structured(&r);
    assert_eq!(v["encoding"], "base64");
    assert_eq!(v["content"], bin);
    let r = call(&c, "read_file", json!({"path": "data.csv"})).await;
    assert_eq!(text(&r), "a,b\n1,2\n3,4\n");
    let r = call(&c, "list_files", json!({})).await;
    let names: Vec<String> = structured(&r)["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    for n in ["blob.bin", "data.csv"] {
        assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
    }
    // Files the code writes come back into the workspace, from sessions and one-shot runs.
    let r = call(
        &c,
        "execute_python",
        json!({"code": "df.to_csv('/workspace/out.csv', index=False)\nopen('/workspace/raw.bin', 'wb').write(bytes([0, 200]))"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("out.csv"), "{}", text(&r));
    // ...and are embedded in the result as resources.
    let embedded: Vec<serde_json::Value> = r
        .content
        .iter()
        .filter_map(|c| c.as_resource())
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let csv = embedded
        .iter()
        .find(|e| e["resource"]["uri"] == "file:///workspace/out.csv")
        .unwrap_or_else(|| panic!("out.csv not embedded: {embedded:?}"));
    assert_eq!(csv["resource"]["text"], "a,b\n1,2\n3,4\n");
    assert_eq!(csv["resource"]["mimeType"], "text/csv");
    let r = call(&c, "read_file", json!({"path": "out.csv"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(text(&r), "a,b\n1,2\n3,4\n");
    let r = call(&c, "read_file", json!({"path": "raw.bin"})).await;
    assert_eq!(structured(&r)["encoding"], "base64", "{}", text(&r));
    let r = call(
        &c,
        "execute_code",
        json!({"code": "open('/workspace/note.txt', 'w').write('from a run')"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&c, "read_file", json!({"path": "/workspace/note.txt"})).await;
    assert_eq!(text(&r), "from a run");
    // The session sees what the one-shot run wrote (synced before the next cell).
    let r = call(
        &c,
        "execute_python",
        json!({"code": "open('/workspace/note.txt').read()"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "'from a run'\n", "{}", text(&r));
    // Refusals.
    for bad in [
        "../escape.txt",
        "/etc/passwd",
        "sub/dir.txt",
        "a\0b",
        &"n".repeat(300),
    ] {
        let r = call(&c, "write_file", json!({"path": bad, "content": "x"})).await;
        assert!(is_error(&r), "{bad:?} accepted: {}", text(&r));
        let r = call(&c, "read_file", json!({"path": bad})).await;
        assert!(is_error(&r), "{bad:?} read: {}", text(&r));
    }
    assert!(!s
        .storage_dir
        .with_extension("ws")
        .join("escape.txt")
        .exists());
    // A planted symlink is not followed.
    let sessions = s.storage_dir.with_extension("ws").join("t-s7-ws.sessions");
    let dirs: Vec<_> = std::fs::read_dir(&sessions).unwrap().collect();
    assert_eq!(dirs.len(), 1, "one MCP session, one workspace");
    let ws = dirs[0].as_ref().unwrap().path();
    std::os::unix::fs::symlink("/etc/passwd", ws.join("link")).unwrap();
    let r = call(&c, "read_file", json!({"path": "link"})).await;
    assert!(
        is_error(&r) && text(&r).contains("symbolic link"),
        "{}",
        text(&r)
    );
    // Another MCP session has its own, empty workspace.
    let other = s.client().await;
    let r = call(&other, "list_files", json!({})).await;
    assert_eq!(structured(&r)["files"], json!([]), "{}", text(&r));
    let r = call(&other, "read_file", json!({"path": "data.csv"})).await;
    assert!(is_error(&r), "{}", text(&r));
    let r = call(
        &other,
        "execute_code",
        json!({"code": "import os; print(os.path.exists('/workspace/data.csv'))"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "False\n", "{}", text(&r));
    other.cancel().await.unwrap();
    // Closing the MCP session deletes its workspace.
    c.cancel().await.unwrap();
    let t0 = std::time::Instant::now();
    while ws.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "workspace kept: {ws:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.finish().await;
}

#[tokio::test]
async fn idle_sessions_are_removed_and_timeouts_say_the_state_is_lost() {
    let mut settings = Settings::default();
    settings.sessions.idle = Duration::from_secs(2);
    let s = server_with("t-s7-idle", settings).await;
    let c = s.client().await;
    let r = call(&c, "execute_python", json!({"code": "z = 5"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(common::containers_of("t-s7-idle").len(), 1);
    s.sandbox_drained_within(Duration::from_secs(15)).await;
    let r = call(&c, "execute_python", json!({"code": "'z' in globals()"})).await;
    assert_eq!(structured(&r)["stdout"], "False\n", "{}", text(&r));
    assert!(text(&r).contains("new session"), "{}", text(&r));

    let r = call(&c, "execute_python", json!({"code": "z = 7"})).await;
    assert!(!is_error(&r));
    let r = call(
        &c,
        "execute_python",
        json!({"code": "import time\ntime.sleep(30)", "timeout": 1}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(structured(&r)["timed_out"].as_bool().unwrap());
    assert!(
        text(&r).contains("state (variables, imports, functions) is gone"),
        "{}",
        text(&r)
    );
    let r = call(
        &c,
        "execute_python",
        json!({"code": "print('z' in globals())"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "False\n", "{}", text(&r));
    c.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn cells_queue_sessions_are_capped_and_expire() {
    let mut settings = Settings::default();
    settings.sessions.max_sessions = 1;
    settings.sessions.max_lifetime = Duration::from_secs(3);
    let s = server_with("t-s7-cap", settings).await;
    let a = s.client().await;
    let b = s.client().await;
    // Two concurrent calls in one session run one after the other, in one interpreter.
    let slow = call(
        &a,
        "execute_python",
        json!({"code": "import time\nlog = globals().setdefault('log', [])\nlog.append('a')\ntime.sleep(1)\nlog.append('a')"}),
    );
    let fast = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        call(
            &a,
            "execute_python",
            json!({"code": "log = globals().setdefault('log', [])\nlog.append('b')"}),
        )
        .await
    };
    let (r1, r2) = tokio::join!(slow, fast);
    assert!(
        !is_error(&r1) && !is_error(&r2),
        "{} {}",
        text(&r1),
        text(&r2)
    );
    let r = call(&a, "execute_python", json!({"code": "''.join(log)"})).await;
    assert_eq!(structured(&r)["stdout"], "'aab'\n", "{}", text(&r));
    // The cap: a second MCP session gets no sandbox while the first lives.
    let r = call(&b, "execute_python", json!({"code": "1"})).await;
    assert!(is_error(&r) && text(&r).contains("maximum"), "{}", text(&r));
    // After its maximum lifetime the session is removed, even though it was used recently.
    tokio::time::sleep(Duration::from_secs(4)).await;
    s.sandbox_drained_within(Duration::from_secs(10)).await;
    let r = call(&b, "execute_python", json!({"code": "1 + 1"})).await;
    assert_eq!(structured(&r)["stdout"], "2\n", "{}", text(&r));
    // Server shutdown removes the live session (clients still connected).
    assert_eq!(common::containers_of("t-s7-cap").len(), 1);
    s.finish().await;
    drop((a, b));
}

#[tokio::test]
async fn a_shared_workspace_is_the_tenants_and_outlives_sessions() {
    let mut settings = Settings::default();
    settings.sessions.shared_workspace = true;
    let s = server_with("t-s7-shared", settings).await;
    let a = s.client().await;
    let r = call(
        &a,
        "write_file",
        json!({"path": "keep.txt", "content": "kept"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    a.cancel().await.unwrap();
    let b = s.client().await;
    let r = call(&b, "read_file", json!({"path": "keep.txt"})).await;
    assert_eq!(text(&r), "kept");
    let dir = s.storage_dir.with_extension("ws").join("t-s7-shared");
    assert!(dir.join("keep.txt").is_file());
    b.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn out_of_memory_ends_the_session_and_says_so() {
    let mut settings = Settings::default();
    settings.limits.memory_bytes = 96 << 20;
    let s = server_with("t-s7-oom", settings).await;
    let c = s.client().await;
    let r = call(&c, "execute_python", json!({"code": "keep = 1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &c,
        "execute_python",
        json!({"code": "big = bytearray(400 << 20)\nbig[::4096] = b'x' * len(big[::4096])"}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["oom_killed"], true, "{}", text(&r));
    assert!(
        text(&r).contains("state (variables, imports, functions) is gone"),
        "{}",
        text(&r)
    );
    let r = call(&c, "execute_python", json!({"code": "'keep' in globals()"})).await;
    assert_eq!(structured(&r)["stdout"], "False\n", "{}", text(&r));
    c.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn exit_in_a_cell_ends_the_session_and_the_next_call_starts_fresh() {
    let s = server("t-s7-exit").await;
    let c = s.client().await;
    for code in [
        "exit()",
        "import sys\nsys.exit(0)",
        "import sys\nsys.exit(1)",
    ] {
        let r = call(&c, "execute_python", json!({"code": "kept = 1"})).await;
        assert!(!is_error(&r), "{}", text(&r));
        let r = call(&c, "execute_python", json!({ "code": code })).await;
        assert!(
            text(&r).contains("state (variables, imports, functions) is gone"),
            "{code:?}: {}",
            text(&r)
        );
        // The next call runs, in a fresh session, instead of failing on a dead one.
        let r = call(&c, "execute_python", json!({"code": "'kept' in globals()"})).await;
        assert!(!is_error(&r), "{code:?}: {}", text(&r));
        assert_eq!(
            structured(&r)["stdout"],
            "False\n",
            "{code:?}: {}",
            text(&r)
        );
        assert!(text(&r).contains("new session"), "{code:?}: {}", text(&r));
    }
    c.cancel().await.unwrap();
    s.sandbox_drained_within(Duration::from_secs(20)).await;
    s.finish().await;
}

#[tokio::test]
async fn a_cell_cancelled_while_queued_leaves_the_session_intact() {
    use rmcp::ServiceExt as _;
    let s = server("t-s7-cancelq").await;
    let recorder = mcp_support::ProgressRecorder::default();
    let c = recorder
        .clone()
        .serve(rmcp::transport::StreamableHttpClientTransport::from_uri(
            s.url("/mcp"),
        ))
        .await
        .unwrap();
    let r = call(&c, "execute_python", json!({"code": "x = 1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    // The first cell runs for a while...
    let first = tokio::spawn({
        let peer = c.peer().clone();
        async move {
            call(
                &peer,
                "execute_python",
                json!({"code": "import time\nprint('first', flush=True)\ntime.sleep(3)\ny = 2"}),
            )
            .await
        }
    });
    recorder.wait_for("running:", Duration::from_secs(30)).await;
    // ...while a second one waits for it, and is cancelled before it gets its turn.
    let params = rmcp::model::CallToolRequestParams::new("execute_python").with_arguments(
        json!({"code": "x = 'clobbered'\nexit()"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let queued = c
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(params)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    queued.cancel(Some("test".into())).await.unwrap();
    let r = first.await.unwrap();
    assert!(!is_error(&r), "{}", text(&r));
    // Neither the cancelled code ran nor was the session dropped: both cells' state is there.
    let r = call(&c, "execute_python", json!({"code": "(x, y)"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "(1, 2)\n", "{}", text(&r));
    assert!(!text(&r).contains("new session"), "{}", text(&r));
    c.cancel().await.unwrap();
    s.finish().await;
}

/// `(start, end)` printed by [`TIMED`], on the containers' clock (the host's).
fn interval(r: &rmcp::model::CallToolResult) -> (f64, f64) {
    let out = structured(r)["stdout"].as_str().unwrap().to_string();
    let v: Vec<f64> = out
        .split_whitespace()
        .map(|x| x.parse().unwrap_or_else(|_| panic!("{out:?}")))
        .collect();
    (v[0], v[1])
}

const TIMED: &str = "import time\nt0 = time.time()\ntime.sleep(1.5)\nprint(t0, time.time())";

#[tokio::test]
async fn cells_take_run_slots_and_count_against_the_tenants_quotas() {
    let mut settings = Settings::default();
    settings.quota.max_concurrent_runs = Some(1);
    settings.quota.runs_per_minute = Some(5);
    let s = server_with("t-s7-slots", settings).await;
    let c = s.client().await;
    let r = call(&c, "execute_python", json!({"code": "1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    // With one run slot, a one-shot run and a cell go one after the other, never together.
    let (a, b) = tokio::join!(
        call(&c, "execute_code", json!({ "code": TIMED })),
        call(&c, "execute_python", json!({ "code": TIMED })),
    );
    assert!(!is_error(&a) && !is_error(&b), "{} {}", text(&a), text(&b));
    let (a, b) = (interval(&a), interval(&b));
    assert!(
        a.1 <= b.0 || b.1 <= a.0,
        "the run {a:?} and the cell {b:?} overlapped with max_concurrent_runs = 1"
    );
    // Cells are runs for runs_per_minute too: 3 above, 2 more, then refused.
    for _ in 0..2 {
        let r = call(&c, "execute_python", json!({"code": "2"})).await;
        assert!(!is_error(&r), "{}", text(&r));
    }
    let r = call(&c, "execute_python", json!({"code": "3"})).await;
    assert!(
        is_error(&r) && text(&r).contains("runs_per_minute"),
        "{}",
        text(&r)
    );
    c.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn concurrent_first_cells_cannot_pass_max_sessions() {
    let mut settings = Settings::default();
    settings.sessions.max_sessions = 2;
    let s = server_with("t-s7-race", settings).await;
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(s.client().await);
    }
    let results = futures::future::join_all(clients.iter().map(|c| {
        call(
            c,
            "execute_python",
            json!({"code": "import time\ntime.sleep(0.5)\n1"}),
        )
    }))
    .await;
    let opened = results.iter().filter(|r| !is_error(r)).count();
    for r in results.iter().filter(|r| is_error(r)) {
        assert!(text(r).contains("max_sessions"), "{}", text(r));
    }
    assert_eq!(opened, 2, "max_sessions = 2, sessions opened: {opened}");
    assert!(common::containers_of("t-s7-race").len() <= 2);
    for c in clients {
        c.cancel().await.unwrap();
    }
    s.finish().await;
}

#[tokio::test]
async fn write_file_takes_the_documented_cap_in_one_request() {
    use mcp_code_executor::app::workspaces::caps;
    let s = server("t-s7-bigwrite").await;
    let c = s.client().await;
    // A session open before the write: the file is copied into it, too.
    let r = call(&c, "execute_python", json!({"code": "1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    // The largest binary file write_file promises, as base64: fits one request.
    let data: Vec<u8> = (0..caps::WRITE_BYTES)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
    let r = call(
        &c,
        "write_file",
        json!({"path": "big.bin", "content": b64, "encoding": "base64"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["size_bytes"], caps::WRITE_BYTES);
    let r = call(
        &c,
        "execute_python",
        json!({"code": "import hashlib\nb = open('/workspace/big.bin', 'rb').read()\nprint(len(b), hashlib.sha256(b).hexdigest())"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let want = {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(&data);
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    assert_eq!(
        structured(&r)["stdout"],
        format!("{} {want}\n", caps::WRITE_BYTES)
    );
    // One byte more is refused, naming the cap, and nothing is written.
    let more = base64::engine::general_purpose::STANDARD.encode([&data[..], &[0]].concat());
    let r = call(
        &c,
        "write_file",
        json!({"path": "bigger.bin", "content": more, "encoding": "base64"}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("at most 5242880 bytes"), "{}", text(&r));
    let r = call(&c, "list_files", json!({})).await;
    assert_eq!(
        structured(&r)["files"].as_array().unwrap().len(),
        1,
        "{}",
        text(&r)
    );
    // And the description says so.
    let tools = c.list_all_tools().await.unwrap();
    let w = tools.iter().find(|t| t.name == "write_file").unwrap();
    assert!(
        w.description
            .as_deref()
            .unwrap()
            .contains("At most 5 MiB per write_file call"),
        "{:?}",
        w.description
    );
    c.cancel().await.unwrap();
    s.finish().await;
}
