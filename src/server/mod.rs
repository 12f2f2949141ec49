//! The MCP server as one call: [`run`]`(config, shutdown)` answers at once (`/healthz`,
//! `/readyz`, stdio's `initialize`), starts up as one story (the image built on a first run,
//! the isolation self-test, each tenant's environment), serves until `shutdown` is
//! cancelled or the stdio client leaves, then cancels runs, waits for their sandboxes to be
//! removed and returns. The binary's `serve` calls it with the configuration it parsed and a
//! token its signal watcher cancels; the MCP tests call the very same function with a
//! listener on port 0 (`tests/mcp_support`).
//!
//! Start-up is told on stderr: the listener (or the stdio handler) answers first; then the
//! image is built if missing ([`progress`]); then the self-test; then "serving ...".
//! `/readyz` says which phase it is in meanwhile. [`start`] wires the pieces: the backend
//! ([`crate::backend::connect`], the one place that names it), one executor per tenant,
//! each built from the configuration by conversions ([`settings`]).

mod progress;
pub mod settings;
mod start;

use std::sync::Arc;

use anyhow::Context as _;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::app::{self, Phase, Startup};
use crate::backend::Backend;
use crate::config::ServeConfig;
use crate::env::state::Environments;
use crate::mcp;
use crate::mcp::transports::http::{self, HttpOptions};
use crate::mcp::transports::stdio::Pending;
use crate::tenancy::{self, token::Authenticator};

/// What [`run`] serves with: the configuration, and the few things a caller may hand in
/// instead of having them made from it. `Config::from(serve_config)` is what the binary
/// runs; tests change the fields they need.
pub struct Config {
    /// The resolved configuration (flags, variables, `.env`, defaults).
    pub serve: ServeConfig,
    /// The executors' settings, made from `serve` ([`settings`]); per tenant, a tenant's own
    /// limits are applied over them.
    pub settings: app::Settings,
    /// The HTTP transports' options, made from `serve.http`.
    pub http: HttpOptions,
    /// A listener already bound (tests bind port 0 and know the address); `None`: bind
    /// `serve.http`'s host and port.
    pub listener: Option<tokio::net::TcpListener>,
    /// A backend already made; `None`: connect the one `serve.backend` names (building the
    /// image when missing, with the start-up sweep).
    pub backend: Option<Arc<dyn Backend>>,
    /// Run the isolation self-test before serving (refusing to serve when it fails, unless
    /// `serve.allow_unsafe`). Always on in the binary.
    pub self_test: bool,
    /// Where the single tenant's Python environments come from.
    pub environments: EnvSource,
    /// Told the service once it serves (what a shutdown that has to be abandoned reports,
    /// what tests inspect).
    pub serving: tokio::sync::watch::Sender<Option<Arc<app::Service>>>,
}

/// Where a tenant's environments come from.
pub enum EnvSource {
    /// From the configuration (`ENV_TYPE` and friends, or the managed default under the
    /// data directory), validated in a sandbox: what `serve` does.
    Configured,
    /// None: runs use the image's own Python and installs are refused.
    None,
    /// These (a single-tenant server only).
    Given(Arc<Environments>),
}

impl From<ServeConfig> for Config {
    fn from(serve: ServeConfig) -> Config {
        Config {
            settings: app::Settings::from(&serve),
            http: HttpOptions::from(&serve.http),
            serve,
            listener: None,
            backend: None,
            self_test: true,
            environments: EnvSource::Configured,
            serving: tokio::sync::watch::Sender::new(None),
        }
    }
}

