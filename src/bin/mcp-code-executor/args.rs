//! The command line: every subcommand, flag and the environment variable behind it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mcp_code_executor::app::settings::defaults as settings;
use mcp_code_executor::backend::image;
use mcp_code_executor::config::serve::http_bounds;
use mcp_code_executor::config::{self, vars, Bytes, Secs, ServeConfig};
use mcp_code_executor::job::{defaults, Limits};
use mcp_code_executor::mcp;
use mcp_code_executor::storage;

#[derive(Parser)]
#[command(
    name = "mcp-code-executor",
    version,
    about = "Run untrusted Python in hardened, short-lived Docker containers"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
// Parsed once at start-up: the size of the largest variant does not matter.
pub enum Command {
    /// Run Python files, each in its own sandbox (for CI pipelines). `-` reads stdin.
    Run(RunCmd),
    /// Check Docker, the image, and that isolation is really enforced on this host.
    Doctor(SandboxOpts),
    /// Measure latency and throughput against plain `docker run` in the same run.
    Bench(BenchCmd),
    /// Build or name the sandbox image.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Exit 0 when the server answers 2xx at URL (the container healthcheck of
    /// docker-compose.yml; the server image has no curl).
    Healthcheck {
        #[arg(default_value = config::defaults::HEALTHCHECK_URL)]
        url: String,
    },
    /// Tenants of a hosted server: make tokens.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Serve the MCP tools: over stdio (`--stdio`) or HTTP (Streamable HTTP at /mcp, legacy
    /// SSE at /sse). Reads a `.env` file in the working directory if there is one.
    Serve(Box<ServeCmd>),
}

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
        let data_dir = self
            .data_dir
            .clone()
            .unwrap_or_else(|| config::data_dir(&get));
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
            max_concurrent: self.max_concurrent,
            max_queue: self.max_queue,
            tenant: self.tenant.clone(),
            tenants_file: self.tenants.clone(),
            tools_file: self.tools.clone(),
            code_storage_dir: self
                .code_storage_dir
                .clone()
                .unwrap_or_else(|| storage::default_dir(&data_dir)),
            workspace_dir: self
                .workspace_dir
                .clone()
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
                b.kubernetes.data_dir = Some(data_dir.clone());
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

#[derive(Subcommand)]
pub enum TenantCmd {
    /// Make a new random token and print it with the `[[tenants]]` entry that holds its
    /// SHA-256 (the token itself is shown once and stored nowhere).
    Token {
        /// The tenant id to put in the entry.
        #[arg(default_value = "my-tenant")]
        id: String,
    },
}

#[derive(Args, Clone)]
pub struct SandboxOpts {
    /// Which sandbox backend runs the code: docker, or kubernetes (a pod per run).
    #[arg(long, env = vars::MCP_EXECUTOR_BACKEND, value_parser = config::serve::BackendKind::parse, default_value_t = config::serve::BackendKind::default())]
    pub backend: config::serve::BackendKind,
    /// Sandbox image (default: the tag matching this binary's images/).
    #[arg(long, env = vars::MCP_EXECUTOR_IMAGE)]
    pub image: Option<String>,
    /// OCI runtime for sandboxes (default: the daemon's, runc). `runsc` is the gVisor
    /// isolation tier (set it up with `scripts/setup-docker.sh --gvisor`); any other name
    /// the daemon has registered (crun) works too. Refused at start when the daemon lacks it.
    /// On kubernetes, the pods' runtimeClassName (e.g. gvisor).
    #[arg(long, env = vars::MCP_EXECUTOR_RUNTIME)]
    pub runtime: Option<String>,
    /// kubernetes: the kubeconfig file (default: in-cluster, else KUBECONFIG, else
    /// ~/.kube/config).
    #[arg(long, env = vars::MCP_EXECUTOR_KUBECONFIG, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// kubernetes: the namespace of sandbox pods (default: the kubeconfig context's).
    #[arg(long, env = vars::MCP_EXECUTOR_KUBE_NAMESPACE, value_name = "NS")]
    pub kube_namespace: Option<String>,
    /// kubernetes: the PVC holding the data directory, for environments and installs
    /// (default: none; the image's Python only, installs refused).
    #[arg(long, env = vars::MCP_EXECUTOR_KUBE_ENV_VOLUME, value_name = "CLAIM")]
    pub kube_env_volume: Option<String>,
    /// Fail instead of building the image when it is missing.
    #[arg(long)]
    pub no_build: bool,
}

