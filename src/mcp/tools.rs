//! The tool surface: one rmcp handler whose nine tools translate a request into a
//! [`JobSpec`] or a storage call and format the result. Nothing here runs code itself.

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use super::args::{self, Args};
use super::progress::Progress;
use super::report::{
    tool_error, with_structured, EnvironmentReport, FileReport, LimitsReport, PackageStatus,
    PackagesReport, RunReport,
};
use super::{environment, Settings, INSTRUCTIONS};
use crate::app::metrics::{self, Metrics};
use crate::backend::{Backend, Events};
use crate::env::state::Environments;
use crate::job::{JobSpec, Outcome};
use crate::storage::{self, CodeStorage};
use crate::tenancy::rate::RateLimiter;
use crate::tenancy::scheduler::{Permit, QueueError, Scheduler};

const EXECUTE_CODE: &str = "Run a complete Python script in a fresh, isolated sandbox and return its stdout, stderr and exit status. \
Each call starts from scratch: no variables, files or installs survive between calls. There is no network access. \
Limits per run: the timeout (default given by get_environment_config, override with `timeout` in seconds up to the server maximum), memory, CPU and 1 MiB of code per call. \
The code is also stored under `filename` (plus a unique suffix) and the result names its file_path, which execute_code_file can run again. \
For scripts too long to send in one call, use initialize_code_file, append_to_code_file and execute_code_file instead.";

const INITIALIZE_CODE_FILE: &str = "Create a new Python file with the first part of a long script, and return its file_path. \
Use this, then append_to_code_file (as many times as needed), then execute_code_file, when the code is too long to send in one execute_code call. \
Pass the returned file_path unchanged to the next calls.";

const APPEND_TO_CODE_FILE: &str = "Append `content` to a file created by initialize_code_file (or stored by execute_code). \
The content is added exactly as given: include the newlines and indentation you need. At most 1 MiB per call; a file may grow to 8 MiB.";

const EXECUTE_CODE_FILE: &str = "Run a stored Python file (built with initialize_code_file/append_to_code_file, or stored by execute_code) in a fresh, isolated sandbox. \
Same limits and results as execute_code. Use read_code_file first if you are unsure the file is complete.";

const READ_CODE_FILE: &str = "Return the current content of a stored Python file, to check it before appending more or running it.";

const INSTALL_DEPENDENCIES: &str = "Install Python packages (from PyPI, with pip) into the current execution environment, for the runs that follow. \
Give plain requirement specifiers such as `six`, `pandas>=2` or `requests[socks]==2.31.0`; URLs, paths and pip options are refused. \
The install runs in separate installer containers (wheels are downloaded with network access, then installed without; runs themselves have none) and may take a minute; \
only packages that publish wheels (binary packages) for the environment's Python install, source builds are not run. The result lists the installed versions, dependencies included. \
Check first with check_installed_packages: numpy, pandas and matplotlib are already there in the default environment.";

const CHECK_INSTALLED_PACKAGES: &str = "Check which of the given packages are installed in the execution environment, with their versions. \
Answered by running a small script in the sandbox, so it reflects exactly what your code can import.";

const CONFIGURE_ENVIRONMENT: &str = "Switch the Python environment the following runs use: type `venv` with venv_path, `venv-uv` with uv_venv_path, `conda` with conda_name (a name or a prefix path), or `default` for the server's managed environment. \
Paths are on the server. The environment is checked first (its Python is started in a sandbox); if it is not usable the previous one stays and the error says why. \
Environments are mounted read-only into runs; use install_dependencies to add packages.";

const GET_ENVIRONMENT_CONFIG: &str = "Describe the execution environment: its type, Python interpreter, sandbox image, where code is stored, and the limits of each run.";

/// Why a run gave no outcome. Shown to the model as a tool error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("the request was cancelled; the run was stopped")]
    Cancelled,
    #[error("the server is shutting down; the run was stopped")]
    ShuttingDown,
    /// A quota said no before any container existed; the text says which and when to retry.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// Everything the tools share; cloned cheaply per session.
