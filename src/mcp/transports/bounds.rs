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

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

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

    /// Prometheus lines of the front.
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let (buffered, by_tenant) = self.buffered();
        let _ = writeln!(
            out,
            "# HELP mcp_http_connections Open HTTP connections (kind: mcp, health_only)."
        );
        let _ = writeln!(out, "# TYPE mcp_http_connections gauge");
        let _ = writeln!(
            out,
            "mcp_http_connections{{kind=\"mcp\"}} {}",
            self.mcp_conns.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "mcp_http_connections{{kind=\"health_only\"}} {}",
            self.health_conns.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP mcp_http_connections_refused_total Connections closed at once: both the MCP connections and the health reserve were full.");
        let _ = writeln!(out, "# TYPE mcp_http_connections_refused_total counter");
        let _ = writeln!(
            out,
            "mcp_http_connections_refused_total {}",
            g(&c.connections_refused)
        );
        let _ = writeln!(out, "# HELP mcp_http_connections_health_only_total Connections taken into the health reserve (MCP connections full).");
        let _ = writeln!(out, "# TYPE mcp_http_connections_health_only_total counter");
        let _ = writeln!(
            out,
            "mcp_http_connections_health_only_total {}",
            g(&c.connections_health_only)
        );
        let _ = writeln!(out, "# HELP mcp_http_streams Open MCP responses (requests in flight, SSE streams), by tenant.");
        let _ = writeln!(out, "# TYPE mcp_http_streams gauge");
        {
            let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            let mut v: Vec<_> = streams.iter().collect();
            v.sort();
            for (t, n) in v {
                let _ = writeln!(out, "mcp_http_streams{{tenant=\"{t}\"}} {n}");
            }
        }
        let _ = writeln!(out, "# HELP mcp_http_streams_refused_total MCP requests refused with 429: too many open responses.");
        let _ = writeln!(out, "# TYPE mcp_http_streams_refused_total counter");
        let _ = writeln!(
            out,
            "mcp_http_streams_refused_total {}",
            g(&c.streams_refused)
        );
        let _ = writeln!(
            out,
            "# HELP mcp_http_body_timeouts_total Requests whose body did not arrive in time (408)."
        );
        let _ = writeln!(out, "# TYPE mcp_http_body_timeouts_total counter");
        let _ = writeln!(out, "mcp_http_body_timeouts_total {}", g(&c.body_timeouts));
        let _ = writeln!(
            out,
            "# HELP mcp_results_buffered_bytes Result bytes waiting for clients to read them."
        );
        let _ = writeln!(out, "# TYPE mcp_results_buffered_bytes gauge");
        let _ = writeln!(out, "mcp_results_buffered_bytes {buffered}");
        let mut v: Vec<_> = by_tenant.into_iter().collect();
        v.sort();
        for (t, n) in v {
            let _ = writeln!(out, "mcp_results_buffered_bytes{{tenant=\"{t}\"}} {n}");
        }
        let _ = writeln!(out, "# HELP mcp_clients_dropped_total Clients disconnected because they did not read their results.");
        let _ = writeln!(out, "# TYPE mcp_clients_dropped_total counter");
        let _ = writeln!(
            out,
            "mcp_clients_dropped_total{{reason=\"stalled\"}} {}",
            g(&c.clients_dropped_stalled)
        );
        let _ = writeln!(
            out,
            "mcp_clients_dropped_total{{reason=\"over_bound\"}} {}",
            g(&c.clients_dropped_over_bound)
        );
        let _ = writeln!(out, "# HELP mcp_results_dropped_bytes_total Unread result bytes discarded with those clients.");
        let _ = writeln!(out, "# TYPE mcp_results_dropped_bytes_total counter");
        let _ = writeln!(
            out,
            "mcp_results_dropped_bytes_total {}",
            g(&c.bytes_dropped)
        );
        out
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

/// One accepted connection, in each of its requests' extensions.
pub struct Conn {
    pub tracker: Arc<Tracker>,
    kill: CancellationToken,
    /// Only `/healthz`, `/readyz` and `/metrics` (the health reserve).
    health_only: bool,
    /// Response body bytes handed to hyper.
    yielded: AtomicU64,
    /// Bytes written to the socket (headers and framing included).
    written: AtomicU64,
    /// Bytes queued for this connection's SSE stream, not yet handed to hyper.
    queued: AtomicU64,
    /// Millis since `epoch` of the last write progress (or of the moment bytes began to wait).
    progress_ms: AtomicU64,
    epoch: Instant,
    owner: Mutex<(Option<String>, Option<String>)>,
}

impl Conn {
    fn new(tracker: Arc<Tracker>, health_only: bool) -> Arc<Conn> {
        Arc::new(Conn {
            tracker,
            kill: CancellationToken::new(),
            health_only,
            yielded: AtomicU64::new(0),
            written: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            owner: Mutex::default(),
        })
    }

    /// Result bytes waiting for this client.
    pub fn buffered(&self) -> u64 {
        let y = self.yielded.load(Ordering::Relaxed);
        let w = self.written.load(Ordering::Relaxed);
        y.saturating_sub(w) + self.queued.load(Ordering::Relaxed)
    }

    /// `n` bytes went out. Headers and chunk framing count too, but never as credit beyond
    /// the body bytes handed out so far.
    fn wrote(&self, n: u64) {
        let yielded = self.yielded.load(Ordering::Relaxed);
        let _ = self
            .written
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                Some(w.saturating_add(n).min(yielded.max(w)))
            });
        self.progressed();
    }

    fn last_progress(&self) -> Instant {
        self.epoch + Duration::from_millis(self.progress_ms.load(Ordering::Relaxed))
    }

    fn progressed(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Relaxed);
    }

    /// The tenant and protocol session this connection serves.
    fn owner(&self) -> (Option<String>, Option<String>) {
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set_tenant(&self, tenant: &str) {
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).0 = Some(tenant.to_string());
    }

    pub fn set_session(&self, session: &str) {
        self.owner.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(session.to_string());
    }

    /// `n` bytes were queued for this connection's SSE stream.
    pub fn queue(&self, n: u64) {
        if self.buffered() == 0 {
            self.progressed();
        }
        self.queued.fetch_add(n, Ordering::Relaxed);
        self.tracker.enforce();
    }

    /// `n` queued bytes were handed on (or dropped).
    pub fn unqueue(&self, n: u64) {
        let _ = self
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(n))
            });
    }

    /// Disconnect this client (its session's queue is over its bound).
    pub fn kill(&self) {
        self.kill.cancel();
    }
}