impl SandboxOpts {
    /// [`config`](Self::config) from the process environment.
    pub fn config_from_process(&self, pool_size: usize) -> config::BackendConfig {
        self.config(pool_size, |k| std::env::var(k).ok())
    }

    /// The backend's configuration with a warm pool of `pool_size` (0: none); `get` gives
    /// what has no flag (`DOCKER_HOST`).
    pub fn config(
        &self,
        pool_size: usize,
        get: impl Fn(&str) -> Option<String>,
    ) -> config::BackendConfig {
        config::BackendConfig {
            kind: self.backend,
            image: self.image.clone(),
            // Empty (compose's `${MCP_EXECUTOR_RUNTIME:-}`): the daemon's default.
            runtime: self.runtime.clone().filter(|r| !r.trim().is_empty()),
            docker_host: get(vars::DOCKER_HOST).filter(|h| !h.trim().is_empty()),
            pool_size,
            build_missing: !self.no_build,
            kubernetes: config::KubeSettings {
                kubeconfig: self.kubeconfig.clone(),
                namespace: self.kube_namespace.clone().filter(|n| !n.trim().is_empty()),
                env_volume: self
                    .kube_env_volume
                    .clone()
                    .filter(|n| !n.trim().is_empty()),
                data_dir: None,
                own_pod: match (
                    get(vars::MCP_EXECUTOR_POD_NAMESPACE),
                    get(vars::MCP_EXECUTOR_POD_NAME),
                    get(vars::MCP_EXECUTOR_POD_UID),
                ) {
                    (Some(ns), Some(name), Some(uid))
                        if !ns.is_empty() && !name.is_empty() && !uid.is_empty() =>
                    {
                        Some((ns, name, uid))
                    }
                    _ => None,
                },
            },
            preload: Default::default(),
        }
    }
}

#[derive(Args)]
pub struct RunCmd {
    /// Python files to run: files, directories (every `*.py` under them, hidden ones
    /// skipped, in path order) and quoted glob patterns (`'tests/**/*.py'`); `-` reads the
    /// code from stdin.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Files run at once (default: the number of CPUs, at most as many as the host's
    /// memory holds at --memory each). A warm pool of this many sandboxes serves them; one
    /// file keeps no pool.
    #[arg(long, short = 'j', value_parser = clap::value_parser!(u16).range(1..=256))]
    pub jobs: Option<u16>,
    /// Start no new file after the first one that fails (running ones finish); the rest
    /// are reported as skipped.
    #[arg(long)]
    pub fail_fast: bool,
    /// Code mode's tools file (TOML, see docs/code-mode.md): MCP servers whose tools the
    /// files call as Python functions (`from tools import NAME`), started by this command.
    #[arg(long, env = vars::MCP_EXECUTOR_TOOLS)]
    pub tools: Option<PathBuf>,
    /// How results are printed: `text` (output, then a status line), `json` (one JSON
    /// outcome per file on stdout) or `github` (output in collapsible groups, failures as
    /// GitHub Actions `::error` annotations at the traceback's line).
    #[arg(long, value_enum, default_value_t = FormatArg::Text)]
    pub format: FormatArg,
    /// Wall-clock limit per file, seconds.
    #[arg(long, env = vars::MCP_EXECUTOR_TIMEOUT, default_value_t = Secs(defaults::TIMEOUT))]
    pub timeout: Secs,
    /// Memory limit per file (swap included), e.g. 512m.
    #[arg(long, env = vars::MCP_EXECUTOR_MEMORY, default_value_t = Bytes(defaults::MEMORY_BYTES))]
    pub memory: Bytes,
    /// CPU quota in cores.
    #[arg(long, env = vars::MCP_EXECUTOR_CPUS, default_value_t = defaults::CPUS)]
    pub cpus: f64,
    /// Processes and threads per sandbox.
    #[arg(long, env = vars::MCP_EXECUTOR_PIDS, default_value_t = defaults::PIDS)]
    pub pids: i64,
    /// Bytes kept of stdout and of stderr, each; the rest is dropped and flagged.
    #[arg(long, env = vars::MCP_EXECUTOR_OUTPUT_LIMIT, default_value_t = Bytes(defaults::OUTPUT_BYTES))]
    pub output_limit: Bytes,
    /// Size of the /workspace tmpfs.
    #[arg(long, env = vars::MCP_EXECUTOR_WORKSPACE_SIZE, default_value_t = Bytes(defaults::WORKSPACE_BYTES))]
    pub workspace_size: Bytes,
    /// Same as `--format json`.
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Write a JUnit XML report, one test case per file.
    #[arg(long, value_name = "PATH")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

/// `run --format`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum FormatArg {
    Text,
    Json,
    Github,
}

