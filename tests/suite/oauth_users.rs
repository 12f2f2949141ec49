//! Two signed-in users of one organisation (one tenant) and the tenant's static token,
//! against a real authorization server (npm `oidc-provider`) and the real binary, through
//! rmcp's client and raw JSON-RPC at 2026-07-28: what one of them makes is not the other's
//! (issue 42). Stored code (`initialize_code_file`, `append_to_code_file`, `read_code_file`,
//! `execute_code_file`, the files `execute_code` keeps) is per user; a user's tasks are
//! freed at the end of their lifetime, so the tenant's bound on kept tasks holds whatever
//! the number of its users; one user's outputs kept for runs without a session do not take
//! the tenant's sessions from the others; a consent question is answered by its asker
//! only (issue 46, `consent.rs`).

mod consent;
mod support;

use mcp_code_executor::tenancy::token;
use std::time::Duration;

use serde_json::{json, Value};

use crate::mcp_support::{call, is_error, structured, text};
use support::{rpc, text_of, tool, with_tasks, Hosted, Issuer, TempDir};

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

/// Poll `tasks/get` until the task is terminal.
async fn wait_terminal(url: &str, token: &str, id: &str) -> Value {
    let t0 = std::time::Instant::now();
    loop {
        let t = rpc(
            url,
            token,
            "tasks/get",
            json!({ "taskId": id }),
            with_tasks(),
        )
        .await;
        let status = t["status"].as_str().unwrap_or_else(|| panic!("{t}"));
        if ["completed", "failed", "cancelled"].contains(&status) {
            return t;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "{id} still {t}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Start task-augmented `execute_code` runs of `code` as `token` until the tenant's bound
/// refuses one (at most `max`), then wait for all to end: how many were started.
async fn fill_with_tasks(url: &str, token: &str, code: &str, max: usize) -> usize {
    let mut ids = Vec::new();
    for _ in 0..max {
        let r = rpc(
            url,
            token,
            "tools/call",
            json!({"name": "execute_code", "arguments": {"code": code, "timeout": 5}}),
            with_tasks(),
        )
        .await;
        match r["taskId"].as_str() {
            Some(id) => ids.push(id.to_string()),
            None => {
                let why = r["error"]["message"].as_str().unwrap_or("");
                assert!(
                    why.contains("tasks kept"),
                    "refused for another reason: {r}"
                );
                break;
            }
        }
    }
    for id in &ids {
        let t = wait_terminal(url, token, id).await;
        assert_eq!(t["status"], "completed", "{t}");
    }
    ids.len()
}

/// Output a result cannot carry whole: each task keeps about 640 KiB (the most a result
/// holds) until it expires.
const LONG_OUTPUT: &str = "print('x' * 900_000)";

/// The tenant's bound of kept task results for this test (`--task-results-limit`): 16 MiB
/// are about 26 results of [`LONG_OUTPUT`], where the default 64 MiB took 100 runs a fill.
const RESULTS_LIMIT_MIB: u64 = 16;

/// How long results are kept (`--task-ttl`): a task's TTL, counted from its creation, is its
/// 5 s timeout plus this, which must cover the queue of a whole fill, as all its tasks are
/// started at once (at load 8 here 27 tasks took 40 s; at load 30, 26 took over 80 s and
/// failed at a TTL of 80 s); the test waits it out once. Was 150 s for fills of 100 tasks.
const TASK_TTL_SECS: u64 = 120;

/// Issue 42, finding 3: user A fills the tenant's kept task results; once they
/// expired, user B fills it again, A never calling in between. The tenant's bound must be
/// the real one: A's results are freed at the end of their lifetime, so B's take their
/// place and the server's memory does not grow by a second cap. Before the fix rmcp kept A's
/// results until A's next call while the ledger counted them gone (review: RSS 25 -> 94 MiB
/// after A, 160 MiB after B, with the default 64 MiB bound).
#[tokio::test]
async fn expired_tasks_are_freed_so_the_tenants_cap_holds_for_all_its_users() {
    let keys = TempDir::new("oauth-users-iss");
    let issuer = Issuer::start(&keys.0.join("keys.json")).await;
    let static_token = token::generate();
    let (ttl, limit) = (TASK_TTL_SECS.to_string(), format!("{RESULTS_LIMIT_MIB}m"));
    let s = Hosted::start(
        "t-users-tasks",
        &issuer,
        &static_token,
        "",
        &["--task-ttl", &ttl, "--task-results-limit", &limit],
    )
    .await;
    let mcp = s.mcp();
    let (ta, tb) = (
        issuer.token("acme-ci", &s.resource()).await,
        issuer.token("acme-ci-2", &s.resource()).await,
    );
    let rss0 = s.rss_mib();
    let n_a = fill_with_tasks(&mcp, &ta, LONG_OUTPUT, 200).await;
    let rss_a = s.rss_mib();
    eprintln!("A: {n_a} tasks, RSS {rss0:.1} -> {rss_a:.1} MiB");
    // Each kept result is about 640 KiB: the bound, not another one, stopped A.
    let results = (RESULTS_LIMIT_MIB << 20) / (640 << 10);
    assert!(
        n_a as u64 + 4 >= results,
        "A filled the {RESULTS_LIMIT_MIB} MiB cap with {n_a} tasks (about {results} expected)"
    );
    // A's results expire (the task's TTL, 5 s more than --task-ttl, after each ended,
    // then a second of grace and the 5 s sweep), and A does not call again.
    tokio::time::sleep(Duration::from_secs(TASK_TTL_SECS + 5 + 12)).await;
    let rss_idle = s.rss_mib();
    let n_b = fill_with_tasks(&mcp, &tb, LONG_OUTPUT, 200).await;
    let rss_b = s.rss_mib();
    eprintln!(
        "B: {n_b} tasks, RSS {rss_idle:.1} (A's expired) -> {rss_b:.1} MiB (A's fill took {:.1} MiB)",
        rss_a - rss0
    );
    assert!(n_b + 10 >= n_a, "B filled the cap as A did: {n_b} of {n_a}");
    let grown = rss_b - rss_a;
    assert!(
        grown < (rss_a - rss0) / 2.0,
        "a second user's tasks added {grown:.1} MiB on top of the first's {:.1} MiB: \
         RSS {rss0:.1} -> {rss_a:.1} -> {rss_b:.1}",
        rss_a - rss0
    );
    s.finish().await;
}

/// Issue 42, finding 3 (sessions): each of user A's task runs with long output kept it in
/// a new session; with the tenant's `max_sessions = 2`, A's third run used the last one and
/// user B got "no session could be opened" from `execute_python` until A's expired (ten
/// minutes). Now what runs keep opens sessions of A's own that take none of the tenant's.
#[tokio::test]
async fn one_users_kept_outputs_leave_sessions_to_the_others() {
    let keys = TempDir::new("oauth-users-iss");
    let issuer = Issuer::start(&keys.0.join("keys.json")).await;
    let static_token = token::generate();
    let s = Hosted::start(
        "t-users-sessions",
        &issuer,
        &static_token,
        "max_sessions = 2",
        &[],
    )
    .await;
    let mcp = s.mcp();
    let (ta, tb) = (
        issuer.token("acme-ci", &s.resource()).await,
        issuer.token("acme-ci-2", &s.resource()).await,
    );
    let mut kept = Vec::new();
    for _ in 0..3 {
        let r = rpc(
            &mcp,
            &ta,
            "tools/call",
            json!({"name": "execute_code", "arguments": {"code": LONG_OUTPUT}}),
            with_tasks(),
        )
        .await;
        let id = r["taskId"].as_str().unwrap_or_else(|| panic!("{r}"));
        let t = wait_terminal(&mcp, &ta, id).await;
        let r = &t["result"];
        assert_eq!(
            r["structuredContent"]["stdout_file"],
            "last-run-stdout.txt",
            "the whole output is kept: {}",
            text_of(r)
        );
        kept.push(
            r["structuredContent"]["session_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // B, then A, open sessions (stateless execute_python).
    for (who, t) in [("B", &tb), ("A", &ta)] {
        let r = tool(
            &mcp,
            t,
            "execute_python",
            json!({"code": "x = 1\nprint(x)"}),
        )
        .await;
        assert!(
            r["isError"] != true && r["structuredContent"]["stdout"] == "1\n",
            "{who}: {r}"
        );
    }
    // A reads its last output back with the handle the result gave.
    let r = tool(
        &mcp,
        &ta,
        "read_file",
        json!({"path": "last-run-stdout.txt", "session_id": kept[2]}),
    )
    .await;
    assert!(r["isError"] != true, "{r}");
    s.finish().await;
}
