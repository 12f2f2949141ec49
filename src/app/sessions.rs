//! Stateful execution: `execute_python` cells run in the connection's own sandbox session
//! (variables, imports and functions survive between calls); `reset_session` drops it.
//!
//! One session per connection (an MCP Streamable HTTP or legacy SSE session, or the stdio
//! connection), scoped by tenant: each [`Connection`](super::Connection) has its own id, and
//! when it is dropped its session's container goes too. [`Sessions`] holds one tenant's
//! sessions and caps how many live at once; a background reaper removes those idle longer
//! than the idle timeout or older than the maximum lifetime. Cells of one session run one at
//! a time (later calls queue; a call cancelled while it waits leaves the session as it was),
//! each in a run slot of the scheduler, like one-shot runs. Opening a session takes one of
//! the tenant's `max_sessions` atomically. Server shutdown removes every session, and
//! [`Sessions::wait_closed`] lets it wait for that before the backend shuts down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::error::AppError;
use super::executor::{code_digest, Executor};
use super::settings::{SessionOptions, Settings};
use crate::backend::{Events, Session};
use crate::job::{JobSpec, Limits, Outcome};

/// The execute_python sessions of one tenant, over all its connections.
pub struct Sessions {
    limits: Limits,
    tenant: String,
    options: SessionOptions,
    sessions: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Sessions open or being opened (each counted by a [`Ticket`]).
    live: AtomicUsize,
    /// execute_python and reset_session calls in progress (shutdown waits for them).
    busy: AtomicUsize,
    reaper: AtomicBool,
    shutdown: CancellationToken,
}

