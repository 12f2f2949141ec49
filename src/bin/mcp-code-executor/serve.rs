//! `serve`: the MCP server on stdio or HTTP, after the isolation self-test, with the
//! configured environment and a warm pool; stops cleanly on SIGINT/SIGTERM.
//!
//! Start-up is one story on stderr: the listener (or the stdio handler) answers first; then
//! the sandbox image is built if missing (its steps as concise lines, or a progress bar on
//! a terminal; the build's own output only at debug level); then the self-test; then
//! "serving ...". `/readyz` says which phase it is in meanwhile.
//!
//! The configuration is resolved once ([`ServeCmd::config_from_process`]); from then on only
//! the typed [`ServeConfig`] is read. This file wires the pieces together: the backend (from
//! [`crate::backend`], the one file that names it), one executor per tenant in the
//! application core, and the transports.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use mcp_code_executor::app::{self, Phase, Startup};
use mcp_code_executor::mcp::transports::http;
use mcp_code_executor::mcp::transports::stdio::Pending;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::backend::image;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::config::ServeConfig;
use mcp_code_executor::env::manager::{EnvManager, InstallCaps};
use mcp_code_executor::env::state::{self, EnvState, Environments};
use mcp_code_executor::mcp;
use mcp_code_executor::ops::doctor;
use mcp_code_executor::storage::CodeStorage;
use mcp_code_executor::tenancy::{self, token::Authenticator, Tenant};

use crate::args::ServeCmd;

