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

/// What `/readyz` answers: ready when start-up is over (the image built, the isolation
/// self-test passed), the backend answers, its image is there, and its warm pool (if it has
/// one) has a sandbox waiting.
#[derive(Debug, Clone, Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub problem: Option<String>,
    /// Where start-up is ([`Phase::name`]): `serving` once the service answers.
    pub phase: &'static str,
    /// The image build's current step (`step 4 of 13: RUN …`), while it builds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
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

/// Where a server is in its start-up. The HTTP listener and the stdio handler exist before
/// the [`Service`] does: until it does, `/readyz` answers from here
/// ([`Startup::readiness`]) and early tool calls wait here ([`Startup::wait_serving`]).
pub struct Startup {
    phase: tokio::sync::watch::Sender<Phase>,
}

/// A phase of start-up, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Connecting to the backend, looking for the image.
    Starting,
    /// Building the sandbox image (first run); `step` is the current step when known.
    BuildingImage { step: Option<String> },
    /// The isolation self-test.
    SelfTest,
    /// Checking the Python environment the runs start in.
    Environment,
    /// The service answers; its own readiness says the rest (backend, image, pool).
    Serving,
    /// Start-up failed (the server exits).
    Failed(String),
}

impl Phase {
    /// The phase as `/readyz` names it.
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::BuildingImage { .. } => "building_image",
            Phase::SelfTest => "self_test",
            Phase::Environment => "environment",
            Phase::Serving => "serving",
            Phase::Failed(_) => "failed",
        }
    }

    /// Why the server is not ready in this phase (`None` once serving).
    pub fn problem(&self) -> Option<String> {
        match self {
            Phase::Starting => Some("starting up".into()),
            Phase::BuildingImage { .. } => Some("building the sandbox image".into()),
            Phase::SelfTest => Some("running the isolation self-test".into()),
            Phase::Environment => Some("checking the Python environment".into()),
            Phase::Serving => None,
            Phase::Failed(e) => Some(format!("start-up failed: {e}")),
        }
    }

    /// The phase in a few words, with the build's step: for people (progress messages).
    pub fn describe(&self) -> String {
        match self {
            Phase::BuildingImage { step: Some(step) } => {
                format!("building the sandbox image ({step})")
            }
            p => p.problem().unwrap_or_else(|| "ready".into()),
        }
    }
}

impl Startup {
    pub fn new() -> Arc<Startup> {
        Arc::new(Startup {
            phase: tokio::sync::watch::Sender::new(Phase::Starting),
        })
    }

    pub fn set(&self, phase: Phase) {
        self.phase.send_replace(phase);
    }

    /// The current build step, while the image builds.
    pub fn set_build_step(&self, step: String) {
        self.phase.send_if_modified(|p| match p {
            Phase::BuildingImage { step: s } => {
                *s = Some(step);
                true
            }
            _ => false,
        });
    }

    pub fn phase(&self) -> Phase {
        self.phase.borrow().clone()
    }

    /// Readiness before the service exists: not ready, and why; `pool_target` is the warm
    /// pool the server will keep.
    pub fn readiness(&self, pool_target: usize) -> Readiness {
        let phase = self.phase();
        let image_present = matches!(phase, Phase::SelfTest | Phase::Environment | Phase::Serving);
        Readiness {
            ready: false,
            problem: Some(phase.problem().unwrap_or_else(|| "starting up".into())),
            phase: phase.name(),
            progress: match &phase {
                Phase::BuildingImage { step } => step.clone(),
                _ => None,
            },
            backend: None,
            image_present,
            pool_ready: 0,
            pool_target,
            live_containers: 0,
        }
    }

    /// Wait until start-up is over, at most `bound`; `on_change` is told each phase (and
    /// build step) seen, the current one first. `Err` says why not: start-up failed, or
    /// is still going on after `bound`.
    pub async fn wait_serving(
        &self,
        bound: Duration,
        mut on_change: impl FnMut(&Phase),
    ) -> Result<(), String> {
        let mut rx = self.phase.subscribe();
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let phase = rx.borrow_and_update().clone();
            match &phase {
                Phase::Serving => return Ok(()),
                Phase::Failed(e) => return Err(format!("the server could not start: {e}")),
                p => on_change(p),
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err("the server is shutting down".into()),
                Err(_) => {
                    return Err(format!(
                        "the server is still starting up ({}) after {} s; retry in a moment",
                        self.phase().describe(),
                        bound.as_secs()
                    ))
                }
            }
        }
    }
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
                storage_total: None,
                tracer: None,
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

    /// Shut down by `token` (a server's signal handler made before the service) rather than
    /// a token of its own. Call it before adding tenants: they take the token then.
    pub fn shutdown_on(mut self, token: CancellationToken) -> Service {
        assert!(self.tenants.is_empty(), "shutdown_on before add_tenant");
        self.shared.shutdown = token;
        self
    }

    /// Export traces with `tracer` (`None`: off). Call it before adding tenants.
    pub fn traces(mut self, tracer: crate::telemetry::Tracer) -> Service {
        assert!(self.tenants.is_empty(), "traces before add_tenant");
        self.shared.tracer = tracer;
        self
    }

    /// The trace exporter; `None`: traces are off.
    pub fn tracer(&self) -> &crate::telemetry::Tracer {
        &self.shared.tracer
    }

    /// Hold the stored code and workspace files of every tenant to `limit` bytes together
    /// (those under `roots`: the code storage and workspace directories). Call it before
    /// adding tenants: their quotas sit within it.
    pub fn storage_total(mut self, limit: u64, roots: Vec<std::path::PathBuf>) -> Service {
        assert!(self.tenants.is_empty(), "storage_total before add_tenant");
        self.shared.storage_total = Some(Arc::new(crate::storage::StorageQuota::server_wide(
            limit, roots,
        )));
        self
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
            phase: Phase::Serving.name(),
            progress: None,
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
        let mut out = self.shared.metrics.render(&gauges);
        crate::telemetry::render_metrics(&self.shared.tracer, &mut out);
        out
    }

    /// What is in flight: runs going, calls waiting for a run slot, sessions open (what a
    /// shutdown past its deadline says it abandons).
    pub fn in_flight(&self) -> (usize, usize, usize) {
        let depth = self.shared.scheduler.depth();
        let sessions = self.tenants.iter().map(|e| e.live_sessions()).sum();
        (depth.running, depth.waiting, sessions)
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
