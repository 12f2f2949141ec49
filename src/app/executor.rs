//! One tenant's executor: every run, cell, install and storage write of that tenant goes
//! through here, in this order: admission (runs per minute) -> the environment's read lock
//! (an install waits for runs, runs wait for an install) -> a run slot (fair between tenants,
//! capped by the tenant's `max_concurrent_runs`) -> the backend. The run races the caller's
//! cancellation and the server's shutdown; either drops the backend's future, which kills
//! and removes the sandbox. Metrics are counted here, once, whatever the front end.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::error::AppError;
use super::metrics::{self, Metrics};
use super::sessions::Sessions;
use super::settings::Settings;
use super::workspaces::Workspaces;
use crate::backend::{Backend, Events};
use crate::env::state::Environments;
use crate::env::Environment;
use crate::job::{JobSpec, Outcome, RunEvent};
use crate::storage::{self, CodeStorage, StorageError};
use crate::tenancy::memory::{Holder, MemoryBudget, MemoryHold};
use crate::tenancy::rate::RateLimiter;
use crate::tenancy::scheduler::{Permit, Place, QueueError, Scheduler};

tokio::task_local! {
    /// Set while a long run's future runs (an MCP task): its runs take the slots long runs
    /// may hold, at most half of them (see [`crate::tenancy::scheduler`]).
    static LONG_RUN: ();
}

/// Run `f` as a long run: the runs it makes wait for one of the slots long runs may hold
/// (half of them), so that long runs never hold every slot.
pub async fn as_long_run<F: std::future::Future>(f: F) -> F::Output {
    LONG_RUN.scope((), f).await
}

/// Whether the current call is a long run ([`as_long_run`]).
fn is_long_run() -> bool {
    LONG_RUN.try_with(|_| ()).is_ok()
}

/// What the server's executors share: the backend, the run slots, the counters and the
/// shutdown signal.
#[derive(Clone)]
pub(crate) struct Shared {
    pub backend: Arc<dyn Backend>,
    pub scheduler: Arc<Scheduler>,
    pub metrics: Arc<Metrics>,
    pub shutdown: CancellationToken,
    /// The server-wide storage quota every tenant's quota sits within (`None`: none).
    pub storage_total: Option<Arc<storage::StorageQuota>>,
    /// The trace exporter (`None`: traces are off).
    pub tracer: crate::telemetry::Tracer,
}

/// One tenant's own parts.
pub struct TenantParts {
    pub settings: Settings,
    /// Its code storage directory; `None` for a front end that stores no code (`run`).
    pub storage: Option<CodeStorage>,
    /// Its Python environments; `None`: runs use the image's own Python and installs are
    /// refused.
    pub environments: Option<Arc<Environments>>,
}

/// The executor of one tenant.
pub struct Executor {
    pub(super) shared: Shared,
    pub(super) settings: Settings,
    storage: Option<CodeStorage>,
    environments: Option<Arc<Environments>>,
    /// Runs per minute of this tenant, when limited.
    rate: Option<RateLimiter>,
    pub(super) workspaces: Arc<Workspaces>,
    pub(super) sessions: Arc<Sessions>,
    /// The memory its sandboxes hold together: runs and open sessions.
    pub(super) memory: Arc<MemoryBudget>,
    /// This process's claim on the tenant's session workspaces (see
    /// [`storage::claim_session_workspaces`]), held while the executor lives.
    _claim: Option<storage::WorkspaceClaim>,
}

