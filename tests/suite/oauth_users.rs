//! Two signed-in users of one organisation (one tenant) and the tenant's static token,
//! against a real authorization server (npm `oidc-provider`) and the real binary, through
//! rmcp's client and raw JSON-RPC at 2026-07-28: what one of them makes is not the other's
//! (issue 42). Stored code (`initialize_code_file`, `append_to_code_file`, `read_code_file`,
//! `execute_code_file`, the files `execute_code` keeps) is per user; a user's tasks are
//! freed at the end of their lifetime, so the tenant's bound on kept tasks holds whatever
//! the number of its users; one user's outputs kept for runs without a session do not take
//! the tenant's sessions from the others.

mod support;

use mcp_code_executor::tenancy::token;
use serde_json::json;

use crate::mcp_support::{call, is_error, structured, text};
use support::{text_of, tool, Hosted, Issuer, TempDir};

/// Issue 42, finding 2: user B of the same organisation gets A's file_path (results show
/// it, the info log records it) and tries to read A's file (which holds an API key), append
/// to it and run it; the static token of the tenant tries too. Each is refused, and A's
/// next run runs A's code only. Before the fix B read the key, appended `print('B was
/// here')`, and A's next `execute_code_file` printed it.
#[tokio::test]
async fn stored_code_is_each_users_own() {
    let keys = TempDir::new("oauth-users-iss");
    let issuer = Issuer::start(&keys.0.join("keys.json")).await;
    let static_token = token::generate();
    let s = Hosted::start("t-users-code", &issuer, &static_token, "", &[]).await;
    let mcp = s.mcp();
    let (ta, tb) = (
        issuer.token("acme-ci", &s.resource()).await,
        issuer.token("acme-ci-2", &s.resource()).await,
    );

    // A, with rmcp's client: a file holding a key, then an append.
    let a = s.client(&ta).await;
    let r = call(
        &a,
        "initialize_code_file",
        json!({"filename": "flow", "content": "API_KEY = 'sk-live-of-A'\n"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let path = structured(&r)["file_path"].as_str().unwrap().to_string();
    let name = path.rsplit('/').next().unwrap().to_string();
    let r = call(
        &a,
        "append_to_code_file",
        json!({"file_path": path, "content": "print('A ran', len(API_KEY))\n"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    // A's execute_code keeps its code too, a path B may learn.
    let r = call(&a, "execute_code", json!({"code": "print('kept of A')"})).await;
    let kept = structured(&r)["file_path"].as_str().unwrap().to_string();
    // Such paths are in the log (`run requested`), as the review says.
    assert!(s.log_text().contains(&kept), "the log records the file");

    // B (same tenant, another user) and the tenant's static token: by A's path and by its
    // bare name, nothing of A's is read, changed or run.
    for (who, t) in [("B", &tb), ("static token", &static_token)] {
        for p in [&path, &name, &kept] {
            let r = tool(&mcp, t, "read_code_file", json!({"file_path": p})).await;
            assert!(
                r["isError"] == true && !r.to_string().contains("sk-live-of-A"),
                "{who} read_code_file {p}: {r}"
            );
            let r = tool(
                &mcp,
                t,
                "append_to_code_file",
                json!({"file_path": p, "content": "print('B was here')\n"}),
            )
            .await;
            assert_eq!(r["isError"], true, "{who} append_to_code_file {p}: {r}");
            let r = tool(&mcp, t, "execute_code_file", json!({"file_path": p})).await;
            let out = text_of(&r);
            assert!(
                r["isError"] == true && !out.contains("A ran") && !out.contains("kept of A"),
                "{who} execute_code_file {p}: {r}"
            );
        }
    }
    // A's file is as A left it, and runs A's code alone.
    let r = call(&a, "read_code_file", json!({"file_path": path})).await;
    assert_eq!(
        structured(&r)["content"],
        "API_KEY = 'sk-live-of-A'\nprint('A ran', len(API_KEY))\n",
        "{}",
        text(&r)
    );
    let r = call(&a, "execute_code_file", json!({"file_path": path})).await;
    assert_eq!(structured(&r)["stdout"], "A ran 12\n", "{}", text(&r));
    // By bare name too, and on a request of its own (no protocol session).
    let r = tool(&mcp, &ta, "execute_code_file", json!({"file_path": name})).await;
    assert_eq!(r["structuredContent"]["stdout"], "A ran 12\n", "{r}");

    // B's own files work the same way, in B's own directory; A does not reach them.
    let r = tool(
        &mcp,
        &tb,
        "initialize_code_file",
        json!({"content": "print('B ran')\n"}),
    )
    .await;
    let b_path = r["structuredContent"]["file_path"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let r = tool(&mcp, &tb, "execute_code_file", json!({"file_path": b_path})).await;
    assert_eq!(r["structuredContent"]["stdout"], "B ran\n", "{r}");
    let r = call(&a, "read_code_file", json!({"file_path": b_path})).await;
    assert!(is_error(&r), "A reads B's: {}", text(&r));

    // The static token keeps the tenant's directory itself, as before the change: its
    // files are where they always were, and users do not reach them.
    let r = tool(
        &mcp,
        &static_token,
        "initialize_code_file",
        json!({"content": "print('static ran')\n"}),
    )
    .await;
    let st_path = r["structuredContent"]["file_path"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let tenant_dir = s.dir.0.join("code").join(&s.tenant).canonicalize().unwrap();
    assert_eq!(
        std::path::Path::new(&st_path).parent().unwrap(),
        tenant_dir,
        "{st_path}"
    );
    let user_dir = std::path::Path::new(&path).parent().unwrap().to_path_buf();
    assert_eq!(
        user_dir.parent().unwrap(),
        tenant_dir.join("users"),
        "{path}"
    );
    let r = tool(
        &mcp,
        &static_token,
        "execute_code_file",
        json!({"file_path": st_path}),
    )
    .await;
    assert_eq!(r["structuredContent"]["stdout"], "static ran\n", "{r}");
    for t in [&ta, &tb] {
        let r = tool(&mcp, t, "read_code_file", json!({"file_path": st_path})).await;
        assert_eq!(r["isError"], true, "{r}");
    }
    a.cancel().await.unwrap();
    s.finish().await;
}