/// A response body counted against its connection, and holding its stream slot.
pub struct Metered {
    inner: Body,
    conn: Option<Arc<Conn>>,
    _slot: Option<StreamSlot>,
}

impl Metered {
    pub fn wrap(inner: Body, conn: Option<Arc<Conn>>, slot: Option<StreamSlot>) -> Body {
        Body::new(Metered {
            inner,
            conn,
            _slot: slot,
        })
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let (Poll::Ready(Some(Ok(frame))), Some(conn)) = (&r, &self.conn) {
            if let Some(data) = frame.data_ref() {
                if !data.is_empty() {
                    if conn.buffered() == 0 {
                        conn.progressed();
                    }
                    conn.yielded.fetch_add(data.len() as u64, Ordering::Relaxed);
                    conn.tracker.enforce();
                }
            }
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A socket that counts what it writes.
struct CountingIo {
    inner: tokio::net::TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for CountingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            if *n > 0 {
                self.conn.wrote(*n as u64);
            }
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r {
            if *n > 0 {
                self.conn.wrote(*n as u64);
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Removes a connection from the books when its task ends.
struct ConnGuard {
    tracker: Arc<Tracker>,
    id: u64,
    health_only: bool,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.tracker.conns().remove(&self.id);
        let n = if self.health_only {
            &self.tracker.health_conns
        } else {
            &self.tracker.mcp_conns
        };
        n.fetch_sub(1, Ordering::Relaxed);
    }
}

/// 503 for an MCP request on a health-reserve connection.
fn saturated() -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32000,
            "message": "the server is at its connection limit (--max-connections, MCP_EXECUTOR_MAX_CONNECTIONS); retry in a moment",
        },
    });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "5"), (header::CONNECTION, "close")],
        axum::Json(body),
    )
        .into_response()
}

/// The kernel's send buffer of each connection, bytes (it doubles it). Without a fixed
/// size Linux grows it up to `tcp_wmem` (4 MiB): a client that does not read would pin that
/// much kernel memory per connection, out of sight of the bounds on unread results.
pub const SEND_BUFFER: usize = 128 << 10;

