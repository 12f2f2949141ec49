//! The Kubernetes backend's warm pool: the shared pool ([`crate::backend::pool`]) of
//! running, attached, single-use pods, and how a pod is made for it.

use std::sync::Arc;

use super::spec::Lifetime;
use super::KubeDriver;
use crate::backend::engine::Pool;

/// One refill worker of `pool` (see [`crate::backend::pool::refill`]).
pub(super) async fn refill(inner: Arc<KubeDriver>, pool: Arc<Pool>) {
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
