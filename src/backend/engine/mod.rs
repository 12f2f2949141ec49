//! The sandbox engine: what every backend does the same way, over a small [`Driver`] that
//! holds only what differs (the sandbox's spec, launch and attach, the verdict on a runner
//! that vanished, listing for the sweep, the image, a session's pause between cells).
//!
//! Here, once: the warm take and the cold launch with its retry when a waiting sandbox
//! vanished ([`Engine`]), the conversation with a runner ([`live`]), sessions
//! ([`session`]), removal on every path ([`guard`]), stats, sweeps and shutdown. The
//! Docker backend is `Engine<DockerDriver>`, the Kubernetes one `Engine<KubeDriver>`.

// The driver trait and the engine's parts are the crate's own: backends outside the crate
// are not a goal, so the engine is public over a crate-private bound.
#![allow(private_bounds, private_interfaces)]

pub(crate) mod guard;
pub mod live;
mod phases;
mod session;
mod tools;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::task::JoinHandle;

use self::guard::{Cleanup, Guard};
use self::live::Hook;
use crate::backend::collect::{Collected, Ended};
use crate::backend::pool::{PoolHandle, PoolStats, Pools};
use crate::backend::protocol::{self, Report};
use crate::backend::{
    emit, Backend, BackendError, BackendInfo, BackendStats, Events, LifecycleFigures, Session,
};
use crate::job::{JobSpec, Limits, Outcome, RunEnv, RunEvent};

/// A started sandbox of any driver.
pub(crate) type Live = live::Live<Guard>;
/// A pool of waiting sandboxes.
pub(crate) type Pool = crate::backend::pool::Pool<Live>;

/// How long [`Backend::shutdown`] waits for the sandboxes still held by runs being
/// cancelled: what the server's bounded shutdown leaves the backend.
const SHUTDOWN_DEADLINE: Duration = crate::config::defaults::DRAIN_DEADLINE;

/// What a sandbox is made for, and so how long it may live at most (on Kubernetes its
/// `activeDeadlineSeconds`, a backstop the kubelet enforces even when the server is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    /// A run made for one job: its timeout, the time to start, the runner's own grace.
    Run(Duration),
    /// A warm sandbox or a session: it waits, then serves a run or a whole session.
    Long,
}

/// The sandbox to make: its limits and environment, whose it is, its id.
pub(crate) struct Shape<'a> {
    pub(crate) limits: &'a Limits,
    pub(crate) env: &'a RunEnv,
    pub(crate) tenant: &'a str,
    pub(crate) id: &'a str,
    /// Read by the Kubernetes driver alone (a pod's deadline), built with `--features kubernetes`.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) lifetime: Lifetime,
}

/// Whose report the driver observes (see [`Driver::observe`]).
#[derive(Clone, Copy)]
pub(crate) struct Seen<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) env: &'a RunEnv,
    /// A run that took a waiting sandbox (its report says what that sandbox preloaded).
    pub(crate) pooled: bool,
}

/// A session's sandbox between cells.
pub(crate) enum Freeze {
    /// Held still: nothing the code left running computes until the next cell.
    Frozen,
    /// The driver does not hold sandboxes still (the Kubernetes driver's answer).
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    Running,
    /// It could not be held still: the session ends.
    Failed,
}

/// What a driver can do beyond the least every driver does, and what it calls its sandboxes
/// at shutdown: `Profile::held_at_shutdown("…")`, then `.preloading()`, `.with_tools()`.
pub(crate) struct Profile {
    /// Are warm sandboxes chosen by the imports of a run's code (a preloading pool)?
    preloads: bool,
    /// Do runs and sessions reach the job's tools (code mode, #26)? Without, a session's
    /// tool requests are answered that no tools are there, and a run's are not taken.
    tools: bool,
    /// What shutdown says when sandboxes are still held past its deadline.
    left_at_shutdown: &'static str,
}

