//! Files sessions (issue 42, finding 3): what one-shot runs without a session keep opens a
//! session of their principal that takes none of the tenant's `max_sessions`; a principal
//! keeps at most `max_sessions` of them, the least recently used going first.

use std::sync::Arc;

use super::*;
use crate::backend::fake::FakeBackend;
use crate::tenancy::oauth::{Principal, User};

fn user(tenant: &str, subject: &str) -> Principal {
    Principal {
        tenant: tenant.into(),
        user: Some(User {
            issuer: "https://as.example".into(),
            subject: subject.into(),
            client_id: None,
            scopes: vec!["mcp".into()],
        }),
    }
}

fn executor(tenant: &str, max_sessions: usize) -> (Service, Arc<Executor>) {
    let mut s = Service::new(
        FakeBackend::new(),
        Capacity {
            max_concurrent: 2,
            max_queue: 8,
        },
    );
    let settings = Settings {
        tenant: tenant.into(),
        sessions: SessionOptions {
            workspace_root: crate::scratch::scratch_root()
                .join(format!("app-{}", crate::job::new_job_id())),
            max_sessions,
            ..SessionOptions::default()
        },
        ..Settings::default()
    };
    let ex = s.add_tenant(TenantParts {
        settings,
        storage: None,
        environments: None,
    });
    (s, ex)
}

fn stateless<'a>(principal: &'a Principal, handle: Option<&'a str>, open: bool) -> Wanted<'a> {
    Wanted {
        handle,
        stateless: true,
        open,
        principal: Some(principal),
    }
}

/// Before: each run's kept output opened a standalone session holding one of the tenant's
/// two sessions, so user A's third run kept nothing and user B could open no session.
#[tokio::test]
async fn one_users_kept_outputs_leave_the_tenants_sessions_to_the_others() {
    let (_s, ex) = executor("t-files-sessions", 2);
    let (a, b) = (
        user("t-files-sessions", "alice"),
        user("t-files-sessions", "bob"),
    );
    let mut handles = Vec::new();
    for i in 0..5 {
        // A new connection per request, as a 2026-07-28 client makes.
        let c = Connection::new(ex.clone());
        c.session(stateless(&a, None, false)).unwrap();
        let kept = c
            .keep_files(
                None,
                vec![("last-run-stdout.txt".into(), vec![b'x'; 100 + i])],
            )
            .await;
        assert_eq!(kept.refused, None, "run {i} of A kept its output");
        handles.push(kept.session.expect("a files session").handle().to_string());
        assert_eq!(ex.live_sessions(), 0, "files sessions hold no place");
    }
    // A keeps the last two (its max_sessions); the older ones went, least recent first.
    let c = Connection::new(ex.clone());
    for (i, h) in handles.iter().enumerate() {
        let found = c.session(stateless(&a, Some(h), false));
        assert_eq!(found.is_ok(), i >= 3, "session of run {i}");
    }
    let s = c
        .session(stateless(&a, Some(&handles[4]), false))
        .unwrap()
        .unwrap();
    let (_, data) = c.read_file(&s, "last-run-stdout.txt").await.unwrap();
    assert_eq!(data.len(), 104);
    // Nobody else finds them, and B opens sessions of its own.
    assert!(c.session(stateless(&b, Some(&handles[4]), false)).is_err());
    let cb = Connection::new(ex.clone());
    let sb = cb.session(stateless(&b, None, true)).unwrap().unwrap();
    assert!(sb.created);
    assert_eq!(ex.live_sessions(), 1, "B's standalone session holds one");
    let cb2 = Connection::new(ex.clone());
    assert!(cb2.session(stateless(&b, None, true)).is_ok());
}

/// A files session one call still holds is never the one removed; when all are held the
/// keep is refused with words that say so, and nothing else is lost.
#[tokio::test]
async fn a_files_session_in_use_is_not_removed() {
    let (_s, ex) = executor("t-files-held", 1);
    let a = user("t-files-held", "alice");
    let c = Connection::new(ex.clone());
    c.session(stateless(&a, None, false)).unwrap();
    let first = c
        .keep_files(None, vec![("f.txt".into(), b"one".to_vec())])
        .await;
    let held = first.session.expect("kept");
    let second = c
        .keep_files(None, vec![("f.txt".into(), b"two".to_vec())])
        .await;
    assert!(second.session.is_none());
    let why = second.refused.expect("refused");
    assert!(why.contains("in use"), "{why}");
    let (_, data) = c.read_file(&held, "f.txt").await.unwrap();
    assert_eq!(data, b"one");
    drop(held);
    let third = c
        .keep_files(None, vec![("f.txt".into(), b"three".to_vec())])
        .await;
    assert!(third.session.is_some(), "{:?}", third.refused);
}
