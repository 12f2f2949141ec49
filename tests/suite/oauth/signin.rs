//! Sign-in with the official Python SDK given only the server URL; key rotation and the
//! issuer down.

use super::*;

#[tokio::test]
async fn the_python_sdk_signs_in_with_only_the_server_url() {
    let python = std::env::var("MCP_PY_SDK_PYTHON")
        .unwrap_or_else(|_| format!("{ROOT}/target/py-sdk/bin/python"));
    assert!(
        std::process::Command::new(&python)
            .args(["-c", "import mcp"])
            .status()
            .is_ok_and(|s| s.success()),
        "the official MCP Python SDK is needed at {python}: run scripts/test.sh"
    );
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let port = free_port();
    let s = Hosted::oauth("sdk", port, &issuer.url(), &token::generate()).await;
    let out = tokio::process::Command::new(&python)
        .arg(format!("{ROOT}/tests/oauth/sdk_oauth.py"))
        .arg(s.url("/mcp"))
        .arg("alice@acme")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK's OAuth client failed: {stdout}\n{stderr}"
    );
    assert!(stdout.contains("ok: auto 2026-07-28"), "{stdout}");
    assert!(stdout.contains("ok: legacy"), "{stdout}");
    let want = format!(
        r#"401 Bearer resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", scope="mcp""#
    );
    assert!(
        stdout.contains(&want),
        "the challenge the SDK saw: {stdout}"
    );
    // alice@acme is in org acme: her runs are the acme tenant's, by a user digest.
    let log = s.log_text();
    assert!(
        log.lines().any(|l| l.contains("standalone session opened")
            && l.contains(&acme("sdk"))
            && l.contains("principal=user:")),
        "{log}"
    );
    s.finish().await;
}

#[tokio::test]
async fn keys_rotate_after_one_refetch_and_the_last_good_keys_outlive_the_issuer() {
    let dir = tempdir();
    let issuer_port = free_port();
    let keys = dir.join("keys.json");
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    // The server starts while the issuer is down: it says so, and starts anyway.
    let s = Hosted::oauth(
        "keys",
        port,
        &format!("http://127.0.0.1:{issuer_port}"),
        &token::generate(),
    )
    .await;
    let log = s.log_text();
    assert!(
        log.contains(&format!("OAuth issuer http://127.0.0.1:{issuer_port}"))
            && log.contains("cannot be fetched"),
        "start-up names the unreachable issuer: {log}"
    );
    let started = Instant::now();
    let mut issuer = Issuer::start(issuer_port, &keys, false).await;
    let mcp = s.url("/mcp");
    let ok = |t: String| {
        let mcp = mcp.clone();
        async move {
            rpc(&mcp, Some(&t), "tools/list", json!({}), json!({}))
                .await
                .0
        }
    };
    let t1 = issuer.token("acme-ci", "mcp", &resource).await;
    // The server never had this issuer's keys: it tries again at most once a second (not
    // every 10 s, as before), so the first tokens after the issuer answers work.
    let mut code = ok(t1.clone()).await;
    while code != 200 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        code = ok(t1.clone()).await;
    }
    assert_eq!(
        code,
        200,
        "the issuer answers: its keys are fetched within a second or so ({:?} after it started)",
        started.elapsed()
    );
    assert_eq!(issuer.jwks_fetches().await, 1);
    let fetched_at = Instant::now();

    // Rotation: a new signing key. Its tokens carry a kid the cache lacks.
    issuer.rotate().await;
    let t2 = issuer.token("acme-ci-2", "mcp", &resource).await;
    let kid = |t: &str| -> String {
        let h = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(t.split('.').next().unwrap())
            .unwrap();
        serde_json::from_slice::<Value>(&h).unwrap()["kid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_ne!(
        kid(&t1),
        kid(&t2),
        "the rotated issuer signs with a new key"
    );
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(fetched_at.elapsed())).await;
    assert_eq!(
        ok(t2.clone()).await,
        200,
        "the new key is fetched once and accepted"
    );
    assert_eq!(issuer.jwks_fetches().await, 1, "one refetch");
    assert_eq!(ok(t1.clone()).await, 200, "the old key is still published");
    let (bogus, _) = issuer
        .sign(json!({"kid": "bogus"}), json!({"iss": issuer.url(), "sub": "x", "aud": resource, "scope": "mcp", "org": "acme", "exp": now() + 600}))
        .await;
    assert_eq!(ok(bogus.clone()).await, 401);
    assert_eq!(ok(bogus.clone()).await, 401);
    assert_eq!(
        issuer.jwks_fetches().await,
        1,
        "an unknown kid is fetched for at most once per cooldown"
    );
    let refetched_at = Instant::now();

    // The issuer goes down: a fetch fails (an unknown kid after the cooldown), and the
    // last good keys stay in use.
    issuer.stop().await;
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(refetched_at.elapsed())).await;
    assert_eq!(
        ok(bogus).await,
        401,
        "the unknown kid: a fetch, which fails"
    );
    assert_eq!(
        ok(t2).await,
        200,
        "the last good keys, with the issuer down"
    );
    assert_eq!(ok(t1).await, 200);
    assert!(
        s.log_text().contains("the last good ones stay in use"),
        "the failed fetch is logged"
    );
    s.finish().await;
}
