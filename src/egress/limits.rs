//! The limits of egress, enforced where the bytes pass: a run's connections in flight and
//! bytes each way ([`RunBudget`], shared by the run's connections), a tenant's new
//! connections per second ([`Rate`]), and [`Metered`], the wrapper around every upstream
//! socket that counts its bytes, stops them at the run's budget and stamps the last
//! activity that the idle timeout ([`idle`]) watches.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::time::Instant as Clock;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::policy::Limits;
use super::refusal::Reason;

/// What one run may still do: its connections in flight and its bytes each way.
#[derive(Debug)]
pub struct RunBudget {
    limits: Limits,
    in_flight: Arc<Semaphore>,
    up: AtomicU64,
    down: AtomicU64,
}

impl RunBudget {
    pub fn new(limits: &Limits) -> Arc<RunBudget> {
        Arc::new(RunBudget {
            limits: limits.clone(),
            in_flight: Arc::new(Semaphore::new(limits.connections_in_flight as usize)),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        })
    }

    /// A place for one more connection, held while it is open; refused when the run has
    /// as many open as it may, or has spent a byte budget.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, Reason> {
        if self.down_left() == 0 {
            return Err(self.bytes_reason(false));
        }
        if self.up_left() == 0 {
            return Err(self.bytes_reason(true));
        }
        self.in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| Reason::Limit {
                what: format!(
                    "{} connections in flight per run",
                    self.limits.connections_in_flight
                ),
                key: "connections_in_flight",
            })
    }

    /// Bytes the run sent upstream and received, all connections together.
    pub fn spent(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed).min(self.limits.bytes_up),
            self.down
                .load(Ordering::Relaxed)
                .min(self.limits.bytes_down),
        )
    }

    fn up_left(&self) -> u64 {
        self.limits
            .bytes_up
            .saturating_sub(self.up.load(Ordering::Relaxed))
    }

    fn down_left(&self) -> u64 {
        self.limits
            .bytes_down
            .saturating_sub(self.down.load(Ordering::Relaxed))
    }

    /// Of `n` bytes just received, how many the budget lets through.
    fn take_down(&self, n: u64) -> u64 {
        let before = self.down.fetch_add(n, Ordering::Relaxed);
        self.limits.bytes_down.saturating_sub(before).min(n)
    }

    fn bytes_reason(&self, up: bool) -> Reason {
        let (n, key, way) = if up {
            (self.limits.bytes_up, "bytes_up", "sent")
        } else {
            (self.limits.bytes_down, "bytes_down", "received")
        };
        Reason::Limit {
            what: format!("{n} bytes {way} per run"),
            key,
        }
    }
}

/// New connections per second of each tenant: a token bucket per tenant holding at most
/// one second's worth.
#[derive(Debug)]
pub struct Rate {
    per_second: u32,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Rate {
    pub fn new(per_second: u32) -> Rate {
        Rate {
            per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// One connection of `tenant`, or the limit it hit.
    pub fn take(&self, tenant: &str) -> Result<(), Reason> {
        let cap = self.per_second as f64;
        let now = Instant::now();
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last) = b.entry(tenant.to_string()).or_insert((cap, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * cap).min(cap);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Reason::Limit {
                what: format!("{} new connections per second per tenant", self.per_second),
                key: "connections_per_second",
            })
        }
    }
}

/// One connection's traffic: bytes each way, when a byte last passed, and whether the
/// run's budget cut it.
#[derive(Debug)]
pub struct Traffic {
    start: Clock,
    up: AtomicU64,
    down: AtomicU64,
    last_ms: AtomicU64,
    cut: AtomicBool,
}

impl Traffic {
    pub fn new() -> Arc<Traffic> {
        Arc::new(Traffic {
            start: Clock::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
            cut: AtomicBool::new(false),
        })
    }

    /// Bytes sent upstream and received from it.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }

