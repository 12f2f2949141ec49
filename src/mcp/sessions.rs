//! Stateful execution: `execute_python` runs cells in the caller's own sandbox session
//! (variables, imports and functions survive between calls), `reset_session` drops it.
//!
//! One session per MCP connection (Streamable HTTP session, legacy SSE session, or the
//! stdio connection), scoped by tenant: rmcp serves each connection with its own clone of
//! [`CodeExecutor`], and each clone carries a fresh [`Connection`] id; when the connection
//! ends, the clone is dropped and so is its session's container. The shared [`Extras`] hold the
//! sessions and cap how many live at once; a background reaper removes those idle longer
//! than the idle timeout or older than the maximum lifetime. Cells of one session run one at
//! a time (later calls queue; a call cancelled while it waits leaves the session as it was),
//! each in a run slot of the tenant's scheduler, like one-shot runs. Opening a session takes
//! one of the tenant's `max_sessions` atomically. Server shutdown removes every session, and
//! [`Extras::wait_closed`] lets it wait for that before the sandbox is drained.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};
use schemars::JsonSchema;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::args::{self, Args};
use super::progress::Progress;
use super::report::{tool_error, RunReport};
use super::workspace::Workspaces;
use super::{CodeExecutor, Settings};
use crate::backend::{Backend, Session};
use crate::job::{JobSpec, Limits};

/// Options of stateful sessions and workspaces (`serve` flags and variables).
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// A session unused this long is removed.
    pub idle: Duration,
    /// A session older than this is removed (at the end of its current cell).
    pub max_lifetime: Duration,
    /// Sessions alive at once, over all connections.
    pub max_sessions: usize,
    /// Where the workspaces live (`<data dir>/workspaces`).
    pub workspace_root: std::path::PathBuf,
    /// One workspace per tenant, shared by its MCP sessions and kept across them; otherwise
    /// (the default) each MCP session has its own, deleted when it ends.
    pub shared_workspace: bool,
}

pub mod defaults {
    use std::time::Duration;
    pub const IDLE: Duration = Duration::from_secs(600);
    pub const MAX_LIFETIME: Duration = Duration::from_secs(3600);
    pub const MAX_SESSIONS: usize = 16;
}

/// How long shutdown waits for execute_python calls to stop and sessions to close before
/// it drains the sandbox anyway (what is left then is removed by the next start-up sweep).
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            idle: defaults::IDLE,
            max_lifetime: defaults::MAX_LIFETIME,
            max_sessions: defaults::MAX_SESSIONS,
            workspace_root: crate::config::data_dir(|k| std::env::var(k).ok()).join("workspaces"),
            shared_workspace: false,
        }
    }
}

/// What every connection shares: the sandbox, the sessions, the workspaces.
pub struct Extras {
    sandbox: Arc<dyn Backend>,
    limits: Limits,
    pub(super) tenant: String,
    options: SessionOptions,
    sessions: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Sessions open or being opened (each counted by a [`Ticket`]).
    live: AtomicUsize,
    /// execute_python and reset_session calls in progress (shutdown waits for them).
    busy: AtomicUsize,
    reaper: AtomicBool,
    shutdown: Mutex<CancellationToken>,
    pub(super) workspaces: Workspaces,
}

/// One connection's session: the sandbox (when one is open) behind the lock that makes
/// cells run one at a time.
struct Slot {
    cell: tokio::sync::Mutex<Option<Live>>,
    /// Last use, for the idle timeout.
    used: Mutex<Instant>,
}

/// An open session, counted while it lives.
struct Live {
    session: Box<dyn Session>,
    /// The environment it was opened with (mounted into its container for its life).
    env: Option<crate::env::Environment>,
    opened: Instant,
    /// Digest of each workspace file as the session last received it.
    synced: HashMap<String, [u8; 32]>,
    _ticket: Ticket,
}

