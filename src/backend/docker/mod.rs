//! The Docker backend: one fresh, hardened container per run, optionally
//! taken from a warm pool of pre-started ones. bollard types stay in here: nothing outside
//! `backend/docker/` uses bollard.
//!
//! Lifecycle of a run (see DESIGN.md for why each step is the way it is):
//! create (read-only root, tmpfs workspace, no network, no capabilities, log driver `none`)
//! → attach (before start, or output is lost) → start → stream the job into the runner's
//! stdin → decode its framed stdout → result as soon as the `X` frame arrives. The
//! container is removed in the background on every path, by a guard whose `Drop` runs on
//! success, error, timeout, cancellation (the future dropped) and panic alike.
//!
//! One file per concern: [`spec`] (what a container is made of: labels, command, the
//! hardening, how environment sources are mounted), `launch` (create, attach, start),
//! `live` (the conversation with the runner), `outcome` (how a run ended), `session`
//! (stateful sessions), `pool` (warm containers), `guard` (removal on every path, sweeps),
//! [`image`] (building the image), `lifecycle` (the benchmark's Docker ceiling). This file
//! holds the configuration, the backend with its map of pools, and the [`Backend`] impl.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::Docker;
use tokio::task::JoinHandle;

use self::guard::Cleanup;
use self::live::Live;
use self::pool::Pool;
pub use self::pool::{KindStats, PoolStats};
use self::session::DockerSession;
pub use self::spec::{
    docker_run_flags, is_gvisor, GVISOR_RUNTIME, LABEL_JOB, LABEL_MANAGED, LABEL_OWNER,
    LABEL_TENANT,
};
use super::protocol;
use super::{emit, Backend, BackendError, BackendInfo, Events, LifecycleFigures, Session};
use crate::backend::collect::Ended;
use crate::job::{JobSpec, Limits, Outcome, RunEnv, RunEvent};

mod guard;
pub mod image;
mod launch;
mod lifecycle;
mod live;
mod outcome;
mod pool;
mod session;
pub mod spec;
mod weight;

/// The [`LABEL_OWNER`] value of what process `pid` of this host makes
/// (`host/pid/start-time`); `None` when there is no such process.
pub fn owner_label(pid: u32) -> Option<String> {
    guard::owner_id(pid)
}

/// Settings of the Docker backend.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The sandbox image (see [`crate::backend::image`]).
    pub image: String,
    /// OCI runtime (`runc` when `None`; `crun` where the daemon knows it).
    pub runtime: Option<String>,
    /// The interpreter inside the sandbox that runs the code.
    pub python: String,
    /// Containers kept started and waiting for a job (0 turns the warm pool off).
    pub pool_size: usize,
    /// The limits pool containers are made with; jobs with other memory/CPU/pids/tmpfs
    /// limits take the cold path.
    pub pool_limits: Limits,
    /// The environment the shared pool's containers are made with at start ([`Backend::prewarm`]
    /// changes it).
    pub pool_env: RunEnv,
    /// The daemon's address (`unix://…`, `tcp://…`); `None`: `DOCKER_HOST`, else the local
    /// socket.
    pub docker_host: Option<String>,
    /// One pool per tenant (multi-tenant servers): no shared pool is made at start; a
    /// tenant's pool is made, with its limits and environment, at its first run and
    /// removed after [`POOL_IDLE`] without a run. Its containers carry the tenant's label.
    pub pool_per_tenant: bool,
    /// What pool sandboxes import before their job, and what is learned (see
    /// [`crate::backend::preload`]); off by default.
    pub preload: crate::backend::preload::PreloadConfig,
}

pub use crate::backend::pool::POOL_IDLE;

/// How long [`DockerBackend::shutdown`] waits for the containers still held by runs being
/// cancelled.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);

use crate::backend::pool::{PoolHandle, Pools};