/// `serve`: answer at once (`/healthz`, `/readyz`, stdio's `initialize`), then start up as
/// one story (the image built on a first run, the isolation self-test, the environment),
/// then serve until the client leaves or a signal comes; then cancel runs, wait for their
/// containers to be removed, and exit 0.
pub async fn serve(cmd: ServeCmd) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let cfg = cmd.config_from_process()?;
    let mut rules = Vec::new();
    let tenants = match &cfg.tenants_file {
        Some(path) => {
            let (t, r) = tenancy::load_all(path)?;
            rules = r;
            eprintln!(
                "mcp-code-executor: {} tenants from {} ({}); every MCP request needs a bearer token",
                t.len(),
                path.display(),
                t.iter().map(|t| t.id.as_str()).collect::<Vec<_>>().join(", ")
            );
            Some(t)
        }
        None => None,
    };
    if let Some(path) = &cfg.tools_file {
        // Code mode (#26): upstream clients start at the first call of each tenant's code.
        let conf = mcp_code_executor::codemode::Config::load(path).map_err(anyhow::Error::msg)?;
        let m = mcp_code_executor::codemode::Manager::new(
            conf,
            cfg.host.path.clone(),
            cfg.host.home.clone(),
        );
        eprintln!(
            "mcp-code-executor: code mode: {} tool servers from {}: {}",
            m.summary().len(),
            path.display(),
            m.summary().join(", ")
        );
        mcp_code_executor::codemode::install(m);
    }
    let code_root = CodeStorage::open(&cfg.code_storage_dir)?;
    eprintln!(
        "mcp-code-executor: code storage {}{}",
        code_root.dir().display(),
        if tenants.is_some() { "/<tenant>" } else { "" }
    );

    let startup = Startup::new();
    let shutdown = CancellationToken::new();
    let serving: Arc<OnceLock<Arc<app::Service>>> = Arc::default();
    watch_signals(
        shutdown.clone(),
        Abandon {
            serving: serving.clone(),
            backend: cfg.backend.kind,
            docker_host: cfg.backend.docker_host.clone(),
        },
    );

    // The front first: it answers (health, readiness, "starting up") while the rest starts.
    let front = if cfg.stdio {
        let pending = Pending::new(startup.clone());
        let task = tokio::spawn(mcp::transports::stdio::serve_stdio_starting(
            pending.clone(),
            shutdown.clone(),
        ));
        Front::Stdio { pending, task }
    } else {
        let http = &cfg.http;
        let listener = tokio::net::TcpListener::bind((http.host.as_str(), http.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", http.host, http.port))?;
        let addr = listener.local_addr()?;
        eprintln!(
            "mcp-code-executor: listening on http://{addr}: /healthz answers now, /readyz says \
             how start-up goes, MCP requests are answered once it is done"
        );
        if tenants.is_none() && !addr.ip().is_loopback() {
            eprintln!(
                "WARNING: listening on {addr}, beyond loopback, with ONE local tenant and NO authentication: \
                 anyone who can reach this port can run code. Give a tenants file (--tenants) to require tokens."
            );
        }
        let pool_target = if tenants.is_some() {
            0
        } else {
            cfg.backend.pool_size
        };
        let starting =
            http::Starting::with_options(startup.clone(), pool_target, http_options(http));
        let task = tokio::spawn(http::serve_bounded(
            listener,
            starting.router(),
            shutdown.clone(),
            http.bounds.clone(),
        ));
        Front::Http {
            starting,
            task,
            addr,
        }
    };
    // A stdio client that leaves during start-up does not cut it short: a failed self-test
    // is still reported (exit 1), a build still finishes for the next start.
    let started = tokio::select! {
        r = start(&cfg, tenants.as_deref(), &startup, shutdown.clone()) => r,
        _ = shutdown.cancelled() => {
            eprintln!("mcp-code-executor: stopped during start-up");
            return Ok(());
        }
    };
    let service = match started {
        Ok(service) => {
            let _ = serving.set(service.clone());
            service
        }
        Err(e) => {
            startup.set(Phase::Failed(format!("{e:#}")));
            // Calls waiting for start-up get their error answer before the process exits.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            return Err(e);
        }
    };

    let served = match front {
        Front::Stdio { pending, task } => {
            pending.ready(mcp::CodeExecutor::connect(&service.tenants()[0]));
            startup.set(Phase::Serving);
            eprintln!("mcp-code-executor: serving MCP over stdio");
            tell_when_pool_ready(&service, shutdown.clone());
            task.await
        }
        Front::Http {
            starting,
            task,
            addr,
        } => {
            let http = &cfg.http;
            let opts = http_options(http);
            let mut auth = tenants.as_deref().map(Authenticator::new);
            if let Some(a) = auth.as_mut() {
                a.oauth = oauth(http, std::mem::take(&mut rules)).await?;
            }
            starting.ready(http::hosted(service.clone(), auth, &opts));
            startup.set(Phase::Serving);
            eprintln!("mcp-code-executor: serving Streamable HTTP at http://{addr}/mcp and legacy SSE at http://{addr}/sse; health at /healthz and /readyz{}",
                if http.metrics { ", metrics at /metrics" } else { "" });
            tell_when_pool_ready(&service, shutdown.clone());
            task.await
        }
    };
    // Runs stopped, sessions closed (bounded), then the backend's pools and sandboxes.
    service.shutdown().await;
    mcp_code_executor::codemode::shutdown().await;
    served.context("the transport task")?.context("serving")?;
    Ok(())
}

/// OAuth sign-in, when issuers are configured: the resource server, with each issuer's
/// metadata and keys fetched once now (a warning names an issuer that cannot be reached;
/// its tokens are checked once it answers).
async fn oauth(
    http: &mcp_code_executor::config::HttpConfig,
    rules: Vec<tenancy::Rule>,
) -> anyhow::Result<Option<Arc<tenancy::oauth::OAuth>>> {
    let c = &http.oauth;
    if c.issuers.is_empty() {
        if !rules.is_empty() {
            eprintln!("mcp-code-executor: warning: the tenants file has [[oauth_rules]] but no --oauth-issuer is given: OAuth sign-in is off");
        }
        return Ok(None);
    }
    let settings = tenancy::oauth::Settings {
        public_url: c.public_url.clone().unwrap_or_default(),
        issuers: c.issuers.clone(),
        scope: c.scope.clone(),
    };
    let o = tenancy::oauth::OAuth::new(settings, rules).map_err(|e| anyhow::anyhow!(e))?;
    for (issuer, r) in o.check_issuers().await {
        match r {
            Ok(n) => eprintln!("mcp-code-executor: OAuth issuer {issuer}: {n} signing keys"),
            Err(e) => eprintln!(
                "mcp-code-executor: warning: OAuth issuer {issuer}: its metadata or keys cannot be fetched ({e}); its tokens are refused until it answers"
            ),
        }
    }
    eprintln!(
        "mcp-code-executor: OAuth sign-in for resource {}/mcp; metadata at {}/.well-known/oauth-protected-resource/mcp",
        o.settings.base(),
        o.settings.base()
    );
    Ok(Some(Arc::new(o)))
}

/// The HTTP transports' options from the configuration.
fn http_options(http: &mcp_code_executor::config::HttpConfig) -> http::HttpOptions {
    http::HttpOptions {
        allowed_hosts: http.allowed_hosts.clone(),
        allowed_origins: http.allowed_origins.clone(),
        metrics: http.metrics,
        bounds: http.bounds.clone(),
        ..Default::default()
    }
}

/// The front that answers from the start: a stdio client, or the HTTP listener.
enum Front {
    Stdio {
        pending: Arc<Pending>,
        task: JoinHandle<std::io::Result<()>>,
    },
    Http {
        starting: Arc<http::Starting>,
        task: JoinHandle<std::io::Result<()>>,
        addr: std::net::SocketAddr,
    },
}

/// Start-up: the backend (the image built first if missing), the isolation self-test, then
/// one executor per tenant with its environment. `startup` says which phase it is in.
async fn start(
    cfg: &ServeConfig,
    tenants: Option<&[Tenant]>,
    startup: &Arc<Startup>,
    shutdown: CancellationToken,
) -> anyhow::Result<Arc<app::Service>> {
    let mut report = BuildReport::new(startup.clone());
    // Tenants that name their own preload list (docs/mcp.md "Preloading").
    let mut backend_cfg = cfg.backend.clone();
    for t in tenants.unwrap_or_default() {
        if let Some(list) = &t.limits.preload {
            backend_cfg
                .preload
                .per_tenant
                .insert(t.id.clone(), list.clone());
        }
    }
    let sandbox = crate::backend::connect_with_pool(
        &backend_cfg,
        cfg.limits.clone(),
        tenants.is_some(),
        &mut |e| report.event(e),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    startup.set(Phase::SelfTest);
    let report = doctor::diagnose(&*sandbox).await;
    if report.ok() {
        eprintln!(
            "mcp-code-executor: isolation self-test passed ({} checks)",
            report.checks.len()
        );
    } else {
        eprint!("{}", report.table());
        if cfg.allow_unsafe {
            eprintln!("WARNING: the isolation self-test FAILED and --allow-unsafe was given.");
            eprintln!("WARNING: untrusted code may reach the host or the network. Do not expose this server.");
        } else {
            sandbox.shutdown().await;
            anyhow::bail!(
                "refusing to serve: the isolation self-test failed (see the table above). \
                 Fix the host (`mcp-code-executor doctor`), or pass --allow-unsafe to serve anyway"
            );
        }
    }
    startup.set(Phase::Environment);
    let settings = app::Settings {
        limits: cfg.limits.clone(),
        max_timeout: cfg.max_timeout,
        max_task_timeout: app::settings::defaults::MAX_TASK_TIMEOUT,
        image: cfg
            .backend
            .image
            .clone()
            .unwrap_or_else(image::default_image),
        python: app::settings::defaults::IMAGE_PYTHON.into(),
        requested_env_type: cfg.env.env_type.clone(),
        tenant: cfg.tenant.clone(),
        sessions: app::SessionOptions {
            idle: cfg.sessions.idle,
            max_lifetime: cfg.sessions.max_lifetime,
            max_sessions: cfg.sessions.max_sessions,
            shared_workspace: cfg.shared_workspace,
            workspace_root: cfg.workspace_dir.clone(),
        },
        quota: app::Quota {
            storage_bytes: cfg.storage_limit,
            code_max_age: cfg.code_max_age,
            memory_budget: cfg.memory_budget,
            ..app::Quota::default()
        },
    };
    sandbox.sweep_periodically(std::time::Duration::from_secs(600));
    // One executor per tenant: its own code storage, workspaces, sessions and environment;
    // run slots and metrics shared, slots handed out fairly between tenants.
    let mut service = app::Service::new(
        sandbox.clone(),
        app::Capacity {
            max_concurrent: cfg.max_concurrent,
            max_queue: cfg.max_queue,
        },
    )
    .shutdown_on(shutdown);
    if let Some(limit) = cfg.storage_limit_total {
        service = service.storage_total(
            limit,
            vec![cfg.code_storage_dir.clone(), cfg.workspace_dir.clone()],
        );
    }
    let local = [Tenant {
        id: cfg.tenant.clone(),
        token_sha256: None,
        limits: tenancy::TenantLimits::local(),
    }];
    let dir = &cfg.code_storage_dir;
    for tenant in tenants.unwrap_or(&local) {
        let storage = match tenants {
            Some(_) => CodeStorage::open(dir.join(&tenant.id))?,
            None => CodeStorage::open(dir)?,
        };
        let restrict = tenants.map(|_| {
            tenant
                .limits
                .env_paths
                .iter()
                .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
                .collect()
        });
        let mut environments = environments(cfg, &*sandbox, &tenant.id, restrict).await?;
        // Installer containers stay within the tenant's own limits.
        environments
            .state
            .cap_installs(install_caps(&tenant.limits));
        // The shared pool of a single-tenant server is made with its environment; tenants'
        // pools are made at their first run.
        sandbox
            .prewarm(&tenant.id, &environments.state.current().await.run_env())
            .await;
        service.add_tenant(app::TenantParts {
            settings: settings.for_tenant(tenant),
            storage: Some(storage),
            environments: Some(Arc::new(environments)),
        });
    }
    Ok(Arc::new(service))
}

/// Say once when the warm pool has its first sandbox waiting (the server is ready then).
fn tell_when_pool_ready(service: &Arc<app::Service>, shutdown: CancellationToken) {
    let backend = service.backend().clone();
    if backend.stats().pool_target == 0 {
        return;
    }
    tokio::spawn(async move {
        loop {
            let stats = backend.stats();
            if stats.pool_ready > 0 {
                eprintln!(
                    "mcp-code-executor: ready: the warm pool has {} of {} sandboxes waiting",
                    stats.pool_ready, stats.pool_target
                );
                return;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {}
            }
        }
    });
}

/// Tells the image build's progress: the start-up phase (for `/readyz` and waiting calls),
/// and stderr: a progress bar on a terminal, plain lines otherwise (CI, compose logs).
struct BuildReport {
    startup: Arc<Startup>,
    terminal: bool,
    /// A progress bar is drawn on the current line.
    bar_drawn: bool,
}

impl BuildReport {
    fn new(startup: Arc<Startup>) -> BuildReport {
        use std::io::IsTerminal as _;
        BuildReport {
            startup,
            terminal: std::io::stderr().is_terminal(),
            bar_drawn: false,
        }
    }

    fn event(&mut self, e: &image::BuildEvent) {
        match e {
            image::BuildEvent::Started { .. } => {
                self.startup.set(Phase::BuildingImage { step: None });
                self.line(e);
            }
            image::BuildEvent::Step { index, total, name } => {
                self.startup.set_build_step(e.to_string());
                if self.terminal {
                    self.bar(*index, *total, name);
                } else {
                    self.line(e);
                }
            }
            image::BuildEvent::Note(_) | image::BuildEvent::Finished { .. } => self.line(e),
        }
    }

    fn line(&mut self, e: &image::BuildEvent) {
        let indent = if matches!(e, image::BuildEvent::Step { .. }) {
            "  "
        } else {
            ""
        };
        if self.bar_drawn {
            // Carriage return, erase the line: the bar's place goes to this line.
            eprint!("\r\x1b[2K");
            self.bar_drawn = false;
        }
        eprintln!("mcp-code-executor: {indent}{e}");
    }

    fn bar(&mut self, index: usize, total: usize, name: &str) {
        const WIDTH: usize = 24;
        let done = (index * WIDTH / total.max(1)).min(WIDTH);
        let name: String = name.chars().take(40).collect();
        eprint!(
            "\r\x1b[2Kmcp-code-executor: [{}{}] step {index} of {total}: {name}",
            "#".repeat(done),
            "-".repeat(WIDTH - done)
        );
        self.bar_drawn = true;
    }
}

/// The environment `tenant`'s runs start in (from ENV_TYPE and friends, or its managed
/// default), validated in a sandbox. `restrict`: the roots it may configure environments
/// under (multi-tenant servers).
async fn environments(
    cfg: &ServeConfig,
    sandbox: &dyn Backend,
    tenant: &str,
    restrict: Option<Vec<std::path::PathBuf>>,
) -> anyhow::Result<Environments> {
    let request = state::request_from(&cfg.env)?;
    let manager = EnvManager::new(cfg.data_dir.clone(), cfg.ca_bundle.clone())
        .with_pip_index(&cfg.pip_index)
        .with_host(cfg.host.clone());
    let mut state = EnvState::init(sandbox, &manager, tenant, request)
        .await
        .map_err(|e| anyhow::anyhow!("the configured Python environment cannot be used: {e}"))?;
    if let Some(roots) = restrict {
        state = state.restrict_to(roots);
    }
    let report = state.report().await;
    eprintln!(
        "mcp-code-executor: tenant {tenant}: environment {} at {} (Python {})",
        report.kind,
        report.path.display(),
        report.python_version
    );
    Ok(Environments { manager, state })
}

/// The caps of a tenant of the tenants file on its installer containers: its `max_cpus`,
/// `max_memory`, `max_timeout`.
fn install_caps(l: &tenancy::TenantLimits) -> InstallCaps {
    InstallCaps {
        cpus: l.max_cpus,
        memory_bytes: l.max_memory,
        timeout: l.max_timeout,
    }
}

/// How long a shutdown may take from SIGTERM (or SIGINT) to the end of the process. Runs
/// are cancelled at once and their containers removed, sessions get
/// [`app::settings::SHUTDOWN_DEADLINE`]; what still has not finished by this deadline (a
/// request stuck in a loop or on a file, a daemon that does not answer) is abandoned: it is
/// logged, the containers of this process are removed, and the process exits (status 1).
/// Under Kubernetes' default grace period of 30 s.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(25);

/// What an abandoned shutdown needs: what is in flight (once serving), and where this
/// process's containers are.
struct Abandon {
    serving: Arc<OnceLock<Arc<app::Service>>>,
    backend: mcp_code_executor::config::serve::BackendKind,
    docker_host: Option<String>,
}

impl Abandon {
    /// Say what is left, remove this process's containers (at most 10 s), exit 1.
    async fn now(self, why: &str) -> ! {
        let left = match self.serving.get() {
            Some(s) => {
                let (running, waiting, sessions) = s.in_flight();
                format!("{running} runs going, {waiting} calls waiting, {sessions} sessions open")
            }
            None => "start-up not finished".to_string(),
        };
        eprintln!("mcp-code-executor: {why}; abandoning what is left ({left})");
        tracing::error!(left = %left, "shutdown abandoned: {why}");
        use mcp_code_executor::config::serve::BackendKind;
        match self.backend {
            BackendKind::Docker => {
                let removed = tokio::time::timeout(
                    Duration::from_secs(10),
                    mcp_code_executor::backend::docker::remove_own_containers(
                        self.docker_host.as_deref(),
                    ),
                )
                .await;
                match removed {
                    Ok(Ok(n)) => eprintln!("mcp-code-executor: removed {n} containers of this process"),
                    Ok(Err(e)) => eprintln!("mcp-code-executor: could not remove this process's containers ({e}); the next start-up sweep removes them"),
                    Err(_) => eprintln!("mcp-code-executor: the Docker daemon did not answer within 10 s; the next start-up sweep removes this process's containers"),
                }
            }
            _ => eprintln!(
                "mcp-code-executor: the pods of this process go to the next start-up sweep"
            ),
        }
        std::process::exit(1)
    }
}

/// Signals are watched on a thread of their own, with its own small runtime: a request that
/// holds every worker of the server's runtime (a loop that never yields) must not stop the
/// shutdown. The first signal cancels `shutdown` (runs stop, the server drains); if the
/// process is still there [`SHUTDOWN_LIMIT`] later, or at a second signal, what is left is
/// abandoned ([`Abandon::now`]).
fn watch_signals(shutdown: CancellationToken, abandon: Abandon) {
    let spawned = std::thread::Builder::new()
        .name("mce-signals".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("mcp-code-executor: no runtime for the signal watcher: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                wait_for_signal().await;
                eprintln!("mcp-code-executor: shutting down; stopping runs");
                shutdown.cancel();
                let why = tokio::select! {
                    _ = tokio::time::sleep(SHUTDOWN_LIMIT) => format!(
                        "the shutdown did not finish within {} s", SHUTDOWN_LIMIT.as_secs()),
                    _ = wait_for_signal() => "a second signal came".to_string(),
                };
                abandon.now(&why).await
            })
        });
    if let Err(e) = spawned {
        eprintln!("mcp-code-executor: cannot watch for signals: {e}");
    }
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
