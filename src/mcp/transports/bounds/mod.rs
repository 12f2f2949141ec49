//! What the HTTP front holds for its clients, bounded: connections (with a reserve that only
//! answers `/healthz`, `/readyz` and `/metrics`), open responses ("streams": requests in
//! flight and SSE streams) per tenant and in all, slow headers and bodies, and result bytes
//! a client has not read yet, per protocol session, per tenant and in all. A client that
//! stops reading while results wait for it is disconnected, longest-stalled first; what is
//! dropped is logged and counted in `/metrics`.
//!
//! The accept loop is ours ([`serve_with`]), not `axum::serve`: it counts connections and
//! bytes written to each socket, and can drop a connection whose client does not read
//! (hyper holds a response frame it cannot write; dropping the connection frees it).
//!
//! The parts: the [`Tracker`] here (what is open and waiting, and who is dropped), `conn`
//! (one connection, its counted socket and its metered bodies), `metrics` (the tracker's
//! Prometheus lines), `accept` (the accept loop) and `json` (the nesting bound).

mod accept;
mod conn;
mod json;
mod metrics;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use accept::{serve_with, SEND_BUFFER};
pub use conn::{Conn, Metered};
pub use json::json_too_deep;

pub use crate::config::serve::http_bounds as defaults;
pub use crate::config::HttpBounds as Bounds;

/// A client whose waiting bytes have not moved for this long may be dropped to bring a total
/// back under its bound; a client that reads is never dropped.
const STALL_GRACE: Duration = Duration::from_secs(1);

/// The paths the health reserve answers.
fn health_path(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// Counters of the front, for `/metrics`.
#[derive(Default)]
struct Counters {
    connections_refused: AtomicU64,
    connections_health_only: AtomicU64,
    streams_refused: AtomicU64,
    body_timeouts: AtomicU64,
    clients_dropped_stalled: AtomicU64,
    clients_dropped_over_bound: AtomicU64,
    bytes_dropped: AtomicU64,
}

/// A connection with bytes waiting: it, the bytes, since when they have not moved, its
/// tenant and session.
type Waiting = (Arc<Conn>, u64, Instant, Option<String>, Option<String>);

/// Everything the front counts, shared by the accept loop, the connections and the routes
/// (which find it through the [`Conn`] in each request's extensions).
pub struct Tracker {
    bounds: Bounds,
    next_id: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    mcp_conns: AtomicUsize,
    health_conns: AtomicUsize,
    streams: Mutex<HashMap<String, usize>>,
    streams_total: AtomicUsize,
    counters: Counters,
}

impl Tracker {
    pub fn new(bounds: Bounds) -> Arc<Tracker> {
        Arc::new(Tracker {
            bounds,
            next_id: AtomicU64::new(1),
            conns: Mutex::default(),
            mcp_conns: AtomicUsize::new(0),
            health_conns: AtomicUsize::new(0),
            streams: Mutex::default(),
            streams_total: AtomicUsize::new(0),
            counters: Counters::default(),
        })
    }

    pub fn bounds(&self) -> &Bounds {
        &self.bounds
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for one open MCP response of `tenant`, or `None` past a cap.
    pub fn open_stream(self: &Arc<Self>, tenant: &str) -> Option<StreamSlot> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let mine = streams.get(tenant).copied().unwrap_or(0);
        let total = self.streams_total.load(Ordering::Relaxed);
        if mine >= self.bounds.max_streams_per_tenant || total >= self.bounds.max_streams {
            self.counters
                .streams_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                tenant,
                open = mine,
                open_in_all = total,
                "refused: too many open MCP requests/streams"
            );
            return None;
        }
        *streams.entry(tenant.to_string()).or_default() += 1;
        self.streams_total.fetch_add(1, Ordering::Relaxed);
        Some(StreamSlot {
            tracker: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    pub fn body_timed_out(&self) {
        self.counters.body_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes waiting for clients: in all, by tenant, by session.
    pub fn buffered(&self) -> (u64, HashMap<String, u64>) {
        let conns = self.conns();
        let mut total = 0;
        let mut tenants: HashMap<String, u64> = HashMap::new();
        for c in conns.values() {
            let b = c.buffered();
            total += b;
            if let Some(t) = c.owner().0 {
                *tenants.entry(t).or_default() += b;
            }
        }
        (total, tenants)
    }

    /// Drop clients that do not read: any stalled past `stall_timeout`, then, while a total
    /// (session, tenant, all) is over its bound, the longest-stalled contributor to it.
    fn enforce(&self) {
        let now = Instant::now();
        let b = &self.bounds;
        let mut live: Vec<Waiting> = self
            .conns()
            .values()
            .filter(|c| !c.kill.is_cancelled())
            .filter_map(|c| {
                let buffered = c.buffered();
                (buffered > 0).then(|| {
                    let (t, s) = c.owner();
                    (c.clone(), buffered, c.last_progress(), t, s)
                })
            })
            .collect();
        if live.is_empty() {
            return;
        }
        live.sort_by_key(|e| e.2);
        let mut dropped = vec![false; live.len()];
        for (i, (c, bytes, since, t, s)) in live.iter().enumerate() {
            if now.duration_since(*since) >= b.stall_timeout {
                self.drop_conn(c, *bytes, t, s, "stalled");
                dropped[i] = true;
            }
        }
        // Over-bound groups: each check is a key function and its bound.
        type Key = fn(&Waiting) -> Option<String>;
        let checks: [(Key, u64, &str); 3] = [
            (|e| e.4.clone(), b.max_buffered_per_session, "session"),
            (|e| e.3.clone(), b.max_buffered_per_tenant, "tenant"),
            (|_| Some(String::new()), b.max_buffered_bytes, "all"),
        ];
        for (key, bound, scope) in checks {
            let mut totals: HashMap<String, u64> = HashMap::new();
            for (i, e) in live.iter().enumerate() {
                if !dropped[i] {
                    if let Some(k) = key(e) {
                        *totals.entry(k).or_default() += e.1;
                    }
                }
            }
            for (i, e) in live.iter().enumerate() {
                let Some(k) = key(e) else { continue };
                let total = totals.get(&k).copied().unwrap_or(0);
                if dropped[i] || total <= bound || now.duration_since(e.2) < STALL_GRACE {
                    continue;
                }
                let reason = match scope {
                    "session" => "over the per-session bound",
                    "tenant" => "over the per-tenant bound",
                    _ => "over the global bound",
                };
                self.drop_conn(&e.0, e.1, &e.3, &e.4, reason);
                dropped[i] = true;
                totals.insert(k, total - e.1);
            }
        }
    }

    fn drop_conn(
        &self,
        c: &Conn,
        bytes: u64,
        tenant: &Option<String>,
        session: &Option<String>,
        reason: &str,
    ) {
        c.kill.cancel();
        super::sessions::trim_soon();
        let counter = if reason == "stalled" {
            &self.counters.clients_dropped_stalled
        } else {
            &self.counters.clients_dropped_over_bound
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes_dropped
            .fetch_add(bytes, Ordering::Relaxed);
        tracing::warn!(
            tenant = tenant.as_deref().unwrap_or("-"),
            session = session.as_deref().unwrap_or("-"),
            unread_bytes = bytes,
            reason,
            "dropped a client that does not read its results: connection closed, its unread results discarded"
        );
    }
}

/// One open MCP response; released when dropped.
pub struct StreamSlot {
    tracker: Arc<Tracker>,
    tenant: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self
            .tracker
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = streams.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&self.tenant);
            }
        }
        self.tracker.streams_total.fetch_sub(1, Ordering::Relaxed);
    }
}
