//! Fast tests of the core against the fake backend ([`crate::backend::fake`]): admission,
//! fair run slots, environment locking, sessions (state, caps, lifecycle), cancellation and
//! shutdown. The real-Docker suite under `tests/` proves the whole; these prove the rules.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::backend::fake::FakeBackend;
use crate::backend::Backend;
use crate::job::{JobSpec, Limits};

fn settings(tenant: &str) -> Settings {
    Settings {
        tenant: tenant.into(),
        sessions: SessionOptions {
            workspace_root: crate::scratch::scratch_root()
                .join(format!("app-{}", crate::job::new_job_id())),
            ..SessionOptions::default()
        },
        ..Settings::default()
    }
}

fn service(backend: Arc<dyn Backend>, slots: usize) -> Service {
    Service::new(
        backend,
        Capacity {
            max_concurrent: slots,
            max_queue: 64,
        },
    )
}

fn tenant(s: &mut Service, settings: Settings) -> Arc<Executor> {
    s.add_tenant(TenantParts {
        settings,
        storage: None,
        environments: None,
    })
}

/// The connection's own session (a stateful transport, no handle).
fn own(c: &Connection) -> SessionRef {
    c.session(Wanted {
        handle: None,
        stateless: false,
        open: true,
        principal: None,
    })
    .unwrap()
    .unwrap()
}

fn job(tenant: &str, name: &str) -> JobSpec {
    let mut j = JobSpec::python("print(1)", Limits::default());
    j.tenant = tenant.into();
    j.entry = name.into();
    j.files[0].path = name.into();
    j
}

#[tokio::test]
async fn runs_past_the_rate_are_refused_before_the_backend_sees_them() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 4);
    let mut set = settings("acme");
    set.quota.runs_per_minute = Some(2);
    let ex = tenant(&mut s, set);
    let never = CancellationToken::new();
    for i in 0..2 {
        let o = ex
            .run(job("acme", &format!("r{i}.py")), None, None, &never)
            .await;
        assert!(o.expect("within the rate").success());
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let e = ex
        .run(job("acme", "r2.py"), None, Some(tx), &never)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, AppError::Refused(m) if m.contains("2 runs per minute")),
        "{e}"
    );
    assert!(
        rx.try_recv().is_err(),
        "a refused run says nothing (not even `queued`)"
    );
    // An admitted one says so first.
    let mut roomy = settings("roomy");
    roomy.quota.runs_per_minute = Some(5);
    let other = tenant(&mut s, roomy);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    other
        .run(job("roomy", "a.py"), None, Some(tx), &never)
        .await
        .unwrap();
    assert_eq!(rx.try_recv().ok(), Some(crate::job::RunEvent::Admitted));
    assert_eq!(
        fake.jobs().iter().filter(|j| j.tenant == "acme").count(),
        2,
        "the refused run never reached the backend"
    );
    let m = s.metrics_text();
    assert!(
        m.contains(r#"mcp_executor_rejected_total{tenant="acme",reason="rate"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"mcp_executor_runs_total{tenant="acme",outcome="ok"} 2"#),
        "{m}"
    );
}

#[tokio::test]
async fn slots_are_shared_fairly_and_a_tenant_stays_within_its_cap() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let mut capped = settings("flood");
    capped.quota.max_concurrent_runs = Some(1);
    let flood = tenant(&mut s, capped);
    let quiet = tenant(&mut s, settings("quiet"));
    fake.hold();
    let never = CancellationToken::new();
    let mut calls = Vec::new();
    for i in 0..6 {
        let (ex, never) = (flood.clone(), never.clone());
        calls.push(tokio::spawn(async move {
            ex.run(job("flood", &format!("f{i}.py")), None, None, &never)
                .await
        }));
    }
    // The flooding tenant holds one slot (its cap), not both.
    fake.wait_running(1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.running(), 1, "the cap of 1 held while a slot was free");
    let q = {
        let (ex, never) = (quiet.clone(), never.clone());
        tokio::spawn(async move { ex.run(job("quiet", "q.py"), None, None, &never).await })
    };
    // The quiet tenant gets the free slot at once, ahead of the five queued flood runs.
    fake.wait_running(2).await;
    assert!(fake.jobs().iter().any(|j| j.tenant == "quiet"));
    fake.release();
    assert!(q.await.unwrap().unwrap().success());
    for c in calls {
        assert!(c.await.unwrap().unwrap().success());
    }
    assert_eq!(fake.max_running(), 2, "never more than the two slots");
    assert_eq!(fake.live(), 0);
}

