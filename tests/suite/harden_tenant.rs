//! Issue 13, the tenant-facing bounds (split from harden_sandbox.rs, which keeps the sandbox
//! side): open sessions hold memory against the tenant's budget, environment probes and
//! installs take run slots, environments outside the allowed roots, storage writes against
//! runs per minute, stored code past its age, orphaned session workspaces. Real runner,
//! real Docker: no skips.

use crate::harden_sandbox::docker_paused;
use crate::mcp_support;
use mcp_support::common;

use std::time::Duration;

use mcp_code_executor::backend::Backend;
use mcp_code_executor::job::{JobSpec, Outcome};

// ---- item 5: environment probes and installs take run slots ------------------------------

/// Item 4, the memory half: open sessions hold their memory against the tenant's budget
/// while paused. With room for two sandboxes, two open sessions leave none: a third session
/// and a one-shot run are refused at once with a text that names the budget and how to
/// free it; once a session is reset, the run goes (before: the sessions counted nowhere
/// and both went).
#[tokio::test]
async fn open_sessions_hold_memory_against_the_tenants_budget() {
    use mcp_code_executor::app::Settings;
    use serde_json::json;
    let tenant = "t-hs-membudget";
    let _clean = common::remove_on_drop(tenant);
    let mut settings = Settings::default();
    settings.limits.memory_bytes = 256 << 20;
    settings.quota.memory_budget = Some(512 << 20);
    let server = mcp_support::server_with(tenant, settings).await;
    let (a, b, c) = (
        server.client().await,
        server.client().await,
        server.client().await,
    );
    for (client, v) in [(&a, 1), (&b, 2)] {
        let r = mcp_support::call(
            client.peer(),
            "execute_python",
            json!({"code": format!("x = {v}")}),
        )
        .await;
        assert!(!mcp_support::is_error(&r), "{}", mcp_support::text(&r));
    }
    let ids = common::own_containers_of(tenant);
    assert_eq!(ids.len(), 2, "two open sessions: {ids:?}");
    assert!(
        ids.iter().all(|id| docker_paused(id)),
        "both paused, both holding memory"
    );
    let held = server.executor.memory_held();
    assert_eq!(
        (held.sessions, held.session_count, held.runs),
        (512 << 20, 2, 0)
    );

    let started = std::time::Instant::now();
    let third = mcp_support::call(c.peer(), "execute_python", json!({"code": "print(3)"})).await;
    let run = mcp_support::call(c.peer(), "execute_code", json!({"code": "print('run')"})).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "refused at once, not left waiting"
    );
    for r in [&third, &run] {
        let text = mcp_support::text(r);
        assert!(mcp_support::is_error(r), "{text}");
        assert!(
            text.contains("memory_budget")
                && text.contains("2 open execute_python session(s) hold 512 MiB")
                && text.contains("reset_session with that session's session_id"),
            "{text}"
        );
    }
    assert_eq!(
        common::own_containers_of(tenant).len(),
        2,
        "nothing else started"
    );

    // A reset gives the session's memory back: the run goes, the other session is intact.
    let r = mcp_support::call(a.peer(), "reset_session", json!({})).await;
    assert!(!mcp_support::is_error(&r), "{}", mcp_support::text(&r));
    let run = mcp_support::call(c.peer(), "execute_code", json!({"code": "print('run')"})).await;
    assert!(!mcp_support::is_error(&run), "{}", mcp_support::text(&run));
    assert!(
        mcp_support::text(&run).contains("run"),
        "{}",
        mcp_support::text(&run)
    );
    let r = mcp_support::call(b.peer(), "execute_python", json!({"code": "x"})).await;
    assert!(
        mcp_support::text(&r).contains('2'),
        "{}",
        mcp_support::text(&r)
    );
    let held = server.executor.memory_held();
    assert_eq!(
        (held.sessions, held.session_count, held.runs),
        (256 << 20, 1, 0)
    );
    drop((a, b, c));
    server.finish().await;
}

