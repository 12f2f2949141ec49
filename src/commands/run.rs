//! `run`: Python files in sandboxes, for CI pipelines, through the application core with a
//! local policy (one tenant, `--jobs` runs at once, no quotas, no code storage); every
//! sandbox removed before it exits, also when interrupted.

use std::path::PathBuf;

use super::{backend, Exit};
use crate::app::{Capacity, Service, Settings, TenantParts};
use crate::cli::files;
use crate::cli::output::Format;
use crate::cli::run::{self, RunOptions};
use crate::config::{self, BackendConfig};
use crate::job::Limits;

/// What `run` was asked: the files as given (files, directories, globs, `-`), the limits of
/// each run, and how to report.
pub struct RunRequest {
    pub files: Vec<String>,
    pub limits: Limits,
    /// Files at once; `None`: as many as the CPUs and the memory allow.
    pub jobs: Option<usize>,
    pub fail_fast: bool,
    pub format: Format,
    pub junit: Option<PathBuf>,
    pub backend: BackendConfig,
    /// Code mode's tools file (`--tools`): the upstream MCP servers the files may call.
    pub tools: Option<PathBuf>,
    /// The egress policy file (`--egress`): the hosts the files may reach (docs/egress.md).
    pub egress: Option<PathBuf>,
}

/// The backend of `run` with code mode or egress: every run gets the tools and the egress
/// proxy of its tenant (the one local tenant), as the server's runs do.
struct WithTools(std::sync::Arc<dyn crate::backend::Backend>);

#[async_trait::async_trait]
impl crate::backend::Wrap for WithTools {
    fn inner(&self) -> &dyn crate::backend::Backend {
        &*self.0
    }

    async fn run(
        &self,
        mut job: crate::job::JobSpec,
        events: crate::backend::Events,
    ) -> Result<crate::job::Outcome, crate::backend::BackendError> {
        if job.tools.is_none() {
            job.tools = crate::codemode::tools_for(&job.tenant);
        }
        if job.egress.is_none() {
            job.egress = crate::egress::sandbox::for_tenant(&job.tenant);
        }
        self.0.run(job, events).await
    }
}

