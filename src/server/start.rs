//! Start-up: the backend (made, or handed in), the isolation self-test, one executor per
//! tenant with its environment; and OAuth sign-in once serving.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::progress::BuildReport;
use super::{Config, EnvSource};
use crate::app::{self, Phase, Startup};
use crate::backend::Backend;
use crate::config::{HttpConfig, ServeConfig};
use crate::env::manager::{EnvManager, InstallCaps};
use crate::env::state::{self, EnvState, Environments};
use crate::ops::doctor;
use crate::storage::CodeStorage;
use crate::tenancy::{self, Tenant};

/// OAuth sign-in, when issuers are configured: the resource server, with each issuer's
/// metadata and keys fetched once now (a warning names an issuer that cannot be reached;
/// its tokens are checked once it answers).
pub(super) async fn oauth(
    http: &HttpConfig,
    rules: Vec<tenancy::Rule>,
) -> anyhow::Result<Option<Arc<tenancy::oauth::OAuth>>> {
    let c = &http.oauth;
    if c.issuers.is_empty() {
        if !rules.is_empty() {
            say!("mcp-code-executor: warning: the tenants file has [[oauth_rules]] but no --oauth-issuer is given: OAuth sign-in is off");
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
            Ok(n) => say!("mcp-code-executor: OAuth issuer {issuer}: {n} signing keys"),
            Err(e) => say!(
                "mcp-code-executor: warning: OAuth issuer {issuer}: its metadata or keys cannot be fetched ({e}); its tokens are refused until it answers"
            ),
        }
    }
    say!(
        "mcp-code-executor: OAuth sign-in for resource {}/mcp; metadata at {}/.well-known/oauth-protected-resource/mcp",
        o.settings.base(),
        o.settings.base()
    );
    Ok(Some(Arc::new(o)))
}

/// Start-up: the backend (the image built first if missing), the isolation self-test, then
/// one executor per tenant with its environment. `startup` says which phase it is in.
pub(super) async fn start(
    config: &Config,
    tenants: Option<&[Tenant]>,
    startup: &Arc<Startup>,
    shutdown: CancellationToken,
) -> anyhow::Result<Arc<app::Service>> {
    let cfg = &config.serve;
    let sandbox = match &config.backend {
        Some(given) => given.clone(),
        None => connect(cfg, tenants, startup).await?,
    };
    if config.self_test {
        self_test(cfg, &sandbox, startup).await?;
    }
    startup.set(Phase::Environment);
    sandbox.sweep_periodically(cfg.http.cluster.sweep_every);
    // One executor per tenant: its own code storage, workspaces, sessions and environment;
    // run slots and metrics shared, slots handed out fairly between tenants.
    let mut service = app::Service::new(
        sandbox.clone(),
        app::Capacity {
            max_concurrent: cfg.max_concurrent,
            max_queue: cfg.max_queue,
        },
    )
    .shutdown_on(shutdown)
    .traces(crate::telemetry::Exporter::start(&cfg.traces));
    if let Some(e) = service.tracer() {
        say!(
            "mcp-code-executor: traces to {} (OTLP/HTTP JSON, service.name {})",
            e.endpoint(),
            cfg.traces.service_name
        );
    }
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
        let environments = match &config.environments {
            EnvSource::Configured => {
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
                    .cap_installs(InstallCaps::from(&tenant.limits));
                // The shared pool of a single-tenant server is made with its environment;
                // tenants' pools are made at their first run.
                sandbox
                    .prewarm(&tenant.id, &environments.state.current().await.run_env())
                    .await;
                Some(Arc::new(environments))
            }
            EnvSource::None => None,
            EnvSource::Given(e) if tenants.is_none() => Some(e.clone()),
            EnvSource::Given(_) => anyhow::bail!("given environments serve a single tenant only"),
        };
        service.add_tenant(app::TenantParts {
            // A tenant of the tenants file: its own limits over the server's. The one local
            // tenant has none of its own: the server's settings are its.
            settings: match tenants {
                Some(_) => config.settings.for_tenant(tenant),
                None => config.settings.clone(),
            },
            storage: Some(storage),
            environments,
        });
    }
    Ok(Arc::new(service))
}

/// The backend the configuration names, its image built first if missing (the build's
/// progress told as the start-up phase), with a warm pool (one per tenant with a tenants
/// file, each with the tenant's own preload list).
async fn connect(
    cfg: &ServeConfig,
    tenants: Option<&[Tenant]>,
    startup: &Arc<Startup>,
) -> anyhow::Result<Arc<dyn Backend>> {
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
    crate::backend::connect::connect_with_pool(
        &backend_cfg,
        cfg.limits.clone(),
        tenants.is_some(),
        &mut |e| report.event(e),
    )
    .await
    .map_err(anyhow::Error::msg)
}

/// The isolation self-test (`doctor`'s checks): serving is refused when one fails, unless
/// `--allow-unsafe` (then loudly).
async fn self_test(
    cfg: &ServeConfig,
    sandbox: &Arc<dyn Backend>,
    startup: &Arc<Startup>,
) -> anyhow::Result<()> {
    startup.set(Phase::SelfTest);
    let report = doctor::diagnose(&**sandbox).await;
    crate::app::health_metrics::set_self_test(report.ok());
    if report.ok() {
        say!(
            "mcp-code-executor: isolation self-test passed ({} checks)",
            report.checks.len()
        );
    } else {
        eprint!("{}", report.table());
        if cfg.allow_unsafe {
            say!("WARNING: the isolation self-test FAILED and --allow-unsafe was given.");
            say!("WARNING: untrusted code may reach the host or the network. Do not expose this server.");
        } else {
            sandbox.shutdown().await;
            anyhow::bail!(
                "refusing to serve: the isolation self-test failed (see the table above). \
                 Fix the host (`mcp-code-executor doctor`), or pass --allow-unsafe to serve anyway"
            );
        }
    }
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
    say!(
        "mcp-code-executor: tenant {tenant}: environment {} at {} (Python {})",
        report.kind,
        report.path.display(),
        report.python_version
    );
    Ok(Environments { manager, state })
}
