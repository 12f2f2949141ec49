//! The command line: every subcommand, flag and the environment variable behind it.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use mcp_code_executor::backend::image;
use mcp_code_executor::config::{self, vars};
use mcp_code_executor::job::defaults;
use mcp_code_executor::mcp;

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
        #[arg(default_value = "http://127.0.0.1:4000/healthz")]
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
    #[arg(long, env = mcp::vars::HOST, default_value = mcp::defaults::HOST)]
    pub host: String,
    /// HTTP port (0 picks a free one).
    #[arg(long, env = mcp::vars::PORT, default_value_t = mcp::defaults::PORT)]
    pub port: u16,
    /// Host header values the HTTP transports accept, comma-separated (guards against DNS
    /// rebinding); `*` accepts any.
    #[arg(long, env = mcp::vars::ALLOWED_HOSTS, value_delimiter = ',', default_value = "localhost,127.0.0.1,::1")]
    pub allowed_hosts: Vec<String>,
    /// Browser Origin values the HTTP transports accept besides the default ones,
    /// comma-separated (e.g. `https://app.example.com`, `http://host:*` for any port); `*`
    /// accepts any. By default a request carrying an Origin passes only from http(s)://
    /// localhost, 127.0.0.1 or [::1] (any port) and from the --allowed-hosts names; requests
    /// without Origin (non-browser clients) always pass.
    #[arg(long, env = mcp::vars::ALLOWED_ORIGINS, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Directory of stored code (default: $XDG_DATA_HOME/mcp-code-executor/code).
    #[arg(long, env = mcp::vars::CODE_STORAGE_DIR)]
    pub code_storage_dir: Option<PathBuf>,
    /// Default wall-clock limit of a run, seconds.
    #[arg(long, env = vars::TIMEOUT, value_parser = config::parse_duration, default_value = "30")]
    pub timeout: std::time::Duration,
    /// Longest timeout a tool call may ask for, seconds.
    #[arg(long, env = mcp::vars::MAX_TIMEOUT, value_parser = config::parse_duration, default_value = "300")]
    pub max_timeout: std::time::Duration,
    /// Memory limit per run (swap included), e.g. 512m.
    #[arg(long, env = vars::MEMORY, value_parser = config::parse_size, default_value = "512m")]
    pub memory: u64,
    /// CPU quota per run, in cores.
    #[arg(long, env = vars::CPUS, default_value_t = defaults::CPUS)]
    pub cpus: f64,
    /// Runs at once; further calls wait their turn.
    #[arg(long, env = mcp::vars::MAX_CONCURRENT, default_value_t = mcp::defaults::MAX_CONCURRENT)]
    pub max_concurrent: usize,
    /// Environment type: conda (with CONDA_ENV_NAME), venv (VENV_PATH), venv-uv
    /// (UV_VENV_PATH); unset: the managed default environment.
    #[arg(long, env = mcp::vars::ENV_TYPE)]
    pub env_type: Option<String>,
    /// Where managed environments live.
    #[arg(long, env = vars::DATA_DIR)]
    pub data_dir: Option<PathBuf>,
    /// CA bundle (PEM) that installer containers trust (default: the host's system bundle).
    #[arg(long, env = vars::CA_BUNDLE)]
    pub ca_bundle: Option<PathBuf>,
    /// Sandboxes kept started and waiting for a run (0 turns the warm pool off).
    #[arg(long, env = vars::POOL_SIZE, default_value_t = 2)]
    pub pool_size: usize,
    /// Label put on this server's containers (`io.mcp-code-executor.tenant`).
    #[arg(long, env = mcp::vars::TENANT, default_value = "local")]
    pub tenant: String,
    /// Seconds without a call after which an execute_python session is removed.
    #[arg(long, env = mcp::vars::SESSION_IDLE, value_parser = config::parse_duration, default_value = "600")]
    pub session_idle: std::time::Duration,
    /// Seconds after which an execute_python session is removed, however busy.
    #[arg(long, env = mcp::vars::SESSION_MAX_LIFETIME, value_parser = config::parse_duration, default_value = "3600")]
    pub session_max_lifetime: std::time::Duration,
    /// execute_python sessions alive at once.
    #[arg(long, env = mcp::vars::MAX_SESSIONS, default_value_t = mcp_code_executor::app::settings::defaults::MAX_SESSIONS)]
    pub max_sessions: usize,
    /// Where the per-tenant workspaces live (default: <data dir>/workspaces).
    #[arg(long, env = mcp::vars::WORKSPACE_DIR)]
    pub workspace_dir: Option<PathBuf>,
    /// One workspace per tenant, shared by its MCP sessions and kept across them (default:
    /// one per MCP session, deleted when it ends).
    #[arg(long, env = mcp::vars::SHARED_WORKSPACE)]
    pub shared_workspace: bool,
    /// Tenants file (TOML, see README "Hosting it"): each tenant's token hash and limits.
    /// With it, the HTTP transports require `Authorization: Bearer <token>`; without it the
    /// server has one tenant (`--tenant`) and no authentication.
    #[arg(long, env = mcp::vars::TENANTS)]
    pub tenants: Option<PathBuf>,
    /// Calls of one tenant that may wait for a run slot; further calls are refused with a
    /// retry hint.
    #[arg(long, env = mcp::vars::MAX_QUEUE, default_value_t = mcp::defaults::MAX_QUEUE)]
    pub max_queue: usize,
    /// Serve Prometheus metrics at /metrics (open without a token); `false` turns it off.
    #[arg(long, env = mcp::vars::METRICS, default_value = "true", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub metrics: bool,
    /// Serve even when the isolation self-test fails. Dangerous: untrusted code may then
    /// reach the host or the network.
    #[arg(long)]
    pub allow_unsafe: bool,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
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
    /// Sandbox image (default: the tag matching this binary's images/).
    #[arg(long, env = vars::IMAGE)]
    pub image: Option<String>,
    /// OCI runtime for sandboxes (e.g. crun, if the daemon has it registered).
    #[arg(long, env = vars::RUNTIME)]
    pub runtime: Option<String>,
    /// Fail instead of building the image when it is missing.
    #[arg(long)]
    pub no_build: bool,
}

