//! More than one replica behind a load balancer without affinity.
//!
//! A replica holds live state that cannot move: an `execute_python` session (its sandbox
//! attached to this process), an MCP task (its run and result), a protocol session of the
//! 2025 revisions, a legacy SSE stream. Every handle to such state names the replica that
//! owns it ([`crate::ids`], a leaf every layer may use); a request that lands on another replica is forwarded whole to the
//! owner (by the router of the HTTP transport, [`crate::mcp::transports::http::route`], the one
//! layer that reads `Mcp-Session-Id`, `/messages` and JSON-RPC bodies: the raw HTTP request, the response streamed back unchanged, SSE and
//! cancellation included), over the same port, marked by a shared secret header that a
//! client cannot forge (a wrong one is refused; the header never reaches the MCP layer).
//! Routing comes after the `Host` check, authentication and the stream caps, and reads the
//! body under the server's body rules: a request the server would refuse is refused before
//! anything of it is read or forwarded. A forwarded request waits for its answer while its
//! owner is alive; one that stops answering ends the wait (504).
//! Stored code needs no owner: it lives in a directory every replica of a host shares
//! (`--code-storage-dir`), or on a shared volume.
//!
//! Replicas find each other from `--peers`: addresses (`http://HOST:PORT`) or a name whose
//! every address is a replica (`dns+http://NAME:PORT`: a headless Service, compose's service
//! name). Each answers `GET /internal/replica` (secret required) with its id; the table of
//! ids is learned on a miss, so a replica that restarted or died is simply not found, and a
//! call on its handle gets an answer that says what was lost (the router's `answers.rs`), the same
//! whichever way it was found gone (a refused connection, an answer broken off, a table
//! that no longer lists it). A peer that hangs is not waited for again and again ([`peers`]).
//!
//! On SIGTERM a replica drains ([`Cluster::drain`]): `/readyz` says 503 at once, calls
//! that name no handle are forwarded to a peer that is not draining (or refused with 503
//! and `Retry-After` without one), calls on its own handles are still served, and runs in
//! progress get `--drain-grace` to finish before the shutdown stops them.
//!
//! This module is the replica's state among its peers (the secret, the peer table, draining,
//! the counters); it knows no MCP. The router above it reads requests and asks it.

pub mod peers;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use peers::{Peer, Peers};

use crate::config::serve::ClusterConfig;

/// The header that marks a request forwarded by a replica; its value is the secret.
pub const FORWARDED: &str = "x-mcp-executor-forwarded";
/// The path where a replica says its id (to peers that show the secret).
pub const REPLICA_PATH: &str = "/internal/replica";

/// This replica among its peers.
pub struct Cluster {
    secret: Option<String>,
    peers: Peers,
    draining: AtomicBool,
    drain_grace: Duration,
    /// Requests forwarded to their owner.
    pub(crate) forwarded: AtomicU64,
    /// Calls on the handle of a replica that is gone.
    pub(crate) gone: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("replica", &crate::ids::replica())
            .field("peers", &self.peers.configured())
            .field("draining", &self.draining())
            .finish()
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster::new(&ClusterConfig::default())
    }
}

impl Cluster {
    /// This replica as `config` says (no peers: a replica alone, which forwards nothing).
    pub fn new(config: &ClusterConfig) -> Cluster {
        Cluster {
            secret: config.secret.clone(),
            peers: Peers::new(config.peers.clone(), config.secret.clone()),
            draining: AtomicBool::new(false),
            drain_grace: config.drain_grace.unwrap_or(if config.peers.is_empty() {
                Duration::ZERO
            } else {
                crate::config::serve::DRAIN_GRACE
            }),
            forwarded: AtomicU64::new(0),
            gone: AtomicU64::new(0),
        }
    }

    /// Are there peers to forward to?
    pub fn clustered(&self) -> bool {
        !self.peers.configured().is_empty()
    }

    /// Is `shown` the shared secret? (Constant time over its bytes.)
    pub fn secret_ok(&self, shown: &[u8]) -> bool {
        let Some(s) = &self.secret else { return false };
        let s = s.as_bytes();
        s.len() == shown.len() && s.iter().zip(shown).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// The peers.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// Has SIGTERM come?
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// How long runs in progress get after SIGTERM.
    pub fn drain_grace(&self) -> Duration {
        self.drain_grace
    }

    /// Stop taking new calls (readiness drops at once), then wait until `busy` says nothing
    /// is in progress, at most the drain grace. True when everything finished in time.
    pub async fn drain(&self, busy: impl Fn() -> usize) -> bool {
        self.draining.store(true, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        loop {
            let n = busy();
            if n == 0 {
                return true;
            }
            if t0.elapsed() >= self.drain_grace {
                tracing::warn!(
                    in_progress = n,
                    grace_s = self.drain_grace.as_secs_f64(),
                    "runs still in progress at the end of the drain grace: they are stopped"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Prometheus lines: forwarded requests, calls on handles of replicas that are gone.
    pub fn metrics_text(&self) -> String {
        format!(
            "# HELP mcp_executor_forwarded_total Requests forwarded to the replica that owns their handle.\n\
             # TYPE mcp_executor_forwarded_total counter\nmcp_executor_forwarded_total {}\n\
             # HELP mcp_executor_owner_gone_total Calls on a handle whose replica is gone.\n\
             # TYPE mcp_executor_owner_gone_total counter\nmcp_executor_owner_gone_total {}\n\
             # HELP mcp_executor_draining 1 once SIGTERM came.\n# TYPE mcp_executor_draining gauge\nmcp_executor_draining {}\n",
            self.forwarded.load(Ordering::Relaxed),
            self.gone.load(Ordering::Relaxed),
            u8::from(self.draining())
        )
    }
}

/// A cluster shared by the front's layers.
pub type Shared = Arc<Cluster>;
