//! `serve`: the MCP server on stdio or HTTP, after the isolation self-test, with the
//! configured environment and a warm pool; stops cleanly on SIGINT/SIGTERM.

use mcp_code_executor::backend::image;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::config;
use mcp_code_executor::job::Limits;
use mcp_code_executor::mcp;
use mcp_code_executor::ops::doctor;
use mcp_code_executor::storage::{self, CodeStorage};
use mcp_code_executor::tenancy::{self, scheduler::Scheduler, token::Authenticator, Tenant};

use crate::args::ServeCmd;

/// `serve`: check the sandbox is safe, then serve until the client leaves or a signal comes;
/// then cancel runs, wait for their containers to be removed, and exit 0.
pub async fn serve(cmd: ServeCmd) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let limits = Limits {
        timeout: cmd.timeout,
        memory_bytes: cmd.memory,
        cpus: cmd.cpus,
        ..Limits::default()
    };
    config::validate_limits(&limits)?;
    anyhow::ensure!(
        cmd.max_timeout >= cmd.timeout,
        "--max-timeout ({:?}) is below --timeout ({:?})",
        cmd.max_timeout,
        cmd.timeout
    );
    let dir = cmd
        .code_storage_dir
        .clone()
        .unwrap_or_else(|| storage::default_dir(&config::data_dir(|k| std::env::var(k).ok())));
    let tenants = match &cmd.tenants {
        Some(path) => {
            anyhow::ensure!(
                !cmd.stdio,
                "--tenants is for the HTTP transports; over stdio the server has one client and no tokens"
            );
            let t = tenancy::load(path)?;
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
    let code_root = CodeStorage::open(&dir)?;
    eprintln!(
        "mcp-code-executor: code storage {}{}",
        code_root.dir().display(),
        if tenants.is_some() { "/<tenant>" } else { "" }
    );

    let sandbox = crate::backend::connect_with_pool(
        &cmd.sandbox,
        cmd.pool_size,
        limits.clone(),
        tenants.is_some(),
    )
    .await
    .map_err(anyhow::Error::msg)?;
    let report = doctor::diagnose(&sandbox).await;
    if report.ok() {
        eprintln!(
            "mcp-code-executor: isolation self-test passed ({} checks)",
            report.checks.len()
        );
    } else {
        eprint!("{}", report.table());
        if cmd.allow_unsafe {
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
    let settings = mcp::Settings {
        limits,
        max_timeout: cmd.max_timeout,
        max_concurrent_runs: cmd.max_concurrent,
        image: cmd
            .sandbox
            .image
            .clone()
            .unwrap_or_else(image::default_image),
        python: "/usr/bin/python3".into(),
        requested_env_type: cmd.env_type.clone(),
        tenant: cmd.tenant.clone(),
        sessions: mcp::sessions::SessionOptions {
            idle: cmd.session_idle,
            max_lifetime: cmd.session_max_lifetime,
            max_sessions: cmd.max_sessions,
            shared_workspace: cmd.shared_workspace,
            workspace_root: cmd.workspace_dir.clone().unwrap_or_else(|| {
                cmd.data_dir
                    .clone()
                    .unwrap_or_else(|| config::data_dir(|k| std::env::var(k).ok()))
                    .join("workspaces")
            }),
        },
        quota: mcp::Quota::default(),
    };
    let sandbox = std::sync::Arc::new(sandbox);
    sandbox.sweep_periodically(std::time::Duration::from_secs(600));
    let shutdown = tokio_util::sync::CancellationToken::new();
    // One executor per tenant: its own code storage, workspaces, sessions and environment;
    // run slots and metrics shared, slots handed out fairly between tenants.
    let scheduler = Scheduler::new(cmd.max_concurrent, cmd.max_queue);
    let metrics = std::sync::Arc::new(mcp_code_executor::app::metrics::Metrics::default());
    let local = [Tenant {
        id: cmd.tenant.clone(),
        token_sha256: [0; 32],
        limits: tenancy::TenantLimits::local(),
    }];
    let mut executors = Vec::new();
    for tenant in tenants.as_deref().unwrap_or(&local) {
        let storage = match tenants {
            Some(_) => CodeStorage::open(dir.join(&tenant.id))?,
            None => CodeStorage::open(&dir)?,
        };
        let restrict = tenants.as_ref().map(|_| {
            tenant
                .limits
                .env_paths
                .iter()
                .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
                .collect()
        });
        let mut environments = environments(&cmd, &*sandbox, &tenant.id, restrict).await?;
        // Installer containers stay within the tenant's own limits.
        environments
            .state
            .cap_installs(install_caps(&tenant.limits));
        // The shared pool of a single-tenant server is made with its environment; tenants'
        // pools are made at their first run.
        sandbox
            .prewarm(&tenant.id, &environments.state.current().await.run_env())
            .await;
        let executor = mcp::CodeExecutor::new(
            sandbox.clone(),
            std::sync::Arc::new(storage),
            settings.for_tenant(tenant),
        )
        .with_shutdown(shutdown.clone())
        .with_environments(std::sync::Arc::new(environments))
        .with_scheduler(scheduler.clone())
        .with_metrics(metrics.clone());
        executors.push(executor);
    }
    // Every tenant's execute_python sessions: shutdown waits for them to close before it
    // drains the sandbox, so that no session container is dropped after the drain.
    let sessions: Vec<_> = executors.iter().map(|e| e.sessions()).collect();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            wait_for_signal().await;
            eprintln!("mcp-code-executor: shutting down; stopping runs");
            shutdown.cancel();
        }
    });
    let served = if cmd.stdio {
        let executor = executors.pop().expect("one tenant over stdio");
        mcp::serve_stdio(executor, shutdown.clone()).await
    } else {
        let listener = tokio::net::TcpListener::bind((cmd.host.as_str(), cmd.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", cmd.host, cmd.port))?;
        let addr = listener.local_addr()?;
        let allowed = if cmd.allowed_hosts.iter().any(|h| h.trim() == "*") {
            Vec::new()
        } else {
            cmd.allowed_hosts.clone()
        };
        let opts = mcp::transports::http::HttpOptions {
            allowed_hosts: allowed,
            allowed_origins: cmd.allowed_origins.clone(),
            metrics: cmd.metrics,
            ..Default::default()
        };
        eprintln!("mcp-code-executor: serving Streamable HTTP at http://{addr}/mcp and legacy SSE at http://{addr}/sse; health at /healthz and /readyz{}",
            if cmd.metrics { ", metrics at /metrics" } else { "" });
        if tenants.is_none() && !addr.ip().is_loopback() {
            eprintln!(
                "WARNING: listening on {addr}, beyond loopback, with ONE local tenant and NO authentication: \
                 anyone who can reach this port can run code. Give a tenants file (--tenants) to require tokens."
            );
        }
        let auth = tenants.as_deref().map(Authenticator::new);
        let router = mcp::transports::http::hosted(executors, auth, &opts, shutdown.clone());
        mcp::transports::http::serve(listener, router, shutdown.clone()).await
    };
    shutdown.cancel();
    for s in &sessions {
        s.wait_closed(mcp::sessions::SHUTDOWN_DEADLINE).await;
    }
    sandbox.shutdown().await;
    served.context("serving")?;
    Ok(())
}

/// The environment `tenant`'s runs start in (from ENV_TYPE and friends, or its managed
/// default), validated in a sandbox. `restrict`: the roots it may configure environments
/// under (multi-tenant servers).
async fn environments(
    cmd: &ServeCmd,
    sandbox: &dyn Backend,
    tenant: &str,
    restrict: Option<Vec<std::path::PathBuf>>,
) -> anyhow::Result<mcp_code_executor::env::state::Environments> {
    use mcp_code_executor::env::manager::EnvManager;
    use mcp_code_executor::env::state::{self, EnvState, Environments};
    let get = |k: &str| std::env::var(k).ok();
    let data_dir = cmd
        .data_dir
        .clone()
        .unwrap_or_else(|| config::data_dir(get));
    let ca = cmd.ca_bundle.clone().or_else(|| config::ca_bundle(get));
    let request = state::request_from_vars(|k| {
        if k == config::vars::ENV_TYPE {
            cmd.env_type.clone()
        } else {
            get(k)
        }
    })?;
    let manager = EnvManager::new(data_dir, ca).with_pip_index(&config::PipIndex::from_vars(get));
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
/// `max_memory`, `max_timeout` (was `InstallCaps::of_tenant`, which made `env` depend on
/// `tenancy`).
fn install_caps(l: &tenancy::TenantLimits) -> mcp_code_executor::env::manager::InstallCaps {
    mcp_code_executor::env::manager::InstallCaps {
        cpus: l.max_cpus,
        memory_bytes: l.max_memory,
        timeout: l.max_timeout,
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