#[derive(Args)]
pub struct RunCmd {
    /// Python files to run; `-` reads the code from stdin.
    #[arg(required = true)]
    pub files: Vec<String>,
    /// Wall-clock limit per file, seconds.
    #[arg(long, env = vars::TIMEOUT, value_parser = config::parse_duration, default_value = "30")]
    pub timeout: std::time::Duration,
    /// Memory limit per file (swap included), e.g. 512m.
    #[arg(long, env = vars::MEMORY, value_parser = config::parse_size, default_value = "512m")]
    pub memory: u64,
    /// CPU quota in cores.
    #[arg(long, env = vars::CPUS, default_value_t = defaults::CPUS)]
    pub cpus: f64,
    /// Processes and threads per sandbox.
    #[arg(long, env = vars::PIDS, default_value_t = defaults::PIDS)]
    pub pids: i64,
    /// Bytes kept of stdout and of stderr, each; the rest is dropped and flagged.
    #[arg(long, env = vars::OUTPUT_LIMIT, value_parser = config::parse_size, default_value = "1m")]
    pub output_limit: u64,
    /// Size of the /workspace tmpfs.
    #[arg(long, env = vars::WORKSPACE_SIZE, value_parser = config::parse_size, default_value = "64m")]
    pub workspace_size: u64,
    /// Print one JSON outcome per file on stdout instead of the live output.
    #[arg(long)]
    pub json: bool,
    /// Write a JUnit XML report, one test case per file.
    #[arg(long, value_name = "PATH")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
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
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
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
        #[arg(long, env = vars::IMAGE)]
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
