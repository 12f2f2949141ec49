//! The registry of stateful sessions (`execute_python`): one tenant's sessions, their caps
//! and their reaper. How a cell runs in one is [`super::cell`].
//!
//! A session is a REPL and its workspace, named by a handle ([`SessionRef::handle`]: 128
//! random bits, scoped to the tenant since each tenant has its own registry). Two kinds:
//!
//! - a connection's own session (an MCP Streamable HTTP session of the 2025 revisions, a
//!   legacy SSE session, the stdio connection): made on first use, removed with its
//!   [`Connection`](super::Connection); its container counts against `max_sessions` while
//!   it is open.
//! - a standalone session, opened for a client without protocol sessions (Streamable HTTP at
//!   2026-07-28, where every request is its own connection) and named only by its handle,
//!   which the client passes back: it counts against `max_sessions` for its whole life and
//!   is removed, workspace and all, once idle longer than the idle timeout.
//! - a files session: a standalone session a one-shot run (`execute_code`, a task) opened
//!   only to keep what it wrote or what its result could not carry. It holds no container
//!   and counts against `max_sessions` only while a REPL is open in it, like a connection's
//!   own; a principal keeps at most `max_sessions` of them, its least recently used going
//!   first (issue 42: one user's long outputs took every session of the tenant).
//!
//! [`Sessions`] holds one tenant's sessions and caps how many live at once; a background
//! reaper removes containers idle longer than the idle timeout or older than the maximum
//! lifetime, and idle standalone sessions. Cells of one session run one at
//! a time (later calls queue; a call cancelled while it waits leaves the session as it was),
//! each in a run slot of the scheduler, like one-shot runs. Opening a session takes one of
//! the tenant's `max_sessions` atomically. Server shutdown removes every session, and
//! [`Sessions::wait_closed`] lets it wait for that before the backend shuts down.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::error::AppError;
use super::settings::{SessionOptions, Settings};
use super::workspaces::Workspaces;
use crate::backend::Session;
use crate::job::Limits;

/// The execute_python sessions of one tenant, over all its connections.
pub struct Sessions {
    pub(super) limits: Limits,
    pub(super) tenant: String,
    pub(super) options: SessionOptions,
    /// By handle.
    sessions: Mutex<HashMap<String, Arc<Slot>>>,
    /// Sessions counted against `max_sessions` (each by a [`Ticket`]): open containers and
    /// standalone sessions.
    live: AtomicUsize,
    /// execute_python and reset_session calls in progress (shutdown waits for them).
    busy: AtomicUsize,
    reaper: AtomicBool,
    pub(super) shutdown: CancellationToken,
}

/// One session: its handle, its workspace, and the sandbox (when one is open) behind the
/// lock that makes cells run one at a time.
pub(super) struct Slot {
    pub(super) handle: String,
    /// Its workspace directory's key (see [`Workspaces`]).
    pub(super) workspace: String,
    /// The connection whose own session this is; `None` for a standalone session.
    owner: Option<u64>,
    /// The principal that made it ([`crate::tenancy::oauth::Principal::owner`]; `None`: the
    /// tenant's static token, or a server without tenants): nobody else finds it.
    pub(super) principal: Option<String>,
    /// A standalone session's place among `max_sessions`, from its opening until
    /// `reset_session` ends its REPL ([`Sessions::release`]).
    pub(super) ticket: Mutex<Option<Ticket>>,
    /// A files session ([`Sessions::open_for_files`], or a standalone one after a reset):
    /// no place among `max_sessions` but while its REPL is open.
    for_files: AtomicBool,
    pub(super) cell: tokio::sync::Mutex<Option<Live>>,
    /// Last use, for the idle timeout.
    pub(super) used: Mutex<Instant>,
    /// Where its workspace lives; removed with the session unless shared by the tenant.
    workspaces: Arc<Workspaces>,
    shared_workspace: bool,
}