impl Executor {
    pub(crate) fn new(shared: Shared, parts: TenantParts) -> Arc<Executor> {
        let TenantParts {
            settings,
            storage,
            environments,
        } = parts;
        let workspaces = Workspaces::new(settings.sessions.workspace_root.clone());
        // Code storage and every workspace of the tenant count together, within the
        // server-wide quota when there is one.
        let quota = match settings.quota.storage_bytes {
            Some(limit) => {
                let ws = workspaces.root();
                let tenant = storage::sanitize_stem(Some(&settings.tenant));
                let mut roots = vec![ws.join(&tenant), ws.join(format!("{tenant}.sessions"))];
                roots.extend(storage.as_ref().map(|s| s.dir().to_path_buf()));
                Some(Arc::new(
                    storage::StorageQuota::new(limit, roots).within(shared.storage_total.clone()),
                ))
            }
            None => shared.storage_total.clone(),
        };
        if let Some(quota) = quota {
            if let Some(s) = &storage {
                s.set_quota(quota.clone());
            }
            workspaces.set_quota(quota);
        }
        if let (Some(s), Some(age)) = (&storage, settings.quota.code_max_age) {
            s.set_max_age(age);
        }
        // Session workspaces a dead process left (kill -9) are swept, as its containers are.
        let claim = if workspaces.root().as_os_str().is_empty() {
            None
        } else {
            let tenant = storage::sanitize_stem(Some(&settings.tenant));
            let dir = workspaces.root().join(format!("{tenant}.sessions"));
            let (claim, removed) = storage::claim_session_workspaces(&dir);
            if removed > 0 {
                tracing::info!(removed, dir = %dir.display(), "orphaned session workspaces removed");
            }
            claim
        };
        let sessions = Sessions::new(&settings, shared.shutdown.clone());
        Arc::new(Executor {
            rate: settings.quota.runs_per_minute.map(RateLimiter::new),
            memory: MemoryBudget::new(&settings.tenant, settings.quota.memory_budget),
            shared,
            settings,
            storage,
            environments,
            workspaces: Arc::new(workspaces),
            sessions,
            _claim: claim,
        })
    }

    /// The tenant this executor serves.
    pub fn tenant(&self) -> &str {
        &self.settings.tenant
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The backend runs go to.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// The trace exporter; `None`: traces are off.
    pub fn tracer(&self) -> &crate::telemetry::Tracer {
        &self.shared.tracer
    }

    /// Open execute_python sessions of this tenant.
    pub fn live_sessions(&self) -> usize {
        self.sessions.live_sessions()
    }

    /// After shutdown was asked for: wait until this tenant's sessions are closed, at most
    /// `deadline`; false when the deadline passed first.
    pub async fn wait_sessions_closed(&self, deadline: Duration) -> bool {
        self.sessions.wait_closed(deadline).await
    }

    /// Cancelled when the server shuts down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shared.shutdown.clone()
    }

    /// The code storage directory, if this executor stores code.
    pub fn storage_dir(&self) -> Option<&Path> {
        self.storage.as_ref().map(|s| s.dir())
    }

    fn storage(&self) -> Result<&CodeStorage, AppError> {
        self.storage
            .as_ref()
            .ok_or_else(|| AppError::Failed("this executor has no code storage directory".into()))
    }

    /// The timeout a call gets: its own (validated, capped) or the default, plus a note
    /// when it was capped.
    pub fn timeout(&self, asked: Option<f64>) -> Result<(Duration, Option<String>), AppError> {
        let s = &self.settings;
        let Some(secs) = asked else {
            return Ok((s.limits.timeout, None));
        };
        if !secs.is_finite() || secs <= 0.0 {
            return Err(AppError::Invalid(format!(
                "invalid argument `timeout`: must be a positive number of seconds, got {secs}"
            )));
        }
        let asked = Duration::from_secs_f64(secs.min(1e9));
        if asked > s.max_timeout {
            let note = format!(
                "timeout {secs} s capped at the server maximum of {} s",
                s.max_timeout.as_secs_f64()
            );
            return Ok((s.max_timeout, Some(note)));
        }
        Ok((asked, None))
    }