/// One connection's session: the sandbox (when one is open) behind the lock that makes
/// cells run one at a time.
pub(super) struct Slot {
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
struct Ticket(Arc<Sessions>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A call in progress, counted until it returns (or is dropped).
pub(super) struct Busy(Arc<Sessions>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Sessions {
    /// The sessions of the tenant of `settings`; all removed when `shutdown` is cancelled.
    pub fn new(settings: &Settings, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Sessions {
            limits: settings.limits.clone(),
            tenant: settings.tenant.clone(),
            options: settings.sessions.clone(),
            sessions: Mutex::default(),
            live: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            reaper: AtomicBool::new(false),
            shutdown,
        })
    }

    pub(super) fn options(&self) -> &SessionOptions {
        &self.options
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

    pub(super) fn busy(self: &Arc<Self>) -> Busy {
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

    pub(super) fn slot(&self, conn: u64) -> Arc<Slot> {
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
    pub(super) fn forget(&self, conn: u64) {
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
    pub(super) fn start_reaper(self: &Arc<Self>) {
        if self.reaper.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
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

/// The text of a lost session, for the model.
pub const LOST: &str = "The session has ended: its state (variables, imports, functions) is gone. The next execute_python call starts a fresh session; re-run any setup you need.";

const SHUTTING_DOWN: &str = "the server is shutting down";

/// The answer to a call that ended before its cell started: the session is as it was.
fn not_run(why: &str) -> AppError {
    AppError::Failed(format!(
        "the cell was not run: {why}. The session is unchanged (its state is kept)."
    ))
}

fn failed(text: String) -> AppError {
    AppError::Failed(text)
}

/// A cell that ran: its outcome, the limit that applied, and notes for the caller.
#[derive(Debug)]
pub struct CellDone {
    pub outcome: Outcome,
    pub timeout: Duration,
    pub note: Option<String>,
}

/// One cell of connection `conn` (workspace `key`): wait for this session's turn, then for a
/// run slot (both given up, leaving the session untouched, when the call is cancelled or the
/// server shuts down), open the session if needed, copy changed workspace files in, run
/// the code.
#[allow(clippy::too_many_arguments)]
pub(super) async fn cell(
    ex: &Executor,
    conn: u64,
    key: &str,
    code: &str,
    timeout: Duration,
    note: Option<String>,
    cancel: &CancellationToken,
    events: Events,
) -> Result<CellDone, AppError> {
    let x = &ex.sessions;
    let _busy = x.busy();
    let shutdown = x.shutdown.clone();
    if shutdown.is_cancelled() {
        return Err(not_run(SHUTTING_DOWN));
    }
    if let Err(e) = ex.admit() {
        return Err(failed(format!("the cell was not run: {e}")));
    }
    x.start_reaper();
    let slot = x.slot(conn);
    let started = Instant::now();
    // This session's turn: cells of one session run one at a time.
    let mut cell = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(not_run("the request was cancelled while it waited for the previous cell")),
        _ = shutdown.cancelled() => return Err(not_run(SHUTTING_DOWN)),
        c = slot.cell.lock() => c,
    };
    if cell.as_ref().is_some_and(|l| !l.session.alive()) {
        cell.take();
    }
    // The session's environment (the current one for a session about to open), held for
    // the cell: an install into it waits for the cell, and the cell for the install.
    let env = match cell.as_ref() {
        Some(l) => l.env.clone(),
        None => ex.current_env().await,
    };
    let _env_lock = match &env {
        Some(env) => tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(not_run("the request was cancelled while it waited for an install to finish")),
            _ = shutdown.cancelled() => return Err(not_run(SHUTTING_DOWN)),
            l = ex.lock_env(env) => l,
        },
        None => None,
    };
    // A run slot, from the scheduler one-shot runs use (the tenant's max_concurrent_runs,
    // fair turns between tenants). Taken after the session's turn and its environment,
    // so that queued cells do not hold slots while they wait.
    let _permit = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Err(not_run("the request was cancelled while it waited for a run slot")),
        _ = shutdown.cancelled() => return Err(not_run(SHUTTING_DOWN)),
        p = ex.acquire_slot() => match p {
            Ok(p) => p,
            Err(e) => return Err(not_run(&e.to_string())),
        },
    };
    *slot.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    let files = ex.workspaces.input_files(key).await.map_err(failed)?;
    let mut notes: Vec<String> = note.into_iter().collect();
    if cell.is_none() {
        let Some(ticket) = x.reserve() else {
            return Err(failed(format!(
                "no session could be opened: tenant `{}` already has {} sessions open, its maximum (max_sessions). Close one (reset_session ends this connection's), wait for idle ones to expire, or use execute_code (no state).",
                x.tenant, x.options.max_sessions
            )));
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
            s = ex.backend().open_session(job) => s,
            _ = cancel.cancelled() => return Err(not_run("the request was cancelled while the session was being opened")),
            _ = shutdown.cancelled() => return Err(not_run(SHUTTING_DOWN)),
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
            Err(e) => return Err(failed(format!("the session could not be opened: {e}"))),
        }
    }
    let live = cell.as_mut().expect("opened above");
    // Files written with write_file since the session opened: put them in first. Not
    // given up on cancellation (that would leave the session half-synced); short.
    let changed: Vec<crate::job::InputFile> = files
        .iter()
        .filter(|f| {
            let d: [u8; 32] = Sha256::digest(&f.contents).into();
            live.synced.get(&f.path) != Some(&d)
        })
        .cloned()
        .collect();
    if !changed.is_empty() {
        let synced = tokio::select! {
            r = live.session.put_files(&changed, timeout) => Some(r),
            _ = shutdown.cancelled() => None,
        };
        match synced {
            None => {
                cell.take();
                return Err(failed(format!(
                    "the cell was not run: {SHUTTING_DOWN}. {LOST}"
                )));
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
            return Err(failed(format!(
                "the cell was not run: the session ended while workspace files were copied in. {LOST}"
            )));
        }
    }
    if cancel.is_cancelled() {
        return Err(not_run("the request was cancelled before the cell started"));
    }
    let result = tokio::select! {
        r = live.session.exec(code, timeout, events) => Some(r),
        _ = cancel.cancelled() => None,
        _ = shutdown.cancelled() => None,
    };
    *slot.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    let label = match &result {
        None => "cancelled",
        Some(Err(_)) => "failed",
        Some(Ok(o)) => super::metrics::outcome_label(o),
    };
    let secs = started.elapsed().as_secs_f64();
    ex.metrics().run(&x.tenant, label, secs);
    tracing::info!(
        tenant = %x.tenant,
        code_sha256 = %code_digest(code.as_bytes()),
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
            return Err(failed(format!("{why}. {LOST}")));
        }
        Some(Err(e)) => {
            let ended = !live.session.alive();
            if ended {
                cell.take();
            }
            return Err(failed(format!(
                "the code could not be run: {e}{}",
                if ended {
                    format!("\n{LOST}")
                } else {
                    String::new()
                }
            )));
        }
        Some(Ok(o)) => o,
    };
    // Files the cell wrote are saved to the workspace; the session already has them.
    for f in &outcome.files {
        live.synced
            .insert(f.path.clone(), Sha256::digest(&f.data).into());
    }
    if let Some(saved) = super::workspaces::save_returned(&ex.workspaces, key, &outcome).await {
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
    Ok(CellDone {
        outcome,
        timeout,
        note,
    })
}

/// End connection `conn`'s session: true when there was one.
pub(super) async fn reset(x: &Arc<Sessions>, conn: u64) -> bool {
    let _busy = x.busy();
    let slot = x.slot(conn);
    let mut cell = slot.cell.lock().await;
    cell.take().is_some()
}
