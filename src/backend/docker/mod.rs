//! The Docker backend: one fresh, hardened container per run, optionally
//! taken from a warm pool of pre-started ones. bollard types stay in here.
//!
//! Lifecycle of a run (see DESIGN.md for why each step is the way it is):
//! create (read-only root, tmpfs workspace, no network, no capabilities, log driver `none`)
//! → attach (before start, or output is lost) → start → stream the job into the runner's
//! stdin → decode its framed stdout → result as soon as the `X` frame arrives. The
//! container is removed in the background on every path, by a guard whose `Drop` runs on
//! success, error, timeout, cancellation (the future dropped) and panic alike.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder};
use bollard::Docker;
use tokio::task::JoinHandle;

use self::guard::{Cleanup, ContainerGuard};
use self::live::{Ended, Live};
use self::pool::Pool;
pub use self::pool::PoolStats;
use super::protocol::{self, Report};
use super::{emit, Backend, BackendError, BackendInfo, Events, Session};
use crate::job::{JobSpec, Limits, Outcome, RunEnv, RunEvent};

mod guard;
pub mod image;
mod lifecycle;
mod live;
mod pool;

pub use self::lifecycle::LifecycleFigures;

/// The [`LABEL_OWNER`] value of what process `pid` of this host makes
/// (`host/pid/start-time`); `None` when there is no such process.
pub fn owner_label(pid: u32) -> Option<String> {
    guard::owner_id(pid)
}

/// Label on everything this project creates: the sweep and tests find containers by it.
pub const LABEL_MANAGED: &str = "io.mcp-code-executor.managed";
/// Label with the job id (for a pool container: its own id until a job is dispatched).
pub const LABEL_JOB: &str = "io.mcp-code-executor.job";
/// Label with the tenant id (`pool` for a waiting pool container).
pub const LABEL_TENANT: &str = "io.mcp-code-executor.tenant";
/// Label naming the process that made the container (`host/pid/start-time`), so that the
/// start-up sweep removes only what a dead process left behind.
pub const LABEL_OWNER: &str = "io.mcp-code-executor.owner";

/// How long to wait for Docker's verdict when the runner vanished without a report.
const POST_MORTEM_DEADLINE: Duration = Duration::from_secs(10);
/// Uid and gid the code runs as (`nobody`).
const SANDBOX_USER: &str = "65534:65534";
/// The runner, started with `-I -S`; the interpreter for the code is appended.
const RUNNER_CMD: &[&str] = &[
    "/usr/bin/python3",
    "-I",
    "-S",
    "/opt/mcp-code-executor/runner.py",
];

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
    /// The environment pool containers are made with (see [`DockerBackend::reconfigure_pool`]).
    pub pool_env: RunEnv,
    /// The daemon's address (`unix://…`, `tcp://…`); `None`: `DOCKER_HOST`, else the local
    /// socket.
    pub docker_host: Option<String>,
    /// One pool per tenant (multi-tenant servers): no shared pool is made at start; a
    /// tenant's pool is made, with its limits and environment, at its first run and
    /// removed after [`POOL_IDLE`] without a run. Its containers carry the tenant's label.
    pub pool_per_tenant: bool,
}

/// A tenant's pool unused this long is removed (per-tenant pools only).
pub const POOL_IDLE: Duration = Duration::from_secs(600);

/// How long [`DockerBackend::shutdown`] waits for the containers still held by runs being
/// cancelled.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);

/// The key of the shared pool in [`DockerBackend`]'s pool map, and its containers' label.
const SHARED_POOL: &str = "pool";

impl DockerConfig {
    /// The image, runc, the image's Python, no pool.
    pub fn new(image: impl Into<String>) -> Self {
        DockerConfig {
            image: image.into(),
            runtime: None,
            python: "/usr/bin/python3".into(),
            pool_size: 0,
            pool_limits: Limits::default(),
            pool_env: RunEnv::default(),
            docker_host: None,
            pool_per_tenant: false,
        }
    }
}

