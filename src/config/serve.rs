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
    /// How long a finished MCP task's result is kept at least (the least TTL of a task).
    pub task_ttl: Duration,
    /// Bytes of results a tenant's kept MCP tasks may hold.
    pub task_result_bytes: u64,
    /// Run slots over all tenants.
    pub max_concurrent: usize,
    /// Calls of one tenant that may wait for a run slot.
    pub max_queue: usize,
    /// Without a tenants file: the one tenant's id (label of the containers).
    pub tenant: String,
    /// The tenants file (TOML); `None`: one local tenant, no authentication.
    pub tenants_file: Option<PathBuf>,
    /// Code mode's tools file (TOML); `None`: the code can call no other MCP server.
    pub tools_file: Option<PathBuf>,
    /// The egress policy file (TOML, docs/egress.md); `None`: no egress, the sandboxes
    /// have no network at all.
    pub egress_file: Option<PathBuf>,
    /// Traces (OpenTelemetry, OTLP): off unless an endpoint is configured.
    pub traces: super::traces::TraceConfig,
    /// Managed environments, installs' scratch space and the copy of the CA bundle.
    pub data_dir: PathBuf,
    /// Stored code (`code/` under the data directory unless given).
    pub code_storage_dir: PathBuf,
    /// The workspaces (`workspaces/` under the data directory unless given).
    pub workspace_dir: PathBuf,
    /// One workspace per tenant, shared by its MCP sessions and kept.
    pub shared_workspace: bool,
    /// Bytes of stored code and workspace files each tenant may keep (`None`: unlimited).
    pub storage_limit: Option<u64>,
    /// Bytes of stored code and workspace files of every tenant together (`None`: unlimited).
    pub storage_limit_total: Option<u64>,
    /// Stored code untouched this long is removed (`None`: kept forever).
    pub code_max_age: Option<Duration>,
    /// Memory all of a tenant's sandboxes may hold at once, sessions included (`None`:
    /// unlimited).
    pub memory_budget: Option<u64>,
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
    /// Caps on connections, streams, protocol sessions and unread results.
    pub bounds: HttpBounds,
    /// Sign-in with OAuth (docs/hosting.md "Sign-in with OAuth").
    pub oauth: OAuthConfig,
    /// More than one replica: peers, their shared secret, draining (docs/hosting.md "Scale").
    pub cluster: ClusterConfig,
}

/// More than one replica behind a balancer without affinity (`crate::cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `--peers`: every replica's internal address (`http://HOST:PORT`, or
    /// `dns+http://NAME:PORT` for every address a name resolves to); empty: one replica.
    pub peers: Vec<String>,
    /// `--cluster-secret`: what replicas show each other on forwarded requests.
    pub secret: Option<String>,
    /// `--drain-grace`: after SIGTERM, how long runs in progress may take to finish
    /// (`None`: [`DRAIN_GRACE`] with peers, none for a server alone, which stops at once).
    pub drain_grace: Option<Duration>,
    /// `--sweep-every`: how often leftovers of dead servers are swept.
    pub sweep_every: Duration,
}

/// After SIGTERM, how long the runs in progress of a replica with peers get to finish
/// (within the shutdown's 25 s).
pub const DRAIN_GRACE: Duration = Duration::from_secs(12);
/// How often `serve` sweeps what dead servers left on the backend.
pub const SWEEP_EVERY: Duration = Duration::from_secs(600);

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            peers: Vec::new(),
            secret: None,
            drain_grace: None,
            sweep_every: SWEEP_EVERY,
        }
    }
}

/// OAuth sign-in: off unless issuers are given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthConfig {
    /// `--public-url`.
    pub public_url: Option<String>,
    /// `--oauth-issuer`.
    pub issuers: Vec<String>,
    /// `--oauth-scope`.
    pub scope: String,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        OAuthConfig {
            public_url: None,
            issuers: Vec::new(),
            scope: super::defaults::OAUTH_SCOPE.into(),
        }
    }
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
    /// A hardened pod per run on a Kubernetes cluster (the `kubernetes` cargo feature).
    Kubernetes,
}

impl std::fmt::Display for BackendKind {
    /// The name `--backend` takes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = Self::ALL
            .iter()
            .find(|(_, k)| k == self)
            .map_or("?", |(n, _)| n);
        f.write_str(name)
    }
}

impl BackendKind {
    /// Every backend, by the name `--backend` takes.
    pub const ALL: &'static [(&'static str, BackendKind)] = &[
        ("docker", BackendKind::Docker),
        ("kubernetes", BackendKind::Kubernetes),
    ];

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
    /// The server's data directory: a Kubernetes pod mounts it from the environment
    /// volume; Docker sandboxes get their `/etc/hosts` from a file there. `None` (the
    /// commands other than `serve`): the default one.
    pub data_dir: Option<PathBuf>,
    /// The Kubernetes backend's settings (unused by Docker).
    pub kubernetes: KubeSettings,
    /// What waiting sandboxes import before their job (`serve --preload`; off elsewhere).
    pub preload: super::preload::PreloadConfig,
}