#[derive(Args)]
pub struct BenchCmd {
    /// Sequential samples per latency row.
    #[arg(long, default_value_t = 30)]
    pub samples: usize,
    /// Warm pool size for the pool-on rows.
    #[arg(long, default_value_t = 4)]
    pub pool_size: usize,
    /// Runs per throughput row.
    #[arg(long, default_value_t = 60)]
    pub throughput_runs: usize,
    /// Concurrency levels of the throughput rows.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 8])]
    pub concurrency: Vec<usize>,
    /// Concurrent calls in the burst.
    #[arg(long, default_value_t = 100)]
    pub burst: usize,
    /// Only the fairness rows (a quiet tenant's latency while a noisy one floods).
    #[arg(long)]
    pub fairness_only: bool,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Build the sandbox image through the Docker API (pulls its base, or bootstraps it offline).
    Build {
        /// Extra CA bundle (PEM) to trust during the build, for TLS-intercepting proxies.
        #[arg(long, value_name = "PEM")]
        ca_bundle: Option<PathBuf>,
        /// Do not try to pull the base; bootstrap it with debootstrap.
        #[arg(long)]
        offline: bool,
        /// Debian mirror for the offline bootstrap.
        #[arg(long, default_value = image::DEFAULT_MIRROR)]
        mirror: String,
        /// Rebuild even when the image exists.
        #[arg(long)]
        force: bool,
        /// Image tag to build (default: the tag matching this binary).
        #[arg(long, env = vars::MCP_EXECUTOR_IMAGE)]
        image: Option<String>,
    },
    /// Build the server image for docker-compose from this very binary (offline-capable;
    /// online, `docker-compose build` builds from source instead).
    Server {
        /// Tag of the server image (docker-compose.yml uses the default).
        #[arg(long, default_value = image::SERVER_IMAGE)]
        tag: String,
        /// Do not try to pull the base; use (or bootstrap) the offline base.
        #[arg(long)]
        offline: bool,
        /// Debian mirror for the offline bootstrap.
        #[arg(long, default_value = image::DEFAULT_MIRROR)]
        mirror: String,
    },
    /// Print the image tag this binary uses.
    Name,
}

/// `--preload`: the module names, parsed as one value.
#[derive(Debug, Clone)]
pub struct PreloadList(pub Vec<String>);

impl std::fmt::Display for PreloadList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

fn parse_preload(s: &str) -> Result<PreloadList, String> {
    mcp_code_executor::config::preload::parse_modules(s).map(PreloadList)
}