/// Issue 24, item 5: one tenant's long runs (tasks) hold at most half the slots; another
/// tenant's normal call runs at once beside them, not after them.
#[tokio::test]
async fn long_runs_of_one_tenant_leave_slots_to_another() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 4);
    let busy = tenant(&mut s, settings("busy"));
    let other = tenant(&mut s, settings("other"));
    fake.hold();
    let never = CancellationToken::new();
    let mut long = Vec::new();
    for i in 0..8 {
        let (ex, never) = (busy.clone(), never.clone());
        long.push(tokio::spawn(executor::as_long_run(async move {
            ex.run(job("busy", &format!("l{i}.py")), None, None, &never)
                .await
        })));
    }
    fake.wait_running(2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.running(), 2, "long runs took more than half the slots");
    let q = {
        let (ex, never) = (other.clone(), never.clone());
        tokio::spawn(async move { ex.run(job("other", "q.py"), None, None, &never).await })
    };
    fake.wait_running(3).await;
    assert!(fake.jobs().iter().any(|j| j.tenant == "other"));
    fake.release();
    assert!(q.await.unwrap().unwrap().success());
    for c in long {
        assert!(c.await.unwrap().unwrap().success());
    }
    assert_eq!(fake.live(), 0);
}

#[tokio::test]
async fn a_cancelled_run_is_stopped_and_its_sandbox_removed() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 1);
    let ex = tenant(&mut s, settings("acme"));
    fake.hold();
    let cancel = CancellationToken::new();
    let run = {
        let (ex, cancel) = (ex.clone(), cancel.clone());
        tokio::spawn(async move { ex.run(job("acme", "a.py"), None, None, &cancel).await })
    };
    fake.wait_running(1).await;
    assert_eq!(fake.live(), 1);
    cancel.cancel();
    let e = run.await.unwrap().unwrap_err();
    assert!(matches!(e, AppError::Cancelled), "{e}");
    assert_eq!(fake.live(), 0, "dropping the run removed its sandbox");
    // A queued run cancelled before it had a slot never reaches the backend.
    let first = {
        let ex = ex.clone();
        tokio::spawn(async move {
            ex.run(job("acme", "b.py"), None, None, &CancellationToken::new())
                .await
        })
    };
    fake.wait_running(1).await;
    let queued = CancellationToken::new();
    let waiting = {
        let (ex, queued) = (ex.clone(), queued.clone());
        tokio::spawn(async move { ex.run(job("acme", "c.py"), None, None, &queued).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    queued.cancel();
    assert!(matches!(waiting.await.unwrap(), Err(AppError::Cancelled)));
    fake.release();
    first.await.unwrap().unwrap();
    assert!(fake.jobs().iter().all(|j| j.entry != "c.py"));
    assert!(s.metrics_text().contains(r#"outcome="cancelled"} 2"#));
}

#[tokio::test]
async fn sessions_keep_state_are_capped_and_go_with_their_connection() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let mut set = settings("acme");
    set.sessions.max_sessions = 1;
    let ex = tenant(&mut s, set);
    let t = (Duration::from_secs(5), None);
    let never = CancellationToken::new();
    let a = Connection::new(ex.clone());
    let b = Connection::new(ex.clone());
    let out = |d: cell::CellDone| d.outcome.stdout_text();
    let first = a
        .cell(&own(&a), "x = 41", t.clone(), None, &never)
        .await
        .unwrap();
    assert_eq!(first.note.as_deref(), Some("a new session was started"));
    assert_eq!(out(first), "cell 1 files \n");
    assert_eq!(
        out(a
            .cell(&own(&a), "x + 1", t.clone(), None, &never)
            .await
            .unwrap()),
        "cell 2 files \n",
        "the same session, its state kept"
    );
    assert_eq!(ex.live_sessions(), 1);
    let e = b
        .cell(&own(&b), "y = 1", t.clone(), None, &never)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("max_sessions"), "{e}");
    // A dropped connection takes its session with it; the other may open one now.
    drop(a);
    assert_eq!(ex.live_sessions(), 0);
    assert_eq!(fake.live(), 0);
    assert_eq!(
        out(b
            .cell(&own(&b), "y = 1", t.clone(), None, &never)
            .await
            .unwrap()),
        "cell 1 files \n"
    );
    assert!(b.reset_session(&own(&b)).await);
    assert!(!b.reset_session(&own(&b)).await, "nothing left to reset");
    assert_eq!(fake.live(), 0);
    // exit() ends the session and says so; the next cell starts a fresh one.
    b.cell(&own(&b), "z = 1", t.clone(), None, &never)
        .await
        .unwrap();
    let ended = b
        .cell(&own(&b), "exit()", t.clone(), None, &never)
        .await
        .unwrap();
    assert!(ended.note.unwrap().contains("The session has ended"));
    assert_eq!(ex.live_sessions(), 0);
    assert_eq!(
        out(b.cell(&own(&b), "z", t, None, &never).await.unwrap()),
        "cell 1 files \n"
    );
}

#[tokio::test]
async fn workspace_files_reach_runs_and_sessions_once() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let ex = tenant(&mut s, settings("acme"));
    let c = Connection::new(ex.clone());
    let never = CancellationToken::new();
    let t = (Duration::from_secs(5), None);
    c.write_file(&own(&c), "/workspace/a.csv", b"1,2\n")
        .await
        .unwrap();
    let e = c
        .write_file(&own(&c), "../etc/passwd", b"x")
        .await
        .unwrap_err();
    assert!(matches!(e, AppError::Failed(_)), "{e}");
    let first = c
        .cell(&own(&c), "1", t.clone(), None, &never)
        .await
        .unwrap();
    assert_eq!(first.outcome.stdout_text(), "cell 1 files a.csv\n");
    c.write_file(&own(&c), "b.csv", b"3\n").await.unwrap();
    c.cell(&own(&c), "2", t.clone(), None, &never)
        .await
        .unwrap();
    c.cell(&own(&c), "3", t, None, &never).await.unwrap();
    assert_eq!(
        fake.put_files(),
        vec!["b.csv".to_string()],
        "only the file written after the session opened is put in, once"
    );
    let names: Vec<String> = c
        .list_files(&own(&c), None)
        .await
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["a.csv", "b.csv"]);
    assert_eq!(c.read_file(&own(&c), "./b.csv").await.unwrap().1, b"3\n");
    // The connection's own workspace goes with it.
    let root = ex.settings().sessions.workspace_root.clone();
    drop(c);
    let left: Vec<_> = std::fs::read_dir(root.join("acme.sessions"))
        .map(|d| d.collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(root);
}

/// What a cell's answer keeps in the workspace (its figures, output too long to send) is
/// put into the session's sandbox in the background, before the next cell asks for it,
/// once; a session without a sandbox is left alone.
#[tokio::test]
async fn files_kept_after_a_cell_go_into_its_session_before_the_next_cell() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let ex = tenant(&mut s, settings("acme"));
    let c = Connection::new(ex.clone());
    let never = CancellationToken::new();
    let t = (Duration::from_secs(5), None);
    c.cell(&own(&c), "1", t.clone(), None, &never)
        .await
        .unwrap();
    let kept = c
        .keep_files(
            Some(own(&c)),
            vec![("figure-001.png".into(), b"png".to_vec())],
        )
        .await;
    assert_eq!(kept.names, ["figure-001.png"]);
    let t0 = std::time::Instant::now();
    while fake.put_files().is_empty() && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        fake.put_files(),
        ["figure-001.png"],
        "put in without a cell"
    );
    let next = c
        .cell(&own(&c), "2", t.clone(), None, &never)
        .await
        .unwrap();
    assert_eq!(next.outcome.stdout_text(), "cell 2 files figure-001.png\n");
    assert_eq!(fake.put_files(), ["figure-001.png"], "and not again");
    // Rewritten with other bytes of the same size: put in again; with the same: not.
    c.write_file(&own(&c), "figure-001.png", b"PNG")
        .await
        .unwrap();
    c.cell(&own(&c), "3", t.clone(), None, &never)
        .await
        .unwrap();
    c.write_file(&own(&c), "figure-001.png", b"PNG")
        .await
        .unwrap();
    c.cell(&own(&c), "4", t, None, &never).await.unwrap();
    assert_eq!(fake.put_files(), ["figure-001.png", "figure-001.png"]);
    // A run's own files session (no sandbox) keeps without a copy.
    let other = Connection::new(ex.clone());
    let files = other
        .keep_files(None, vec![("out.txt".into(), b"x".to_vec())])
        .await;
    assert!(files.session.is_some(), "{:?}", files.refused);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(fake.put_files(), ["figure-001.png", "figure-001.png"]);
}