/// Settings only the Kubernetes backend reads; the image, the runtime (its
/// `runtimeClassName`) and the pool size are [`BackendConfig`]'s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeSettings {
    /// `--kubeconfig`; `None`: in-cluster, `KUBECONFIG`, `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-namespace`; `None`: the kubeconfig context's.
    pub namespace: Option<String>,
    /// `--kube-env-volume`: the PVC that holds the data directory (mounted at
    /// [`BackendConfig::data_dir`]).
    pub env_volume: Option<String>,
    /// The server's own pod (downward API): `(namespace, name, uid)`.
    pub own_pod: Option<(String, String, String)>,
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
        if let Some(budget) = self.memory_budget.filter(|b| *b < self.limits.memory_bytes) {
            return Err(ConfigError::MemoryBudgetBelowRun {
                budget,
                memory: self.limits.memory_bytes,
            });
        }
        if self.stdio && self.tenants_file.is_some() {
            return Err(ConfigError::TenantsOverStdio);
        }
        let oauth = &self.http.oauth;
        if !oauth.issuers.is_empty() && (self.tenants_file.is_none() || oauth.public_url.is_none())
        {
            return Err(ConfigError::OutOfRange {
                what: "--oauth-issuer",
                rule: "given with --public-url and --tenants (whose [[oauth_rules]] map tokens to tenants)",
                value: oauth.issuers.join(","),
            });
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
                bounds: HttpBounds::default(),
                oauth: OAuthConfig::default(),
                cluster: ClusterConfig::default(),
            },
            limits: Limits::default(),
            max_timeout: Duration::from_secs(300),
            task_ttl: Duration::from_secs(900),
            task_result_bytes: crate::app::settings::defaults::TASK_RESULT_BYTES,
            max_concurrent: 4,
            max_queue: 256,
            tenant: crate::job::LOCAL_TENANT.into(),
            tenants_file: None,
            tools_file: None,
            egress_file: None,
            traces: Default::default(),
            data_dir: "/d".into(),
            code_storage_dir: "/d/code".into(),
            workspace_dir: "/d/workspaces".into(),
            shared_workspace: false,
            storage_limit: Some(1 << 30),
            storage_limit_total: Some(10 << 30),
            code_max_age: None,
            memory_budget: Some(8 * (512 << 20)),
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
                data_dir: None,
                kubernetes: KubeSettings::default(),
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
        let c2 = ServeConfig {
            memory_budget: Some(1 << 20),
            ..sample()
        };
        let e = c2.check().unwrap_err().to_string();
        assert!(
            e.contains("--memory-budget") && e.contains("--memory"),
            "{e}"
        );
        let e = c.check().unwrap_err().to_string();
        assert!(
            e.contains("--max-timeout") && e.contains("--timeout"),
            "{e}"
        );
        let c = ServeConfig {
            stdio: true,
            tenants_file: Some("t.toml".into()),
            tools_file: None,
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

/// The bounds of the HTTP front (`mcp::transports::bounds`). Defaults suit a 2-core machine with a few GiB to spare;
/// each has a flag and a variable (docs/mcp.md, "Bounds").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpBounds {
    /// Connections serving MCP (and health) at once; further ones go to the health reserve.
    pub max_connections: usize,
    /// Connections beyond `max_connections` that only answer `/healthz`, `/readyz` and
    /// `/metrics` (others get 503); beyond these, new connections are closed at once.
    pub health_connections: usize,
    /// Open MCP responses (requests in flight, SSE streams) in all.
    pub max_streams: usize,
    /// Open MCP responses of one tenant.
    pub max_streams_per_tenant: usize,
    /// Time to send a request's headers (also how long an idle keep-alive connection stays).
    pub header_timeout: Duration,
    /// Time to send a request's body.
    pub body_timeout: Duration,
    /// Result bytes waiting for clients to read them, in all.
    pub max_buffered_bytes: u64,
    /// Result bytes waiting for one tenant's clients.
    pub max_buffered_per_tenant: u64,
    /// Result bytes waiting for one protocol session.
    pub max_buffered_per_session: u64,
    /// A client with result bytes waiting that reads none of them for this long is
    /// disconnected.
    pub stall_timeout: Duration,
    /// Streamable HTTP protocol sessions open at once, in all.
    pub max_sessions: usize,
    /// Streamable HTTP protocol sessions open at once, per tenant.
    pub max_sessions_per_tenant: usize,
    /// A protocol session with no request for this long is closed.
    pub session_idle: Duration,
}

impl Default for HttpBounds {
    fn default() -> Self {
        HttpBounds {
            max_connections: http_bounds::MAX_CONNECTIONS,
            health_connections: http_bounds::HEALTH_CONNECTIONS,
            max_streams: http_bounds::MAX_STREAMS,
            max_streams_per_tenant: http_bounds::MAX_STREAMS_PER_TENANT,
            header_timeout: http_bounds::HEADER_TIMEOUT,
            body_timeout: http_bounds::BODY_TIMEOUT,
            max_buffered_bytes: http_bounds::MAX_BUFFERED_BYTES,
            max_buffered_per_tenant: http_bounds::MAX_BUFFERED_PER_TENANT,
            max_buffered_per_session: http_bounds::MAX_BUFFERED_PER_SESSION,
            stall_timeout: http_bounds::STALL_TIMEOUT,
            max_sessions: http_bounds::MAX_SESSIONS,
            max_sessions_per_tenant: http_bounds::MAX_SESSIONS_PER_TENANT,
            session_idle: http_bounds::SESSION_IDLE,
        }
    }
}

/// The defaults of [`HttpBounds`].
pub mod http_bounds {
    use std::time::Duration;
    pub const MAX_CONNECTIONS: usize = 512;
    pub const HEALTH_CONNECTIONS: usize = 16;
    pub const MAX_STREAMS: usize = 256;
    pub const MAX_STREAMS_PER_TENANT: usize = 64;
    pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
    pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
    pub const MAX_BUFFERED_BYTES: u64 = 256 << 20;
    pub const MAX_BUFFERED_PER_TENANT: u64 = 128 << 20;
    pub const MAX_BUFFERED_PER_SESSION: u64 = 16 << 20;
    pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
    pub const MAX_SESSIONS: usize = 1000;
    pub const MAX_SESSIONS_PER_TENANT: usize = 200;
    pub const SESSION_IDLE: Duration = Duration::from_secs(300);
}
