//! `serve`: the MCP server on stdio or HTTP, after the isolation self-test, with the
//! configured environment and a warm pool; stops cleanly on SIGINT/SIGTERM.
//!
//! The configuration is resolved once ([`ServeCmd::config_from_process`]); from then on only
//! the typed [`ServeConfig`] is read. This file wires the pieces together: the backend (from
//! [`crate::backend`], the one file that names it), one executor per tenant in the
//! application core, and the transports.

use std::sync::Arc;

use mcp_code_executor::app;
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::config::ServeConfig;
use mcp_code_executor::env::manager::{EnvManager, InstallCaps};
use mcp_code_executor::env::state::{self, EnvState, Environments};
use mcp_code_executor::mcp;
use mcp_code_executor::ops::doctor;
use mcp_code_executor::storage::CodeStorage;
use mcp_code_executor::tenancy::{self, token::Authenticator, Tenant};

use crate::args::ServeCmd;

/// `serve`: check the sandbox is safe, then serve until the client leaves or a signal comes;
/// then cancel runs, wait for their containers to be removed, and exit 0.
pub async fn serve(cmd: ServeCmd) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let cfg = cmd.config_from_process()?;
    let tenants = match &cfg.tenants_file {
        Some(path) => {
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
    let dir = &cfg.code_storage_dir;
    let code_root = CodeStorage::open(dir)?;
    eprintln!(
        "mcp-code-executor: code storage {}{}",
        code_root.dir().display(),
        if tenants.is_some() { "/<tenant>" } else { "" }
    );

    let sandbox = Arc::new(
        crate::backend::connect_with_pool(
            &cmd.sandbox,
            cfg.backend.pool_size,
            cfg.limits.clone(),
            tenants.is_some(),
        )
        .await
        .map_err(anyhow::Error::msg)?,
    );
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
    let settings = app::Settings {
        limits: cfg.limits.clone(),
        max_timeout: cfg.max_timeout,
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
        quota: app::Quota::default(),
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
    );
    let local = [Tenant {
        id: cfg.tenant.clone(),
        token_sha256: [0; 32],
        limits: tenancy::TenantLimits::local(),
    }];
    for tenant in tenants.as_deref().unwrap_or(&local) {
        let storage = match tenants {
            Some(_) => CodeStorage::open(dir.join(&tenant.id))?,
            None => CodeStorage::open(dir)?,
        };
        let restrict = tenants.as_ref().map(|_| {
            tenant
                .limits
                .env_paths
                .iter()
                .map(|p| p.canonicalize().unwrap_or_else(|_| p.clone()))
                .collect()
        });
        let mut environments = environments(&cfg, &*sandbox, &tenant.id, restrict).await?;
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
    let service = Arc::new(service);
    let shutdown = service.shutdown_token();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            wait_for_signal().await;
            eprintln!("mcp-code-executor: shutting down; stopping runs");
            shutdown.cancel();
        }
    });
    let served = if cfg.stdio {
        let executor = mcp::CodeExecutor::connect(&service.tenants()[0]);
        mcp::serve_stdio(executor, shutdown.clone()).await
    } else {
        let http = &cfg.http;
        let listener = tokio::net::TcpListener::bind((http.host.as_str(), http.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", http.host, http.port))?;
        let addr = listener.local_addr()?;
        let opts = mcp::transports::http::HttpOptions {
            allowed_hosts: http.allowed_hosts.clone(),
            allowed_origins: http.allowed_origins.clone(),
            metrics: http.metrics,
            ..Default::default()
        };
        eprintln!("mcp-code-executor: serving Streamable HTTP at http://{addr}/mcp and legacy SSE at http://{addr}/sse; health at /healthz and /readyz{}",
            if http.metrics { ", metrics at /metrics" } else { "" });
        if tenants.is_none() && !addr.ip().is_loopback() {
            eprintln!(
                "WARNING: listening on {addr}, beyond loopback, with ONE local tenant and NO authentication: \
                 anyone who can reach this port can run code. Give a tenants file (--tenants) to require tokens."
            );
        }
        let auth = tenants.as_deref().map(Authenticator::new);
        let router = mcp::transports::http::hosted(service.clone(), auth, &opts);
        mcp::transports::http::serve(listener, router, shutdown.clone()).await
    };
    // Runs stopped, sessions closed (bounded), then the backend's pools and sandboxes.
    service.shutdown().await;
    served.context("serving")?;
    Ok(())
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
