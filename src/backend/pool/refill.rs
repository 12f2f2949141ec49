//! The refill workers: each claims a kind of sandbox the pool lacks, makes it, and gives
//! it to the pool.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Pool, Waiting, PRUNE_EVERY};
use crate::backend::BackendError;

/// One refill worker; each pool runs [`REFILL_WORKERS`] of them, so a bounded number of
/// sandboxes is made at once: refilling cannot take all of the machine away from the runs
/// themselves, yet keeps up with a sustained load. `make` makes one sandbox of the pool,
/// ready for a job; `None` when the pool closed while it waited to begin. (The Kubernetes
/// backend's; Docker's preloads, [`refill_kinds`].)
#[cfg(feature = "kubernetes")]
pub(crate) async fn refill<L, F, Fut>(pool: Arc<Pool<L>>, make: F)
where
    L: Waiting,
    F: Fn(Arc<Pool<L>>) -> Fut,
    Fut: Future<Output = Option<Result<L, BackendError>>>,
{
    refill_kinds(pool, |pool, _kind| make(pool)).await
}

/// One refill worker, where `make` is told what the sandbox preloads (its kind).
pub(crate) async fn refill_kinds<L, F, Fut>(pool: Arc<Pool<L>>, make: F)
where
    L: Waiting,
    F: Fn(Arc<Pool<L>>, Vec<String>) -> Fut,
    Fut: Future<Output = Option<Result<L, BackendError>>>,
{
    let mut failures: u32 = 0;
    loop {
        if pool.is_closed() {
            return;
        }
        if let Some(kind) = pool.claim() {
            pool.settle().await;
            let made = match make(pool.clone(), kind.clone()).await {
                Some(made) => made,
                None => {
                    pool.made(&kind, None);
                    return;
                }
            };
            match made {
                Ok(live) => {
                    if failures > 0 {
                        tracing::info!(failures, "the warm pool refills again");
                    }
                    failures = 0;
                    if !pool.made(&kind, Some(live)) {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    pool.made(&kind, None);
                    super::REFILL_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    failures = failures.saturating_add(1);
                    let backoff = Duration::from_millis(100 << failures.min(7));
                    // One warning per streak of failures, not one per retry; the retries
                    // (with their back-off) are at debug level.
                    if failures == 1 {
                        tracing::warn!(error = %e, "could not refill the warm pool; retrying with back-off");
                    } else {
                        tracing::debug!(error = %e, failures, retry_in_ms = backoff.as_millis() as u64, "could not refill the warm pool");
                    }
                    // Woken early when the pool closes (or a run takes from it).
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = pool.wake.notified() => {}
                    }
                    continue;
                }
            }
        }
        tokio::select! {
            _ = pool.wake.notified() => {}
            _ = tokio::time::sleep(PRUNE_EVERY) => {}
        }
    }
}