impl DockerConfig {
    /// The image, runc, the image's Python, no pool.
    pub fn new(image: impl Into<String>) -> Self {
        DockerConfig {
            image: image.into(),
            runtime: None,
            python: crate::backend::image::PYTHON.into(),
            pool_size: 0,
            pool_limits: Limits::default(),
            pool_env: RunEnv::default(),
            docker_host: None,
            pool_per_tenant: false,
            preload: Default::default(),
        }
    }
}

/// What the request path and the pool's refill task share.
pub(super) struct Inner {
    docker: Docker,
    config: DockerConfig,
    cleanup: Arc<Cleanup>,
    owner: String,
    /// Preloading refills at once over all pools, and what was learned (see `pool`).
    preloads: pool::Preloads,
}

/// The real backend.
pub struct DockerBackend {
    inner: Arc<Inner>,
    /// Warm pools: one shared, or one per tenant (see [`crate::backend::pool::Pools`]).
    pools: Pools<Live>,
    /// The periodic sweep of a long-lived server, stopped at shutdown.
    sweeper: std::sync::Mutex<Option<JoinHandle<()>>>,
}

/// Refuse a runtime the daemon does not have registered, with what to run: otherwise every
/// container start fails later with Docker's "unknown or invalid runtime name".
async fn check_runtime(docker: &bollard::Docker, runtime: &str) -> Result<(), BackendError> {
    let info = docker
        .info()
        .await
        .map_err(|e| classify("asking the daemon's runtimes", e))?;
    let known: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    if known.iter().any(|r| r == runtime) {
        return Ok(());
    }
    let fix = if is_gvisor(Some(runtime)) {
        "install and register gVisor: `sudo scripts/setup-docker.sh --gvisor` (installs runsc, \
         adds it to /etc/docker/daemon.json, reloads dockerd with SIGHUP)"
    } else {
        "register it in /etc/docker/daemon.json (`runtimes`) and reload dockerd (SIGHUP)"
    };
    Err(BackendError::Failed {
        backend: "Docker",
        action: "checking the sandbox runtime",
        detail: format!(
            "the daemon has no runtime `{runtime}` registered (it has: {}); {fix}",
            known.join(", ")
        ),
    })
}

impl DockerBackend {
    /// Connect to the daemon named by `DOCKER_HOST` (or the local socket), check it answers,
    /// and start filling the warm pool if one is configured.
    pub async fn connect(config: DockerConfig) -> Result<Self, BackendError> {
        let docker = connect_docker_at(config.docker_host.as_deref()).await?;
        if let Some(runtime) = &config.runtime {
            check_runtime(&docker, runtime).await?;
        }
        let inner = Arc::new(Inner {
            docker,
            owner: guard::owner_id(std::process::id()).unwrap_or_else(|| "unknown".into()),
            cleanup: Arc::default(),
            preloads: pool::Preloads::new(&config.preload),
            config,
        });
        let c = &inner.config;
        let starter = inner.clone();
        // A new pool preloads what is configured and learned for its key.
        let start = move |pool: Pool| {
            let config = &starter.config.preload;
            let list = starter.preloads.list_for(config, &pool.label, &pool.env);
            let inner = starter.clone();
            PoolHandle::start(pool.with_preload(list), move |p| {
                pool::refill(inner.clone(), p)
            })
        };
        let shared = (c.pool_limits.clone(), c.pool_env.clone());
        let pools = Pools::new(c.pool_size, c.pool_per_tenant, shared, Box::new(start));
        Ok(DockerBackend {
            inner,
            pools,
            sweeper: std::sync::Mutex::default(),
        })
    }

    /// Pool figures, all pools together; `None` when the pool is off. The Docker backend's
    /// own tests read them; everything else reads [`Backend::stats`].
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.pools.stats()
    }

    /// A waiting container for `job`, if its pool has one of its shape: for a run, the kind
    /// its code's imports need (see [`crate::backend::preload::choose`]); for a session
    /// (`run` false), the most preloaded.
    fn take_warm(&self, job: &JobSpec, run: bool) -> Option<Live> {
        let imports = run.then(|| {
            job.files
                .iter()
                .find(|f| f.path == job.entry)
                .map(|f| crate::backend::preload::imports_in(&f.contents))
                .unwrap_or_default()
        });
        self.pools.take_for(
            &job.tenant,
            &job.limits,
            &job.env,
            job.keep_warm,
            imports.as_deref(),
        )
    }
}