impl Profile {
    /// A driver that neither preloads nor reaches tools; `left` is what shutdown says.
    pub(crate) const fn held_at_shutdown(left: &'static str) -> Self {
        Profile {
            preloads: false,
            tools: false,
            left_at_shutdown: left,
        }
    }

    /// Its pools preload, and runs take the kind their imports need.
    pub(crate) const fn preloading(mut self) -> Self {
        self.preloads = true;
        self
    }

    /// Its runs and sessions reach the job's tools.
    pub(crate) const fn with_tools(mut self) -> Self {
        self.tools = true;
        self
    }
}

/// What differs between backends. Every method is required: a driver says what it does
/// for each.
#[async_trait]
pub(crate) trait Driver: Send + Sync + Sized + 'static {
    /// What it can do (see [`Profile`]).
    const PROFILE: Profile;

    /// The interpreter line of the job header of a job with `env`.
    fn python(&self, env: &RunEnv) -> Result<String, BackendError>;
    /// Make a sandbox of `shape`, guarded from before its creation (the cold path).
    async fn launch(&self, shape: Shape<'_>) -> Result<Live, BackendError>;
    /// Run `pool` with its refill workers.
    fn start_pool(self: &Arc<Self>, pool: Pool) -> PoolHandle<Live>;
    /// The outcome of a sandbox whose runner vanished without a report (`out`: what it
    /// sent before): the OOM killer, a deadline, or an error saying it was stopped from
    /// outside.
    async fn vanished(&self, guard: &Guard, out: Collected) -> Result<Outcome, BackendError>;
    /// What the report of a run, or of a session's cell, of `tenant` in `env` says about
    /// the pools (preloading learns from it); `pooled`: a run that took a waiting sandbox.
    fn observe(&self, pools: &Pools<Live>, seen: Seen<'_>, report: &Report);
    /// Is the backend reachable, and what is it?
    async fn info(&self) -> Result<BackendInfo, BackendError>;
    /// Remove what processes that are gone left behind; how many.
    async fn sweep(&self) -> Result<usize, BackendError>;
    /// The backend's own ceiling for the benchmark, where it has one.
    async fn lifecycle_ceiling(
        self: &Arc<Self>,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>>;
    /// Hold a session's sandbox (named `id`) still between cells.
    async fn freeze(&self, id: &str) -> Freeze;
    /// Let a frozen session's sandbox go on for the next cell; an error ends the session.
    async fn thaw(&self, id: &str) -> Result<(), BackendError>;
}

/// A backend: the engine over driver `D`.
pub struct Engine<D: Driver> {
    driver: Arc<D>,
    /// Warm pools: one shared, or one per tenant (see [`crate::backend::pool::Pools`]).
    pools: Arc<Pools<Live>>,
    /// The periodic sweep of a long-lived server, stopped at shutdown.
    sweeper: std::sync::Mutex<Option<JoinHandle<()>>>,
    /// What the driver's guards hold (drain and shutdown wait on it).
    cleanup: Arc<Cleanup>,
}

impl<D: Driver> Engine<D> {
    /// The engine over `driver`, whose guards hold what `cleanup` counts (see
    /// [`Guards::count`]), with the pools `pool` describes (per tenant, or one shared pool
    /// started at once).
    pub(crate) fn new(driver: Arc<D>, cleanup: Arc<Cleanup>, pool: &super::PoolConfig) -> Self {
        let (size, per_tenant) = (pool.size, pool.per_tenant);
        let shared = (pool.limits.clone(), pool.env.clone());
        let starter = driver.clone();
        let start = move |pool: Pool| starter.start_pool(pool);
        Engine {
            pools: Arc::new(Pools::new(size, per_tenant, shared, Box::new(start))),
            driver,
            sweeper: std::sync::Mutex::default(),
            cleanup,
        }
    }

    pub(crate) fn driver(&self) -> &Arc<D> {
        &self.driver
    }

    pub(crate) fn pools(&self) -> &Pools<Live> {
        &self.pools
    }

    /// Pool figures, all pools together; `None` when the pool is off. The backends' own
    /// tests read them; everything else reads [`Backend::stats`].
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.pools.stats()
    }

    /// A waiting sandbox for `job`, if its pool has one of its shape: on a preloading
    /// driver, the kind its code's imports need (see [`crate::backend::preload::choose`]),
    /// the code being a run's entry file or a session's first cell (with what the pool's
    /// sessions commonly import later); for a session opened without one, the most
    /// preloaded. The pool's demand counts what was asked. A pool
    /// found dry while plain sandboxes are being made gives one of those once made (see
    /// [`Pool::take_late`]), rather than the job starting a cold one.
    async fn take_warm(&self, job: &JobSpec, run: bool) -> Option<Live> {
        let (tenant, limits, env) = (&job.tenant, &job.limits, &job.env);
        let mut imports = D::PROFILE.preloads.then(|| imports_of(job, run)).flatten();
        if let (false, Some(asked)) = (run, imports.as_mut()) {
            // A session also asks for what the pool's sessions commonly import later.
            if let Some(pool) = self.pools.pool_of(tenant, limits, env) {
                for m in pool.later_imports() {
                    if !asked.contains(&m) {
                        asked.push(m);
                    }
                }
            }
        }
        let warm = match &imports {
            None => self.pools.take(tenant, limits, env, job.keep_warm),
            Some(i) => self
                .pools
                .take_for(tenant, limits, env, job.keep_warm, Some(i)),
        };
        if warm.is_some() {
            return warm;
        }
        let pool = self.pools.pool_of(tenant, limits, env)?;
        pool.take_late().await
    }

    async fn cold(&self, job: &JobSpec, lifetime: Lifetime) -> Result<Live, BackendError> {
        let shape = Shape {
            limits: &job.limits,
            env: &job.env,
            tenant: &job.tenant,
            id: &job.id,
            lifetime,
        };
        self.driver.launch(shape).await
    }

    /// [`Backend::run`], with `hook` taking the frames the engine does not handle.
    pub async fn run_with_hook(
        &self,
        job: JobSpec,
        events: Events,
        hook: Hook,
    ) -> Result<Outcome, BackendError> {
        let started = Instant::now();
        let python = self.driver.python(&job.env)?;
        let input = protocol::encode_job(&job, &python)
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let lifetime = Lifetime::Run(job.limits.timeout);
        let take = crate::telemetry::span("sandbox.take");
        let warm = self.take_warm(&job, true).await;
        let pooled = warm.is_some();
        let mut live = match warm {
            Some(live) => live,
            None => self.cold(&job, lifetime).await?,
        };
        took(take, &live);
        let sandbox = live.guard.id().to_string();
        tracing::debug!(job_id = %job.id, tenant = %job.tenant, sandbox = %sandbox, pooled, ms = started.elapsed().as_millis() as u64, "sandbox started");
        emit(
            &events,
            RunEvent::Created {
                container: sandbox.clone(),
            },
        );
        let limits = &job.limits;
        let mut run = crate::telemetry::span("sandbox.run");
        let mut ended = run
            .scope(live.execute(&input, true, limits, &events, &hook))
            .await?;
        let mut received = std::time::SystemTime::now();
        if let Ended::Vanished(out) = &ended {
            if pooled && !out.started() {
                // A waiting sandbox that died while it waited (a daemon restart, a kill
                // from outside, its node gone) and slipped past the pool's liveness check:
                // its runner never said it had the job, so the code never ran. Run it once
                // more, in a fresh sandbox. (Silence is no such proof: a memory bomb dies
                // without a word, and was once run twice.)
                tracing::warn!(job_id = %job.id, sandbox = %sandbox, "the warm sandbox was gone at dispatch; running the job in a fresh one");
                live = self.cold(&job, lifetime).await?;
                run.set("mcp_executor.sandbox.relaunched", true);
                ended = run
                    .scope(live.execute(&input, true, limits, &events, &hook))
                    .await?;
                received = std::time::SystemTime::now();
            }
        }
        if let Ended::Report(report, _) = &ended {
            phases::record(&run, report, received);
            let seen = Seen {
                tenant: &job.tenant,
                env: &job.env,
                pooled,
            };
            self.driver.observe(&self.pools, seen, report);
            live.guard.exiting();
        }
        let mut outcome = outcome_of(&*self.driver, ended, &live.guard).await?;
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        traced(&mut run, &outcome);
        tracing::debug!(job_id = %job.id, status = %outcome.status_line(), "run finished");
        // `live` drops here: its guard removes the sandbox in the background.
        Ok(outcome)
    }

    /// [`Backend::open_session`]: each cell's frames the engine does not handle go to a
    /// hook of the job's tools made for that cell (see [`tools::tool_hook_of`]).
    async fn open_session_with_tools(
        &self,
        mut job: JobSpec,
    ) -> Result<Box<dyn Session>, BackendError> {
        if !D::PROFILE.tools {
            job.egress = None;
        }
        let python = self.driver.python(&job.env)?;
        let input = protocol::encode_session(&job, &python)
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let take = crate::telemetry::span("sandbox.take");
        let mut live = match self.take_warm(&job, false).await {
            Some(live) => live,
            None => self.cold(&job, Lifetime::Long).await?,
        };
        took(take, &live);
        live.wait_ready().await?;
        live.send(&input).await?;
        tracing::debug!(job_id = %job.id, tenant = %job.tenant, sandbox = %live.guard.id(), "session opened");
        let (tools, egress) = if D::PROFILE.tools {
            (job.tools.clone(), job.egress.clone())
        } else {
            (None, None)
        };
        let learn = session::Learn {
            pools: self.pools.clone(),
            tenant: job.tenant,
            env: job.env,
        };
        Ok(Box::new(session::EngineSession::new(
            self.driver.clone(),
            live,
            job.limits,
            tools,
            egress.map(|e| (e, job.id.clone())),
            learn,
        )))
    }
}

/// What the code `job` opens with imports: a run's entry file's, a session's first
/// cell's; `None` for a session opened without one (it takes the most preloaded sandbox).
/// Describe the run's span with how it ended and the runner's own figures (CPU time, peak
/// memory); never its output.
fn traced(span: &mut crate::telemetry::Span, o: &Outcome) {
    if let Some(code) = o.exit_code {
        span.set("process.exit.code", code);
    }
    span.set("mcp_executor.run.timed_out", o.timed_out);
    span.set("mcp_executor.run.oom_killed", o.oom_killed);
    if let Some(ms) = o.cpu_ms {
        span.set("mcp_executor.run.cpu_ms", ms);
    }
    if let Some(b) = o.peak_memory_bytes {
        span.set("mcp_executor.run.peak_memory_bytes", b);
    }
    span.set("mcp_executor.run.stdout_bytes", o.stdout.len());
    let failed = if o.timed_out {
        "timeout"
    } else if o.oom_killed {
        "oom"
    } else if o.signal.is_some() {
        "killed"
    } else if o.exit_code != Some(0) {
        "error"
    } else {
        return;
    };
    span.fail(failed);
}

fn imports_of(job: &JobSpec, run: bool) -> Option<Vec<String>> {
    let code = match run {
        true => job
            .files
            .iter()
            .find(|f| f.path == job.entry)
            .map(|f| f.contents.as_slice())
            .unwrap_or_default(),
        false => job.first_cell.as_deref()?.as_bytes(),
    };
    Some(crate::backend::preload::imports_in(code))
}

/// Turn how a conversation ended into the user's outcome: the runner's report, a timeout
/// (the sandbox is killed now rather than in the background: the CPU is the next run's),
/// or the driver's verdict on a runner that vanished.
pub(crate) async fn outcome_of<D: Driver>(
    driver: &D,
    ended: Ended,
    guard: &Guard,
) -> Result<Outcome, BackendError> {
    match ended {
        Ended::Report(report, out) => Ok(out.into_outcome(&report)),
        Ended::TimedOut(out) => {
            guard.kill_now().await;
            Ok(out.into_killed(true))
        }
        Ended::Vanished(out) => driver.vanished(guard, out).await,
    }
}

/// End the `sandbox.take` span: warm or cold, and for a warm sandbox its pool and how many
/// modules it had preloaded (0: a plain one; never their names).
fn took(mut take: crate::telemetry::Span, live: &Live) {
    take.set("mcp_executor.sandbox.warm", live.taken_from.is_some());
    if let Some(from) = &live.taken_from {
        take.set("mcp_executor.pool", from.pool.clone());
        take.set("mcp_executor.sandbox.preloaded", from.preloaded.len());
    }
}

#[async_trait]
impl<D: Driver> Backend for Engine<D> {
    async fn run(&self, mut job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
        // Code mode (#26): the code's tool requests go to the job's tools; egress (#41):
        // the code's connections to the proxy, over the same channel.
        // Both kept here to read what the run used (usage, #45) once it has ended.
        if !D::PROFILE.tools {
            job.egress = None;
        }
        let tool_run = D::PROFILE
            .tools
            .then(|| job.tools.as_ref().map(|t| t.0.start()))
            .flatten();
        let egress_run = job.egress.as_ref().map(|e| e.0.start(&job.id));
        let hook = match &egress_run {
            _ if !D::PROFILE.tools => None,
            Some(run) => crate::backend::relay::hook(
                run.clone(),
                tools::tool_hook_of(tool_run.clone(), true),
            ),
            None => tools::tool_hook_of(tool_run.clone(), false),
        };
        let mut result = self.run_with_hook(job, events, hook).await;
        if let Ok(outcome) = &mut result {
            outcome.external = tools::spent(tool_run, egress_run);
        }
        result
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        self.driver.info().await
    }

    async fn drain(&self) {
        self.cleanup.drain().await
    }

    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        self.open_session_with_tools(job).await
    }

    async fn prewarm(&self, tenant: &str, env: &RunEnv) {
        self.pools.prewarm(tenant, env);
    }

    fn stats(&self) -> BackendStats {
        let pool = self.pool_stats().unwrap_or_default();
        BackendStats {
            live_containers: self.cleanup.live(),
            pool_ready: pool.ready,
            pool_target: pool.target,
            pool_hits: pool.hits,
            pool_misses: pool.misses,
        }
    }

    async fn sweep(&self) -> Result<usize, BackendError> {
        self.driver.sweep().await
    }

    /// Sweep every `every` as well as at start-up (a long-lived server): sandboxes of
    /// servers that died meanwhile go too.
    fn sweep_periodically(&self, every: Duration) {
        let driver = self.driver.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = driver.sweep().await {
                    tracing::warn!(error = %e, "periodic sweep of leftover sandboxes failed");
                }
            }
        });
        if let Some(old) = self.sweeper.lock().expect("sweeper lock").replace(task) {
            old.abort();
        }
    }

    /// Stop the pools, remove their sandboxes, and wait until every sandbox this backend
    /// made is removed (runs being cancelled drop theirs a moment later), for at most
    /// [`SHUTDOWN_DEADLINE`]; what is left then goes to the next sweep.
    async fn shutdown(&self) {
        if let Some(t) = self.sweeper.lock().expect("sweeper lock").take() {
            t.abort();
        }
        self.pools.shutdown().await;
        let left = self.cleanup.drain_all(SHUTDOWN_DEADLINE).await;
        if left > 0 {
            tracing::warn!(left, "{}", D::PROFILE.left_at_shutdown);
        }
    }

    async fn lifecycle_ceiling(
        &self,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        self.driver.lifecycle_ceiling(total, concurrency).await
    }
}
