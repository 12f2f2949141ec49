//! Issue 42's sign-in findings, against the real binary and the real issuer:
//! - 8: a plain-http issuer "on loopback" was a prefix match (`http://localhost.attacker.example`
//!   was accepted);
//! - 9: every refused token wrote its untrusted `iss`/`kid` to the log (2,000 bad tokens:
//!   22.3 MB in 7.2 s);
//! - 10: `crit`, an empty `sub`, an `exp` that never comes, and `typ`.

use super::*;
use futures::StreamExt as _;
use mcp_code_executor::tenancy::oauth::refusal_log;

/// Finding 8: `serve` refuses an issuer whose host only starts like `localhost` or
/// `127.0.0.1`, at start-up, naming the rule; before, it started and would have fetched the
/// keys over plain HTTP from that host.
#[tokio::test]
async fn an_issuer_that_only_looks_like_loopback_is_refused_at_start_up() {
    let dir = tempdir();
    for issuer in [
        "http://localhost.attacker.example",
        "http://127.0.0.1.nip.io:8080",
        "http://localhost@attacker.example",
    ] {
        let file = format!(
            "[[tenants]]\nid = \"t-oauth-h8\"\n\n[[oauth_rules]]\nissuer = \"{issuer}\"\nclaim = \"org\"\nvalue = \"acme\"\ntenant = \"t-oauth-h8\"\n"
        );
        std::fs::write(dir.join("tenants.toml"), file).unwrap();
        let out = tokio::time::timeout(
            Duration::from_secs(120),
            tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
                .args(["serve", "--pool-size", "0", "--port", "0"])
                .arg("--tenants")
                .arg(dir.join("tenants.toml"))
                .args([
                    "--public-url",
                    "http://127.0.0.1:9",
                    "--oauth-issuer",
                    issuer,
                ])
                .env("CODE_STORAGE_DIR", dir.join("code"))
                .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
                .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.join("ws"))
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("serve stops at once")
        .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{issuer} accepted: {err}");
        assert!(
            err.contains("--oauth-issuer") && err.contains("loopback"),
            "{issuer}: {err}"
        );
        assert!(!err.contains("Streamable HTTP at"), "{err}");
    }
}

/// A JWT of `header` and `payload` with a junk signature (nothing checks it before the
/// issuer and key are known).
fn unsigned(header: Value, payload: Value) -> String {
    format!(
        "{}.{}.c2ln",
        b64(header.to_string().as_bytes()),
        b64(payload.to_string().as_bytes())
    )
}