/// `run`: read the files, connect (with a warm pool that makes one sandbox per file, up to
/// twice `--jobs` ahead, when several files run), run them through the application core, and remove every sandbox before exiting,
/// whether the run ended, failed, or was interrupted (SIGINT, SIGTERM).
pub async fn run(cmd: RunRequest) -> Exit {
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    let limits = cmd.limits;
    if let Err(e) = config::validate_limits(&limits) {
        eprintln!("mcp-code-executor: {e}");
        return run::exit::USAGE;
    }
    let format = cmd.format;
    // Every file is found and read before any runs: a typo in the last name fails the job
    // at once, not after the others ran (and without a half-written report).
    let mut files = match files::expand(&cmd.files) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mcp-code-executor: {e}");
            return run::exit::USAGE;
        }
    };
    if files.iter().filter(|f| f.path.is_none()).count() > 1 {
        eprintln!("mcp-code-executor: `-` (stdin) may be given once");
        return run::exit::USAGE;
    }
    if let Err(e) = files::read_all(&mut files).await {
        eprintln!("mcp-code-executor: {e}");
        return run::exit::USAGE;
    }
    // Code mode: its file is read before anything runs; its upstream servers start at the
    // first call of a file's code.
    if let Some(path) = &cmd.tools {
        match crate::codemode::Config::load(path) {
            Ok(conf) => {
                let host = config::HostEnv::from_process();
                crate::codemode::install(crate::codemode::Manager::new(conf, host.path, host.home));
            }
            Err(e) => {
                eprintln!("mcp-code-executor: {e}");
                return run::exit::USAGE;
            }
        }
    }
    // Egress (#41): the policy is checked before anything runs.
    if let Some(path) = &cmd.egress {
        match crate::egress::Policy::load(path) {
            Ok(policy) => crate::egress::sandbox::install(crate::egress::Proxy::new(policy)),
            Err(e) => {
                eprintln!("mcp-code-executor: {e}");
                return run::exit::USAGE;
            }
        }
    }
    let jobs = cmd
        .jobs
        .unwrap_or_else(|| run::default_jobs(&limits))
        .min(files.len())
        .max(1);

    // SIGINT (Ctrl-C) or SIGTERM (a cancelled CI job) from here on: no new file starts, the
    // running ones are cancelled, and every sandbox is removed before exiting.
    let stop = CancellationToken::new();
    let signalled = Arc::new(AtomicI32::new(0));
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("mcp-code-executor: cannot handle SIGTERM: {e}");
            return run::exit::INFRA;
        }
    };
    let watcher = tokio::spawn({
        let (stop, signalled) = (stop.clone(), signalled.clone());
        async move {
            let code = tokio::select! {
                _ = tokio::signal::ctrl_c() => run::exit::INTERRUPTED,
                _ = term.recv() => run::exit::TERMINATED,
            };
            let what = if code == run::exit::INTERRUPTED {
                "interrupted"
            } else {
                "terminated"
            };
            eprintln!("mcp-code-executor: {what}; removing the sandboxes");
            signalled.store(code, Ordering::SeqCst);
            stop.cancel();
        }
    });
    let interrupted = || match signalled.load(Ordering::SeqCst) {
        0 => None,
        code => Some(code),
    };

    // Connect (and build the image on first use) without a pool, so that a signal meanwhile
    // leaves no sandbox behind; then, for several files, a backend with a warm pool of
    // `jobs` sandboxes of the run's shape (one file keeps no pool).
    let plain = tokio::select! {
        r = backend::connect(&cmd.backend) => r,
        _ = stop.cancelled() => return interrupted().unwrap_or(run::exit::INTERRUPTED),
    };
    // The pool serves exactly the files (see `backend::connect_for_runs`), made up to twice
    // `jobs` ahead: on two cores, Docker made 40 sandboxes 12-15% faster 8 at a time than
    // 4 (its create and start wait on more than the CPU); `jobs` files still run at once.
    let sandbox = match plain {
        Ok(s) if files.len() > 1 => {
            drop(s);
            let cfg = BackendConfig {
                pool_size: (2 * jobs).min(files.len()),
                build_missing: false,
                ..cmd.backend.clone()
            };
            let (n, print) = (files.len(), &mut backend::print_build);
            backend::connect_for_runs(&cfg, limits.clone(), n, print).await
        }
        other => other.map(|s| (s, None)),
    };
    let (sandbox, gate) = match sandbox {
        Ok((s, gate)) if cmd.tools.is_some() || cmd.egress.is_some() => (
            std::sync::Arc::new(WithTools(s)) as std::sync::Arc<dyn crate::backend::Backend>,
            gate,
        ),
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcp-code-executor: {e}");
            return run::exit::INFRA;
        }
    };
    // The same core the server uses, with a local policy: one tenant, `jobs` runs at once,
    // no quotas, no code storage.
    let mut service = Service::new(
        sandbox.clone(),
        Capacity {
            max_concurrent: jobs,
            ..Capacity::default()
        },
    );
    let executor = service.add_tenant(TenantParts {
        settings: Settings {
            limits: limits.clone(),
            ..Settings::default()
        },
        storage: None,
        environments: None,
    });
    let opts = RunOptions {
        limits,
        format,
        junit: cmd.junit,
        jobs,
        fail_fast: cmd.fail_fast,
        gate,
    };
    let code = run::run_files(executor, files, opts, stop).await;
    // Pools stopped, every sandbox removed (bounded; what is left goes to the next sweep).
    sandbox.shutdown().await;
    crate::codemode::shutdown().await;
    watcher.abort();
    interrupted().unwrap_or(code)
}
