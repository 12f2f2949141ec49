//! `mcp-code-executor serve --stdio` as an MCP client spawns it: the real binary as a child
//! process (doctor self-test included), rmcp's client on its stdin/stdout.

mod mcp_support;

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