/// The real backend, counting the runs in progress through it and the most at once.
struct Counting {
    inner: std::sync::Arc<dyn Backend>,
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

#[async_trait::async_trait]
impl mcp_code_executor::backend::Wrap for Counting {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn run(
        &self,
        job: JobSpec,
        events: mcp_code_executor::backend::Events,
    ) -> Result<Outcome, mcp_code_executor::backend::BackendError> {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.max.fetch_max(n, SeqCst);
        let r = self.inner.run(job, events).await;
        self.now.fetch_sub(1, SeqCst);
        r
    }
    async fn info(
        &self,
    ) -> Result<mcp_code_executor::backend::BackendInfo, mcp_code_executor::backend::BackendError>
    {
        self.inner.info().await
    }
    async fn drain(&self) {
        self.inner.drain().await
    }
}

/// Six concurrent configure_environment calls of a tenant limited to one run at once
/// start one probe sandbox at a time (before: all six at once).
#[tokio::test]
async fn environment_probes_wait_for_run_slots() {
    use mcp_code_executor::app::Settings;
    use mcp_code_executor::env::manager::EnvManager;
    use mcp_code_executor::env::state::{EnvState, Environments};
    use serde_json::json;
    let tenant = "t-hs-probes";
    let _clean = common::remove_on_drop(tenant);
    let data =
        std::env::temp_dir().join(format!("mcpx-hs-probes-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _data_guard = crate::common::TempDirs(vec![data.clone()]);
    let sandbox = common::sandbox().await;
    let manager = EnvManager::new(data.clone(), EnvManager::default_ca_bundle());
    let state = EnvState::init(&*sandbox, &manager, tenant, None)
        .await
        .expect("the managed environment");
    let envs = std::sync::Arc::new(Environments { manager, state });
    let venv = data.join("venv-probe");
    let ok = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(ok.success());
    let mut settings = Settings::default();
    settings.quota.max_concurrent_runs = Some(1);
    let max = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server =
        mcp_support::server_custom(tenant, settings, Some(envs), &Default::default(), |inner| {
            std::sync::Arc::new(Counting {
                inner,
                now: Default::default(),
                max: max.clone(),
            })
        })
        .await;
    let client = server.client().await;
    let calls = (0..6).map(|_| {
        let peer = client.peer().clone();
        let venv = venv.display().to_string();
        async move {
            mcp_support::call(
                &peer,
                "configure_environment",
                json!({"type": "venv", "venv_path": venv}),
            )
            .await
        }
    });
    let results = futures::future::join_all(calls).await;
    for r in &results {
        assert!(!mcp_support::is_error(r), "{}", mcp_support::text(r));
    }
    let most = max.load(std::sync::atomic::Ordering::SeqCst);
    assert!(most >= 1, "the probes ran");
    assert_eq!(
        most, 1,
        "probes at once, for a tenant allowed one run at a time"
    );
    drop(client);
    server.finish().await;
    let _ = std::fs::remove_dir_all(&data);
}

// ---- item 11: the single-tenant environment policy is an allow list ------------------------

/// A venv planted outside the allowed roots (the data directory, the configured
/// environment, MCP_EXECUTOR_ENV_ROOTS), whose `home` points at some tree, is refused;
/// so is a venv inside the data directory whose base interpreter lies outside; a path
/// outside that does not exist gets the very same text (nothing says what exists).
#[tokio::test]
async fn environments_outside_the_allowed_roots_are_refused_with_one_text() {
    use serde_json::json;
    let tenant = "t-hs-envroots";
    let _clean = common::remove_on_drop(tenant);
    let uniq = uuid::Uuid::new_v4().simple().to_string();
    let data = std::env::temp_dir().join(format!("mcpx-hs-envroots-{uniq}"));
    // Removed when the test ends, whether it passes or not.
    let _data_guard = crate::common::TempDirs(vec![data.clone()]);
    let outside = std::env::temp_dir().join(format!("mcpx-hs-planted-{uniq}"));
    // Removed when the test ends, whether it passes or not.
    let _outside_guard = crate::common::TempDirs(vec![outside.clone()]);
    // A "source tree" and a venv claiming it as its base interpreter's home.
    let tree = outside.join("tree");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::write(tree.join("secret.txt"), "not for sandboxes").unwrap();
    let plant = |venv: &std::path::Path| {
        std::fs::create_dir_all(venv.join("bin")).unwrap();
        std::fs::write(
            venv.join("pyvenv.cfg"),
            format!(
                "home = {}\ninclude-system-site-packages = false\nversion = 3.11.2\n",
                tree.join("bin").display()
            ),
        )
        .unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", venv.join("bin/python")).unwrap();
    };
    let planted = outside.join("venv");
    plant(&planted);
    let server = mcp_support::server_with_environments(tenant, &data).await;
    let inside_bad_base = data.join("venv-bad-base");
    plant(&inside_bad_base);
    let client = server.client().await;
    let configure = |path: String| {
        let peer = client.peer().clone();
        async move {
            mcp_support::call(
                &peer,
                "configure_environment",
                json!({"type": "venv", "venv_path": path}),
            )
            .await
        }
    };
    let missing = outside.join("no-such-venv");
    let mut texts = vec![];
    for p in [&planted, &missing, &inside_bad_base] {
        let shown = p.display().to_string();
        let r = configure(shown.clone()).await;
        let t = mcp_support::text(&r);
        assert!(mcp_support::is_error(&r), "{shown} accepted: {t}");
        assert!(
            t.contains("is not an environment this server may use"),
            "{shown}: {t}"
        );
        texts.push(t.replace(&shown, "PATH"));
    }
    assert_eq!(
        texts[0], texts[1],
        "one text, whether the path exists or not"
    );
    assert_eq!(texts[0], texts[2], "and for a base interpreter outside");
    // A venv inside the data directory still works.
    let good = data.join("venv-good");
    let ok = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&good)
        .status()
        .unwrap();
    assert!(ok.success());
    let r = configure(good.display().to_string()).await;
    assert!(!mcp_support::is_error(&r), "{}", mcp_support::text(&r));
    drop(client);
    server.finish().await;
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&outside);
}

// ---- item 6: storage ---------------------------------------------------------------------

/// initialize_code_file and append_to_code_file write to disk without starting a
/// container: they count against the tenant's runs per minute all the same.
#[tokio::test]
async fn storage_writes_count_against_runs_per_minute() {
    use serde_json::json;
    let tenant = "t-hs-storerate";
    let _clean = common::remove_on_drop(tenant);
    let mut settings = mcp_code_executor::app::Settings::default();
    settings.quota.runs_per_minute = Some(2);
    let server = mcp_support::server_with(tenant, settings).await;
    let client = server.client().await;
    let mut refused = 0;
    for i in 0..4 {
        let r = mcp_support::try_call(
            client.peer(),
            "initialize_code_file",
            json!({"content": format!("x = {i}\n"), "filename": "w"}),
        )
        .await;
        match r {
            Ok(r) if !mcp_support::is_error(&r) => {}
            Ok(r) => {
                assert!(
                    mcp_support::text(&r).contains("runs per minute"),
                    "{}",
                    mcp_support::text(&r)
                );
                refused += 1;
            }
            Err(e) => {
                assert!(e.to_string().contains("runs per minute"), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!(
        refused, 2,
        "two of four writes over a quota of two per minute"
    );
    drop(client);
    server.finish().await;
}

/// Stored code not modified for longer than the configured age is removed when the
/// tenant's executor starts (and later, hourly, on writes); newer code stays.
#[tokio::test]
async fn stored_code_past_its_age_is_removed() {
    let dir = std::env::temp_dir().join(format!("mcpx-hs-age-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    std::fs::create_dir_all(&dir).unwrap();
    let old = dir.join("old_0123abcd.py");
    let new = dir.join("new_4567abcd.py");
    std::fs::write(&old, "print('old')\n").unwrap();
    std::fs::write(&new, "print('new')\n").unwrap();
    let ok = std::process::Command::new("touch")
        .args(["-m", "-d", "3 hours ago"])
        .arg(&old)
        .status()
        .unwrap();
    assert!(ok.success());
    let storage = mcp_code_executor::storage::CodeStorage::open(&dir).unwrap();
    let mut settings = mcp_code_executor::app::Settings {
        tenant: "t-hs-age".into(),
        ..Default::default()
    };
    settings.sessions.workspace_root = dir.with_extension("ws");
    settings.quota.code_max_age = Some(Duration::from_secs(3600));
    let sandbox = common::sandbox().await;
    let mut service = mcp_code_executor::app::Service::new(
        sandbox as std::sync::Arc<dyn Backend>,
        mcp_code_executor::app::Capacity::default(),
    );
    let _ex = service.add_tenant(mcp_code_executor::app::TenantParts {
        settings,
        storage: Some(storage),
        environments: None,
    });
    assert!(
        !old.exists(),
        "code untouched for 3 h, over a 1 h age, is removed"
    );
    assert!(new.exists(), "newer code stays");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(dir.with_extension("ws"));
}

/// Session workspaces left by a server that died (kill -9) are swept when the tenant's
/// executor starts, unless another live server process shares the directory.
#[tokio::test]
async fn orphaned_session_workspaces_are_swept_at_start_up() {
    use std::os::unix::io::AsRawFd as _;
    let root =
        std::env::temp_dir().join(format!("mcpx-hs-orphans-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _root_guard = crate::common::TempDirs(vec![root.clone()]);
    let orphan = root.join("t-hs-orph.sessions/0123456789abcdef");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("big.bin"), vec![0u8; 1 << 20]).unwrap();
    // A dead process's claim (nobody holds its lock) and a live one's (this test holds it).
    let dead = root.join("t-hs-orph.sessions.owner-999999999");
    std::fs::write(&dead, b"").unwrap();
    let live_path = root.join("t-hs-orph.sessions.owner-1");
    let live = std::fs::File::create(&live_path).unwrap();
    // SAFETY: flock on a file this test owns.
    assert_eq!(
        unsafe { libc::flock(live.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) },
        0
    );
    let sandbox = common::sandbox().await;
    let start = || {
        let mut settings = mcp_code_executor::app::Settings {
            tenant: "t-hs-orph".into(),
            ..Default::default()
        };
        settings.sessions.workspace_root = root.clone();
        let mut service = mcp_code_executor::app::Service::new(
            sandbox.clone() as std::sync::Arc<dyn Backend>,
            mcp_code_executor::app::Capacity::default(),
        );
        service.add_tenant(mcp_code_executor::app::TenantParts {
            settings,
            storage: None,
            environments: None,
        })
    };
    let ex = start();
    assert!(
        orphan.exists(),
        "another live server shares the directory: kept"
    );
    assert!(!dead.exists(), "a dead process's claim goes");
    drop(ex);
    drop(live);
    let _ex = start();
    assert!(
        !orphan.exists(),
        "nobody else alive: the orphaned workspace is swept"
    );
    let _ = std::fs::remove_dir_all(&root);
}