/// What the request path and the pool's refill task share.
pub(super) struct Inner {
    docker: Docker,
    config: DockerConfig,
    cleanup: Arc<Cleanup>,
    owner: String,
}

/// The real backend.
pub struct DockerBackend {
    inner: Arc<Inner>,
    /// Warm pools by key: [`SHARED_POOL`], or tenant ids with `pool_per_tenant`; each with
    /// the time a run last took from it.
    pools: std::sync::Mutex<HashMap<String, (PoolHandle, Instant)>>,
    /// Pools replaced by a reconfiguration, still stopping.
    retiring: std::sync::Mutex<Vec<JoinHandle<()>>>,
    /// [`DockerBackend::shutdown`] has begun: no pool is started any more.
    closed: std::sync::atomic::AtomicBool,
    /// The periodic sweep of a long-lived server, stopped at shutdown.
    sweeper: std::sync::Mutex<Option<JoinHandle<()>>>,
}

/// A running pool and its refill workers.
struct PoolHandle {
    pool: Arc<Pool>,
    workers: Vec<JoinHandle<()>>,
}

impl PoolHandle {
    fn start(
        inner: &Arc<Inner>,
        limits: Limits,
        env: RunEnv,
        size: usize,
        label: &str,
    ) -> PoolHandle {
        let pool = Arc::new(Pool::new(limits, env, size, label));
        let workers = (0..pool::REFILL_WORKERS)
            .map(|_| tokio::spawn(pool::refill(inner.clone(), pool.clone())))
            .collect();
        PoolHandle { pool, workers }
    }

    /// Close the pool and wait for its workers: a worker finishes the container it is
    /// making, sees the pool closed and drops it (aborting mid-create would be safe too,
    /// the guard knows the name, but slower to clean).
    async fn stop(self) {
        self.pool.close();
        for w in self.workers {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
            while !w.is_finished() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            w.abort();
        }
    }
}

impl DockerBackend {
    /// Connect to the daemon named by `DOCKER_HOST` (or the local socket), check it answers,
    /// and start filling the warm pool if one is configured.
    pub async fn connect(config: DockerConfig) -> Result<Self, BackendError> {
        let docker = connect_docker_at(config.docker_host.as_deref()).await?;
        let inner = Arc::new(Inner {
            docker,
            owner: guard::owner_id(std::process::id()).unwrap_or_else(|| "unknown".into()),
            cleanup: Arc::default(),
            config,
        });
        let c = &inner.config;
        let mut pools = HashMap::new();
        if c.pool_size > 0 && !c.pool_per_tenant {
            let h = PoolHandle::start(
                &inner,
                c.pool_limits.clone(),
                c.pool_env.clone(),
                c.pool_size,
                SHARED_POOL,
            );
            pools.insert(SHARED_POOL.to_string(), (h, Instant::now()));
        }
        Ok(DockerBackend {
            inner,
            pools: std::sync::Mutex::new(pools),
            retiring: std::sync::Mutex::default(),
            closed: std::sync::atomic::AtomicBool::new(false),
            sweeper: std::sync::Mutex::default(),
        })
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<String, (PoolHandle, Instant)>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pool figures, all pools together; `None` when the pool is off.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        if self.inner.config.pool_size == 0 {
            return None;
        }
        Some(
            self.pools()
                .values()
                .map(|(h, _)| h.pool.stats())
                .fold(PoolStats::default(), |a, b| a + b),
        )
    }

    /// Make the shared pool's containers with another environment (a configuration
    /// change): the waiting containers of the old one are removed, never handed to a run.
    pub fn reconfigure_pool(&self, limits: Limits, env: RunEnv) {
        self.replace_pool(SHARED_POOL, limits, env);
    }

