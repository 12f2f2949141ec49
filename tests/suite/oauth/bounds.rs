//! The size of `initialize` is bounded; a refused `Origin` is logged quoted.

use super::*;

/// Issue 24 item 4: an `initialize` whose capabilities carry megabytes is refused, so that
/// protocol sessions cannot pin memory by the megabyte (30 of 7.5 MB added ~300 MB before).
#[tokio::test]
async fn initialize_requests_are_bounded_in_size() {
    let port = free_port();
    let s = Hosted::start(
        None,
        &["t-oauth-init"],
        &[
            "--port".into(),
            port.to_string(),
            "--tenant".into(),
            "t-oauth-init".into(),
        ],
    )
    .await;
    let pid = s.child.id().unwrap();
    let rss = || -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    let http = reqwest::Client::new();
    let before = rss();
    let blob = "x".repeat(7_500_000);
    let mut statuses = Vec::new();
    for i in 0..30 {
        let init = json!({"jsonrpc": "2.0", "id": i, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {"experimental": {"blob": {"b": blob}}},
            "clientInfo": {"name": "big", "version": "0"}}});
        let r = http
            .post(s.url("/mcp"))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(init.to_string())
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        let _ = r.text().await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss();
    eprintln!("RSS before {before} KiB, after 30 initialize of 7.5 MB: {after} KiB");
    assert!(statuses.iter().all(|s| *s == 400), "refused: {statuses:?}");
    assert!(
        after < before + 100_000,
        "RSS grew from {before} KiB to {after} KiB"
    );
    // A normal initialize still works.
    let r = http
        .post(s.url("/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "small", "version": "0"}}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    s.finish().await;
}

/// Issue 24 item 9: client-sent values in the log are quoted and escaped: a refused
/// `Origin` carrying a quote and `level=ERROR` shows as one quoted value, not extra fields.
#[tokio::test]
async fn a_refused_origin_is_logged_quoted() {
    let port = free_port();
    let s = Hosted::start(
        None,
        &["t-oauth-origin"],
        &[
            "--port".into(),
            port.to_string(),
            "--tenant".into(),
            "t-oauth-origin".into(),
        ],
    )
    .await;
    let r = reqwest::Client::new()
        .post(s.url("/mcp"))
        .header("Origin", "http://evil.example\" fake=1 level=ERROR")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = s.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("refused: Origin not allowed"))
        .unwrap_or_else(|| panic!("no refusal logged: {log}"));
    assert!(
        line.contains(r#"origin="http://evil.example\" fake=1 level=ERROR""#),
        "the origin is one quoted, escaped value: {line}"
    );
    s.finish().await;
}
