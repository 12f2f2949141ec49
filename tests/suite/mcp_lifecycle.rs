//! Long runs: progress notifications while a run goes on, and SIGTERM of a real `serve`
//! process in the middle of a run (exit 0, no container left).

use crate::mcp_support;

use std::sync::Arc;
use std::time::Duration;

use mcp_code_executor::backend::{Backend, BackendError, Events, Session, Wrap};
use mcp_code_executor::job::{JobSpec, Outcome};

use mcp_support::{common, is_error, server, structured, text, ProgressRecorder};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn progress_notifications_report_the_phases_of_a_run() {
    let s = server("t-mcp-progress").await;
    let recorder = ProgressRecorder::default();
    let client = recorder
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(s.url("/mcp")))
        .await
        .unwrap();
    let code =
        "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\n";
    let r = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(json!({"code": code}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(
        structured(&r)["stdout"].as_str().unwrap().lines().count(),
        4
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = recorder.seen.lock().unwrap().clone();
    let messages = recorder.messages();
    let has = |prefix: &str| messages.iter().any(|m| m.starts_with(prefix));
    for phase in ["queued", "started", "running:", "finished"] {
        assert!(has(phase), "no `{phase}` notification in {messages:?}");
    }
    assert!(
        seen.windows(2).all(|w| w[0].progress < w[1].progress),
        "progress must increase: {seen:?}"
    );
    client.cancel().await.unwrap();
    s.finish().await;
}

#[tokio::test]
async fn sigterm_stops_runs_removes_containers_and_exits_zero() {
    const TENANT: &str = "t-mcp-sigterm";
    let _image = common::sandbox().await;
    let dir = std::env::temp_dir().join(format!(
        "mcp-test-sigterm-{}",
        uuid::Uuid::new_v4().simple()
    ));
    // Removed when the test ends, whether it passes or not.
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["serve", "--port", "0"])
        .env("CODE_STORAGE_DIR", &dir)
        .env("MCP_EXECUTOR_TENANT", TENANT)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = common::announced_url(&mut lines, Duration::from_secs(120), true).await;
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("[server] {line}");
        }
    });
    let recorder = ProgressRecorder::default();
    let client = recorder
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
    let call = tokio::spawn(async move {
        client
            .call_tool(
                CallToolRequestParams::new("execute_code").with_arguments(
                    json!({"code": "import time\ntime.sleep(120)\n"})
                        .as_object()
                        .unwrap()
                        .clone(),
                ),
            )
            .await
    });
    recorder.wait_for("started", Duration::from_secs(30)).await;
    // The run's container is a cold one (labelled with the tenant) or one of the pool's
    // (labelled `pool`, made before or while the run waited for it): the server's all the same.
    let pid = child.id().unwrap();
    let server = common::owner_of_process(pid);
    assert!(
        !common::containers_owned_by(&server).is_empty(),
        "the run has a container"
    );
    let pid = pid as i32;
    let t_term = std::time::Instant::now();
    // SAFETY: kill(2) on the pid of a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the server exits within 30 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(
        t_term.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t_term.elapsed()
    );
    assert!(
        common::containers_of(TENANT).is_empty(),
        "containers left after shutdown: {:?}",
        common::containers_of(TENANT)
    );
    assert!(
        common::containers_owned_by(&server).is_empty(),
        "containers left after shutdown: {:?}",
        common::containers_owned_by(&server)
    );
    call.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server whose stderr reader went away (a supervisor that died, `serve 2>&1 | head`)
