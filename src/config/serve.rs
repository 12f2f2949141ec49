//! `serve`'s configuration: one plain value, resolved once at start-up from flags,
//! environment variables, `.env` and named defaults (in that order: clap reads a flag's
//! variable when the flag is absent, `.env` only fills in unset variables), then handed to
//! whatever builds the server. Nothing downstream looks at the process environment again.
//!
//! It is plain data on purpose: no handles, no backend or MCP types, so that it can be
//! built and checked in a unit test, printed, and read by every layer. Every field is
//! resolved (defaults applied, relative paths left as given); [`ServeConfig::check`] refuses
//! combinations that cannot work, naming the flags at fault.

use std::path::PathBuf;
use std::time::Duration;

use super::{validate_limits, ConfigError, EnvSelection, PipIndex};
use crate::job::Limits;

/// Everything `serve` is configured with.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// One client over stdin/stdout instead of HTTP (`--stdio`).
    pub stdio: bool,
    /// The HTTP transports (unused with `stdio`).
    pub http: HttpConfig,
    /// Limits of each run; `timeout` is the default a call gets.
    pub limits: Limits,
    /// The highest timeout a call may ask for.
    pub max_timeout: Duration,
    /// Run slots over all tenants.
    pub max_concurrent: usize,
    /// Calls of one tenant that may wait for a run slot.
    pub max_queue: usize,
    /// Without a tenants file: the one tenant's id (label of the containers).
    pub tenant: String,
    /// The tenants file (TOML); `None`: one local tenant, no authentication.
    pub tenants_file: Option<PathBuf>,
    /// Managed environments, installs' scratch space and the copy of the CA bundle.
    pub data_dir: PathBuf,
    /// Stored code (`code/` under the data directory unless given).
    pub code_storage_dir: PathBuf,
    /// The workspaces (`workspaces/` under the data directory unless given).
    pub workspace_dir: PathBuf,
    /// One workspace per tenant, shared by its MCP sessions and kept.
    pub shared_workspace: bool,
    /// execute_python sessions.
    pub sessions: SessionLimits,
    /// The Python environment asked for (`None` fields: the managed default).
    pub env: EnvSelection,
    /// The CA bundle installs trust (`None`: none beyond the image's).
    pub ca_bundle: Option<PathBuf>,
    /// The package indexes installs fetch from.
    pub pip_index: PipIndex,
    /// Where sandboxes come from.
    pub backend: BackendConfig,
    /// Host facts environments are resolved with (`HOME`, `CONDA_EXE`, `PATH`).
    pub host: super::HostEnv,
    /// Serve even when the isolation self-test fails.
    pub allow_unsafe: bool,
}

/// The HTTP transports: where to listen and whom to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    pub host: String,
    pub port: u16,
    /// Accepted `Host` header values; empty: any (`--allowed-hosts '*'`).
    pub allowed_hosts: Vec<String>,
    /// Accepted browser `Origin` values besides the default ones (`*`: any).
    pub allowed_origins: Vec<String>,
    /// Serve Prometheus metrics at `/metrics`.
    pub metrics: bool,
}

/// How long execute_python sessions live, and how many at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub idle: Duration,
    pub max_lifetime: Duration,
    pub max_sessions: usize,
}

/// Which sandbox backend runs the code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// A hardened container per run on a Docker daemon.
    #[default]
    Docker,
}

impl BackendKind {
    /// Every backend, by the name `--backend` takes.
    pub const ALL: &'static [(&'static str, BackendKind)] = &[("docker", BackendKind::Docker)];

    /// The backend named `name`, or what the choices are.
    pub fn parse(name: &str) -> Result<BackendKind, String> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.trim()))
            .map(|(_, k)| *k)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!(
                    "`{name}` is not a backend; choose one of: {}",
                    names.join(", ")
                )
            })
    }
}

/// The sandbox backend's settings, in words every backend understands (Docker today).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// Which backend.
    pub kind: BackendKind,
    /// The sandbox image; `None`: the tag that matches this binary.
    pub image: Option<String>,
    /// OCI runtime; `None`: the daemon's default.
    pub runtime: Option<String>,
    /// The Docker daemon (`DOCKER_HOST`); `None`: the local socket.
    pub docker_host: Option<String>,
    /// Sandboxes kept started and waiting (0: no warm pool).
    pub pool_size: usize,
    /// Build the image when it is missing (`--no-build` turns it off).
    pub build_missing: bool,
    /// What waiting sandboxes import before their job (`serve --preload`; off elsewhere).
    pub preload: crate::backend::preload::PreloadConfig,
}

impl ServeConfig {
    /// Refuse what cannot work: limits out of range, a default timeout above the highest
    /// one, a tenants file over stdio (one client, no tokens).
    pub fn check(&self) -> Result<(), ConfigError> {
        validate_limits(&self.limits)?;
        if self.max_timeout < self.limits.timeout {
            return Err(ConfigError::TimeoutAboveMax {
                timeout: self.limits.timeout,
                max: self.max_timeout,
            });
        }
        if self.stdio && self.tenants_file.is_some() {
            return Err(ConfigError::TenantsOverStdio);
        }
        Ok(())
    }
}

/// `--allowed-hosts` as the HTTP layer takes it: `*` anywhere means any host (empty list).
pub fn allowed_hosts(given: &[String]) -> Vec<String> {
    if given.iter().any(|h| h.trim() == "*") {
        Vec::new()
    } else {
        given.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ServeConfig {
        ServeConfig {
            stdio: false,
            http: HttpConfig {
                host: "127.0.0.1".into(),
                port: 4000,
                allowed_hosts: allowed_hosts(&["localhost".into()]),
                allowed_origins: Vec::new(),
                metrics: true,
            },
            limits: Limits::default(),
            max_timeout: Duration::from_secs(300),
            max_concurrent: 4,
            max_queue: 256,
            tenant: crate::job::LOCAL_TENANT.into(),
            tenants_file: None,
            data_dir: "/d".into(),
            code_storage_dir: "/d/code".into(),
            workspace_dir: "/d/workspaces".into(),
            shared_workspace: false,
            sessions: SessionLimits {
                idle: Duration::from_secs(600),
                max_lifetime: Duration::from_secs(3600),
                max_sessions: 16,
            },
            env: EnvSelection::default(),
            ca_bundle: None,
            pip_index: PipIndex::default(),
            backend: BackendConfig {
                kind: BackendKind::Docker,
                image: None,
                runtime: None,
                docker_host: None,
                pool_size: 2,
                build_missing: true,
                preload: Default::default(),
            },
            host: Default::default(),
            allow_unsafe: false,
        }
    }

    #[test]
    fn check_names_the_flags_at_fault() {
        assert_eq!(sample().check(), Ok(()));
        let c = ServeConfig {
            max_timeout: Duration::from_secs(10),
            ..sample()
        };
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("--max-timeout") && e.contains("--timeout"),
            "{e}"
        );
        let c = ServeConfig {
            stdio: true,
            tenants_file: Some("t.toml".into()),
            ..sample()
        };
        assert_eq!(c.check(), Err(ConfigError::TenantsOverStdio));
        let mut c = sample();
        c.limits.memory_bytes = 1;
        assert!(c.check().unwrap_err().to_string().contains("memory"));
    }

    #[test]
    fn a_star_allows_any_host() {
        assert!(allowed_hosts(&["localhost".into(), " * ".into()]).is_empty());
        assert_eq!(allowed_hosts(&["a".into()]), ["a"]);
    }
}