    /// Start the pool `key` (a tenant, or the shared one) anew with this shape; the old
    /// one, if any, is stopped in the background.
    fn replace_pool(&self, key: &str, limits: Limits, env: RunEnv) {
        let size = self.inner.config.pool_size;
        if size == 0 || self.is_closed() {
            return;
        }
        let new = PoolHandle::start(&self.inner, limits, env, size, key);
        let old = self.pools().insert(key.to_string(), (new, Instant::now()));
        if let Some((old, _)) = old {
            self.retire(old);
        }
    }

    fn retire(&self, old: PoolHandle) {
        old.pool.close();
        let stopping = tokio::spawn(old.stop());
        self.retiring.lock().expect("retiring lock").push(stopping);
    }

    /// A waiting container for `job`, if its pool has one of its shape. With per-tenant
    /// pools, a tenant's usual run ([`JobSpec::keep_warm`]) starts its pool when it has
    /// none or one of another shape (limits or environment changed), and pools unused for
    /// [`POOL_IDLE`] are removed.
    fn take_warm(&self, job: &JobSpec) -> Option<Live> {
        if self.inner.config.pool_size == 0 || self.is_closed() {
            return None;
        }
        if !self.inner.config.pool_per_tenant {
            let pools = self.pools();
            return pools.get(SHARED_POOL)?.0.pool.take(&job.limits, &job.env);
        }
        let mut pools = self.pools();
        let idle: Vec<String> = pools
            .iter()
            .filter(|(k, (_, used))| **k != job.tenant && used.elapsed() > POOL_IDLE)
            .map(|(k, _)| k.clone())
            .collect();
        for k in idle {
            if let Some((h, _)) = pools.remove(&k) {
                tracing::debug!(tenant = %k, "idle tenant pool removed");
                self.retire(h);
            }
        }
        if let Some((h, used)) = pools.get_mut(&job.tenant) {
            *used = Instant::now();
            if h.pool.fits(&job.limits, &job.env) || !job.keep_warm {
                return h.pool.take(&job.limits, &job.env);
            }
        }
        if job.keep_warm {
            let h = PoolHandle::start(
                &self.inner,
                job.limits.clone(),
                job.env.clone(),
                self.inner.config.pool_size,
                &job.tenant,
            );
            if let Some((old, _)) = pools.insert(job.tenant.clone(), (h, Instant::now())) {
                self.retire(old);
            }
        }
        None
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for DockerBackend {
    fn drop(&mut self) {
        for (h, _) in self.pools().values() {
            // Workers stop by themselves once they see the pool closed.
            h.pool.close();
        }
    }
}

impl Inner {
    /// The interpreter a job with `env` runs.
    fn python<'a>(&'a self, env: &'a RunEnv) -> &'a str {
        env.python.as_deref().unwrap_or(&self.config.python)
    }

    /// Create, attach and start a container of the given shape for `tenant`.
    async fn launch(
        &self,
        limits: &Limits,
        env: &RunEnv,
        tenant: &str,
        id: &str,
    ) -> Result<Live, BackendError> {
        let labels = HashMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_JOB.to_string(), id.to_string()),
            (LABEL_TENANT.to_string(), tenant.to_string()),
            (LABEL_OWNER.to_string(), self.owner.clone()),
        ]);
        let body = ContainerCreateBody {
            image: Some(self.config.image.clone()),
            cmd: Some(
                [RUNNER_CMD, &[self.python(env)]]
                    .concat()
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            ),
            env: Some(
                env.vars
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .chain([format!(
                        "MCPX_WAIT_LIMIT={}",
                        protocol::WAIT_LIMIT.as_secs()
                    )])
                    .collect(),
            ),
            user: Some(env.user.clone().unwrap_or_else(|| SANDBOX_USER.to_string())),
            working_dir: Some(protocol::WORKDIR.to_string()),
            hostname: Some("sandbox".to_string()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            labels: Some(labels),
            host_config: Some(host_config(limits, env, self.config.runtime.clone())),
            ..Default::default()
        };
        let name = format!("mcpx-{id}");
        let mut guard = ContainerGuard::new(&self.docker, &name, &self.cleanup);
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            )
            .await
            .map_err(|e| {
                if let BollardError::DockerResponseServerError { .. } = e {
                    guard.disarm();
                }
                match e {
                    BollardError::DockerResponseServerError {
                        status_code: 404, ..
                    } => BackendError::ImageMissing {
                        image: self.config.image.clone(),
                    },
                    e => classify("creating the container", e),
                }
            })?;
        guard.confirm(&created.id);
        let attached = self
            .docker
            .attach_container(
                &created.id,
                Some(
                    AttachContainerOptionsBuilder::default()
                        .stdin(true)
                        .stdout(true)
                        .stderr(true)
                        .stream(true)
                        .build(),
                ),
            )
            .await
            .map_err(|e| classify("attaching to the container", e))?;
        self.docker
            .start_container(&created.id, None)
            .await
            .map_err(|e| classify("starting the container", e))?;
        Ok(Live::new(guard, attached.input, attached.output))
    }

    /// Turn how a conversation ended into the user's outcome, or into an infrastructure
    /// error when the sandbox ended without its runner reporting and Docker does not say
    /// the code ran out of memory: then something outside stopped it (`docker kill`, a
    /// daemon restart) and nothing is known of the code's own outcome.
    async fn outcome_of(
        &self,
        ended: Ended,
        guard: &ContainerGuard,
    ) -> Result<Outcome, BackendError> {
        Ok(match ended {
            Ended::Report(report, out) => out.into_outcome(&report),
            Ended::TimedOut(out) => {
                // Kill now rather than in the background: the CPU is the next run's.
                guard.kill_now().await;
                let mut o = out.into_outcome(&Report::default());
                o.timed_out = true;
                o.signal = Some(9);
                o
            }
            Ended::Vanished(out) => {
                // The runner died before it could report: the OOM killer chose it, or
                // something outside killed the container. Ask Docker which.
                let (exit_code, oom) = self.post_mortem(guard.id()).await;
                if !oom {
                    let how = match exit_code {
                        Some(c) if c > 128 => format!("killed by signal {}", c - 128),
                        Some(c) => format!("exit status {c}"),
                        None => "the container is gone".to_string(),
                    };
                    return Err(BackendError::Runner(format!(
                        "the sandbox stopped before its runner reported ({how}): it was \
                         stopped from outside (docker kill or rm, a daemon restart) or the \
                         runner crashed; the code's own outcome is unknown, run it again"
                    )));
                }
                let mut o = out.into_outcome(&Report::default());
                o.oom_killed = true;
                o.signal = Some(9);
                o
            }
        })
    }

    async fn post_mortem(&self, id: &str) -> (Option<i64>, bool) {
        let wait = async {
            loop {
                match self.docker.inspect_container(id, None).await {
                    Ok(c) => {
                        let state = c.state.unwrap_or_default();
                        if state.running != Some(true) {
                            return (state.exit_code, state.oom_killed.unwrap_or(false));
                        }
                    }
                    Err(_) => return (None, false),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(POST_MORTEM_DEADLINE, wait)
            .await
            .unwrap_or((None, false))
    }
}

/// The `docker run` flags that give a container the same hardening as [`host_config`] (and
/// the sandbox user), read off it, for baselines that compare the engine with the CLI.
pub fn docker_run_flags(limits: &Limits, runtime: Option<&str>) -> Vec<String> {
    let hc = host_config(limits, &RunEnv::default(), runtime.map(str::to_string));
    let mut f: Vec<String> = vec!["--user".into(), SANDBOX_USER.into()];
    let mut flag = |name: &str, value: String| {
        f.push(name.to_string());
        f.push(value);
    };
    if let Some(n) = hc.network_mode {
        flag("--network", n);
    }
    for c in hc.cap_drop.unwrap_or_default() {
        flag("--cap-drop", c);
    }
    for o in hc.security_opt.unwrap_or_default() {
        flag("--security-opt", o);
    }
    let mut tmpfs: Vec<_> = hc.tmpfs.unwrap_or_default().into_iter().collect();
    tmpfs.sort();
    for (path, opts) in tmpfs {
        flag("--tmpfs", format!("{path}:{opts}"));
    }
    if let Some(p) = hc.pids_limit {
        flag("--pids-limit", p.to_string());
    }
    if let Some(m) = hc.memory {
        flag("--memory", m.to_string());
    }
    if let Some(m) = hc.memory_swap {
        flag("--memory-swap", m.to_string());
    }
    if let Some(n) = hc.nano_cpus {
        flag("--cpus", (n as f64 / 1e9).to_string());
    }
    for u in hc.ulimits.unwrap_or_default() {
        let (name, soft, hard) = (
            u.name.unwrap_or_default(),
            u.soft.unwrap_or(0),
            u.hard.unwrap_or(0),
        );
        flag("--ulimit", format!("{name}={soft}:{hard}"));
    }
    if let Some(s) = hc.shm_size {
        flag("--shm-size", s.to_string());
    }
    if let Some(l) = hc.log_config.and_then(|l| l.typ) {
        flag("--log-driver", l);
    }
    if let Some(r) = hc.runtime {
        flag("--runtime", r);
    }
    if hc.readonly_rootfs == Some(true) {
        f.push("--read-only".into());
    }
    f
}

/// The hardening every sandbox gets. Each line is checked by `doctor` or the tests.
fn host_config(l: &Limits, env: &RunEnv, runtime: Option<String>) -> HostConfig {
    let tmpfs = |size: u64| format!("rw,nosuid,nodev,noexec,size={size},mode=1777");
    let binds: Vec<String> = env
        .mounts
        .iter()
        .map(|m| {
            let p = m.path.display();
            format!("{p}:{p}:{}", if m.writable { "rw" } else { "ro" })
        })
        .collect();
    HostConfig {
        network_mode: Some(if env.network { "bridge" } else { "none" }.to_string()),
        binds: (!binds.is_empty()).then_some(binds),
        readonly_rootfs: Some(true),
        tmpfs: Some(HashMap::from([
            (protocol::WORKDIR.to_string(), tmpfs(l.workspace_bytes)),
            ("/tmp".to_string(), tmpfs(l.tmp_bytes)),
        ])),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec!["no-new-privileges".to_string()]),
        pids_limit: Some(l.pids),
        memory: Some(l.memory_bytes as i64),
        memory_swap: Some(l.memory_bytes as i64),
        nano_cpus: Some((l.cpus * 1e9) as i64),
        shm_size: Some(16 << 20),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".to_string()),
            soft: Some(l.nofile as i64),
            hard: Some(l.nofile as i64),
        }]),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        init: Some(false),
        auto_remove: Some(false),
        runtime,
        ..Default::default()
    }
}