/// Serve the MCP tools as `config` says until `shutdown` is cancelled (or the stdio client
/// leaves); then stop runs, close sessions, shut the backend down and return. An error:
/// start-up failed (the configuration, the backend, the self-test, an environment).
pub async fn run(mut config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = config.listener.take();
    let config = config;
    let cfg = &config.serve;
    if !cfg.http.cluster.peers.is_empty() && cfg.http.cluster.secret.is_none() {
        anyhow::bail!("--peers needs --cluster-secret (MCP_EXECUTOR_CLUSTER_SECRET): replicas show it to each other on forwarded requests");
    }
    // `shutdown` starts the drain; `stop` (after it) stops serving, runs and sessions.
    let stop = drain_on(&config, shutdown);
    let shutdown = stop;
    let (tenants, mut rules) = match &cfg.tenants_file {
        Some(path) => {
            let (t, r) = tenancy::load_all(path)?;
            say!(
                "mcp-code-executor: {} tenants from {} ({}); every MCP request needs a bearer token",
                t.len(),
                path.display(),
                t.iter().map(|t| t.id.as_str()).collect::<Vec<_>>().join(", ")
            );
            (Some(t), r)
        }
        None => (None, Vec::new()),
    };
    // Code mode (#26): the tools file's servers and the tenants file's ([[tenants.servers]]);
    // upstream clients start at the first call of each tenant's code.
    let tenant_servers: Vec<(&str, &[crate::codemode::config::Server])> = tenants
        .iter()
        .flatten()
        .map(|t| (t.id.as_str(), t.limits.servers.as_slice()))
        .collect();
    let code_mode = crate::codemode::configure(
        cfg.tools_file.as_deref(),
        &tenant_servers,
        cfg.host.path.clone(),
        cfg.host.home.clone(),
    );
    if let Some(m) = code_mode.map_err(anyhow::Error::msg)? {
        say!(
            "mcp-code-executor: code mode: {} tool servers: {}",
            m.summary().len(),
            m.summary().join(", ")
        );
        crate::codemode::install(m);
    }
    // Egress (#41): the policy is read and checked at start-up, so that a wrong file stops
    // the server now rather than the first run that needs it. The tenants file's own rules
    // ([[tenants.egress]]) join it, and turn egress on by themselves (default limits).
    let tenant_egress: Vec<crate::egress::policy::Rule> = tenants
        .iter()
        .flatten()
        .flat_map(|t| t.limits.egress.iter().cloned())
        .collect();
    if cfg.egress_file.is_some() || !tenant_egress.is_empty() {
        let (from, policy) = match &cfg.egress_file {
            Some(path) => (
                path.display().to_string(),
                crate::egress::Policy::load(path).map_err(anyhow::Error::msg)?,
            ),
            None => (
                "(none: the tenants file's rules, default limits)".to_string(),
                crate::egress::Policy::parse("").map_err(anyhow::Error::msg)?,
            ),
        };
        let policy = policy.with_tenant_rules(tenant_egress);
        say!(
            "mcp-code-executor: egress policy {from}: {}",
            policy.summary()
        );
        crate::egress::sandbox::install(crate::egress::Proxy::new(policy));
    }
    let code_root = crate::storage::CodeStorage::open(&cfg.code_storage_dir)?;
    crate::app::health_metrics::set_storage_dir(code_root.dir().to_path_buf());
    let usage_dir = crate::app::usage::dir_of(&cfg.data_dir);
    crate::app::usage::open(&usage_dir)
        .with_context(|| format!("usage records at {}", usage_dir.display()))?;
    say!(
        "mcp-code-executor: code storage {}{}",
        code_root.dir().display(),
        if tenants.is_some() { "/<tenant>" } else { "" }
    );

    let startup = Startup::new();
    // The front first: it answers (health, readiness, "starting up") while the rest starts.
    let front = front(&config, listener, tenants.is_some(), &startup, &shutdown).await?;
    // A stdio client that leaves during start-up does not cut it short: a failed self-test
    // is still reported (exit 1), a build still finishes for the next start.
    let started = tokio::select! {
        r = start::start(&config, tenants.as_deref(), &startup, shutdown.clone()) => r,
        _ = shutdown.cancelled() => {
            say!("mcp-code-executor: stopped during start-up");
            return Ok(());
        }
    };
    let service = match started {
        Ok(service) => service,
        Err(e) => {
            startup.set(Phase::Failed(format!("{e:#}")));
            front.abort_after_failure().await;
            return Err(e);
        }
    };
    config.serving.send_replace(Some(service.clone()));

    let served = match front {
        Front::Stdio { pending, task } => {
            pending.ready(mcp::CodeExecutor::connect(&service.tenants()[0]));
            startup.set(Phase::Serving);
            say!("mcp-code-executor: serving MCP over stdio");
            tell_when_pool_ready(&service, shutdown.clone());
            task.await
        }
        Front::Http {
            starting,
            task,
            addr,
        } => {
            let mut auth = tenants.as_deref().map(Authenticator::new);
            if let Some(a) = auth.as_mut() {
                a.oauth = start::oauth(&cfg.http, std::mem::take(&mut rules)).await?;
            }
            starting.ready(http::hosted(service.clone(), auth, &config.http));
            startup.set(Phase::Serving);
            say!("mcp-code-executor: serving Streamable HTTP at http://{addr}/mcp and legacy SSE at http://{addr}/sse; health at /healthz and /readyz{}",
                if cfg.http.metrics { ", metrics at /metrics" } else { "" });
            if tenants.is_some() && cfg.backend.pool_size > 0 {
                // No shared pool to wait for: say what the documented default means here.
                say!("mcp-code-executor: ready: each tenant's warm pool ({} sandboxes, --pool-size) is made at its first run",
                    cfg.backend.pool_size);
            }
            tell_when_pool_ready(&service, shutdown.clone());
            task.await
        }
    };
    // Runs stopped, sessions closed (bounded), then the backend's pools and sandboxes.
    service.shutdown().await;
    if let Some(traces) = service.tracer() {
        traces.flush(TRACES_FLUSH).await;
    }
    crate::codemode::shutdown().await;
    shutdown.cancel();
    served.context("the transport task")?.context("serving")?;
    Ok(())
}

