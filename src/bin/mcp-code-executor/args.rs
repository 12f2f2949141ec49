//! The command line: every subcommand, flag and the environment variable behind it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mcp_code_executor::backend::image;
use mcp_code_executor::config::serve::http_bounds;
use mcp_code_executor::config::{self, vars, Bytes, Secs};
use mcp_code_executor::job::defaults;

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
    /// Usage by day, tenant and principal, as JSON: runs, outcomes, wall and CPU seconds,
    /// memory held x time, peak memory, output bytes, figures (what every replica sharing
    /// the data directory recorded; docs/hosting.md "Usage").
    Usage {
        /// The data directory the servers use (default: MCP_EXECUTOR_DATA_DIR, else the
        /// default data directory).
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// Only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// First day, YYYY-MM-DD (UTC).
        #[arg(long)]
        from: Option<String>,
        /// Last day, YYYY-MM-DD (UTC).
        #[arg(long)]
        to: Option<String>,
    },
    /// Serve the MCP tools: over stdio (`--stdio`) or HTTP (Streamable HTTP at /mcp, legacy
    /// SSE at /sse). Reads a `.env` file in the working directory if there is one.
    Serve(Box<ServeCmd>),
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
            data_dir: None,
            kubernetes: config::KubeSettings {
                kubeconfig: self.kubeconfig.clone(),
                namespace: self.kube_namespace.clone().filter(|n| !n.trim().is_empty()),
                env_volume: self
                    .kube_env_volume
                    .clone()
                    .filter(|n| !n.trim().is_empty()),
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
    /// The egress policy file (TOML, see docs/egress.md): the hosts and ports the files
    /// may reach through this command's proxy (`HTTP_PROXY` / `HTTPS_PROXY` in the
    /// sandbox), default deny; unset: no network.
    #[arg(long, env = vars::MCP_EXECUTOR_EGRESS)]
    pub egress: Option<PathBuf>,
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

mod serve;
#[cfg(test)]
mod tests;

pub use serve::ServeCmd;