#[async_trait]
impl Backend for DockerBackend {
    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
        let started = Instant::now();
        let input = protocol::encode_job(&job, self.inner.python(&job.env))
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let warm = self.take_warm(&job);
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

        let mut ended = live.execute(&input, true, &job.limits, &events).await?;
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
                ended = live.execute(&input, true, &job.limits, &events).await?;
            }
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
        let mut live = match self.take_warm(&job) {
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
        Ok(Box::new(DockerSession {
            inner: self.inner.clone(),
            live,
            limits: job.limits,
            alive: true,
        }))
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        let docker = &self.inner.docker;
        let v = docker
            .version()
            .await
            .map_err(|e| classify("asking the daemon's version", e))?;
        let image_present = docker.inspect_image(&self.inner.config.image).await.is_ok();
        Ok(BackendInfo {
            kind: "docker",
            details: vec![(
                "runtime".to_string(),
                self.inner
                    .config
                    .runtime
                    .clone()
                    .unwrap_or_else(|| "runc".to_string()),
            )],
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
        crate::backend::BackendStats {
            live_containers: self.inner.cleanup.live(),
            pool_ready: self.pool_stats().map(|p| p.ready).unwrap_or(0),
            pool_target: self.pool_stats().map(|p| p.target).unwrap_or(0),
        }
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
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.sweeper.lock().expect("sweeper lock").take() {
            t.abort();
        }
        let handles: Vec<PoolHandle> = self.pools().drain().map(|(_, (h, _))| h).collect();
        for h in handles {
            h.stop().await;
        }
        let retiring = std::mem::take(&mut *self.retiring.lock().expect("retiring lock"));
        for r in retiring {
            let _ = r.await;
        }
        let left = self.inner.cleanup.drain_all(SHUTDOWN_DEADLINE).await;
        if left > 0 {
            tracing::warn!(
                left,
                "containers still held at shutdown; the next start-up sweep removes them"
            );
        }
    }

    async fn prewarm(&self, tenant: &str, env: &RunEnv) {
        let key = if self.inner.config.pool_per_tenant {
            tenant
        } else {
            SHARED_POOL
        };
        let current = self
            .pools()
            .get(key)
            .map(|(h, _)| (h.pool.limits.clone(), h.pool.env.clone()));
        if let Some((limits, old)) = current {
            if &old != env {
                self.replace_pool(key, limits, env.clone());
            }
        }
    }
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
    .map_err(|e| BackendError::DaemonUnreachable {
        detail: e.to_string(),
    })?;
    docker
        .ping()
        .await
        .map_err(|e| BackendError::DaemonUnreachable {
            detail: e.to_string(),
        })?;
    Ok(docker)
}

/// A session: one container, one interpreter, cell after cell.
struct DockerSession {
    inner: Arc<Inner>,
    live: Live,
    limits: Limits,
    alive: bool,
}

#[async_trait]
impl Session for DockerSession {
    async fn exec(
        &mut self,
        code: &str,
        timeout: Duration,
        events: Events,
    ) -> Result<Outcome, BackendError> {
        if !self.alive {
            return Err(BackendError::Rejected(
                "this session has ended; open a new one".into(),
            ));
        }
        let started = Instant::now();
        let limits = Limits {
            timeout,
            ..self.limits.clone()
        };
        emit(
            &events,
            RunEvent::Created {
                container: self.live.guard.id().to_string(),
            },
        );
        let cell = protocol::encode_cell(code, limits.output_bytes);
        let ended = match self.live.execute(&cell, false, &limits, &events).await {
            Ok(e) => e,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        let report_ok = matches!(&ended, Ended::Report(r, _) if !r.ended && r.signal.is_none() && r.exit_code.is_some_and(|c| c <= 1));
        let mut outcome = match self.inner.outcome_of(ended, &self.live.guard).await {
            Ok(o) => o,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        // A timeout, an OOM kill or a dead interpreter (`exit()` included, whatever its
        // status) ends the session: its state is gone.
        if !report_ok || outcome.timed_out || outcome.oom_killed {
            self.alive = false;
        }
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        Ok(outcome)
    }

    async fn put_files(
        &mut self,
        files: &[crate::job::InputFile],
        timeout: Duration,
    ) -> Result<(), BackendError> {
        if files.is_empty() {
            return Ok(());
        }
        let o = self.exec(&put_files_code(files), timeout, None).await?;
        if o.success() {
            Ok(())
        } else {
            Err(BackendError::Runner(format!(
                "workspace files could not be copied into the session: {}",
                o.stderr_text()
            )))
        }
    }

    fn alive(&self) -> bool {
        self.alive
    }
}

/// A cell that writes `files` into /workspace without touching the session's variables.
fn put_files_code(files: &[crate::job::InputFile]) -> String {
    use base64::Engine as _;
    let mut items = String::new();
    for f in files {
        let name = serde_json::to_string(&f.path).unwrap_or_default();
        let data = base64::engine::general_purpose::STANDARD.encode(&f.contents);
        items.push_str(&format!("({name}, '{data}'),"));
    }
    format!(
        "__import__('builtins').exec(\"import base64\\nfor n, d in FILES:\\n    open('/workspace/' + n, 'wb').write(base64.b64decode(d))\", {{'FILES': [{items}]}})"
    )
}

/// Sort a bollard error into "the daemon is not there" and "the daemon said no".
pub(crate) fn classify(action: &'static str, e: BollardError) -> BackendError {
    match e {
        BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::SocketNotFoundError(_)
        | BollardError::HttpClientError { .. } => BackendError::DaemonUnreachable {
            detail: e.to_string(),
        },
        e => BackendError::Docker {
            action,
            detail: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every piece of hardening `host_config` gives, with limits unlike the defaults so that
    /// each one is seen to come from the job. `doctor` and tests/engine.rs check the same
    /// from inside a running sandbox.
    #[test]
    fn hardening_is_all_there() {
        let l = Limits {
            memory_bytes: 300 << 20,
            cpus: 0.25,
            pids: 17,
            nofile: 99,
            workspace_bytes: 5 << 20,
            tmp_bytes: 3 << 20,
            ..Limits::default()
        };
        let hc = host_config(&l, &RunEnv::default(), None);
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, None);
        assert_eq!(hc.privileged, None);
        assert_eq!(hc.devices, None);
        assert_eq!(hc.binds, None, "no mounts unless the environment asks");
        assert_eq!(
            hc.security_opt,
            Some(vec!["no-new-privileges".to_string()]),
            "no-new-privileges, and nothing that turns seccomp off"
        );
        assert_eq!(hc.pids_limit, Some(17));
        assert_eq!(hc.memory, Some(300 << 20));
        assert_eq!(hc.memory_swap, hc.memory, "no swap on top of the memory");
        assert_eq!(hc.nano_cpus, Some(250_000_000));
        let ulimits = hc.ulimits.unwrap();
        assert_eq!(ulimits.len(), 1);
        assert_eq!(ulimits[0].name.as_deref(), Some("nofile"));
        assert_eq!((ulimits[0].soft, ulimits[0].hard), (Some(99), Some(99)));
        let log = hc.log_config.unwrap();
        assert_eq!(log.typ.as_deref(), Some("none"), "no log file on the host");
        // The runner is PID 1 and reaps; Docker's init would make it killable by the code.
        assert_eq!(hc.init, Some(false));
        // Removed explicitly on every path: auto_remove races `wait`.
        assert_eq!(hc.auto_remove, Some(false));
        assert_eq!(hc.runtime, None);
        assert_eq!(hc.shm_size, Some(16 << 20));

        let tmpfs = hc.tmpfs.unwrap();
        assert_eq!(tmpfs.len(), 2, "{tmpfs:?}");
        for (path, size) in [(protocol::WORKDIR, 5u64 << 20), ("/tmp", 3 << 20)] {
            let mut opts: Vec<&str> = tmpfs[path].split(',').collect();
            opts.sort();
            let size = format!("size={size}");
            let mut want = vec!["rw", "nosuid", "nodev", "noexec", &size, "mode=1777"];
            want.sort();
            assert_eq!(opts, want, "{path}");
        }

        // The user is set on the container, not in host_config: nobody, unless the
        // environment (an installer) says otherwise.
        assert_eq!(SANDBOX_USER, "65534:65534");
        assert_eq!(RunEnv::default().user, None);

        // An installer's environment: network, and its mounts read-only unless writable.
        let env = RunEnv {
            network: true,
            mounts: vec![
                crate::job::Mount {
                    path: "/opt/venv".into(),
                    writable: false,
                },
                crate::job::Mount {
                    path: "/opt/cache".into(),
                    writable: true,
                },
            ],
            ..RunEnv::default()
        };
        let hc = host_config(&l, &env, Some("crun".into()));
        assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
        assert_eq!(
            hc.binds,
            Some(vec![
                "/opt/venv:/opt/venv:ro".to_string(),
                "/opt/cache:/opt/cache:rw".to_string()
            ])
        );
        assert_eq!(hc.runtime.as_deref(), Some("crun"));
        assert_eq!(hc.readonly_rootfs, Some(true), "installers too");
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    }
}
