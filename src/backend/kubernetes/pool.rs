//! The Kubernetes backend's warm pool: the shared pool ([`crate::backend::pool`]) of
//! running, attached, single-use pods, and how a pod is made for it.

use std::sync::Arc;
use std::time::Instant;

use super::live::Live;
use super::spec::Lifetime;
use super::Inner;
use crate::backend::pool::Waiting;

pub use crate::backend::pool::PoolStats;

/// A pool of waiting pods.
pub(super) type Pool = crate::backend::pool::Pool<Live>;

impl Waiting for Live {
    fn waiting_since(&mut self) -> Option<Instant> {
        self.still_waiting().then_some(self.born)
    }
}

/// One refill worker of `pool` (see [`crate::backend::pool::refill`]).
pub(super) async fn refill(inner: Arc<Inner>, pool: Arc<Pool>) {
    crate::backend::pool::refill(pool, |pool| {
        let inner = inner.clone();
        async move {
            Some(
                inner
                    .launch(
                        &pool.limits,
                        &pool.env,
                        &pool.label,
                        &crate::job::new_job_id(),
                        Lifetime::Long,
                    )
                    .await,
            )
        }
    })
    .await
}
