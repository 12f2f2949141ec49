//! One accepted connection: what it was handed and what it wrote (its socket counts the
//! bytes), the response bodies metered against it, and the kill switch that drops it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

use super::{StreamSlot, Tracker};

/// One accepted connection, in each of its requests' extensions.
pub struct Conn {
    pub tracker: Arc<Tracker>,
    pub(super) kill: CancellationToken,
    /// Only `/healthz`, `/readyz` and `/metrics` (the health reserve).
    pub(super) health_only: bool,
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
    pub(super) fn new(tracker: Arc<Tracker>, health_only: bool) -> Arc<Conn> {
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

    pub(super) fn last_progress(&self) -> Instant {
        self.epoch + Duration::from_millis(self.progress_ms.load(Ordering::Relaxed))
    }

    fn progressed(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Relaxed);
    }

    /// The tenant and protocol session this connection serves.
    pub(super) fn owner(&self) -> (Option<String>, Option<String>) {
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
pub(super) struct CountingIo {
    pub(super) inner: tokio::net::TcpStream,
    pub(super) conn: Arc<Conn>,
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