    /// Whether the run's byte budget ended this connection.
    pub fn cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn last(&self) -> Clock {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Resolves when no byte has passed either way on `traffic` for `limit`.
pub async fn idle(traffic: &Traffic, limit: Duration) {
    loop {
        let due = traffic.last() + limit;
        if Clock::now() >= due {
            return;
        }
        tokio::time::sleep_until(due).await;
    }
}

/// An upstream socket, counted and held to the run's byte budget. Reads past the budget
/// deliver what is left, then fail; so do writes.
pub struct Metered<S> {
    inner: S,
    run: Arc<RunBudget>,
    traffic: Arc<Traffic>,
}

impl<S> Metered<S> {
    pub fn new(inner: S, run: Arc<RunBudget>, traffic: Arc<Traffic>) -> Self {
        traffic.touch();
        Metered {
            inner,
            run,
            traffic,
        }
    }

    fn over(&self, up: bool) -> io::Error {
        self.traffic.cut.store(true, Ordering::Relaxed);
        let what = match self.run.bytes_reason(up) {
            Reason::Limit { what, .. } => what,
            _ => String::new(),
        };
        io::Error::other(format!("egress limit: {what}"))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.run.down_left() == 0 {
            return Poll::Ready(Err(self.over(false)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        let n = (buf.filled().len() - before) as u64;
        if n == 0 {
            return Poll::Ready(Ok(()));
        }
        let granted = self.run.take_down(n);
        if granted == 0 {
            buf.set_filled(before);
            return Poll::Ready(Err(self.over(false)));
        }
        if granted < n {
            buf.set_filled(before + granted as usize);
            self.traffic.cut.store(true, Ordering::Relaxed);
        }
        self.traffic.down.fetch_add(granted, Ordering::Relaxed);
        self.traffic.touch();
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let left = self.run.up_left();
        if left == 0 && !buf.is_empty() {
            return Poll::Ready(Err(self.over(true)));
        }
        let m = buf.len().min(left.min(usize::MAX as u64) as usize);
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &buf[..m]))?;
        self.run.up.fetch_add(n as u64, Ordering::Relaxed);
        self.traffic.up.fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            self.traffic.touch();
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(in_flight: u32, up: u64, down: u64) -> Limits {
        Limits {
            connections_in_flight: in_flight,
            bytes_up: up,
            bytes_down: down,
            ..Limits::default()
        }
    }

    #[test]
    fn in_flight_permits_come_back() {
        let b = RunBudget::new(&limits(2, 10, 10));
        let p1 = b.admit().unwrap();
        let _p2 = b.admit().unwrap();
        assert!(matches!(
            b.admit(),
            Err(Reason::Limit {
                key: "connections_in_flight",
                ..
            })
        ));
        drop(p1);
        assert!(b.admit().is_ok());
    }

    #[test]
    fn rate_is_per_tenant() {
        let r = Rate::new(3);
        for _ in 0..3 {
            r.take("a").unwrap();
        }
        assert!(matches!(
            r.take("a"),
            Err(Reason::Limit {
                key: "connections_per_second",
                ..
            })
        ));
        assert!(r.take("b").is_ok());
    }

    #[tokio::test]
    async fn bytes_stop_at_the_run_budget_across_connections() {
        let b = RunBudget::new(&limits(4, 6, 10));
        let (mut far, near) = tokio::io::duplex(64);
        let t1 = Traffic::new();
        let mut m = Metered::new(near, b.clone(), t1.clone());
        far.write_all(b"0123456").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(m.read(&mut buf).await.unwrap(), 7);
        // A second connection of the same run gets the 3 bytes left, then an error.
        let (mut far2, near2) = tokio::io::duplex(64);
        let t2 = Traffic::new();
        let mut m2 = Metered::new(near2, b.clone(), t2.clone());
        far2.write_all(b"abcdef").await.unwrap();
        assert_eq!(m2.read(&mut buf).await.unwrap(), 3);
        assert_eq!(&buf[..3], b"abc");
        assert!(t2.cut());
        let e = m2.read(&mut buf).await.unwrap_err();
        assert!(e.to_string().contains("10 bytes received per run"), "{e}");
        assert!(matches!(
            b.admit(),
            Err(Reason::Limit {
                key: "bytes_down",
                ..
            })
        ));
        // Writes: 6 bytes pass, then the budget refuses.
        assert_eq!(m.write(b"12345678").await.unwrap(), 6);
        assert!(m.write(b"9").await.is_err());
        assert_eq!(t1.bytes(), (6, 7));
        assert_eq!(b.spent(), (6, 10));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_fires_after_quiet() {
        let t = Traffic::new();
        t.touch();
        let start = Clock::now();
        idle(&t, Duration::from_secs(5)).await;
        assert!(start.elapsed() >= Duration::from_secs(5));
    }
}