impl Slot {
    pub(super) fn touch(&self) {
        *self.used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn idle(&self) -> Duration {
        self.used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.shared_workspace {
            self.workspaces.remove(&self.workspace);
        }
    }
}

/// A session a call is about, as the core hands it to a front end: its handle to give
/// the client, and whether this call opened it.
#[derive(Clone)]
pub struct SessionRef {
    pub(super) slot: Arc<Slot>,
    /// True when the call that asked for it opened it (a new standalone session).
    pub created: bool,
}

impl SessionRef {
    /// The handle the client passes back (`session_id`) to continue this session.
    pub fn handle(&self) -> &str {
        &self.slot.handle
    }

    /// The key of its workspace.
    pub(super) fn workspace(&self) -> &str {
        &self.slot.workspace
    }
}

/// A new handle: 128 bits from two random (v4) UUIDs, as 32 hex digits after `s_` and this
/// replica's id (`s_REPLICA_HEX`, [`crate::ids`]: a call on it that lands on
/// another replica is forwarded here).
pub fn new_handle() -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    h.update(uuid::Uuid::new_v4().as_bytes());
    h.update(uuid::Uuid::new_v4().as_bytes());
    let d = h.finalize();
    let hex: String = d[..16].iter().map(|b| format!("{b:02x}")).collect();
    crate::ids::mint('s', &hex)
}

/// The answer for a handle this tenant does not know, whatever the reason (never made,
/// expired, another tenant's): always the same words.
pub fn not_found(handle: &str) -> AppError {
    // A whole handle (`s_REPLICA_HEX` is 43 characters); longer input is cut.
    let shown: String = handle.chars().take(48).collect();
    AppError::Failed(format!(
        "session `{shown}` not found: it may have expired after a period without calls, or the server restarted. \
         Call again without session_id to start a new session (variables and workspace files of the old one are gone)."
    ))
}

/// An open session, counted while it lives.
pub(super) struct Live {
    pub(super) session: Box<dyn Session>,
    /// The environment it was opened with (mounted into its container for its life).
    pub(super) env: Option<crate::env::Environment>,
    pub(super) opened: Instant,
    /// Each workspace file as the session last received it.
    pub(super) synced: HashMap<String, Synced>,
    /// Its place among `max_sessions` (`None` in a standalone session, which holds one).
    pub(super) _ticket: Option<Ticket>,
    /// Its share of the tenant's memory budget, held while its container is open (running
    /// a cell or paused between cells).
    pub(super) _memory: crate::tenancy::memory::MemoryHold,
}

/// A workspace file as a session's sandbox has it: its digest, and the stamp of the
/// workspace's copy when that was read (`None`: not read since; a file whose stamp has not
/// changed is not read again before a cell).
#[derive(Debug, Clone, Copy)]
pub(super) struct Synced {
    pub(super) digest: [u8; 32],
    pub(super) stamp: Option<crate::storage::Stamp>,
}