/// One of the tenant's `max_sessions`, taken before a session is opened (so that
/// concurrent first cells cannot pass the cap) and given back when dropped.
struct Ticket(Arc<Extras>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A call in progress, counted until it returns (or is dropped).
struct Busy(Arc<Extras>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Extras {
    pub fn new(sandbox: Arc<dyn Backend>, settings: &Settings) -> Arc<Self> {
        Arc::new(Extras {
            sandbox,
            limits: settings.limits.clone(),
            tenant: settings.tenant.clone(),
            options: settings.sessions.clone(),
            sessions: Mutex::default(),
            live: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            reaper: AtomicBool::new(false),
            shutdown: Mutex::new(CancellationToken::new()),
            workspaces: Workspaces::new(settings.sessions.workspace_root.clone()),
        })
    }

    /// Remove every session when `token` is cancelled (server shutdown).
    pub fn set_shutdown(&self, token: CancellationToken) {
        *self.shutdown.lock().unwrap_or_else(|e| e.into_inner()) = token;
    }

    fn shutdown(&self) -> CancellationToken {
        self.shutdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions with an open sandbox (or one being opened).
    pub fn live_sessions(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Take one of the `max_sessions`, atomically with the check; `None` at the cap.
    fn reserve(self: &Arc<Self>) -> Option<Ticket> {
        let max = self.options.max_sessions;
        self.live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Ticket(self.clone()))
    }

    fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// After shutdown was asked for: wait until no execute_python call is in progress and
    /// every session is closed (its container handed to the sandbox for removal), at most
    /// `deadline`. The sandbox is drained after this, so that no session container is
    /// dropped after the drain. False when the deadline passed first.
    pub async fn wait_closed(&self, deadline: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            if self.busy.load(Ordering::SeqCst) == 0 && self.live.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if t0.elapsed() >= deadline {
                tracing::warn!(
                    tenant = %self.tenant,
                    calls = self.busy.load(Ordering::SeqCst),
                    sessions = self.live.load(Ordering::SeqCst),
                    "sessions still open at the shutdown deadline"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn slot(&self, conn: u64) -> Arc<Slot> {
        self.map()
            .entry(conn)
            .or_insert_with(|| {
                Arc::new(Slot {
                    cell: tokio::sync::Mutex::new(None),
                    used: Mutex::new(Instant::now()),
                })
            })
            .clone()
    }

    /// Forget a connection's session; its container is removed once no call holds it.
    fn forget(&self, conn: u64) {
        let slot = self.map().remove(&conn);
        if let Some(slot) = slot {
            if let Ok(mut cell) = slot.cell.try_lock() {
                if cell.take().is_some() {
                    tracing::info!(conn, "session closed with its connection");
                }
            }
        }
    }

    /// Start the reaper once (from inside the runtime).
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        let shutdown = self.shutdown();
        let tick = (self.options.idle.min(self.options.max_lifetime) / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(10));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {}
                    _ = shutdown.cancelled() => {
                        if let Some(x) = weak.upgrade() {
                            let all: Vec<_> = x.map().drain().collect();
                            for (_, slot) in all {
                                if let Ok(mut c) = slot.cell.try_lock() { c.take(); }
                            }
                        }
                        return;
                    }
                }
                let Some(x) = weak.upgrade() else { return };
                x.reap();
            }
        });
    }

    /// Remove sessions idle or alive too long (skipping those running a cell).
    fn reap(&self) {
        let slots: Vec<(u64, Arc<Slot>)> =
            self.map().iter().map(|(k, v)| (*k, v.clone())).collect();
        for (conn, slot) in slots {
            let idle = slot
                .used
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed();
            let Ok(mut cell) = slot.cell.try_lock() else {
                continue;
            };
            let Some(live) = cell.as_ref() else { continue };
            let why = if idle > self.options.idle {
                "idle timeout"
            } else if live.opened.elapsed() > self.options.max_lifetime {
                "maximum lifetime"
            } else {
                continue;
            };
            tracing::info!(conn, why, "session removed");
            cell.take();
        }
    }
}

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// The identity of one connection. Cloning the executor for a new connection gives it a
/// new identity; dropping it removes that connection's session.
pub struct Connection {
    pub(super) id: u64,
    /// Random: names the connection's own workspace directory.
    key: String,
    pub(super) extras: Arc<Extras>,
}

impl Connection {
    pub fn new(extras: Arc<Extras>) -> Self {
        Connection {
            id: NEXT_CONNECTION.fetch_add(1, Ordering::SeqCst),
            key: crate::job::new_job_id(),
            extras,
        }
    }

    /// The workspace directory of this connection, under the workspace root:
    /// `<tenant>` when shared, else `<tenant>.sessions/<random>`.
    pub(super) fn workspace_key(&self) -> String {
        let tenant = crate::storage::sanitize_stem(Some(&self.extras.tenant));
        if self.extras.options.shared_workspace {
            tenant
        } else {
            format!("{tenant}.sessions/{}", self.key)
        }
    }
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        Connection::new(self.extras.clone())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.extras.forget(self.id);
        if !self.extras.options.shared_workspace {
            self.extras.workspaces.remove(&self.workspace_key());
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutePython {
    /// Python code to run in your session: statements, and optionally a final expression whose value is shown.
    pub code: String,
    /// Wall-clock limit of this call in seconds; capped by the server's maximum. Running over it ends the session.
    #[serde(default)]
    pub timeout: Option<f64>,
}

const EXECUTE_PYTHON: &str = "Run Python in your persistent session, like a notebook or REPL: variables, imports and functions defined in one call are still there in the next. \
The value of a final expression is shown as a REPL shows it (`x + 1` shows `42`). An exception returns the traceback as an error and keeps the session. \
matplotlib figures (plt.show() or left open) come back as PNG images. Your workspace files (write_file) are at /workspace. No network. \
A call that runs over its timeout or out of memory ends the session: all state is lost and the next call starts fresh. \
Sessions end after a period without calls, after a maximum lifetime, with reset_session, or when the connection closes.";

const RESET_SESSION: &str = "End your persistent execute_python session: its variables, imports and sandbox are discarded. The next execute_python call starts a fresh session (with the current environment, e.g. after install_dependencies or configure_environment). Workspace files are kept.";

const LOST: &str = "The session has ended: its state (variables, imports, functions) is gone. The next execute_python call starts a fresh session; re-run any setup you need.";

/// Short names for the text of a cell's result.
fn cell_path(conn: u64) -> String {
    format!("<session {conn}>")
}

#[tool_router(router = session_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        description = EXECUTE_PYTHON,
        input_schema = args::schema::<ExecutePython>(),
        output_schema = schema_for_output::<RunReport>()
    )]
    async fn execute_python(
        &self,
        Args(a): Args<ExecutePython>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        crate::storage::check_code_size(&a.code)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let (timeout, note) = self.timeout(a.timeout)?;
        let x = self.conn.extras.clone();
        let _busy = x.busy();
        let shutdown = x.shutdown();
        if shutdown.is_cancelled() {
            return Ok(not_run(SHUTTING_DOWN));
        }
        if let Err(e) = self.admit() {
            return Ok(tool_error(format!("the cell was not run: {e}")));
        }
        x.start_reaper();
        let slot = x.slot(self.conn.id);
        let (progress, events) = Progress::start(&ctx);
        let result = self
            .cell(&a.code, timeout, note, &slot, &ctx, &shutdown, events)
            .await;
        match progress {
            // At shutdown the client may be gone: do not hold the shutdown up for it.
            Some(p) if !shutdown.is_cancelled() => p.finish().await,
            _ => {}
        }
        Ok(result)
    }

    #[tool(description = RESET_SESSION)]
    async fn reset_session(&self) -> Result<CallToolResult, ErrorData> {
        let x = &self.conn.extras;
        let _busy = x.busy();
        let slot = x.slot(self.conn.id);
        let mut cell = slot.cell.lock().await;
        let had = cell.take().is_some();
        Ok(CallToolResult::success(vec![
            rmcp::model::ContentBlock::text(if had {
                "the session was reset: its state is gone and its sandbox removed; the next execute_python call starts fresh"
            } else {
                "there was no open session; the next execute_python call starts fresh"
            }),
        ]))
    }
}

