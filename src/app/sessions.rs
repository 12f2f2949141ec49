//! The registry of stateful sessions (`execute_python`): one tenant's sessions, their caps
//! and their reaper. How a cell runs in one is [`super::cell`].
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

use tokio_util::sync::CancellationToken;

use super::settings::{SessionOptions, Settings};
use crate::backend::Session;
use crate::job::Limits;

/// The execute_python sessions of one tenant, over all its connections.
pub struct Sessions {
    pub(super) limits: Limits,
    pub(super) tenant: String,
    pub(super) options: SessionOptions,
    sessions: Mutex<HashMap<u64, Arc<Slot>>>,
    /// Sessions open or being opened (each counted by a [`Ticket`]).
    live: AtomicUsize,
    /// execute_python and reset_session calls in progress (shutdown waits for them).
    busy: AtomicUsize,
    reaper: AtomicBool,
    pub(super) shutdown: CancellationToken,
}

/// One connection's session: the sandbox (when one is open) behind the lock that makes
/// cells run one at a time.
pub(super) struct Slot {
    pub(super) cell: tokio::sync::Mutex<Option<Live>>,
    /// Last use, for the idle timeout.
    pub(super) used: Mutex<Instant>,
}

/// An open session, counted while it lives.
pub(super) struct Live {
    pub(super) session: Box<dyn Session>,
    /// The environment it was opened with (mounted into its container for its life).
    pub(super) env: Option<crate::env::Environment>,
    pub(super) opened: Instant,
    /// Digest of each workspace file as the session last received it.
    pub(super) synced: HashMap<String, [u8; 32]>,
    pub(super) _ticket: Ticket,
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

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
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