struct Shared {
    sandbox: Arc<dyn Backend>,
    storage: Arc<CodeStorage>,
    settings: Settings,
    /// Run slots, shared fairly with the server's other tenants.
    scheduler: Arc<Scheduler>,
    /// Runs per minute of this tenant, when limited.
    rate: Option<RateLimiter>,
    /// The server's counters.
    pub(super) metrics: Arc<Metrics>,
    /// Cancelled when the server shuts down: every run in flight is stopped.
    shutdown: CancellationToken,
    /// Python environments, when the server has them (runs use the current one).
    environments: Option<Arc<Environments>>,
}

/// The MCP handler: one per session, all sharing one sandbox and storage.
#[derive(Clone)]
pub struct CodeExecutor {
    shared: Arc<Shared>,
    tool_router: ToolRouter<CodeExecutor>,
    /// This connection's stateful session and the workspaces (issue 7).
    pub(super) conn: super::sessions::Connection,
}

impl CodeExecutor {
    pub fn new(sandbox: Arc<dyn Backend>, storage: Arc<CodeStorage>, settings: Settings) -> Self {
        let scheduler = Scheduler::new(settings.max_concurrent_runs, super::defaults::MAX_QUEUE);
        let extras = super::sessions::Extras::new(sandbox.clone(), &settings);
        if let Some(limit) = settings.quota.storage_bytes {
            // Code storage and every workspace of the tenant count together.
            let ws = extras.workspaces.root();
            let tenant = storage::sanitize_stem(Some(&settings.tenant));
            let quota = Arc::new(storage::StorageQuota::new(
                limit,
                vec![
                    storage.dir().to_path_buf(),
                    ws.join(&tenant),
                    ws.join(format!("{tenant}.sessions")),
                ],
            ));
            storage.set_quota(quota.clone());
            extras.workspaces.set_quota(quota);
        }
        CodeExecutor {
            shared: Arc::new(Shared {
                sandbox,
                storage,
                rate: settings.quota.runs_per_minute.map(RateLimiter::new),
                settings,
                scheduler,
                metrics: Arc::default(),
                shutdown: CancellationToken::new(),
                environments: None,
            }),
            tool_router: Self::tool_router() + Self::session_router() + Self::workspace_router(),
            conn: super::sessions::Connection::new(extras),
        }
    }

    /// Stop every run in flight when `token` is cancelled (server shutdown). Call before the
    /// executor is cloned into sessions.
    pub fn with_shutdown(mut self, token: CancellationToken) -> Self {
        self.conn.extras.set_shutdown(token.clone());
        Arc::get_mut(&mut self.shared)
            .expect("with_shutdown is called before the executor is shared")
            .shutdown = token;
        self
    }

    /// Share run slots (and their fair queue) with other tenants' executors. Call before the
    /// executor is cloned into sessions.
    pub fn with_scheduler(mut self, scheduler: Arc<Scheduler>) -> Self {
        Arc::get_mut(&mut self.shared)
            .expect("with_scheduler is called before the executor is shared")
            .scheduler = scheduler;
        self
    }

