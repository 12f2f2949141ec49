//! Consent through `input_required` behind a balancer without affinity (#46): the retry
//! that carries the user's answer reaches the replica whose run asked, wherever round robin
//! sends it (the `requestState` names its replica, as handles do). Official Python SDK,
//! default mode, with its elicitation callback (`tests/sdk/consent.py replicas`), against
//! the real server-filesystem upstream that each replica runs.

use super::*;

#[tokio::test]
async fn a_consent_retry_reaches_the_replica_that_asked() {
    let (_dirs, dir) = common::TempDirs::one("replicas-consent");
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let tools = dir.join("tools.toml");
    std::fs::write(&tools, crate::codemode::everything_and_filesystem(&root)).unwrap();
    let c = Cluster::start("consent", &["--tools", tools.to_str().unwrap()]).await;
    let before = [
        metric(&c.replicas[0], "mcp_executor_forwarded_total").await,
        metric(&c.replicas[1], "mcp_executor_forwarded_total").await,
    ];
    let python = common::sdk_python();
    let args = vec![
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/consent.py").to_string(),
        c.lb("/mcp"),
        root.display().to_string(),
        "replicas".to_string(),
    ];
    let out = tokio::task::spawn_blocking(move || {
        Command::new(&python)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("python starts")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ok: replicas"),
        "consent.py replicas failed:\n{stdout}\n{}\n--- replica 0 ---\n{}\n--- replica 1 ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.replicas[0].log(),
        c.replicas[1].log()
    );
    let after = [
        metric(&c.replicas[0], "mcp_executor_forwarded_total").await,
        metric(&c.replicas[1], "mcp_executor_forwarded_total").await,
    ];
    assert!(
        after[0] + after[1] > before[0] + before[1],
        "no call was forwarded: {before:?} -> {after:?}"
    );
}