impl Inner {
    /// The interpreter a job with `env` runs.
    fn python<'a>(&'a self, env: &'a RunEnv) -> &'a str {
        spec::python(&self.config, env)
    }
}

#[async_trait]
impl Backend for DockerBackend {
    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
        let started = Instant::now();
        let input = protocol::encode_job(&job, self.inner.python(&job.env))
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let warm = self.take_warm(&job, true);
        let pooled = warm.is_some();
        let mut live = match warm {
            Some(live) => live,
            None => {
                self.inner
                    .launch(&job.limits, &job.env, &job.tenant, &job.id)
                    .await?
            }
        };
        let container = live.guard.id().to_string();
        tracing::debug!(job_id = %job.id, tenant = %job.tenant, container = %container, pooled, ms = started.elapsed().as_millis() as u64, "sandbox started");
        emit(
            &events,
            RunEvent::Created {
                container: container.clone(),
            },
        );

        // Code mode (#26): the code's tool requests go to the job's tools.
        let hook = protocol::tool_hook(&job.tools, false);
        let mut ended = live
            .execute(&input, true, &job.limits, &events, &hook)
            .await?;
        if let Ended::Vanished(out) = &ended {
            if pooled && out.is_empty() {
                // A pool container that died while it waited (a daemon restart, a kill
                // from outside) and slipped past the pool's liveness check: the job never
                // started. Run it once more, in a fresh container.
                tracing::warn!(job_id = %job.id, container = %container, "pool container was dead at dispatch; running the job in a fresh container");
                live = self
                    .inner
                    .launch(&job.limits, &job.env, &job.tenant, &job.id)
                    .await?;
                ended = live
                    .execute(&input, true, &job.limits, &events, &hook)
                    .await?;
            }
        }
        if let Ended::Report(report, _) = &ended {
            self.observe_preload(&job, pooled, report);
        }
        let mut outcome = self.inner.outcome_of(ended, &live.guard).await?;
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(job_id = %job.id, status = %outcome.status_line(), "run finished");
        // `live` drops here: its guard removes the container in the background.
        Ok(outcome)
    }

    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        let input = protocol::encode_session(&job, self.inner.python(&job.env))
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let mut live = match self.take_warm(&job, false) {
            Some(live) => live,
            None => {
                self.inner
                    .launch(&job.limits, &job.env, &job.tenant, &job.id)
                    .await?
            }
        };
        live.wait_ready().await?;
        live.send(&input).await?;
        tracing::debug!(job_id = %job.id, tenant = %job.tenant, container = %live.guard.id(), "session opened");
        let mut session = DockerSession::new(self.inner.clone(), live, job.limits);
        session.tools = job.tools.clone();
        Ok(Box::new(session))
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        let docker = &self.inner.docker;
        let v = docker
            .version()
            .await
            .map_err(|e| classify("asking the daemon's version", e))?;
        let image_present = docker.inspect_image(&self.inner.config.image).await.is_ok();
        let runtime = self.inner.config.runtime.as_deref();
        let mut details = vec![("runtime".to_string(), runtime.unwrap_or("runc").to_string())];
        if is_gvisor(runtime) {
            // What `doctor` checks the sandbox's kernel against.
            details.push(("isolation".to_string(), "gvisor".to_string()));
            details.push((
                "host kernel".to_string(),
                v.kernel_version.unwrap_or_default(),
            ));
        }
        Ok(BackendInfo {
            kind: "docker",
            details,
            version: format!(
                "Docker {} (API {})",
                v.version.unwrap_or_default(),
                v.api_version.unwrap_or_default()
            ),
            image: self.inner.config.image.clone(),
            image_present,
        })
    }

    async fn drain(&self) {
        self.inner.cleanup.drain().await;
    }

    fn stats(&self) -> crate::backend::BackendStats {
        let pool = self.pool_stats().unwrap_or_default();
        crate::backend::BackendStats {
            live_containers: self.inner.cleanup.live(),
            pool_ready: pool.ready,
            pool_target: pool.target,
            pool_hits: pool.hits,
            pool_misses: pool.misses,
        }
    }

    /// Bare containers of `/bin/true` with the same hardening: what Docker alone allows.
    async fn lifecycle_ceiling(
        &self,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        Some(lifecycle::ceiling(&self.inner, total, concurrency).await)
    }

    /// Remove containers of ours whose owning process on this host is gone (a crash, a
    /// `kill -9`). Containers of live processes, and of other hosts, are left alone.
    async fn sweep(&self) -> Result<usize, BackendError> {
        guard::sweep(&self.inner.docker).await
    }

    /// Sweep every `every` as well as at start-up (a long-lived server): containers of
    /// servers that died meanwhile, on this host or in a recreated service, go too.
    fn sweep_periodically(&self, every: Duration) {
        let docker = self.inner.docker.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = guard::sweep(&docker).await {
                    tracing::warn!(error = %e, "periodic sweep of leftover containers failed");
                }
            }
        });
        if let Some(old) = self.sweeper.lock().expect("sweeper lock").replace(task) {
            old.abort();
        }
    }

    /// Stop the pools, remove their containers, and wait until every container this
    /// backend made is removed (runs being cancelled drop theirs a moment later), for at
    /// most [`SHUTDOWN_DEADLINE`]; what is left then goes to the next start-up sweep.
    async fn shutdown(&self) {
        if let Some(t) = self.sweeper.lock().expect("sweeper lock").take() {
            t.abort();
        }
        self.pools.shutdown().await;
        let left = self.inner.cleanup.drain_all(SHUTDOWN_DEADLINE).await;
        if left > 0 {
            tracing::warn!(
                left,
                "containers still held at shutdown; the next start-up sweep removes them"
            );
        }
    }

    async fn prewarm(&self, tenant: &str, env: &RunEnv) {
        self.pools.prewarm(tenant, env);
    }
}