    /// Count into the server's metrics. Call before the executor is cloned into sessions.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        Arc::get_mut(&mut self.shared)
            .expect("with_metrics is called before the executor is shared")
            .metrics = metrics;
        self
    }

    /// The backend runs go to.
    pub fn sandbox(&self) -> &Arc<dyn Backend> {
        &self.shared.sandbox
    }

    /// The tenant this executor serves.
    pub fn tenant(&self) -> &str {
        &self.shared.settings.tenant
    }

    /// The server's counters, and the run queue.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub fn scheduler(&self) -> &Arc<Scheduler> {
        &self.shared.scheduler
    }

    /// Open execute_python sessions of this tenant.
    pub fn live_sessions(&self) -> usize {
        self.conn.extras.live_sessions()
    }

    /// This tenant's execute_python sessions, shared by every connection: at shutdown,
    /// [`Extras::wait_closed`](super::sessions::Extras::wait_closed) before draining the
    /// sandbox.
    pub fn sessions(&self) -> Arc<super::sessions::Extras> {
        self.conn.extras.clone()
    }

    /// A storage error as a tool error; a refusal by the storage quota is counted.
    pub(super) fn storage_error(&self, e: storage::StorageError) -> CallToolResult {
        self.count_quota(&e);
        tool_error(e.to_string())
    }

    /// Count a refusal by the storage quota.
    pub(super) fn count_quota(&self, e: &storage::StorageError) {
        if matches!(e, storage::StorageError::Quota { .. }) {
            self.shared.metrics.rejected(self.tenant(), "storage");
        }
    }

    /// Take one run from the tenant's runs-per-minute quota, or say when to retry. Checked
    /// before anything is started.
    pub(super) fn admit(&self) -> Result<(), RunError> {
        let Some(rate) = &self.shared.rate else {
            return Ok(());
        };
        rate.try_take().map_err(|wait| {
            self.shared.metrics.rejected(self.tenant(), "rate");
            RunError::Refused(format!(
                "quota exceeded: tenant `{}` may start {} runs per minute (runs_per_minute). Retry in {} s",
                self.tenant(),
                rate.per_minute(),
                wait.as_secs_f64().ceil().max(1.0)
            ))
        })
    }

    /// Run in (and install into) the environments of `envs`. Call before the executor is
    /// cloned into sessions.
    pub fn with_environments(mut self, envs: Arc<Environments>) -> Self {
        Arc::get_mut(&mut self.shared)
            .expect("with_environments is called before the executor is shared")
            .environments = Some(envs);
        self
    }

    /// The timeout a call gets: its own (validated, capped) or the default, plus a note
    /// when it was capped.
    pub(super) fn timeout(
        &self,
        asked: Option<f64>,
    ) -> Result<(Duration, Option<String>), ErrorData> {
        let s = &self.shared.settings;
        let Some(secs) = asked else {
            return Ok((s.limits.timeout, None));
        };
        if !secs.is_finite() || secs <= 0.0 {
            return Err(ErrorData::invalid_params(
                format!(
                    "invalid argument `timeout`: must be a positive number of seconds, got {secs}"
                ),
                None,
            ));
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

    /// Run `code` stored at `path` and format the outcome.
    async fn run_stored(
        &self,
        code: String,
        path: &std::path::Path,
        (timeout, note): (Duration, Option<String>),
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let mut limits = self.shared.settings.limits.clone();
        limits.timeout = timeout;
        let mut job = JobSpec::python(code, limits);
        job.tenant = self.shared.settings.tenant.clone();
        job.keep_warm = true;
        if let Some(name) = entry_name(path) {
            job.files[0].path = name.clone();
            job.entry = name;
        }
        self.add_workspace_files(&mut job).await;
        tracing::info!(
            job_id = %job.id,
            tenant = %job.tenant,
            code_sha256 = %code_digest(&job.files[0].contents),
            file = %path.display(),
            "run requested"
        );
        let result = self.run_job(job, self.current_env().await, &ctx).await;
        let file_path = path.display().to_string();
        Ok(match result {
            Ok(outcome) => {
                let note = self.save_workspace_files(&outcome, note).await;
                RunReport::new(&outcome, timeout.as_secs_f64(), file_path).into_result(note)
            }
            Err(e) => tool_error(format!(
                "the code could not be run: {e}\nfile_path: {file_path}"
            )),
        })
    }

    /// Run a job in `env` (`None`: the image's Python) with progress notifications, until
    /// it ends, the client cancels the request or the server shuts down. The last two drop
    /// the run, which kills and removes its container.
    async fn run_job(
        &self,
        job: JobSpec,
        env: Option<crate::env::Environment>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Outcome, RunError> {
        let job_id = job.id.clone();
        self.admit()?;
        let started = std::time::Instant::now();
        let (progress, events) = Progress::start(ctx);
        let result = tokio::select! {
            r = self.run_in_slot(job, env, events) => r,
            _ = ctx.ct.cancelled() => {
                tracing::info!(job_id = %job_id, "run cancelled by the client");
                Err(RunError::Cancelled)
            }
            _ = self.shared.shutdown.cancelled() => {
                tracing::info!(job_id = %job_id, "run stopped: the server is shutting down");
                Err(RunError::ShuttingDown)
            }
        };
        if let Some(p) = progress {
            p.finish().await;
        }
        let label = match &result {
            Ok(o) => Some(metrics::outcome_label(o)),
            Err(RunError::Cancelled | RunError::ShuttingDown) => Some("cancelled"),
            Err(RunError::Backend(_)) => Some("failed"),
            Err(RunError::Refused(_)) => None,
        };
        if let Some(label) = label {
            let secs = started.elapsed().as_secs_f64();
            self.shared.metrics.run(self.tenant(), label, secs);
        }
        result
    }

    /// Wait for one of the run slots, fairly shared between tenants and capped by the
    /// tenant's `max_concurrent_runs`: one-shot runs and execute_python cells alike.
    pub(super) async fn acquire_slot(&self) -> Result<Permit, RunError> {
        let s = &self.shared;
        let cap = s.settings.quota.max_concurrent_runs.unwrap_or(usize::MAX);
        s.scheduler
            .acquire(&s.settings.tenant, cap)
            .await
            .map_err(|e| match e {
                QueueError::Closed => RunError::ShuttingDown,
                full @ QueueError::Full { .. } => {
                    s.metrics.rejected(&s.settings.tenant, "queue_full");
                    RunError::Refused(full.to_string())
                }
            })
    }

    /// Hold `env`, then wait for one of the run slots (fairly shared between tenants),
    /// then run in it.
    async fn run_in_slot(
        &self,
        mut job: JobSpec,
        env: Option<crate::env::Environment>,
        events: Events,
    ) -> Result<Outcome, RunError> {
        // The environment first: a run waiting for an install holds no run slot meanwhile.
        let _env_lock = match &env {
            Some(env) => self.lock_env(env).await,
            None => None,
        };
        let _slot = self.acquire_slot().await?;
        if let Some(env) = &env {
            job.env = env.run_env();
        }
        self.shared.sandbox.run(job, events).await.map_err(|e| {
            tracing::warn!(error = %e, "sandbox failure");
            RunError::Backend(e)
        })
    }

    /// The environment runs and new sessions use now; `None` on a server without
    /// environment management (the image's own Python).
    pub(super) async fn current_env(&self) -> Option<crate::env::Environment> {
        match &self.shared.environments {
            Some(envs) => Some(envs.state.current().await),
            None => None,
        }
    }

    /// Hold `env` for a run or a cell: an install waits for it, and it waits for an
    /// install, so code never sees an environment halfway through an install.
    pub(super) async fn lock_env(
        &self,
        env: &crate::env::Environment,
    ) -> Option<tokio::sync::OwnedRwLockReadGuard<()>> {
        match &self.shared.environments {
            Some(envs) => Some(envs.manager.read_lock(env).await),
            None => None,
        }
    }

    fn file_report(
        &self,
        path: &std::path::Path,
        size: u64,
        content: Option<String>,
    ) -> FileReport {
        FileReport {
            file_path: path.display().to_string(),
            size_bytes: size,
            content,
        }
    }
}

/// A short digest of the code for logs, which never carry the code itself.
pub(super) fn code_digest(code: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(code)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The stored file's name, when it is safe to use as the entry inside the workspace (so
/// tracebacks name the user's file); `None` falls back to `main.py`.
fn entry_name(path: &std::path::Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let ok = !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then(|| name.to_string())
}

/// Distribution names we pass to the probe script: PyPI's allowed characters only, so the
/// JSON list is also a safe Python literal.
fn check_package_names(packages: &[String]) -> Result<(), ErrorData> {
    if packages.is_empty() || packages.len() > 200 {
        return Err(ErrorData::invalid_params(
            "invalid argument `packages`: give between 1 and 200 package names",
            None,
        ));
    }
    for (i, p) in packages.iter().enumerate() {
        let ok = !p.is_empty()
            && p.len() <= 100
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        if !ok {
            return Err(ErrorData::invalid_params(
                format!("invalid argument `packages[{i}]`: `{p}` is not a package name (letters, digits, `.`, `_`, `-`; no version specifiers)"),
                None,
            ));
        }
    }
    Ok(())
}

const PACKAGE_PROBE: &str = r#"
import json, re, importlib.metadata as md
out = []
for name in NAMES:
    version = None
    for candidate in (name, re.sub(r"[-_.]+", "-", name).lower(), re.sub(r"[-_.]+", "_", name).lower()):
        try:
            version = md.version(candidate)
            break
        except md.PackageNotFoundError:
            pass
    out.append({"name": name, "installed": version is not None, "version": version})
print(json.dumps(out))
"#;

#[tool_router]
impl CodeExecutor {
    #[tool(
        description = EXECUTE_CODE,
        input_schema = args::schema::<args::ExecuteCode>(),
        output_schema = schema_for_output::<RunReport>()
    )]
    async fn execute_code(
        &self,
        Args(a): Args<args::ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let timeout = self.timeout(a.timeout)?;
        let path = match self
            .shared
            .storage
            .create(a.filename.as_deref(), &a.code)
            .await
        {
            Ok(p) => p,
            Err(e) => return Ok(self.storage_error(e)),
        };
        self.run_stored(a.code, &path, timeout, ctx).await
    }

    #[tool(
        description = INITIALIZE_CODE_FILE,
        input_schema = args::schema::<args::InitializeCodeFile>(),
        output_schema = schema_for_output::<FileReport>()
    )]
    async fn initialize_code_file(
        &self,
        Args(a): Args<args::InitializeCodeFile>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self
                .shared
                .storage
                .create(a.filename.as_deref(), &a.content)
                .await
            {
                Ok(path) => {
                    let r = self.file_report(&path, a.content.len() as u64, None);
                    let text = format!(
                    "created {} ({} bytes). Pass this file_path to append_to_code_file and execute_code_file.",
                    r.file_path, r.size_bytes
                );
                    with_structured(text, &r, false)
                }
                Err(e) => self.storage_error(e),
            },
        )
    }

    #[tool(
        description = APPEND_TO_CODE_FILE,
        input_schema = args::schema::<args::AppendToCodeFile>(),
        output_schema = schema_for_output::<FileReport>()
    )]
    async fn append_to_code_file(
        &self,
        Args(a): Args<args::AppendToCodeFile>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(
            match self.shared.storage.append(&a.file_path, &a.content).await {
                Ok((path, size)) => {
                    let r = self.file_report(&path, size, None);
                    let text = format!(
                        "appended {} bytes to {} (now {} bytes)",
                        a.content.len(),
                        r.file_path,
                        size
                    );
                    with_structured(text, &r, false)
                }
                Err(e) => self.storage_error(e),
            },
        )
    }

    #[tool(
        description = EXECUTE_CODE_FILE,
        input_schema = args::schema::<args::ExecuteCodeFile>(),
        output_schema = schema_for_output::<RunReport>()
    )]
    async fn execute_code_file(
        &self,
        Args(a): Args<args::ExecuteCodeFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let timeout = self.timeout(a.timeout)?;
        let (path, code) = match self.shared.storage.read(&a.file_path).await {
            Ok(v) => v,
            Err(e) => return Ok(self.storage_error(e)),
        };
        self.run_stored(code, &path, timeout, ctx).await
    }

    #[tool(
        description = READ_CODE_FILE,
        input_schema = args::schema::<args::ReadCodeFile>(),
        output_schema = schema_for_output::<FileReport>()
    )]
    async fn read_code_file(
        &self,
        Args(a): Args<args::ReadCodeFile>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(match self.shared.storage.read(&a.file_path).await {
            Ok((path, text)) => {
                let r = self.file_report(&path, text.len() as u64, Some(text.clone()));
                with_structured(text, &r, false)
            }
            Err(e) => self.storage_error(e),
        })
    }

    #[tool(
        description = INSTALL_DEPENDENCIES,
        input_schema = args::schema::<args::Packages>()
    )]
    async fn install_dependencies(
        &self,
        Args(a): Args<args::Packages>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Some(envs) = &self.shared.environments {
            let s = &self.shared;
            let tenant = s.settings.tenant.clone();
            let refused = |why: String| {
                s.metrics.install(&tenant, "refused");
                Ok(tool_error(format!(
                    "nothing was installed ({}): {why}",
                    a.packages.join(", ")
                )))
            };
            if !s.settings.quota.install_network {
                return refused(format!(
                    "tenant `{tenant}` may not install packages (install_network = false in the tenants file; installs need the network). \
                     Use what the environment has: check_installed_packages lists it"
                ));
            }
            // An install starts containers: it counts as a run of the tenant's quota
            // (a malformed request is refused before it costs one).
            environment::check_specs(&a.packages)?;
            if let Err(e) = self.admit() {
                return refused(e.to_string());
            }
            // The environment is read, checked and installed into in one step: a switch
            // (configure_environment) meanwhile cannot redirect the install.
            let (result, outcome) =
                environment::install(envs, s.sandbox.clone(), a.packages.clone(), &ctx).await?;
            s.metrics.install(&tenant, outcome);
            return Ok(result);
        }
        check_package_names(&a.packages)?;
        Ok(tool_error(format!(
            "install_dependencies is not available on this server instance (it runs without environments): the sandbox runs the image's default Python, mounted read-only, \
             and installing into environments is a later feature of this server. Nothing was installed ({}). \
             What works today: check_installed_packages tells you which packages the default environment already has \
             (numpy and the standard library among them); write code that uses those.",
            a.packages.join(", ")
        )))
    }

    #[tool(
        description = CHECK_INSTALLED_PACKAGES,
        input_schema = args::schema::<args::Packages>(),
        output_schema = schema_for_output::<PackagesReport>()
    )]
    async fn check_installed_packages(
        &self,
        Args(a): Args<args::Packages>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        check_package_names(&a.packages)?;
        let names = serde_json::to_string(&a.packages).unwrap_or_default();
        let code = PACKAGE_PROBE.replace("NAMES", &names);
        let mut limits = self.shared.settings.limits.clone();
        limits.timeout = Duration::from_secs(30).min(self.shared.settings.max_timeout);
        let mut job = JobSpec::python(code, limits);
        job.tenant = self.shared.settings.tenant.clone();
        // The environment is read once: the one checked is the one reported.
        let env = self.current_env().await;
        let (environment, path) = match &env {
            Some(e) => (
                e.kind.as_str().to_string(),
                Some(e.prefix.display().to_string()),
            ),
            None => ("default".to_string(), None),
        };
        let outcome = match self.run_job(job, env, &ctx).await {
            Ok(o) if o.success() => o,
            Ok(o) => {
                return Ok(tool_error(format!(
                    "the package check failed in the sandbox: {}\n{}",
                    o.status_line(),
                    o.stderr_text()
                )))
            }
            Err(e) => return Ok(tool_error(format!("the package check could not run: {e}"))),
        };
        let packages: Vec<PackageStatus> = match serde_json::from_slice(&outcome.stdout) {
            Ok(p) => p,
            Err(e) => {
                return Ok(tool_error(format!(
                    "the package check gave an unreadable answer: {e}"
                )))
            }
        };
        let text = packages
            .iter()
            .map(|p| match &p.version {
                Some(v) => format!("{}: installed ({v})", p.name),
                None => format!("{}: not installed", p.name),
            })
            .collect::<Vec<_>>()
            .join("\n");
        let report = PackagesReport {
            environment,
            path,
            packages,
        };
        Ok(with_structured(text, &report, false))
    }

    #[tool(
        description = CONFIGURE_ENVIRONMENT,
        input_schema = args::schema::<args::ConfigureEnvironment>()
    )]
    async fn configure_environment(
        &self,
        Args(a): Args<args::ConfigureEnvironment>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Some(envs) = &self.shared.environments {
            // Validating starts the environment's Python in a container: it counts as a
            // run of the tenant's quota.
            if let Err(e) = self.admit() {
                return Ok(tool_error(format!("the environment was not changed: {e}")));
            }
            return environment::configure(envs, &*self.shared.sandbox, a).await;
        }
        if !matches!(a.env_type.as_str(), "conda" | "venv" | "venv-uv") {
            return Err(ErrorData::invalid_params(
                format!(
                    "invalid argument `type`: `{}`; use `conda`, `venv` or `venv-uv`",
                    a.env_type
                ),
                None,
            ));
        }
        Ok(tool_error(format!(
            "configure_environment is not available on this server instance (it runs without environments): switching to a `{}` environment is not possible here, \
             and the configuration was not changed. What works today: code runs in the sandbox image's default Python \
             (see get_environment_config; check_installed_packages lists what it has).",
            a.env_type
        )))
    }

    #[tool(
        description = GET_ENVIRONMENT_CONFIG,
        output_schema = schema_for_output::<EnvironmentReport>()
    )]
    async fn get_environment_config(&self) -> Result<CallToolResult, ErrorData> {
        let s = &self.shared.settings;
        let current = match &self.shared.environments {
            Some(envs) => Some(envs.state.report().await),
            None => None,
        };
        let report = EnvironmentReport {
            env_type: current
                .as_ref()
                .map(|c| c.kind.as_str().to_string())
                .unwrap_or_else(|| "default".into()),
            python: current
                .as_ref()
                .map(|c| c.python.display().to_string())
                .unwrap_or_else(|| s.python.clone()),
            path: current.as_ref().map(|c| c.path.display().to_string()),
            python_version: current.as_ref().map(|c| c.python_version.clone()),
            base_prefix: current
                .as_ref()
                .and_then(|c| c.base_prefix.as_ref().map(|b| b.display().to_string())),
            image: s.image.clone(),
            read_only: true,
            code_storage_dir: self.shared.storage.dir().display().to_string(),
            requested_env_type: s.requested_env_type.clone(),
            limits: LimitsReport {
                default_timeout_seconds: s.limits.timeout.as_secs_f64(),
                max_timeout_seconds: s.max_timeout.as_secs_f64(),
                memory_bytes: s.limits.memory_bytes,
                cpus: s.limits.cpus,
                output_bytes_per_stream: s.limits.output_bytes,
                max_code_bytes: storage::defaults::MAX_CODE_BYTES as u64,
                max_file_bytes: storage::defaults::MAX_FILE_BYTES,
                network: false,
            },
        };
        let mut text = format!(
            "environment: default (the sandbox image's Python {}, read-only)\nimage: {}\ncode storage: {}\ntimeout: {} s by default, at most {} s; memory {} MiB; no network",
            report.python,
            report.image,
            report.code_storage_dir,
            report.limits.default_timeout_seconds,
            report.limits.max_timeout_seconds,
            report.limits.memory_bytes >> 20,
        );
        match &current {
            Some(c) => text = format!(
                "environment: {} at {} (Python {}{}), mounted read-only in every run; install_dependencies installs wheels into it (downloaded in a separate container, installed with the network off)\n{}",
                c.kind,
                c.path.display(),
                c.python_version,
                c.base_prefix
                    .as_ref()
                    .map(|b| format!(", base interpreter {} mounted beside it", b.display()))
                    .unwrap_or_default(),
                text.split_once('\n').map(|(_, rest)| rest).unwrap_or("")
            ),
            None => {
                if let Some(t) = &report.requested_env_type {
                    text.push_str(&format!(
                        "\nENV_TYPE={t} is configured but not honoured by this server instance"
                    ));
                }
            }
        }
        Ok(with_structured(text, &report, false))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeExecutor {
    /// rmcp's dispatch, after refusing arguments the tool does not know (every tool, those
    /// without arguments too): a misspelt argument must not be silently ignored.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        if let (Some(tool), Some(arguments)) =
            (self.tool_router.get(&request.name), &request.arguments)
        {
            args::check_known(&request.name, &tool.input_schema, arguments)?;
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "mcp-code-executor",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }
}