/// One of the tenant's `max_sessions`, taken before a session is opened (so that
/// concurrent first cells cannot pass the cap) and given back when dropped.
pub(super) struct Ticket(Arc<Sessions>);

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

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sessions with an open sandbox (or one being opened).
    pub fn live_sessions(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Take one of the `max_sessions`, atomically with the check; `None` at the cap.
    pub(super) fn reserve(self: &Arc<Self>) -> Option<Ticket> {
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

    /// The own session of connection `conn` of principal `principal`, named `handle`, with
    /// workspace `workspace` (made on first use).
    pub(super) fn own(
        self: &Arc<Self>,
        workspaces: &Arc<Workspaces>,
        (conn, principal): (u64, Option<String>),
        handle: &str,
        workspace: &str,
    ) -> Arc<Slot> {
        let slot = self
            .map()
            .entry(handle.to_string())
            .or_insert_with(|| {
                Arc::new(Slot {
                    handle: handle.to_string(),
                    workspace: workspace.to_string(),
                    owner: Some(conn),
                    principal,
                    ticket: Mutex::new(None),
                    for_files: AtomicBool::new(false),
                    cell: tokio::sync::Mutex::new(None),
                    used: Mutex::new(Instant::now()),
                    workspaces: workspaces.clone(),
                    shared_workspace: self.options.shared_workspace,
                })
            })
            .clone();
        slot.touch();
        slot
    }

    /// The session named `handle` made by the principal `owner`, or the "not found" answer
    /// (also for another principal's: the same words).
    pub(super) fn find(&self, handle: &str, owner: Option<&str>) -> Result<Arc<Slot>, AppError> {
        let slot = self
            .map()
            .get(handle)
            .filter(|s| s.principal.as_deref() == owner)
            .cloned();
        match slot {
            Some(s) => {
                s.touch();
                Ok(s)
            }
            None => Err(not_found(handle)),
        }
    }

    /// Open a standalone session with workspace `workspace`: one of the `max_sessions`
    /// for its whole life; refused at the cap.
    pub(super) fn open_standalone(
        self: &Arc<Self>,
        workspaces: &Arc<Workspaces>,
        workspace: String,
        principal: Option<String>,
    ) -> Result<Arc<Slot>, AppError> {
        if self.shutdown.is_cancelled() {
            return Err(AppError::ShuttingDown);
        }
        let Some(ticket) = self.reserve() else {
            return Err(AppError::Refused(format!(
                "no session could be opened: tenant `{}` already has {} sessions, its maximum (max_sessions). \
                 Pass the session_id of one you have, end one with reset_session, or wait for idle ones to expire (after {} s without calls).",
                self.tenant,
                self.options.max_sessions,
                self.options.idle.as_secs()
            )));
        };
        let handle = new_handle();
        let slot = Arc::new(Slot {
            handle: handle.clone(),
            workspace,
            owner: None,
            principal: principal.clone(),
            ticket: Mutex::new(Some(ticket)),
            for_files: AtomicBool::new(false),
            cell: tokio::sync::Mutex::new(None),
            used: Mutex::new(Instant::now()),
            workspaces: workspaces.clone(),
            shared_workspace: self.options.shared_workspace,
        });
        self.map().insert(handle, slot.clone());
        self.start_reaper();
        tracing::info!(
            tenant = %self.tenant,
            principal = %principal.as_deref().map_or("static-token".to_string(), |d| format!("user:{d}")),
            "standalone session opened"
        );
        Ok(slot)
    }

    /// Open a files session with workspace `workspace` for `principal`: what a one-shot run
    /// wrote, or what its result could not carry, kept for the client to read with the
    /// handle. It takes none of the tenant's `max_sessions` (a REPL opened in it later
    /// does, while open), so one principal's runs never leave the others without sessions;
    /// a principal keeps at most `max_sessions` of them, and opening one more removes its
    /// least recently used one that no call holds (refused when every one is in use).
    pub(super) fn open_for_files(
        self: &Arc<Self>,
        workspaces: &Arc<Workspaces>,
        workspace: String,
        principal: Option<String>,
    ) -> Result<Arc<Slot>, AppError> {
        if self.shutdown.is_cancelled() {
            return Err(AppError::ShuttingDown);
        }
        let max = self.options.max_sessions.max(1);
        let handle = new_handle();
        let slot = Arc::new(Slot {
            handle: handle.clone(),
            workspace,
            owner: None,
            principal: principal.clone(),
            ticket: Mutex::new(None),
            for_files: AtomicBool::new(true),
            cell: tokio::sync::Mutex::new(None),
            used: Mutex::new(Instant::now()),
            workspaces: workspaces.clone(),
            shared_workspace: self.options.shared_workspace,
        });
        // Removed (its workspace deleted on drop) after the map's lock is let go.
        let evicted = {
            let mut map = self.map();
            let evicted = Self::make_room(&mut map, principal.as_ref(), max, None).ok_or_else(|| {
                AppError::Refused(format!(
                    "no session could be opened to keep the files: the {max} sessions kept for your runs without a session_id are all in use. \
                     Pass the session_id of one you have, or retry when a call on one ends."
                ))
            })?;
            map.insert(handle, slot.clone());
            evicted
        };
        if evicted.is_some() {
            tracing::info!(
                tenant = %self.tenant,
                "files session removed: its principal opened more than max_sessions"
            );
        }
        drop(evicted);
        self.start_reaper();
        tracing::info!(
            tenant = %self.tenant,
            principal = %principal.as_deref().map_or("static-token".to_string(), |d| format!("user:{d}")),
            "files session opened"
        );
        Ok(slot)
    }

    /// Room for one more files session of `principal` (at most `max` of them, `keep`
    /// aside): `Some(None)` when there is room, `Some(Some(slot))` with the least recently
    /// used one taken out of `map` to make it, `None` when every one is in use.
    fn make_room(
        map: &mut HashMap<String, Arc<Slot>>,
        principal: Option<&String>,
        max: usize,
        keep: Option<&str>,
    ) -> Option<Option<Arc<Slot>>> {
        let mine: Vec<&Arc<Slot>> = map
            .values()
            .filter(|s| s.for_files.load(Ordering::SeqCst) && s.principal.as_ref() == principal)
            .filter(|s| Some(s.handle.as_str()) != keep)
            .collect();
        if mine.len() < max {
            return Some(None);
        }
        // Held only by the map (no call uses it) and no REPL open in it.
        let oldest = mine
            .into_iter()
            .filter(|s| Arc::strong_count(s) == 1)
            .filter(|s| s.cell.try_lock().is_ok_and(|c| c.is_none()))
            .max_by_key(|s| s.idle())
            .map(|s| s.handle.clone())?;
        Some(map.remove(&oldest))
    }

    /// A standalone session whose REPL `reset_session` ended: its place among
    /// `max_sessions` is given back now (not at its idle expiry); its handle and workspace
    /// stay, counted from now on with its principal's files sessions (at most
    /// `max_sessions` of them, the least recently used removed), and a REPL opened in it
    /// again takes a place while open.
    pub(super) fn release(&self, slot: &Arc<Slot>) {
        let ticket = slot.ticket.lock().unwrap_or_else(|e| e.into_inner()).take();
        if ticket.is_none() {
            return;
        }
        slot.for_files.store(true, Ordering::SeqCst);
        drop(ticket);
        let max = self.options.max_sessions.max(1);
        let evicted = {
            let mut map = self.map();
            Self::make_room(&mut map, slot.principal.as_ref(), max, Some(&slot.handle)).flatten()
        };
        if evicted.is_some() {
            tracing::info!(
                tenant = %self.tenant,
                "files session removed: its principal reset more than max_sessions"
            );
        }
    }

    /// Forget a session (a connection's own, when it ends; a standalone one, when reset);
    /// its container is removed once no call holds it, its workspace with the last holder.
    pub(super) fn forget(&self, handle: &str) {
        let slot = self.map().remove(handle);
        if let Some(slot) = slot {
            if let Ok(mut cell) = slot.cell.try_lock() {
                if cell.take().is_some() {
                    tracing::info!(owner = ?slot.owner, "session closed");
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
                                // Dropped here, or by the last call holding it.
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

    /// Remove containers idle or alive too long, and idle standalone sessions (skipping
    /// those running a cell).
    fn reap(&self) {
        let slots: Vec<Arc<Slot>> = self.map().values().cloned().collect();
        for slot in slots {
            let idle = slot.idle();
            let Ok(mut cell) = slot.cell.try_lock() else {
                continue;
            };
            if slot.owner.is_none() && idle > self.options.idle {
                tracing::info!(tenant = %self.tenant, "standalone session removed after its idle timeout");
                cell.take();
                drop(cell);
                self.map().remove(&slot.handle);
                continue;
            }
            let Some(live) = cell.as_ref() else { continue };
            let why = if idle > self.options.idle {
                "idle timeout"
            } else if live.opened.elapsed() > self.options.max_lifetime {
                "maximum lifetime"
            } else {
                continue;
            };
            tracing::info!(owner = ?slot.owner, why, "session container removed");
            cell.take();
        }
    }
}