    /// Take one run from the tenant's runs-per-minute quota, or say when to retry. Checked
    /// before anything is started.
    pub fn admit(&self) -> Result<(), AppError> {
        let mut span = crate::telemetry::span("executor.admit");
        let Some(rate) = &self.rate else {
            return Ok(());
        };
        rate.try_take().map_err(|wait| {
            span.fail("quota");
            self.shared.metrics.rejected(self.tenant(), "rate");
            AppError::Refused(format!(
                "quota exceeded: tenant `{}` may start {} runs per minute (runs_per_minute). Retry in {} s",
                self.tenant(),
                rate.per_minute(),
                wait.as_secs_f64().ceil().max(1.0)
            ))
        })
    }

    /// Take `bytes` of the tenant's memory budget for a sandbox of `holder` (wait while its
    /// runs hold the rest; refused at once when its open sessions leave too little). Taken
    /// before a run slot, never while holding one.
    pub(super) async fn hold_memory(
        &self,
        holder: Holder,
        bytes: u64,
    ) -> Result<MemoryHold, AppError> {
        self.memory.hold(holder, bytes).await.map_err(|e| {
            self.shared.metrics.rejected(self.tenant(), "memory");
            AppError::Refused(e.to_string())
        })
    }

    /// What the tenant's sandboxes hold of its memory budget now.
    pub fn memory_held(&self) -> crate::tenancy::memory::Held {
        self.memory.held()
    }

    /// Wait for one of the run slots, fairly shared between tenants and capped by the
    /// tenant's `max_concurrent_runs`: one-shot runs and execute_python cells alike.
    pub(super) async fn acquire_slot(&self) -> Result<Permit, AppError> {
        let _queue = crate::telemetry::span("executor.queue");
        let waited = Instant::now();
        let place = self.reserve_place()?;
        let permit = place.acquire().await.map_err(|e| self.queue_error(e))?;
        self.shared
            .metrics
            .queue_wait(self.tenant(), waited.elapsed().as_secs_f64());
        Ok(permit)
    }

    /// A place in the tenant's queue (`--max-queue`), taken before a call holds anything:
    /// its memory, its environment, its files.
    pub(super) fn reserve_place(&self) -> Result<Place, AppError> {
        self.shared
            .scheduler
            .reserve(self.tenant(), self.slot_cap())
            .map(|p| p.long(is_long_run()))
            .map_err(|e| self.queue_error(e))
    }

    /// The most run slots this tenant may hold at once.
    fn slot_cap(&self) -> usize {
        self.settings
            .quota
            .max_concurrent_runs
            .unwrap_or(usize::MAX)
    }

    fn queue_error(&self, e: QueueError) -> AppError {
        match e {
            QueueError::Closed => AppError::ShuttingDown,
            full @ QueueError::Full { .. } => {
                self.shared.metrics.rejected(self.tenant(), "queue_full");
                AppError::Refused(full.to_string())
            }
        }
    }

    /// Run a job in `env` (`None`: the image's Python) until it ends, `cancel` fires or the
    /// server shuts down; the last two drop the run, which kills and removes its sandbox.
    /// Admission first: a refused run costs nothing.
    pub async fn run(
        &self,
        job: JobSpec,
        env: Option<Environment>,
        events: Events,
        cancel: &CancellationToken,
    ) -> Result<Outcome, AppError> {
        self.run_with_workspace(job, env, None, events, cancel)
            .await
    }

    /// [`Executor::run`], with the files of the session workspace `workspace` (its key)
    /// added to the job once it has its run slot: a call that waits holds no copy of them.
    pub async fn run_with_workspace(
        &self,
        job: JobSpec,
        env: Option<Environment>,
        workspace: Option<&str>,
        events: Events,
        cancel: &CancellationToken,
    ) -> Result<Outcome, AppError> {
        let job_id = job.id.clone();
        self.admit()?;
        crate::backend::emit(&events, RunEvent::Admitted);
        let started = Instant::now();
        let result = tokio::select! {
            r = self.run_in_slot(job, env, workspace, events) => r,
            _ = cancel.cancelled() => {
                tracing::info!(job_id = %job_id, "run cancelled by the client");
                Err(AppError::Cancelled)
            }
            _ = self.shared.shutdown.cancelled() => {
                tracing::info!(job_id = %job_id, "run stopped: the server is shutting down");
                Err(AppError::ShuttingDown)
            }
        };
        let label = match &result {
            Ok(o) => Some(metrics::outcome_label(o)),
            Err(e) => e.run_label(),
        };
        if let Some(label) = label {
            let secs = started.elapsed().as_secs_f64();
            self.shared.metrics.run(self.tenant(), label, secs);
        }
        result
    }