/// How long a stopping server waits for its last spans to be sent.
const TRACES_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// The token that stops serving: cancelled once `shutdown` is and the drain is over. The
/// drain ([`crate::cluster::Cluster::drain`]): readiness says 503 at once, new calls go to
/// other replicas, runs in progress get `--drain-grace` to finish.
fn drain_on(config: &Config, shutdown: CancellationToken) -> CancellationToken {
    let stop = CancellationToken::new();
    let cluster = config.http.cluster.clone();
    let serving = config.serving.subscribe();
    let stopped = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = stopped.cancelled() => return,
        }
        let service = serving.borrow().clone();
        if let Some(service) = service {
            let (running, waiting, _) = service.in_flight();
            // Only replicas have others to take the new calls.
            let elsewhere = if cluster.clustered() {
                "new calls go to other replicas"
            } else {
                "no other replica is there to take new calls"
            };
            say!(
                "mcp-code-executor: draining: /readyz says 503, {elsewhere}; \
                 {} runs in progress and {waiting} waiting get {} s to finish",
                running,
                cluster.drain_grace().as_secs()
            );
            let finished = cluster
                .drain(|| {
                    let (r, w, _) = service.in_flight();
                    r + w
                })
                .await;
            if !finished {
                say!("mcp-code-executor: the drain grace is over: stopping the runs still in progress");
            }
        }
        stopped.cancel();
    });
    stop
}

/// How long the front keeps answering after a failed start-up, so that calls waiting for
/// it get the failure as their answer before it stops.
const FAILED_STARTUP_ANSWER: std::time::Duration = std::time::Duration::from_millis(300);

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

impl Front {
    /// After a failed start-up: give calls waiting for it their error answer (the phase
    /// says `Failed`), then stop answering.
    async fn abort_after_failure(self) {
        tokio::time::sleep(FAILED_STARTUP_ANSWER).await;
        match self {
            Front::Stdio { task, .. } | Front::Http { task, .. } => task.abort(),
        }
    }
}

/// Start the front: stdio's handler, or the HTTP listener with its start-up router.
async fn front(
    config: &Config,
    listener: Option<tokio::net::TcpListener>,
    hosted: bool,
    startup: &Arc<Startup>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Front> {
    let cfg = &config.serve;
    if cfg.stdio {
        let pending = Pending::new(startup.clone());
        let task = tokio::spawn(mcp::transports::stdio::serve_stdio_starting(
            pending.clone(),
            shutdown.clone(),
        ));
        return Ok(Front::Stdio { pending, task });
    }
    let http = &cfg.http;
    let listener = match listener {
        Some(l) => l,
        None => tokio::net::TcpListener::bind((http.host.as_str(), http.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", http.host, http.port))?,
    };
    let addr = listener.local_addr()?;
    say!(
        "mcp-code-executor: listening on http://{addr}: /healthz answers now, /readyz says \
         how start-up goes, MCP requests are answered once it is done"
    );
    if !hosted && !addr.ip().is_loopback() {
        say!(
            "WARNING: listening on {addr}, beyond loopback, with ONE local tenant and NO authentication: \
             anyone who can reach this port can run code. Give a tenants file (--tenants) to require tokens."
        );
    }
    let pool_target = if hosted { 0 } else { cfg.backend.pool_size };
    let starting = http::Starting::with_options(startup.clone(), pool_target, config.http.clone());
    let task = tokio::spawn(http::serve_bounded(
        listener,
        starting.router(),
        shutdown.clone(),
        http.bounds.clone(),
    ));
    Ok(Front::Http {
        starting,
        task,
        addr,
    })
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
                say!(
                    "mcp-code-executor: ready: the warm pool has {} of {} sandboxes waiting",
                    stats.pool_ready,
                    stats.pool_target
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