fn limit_send_buffer(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd as _;
    let size = SEND_BUFFER as libc::c_int;
    // SAFETY: setsockopt on a socket we own, with a pointer to a local int of the right size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Raise the soft limit on open files to the hard limit, so that the connection caps, not
/// the descriptor table, are what a flood of connections meets.
fn raise_open_files_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max.min(1 << 20),
                rlim_max: lim.rlim_max,
            };
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &want);
        }
    }
}

/// The soft limit on open files.
fn open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            return lim.rlim_cur;
        }
    }
    u64::MAX
}

/// Serve `router` on `listener` within `bounds` until `shutdown` is cancelled; then give
/// open requests `grace` to finish and drop what is left.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
    bounds: Bounds,
    grace: Duration,
) -> std::io::Result<()> {
    raise_open_files_limit();
    let wanted = (bounds.max_connections + bounds.health_connections) as u64 + 64;
    let nofile = open_files_limit();
    if nofile < wanted {
        tracing::warn!(
            open_files_limit = nofile,
            max_connections = bounds.max_connections,
            "the open-files limit is below the connection caps: raise it (ulimit -n) or lower --max-connections"
        );
    }
    let tracker = Tracker::new(bounds);
    // The stall check also runs when nothing is written.
    let ticker = tokio::spawn({
        let tracker = Arc::downgrade(&tracker);
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                match tracker.upgrade() {
                    Some(t) => t.enforce(),
                    None => return,
                }
            }
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(tracker.bounds.header_timeout)
        .keep_alive(true);
    let builder = Arc::new(builder);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => break,
        };
        let (stream, _peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors (EMFILE) and the like: wait, do not spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let b = &tracker.bounds;
        let health_only = if tracker.mcp_conns.load(Ordering::Relaxed) < b.max_connections {
            tracker.mcp_conns.fetch_add(1, Ordering::Relaxed);
            false
        } else if tracker.health_conns.load(Ordering::Relaxed) < b.health_connections {
            tracker.health_conns.fetch_add(1, Ordering::Relaxed);
            tracker
                .counters
                .connections_health_only
                .fetch_add(1, Ordering::Relaxed);
            true
        } else {
            tracker
                .counters
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "connection refused: the connection caps and the health reserve are full"
            );
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        limit_send_buffer(&stream);
        let conn = Conn::new(tracker.clone(), health_only);
        let id = tracker.next_id.fetch_add(1, Ordering::Relaxed);
        tracker.conns().insert(id, conn.clone());
        let guard = ConnGuard {
            tracker: tracker.clone(),
            id,
            health_only,
        };
        let router = router.clone();
        let builder = builder.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let kill = conn.kill.clone();
            let io = hyper_util::rt::TokioIo::new(CountingIo {
                inner: stream,
                conn: conn.clone(),
            });
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let router = router.clone();
                    let conn = conn.clone();
                    async move {
                        let mut request: Request = request.map(Body::new);
                        if conn.health_only && !health_path(request.uri().path()) {
                            return Ok::<_, Infallible>(saturated());
                        }
                        request.extensions_mut().insert(conn.clone());
                        let response = match router.oneshot(request).await {
                            Ok(r) => r,
                            Err(never) => match never {},
                        };
                        Ok(response.map(|b| Metered::wrap(b, Some(conn), None)))
                    }
                },
            );
            let connection = builder.serve_connection(io, service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = kill.cancelled() => {}
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    tokio::select! {
                        _ = connection.as_mut() => {}
                        _ = kill.cancelled() => {}
                    }
                }
            }
        });
    }
    drop(listener);
    let all_closed = || async {
        while !tracker.conns().is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(grace, all_closed()).await.is_err() {
        tracing::warn!("requests still open after the shutdown grace period; dropping them");
        for c in tracker.conns().values() {
            c.kill.cancel();
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), all_closed()).await;
    }
    ticker.abort();
    Ok(())
}

/// Nesting deeper than `max` (arrays and objects, outside strings)?
pub fn json_too_deep(bytes: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &c in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == b'\\' {
                escaped = true;
            } else if c == b'"' {
                in_string = false;
            }
            continue;
        }
        match c {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth() {
        assert!(!json_too_deep(br#"{"a":[1,{"b":"[[[[["}]}"#, 3));
        assert!(json_too_deep(br#"{"a":[1,{"b":[[]]}]}"#, 3));
        assert!(!json_too_deep(br#""\"[[[[""#, 1));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(json_too_deep(deep.as_bytes(), 128));
    }
}