    /// Take a place in the tenant's queue, hold `env`, then the run's memory, then wait for
    /// one of the run slots (fairly shared between tenants), then read the workspace's
    /// files and run.
    async fn run_in_slot(
        &self,
        mut job: JobSpec,
        env: Option<Environment>,
        workspace: Option<&str>,
        events: Events,
    ) -> Result<Outcome, AppError> {
        // A place in the queue before anything is held: a call past `--max-queue` is
        // refused at once, whatever it would wait for.
        let queue = crate::telemetry::span("executor.queue");
        let waited = Instant::now();
        let place = self.reserve_place()?;
        // The environment first: a run waiting for an install holds no run slot meanwhile.
        let _env_lock = match &env {
            Some(env) => self.lock_env(env).await,
            None => None,
        };
        // Its share of the tenant's memory, then a slot: a slot's holder never waits.
        let _memory = self
            .hold_memory(Holder::Run, job.limits.memory_bytes)
            .await?;
        let _slot = place.acquire().await.map_err(|e| self.queue_error(e))?;
        self.shared
            .metrics
            .queue_wait(self.tenant(), waited.elapsed().as_secs_f64());
        queue.end();
        if let Some(key) = workspace {
            self.add_workspace_files(key, &mut job).await;
        }
        if let Some(env) = &env {
            job.env = env.run_env();
        }
        self.shared.backend.run(job, events).await.map_err(|e| {
            tracing::warn!(error = %e, "sandbox failure");
            AppError::Backend(e)
        })
    }

    /// Put the files of workspace `key` into a one-shot job (a file named like the job's
    /// entry is left out: the code wins); the files the run writes come back.
    async fn add_workspace_files(&self, key: &str, job: &mut JobSpec) {
        match self.workspaces.input_files(key).await {
            Ok(files) => {
                let entry = job.entry.clone();
                job.files
                    .extend(files.into_iter().filter(|f| f.path != entry));
            }
            Err(e) => tracing::warn!(error = ?e.to_string(), "workspace files not sent"),
        }
        job.return_files = true;
    }

    /// The environments of this tenant, when the server has them.
    pub fn environments(&self) -> Option<&Arc<Environments>> {
        self.environments.as_ref()
    }

    /// The environment runs and new sessions use now; `None` on a server without
    /// environment management (the image's own Python).
    pub async fn current_env(&self) -> Option<Environment> {
        match &self.environments {
            Some(envs) => Some(envs.state.current().await),
            None => None,
        }
    }

    /// Hold `env` for a run or a cell: an install waits for it, and it waits for an
    /// install, so code never sees an environment halfway through an install.
    pub(super) async fn lock_env(
        &self,
        env: &Environment,
    ) -> Option<tokio::sync::OwnedRwLockReadGuard<()>> {
        match &self.environments {
            Some(envs) => Some(envs.manager.read_lock(env).await),
            None => None,
        }
    }

    /// A storage error in words; a refusal by the storage quota is counted.
    pub(super) fn storage_error(&self, e: StorageError) -> AppError {
        self.count_quota(&e);
        AppError::Failed(e.to_string())
    }

    /// Count a refusal by the storage quota.
    pub(super) fn count_quota(&self, e: &StorageError) {
        if matches!(e, StorageError::Quota { .. }) {
            self.shared.metrics.rejected(self.tenant(), "storage");
        }
    }

