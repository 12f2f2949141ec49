//! Consent the 2026-07-28 way (#46): a destructive code-mode call the operator has not
//! allowed is put to the client's user as an `input_required` result, answered by the
//! official Python SDK's own driver with its elicitation callback
//! (`tests/sdk/consent.py`), against the real server-filesystem upstream.

use std::path::Path;

use crate::codemode::{everything_and_filesystem, sdk_script, start, TempDir};
use crate::common;
use crate::process::Server;

/// `tests/sdk/consent.py` against `s` with `root` as the filesystem server's root.
async fn sdk(s: &Server, root: &Path, extra: &[&str]) -> String {
    let mut args = vec![root.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    sdk_script(s, "consent.py", &args).await
}

/// Accept writes, decline raises ToolDenied and writes nothing, two writes ask twice, a
/// session cell asks; tampered, misused and replayed states are refused and change
/// nothing; a client without the callback is not asked; legacy mode keeps elicitation; a
/// task asks through its `input_required` status and `tasks/update`, and cancelling it
/// while it asks ends it.
#[tokio::test]
async fn a_destructive_call_asks_through_input_required() {
    let dir = TempDir::new("consent");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let s = start("consent", &everything_and_filesystem(&root), &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let out = sdk(&s, &root, &[]).await;
    for line in [
        "ok: accept",
        "ok: two writes, two questions",
        "ok: session cell",
        "ok: decline",
        "ok: a client that cannot answer",
        "ok: tampered and misused states refused",
        "ok: replay refused",
        "ok: legacy elicitation",
        "ok: task asks through input_required",
        "ok: task cancelled while asking",
    ] {
        assert!(out.contains(line), "{line} missing:\n{out}");
    }
}

/// A question nobody answers within the call's limit stops the run: nothing written, its
/// sandbox removed, a late answer told so; once as long again has passed, the state has
/// expired and is refused; the next call runs.
#[tokio::test]
async fn an_abandoned_question_ends_the_run_and_its_state_expires() {
    let dir = TempDir::new("abandon");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let conf = format!(
        "[limits]\ncall_timeout_s = 5\n{}",
        everything_and_filesystem(&root)
    );
    let s = start("consent-abandon", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let out = sdk(&s, &root, &["abandon"]).await;
    for line in [
        "was not answered within 5s",
        "ok: abandoned",
        "ok: expired state refused",
        "ok: the next call runs",
    ] {
        assert!(out.contains(line), "{line} missing:\n{out}");
    }
    // The stopped runs' sandboxes (the pool is empty: each run's own, labelled with the
    // tenant) are gone once the last call has answered.
    let t0 = std::time::Instant::now();
    while !common::containers_of(&s.tenant).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(15),
            "sandboxes left: {:?}",
            common::containers_of(&s.tenant)
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Tenant A's question, answered with tenant B's token: refused like any bad state,
/// nothing written, and A's own answer still works (raw 2026-07-28 requests).
#[tokio::test]
async fn another_tenants_answer_is_refused() {
    let dir = TempDir::new("consent-tenants");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let (tenants, a, b, ta, tb) = crate::codemode::two_tenants(&dir.0, "ct", "", "");
    let s = start(
        "consent-tenants",
        &everything_and_filesystem(&root),
        &dir.0,
        &["--tenants", tenants.to_str().unwrap()],
    )
    .await;
    let _clean_a = common::remove_on_drop(&a);
    let _clean_b = common::remove_on_drop(&b);
    let out = sdk(&s, &root, &["tenants", &ta, &tb]).await;
    assert!(out.contains("ok: another caller's answer refused"), "{out}");
}

/// Two questions pending together and the run's own timeout: a late answer gets the run's
/// end (before: the second question of a run that was over, and the run's result and
/// state held until shutdown, its end waiting behind that question).
#[tokio::test]
async fn a_run_that_ends_with_two_questions_pending_answers_its_end() {
    let dir = TempDir::new("consent-two");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let s = start(
        "consent-two",
        &everything_and_filesystem(&root),
        &dir.0,
        &[],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let out = sdk(&s, &root, &["two-pending"]).await;
    assert!(
        out.contains("ok: two pending questions and the run's timeout"),
        "{out}"
    );
}
