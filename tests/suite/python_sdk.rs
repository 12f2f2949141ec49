//! Interoperability with the official MCP Python SDK (PyPI `mcp`): `tests/sdk/client.py`
//! drives a real `serve` over Streamable HTTP, legacy SSE and stdio as a user's client
//! would (the nine tools listed, numpy, the incremental file flow, `/etc/passwd` refused,
//! a non-zero exit as `isError`), then with the SDK's `Client` in its default mode (over
//! HTTP: protocol 2026-07-28, no protocol session, each request on its own) and in legacy
//! mode: `x = 41` then `x + 1` with the returned session_id gives 42, write_file, read_file
//! and execute_code see the same file, a 3 MB print comes back (under the SDK's 1 MiB
//! event limit) as its head and tail with the whole output in the workspace and as
//! `resource_link`s whose `resources/read` gives all of it (up to the output limit), and a
//! 3000x3000 figure's link reads back as a PNG blob. (Tasks: the SDK has no client side for
//! them; tests/suite/mcp_tasks.rs drives them over raw HTTP.) `scripts/test.sh` makes the SDK's venv; without it this
//! test fails and says how to make it.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");
const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/client.py");

fn client(args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(common::sdk_python())
        .arg(CLIENT)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK client failed over {}: {stdout}\n{stderr}",
        args[0]
    );
    assert!(
        !stderr.contains("Session termination failed"),
        "the SDK could not end its session cleanly over {}: {stderr}",
        args[0]
    );
    stdout
}

#[tokio::test]
async fn the_official_python_sdk_works_over_every_transport() {
    let tenant = "t-pysdk";
    let _clean = common::remove_on_drop(tenant);
    common::sandbox().await;
    let dir = std::env::temp_dir().join(format!("mcpx-pysdk-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    let mut server = tokio::process::Command::new(BIN)
        .args([
            "serve",
            "--port",
            "0",
            "--pool-size",
            "1",
            "--tenant",
            tenant,
        ])
        .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
        .env("CODE_STORAGE_DIR", dir.join("code"))
        .env("RUST_LOG", "mcp_code_executor=warn")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let base = loop {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .expect("serve prints its address")
            .unwrap()
            .expect("serve is running");
        if let Some(rest) = line.split("Streamable HTTP at ").nth(1) {
            let url = rest.split_whitespace().next().unwrap();
            break url.trim_end_matches("/mcp").to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let http = tokio::task::spawn_blocking({
        let base = base.clone();
        move || {
            let a = client(&["http", &format!("{base}/mcp")], "");
            let b = client(&["sse", &format!("{base}/sse")], "");
            (a, b)
        }
    })
    .await
    .unwrap();
    for want in [
        "ok: http auto 2026-07-28",
        "ok: http legacy 2025-",
        "ok: http\n",
    ] {
        assert!(http.0.contains(want), "{want}: {}", http.0);
    }
    for want in ["ok: sse auto", "ok: sse legacy 2025-", "ok: sse\n"] {
        assert!(http.1.contains(want), "{want}: {}", http.1);
    }
    eprintln!("{}{}", http.0, http.1);

    // stdio: the SDK starts the server itself, as a client configured with it does.
    let env = serde_json::json!({
        "CODE_STORAGE_DIR": dir.join("code-stdio"),
        "MCP_EXECUTOR_DATA_DIR": dir.join("data"),
    })
    .to_string();
    let stdio = tokio::task::spawn_blocking(move || {
        client(
            &[
                "stdio",
                BIN,
                "serve",
                "--stdio",
                "--pool-size",
                "0",
                "--tenant",
                tenant,
            ],
            &format!("{env}\n"),
        )
    })
    .await
    .unwrap();
    for want in ["ok: stdio auto", "ok: stdio legacy 2025-", "ok: stdio\n"] {
        assert!(stdio.contains(want), "{want}: {stdio}");
    }
    eprintln!("{stdio}");

    let pid = server.id().expect("running");
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("serve exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    let left = common::containers_of(tenant);
    assert!(left.is_empty(), "containers left: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