/// still stops at SIGTERM: writing to a closed stderr must not take the shutdown with it
/// (`eprintln!` panics on EPIPE, and its panic ended the signal watcher, so the process ran on).
#[tokio::test]
async fn sigterm_stops_a_server_whose_stderr_reader_is_gone() {
    let dir = std::env::temp_dir().join(format!(
        "mcp-test-sigterm-epipe-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["serve", "--port", "0", "--pool-size", "0"])
        .env("CODE_STORAGE_DIR", &dir)
        .env("MCP_EXECUTOR_TENANT", "t-mcp-sigterm-epipe")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = common::announced_url(&mut lines, Duration::from_secs(120), false).await;
    let ready = url.replace("/mcp", "/readyz");
    let t = std::time::Instant::now();
    while reqwest::get(&ready).await.map(|r| r.status().as_u16()).ok() != Some(200) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{ready} never said 200"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(lines); // the reader of its stderr is gone
    let pid = child.id().unwrap() as i32;
    // SAFETY: kill(2) on the pid of a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(40), child.wait())
        .await
        .expect("the server exits within 40 s of SIGTERM with its stderr reader gone")
        .unwrap();
    assert!(status.code().is_some(), "exit status {status:?}");
}

#[tokio::test]
async fn serve_refuses_to_start_when_the_self_test_fails() {
    // an image that does not exist (and may not be built) fails the start-up self-test
    let dir =
        std::env::temp_dir().join(format!("mcp-test-refuse-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    let serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args([
            "serve",
            "--stdio",
            "--no-build",
            "--image",
            "mcp-code-executor/absent:none",
        ])
        .env("CODE_STORAGE_DIR", &dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), serve)
        .await
        .expect("serve exits after a failed self-test instead of hanging")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "served despite a failed self-test: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "stdout must stay protocol-only: {:?}",
        out.stdout
    );
    assert!(stderr.contains("FAIL"), "{stderr}");
    assert!(stderr.contains("refusing to serve"), "{stderr}");
    assert!(stderr.contains("--allow-unsafe"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real sandbox, whose sessions are slow to take workspace files in (longer than the
/// HTTP server's shutdown grace period): a call can be inside that sync at shutdown.
struct SlowSync {
    inner: Arc<dyn Backend>,
    entered: Arc<tokio::sync::Notify>,
}

struct SlowSyncSession {
    inner: Box<dyn Session>,
    entered: Arc<tokio::sync::Notify>,
}

/// Only sessions change; everything else forwards to the real sandbox.
#[async_trait::async_trait]
impl Wrap for SlowSync {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        Ok(Box::new(SlowSyncSession {
            inner: self.inner.open_session(job).await?,
            entered: self.entered.clone(),
        }))
    }
}

#[async_trait::async_trait]
impl Session for SlowSyncSession {
    async fn exec(
        &mut self,
        code: &str,
        timeout: Duration,
        events: Events,
    ) -> Result<Outcome, BackendError> {
        self.inner.exec(code, timeout, events).await
    }
    async fn put_files(
        &mut self,
        files: &[mcp_code_executor::job::InputFile],
        timeout: Duration,
    ) -> Result<(), BackendError> {
        self.entered.notify_one();
        tokio::time::sleep(mcp_code_executor::mcp::transports::http::SHUTDOWN_GRACE * 2).await;
        self.inner.put_files(files, timeout).await
    }
    fn alive(&self) -> bool {
        self.inner.alive()
    }
}

#[tokio::test]
async fn shutdown_closes_a_session_busy_with_the_workspace_sync_before_draining() {
    const TENANT: &str = "t-mcp-shutsync";
    let entered = Arc::new(tokio::sync::Notify::new());
    let s = mcp_support::server_custom(
        TENANT,
        mcp_code_executor::app::Settings::default(),
        None,
        &Default::default(),
        |inner| {
            Arc::new(SlowSync {
                inner,
                entered: entered.clone(),
            })
        },
    )
    .await;
    let client = s.client().await;
    let r = mcp_support::call(&client, "execute_python", json!({"code": "1"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = mcp_support::call(
        &client,
        "write_file",
        json!({"path": "new.txt", "content": "x"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let call = tokio::spawn(async move {
        let r = mcp_support::call(&client, "execute_python", json!({"code": "2"})).await;
        (r, client)
    });
    // The call is copying the new file into the session.
    entered.notified().await;
    assert_eq!(common::containers_of(TENANT).len(), 1);
    // Shut down as `serve` does: cancel, wait for the sessions to close, drain; nothing may
    // be left right after the drain.
    s.finish().await;
    call.abort();
}
