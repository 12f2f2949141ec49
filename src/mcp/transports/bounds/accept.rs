//! The accept loop: connections within their caps (with the health reserve), each socket
//! counted and its send buffer fixed, and the grace period of a shutdown.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::conn::CountingIo;
use super::{health_path, Bounds, Conn, Metered, Tracker};

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
