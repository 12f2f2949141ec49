//! The peer table: which replica id answers at which internal address, learned by asking
//! every configured address `GET /internal/replica`, again whenever an id is not known (at
//! most every [`REFRESH_EVERY`]); and the HTTP client that forwards to them.
//!
//! An address is dropped from the table only on evidence that its replica is gone: it
//! refuses connections, answers with another id, or no longer resolves. An address that
//! takes the connection and does not answer within [`ASK_TIMEOUT`] (a hung or stopped
//! process) keeps the id it had, and is "silent" for [`SILENT_FOR`]: refreshes meanwhile do
//! not wait for it (it is asked in the background), so a hung peer costs one call one
//! [`ASK_TIMEOUT`], not every call, and the handles it held are not declared gone while it
//! might come back.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{FORWARDED, REPLICA_PATH};
use crate::ids;

/// A table older than this is asked again on a miss; younger, a miss means gone.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);
/// How long a peer has to say its id (a few milliseconds when it is alive).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long an address that did not answer in time is not waited for.
pub const SILENT_FOR: Duration = Duration::from_secs(15);
/// How long connecting to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One peer as it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// Its replica id.
    pub id: String,
    /// `http://HOST:PORT`.
    pub base: String,
    pub draining: bool,
}

/// What asking an address for its id gave.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// It said its id.
    Id(Peer),
    /// It refused the connection or answered something else: no replica there.
    Nobody,
    /// It took the connection and said nothing within [`ASK_TIMEOUT`].
    Silent,
}

/// What is known of the peers.
#[derive(Default)]
struct Table {
    by_id: HashMap<String, Peer>,
    /// When every configured address was last asked.
    asked: Option<Instant>,
    /// Addresses that did not answer in time, and until when they are not waited for.
    silent: HashMap<String, Instant>,
    /// Silent addresses being asked in the background.
    in_background: HashSet<String>,
}

impl Table {
    /// What asking `base` gave, at `now`.
    fn learn(&mut self, base: &str, answer: Answer, now: Instant) {
        match answer {
            Answer::Id(p) => {
                self.by_id.retain(|id, q| q.base != base || *id == p.id);
                self.silent.remove(base);
                self.by_id.insert(p.id.clone(), p);
            }
            Answer::Nobody => {
                self.by_id.retain(|_, q| q.base != base);
                self.silent.remove(base);
            }
            // What it said before still holds: a stopped process may go on.
            Answer::Silent => {
                self.silent.insert(base.to_string(), now + SILENT_FOR);
            }
        }
    }

    fn is_silent(&self, base: &str, now: Instant) -> bool {
        self.silent.get(base).is_some_and(|until| *until > now)
    }
}

/// The configured addresses, the table learned from them and the forwarding client.
pub struct Peers {
    configured: Vec<String>,
    secret: Option<String>,
    table: Arc<Mutex<Table>>,
    refreshing: tokio::sync::Mutex<()>,
    client: Client<HttpConnector, Body>,
}

