//! The end check of `scripts/test.sh` (`scripts/test-owner.sh check`), against the real
//! daemon and real servers. Issue 42: the check listed every container with the project's
//! `managed` label and removed them all, so a developer's `serve` running beside the tests
//! lost its warm sandboxes and its sessions. Now the tests run under a host name of their
//! own (`scripts/test-owner.sh enter`), carried by their containers' owner label, and the
//! check takes only those.
//!
//! Needs root, or user namespaces, for `unshare --uts` (as `scripts/test.sh` does).

use crate::common;
use crate::mcp_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use tokio::io::{AsyncBufReadExt, BufReader};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");

fn script() -> String {
    format!("{ROOT}/scripts/test-owner.sh")
}

/// `(id, owner label)` of every container of ours on the daemon.
fn ours() -> Vec<(String, String)> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.mcp-code-executor.managed=true",
            "--format",
            "{{.ID}} {{.Label \"io.mcp-code-executor.owner\"}}",
        ])
        .output()
        .expect("docker ps");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(i, o)| (i.to_string(), o.to_string()))
        .collect()
}

fn exists(id: &str) -> bool {
    std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Id}}", id])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `serve --port 0 --pool-size POOL` for `tenant` in `dir`, run through `prefix` (e.g. the
/// script's `enter NAME`): the child and its Streamable HTTP URL, once `/readyz` says 200.
async fn serve(
    prefix: &[String],
    pool: &str,
    tenant: &str,
    dir: &std::path::Path,
) -> (tokio::process::Child, String) {
    let mut argv: Vec<String> = prefix.to_vec();
    argv.extend(
        [BIN, "serve", "--port", "0", "--pool-size", pool]
            .iter()
            .map(|s| s.to_string()),
    );
    let mut child = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("CODE_STORAGE_DIR", dir.join("code"))
        .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
        .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.join("ws"))
        .env("MCP_EXECUTOR_TENANT", tenant)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = common::announced_url(&mut lines, Duration::from_secs(180), true).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let ready = url.replace("/mcp", "/readyz");
    let t = Instant::now();
    while reqwest::get(&ready).await.map(|r| r.status().as_u16()).ok() != Some(200) {
        assert!(t.elapsed() < Duration::from_secs(120), "{ready} never 200");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (child, url)
}

fn check(name: &str) -> (i32, String) {
    let out = std::process::Command::new(script())
        .args(["check", name])
        .output()
        .expect("the script runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(90), "{what}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
async fn the_end_check_takes_only_what_the_run_made_and_a_serve_beside_it_keeps_its_sandboxes() {
    let _image = common::sandbox().await;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (_dirs, dir) = common::TempDirs::one("test-script");
    // -- A developer's server, beside the tests: a warm pool and a session holding x.
    let tenant = format!("t-unrelated-{id}");
    let (mut unrelated, url) = serve(&[], "2", &tenant, &dir.join("unrelated")).await;
    let pid = unrelated.id().unwrap();
    let owner = common::owner_of_process(pid);
    let client =
        ().serve(StreamableHttpClientTransport::from_uri(url.as_str()))
            .await
            .expect("a client of the unrelated server");
    let cell = |code: &str| {
        let args = serde_json::json!({ "code": code });
        mcp_support::call(client.peer(), "execute_python", args)
    };
    let r = cell("x = 41").await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    wait_for("the unrelated server's pool and session", || {
        common::containers_owned_by(&owner).len() >= 3
    })
    .await;
    let before = common::containers_owned_by(&owner);

    // -- A "test run" that leaks: a server started under the run's host name, killed -9
    // with its warm sandboxes still there.
    let run = format!("fake-test-{id}");
    let enter = vec![script(), "enter".to_string(), run.clone()];
    let (mut leaky, _) = serve(&enter, "1", &format!("t-leaky-{id}"), &dir.join("leaky")).await;
    let prefix = format!("{run}/");
    wait_for("the run's server made a sandbox", || {
        ours().iter().any(|(_, o)| o.starts_with(&prefix))
    })
    .await;
    leaky.start_kill().unwrap();
    let _ = leaky.wait().await;
    let leaked: Vec<String> = ours()
        .into_iter()
        .filter(|(_, o)| o.starts_with(&prefix))
        .map(|(i, _)| i)
        .collect();
    assert!(!leaked.is_empty());
    // The check of before would have taken the unrelated server's too: it listed them all.
    let all: Vec<String> = ours().into_iter().map(|(i, _)| i).collect();
    assert!(
        before.iter().all(|c| all.contains(c)),
        "the old check (every managed container) listed the unrelated server's"
    );

    // -- The end check: the run's leftovers found, named and removed; nothing else touched.
    let (code, said) = check(&run);
    assert_eq!(code, 1, "a leftover fails the run: {said}");
    assert!(
        said.contains(&prefix) && said.contains("not touched"),
        "{said}"
    );
    assert!(
        ours().iter().all(|(_, o)| !o.starts_with(&prefix)),
        "the run's leftovers are removed"
    );
    for c in &before {
        assert!(
            exists(c),
            "the unrelated server's container {c} was removed: {said}"
        );
    }
    let r = cell("x + 1").await;
    let text = format!("{:?}", r.content);
    assert!(text.contains("42"), "its session still sees x: {text}");
    // Nothing of the run left: the check passes and says it looked at nothing else.
    let (code, said) = check(&run);
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("no container made by this run's tests is left"),
        "{said}"
    );

    // -- The unrelated server stops as it would, taking its own containers.
    client.cancel().await.unwrap();
    // SAFETY: kill(2) on the pid of a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let _ = tokio::time::timeout(Duration::from_secs(60), unrelated.wait()).await;
    common::remove_containers(&common::containers_owned_by(&owner));
}

/// The host name is set only inside a new namespace: the machine's stays.
#[test]
fn enter_names_the_run_inside_its_namespace_only() {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let out = std::process::Command::new(script())
        .args([
            "enter",
            "fake-test-name",
            "cat",
            "/proc/sys/kernel/hostname",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "fake-test-name"
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        host
    );
    let name = std::process::Command::new(script())
        .args(["name", &std::process::id().to_string()])
        .output()
        .unwrap();
    let name = String::from_utf8_lossy(&name.stdout).trim().to_string();
    assert!(
        name.contains(&format!("-test-{}-", std::process::id())) && name.len() <= 63,
        "{name}"
    );
}
