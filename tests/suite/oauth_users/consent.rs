//! Issue 46: a consent question is its asker's. User A's question (code mode, 2026-07-28
//! `input_required`) answered with the token of user B, signed in to the same tenant
//! through the same issuer: refused like any bad state, nothing written, and A's own answer
//! still works. The raw requests are `tests/sdk/consent.py`'s (mode `tenants`, which takes
//! any two bearer tokens).

use super::support::{Hosted, Issuer, TempDir};
use crate::codemode::{everything_and_filesystem, sdk_output};
use crate::common;

#[tokio::test]
async fn another_users_answer_is_refused() {
    let keys = TempDir::new("oauth-users-consent");
    let root = keys.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let tools = keys.0.join("tools.toml");
    std::fs::write(&tools, everything_and_filesystem(&root)).unwrap();
    let issuer = Issuer::start(&keys.0.join("keys.json")).await;
    let static_token = mcp_code_executor::tenancy::token::generate();
    let s = Hosted::start(
        "t-users-consent",
        &issuer,
        &static_token,
        "",
        &["--tools", tools.to_str().unwrap()],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let (ta, tb) = (
        issuer.token("acme-ci", &s.resource()).await,
        issuer.token("acme-ci-2", &s.resource()).await,
    );
    let args = [
        root.as_os_str(),
        "tenants".as_ref(),
        ta.as_ref(),
        tb.as_ref(),
    ];
    let out = sdk_output(&s.mcp(), "consent.py", &args).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ok: another caller's answer refused"),
        "{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log_text()
    );
}