/// The HTTP front's bounds (docs/mcp.md, "Bounds").
#[derive(clap::Args, Debug, Clone)]
pub struct BoundsOpts {
    /// HTTP connections serving MCP at once.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_CONNECTIONS, default_value_t = config::serve::http_bounds::MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Connections beyond --max-connections that answer only /healthz, /readyz, /metrics.
    #[arg(long, env = vars::MCP_EXECUTOR_HEALTH_CONNECTIONS, default_value_t = config::serve::http_bounds::HEALTH_CONNECTIONS)]
    pub health_connections: usize,
    /// Open MCP responses (requests in flight, SSE streams) in all.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_STREAMS, default_value_t = config::serve::http_bounds::MAX_STREAMS)]
    pub max_streams: usize,
    /// Open MCP responses of one tenant.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_STREAMS_PER_TENANT, default_value_t = config::serve::http_bounds::MAX_STREAMS_PER_TENANT)]
    pub max_streams_per_tenant: usize,
    /// Seconds to send a request's headers (and an idle keep-alive connection's life).
    #[arg(long, env = vars::MCP_EXECUTOR_HEADER_TIMEOUT, default_value_t = Secs(http_bounds::HEADER_TIMEOUT))]
    pub header_timeout: Secs,
    /// Seconds to send a request's body.
    #[arg(long, env = vars::MCP_EXECUTOR_BODY_TIMEOUT, default_value_t = Secs(http_bounds::BODY_TIMEOUT))]
    pub body_timeout: Secs,
    /// Result bytes waiting for clients to read them, in all.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_BUFFERED, default_value_t = Bytes(http_bounds::MAX_BUFFERED_BYTES))]
    pub max_buffered: Bytes,
    /// Result bytes waiting for one tenant's clients.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_BUFFERED_PER_TENANT, default_value_t = Bytes(http_bounds::MAX_BUFFERED_PER_TENANT))]
    pub max_buffered_per_tenant: Bytes,
    /// Result bytes waiting for one protocol session.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_BUFFERED_PER_SESSION, default_value_t = Bytes(http_bounds::MAX_BUFFERED_PER_SESSION))]
    pub max_buffered_per_session: Bytes,
    /// Seconds a client with results waiting may read nothing before it is disconnected.
    #[arg(long, env = vars::MCP_EXECUTOR_STALL_TIMEOUT, default_value_t = Secs(http_bounds::STALL_TIMEOUT))]
    pub stall_timeout: Secs,
    /// Streamable HTTP protocol sessions open at once, in all.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_PROTOCOL_SESSIONS, default_value_t = config::serve::http_bounds::MAX_SESSIONS)]
    pub max_protocol_sessions: usize,
    /// Streamable HTTP protocol sessions open at once, per tenant.
    #[arg(long, env = vars::MCP_EXECUTOR_MAX_PROTOCOL_SESSIONS_PER_TENANT, default_value_t = config::serve::http_bounds::MAX_SESSIONS_PER_TENANT)]
    pub max_protocol_sessions_per_tenant: usize,
    /// Seconds without a request after which a protocol session is closed.
    #[arg(long, env = vars::MCP_EXECUTOR_PROTOCOL_SESSION_IDLE, default_value_t = Secs(http_bounds::SESSION_IDLE))]
    pub protocol_session_idle: Secs,
}

impl BoundsOpts {
    pub fn bounds(&self) -> config::HttpBounds {
        config::HttpBounds {
            max_connections: self.max_connections,
            health_connections: self.health_connections,
            max_streams: self.max_streams,
            max_streams_per_tenant: self.max_streams_per_tenant,
            header_timeout: self.header_timeout.0,
            body_timeout: self.body_timeout.0,
            max_buffered_bytes: self.max_buffered.0,
            max_buffered_per_tenant: self.max_buffered_per_tenant.0,
            max_buffered_per_session: self.max_buffered_per_session.0,
            stall_timeout: self.stall_timeout.0,
            max_sessions: self.max_protocol_sessions,
            max_sessions_per_tenant: self.max_protocol_sessions_per_tenant,
            session_idle: self.protocol_session_idle.0,
        }
    }
}

#[cfg(test)]
mod tests;