    /// Store new code (initialize_code_file, execute_code) in the part of the storage of
    /// `owner` (the caller's [`crate::tenancy::oauth::Principal::owner`]; `None`: the
    /// tenant's static token, or a server without sign-in): its path.
    pub async fn create_code(
        &self,
        owner: Option<&str>,
        filename: Option<&str>,
        code: &str,
    ) -> Result<PathBuf, AppError> {
        self.storage()?
            .scope(owner)
            .create(filename, code)
            .await
            .map_err(|e| self.storage_error(e))
    }

    /// Store new code on its own (initialize_code_file): a storage write, which counts
    /// against the tenant's runs per minute like a run does (a run that stores its code,
    /// execute_code, counts once, as a run).
    pub async fn create_code_file(
        &self,
        owner: Option<&str>,
        filename: Option<&str>,
        code: &str,
    ) -> Result<PathBuf, AppError> {
        self.admit()?;
        self.create_code(owner, filename, code).await
    }

    /// Append to `owner`'s stored code: its path and new size. A storage write: it counts
    /// against the tenant's runs per minute.
    pub async fn append_code(
        &self,
        owner: Option<&str>,
        file_path: &str,
        content: &str,
    ) -> Result<(PathBuf, u64), AppError> {
        self.admit()?;
        self.storage()?
            .scope(owner)
            .append(file_path, content)
            .await
            .map_err(|e| self.storage_error(e))
    }

    /// Read `owner`'s stored code: its path and text (another principal's file is not
    /// found).
    pub async fn read_code(
        &self,
        owner: Option<&str>,
        file_path: &str,
    ) -> Result<(PathBuf, String), AppError> {
        self.storage()?
            .scope(owner)
            .read(file_path)
            .await
            .map_err(|e| self.storage_error(e))
    }
}

/// A short digest of the code for logs, which never carry the code itself.
pub fn code_digest(code: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(code)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The backend as the environment manager sees it for one tenant: each of its runs (the
/// probe of `configure_environment`, the phases of an install) takes its share of the
/// tenant's memory budget and waits for one of the tenant's run slots first, like every
/// other run, so a burst of such calls starts no
/// more sandboxes at once than the tenant's `max_concurrent_runs` (and the server's
/// capacity) allow.
struct InSlots {
    inner: Arc<dyn Backend>,
    memory: Arc<MemoryBudget>,
    scheduler: Arc<crate::tenancy::scheduler::Scheduler>,
    tenant: String,
    cap: usize,
}

/// Only runs change: the rest (sessions, prewarm, stats, ...) forwards to the backend.
#[async_trait::async_trait]
impl crate::backend::Wrap for InSlots {
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }

    async fn run(
        &self,
        job: crate::job::JobSpec,
        events: crate::backend::Events,
    ) -> Result<Outcome, crate::backend::BackendError> {
        let rejected =
            |e: &dyn std::fmt::Display| crate::backend::BackendError::Rejected(e.to_string());
        let place = self
            .scheduler
            .reserve(&self.tenant, self.cap)
            .map_err(|e| rejected(&e))?
            .long(is_long_run());
        let _memory = self
            .memory
            .hold(Holder::Run, job.limits.memory_bytes)
            .await
            .map_err(|e| rejected(&e))?;
        let _slot = place.acquire().await.map_err(|e| rejected(&e))?;
        self.inner.run(job, events).await
    }
}

impl Executor {
    /// The backend for environment work (probes, installs): every run in a run slot.
    pub fn backend_in_slots(&self) -> Arc<dyn Backend> {
        Arc::new(InSlots {
            inner: self.shared.backend.clone(),
            memory: self.memory.clone(),
            scheduler: self.shared.scheduler.clone(),
            tenant: self.tenant().to_string(),
            cap: self
                .settings
                .quota
                .max_concurrent_runs
                .unwrap_or(usize::MAX),
        })
    }
}
