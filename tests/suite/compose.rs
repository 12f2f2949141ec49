//! The docker-compose deployment as a new user runs it: the server image built from this
//! binary (offline, as here), `docker-compose up`, an MCP client with a tenant's token
//! through the published port, a call without the token refused, `docker-compose down`,
//! nothing left behind. Needs docker-compose (scripts/setup-docker.sh installs it); without
//! it this test fails, it never skips.

use crate::mcp_support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use mcp_code_executor::tenancy::token;
use mcp_support::{call, common, is_error, structured, text};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::json;

/// The stack of one test: brought down, its image and data removed, whatever happens.
struct Stack {
    project: String,
    image: String,
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
}

impl Stack {
    fn compose(&self, args: &[&str]) -> std::process::Output {
        let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docker-compose.yml");
        Command::new("docker-compose")
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(file)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap_or_else(|e| {
                panic!("docker-compose cannot run ({e}): install it with scripts/setup-docker.sh")
            })
    }

    fn logs(&self) -> String {
        String::from_utf8_lossy(&self.compose(&["logs", "--no-color"]).stdout).to_string()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let out = self.compose(&["down", "-v", "--remove-orphans", "-t", "20"]);
        if !out.status.success() {
            eprintln!(
                "docker-compose down: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", &self.image])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn containers(filter: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", filter])
        .output()
        .expect("docker CLI");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn docker_compose_up_serves_tenants_through_the_published_port_and_down_leaves_nothing() {
    let _image = common::sandbox().await;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let tenant = format!("t-compose-{tag}");
    let image = format!("mcp-code-executor/server:test-{tag}");
    let dir = std::env::temp_dir().join(format!("mcpx-compose-{tag}"));
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let tok = token::generate();
    let tenants = dir.join("tenants.toml");
    std::fs::write(
        &tenants,
        format!(
            "[[tenants]]\nid = \"{tenant}\"\ntoken_sha256 = \"{}\"\n",
            token::to_hex(&token::hash(&tok))
        ),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    // The server image from this very binary: offline here, so the bootstrapped base.
    let built = Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["image", "server", "--tag", &image])
        .output()
        .unwrap();
    let stack = Stack {
        project: format!("mcpxtest{tag}"),
        image: image.clone(),
        dir: dir.clone(),
        env: vec![
            ("MCP_EXECUTOR_SERVER_IMAGE", image.clone()),
            (
                "MCP_EXECUTOR_DATA_DIR",
                dir.join("data").display().to_string(),
            ),
            ("MCP_EXECUTOR_PORT", port.to_string()),
            ("MCP_EXECUTOR_TENANTS_FILE", tenants.display().to_string()),
        ],
    };
    assert!(
        built.status.success(),
        "image server failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let up = stack.compose(&["up", "-d"]);
    assert!(
        up.status.success(),
        "docker-compose up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let t0 = Instant::now();
    loop {
        let ready = http.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the stack did not become ready; logs:\n{}",
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "compose: ready {:.1} s after up",
        t0.elapsed().as_secs_f64()
    );

    // Without the token: 401 and the challenge.
    let r = http
        .post(format!("{base}/mcp"))
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));

    // With it: a real MCP client runs code; the run's container carries the tenant.
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp")).auth_header(tok);
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap_or_else(|e| panic!("client: {e}; logs:\n{}", stack.logs()));
    let r = call(&client, "execute_code", json!({"code": "print(6*7)"})).await;
    assert!(!is_error(&r), "{}\nlogs:\n{}", text(&r), stack.logs());
    assert_eq!(structured(&r)["stdout"], "42\n");
    let file_path = structured(&r)["file_path"].as_str().unwrap().to_string();
    assert!(
        file_path.starts_with(&dir.join("data/code").join(&tenant).display().to_string()),
        "the data directory has the same path inside and outside: {file_path}"
    );
    assert!(
        PathBuf::from(&file_path).exists(),
        "the stored code is on the host at {file_path}"
    );
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = format!("mcp_executor_runs_total{{tenant=\"{tenant}\",outcome=\"ok\"}} 1");
    assert!(metrics.contains(&line), "{metrics}");
    assert!(
        !containers(&format!("label=io.mcp-code-executor.tenant={tenant}")).is_empty(),
        "the tenant's warm pool runs on the host daemon"
    );
    client.cancel().await.unwrap();

    // Down: the server removes its sandboxes on SIGTERM; nothing of the project is left.
    let project = stack.project.clone();
    drop(stack);
    let t0 = Instant::now();
    loop {
        let left_sandboxes = containers(&format!("label=io.mcp-code-executor.tenant={tenant}"));
        let left_stack = containers(&format!("label=com.docker.compose.project={project}"));
        if left_sandboxes.is_empty() && left_stack.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "left after down: sandboxes {left_sandboxes:?}, stack {left_stack:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(!dir.exists(), "the test's data directory was removed");
}
