//! `serve`'s flags and the configuration they resolve to.

use std::path::PathBuf;

use clap::Args;
use mcp_code_executor::app::settings::defaults as settings;
use mcp_code_executor::config::{self, vars, Bytes, Secs, ServeConfig};
use mcp_code_executor::job::{defaults, Limits};
use mcp_code_executor::mcp;
use mcp_code_executor::storage;

use super::{parse_preload, BoundsOpts, PreloadList, SandboxOpts};

#[derive(Args)]
pub struct ServeCmd {
    /// Serve one client over stdin/stdout instead of HTTP (stdout carries only the protocol).
    #[arg(long)]
    pub stdio: bool,
    /// Address to bind the HTTP server to.
    #[arg(long, env = vars::MCP_EXECUTOR_HOST, default_value = mcp::defaults::HOST)]
    pub host: String,
    /// HTTP port (0 picks a free one).
    #[arg(long, env = vars::PORT, default_value_t = mcp::defaults::PORT)]
    pub port: u16,
    /// Host header values the HTTP transports accept, comma-separated (guards against DNS
    /// rebinding); `*` accepts any.
    #[arg(long, env = vars::MCP_EXECUTOR_ALLOWED_HOSTS, value_delimiter = ',', default_values_t = mcp::defaults::ALLOWED_HOSTS.map(String::from))]
    pub allowed_hosts: Vec<String>,
    /// Browser Origin values the HTTP transports accept besides the default ones,
    /// comma-separated (e.g. `https://app.example.com`, `http://host:*` for any port); `*`
    /// accepts any. By default a request carrying an Origin passes only from http(s)://
    /// localhost, 127.0.0.1 or [::1] (any port) and from the --allowed-hosts names; requests
    /// without Origin (non-browser clients) always pass.
    #[arg(long, env = vars::MCP_EXECUTOR_ALLOWED_ORIGINS, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Directory of stored code (default: $XDG_DATA_HOME/mcp-code-executor/code).
    #[arg(long, env = vars::CODE_STORAGE_DIR)]
    pub code_storage_dir: Option<PathBuf>,
    /// Default wall-clock limit of a run, seconds.
    #[arg(long, env = vars::MCP_EXECUTOR_TIMEOUT, default_value_t = Secs(defaults::TIMEOUT))]
    pub timeout: Secs,
    /// Longest timeout a tool call may ask for, seconds.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_TIMEOUT, default_value_t = Secs(mcp::defaults::MAX_TIMEOUT))]
    pub max_timeout: Secs,
    /// How long a finished MCP task's result stays readable (tasks/get), at least: a task's
    /// TTL is its timeout plus 5 minutes (or plus this, when shorter), and never less than
    /// this (seconds; at least 1).
    #[arg(long, env = vars::MCP_EXECUTOR_TASK_TTL, default_value_t = Secs(settings::TASK_TTL))]
    pub task_ttl: Secs,
    /// Bytes of results the kept MCP tasks of a tenant may hold, all its users together (a
    /// working task counts as a full result, 640 KiB); past it a new task is refused, e.g. 64m.
    #[arg(long, env = vars::MCP_EXECUTOR_TASK_RESULTS_LIMIT, default_value_t = Bytes(settings::TASK_RESULT_BYTES))]
    pub task_results_limit: Bytes,
    /// Memory limit per run (swap included), e.g. 512m.
    #[arg(long, env = vars::MCP_EXECUTOR_MEMORY, default_value_t = Bytes(defaults::MEMORY_BYTES))]
    pub memory: Bytes,
    /// CPU quota per run, in cores.
    #[arg(long, env = vars::MCP_EXECUTOR_CPUS, default_value_t = defaults::CPUS)]
    pub cpus: f64,
    /// Runs at once; further calls wait their turn.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_CONCURRENT, default_value_t = mcp::defaults::MAX_CONCURRENT)]
    pub max_concurrent: usize,
    /// Environment type: conda (with CONDA_ENV_NAME), venv (VENV_PATH), venv-uv
    /// (UV_VENV_PATH); unset: the managed default environment.
    #[arg(long, env = vars::ENV_TYPE)]
    pub env_type: Option<String>,
    /// Where managed environments live.
    #[arg(long, env = vars::MCP_EXECUTOR_DATA_DIR)]
    pub data_dir: Option<PathBuf>,
    /// CA bundle (PEM) that installer containers trust (default: the host's system bundle).
    #[arg(long, env = vars::MCP_EXECUTOR_CA_BUNDLE)]
    pub ca_bundle: Option<PathBuf>,
    /// Sandboxes kept started and waiting for a run (0 turns the warm pool off).
    #[arg(long, env = vars::MCP_EXECUTOR_POOL_SIZE, default_value_t = config::defaults::POOL_SIZE)]
    pub pool_size: usize,
    /// Modules a waiting sandbox imports before its run, comma-separated, each only where
    /// the environment has it (`none`: nothing). See docs/mcp.md "Preloading".
    #[arg(long, env = vars::MCP_EXECUTOR_PRELOAD, value_parser = parse_preload, default_value_t = PreloadList(config::preload::DEFAULT_MODULES.iter().map(|m| m.to_string()).collect()))]
    pub preload: PreloadList,
    /// Learn what to preload from the modules runs import (per tenant and environment);
    /// `false` turns it off.
    #[arg(long, env = vars::MCP_EXECUTOR_PRELOAD_LEARN, default_value_t = true, value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub preload_learn: bool,
    /// Learned modules added to a pool's preload list, at most.
    #[arg(long, env = vars::MCP_EXECUTOR_PRELOAD_LEARN_MAX, default_value_t = mcp_code_executor::config::preload::DEFAULT_LEARN_MAX)]
    pub preload_learn_max: usize,
    /// Percent of a sandbox's memory limit its preloaded interpreter may hold; what goes
    /// past it is dropped for that pool.
    #[arg(long, env = vars::MCP_EXECUTOR_PRELOAD_MEMORY, default_value_t = mcp_code_executor::config::preload::DEFAULT_MEMORY_PERCENT, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub preload_memory: u8,
    /// Label put on this server's containers (`io.mcp-code-executor.tenant`).
    #[arg(long, env = vars::MCP_EXECUTOR_TENANT, default_value = config::defaults::TENANT)]
    pub tenant: String,
    /// Seconds without a call after which an execute_python session is removed.
    #[arg(long, env = vars::MCP_EXECUTOR_SESSION_IDLE, default_value_t = Secs(settings::SESSION_IDLE))]
    pub session_idle: Secs,
    /// Seconds after which an execute_python session is removed, however busy.
    #[arg(long, env = vars::MCP_EXECUTOR_SESSION_MAX_LIFETIME, default_value_t = Secs(settings::SESSION_MAX_LIFETIME))]
    pub session_max_lifetime: Secs,
    /// execute_python sessions alive at once.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_SESSIONS, default_value_t = mcp_code_executor::app::settings::defaults::MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Where the per-tenant workspaces live (default: <data dir>/workspaces).
    #[arg(long, env = vars::MCP_EXECUTOR_WORKSPACE_DIR)]
    pub workspace_dir: Option<PathBuf>,
    /// One workspace per tenant, shared by its MCP sessions and kept across them (default:
    /// one per MCP session, deleted when it ends).
    #[arg(long, env = vars::MCP_EXECUTOR_SHARED_WORKSPACE)]
    pub shared_workspace: bool,
    /// Bytes of stored code and workspace files each tenant may keep (a tenant's own
    /// `storage_limit` may lower it); 0: unlimited.
    #[arg(long, env = vars::MCP_EXECUTOR_STORAGE_LIMIT, default_value_t = Bytes(settings::STORAGE_BYTES))]
    pub storage_limit: Bytes,
    /// Bytes of stored code and workspace files of every tenant together; 0: unlimited.
    #[arg(long, env = vars::MCP_EXECUTOR_STORAGE_LIMIT_TOTAL, default_value_t = Bytes(config::defaults::STORAGE_LIMIT_TOTAL))]
    pub storage_limit_total: Bytes,
    /// Memory all of a tenant's sandboxes may hold at once: its runs, probes, installs and
    /// open execute_python sessions (paused between cells or not). A run that does not fit
    /// waits for the tenant's runs to end; one that its open sessions leave no room for is
    /// refused. Default: 8 x --memory; 0: unlimited; a tenant's `memory_budget` may lower it.
    #[arg(long, env = vars::MCP_EXECUTOR_MEMORY_BUDGET, value_parser = config::parse_size)]
    pub memory_budget: Option<u64>,
    /// Stored code files not modified for this long are removed (seconds; default 30 days).
    #[arg(long, env = vars::MCP_EXECUTOR_CODE_MAX_AGE, default_value_t = Secs(settings::CODE_MAX_AGE))]
    pub code_max_age: Secs,
    /// Tenants file (TOML, see docs/hosting.md): each tenant's token hash and limits.
    /// With it, the HTTP transports require `Authorization: Bearer <token>`; without it the
    /// server has one tenant (`--tenant`) and no authentication.
    #[arg(long, env = vars::MCP_EXECUTOR_TENANTS)]
    pub tenants: Option<PathBuf>,
    /// Code mode's tools file (TOML, see docs/code-mode.md): MCP servers whose tools the
    /// sandboxed code calls as Python functions (`from tools import NAME`).
    #[arg(long, env = vars::MCP_EXECUTOR_TOOLS)]
    pub tools: Option<PathBuf>,
    /// The egress policy file (TOML, see docs/egress.md): the hosts and ports sandboxed
    /// code may reach through this server, default deny. Checked at start-up; the code
    /// gets the proxy as `HTTP_PROXY` / `HTTPS_PROXY` (#41).
    #[arg(long, env = vars::MCP_EXECUTOR_EGRESS)]
    pub egress: Option<PathBuf>,
    /// Traces: the OTLP/HTTP collector's base URL (`/v1/traces` is appended), e.g.
    /// `http://127.0.0.1:4318`. Unset: no traces. The other `OTEL_*` variables of
    /// docs/hosting.md "Traces" apply.
    #[arg(long, env = vars::OTEL_EXPORTER_OTLP_ENDPOINT)]
    pub otlp_endpoint: Option<String>,
    /// Calls of one tenant that may wait for a run slot; further calls are refused with a
    /// retry hint.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_QUEUE, default_value_t = mcp::defaults::MAX_QUEUE)]
    pub max_queue: usize,
    /// Serve Prometheus metrics at /metrics (open without a token); `false` turns it off.
    #[arg(long, env = vars::MCP_EXECUTOR_METRICS, default_value_t = true, value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub metrics: bool,
    /// The server's public URL, an origin (e.g. https://mcp.example.com): OAuth's resource
    /// identifiers (it, it/mcp, it/sse) and metadata URLs are made from it.
    #[arg(long, env = vars::MCP_EXECUTOR_PUBLIC_URL)]
    pub public_url: Option<String>,
    /// OAuth issuers whose JWT access tokens are accepted, comma-separated, each exactly as
    /// its tokens' `iss` (needs --public-url and a tenants file with [[oauth_rules]]).
    #[arg(long, env = vars::MCP_EXECUTOR_OAUTH_ISSUERS, value_delimiter = ',')]
    pub oauth_issuer: Vec<String>,
    /// The scope an OAuth access token must carry.
    #[arg(long, env = vars::MCP_EXECUTOR_OAUTH_SCOPE, default_value = config::defaults::OAUTH_SCOPE)]
    pub oauth_scope: String,
    /// Every replica's internal address, comma-separated (`http://HOST:PORT`, or
    /// `dns+http://NAME:PORT` for all addresses of a name): calls on another replica's
    /// handles are forwarded to it (docs/hosting.md "Scale").
    #[arg(long, env = vars::MCP_EXECUTOR_PEERS, value_delimiter = ',')]
    pub peers: Vec<String>,
    /// The secret replicas show each other on forwarded requests (needed with --peers).
    #[arg(long, env = vars::MCP_EXECUTOR_CLUSTER_SECRET, hide_env_values = true)]
    pub cluster_secret: Option<String>,
    /// After SIGTERM: seconds runs in progress get to finish (readiness says 503 at once).
    /// Default: 12 with --peers, 0 for a server alone.
    #[arg(long, env = vars::MCP_EXECUTOR_DRAIN_GRACE)]
    pub drain_grace: Option<Secs>,
    /// Seconds between sweeps of sandboxes that dead servers left behind.
    #[arg(long, env = vars::MCP_EXECUTOR_SWEEP_EVERY, default_value_t = Secs(config::serve::SWEEP_EVERY))]
    pub sweep_every: Secs,
    #[command(flatten)]
    pub bounds: BoundsOpts,
    /// Serve even when the isolation self-test fails. Dangerous: untrusted code may then
    /// reach the host or the network.
    #[arg(long)]
    pub allow_unsafe: bool,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

impl ServeCmd {
    /// The configuration of `serve`, resolved once: what clap parsed (flag, else its
    /// variable, else `.env`, else the default), and, for what has no flag, `get` (a
    /// variable's value: `std::env::var` at the binary's edge, a table in tests).
    pub fn config(
        &self,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<ServeConfig, config::ConfigError> {
        // Absolute: what lies under it is bind-mounted into sandboxes, and Docker refuses a
        // relative source (`--data-dir meas/d1` failed the isolation self-test).
        let data_dir = absolute(
            self.data_dir
                .clone()
                .unwrap_or_else(|| config::data_dir(&get)),
        );
        let mut env = config::EnvSelection::from_vars(&get);
        env.env_type = self.env_type.clone().filter(|t| !t.trim().is_empty());
        let cfg = ServeConfig {
            stdio: self.stdio,
            http: config::HttpConfig {
                host: self.host.clone(),
                port: self.port,
                allowed_hosts: config::serve::allowed_hosts(&self.allowed_hosts),
                allowed_origins: self.allowed_origins.clone(),
                metrics: self.metrics,
                bounds: self.bounds.bounds(),
                oauth: config::serve::OAuthConfig {
                    public_url: self.public_url.clone().filter(|u| !u.trim().is_empty()),
                    issuers: self
                        .oauth_issuer
                        .iter()
                        .map(|i| i.trim().to_string())
                        .filter(|i| !i.is_empty())
                        .collect(),
                    scope: self.oauth_scope.clone(),
                },
                cluster: config::serve::ClusterConfig {
                    peers: self
                        .peers
                        .iter()
                        .map(|p| p.trim().to_string())
                        .filter(|p| !p.is_empty())
                        .collect(),
                    secret: self.cluster_secret.clone().filter(|s| !s.is_empty()),
                    drain_grace: self.drain_grace.as_ref().map(|s| s.0),
                    sweep_every: self.sweep_every.0,
                },
            },
            limits: Limits {
                timeout: self.timeout.0,
                memory_bytes: self.memory.0,
                cpus: self.cpus,
                ..Limits::default()
            },
            max_timeout: self.max_timeout.0,
            task_ttl: self.task_ttl.0.max(std::time::Duration::from_secs(1)),
            task_result_bytes: self.task_results_limit.0,
            max_concurrent: self.max_concurrent,
            max_queue: self.max_queue,
            tenant: self.tenant.clone(),
            tenants_file: self.tenants.clone(),
            tools_file: self.tools.clone(),
            egress_file: self.egress.clone(),
            traces: config::traces::TraceConfig::from_vars(self.otlp_endpoint.as_deref(), &get),
            code_storage_dir: self
                .code_storage_dir
                .clone()
                .map(absolute)
                .unwrap_or_else(|| storage::default_dir(&data_dir)),
            workspace_dir: self
                .workspace_dir
                .clone()
                .map(absolute)
                .unwrap_or_else(|| data_dir.join("workspaces")),
            shared_workspace: self.shared_workspace,
            storage_limit: (self.storage_limit.0 > 0).then_some(self.storage_limit.0),
            storage_limit_total: (self.storage_limit_total.0 > 0)
                .then_some(self.storage_limit_total.0),
            code_max_age: (!self.code_max_age.0.is_zero()).then_some(self.code_max_age.0),
            memory_budget: match self.memory_budget {
                None => {
                    Some(mcp_code_executor::server::settings::MEMORY_BUDGET_TIMES * self.memory.0)
                }
                Some(0) => None,
                Some(b) => Some(b),
            },
            sessions: config::SessionLimits {
                idle: self.session_idle.0,
                max_lifetime: self.session_max_lifetime.0,
                max_sessions: self.max_sessions,
            },
            env,
            ca_bundle: self.ca_bundle.clone().or_else(|| config::ca_bundle(&get)),
            pip_index: config::PipIndex::from_vars(&get),
            backend: {
                let mut b = self.sandbox.config(self.pool_size, &get);
                b.data_dir = Some(data_dir.clone());
                b.preload = mcp_code_executor::config::preload::PreloadConfig {
                    modules: self.preload.0.clone(),
                    per_tenant: Default::default(),
                    learn: self.preload_learn,
                    learn_max: self.preload_learn_max,
                    memory_percent: self.preload_memory,
                };
                b
            },
            host: config::HostEnv::from_vars(&get),
            data_dir,
            allow_unsafe: self.allow_unsafe,
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// [`config`](Self::config) from the process environment (after `.env`), warning about
    /// `MCP_EXECUTOR_*` variables nothing reads (a typo is otherwise silently ignored).
    pub fn config_from_process(&self) -> Result<ServeConfig, config::ConfigError> {
        let names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .collect();
        for name in vars::unknown(names.iter().map(String::as_str)) {
            tracing::warn!(variable = %name, "unknown variable ignored (see docs/mcp.md for the ones read)");
        }
        self.config(|k| std::env::var(k).ok())
    }
}

/// `path` made absolute against the current directory (as given when that fails).
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}