impl Peers {
    pub(super) fn new(configured: Vec<String>, secret: Option<String>) -> Peers {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Peers {
            configured,
            secret,
            table: Arc::default(),
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
    pub(crate) fn client(&self) -> &Client<HttpConnector, Body> {
        &self.client
    }

    /// The secret forwarded requests carry.
    pub(crate) fn secret(&self) -> &str {
        self.secret.as_deref().unwrap_or_default()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        lock(&self.table)
    }

    /// Where replica `id` answers; asks the peers again when it is not known (a new
    /// replica) and the table is older than [`REFRESH_EVERY`]. `None`: no peer says it is
    /// `id` (it is gone).
    pub async fn find(&self, id: &str) -> Option<Peer> {
        if let Some(p) = self.table().by_id.get(id) {
            return Some(p.clone());
        }
        self.refresh().await;
        self.table().by_id.get(id).cloned()
    }

    /// Forget `id` (its address stopped answering) and ask the peers again.
    pub async fn lost(&self, id: &str) -> Option<Peer> {
        {
            let mut t = self.table();
            t.by_id.remove(id);
            t.asked = None;
        }
        self.find(id).await
    }

    /// A peer other than this replica that is not draining and not silent (for calls a
    /// draining replica does not take).
    pub async fn another(&self) -> Option<Peer> {
        self.refresh().await;
        let me = ids::replica();
        let now = Instant::now();
        let t = self.table();
        t.by_id
            .values()
            .find(|p| p.id != me && !p.draining && !t.is_silent(&p.base, now))
            .cloned()
    }

    /// Does `peer` still answer as itself, within [`ASK_TIMEOUT`]?
    pub async fn answers(&self, peer: &Peer) -> bool {
        let answer = ask(&self.client, self.secret(), &peer.base).await;
        let alive = matches!(&answer, Answer::Id(p) if p.id == peer.id);
        self.table().learn(&peer.base, answer, Instant::now());
        alive
    }

    /// Ask every configured address for its id (unless the table is fresh); addresses that
    /// are silent are asked in the background, not waited for.
    async fn refresh(&self) {
        let _one = self.refreshing.lock().await;
        if self
            .table()
            .asked
            .is_some_and(|t| t.elapsed() < REFRESH_EVERY)
        {
            return;
        }
        let mut bases = Vec::new();
        for p in &self.configured {
            bases.extend(expand(p).await);
        }
        let now = Instant::now();
        let (quiet, waited): (Vec<String>, Vec<String>) = {
            let t = self.table();
            bases.into_iter().partition(|b| t.is_silent(b, now))
        };
        for base in quiet {
            self.ask_in_background(base);
        }
        let asked = futures::future::join_all(
            waited
                .iter()
                .map(|b| async move { (b, ask(&self.client, self.secret(), b).await) }),
        )
        .await;
        let mut t = self.table();
        let listed: HashSet<&str> = waited.iter().map(String::as_str).collect();
        // An address no longer listed (a name that stopped resolving to it) is gone.
        let silent_now: HashSet<String> = t.silent.keys().cloned().collect();
        t.by_id
            .retain(|_, p| listed.contains(p.base.as_str()) || silent_now.contains(&p.base));
        for (base, answer) in asked {
            t.learn(base, answer, now);
        }
        t.asked = Some(Instant::now());
        tracing::debug!(peers = ?t.by_id.keys().collect::<Vec<_>>(), silent = ?t.silent.keys().collect::<Vec<_>>(), "peer table refreshed");
    }

    /// Ask a silent address again without waiting for it; what it says goes in the table.
    fn ask_in_background(&self, base: String) {
        if !self.table().in_background.insert(base.clone()) {
            return;
        }
        let (client, secret, table) = (
            self.client.clone(),
            self.secret().to_string(),
            self.table.clone(),
        );
        tokio::spawn(async move {
            let answer = ask(&client, &secret, &base).await;
            let mut t = lock(&table);
            t.in_background.remove(&base);
            t.learn(&base, answer, Instant::now());
        });
    }
}

fn lock(table: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(|e| e.into_inner())
}

/// `GET base/internal/replica` with the secret: the peer's id and whether it drains.
async fn ask(client: &Client<HttpConnector, Body>, secret: &str, base: &str) -> Answer {
    let Ok(request) = axum::http::Request::get(format!("{base}{REPLICA_PATH}"))
        .header(FORWARDED, secret)
        .body(Body::empty())
    else {
        return Answer::Nobody;
    };
    let answer = tokio::time::timeout(ASK_TIMEOUT, async {
        let r = client.request(request).await.ok()?;
        if !r.status().is_success() {
            return None;
        }
        let body = http_body_util::BodyExt::collect(r.into_body()).await.ok()?;
        serde_json::from_slice::<serde_json::Value>(&body.to_bytes()).ok()
    })
    .await;
    let Ok(Some(answer)) = answer else {
        return match answer {
            Err(_) => Answer::Silent,
            Ok(_) => Answer::Nobody,
        };
    };
    let Some(id) = answer.get("id").and_then(|v| v.as_str()) else {
        return Answer::Nobody;
    };
    let draining = answer
        .get("draining")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Answer::Id(Peer {
        id: id.to_string(),
        base: base.to_string(),
        draining,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(id: &str, base: &str) -> Answer {
        Answer::Id(Peer {
            id: id.into(),
            base: base.into(),
            draining: false,
        })
    }

    #[test]
    fn a_silent_address_keeps_its_id_and_one_that_refuses_loses_it() {
        let now = Instant::now();
        let mut t = Table::default();
        t.learn("http://a", peer("0000000a", "http://a"), now);
        t.learn("http://b", peer("0000000b", "http://b"), now);
        // b stops answering (SIGSTOP, a hung process): it is silent, its id stays.
        t.learn("http://b", Answer::Silent, now);
        assert!(t.by_id.contains_key("0000000b"));
        assert!(t.is_silent("http://b", now));
        assert!(!t.is_silent("http://b", now + SILENT_FOR));
        // It answers again: no longer silent.
        t.learn("http://b", peer("0000000b", "http://b"), now);
        assert!(!t.is_silent("http://b", now));
        // a restarted (a new id at its address), b refuses connections (it died).
        t.learn("http://a", peer("0000001a", "http://a"), now);
        t.learn("http://b", Answer::Nobody, now);
        let mut ids: Vec<_> = t.by_id.keys().cloned().collect();
        ids.sort();
        assert_eq!(ids, ["0000001a"]);
    }
}