#[tokio::test]
async fn shutdown_stops_runs_closes_sessions_then_shuts_the_backend_down() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let ex = tenant(&mut s, settings("acme"));
    let c = Connection::new(ex.clone());
    let never = CancellationToken::new();
    c.cell(
        &own(&c),
        "x = 1",
        (Duration::from_secs(5), None),
        None,
        &never,
    )
    .await
    .unwrap();
    fake.hold();
    let run = {
        let ex = ex.clone();
        tokio::spawn(async move {
            ex.run(job("acme", "a.py"), None, None, &CancellationToken::new())
                .await
        })
    };
    fake.wait_running(1).await;
    assert_eq!(fake.live(), 2, "a run and a session");
    tokio::time::timeout(Duration::from_secs(5), s.shutdown())
        .await
        .expect("shutdown is bounded");
    assert!(matches!(run.await.unwrap(), Err(AppError::ShuttingDown)));
    assert_eq!(ex.live_sessions(), 0);
    assert_eq!(fake.live(), 0, "the session's sandbox went too");
    assert!(fake.was_shut_down(), "the backend was shut down last");
    let e = c
        .cell(&own(&c), "x", (Duration::from_secs(5), None), None, &never)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("shutting down"), "{e}");
}

#[tokio::test]
async fn handles_name_sessions_across_connections_within_a_tenant_only() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let mut set = settings("acme");
    set.sessions.max_sessions = 2;
    // Long enough that a loaded machine's stall between two calls does not expire it (CI
    // once failed here with 300 ms), short enough to wait for below.
    set.sessions.idle = Duration::from_millis(1500);
    let ex = tenant(&mut s, set);
    let other = tenant(&mut s, settings("globex"));
    let t = (Duration::from_secs(5), None);
    let never = CancellationToken::new();
    let stateless = |handle| Wanted {
        handle,
        stateless: true,
        open: true,
        principal: None,
    };
    // A stateless request without a handle opens a standalone session...
    let first = Connection::new(ex.clone());
    let s1 = first.session(stateless(None)).unwrap().unwrap();
    assert!(s1.created);
    let h = s1.handle().to_string();
    assert!(h.starts_with("s_") && h.len() == 43, "{h}");
    first
        .cell(&s1, "x = 41", t.clone(), None, &never)
        .await
        .unwrap();
    first.write_file(&s1, "a.txt", b"hi").await.unwrap();
    drop(first);
    // ...which outlives that request's connection: the next one names it.
    let next = Connection::new(ex.clone());
    let s1b = next.session(stateless(Some(&h))).unwrap().unwrap();
    assert!(!s1b.created);
    let out = next
        .cell(&s1b, "x + 1", t.clone(), None, &never)
        .await
        .unwrap();
    assert_eq!(
        out.outcome.stdout_text(),
        "cell 2 files a.txt\n",
        "same REPL"
    );
    assert_eq!(next.read_file(&s1b, "a.txt").await.unwrap().1, b"hi");
    // Without open, a stateless request gets no session.
    let none = next
        .session(Wanted {
            handle: None,
            stateless: true,
            open: false,
            principal: None,
        })
        .unwrap();
    assert!(none.is_none());
    // Another tenant's handle, or a made-up one: the same "not found".
    let stranger = Connection::new(other.clone());
    let e1 = stranger
        .session(stateless(Some(&h)))
        .err()
        .unwrap()
        .to_string();
    let e2 = next
        .session(stateless(Some("s_00000000000000000000000000000000")))
        .err()
        .unwrap()
        .to_string();
    assert!(e1.contains("not found"), "{e1}");
    assert_eq!(
        e1.replace(&h, "H"),
        e2.replace("s_00000000000000000000000000000000", "H")
    );
    // Standalone sessions count against max_sessions for their whole life.
    let s2 = next.session(stateless(None)).unwrap().unwrap();
    assert_eq!(ex.live_sessions(), 2);
    let e = next.session(stateless(None)).err().unwrap().to_string();
    assert!(e.contains("max_sessions"), "{e}");
    // Idle ones expire, workspace and all; their handle is then unknown.
    let root = ex.settings().sessions.workspace_root.clone();
    drop((s1, s1b, s2));
    tokio::time::timeout(Duration::from_secs(10), async {
        while ex.live_sessions() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("idle standalone sessions expire");
    assert!(next.session(stateless(Some(&h))).is_err());
    assert_eq!(fake.live(), 0);
    let left: Vec<_> = std::fs::read_dir(root.join("acme.sessions"))
        .map(|d| d.collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(root);
}

/// `reset_session` gives a standalone session's place among `max_sessions` back at once
/// (it was held until the handle's idle expiry, 600 s by default); the handle and its
/// workspace stay, and a REPL opened in it again takes a place while open.
#[tokio::test]
async fn reset_frees_a_standalone_sessions_place_at_once() {
    let fake = FakeBackend::new();
    let mut s = service(fake.clone(), 2);
    let mut set = settings("acme-reset");
    set.sessions.max_sessions = 1;
    let ex = tenant(&mut s, set);
    let t = (Duration::from_secs(5), None);
    let never = CancellationToken::new();
    let stateless = |handle| Wanted {
        handle,
        stateless: true,
        open: true,
        principal: None,
    };
    let c = Connection::new(ex.clone());
    let s1 = c.session(stateless(None)).unwrap().unwrap();
    c.cell(&s1, "x = 1", t.clone(), None, &never).await.unwrap();
    c.write_file(&s1, "kept.txt", b"kept").await.unwrap();
    assert_eq!(ex.live_sessions(), 1);
    let e = c.session(stateless(None)).err().unwrap().to_string();
    assert!(
        e.contains("max_sessions"),
        "at the cap before the reset: {e}"
    );
    assert!(c.reset_session(&s1).await, "a REPL was open");
    assert_eq!(ex.live_sessions(), 0, "its place is back at once");
    assert_eq!(fake.live(), 0, "its sandbox is gone");
    // Another session opens now, not after 600 s.
    let s2 = c.session(stateless(None)).unwrap().unwrap();
    assert!(s2.created);
    c.cell(&s2, "y = 2", t.clone(), None, &never).await.unwrap();
    assert_eq!(ex.live_sessions(), 1);
    // The reset handle still names its workspace; a REPL in it needs a place again.
    let again = c.session(stateless(Some(s1.handle()))).unwrap().unwrap();
    assert!(!again.created);
    assert_eq!(c.read_file(&again, "kept.txt").await.unwrap().1, b"kept");
    let e = c
        .cell(&again, "x", t.clone(), None, &never)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("max_sessions"), "{e}");
    assert!(c.reset_session(&s2).await);
    assert_eq!(ex.live_sessions(), 0);
    c.cell(&again, "z = 3", t.clone(), None, &never)
        .await
        .unwrap();
    assert_eq!(ex.live_sessions(), 1, "held while its REPL is open");
    assert!(c.reset_session(&again).await);
    assert_eq!(ex.live_sessions(), 0);
    assert_eq!(fake.live(), 0);
    let root = ex.settings().sessions.workspace_root.clone();
    drop((s1, s2, again, c));
    let _ = std::fs::remove_dir_all(root);
}

mod env_lock {
    //! A run waits for an install into its environment, and holds no run slot meanwhile.

    use super::*;
    use crate::backend::{BackendError, Events};
    use crate::env::manager::EnvManager;
    use crate::env::state::{EnvState, Environments};
    use crate::env::testing::Recorder;
    use crate::job::Outcome;
    use crate::scratch::tempdir;
    use tokio::sync::watch;

    /// The environment fake, whose install phase waits at a gate.
    struct GatedInstall {
        inner: Recorder,
        gate: watch::Sender<bool>,
        installing: tokio::sync::Notify,
    }

    #[async_trait::async_trait]
    impl crate::backend::Wrap for GatedInstall {
        fn inner(&self) -> &dyn Backend {
            &self.inner
        }
        async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
            if job.files.iter().any(|f| f.path == "install.json") {
                self.installing.notify_one();
                let mut open = self.gate.subscribe();
                while !*open.borrow_and_update() {
                    open.changed().await.unwrap();
                }
            }
            Backend::run(&self.inner, job, events).await
        }
    }

    #[tokio::test]
    async fn a_run_waits_for_an_install_without_holding_a_slot() {
        let t = tempdir();
        let fake = Arc::new(GatedInstall {
            inner: Recorder::default(),
            gate: watch::channel(false).0,
            installing: tokio::sync::Notify::new(),
        });
        let manager = EnvManager::new(t.join("data"), None);
        let state = EnvState::init(&*fake, &manager, "acme", None)
            .await
            .unwrap();
        let envs = Arc::new(Environments { manager, state });
        let mut s = service(fake.clone(), 1);
        let ex = s.add_tenant(TenantParts {
            settings: settings("acme"),
            storage: None,
            environments: Some(envs),
        });
        let install = {
            let ex = ex.clone();
            tokio::spawn(async move {
                packages::install(&ex, None, &["six".into()], None, &CancellationToken::new()).await
            })
        };
        fake.installing.notified().await;
        let jobs_before = fake.inner.jobs().len();
        let run = {
            let ex = ex.clone();
            tokio::spawn(async move {
                let env = ex.current_env().await;
                ex.run(job("acme", "a.py"), env, None, &CancellationToken::new())
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            fake.inner.jobs().len(),
            jobs_before,
            "the run waited for the install"
        );
        assert_eq!(
            s.scheduler().depth().running,
            1,
            "and held no run slot while it waited: the one in use is the install's own \
             (install phases take run slots like every run)"
        );
        fake.gate.send_replace(true);
        install.await.unwrap().expect("the install");
        let o = run.await.unwrap().expect("the run, after the install");
        assert!(o.success());
        let last = fake.inner.jobs().pop().unwrap();
        assert_eq!(last.entry, "a.py", "the run came after the install");
        std::fs::remove_dir_all(t).ok();
    }
}
