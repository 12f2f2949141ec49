//! The peer table: which replica id answers at which internal address, learned by asking
//! every configured address `GET /internal/replica`, again whenever an id is not known (at
//! most every [`REFRESH_EVERY`]); and the HTTP client that forwards to them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{ids, FORWARDED, REPLICA_PATH};

/// A table older than this is asked again on a miss; younger, a miss means gone.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// How long a peer has to say its id.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One peer as it answered.
#[derive(Debug, Clone)]
pub struct Peer {
    /// `http://HOST:PORT`.
    pub base: String,
    pub draining: bool,
}

/// The configured addresses, the table learned from them and the forwarding client.
pub struct Peers {
    configured: Vec<String>,
    secret: Option<String>,
    table: Mutex<(HashMap<String, Peer>, Option<Instant>)>,
    refreshing: tokio::sync::Mutex<()>,
    client: Client<HttpConnector, Body>,
}

impl Peers {
    pub(super) fn new(configured: Vec<String>, secret: Option<String>) -> Peers {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        connector.set_nodelay(true);
        Peers {
            configured,
            secret,
            table: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(()),
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
        }
    }

    /// The addresses as configured.
    pub fn configured(&self) -> &[String] {
        &self.configured
    }

    /// The client requests to peers go through (pooled connections).
    pub(super) fn client(&self) -> &Client<HttpConnector, Body> {
        &self.client
    }

    /// The secret forwarded requests carry.
    pub(super) fn secret(&self) -> &str {
        self.secret.as_deref().unwrap_or_default()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, (HashMap<String, Peer>, Option<Instant>)> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where replica `id` answers; asks the peers again when it is not known (a new
    /// replica) and the table is older than [`REFRESH_EVERY`]. `None`: no peer says it is
    /// `id` (it is gone).
    pub async fn find(&self, id: &str) -> Option<Peer> {
        if let Some(p) = self.table().0.get(id) {
            return Some(p.clone());
        }
        self.refresh().await;
        self.table().0.get(id).cloned()
    }

    /// Forget `id` (its address stopped answering) and ask the peers again.
    pub async fn lost(&self, id: &str) -> Option<Peer> {
        self.table().0.remove(id);
        self.table().1 = None;
        self.find(id).await
    }

    /// A peer other than this replica that is not draining (for calls a draining replica
    /// does not take).
    pub async fn another(&self) -> Option<Peer> {
        self.refresh().await;
        let me = ids::replica();
        self.table()
            .0
            .iter()
            .find(|(id, p)| id.as_str() != me && !p.draining)
            .map(|(_, p)| p.clone())
    }

    /// Ask every configured address for its id (unless the table is fresh).
    async fn refresh(&self) {
        let _one = self.refreshing.lock().await;
        if self.table().1.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return;
        }
        let mut bases = Vec::new();
        for p in &self.configured {
            bases.extend(expand(p).await);
        }
        let asked = futures::future::join_all(bases.into_iter().map(|b| self.ask(b))).await;
        let table: HashMap<String, Peer> = asked.into_iter().flatten().collect();
        tracing::debug!(peers = ?table.keys().collect::<Vec<_>>(), "peer table refreshed");
        *self.table() = (table, Some(Instant::now()));
    }

    /// `GET base/internal/replica` with the secret: the peer's id and whether it drains.
    async fn ask(&self, base: String) -> Option<(String, Peer)> {
        let request = axum::http::Request::get(format!("{base}{REPLICA_PATH}"))
            .header(FORWARDED, self.secret())
            .body(Body::empty())
            .ok()?;
        let answer = tokio::time::timeout(ASK_TIMEOUT, async {
            let r = self.client.request(request).await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            let body = http_body_util::BodyExt::collect(r.into_body()).await.ok()?;
            serde_json::from_slice::<serde_json::Value>(&body.to_bytes()).ok()
        })
        .await
        .ok()??;
        let id = answer.get("id")?.as_str()?.to_string();
        let draining = answer
            .get("draining")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        Some((id, Peer { base, draining }))
    }
}

/// The bases one configured address stands for: itself, or with `dns+http://NAME:PORT`
/// one `http://IP:PORT` per address NAME resolves to now.
async fn expand(configured: &str) -> Vec<String> {
    let trimmed = configured.trim_end_matches('/');
    let Some(name) = trimmed.strip_prefix("dns+http://") else {
        return vec![trimmed.to_string()];
    };
    match tokio::net::lookup_host(name).await {
        Ok(addrs) => addrs.map(|a| format!("http://{a}")).collect(),
        Err(e) => {
            tracing::warn!(name, error = %e, "peer name does not resolve");
            Vec::new()
        }
    }
}