/// Remove now every container this process made, over a connection of its own (the
/// caller may run on another runtime than the backend, whose tasks may be stuck): what a
/// shutdown past its deadline does before the process exits. Their count.
pub async fn remove_own_containers(docker_host: Option<&str>) -> Result<usize, BackendError> {
    let docker = connect_docker_at(docker_host).await?;
    let owner = guard::owner_id(std::process::id()).unwrap_or_else(|| "unknown".into());
    guard::remove_owned(&docker, &owner).await
}

/// Connect to the daemon named by `DOCKER_HOST` (`unix://` or `tcp://`; the local socket
/// when unset) and check it answers.
pub(crate) async fn connect_docker() -> Result<Docker, BackendError> {
    connect_docker_at(None).await
}

/// [`connect_docker`], to `host` when given.
async fn connect_docker_at(host: Option<&str>) -> Result<Docker, BackendError> {
    let docker = match host {
        Some(h) => Docker::connect_with_host(h),
        None => Docker::connect_with_defaults(),
    }
    .map_err(|e| unreachable(e.to_string()))?;
    docker
        .ping()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    Ok(docker)
}

/// The daemon does not answer: in Docker's words, with what to do.
pub(crate) fn unreachable(detail: String) -> BackendError {
    BackendError::Unreachable {
        what: "the Docker daemon",
        detail,
        hint: "Is it running? Start it (`dockerd &` or `systemctl start docker`) or point DOCKER_HOST at it",
    }
}

/// Sort a bollard error into "the daemon is not there" and "the daemon said no".
pub(crate) fn classify(action: &'static str, e: BollardError) -> BackendError {
    match e {
        BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::SocketNotFoundError(_)
        | BollardError::HttpClientError { .. } => unreachable(e.to_string()),
        e => BackendError::Failed {
            backend: "Docker",
            action,
            detail: e.to_string(),
        },
    }
}
