//! `mcp-code-executor serve --stdio` as an MCP client spawns it: the real binary as a child
//! process (doctor self-test included), rmcp's client on its stdin/stdout.

use crate::mcp_support;

use std::time::Duration;

use mcp_support::{call, common, is_error, structured, text};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::ServiceExt;
use serde_json::json;

const TENANT: &str = "t-mcp-stdio";

#[tokio::test]
async fn stdio_server_executes_and_leaves_nothing_behind() {
    // make sure the image is there before the child's start-up checks
    let sandbox = common::sandbox().await;
    let dir =
        std::env::temp_dir().join(format!("mcp-test-stdio-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor")).configure(|cmd| {
            cmd.arg("serve")
                .arg("--stdio")
                .env("CODE_STORAGE_DIR", &dir)
                .env("MCP_EXECUTOR_TENANT", TENANT)
                .env("RUST_LOG", "mcp_code_executor=info");
        }),
    )
    .expect("spawn the server");
    let client = tokio::time::timeout(Duration::from_secs(120), ().serve(transport))
        .await
        .expect("the server answers initialize (after its self-test) in time")
        .expect("initialize over stdio");
    assert_eq!(
        client
            .peer_info()
            .unwrap()
            .server_info
            .as_ref()
            .unwrap()
            .name,
        "mcp-code-executor"
    );
    let r = call(
        &client,
        "execute_code",
        json!({"code": "import numpy as np; print(np.random.rand(3,3))", "filename": "matrix_gen"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        structured(&r)["stdout"].as_str().unwrap().lines().count(),
        3
    );
    let path = structured(&r)["file_path"].as_str().unwrap().to_string();
    assert!(
        path.starts_with(dir.canonicalize().unwrap().to_str().unwrap()),
        "{path}"
    );

    let r = call(
        &client,
        "read_code_file",
        json!({"file_path": "/etc/passwd"}),
    )
    .await;
    assert!(is_error(&r));
    assert!(text(&r).contains("outside"), "{}", text(&r));

    // closing stdin ends the server; it removes its containers before exiting
    client.cancel().await.unwrap();
    let t0 = std::time::Instant::now();
    loop {
        let left = common::containers_of(TENANT);
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(sandbox);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The wire as a client that writes lines by hand sees it: malformed lines get JSON-RPC
/// errors, the `.env` file of the working directory is read, stdout holds only protocol.
#[tokio::test]
async fn raw_stdio_errors_and_dotenv() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let _image = common::sandbox().await;
    let cwd =
        std::env::temp_dir().join(format!("mcp-test-dotenv-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _cwd_guard = crate::common::TempDirs(vec![cwd.clone()]);
    let storage = cwd.join("from-dotenv");
    std::fs::create_dir_all(&cwd).unwrap();
    // A real venv, configured the way users of the old tools do it: ENV_TYPE + VENV_PATH.
    let venv = cwd.join("venv");
    let made = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::write(
        cwd.join(".env"),
        format!(
            "CODE_STORAGE_DIR={}\nENV_TYPE=venv\nVENV_PATH={}\nMCP_EXECUTOR_TENANT={TENANT}-raw\n",
            storage.display(),
            venv.display()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["serve", "--stdio"])
        .current_dir(&cwd)
        .env_remove("CODE_STORAGE_DIR")
        .env_remove("ENV_TYPE")
        .env_remove("VENV_PATH")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || -> serde_json::Value {
        let line = tokio::time::timeout(Duration::from_secs(120), out.next_line())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("stdout open");
        serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout carried a non-JSON line {line:?}: {e}"))
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    for line in [
        init.to_string(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
    ] {
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
    }
    let v = next().await;
    assert_eq!(v["id"], 1);
    assert_eq!(v["result"]["serverInfo"]["name"], "mcp-code-executor");

    stdin.write_all(b"this is not json\n").await.unwrap();
    let v = next().await;
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(v["id"].is_null());

    stdin
        .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"hello\":1}\n")
        .await
        .unwrap();
    let v = next().await;
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert_eq!(v["id"], 5);

    let call = json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "nope", "arguments": {}}});
    stdin
        .write_all(format!("{call}\n").as_bytes())
        .await
        .unwrap();
    let v = next().await;
    assert_eq!(v["id"], 6);
    assert_eq!(v["error"]["code"], -32602, "{v}");

    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "get_environment_config", "arguments": {}}});
    stdin
        .write_all(format!("{call}\n").as_bytes())
        .await
        .unwrap();
    let v = next().await;
    assert_eq!(v["id"], 7);
    let cfg = &v["result"]["structuredContent"];
    assert_eq!(
        cfg["code_storage_dir"],
        storage.canonicalize().unwrap().display().to_string(),
        "{v}"
    );
    assert_eq!(cfg["type"], "venv", "{v}");
    assert_eq!(cfg["path"], venv.display().to_string(), "{v}");

    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the server exits when stdin closes")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&cwd);
}