/// Finding 9: 2,000 requests with bad tokens whose `iss` and `kid` are kilobytes of junk
/// holding newlines and a forged log line. Before: one info line each, with the whole `iss`
/// (about 11 KB a line, 22 MB in all). Now: a few lines, at `warn` (the default level shows
/// them), each short, escaped, naming the reason; every refusal counted by reason in
/// `/metrics`; the next line after the burst says how many were not logged.
#[tokio::test]
async fn refused_tokens_write_a_bounded_log_and_are_counted() {
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let port = free_port();
    let s = Hosted::oauth("h9", port, &issuer.url(), &token::generate()).await;
    let mcp = s.url("/mcp");
    let http = reqwest::Client::new();
    let metrics = |http: reqwest::Client, url: String| async move {
        http.get(url).send().await.unwrap().text().await.unwrap()
    };
    let before_invalid = metric(&metrics(http.clone(), s.url("/metrics")).await, "invalid");
    let junk = format!(
        "x\nINFO mcp_code_executor::tenancy::oauth: FORGED admin sign-in {}",
        "A".repeat(5_500)
    );
    // Half with an untrusted issuer of 5.5 KB, half naming the real issuer with an
    // unknown key id of 5.5 KB (the key-set refetch path).
    let tokens: Vec<String> = (0..2000)
        .map(|i| {
            if i % 2 == 0 {
                unsigned(
                    json!({"alg": "RS256", "kid": junk}),
                    json!({"iss": format!("{junk}{i}"), "sub": "s"}),
                )
            } else {
                unsigned(
                    json!({"alg": "RS256", "kid": format!("{junk}{i}")}),
                    json!({"iss": issuer.url(), "sub": "s"}),
                )
            }
        })
        .collect();
    assert!(
        tokens.iter().all(|t| t.len() < 16 * 1024),
        "under the token cap"
    );
    let log_before = s.log_text().len();
    let started = Instant::now();
    let statuses: Vec<u16> = futures::stream::iter(tokens.iter().cloned())
        .map(|t| {
            let (http, mcp) = (http.clone(), mcp.clone());
            async move {
                http.post(&mcp)
                    .bearer_auth(t)
                    .header("Content-Type", "application/json")
                    .header("Accept", "application/json, text/event-stream")
                    .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let took = started.elapsed();
    assert!(statuses.iter().all(|s| *s == 401), "all refused");
    // The log lines arrive through a pipe: let them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = s.log_text().len() - log_before;
    let text = s.log_text()[log_before..].to_string();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("refused: authentication"))
        .collect();
    eprintln!(
        "2,000 bad tokens in {:.1} s: {grown} bytes of log, {} refusal lines",
        took.as_secs_f64(),
        lines.len()
    );
    assert!(grown < 16 * 1024, "{grown} bytes of log for 2,000 refusals");
    // At most a burst per window begun (the 2,000 may take more than one here).
    let windows = took.as_secs() / refusal_log::WINDOW.as_secs() + 2;
    assert!(
        !lines.is_empty() && lines.len() as u64 <= u64::from(refusal_log::BURST) * windows,
        "{text}"
    );
    for l in &lines {
        assert!(l.contains(" WARN "), "seen at the default level: {l}");
        assert!(
            l.contains("reason=\"invalid\"") || l.contains("reason=invalid"),
            "{l}"
        );
        assert!(l.len() < 800, "a short line: {} bytes", l.len());
    }
    assert!(
        lines.iter().any(|l| l.contains("is not trusted"))
            || lines.iter().any(|l| l.contains("no key")),
        "the reason is there: {text}"
    );
    assert!(
        !text.lines().any(
            |l| l.starts_with("INFO mcp_code_executor::tenancy::oauth: FORGED")
                || l.contains("FORGED") && !l.contains("refused: authentication")
        ),
        "no forged line: {text}"
    );
    let after_invalid = metric(&metrics(http.clone(), s.url("/metrics")).await, "invalid");
    assert_eq!(
        after_invalid - before_invalid,
        2000,
        "every refusal counted"
    );
    // After the window, the next refusal's line says how many were not logged.
    tokio::time::sleep(refusal_log::WINDOW).await;
    let (status, _, _) = rpc(&mcp, Some(&tokens[0]), "tools/list", json!({}), json!({})).await;
    assert_eq!(status, 401);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = s.log_text()[log_before..].to_string();
    let refusal_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("refused: authentication"))
        .collect();
    let said_not_logged: u64 = refusal_lines
        .iter()
        .filter_map(|l| l.split("not_logged=").nth(1))
        .map(|v| v.trim().parse::<u64>().unwrap())
        .sum();
    assert!(
        refusal_lines.last().unwrap().contains("not_logged=") && said_not_logged > 0,
        "{log}"
    );
    assert_eq!(
        said_not_logged + refusal_lines.len() as u64,
        2001,
        "every refusal is either logged or counted in a later line: {log}"
    );
    s.finish().await;
}

/// Finding 10, with tokens the real issuer signs: `crit` (any), an empty `sub`, an `exp`
/// years away and a `typ` of another kind of JWT are refused as invalid tokens (401,
/// counted `invalid`); `typ` `at+jwt` (oidc-provider's), `JWT` or none are taken.
#[tokio::test]
async fn crit_an_empty_sub_a_far_exp_and_a_foreign_typ_are_refused() {
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let port = free_port();
    let s = Hosted::oauth("h10", port, &issuer.url(), &token::generate()).await;
    let mcp = s.url("/mcp");
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let claims = |extra: Value| {
        let mut c = json!({
            "iss": issuer.url(), "sub": "user-1", "aud": resource, "scope": "mcp",
            "org": "acme", "client_id": "acme-ci", "iat": now(), "exp": now() + 600,
        });
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let status = |t: String| {
        let mcp = mcp.clone();
        async move {
            rpc(&mcp, Some(&t), "tools/list", json!({}), json!({}))
                .await
                .0
        }
    };
    for (what, header) in [
        ("typ at+jwt", json!({})),
        ("typ JWT", json!({"typ": "JWT"})),
        ("no typ", json!({"typ": null})),
    ] {
        let (t, _) = issuer.sign(header, claims(json!({}))).await;
        assert_eq!(status(t).await, 200, "{what} is taken");
    }
    let http = reqwest::Client::new();
    let invalid = || async {
        let m = http
            .get(s.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric(&m, "invalid")
    };
    let before = invalid().await;
    let refused = [
        (
            "crit [exp]",
            json!({"crit": ["exp"], "exp": now() + 600}),
            json!({}),
        ),
        ("typ dpop+jwt", json!({"typ": "dpop+jwt"}), json!({})),
        ("typ logout+jwt", json!({"typ": "logout+jwt"}), json!({})),
        ("empty sub", json!({}), json!({"sub": ""})),
        (
            "exp in the year 9999",
            json!({}),
            json!({"exp": 253_402_300_799u64}),
        ),
        (
            "exp 2^53-1",
            json!({}),
            json!({"exp": 9_007_199_254_740_991u64}),
        ),
    ];
    for (what, header, extra) in &refused {
        let (t, _) = issuer.sign(header.clone(), claims(extra.clone())).await;
        assert_eq!(status(t).await, 401, "{what} must be refused");
    }
    assert_eq!(invalid().await - before, refused.len() as u64);
    s.finish().await;
}
