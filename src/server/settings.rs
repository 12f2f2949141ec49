//! What each piece of the server is made with, from the one configuration: conversions,
//! so that no caller maps [`ServeConfig`] fields by hand.

use std::path::PathBuf;

use crate::app::{self, Settings};
use crate::config::serve::BackendKind;
use crate::config::{BackendConfig, HttpConfig, ServeConfig};
use crate::env::manager::InstallCaps;
use crate::job::Limits;
use crate::mcp;
use crate::mcp::transports::http::HttpOptions;
use crate::tenancy::TenantLimits;

/// The executors' settings (before a tenant's own limits are applied:
/// [`Settings::for_tenant`]).
impl From<&ServeConfig> for Settings {
    fn from(cfg: &ServeConfig) -> Settings {
        Settings {
            limits: cfg.limits.clone(),
            max_timeout: cfg.max_timeout,
            max_task_timeout: app::settings::defaults::MAX_TASK_TIMEOUT,
            task_ttl: cfg.task_ttl,
            task_result_bytes: cfg.task_result_bytes,
            image: cfg
                .backend
                .image
                .clone()
                .unwrap_or_else(crate::backend::image::default_image),
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
        }
    }
}

/// The HTTP transports' options.
impl From<&HttpConfig> for HttpOptions {
    fn from(http: &HttpConfig) -> HttpOptions {
        HttpOptions {
            allowed_hosts: http.allowed_hosts.clone(),
            allowed_origins: http.allowed_origins.clone(),
            metrics: http.metrics,
            bounds: http.bounds.clone(),
            cluster: std::sync::Arc::new(crate::cluster::Cluster::new(&http.cluster)),
            ..HttpOptions::default()
        }
    }
}

/// The caps of a tenant of the tenants file on its installer containers: its `max_cpus`,
/// `max_memory`, `max_timeout`.
impl From<&TenantLimits> for InstallCaps {
    fn from(l: &TenantLimits) -> InstallCaps {
        InstallCaps {
            cpus: l.max_cpus,
            memory_bytes: l.max_memory,
            timeout: l.max_timeout,
        }
    }
}

impl ServeConfig {
    /// `serve`'s configuration with every named default, for a single local tenant keeping
    /// its data under `data_dir`: what `serve` resolves to with no flag and no variable (a
    /// test of the binary compares the two), without the host's facts (CA bundle, package
    /// indexes, `HOME`). The MCP tests start their servers from it.
    pub fn local(data_dir: PathBuf) -> ServeConfig {
        use crate::app::settings::defaults as app;
        use crate::config::{self, defaults, preload};
        let limits = Limits::default();
        ServeConfig {
            stdio: false,
            http: HttpConfig {
                host: mcp::defaults::HOST.into(),
                port: mcp::defaults::PORT,
                allowed_hosts: mcp::defaults::ALLOWED_HOSTS.map(String::from).to_vec(),
                allowed_origins: Vec::new(),
                metrics: true,
                bounds: config::HttpBounds::default(),
                oauth: config::serve::OAuthConfig::default(),
                cluster: config::serve::ClusterConfig::default(),
            },
            max_timeout: app::MAX_TIMEOUT,
            task_ttl: app::TASK_TTL,
            task_result_bytes: app::TASK_RESULT_BYTES,
            max_concurrent: app::MAX_CONCURRENT,
            max_queue: app::MAX_QUEUE,
            tenant: defaults::TENANT.into(),
            tenants_file: None,
            tools_file: None,
            egress_file: None,
            traces: Default::default(),
            code_storage_dir: crate::storage::default_dir(&data_dir),
            workspace_dir: data_dir.join("workspaces"),
            shared_workspace: false,
            storage_limit: Some(app::STORAGE_BYTES),
            storage_limit_total: Some(defaults::STORAGE_LIMIT_TOTAL),
            code_max_age: Some(app::CODE_MAX_AGE),
            memory_budget: Some(MEMORY_BUDGET_TIMES * limits.memory_bytes),
            sessions: config::SessionLimits {
                idle: app::SESSION_IDLE,
                max_lifetime: app::SESSION_MAX_LIFETIME,
                max_sessions: app::MAX_SESSIONS,
            },
            env: config::EnvSelection::default(),
            ca_bundle: None,
            pip_index: config::PipIndex::default(),
            backend: BackendConfig {
                kind: BackendKind::default(),
                image: None,
                runtime: None,
                docker_host: None,
                pool_size: defaults::POOL_SIZE,
                build_missing: true,
                data_dir: Some(data_dir.clone()),
                kubernetes: config::KubeSettings::default(),
                preload: preload::PreloadConfig::server_default(),
            },
            host: config::HostEnv::default(),
            limits,
            data_dir,
            allow_unsafe: false,
        }
    }
}

/// The default memory budget of a tenant: this many times the memory of one run.
pub const MEMORY_BUDGET_TIMES: u64 = 8;

/// The HTTP options the configuration's defaults give are the transports' own defaults
/// (body size, allowed hosts): one set of defaults, whichever way a server is made.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_http_options_keep_the_transports_defaults() {
        let cfg = ServeConfig::local(std::path::PathBuf::from("/nonexistent"));
        let opts = HttpOptions::from(&cfg.http);
        let default = HttpOptions::default();
        assert_eq!(opts.allowed_hosts, default.allowed_hosts);
        assert_eq!(opts.max_body_bytes, default.max_body_bytes);
        assert_eq!(opts.metrics, default.metrics);
        let settings = Settings::from(&cfg);
        assert_eq!(settings.limits, cfg.limits);
        assert_eq!(settings.sessions.workspace_root, cfg.workspace_dir);
        assert_eq!(settings.quota.memory_budget, cfg.memory_budget);
    }

    #[test]
    fn the_healthcheck_url_is_the_default_address() {
        assert_eq!(
            crate::config::defaults::HEALTHCHECK_URL,
            format!(
                "http://{}:{}/healthz",
                mcp::defaults::HOST,
                mcp::defaults::PORT
            )
        );
    }
}