const SHUTTING_DOWN: &str = "the server is shutting down";

/// The answer to a call that ended before its cell started: the session is as it was.
fn not_run(why: &str) -> CallToolResult {
    tool_error(format!(
        "the cell was not run: {why}. The session is unchanged (its state is kept)."
    ))
}

impl CodeExecutor {
    /// One cell: wait for this session's turn, then for a run slot (both given up, leaving
    /// the session untouched, when the call is cancelled or the server shuts down), open the
    /// session if needed, copy changed workspace files in, run the code.
    #[allow(clippy::too_many_arguments)]
    async fn cell(
        &self,
        code: &str,
        timeout: Duration,
        note: Option<String>,
        slot: &Slot,
        ctx: &RequestContext<RoleServer>,
        shutdown: &CancellationToken,
        events: crate::backend::Events,
    ) -> CallToolResult {
        let x = &self.conn.extras;
        let conn = self.conn.id;
        let started = Instant::now();
        // This session's turn: cells of one session run one at a time.
        let mut cell = tokio::select! {
            biased;
            _ = ctx.ct.cancelled() => return not_run("the request was cancelled while it waited for the previous cell"),
            _ = shutdown.cancelled() => return not_run(SHUTTING_DOWN),
            c = slot.cell.lock() => c,
        };
        if cell.as_ref().is_some_and(|l| !l.session.alive()) {
            cell.take();
        }
        // The session's environment (the current one for a session about to open), held for
        // the cell: an install into it waits for the cell, and the cell for the install.
        let env = match cell.as_ref() {
            Some(l) => l.env.clone(),
            None => self.current_env().await,
        };
        let _env_lock = match &env {
            Some(env) => tokio::select! {
                biased;
                _ = ctx.ct.cancelled() => return not_run("the request was cancelled while it waited for an install to finish"),
                _ = shutdown.cancelled() => return not_run(SHUTTING_DOWN),
                l = self.lock_env(env) => l,
            },
            None => None,
        };
        // A run slot, from the scheduler one-shot runs use (the tenant's max_concurrent_runs,
        // fair turns between tenants). Taken after the session's turn and its environment,
        // so that queued cells do not hold slots while they wait.
        let _permit = tokio::select! {
            biased;
            _ = ctx.ct.cancelled() => return not_run("the request was cancelled while it waited for a run slot"),
            _ = shutdown.cancelled() => return not_run(SHUTTING_DOWN),
            p = self.acquire_slot() => match p {
                Ok(p) => p,
                Err(e) => return not_run(&e.to_string()),
            },
        };
        *slot.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let files = match x.workspaces.input_files(&self.conn.workspace_key()).await {
            Ok(f) => f,
            Err(e) => return tool_error(e),
        };
        let mut notes: Vec<String> = note.into_iter().collect();
        if cell.is_none() {
            let Some(ticket) = x.reserve() else {
                return tool_error(format!(
                    "no session could be opened: tenant `{}` already has {} sessions open, its maximum (max_sessions). Close one (reset_session ends this connection's), wait for idle ones to expire, or use execute_code (no state).",
                    x.tenant, x.options.max_sessions
                ));
            };
            let mut job = JobSpec::python("", x.limits.clone());
            job.tenant = x.tenant.clone();
            job.files = files.clone();
            job.return_files = true;
            job.keep_warm = true;
            job.env = env.as_ref().map(|e| e.run_env()).unwrap_or_default();
            let synced = files
                .iter()
                .map(|f| (f.path.clone(), Sha256::digest(&f.contents).into()))
                .collect();
            // Dropping the future (cancelled, shutting down) removes a half-made container.
            let session = tokio::select! {
                s = x.sandbox.open_session(job) => s,
                _ = ctx.ct.cancelled() => return not_run("the request was cancelled while the session was being opened"),
                _ = shutdown.cancelled() => return not_run(SHUTTING_DOWN),
            };
            match session {
                Ok(session) => {
                    *cell = Some(Live {
                        session,
                        env,
                        opened: Instant::now(),
                        synced,
                        _ticket: ticket,
                    });
                    notes.push("a new session was started".into());
                }
                Err(e) => return tool_error(format!("the session could not be opened: {e}")),
            }
        }
        let live = cell.as_mut().expect("opened above");
        // Files written with write_file since the session opened: copy them in first. Not
        // given up on cancellation (that would leave the interpreter mid-cell); short.
        let changed: Vec<_> = files
            .iter()
            .filter(|f| {
                let d: [u8; 32] = Sha256::digest(&f.contents).into();
                live.synced.get(&f.path) != Some(&d)
            })
            .collect();
        if !changed.is_empty() {
            let changed: Vec<crate::job::InputFile> = changed.into_iter().cloned().collect();
            let synced = tokio::select! {
                r = live.session.put_files(&changed, timeout) => Some(r),
                _ = shutdown.cancelled() => None,
            };
            match synced {
                None => {
                    cell.take();
                    return tool_error(format!("the cell was not run: {SHUTTING_DOWN}. {LOST}"));
                }
                Some(Ok(())) => {
                    for f in &changed {
                        live.synced
                            .insert(f.path.clone(), Sha256::digest(&f.contents).into());
                    }
                }
                Some(Err(e)) => notes.push(format!(
                    "workspace files could not be copied into the session: {e}"
                )),
            }
            if !live.session.alive() {
                cell.take();
                return tool_error(format!(
                    "the cell was not run: the session ended while workspace files were copied in. {LOST}"
                ));
            }
        }
        if ctx.ct.is_cancelled() {
            return not_run("the request was cancelled before the cell started");
        }
        let result = tokio::select! {
            r = live.session.exec(code, timeout, events) => Some(r),
            _ = ctx.ct.cancelled() => None,
            _ = shutdown.cancelled() => None,
        };
        *slot.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        let label = match &result {
            None => "cancelled",
            Some(Err(_)) => "failed",
            Some(Ok(o)) => crate::app::metrics::outcome_label(o),
        };
        let secs = started.elapsed().as_secs_f64();
        self.metrics().run(&x.tenant, label, secs);
        tracing::info!(
            tenant = %x.tenant,
            code_sha256 = %super::tools::code_digest(code.as_bytes()),
            outcome = label,
            "session cell ran"
        );
        let outcome = match result {
            None => {
                cell.take();
                let why = if shutdown.is_cancelled() {
                    "the server is shutting down; the cell was stopped while running"
                } else {
                    "the call was cancelled while running"
                };
                return tool_error(format!("{why}. {LOST}"));
            }
            Some(Err(e)) => {
                let ended = !live.session.alive();
                if ended {
                    cell.take();
                }
                return tool_error(format!(
                    "the code could not be run: {e}{}",
                    if ended {
                        format!("\n{LOST}")
                    } else {
                        String::new()
                    }
                ));
            }
            Some(Ok(o)) => o,
        };
        // Files the cell wrote are saved to the workspace; the session already has them.
        for f in &outcome.files {
            live.synced
                .insert(f.path.clone(), Sha256::digest(&f.data).into());
        }
        if let Some(saved) =
            super::workspace::save_returned(&x.workspaces, &self.conn.workspace_key(), &outcome)
                .await
        {
            notes.push(saved);
        }
        if outcome.timed_out || outcome.oom_killed || !live.session.alive() {
            if !outcome.timed_out && !outcome.oom_killed {
                notes.push(
                    "the session's Python interpreter exited (exit(), sys.exit(), os._exit() or a crash)"
                        .into(),
                );
            }
            cell.take();
            notes.push(LOST.into());
        } else if shutdown.is_cancelled() {
            // The shutdown sweep skipped this session while the cell ran.
            cell.take();
        }
        let note = (!notes.is_empty()).then(|| notes.join("; "));
        RunReport::new(&outcome, timeout.as_secs_f64(), cell_path(conn)).into_result(note)
    }
}
