//! The whole executor service: the backend, the run slots (one fair scheduler for every
//! tenant), the counters, the shutdown signal, and one [`Executor`] per tenant. Front ends
//! ask it for readiness and metrics in backend-neutral words, and shut it down through it:
//! stop runs, wait for sessions to close, then let the backend remove what is left.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::executor::{Executor, Shared, TenantParts};
use super::metrics::{Gauges, Metrics};
use super::settings::{defaults, SHUTDOWN_DEADLINE};
use crate::backend::Backend;
use crate::tenancy::scheduler::Scheduler;

/// The run slots of a service.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    /// Runs at once over all tenants.
    pub max_concurrent: usize,
    /// Calls of one tenant that may wait for a slot; past it calls are refused.
    pub max_queue: usize,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            max_concurrent: defaults::MAX_CONCURRENT,
            max_queue: defaults::MAX_QUEUE,
        }
    }
}

/// The service and its tenants.
pub struct Service {
    shared: Shared,
    tenants: Vec<Arc<Executor>>,
}

/// What `/readyz` answers: ready when the backend answers, its image is there, and its
/// warm pool (if it has one) has a sandbox waiting.
#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub problem: Option<String>,
    /// Which backend (`docker`), its version and backend-specific details.
    pub backend: Option<BackendReport>,
    pub image_present: bool,
    pub pool_ready: usize,
    pub pool_target: usize,
    pub live_containers: usize,
}

/// The backend, as readiness reports it.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    pub kind: &'static str,
    pub version: String,
    pub image: String,
    pub details: std::collections::BTreeMap<String, String>,
}

impl Service {
    /// A service on `backend` with these run slots and no tenant yet.
    pub fn new(backend: Arc<dyn Backend>, capacity: Capacity) -> Service {
        Service {
            shared: Shared {
                backend,
                scheduler: Scheduler::new(capacity.max_concurrent, capacity.max_queue),
                metrics: Arc::default(),
                shutdown: CancellationToken::new(),
            },
            tenants: Vec::new(),
        }
    }

    /// Add a tenant: its executor, sharing the backend, the run slots and the counters.
    pub fn add_tenant(&mut self, parts: TenantParts) -> Arc<Executor> {
        let ex = Executor::new(self.shared.clone(), parts);
        self.tenants.push(ex.clone());
        ex
    }

    pub fn tenants(&self) -> &[Arc<Executor>] {
        &self.tenants
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.shared.scheduler
    }

    /// Cancelled when the service shuts down: every run and session in flight stops.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// Ready to serve? Asks the backend (at most 3 s).
    pub async fn readiness(&self) -> Readiness {
        let backend = &self.shared.backend;
        let info = tokio::time::timeout(Duration::from_secs(3), backend.info()).await;
        let stats = backend.stats();
        let (report, image_present, problem) = match info {
            Ok(Ok(i)) => {
                let problem =
                    (!i.image_present).then(|| format!("the sandbox image {} is missing", i.image));
                let report = BackendReport {
                    kind: i.kind,
                    version: i.version,
                    image: i.image,
                    details: i.details.into_iter().collect(),
                };
                (Some(report), i.image_present, problem)
            }
            Ok(Err(e)) => (None, false, Some(e.to_string())),
            Err(_) => (
                None,
                false,
                Some("the sandbox backend did not answer within 3 s".into()),
            ),
        };
        let pool_ok = stats.pool_target == 0 || stats.pool_ready > 0;
        let problem =
            problem.or_else(|| (!pool_ok).then(|| "the warm pool has no sandbox ready yet".into()));
        Readiness {
            ready: problem.is_none(),
            problem,
            backend: report,
            image_present,
            pool_ready: stats.pool_ready,
            pool_target: stats.pool_target,
            live_containers: stats.live_containers,
        }
    }

    /// The counters and gauges, in the Prometheus text format.
    pub fn metrics_text(&self) -> String {
        let depth = self.shared.scheduler.depth();
        let stats = self.shared.backend.stats();
        let gauges = Gauges {
            runs_going: depth.running,
            queue_waiting: depth.waiting,
            run_slots: self.shared.scheduler.capacity(),
            pool_ready: stats.pool_ready,
            pool_target: stats.pool_target,
            live_containers: stats.live_containers,
            sessions: self
                .tenants
                .iter()
                .map(|e| (e.tenant().to_string(), e.live_sessions()))
                .collect(),
        };
        self.shared.metrics.render(&gauges)
    }

    /// Stop every run and session (the shutdown token), wait for sessions to close (at most
    /// [`SHUTDOWN_DEADLINE`]), then shut the backend down (pools stopped, sandboxes removed).
    pub async fn shutdown(&self) {
        self.shared.shutdown.cancel();
        for ex in &self.tenants {
            ex.wait_sessions_closed(SHUTDOWN_DEADLINE).await;
        }
        self.shared.backend.shutdown().await;
    }
}
