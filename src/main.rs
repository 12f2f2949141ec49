//! The `mcp-code-executor` binary: parses the command line, sets up logging to stderr, and
//! calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use mcp_code_executor::cli::run::{self, RunArgs};
use mcp_code_executor::config::{self, vars};
use mcp_code_executor::job::{defaults, Limits};
use mcp_code_executor::mcp;
use mcp_code_executor::sandbox::docker::{DockerConfig, DockerSandbox};
use mcp_code_executor::sandbox::image::{self, BuildOptions};
use mcp_code_executor::sandbox::Sandbox;
use mcp_code_executor::storage::{self, CodeStorage};
use mcp_code_executor::{bench, doctor};

#[derive(Parser)]
#[command(
    name = "mcp-code-executor",
    version,
    about = "Run untrusted Python in hardened, short-lived Docker containers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// Parsed once at start-up: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run Python files, each in its own sandbox (for CI pipelines). `-` reads stdin.
    Run(RunCmd),
    /// Check Docker, the image, and that isolation is really enforced on this host.
    Doctor(SandboxOpts),
    /// Measure latency and throughput against plain `docker run` in the same run.
    Bench(BenchCmd),
    /// Build or name the sandbox image.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Serve the MCP tools: over stdio (`--stdio`) or HTTP (Streamable HTTP at /mcp, legacy
    /// SSE at /sse). Reads a `.env` file in the working directory if there is one.
    Serve(ServeCmd),
}

#[derive(Args)]
struct ServeCmd {
    /// Serve one client over stdin/stdout instead of HTTP (stdout carries only the protocol).
    #[arg(long)]
    stdio: bool,
    /// Address to bind the HTTP server to.
    #[arg(long, env = mcp::vars::HOST, default_value = mcp::defaults::HOST)]
    host: String,
    /// HTTP port (0 picks a free one).
    #[arg(long, env = mcp::vars::PORT, default_value_t = mcp::defaults::PORT)]
    port: u16,
    /// Host header values the HTTP transports accept, comma-separated (guards against DNS
    /// rebinding); `*` accepts any.
    #[arg(long, env = mcp::vars::ALLOWED_HOSTS, value_delimiter = ',', default_value = "localhost,127.0.0.1,::1")]
    allowed_hosts: Vec<String>,
    /// Browser Origin values the HTTP transports accept, comma-separated (e.g.
    /// `http://localhost:*`); unset: Origin is not checked.
    #[arg(long, env = mcp::vars::ALLOWED_ORIGINS, value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Directory of stored code (default: $XDG_DATA_HOME/mcp-code-executor/code).
    #[arg(long, env = mcp::vars::CODE_STORAGE_DIR)]
    code_storage_dir: Option<PathBuf>,
    /// Default wall-clock limit of a run, seconds.
    #[arg(long, env = vars::TIMEOUT, value_parser = config::parse_duration, default_value = "30")]
    timeout: std::time::Duration,
    /// Longest timeout a tool call may ask for, seconds.
    #[arg(long, env = mcp::vars::MAX_TIMEOUT, value_parser = config::parse_duration, default_value = "300")]
    max_timeout: std::time::Duration,
    /// Memory limit per run (swap included), e.g. 512m.
    #[arg(long, env = vars::MEMORY, value_parser = config::parse_size, default_value = "512m")]
    memory: u64,
    /// CPU quota per run, in cores.
    #[arg(long, env = vars::CPUS, default_value_t = defaults::CPUS)]
    cpus: f64,
    /// Runs at once; further calls wait their turn.
    #[arg(long, env = mcp::vars::MAX_CONCURRENT, default_value_t = mcp::defaults::MAX_CONCURRENT)]
    max_concurrent: usize,
    /// Environment type: conda (with CONDA_ENV_NAME), venv (VENV_PATH), venv-uv
    /// (UV_VENV_PATH); unset: the managed default environment.
    #[arg(long, env = mcp::vars::ENV_TYPE)]
    env_type: Option<String>,
    /// Where managed environments live.
    #[arg(long, env = vars::DATA_DIR)]
    data_dir: Option<PathBuf>,
    /// CA bundle (PEM) that installer containers trust (default: the host's system bundle).
    #[arg(long, env = vars::CA_BUNDLE)]
    ca_bundle: Option<PathBuf>,
    /// Sandboxes kept started and waiting for a run (0 turns the warm pool off).
    #[arg(long, env = vars::POOL_SIZE, default_value_t = 2)]
    pool_size: usize,
    /// Label put on this server's containers (`io.mcp-code-executor.tenant`).
    #[arg(long, env = mcp::vars::TENANT, default_value = "local")]
    tenant: String,
    /// Seconds without a call after which an execute_python session is removed.
    #[arg(long, env = mcp::vars::SESSION_IDLE, value_parser = config::parse_duration, default_value = "600")]
    session_idle: std::time::Duration,
    /// Seconds after which an execute_python session is removed, however busy.
    #[arg(long, env = mcp::vars::SESSION_MAX_LIFETIME, value_parser = config::parse_duration, default_value = "3600")]
    session_max_lifetime: std::time::Duration,
    /// execute_python sessions alive at once.
    #[arg(long, env = mcp::vars::MAX_SESSIONS, default_value_t = mcp::sessions::defaults::MAX_SESSIONS)]
    max_sessions: usize,
    /// Where the per-tenant workspaces live (default: <data dir>/workspaces).
    #[arg(long, env = mcp::vars::WORKSPACE_DIR)]
    workspace_dir: Option<PathBuf>,
    /// One workspace per tenant, shared by its MCP sessions and kept across them (default:
    /// one per MCP session, deleted when it ends).
    #[arg(long, env = mcp::vars::SHARED_WORKSPACE)]
    shared_workspace: bool,
    /// Serve even when the isolation self-test fails. Dangerous: untrusted code may then
    /// reach the host or the network.
    #[arg(long)]
    allow_unsafe: bool,
    #[command(flatten)]
    sandbox: SandboxOpts,
}

#[derive(Args, Clone)]
struct SandboxOpts {
    /// Sandbox image (default: the tag matching this binary's images/).
    #[arg(long, env = vars::IMAGE)]
    image: Option<String>,
    /// OCI runtime for sandboxes (e.g. crun, if the daemon has it registered).
    #[arg(long, env = vars::RUNTIME)]
    runtime: Option<String>,
    /// Fail instead of building the image when it is missing.
    #[arg(long)]
    no_build: bool,
}

#[derive(Args)]
struct RunCmd {
    /// Python files to run; `-` reads the code from stdin.
    #[arg(required = true)]
    files: Vec<String>,
    /// Wall-clock limit per file, seconds.
    #[arg(long, env = vars::TIMEOUT, value_parser = config::parse_duration, default_value = "30")]
    timeout: std::time::Duration,
    /// Memory limit per file (swap included), e.g. 512m.
    #[arg(long, env = vars::MEMORY, value_parser = config::parse_size, default_value = "512m")]
    memory: u64,
    /// CPU quota in cores.
    #[arg(long, env = vars::CPUS, default_value_t = defaults::CPUS)]
    cpus: f64,
    /// Processes and threads per sandbox.
    #[arg(long, env = vars::PIDS, default_value_t = defaults::PIDS)]
    pids: i64,
    /// Bytes kept of stdout and of stderr, each; the rest is dropped and flagged.
    #[arg(long, env = vars::OUTPUT_LIMIT, value_parser = config::parse_size, default_value = "1m")]
    output_limit: u64,
    /// Size of the /workspace tmpfs.
    #[arg(long, env = vars::WORKSPACE_SIZE, value_parser = config::parse_size, default_value = "64m")]
    workspace_size: u64,
    /// Print one JSON outcome per file on stdout instead of the live output.
    #[arg(long)]
    json: bool,
    /// Write a JUnit XML report, one test case per file.
    #[arg(long, value_name = "PATH")]
    junit: Option<PathBuf>,
    #[command(flatten)]
    sandbox: SandboxOpts,
}

#[derive(Args)]
struct BenchCmd {
    /// Sequential samples per latency row.
    #[arg(long, default_value_t = 30)]
    samples: usize,
    /// Warm pool size for the pool-on rows.
    #[arg(long, default_value_t = 4)]
    pool_size: usize,
    /// Runs per throughput row.
    #[arg(long, default_value_t = 60)]
    throughput_runs: usize,
    /// Concurrency levels of the throughput rows.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    concurrency: Vec<usize>,
    /// Concurrent calls in the burst.
    #[arg(long, default_value_t = 100)]
    burst: usize,
    #[command(flatten)]
    sandbox: SandboxOpts,
}

#[derive(Subcommand)]
enum ImageCmd {
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
    /// Print the image tag this binary uses.
    Name,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "mcp_code_executor=warn".into()),
        )
        .init();
    let mut cli = Cli::parse();
    if matches!(cli.command, Command::Serve(_)) {
        // `.env` fills in what the environment does not set; parse again to see it.
        match dotenvy::dotenv() {
            Ok(path) => {
                tracing::info!(path = %path.display(), "read .env");
                cli = Cli::parse();
            }
            Err(e) if e.not_found() => {}
            Err(e) => {
                eprintln!("mcp-code-executor: cannot read .env: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let code = rt.block_on(dispatch(cli));
    ExitCode::from(code.clamp(0, 255) as u8)
}

async fn dispatch(cli: Cli) -> i32 {
    match cli.command {
        Command::Serve(cmd) => match serve(cmd).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("mcp-code-executor: {e:#}");
                1
            }
        },
        Command::Image(ImageCmd::Name) => {
            println!("{}", image::default_image());
            0
        }
        Command::Image(ImageCmd::Build {
            ca_bundle,
            offline,
            mirror,
            force,
            image,
        }) => {
            let opts = BuildOptions {
                ca_bundle,
                offline,
                mirror: Some(mirror),
                force,
            };
            let tag = image.unwrap_or_else(image::default_image);
            match image::ensure(&tag, &opts, &mut |l| eprintln!("{l}")).await {
                Ok(true) => 0,
                Ok(false) => {
                    eprintln!("{tag} is already built (use --force to rebuild)");
                    0
                }
                Err(e) => {
                    eprintln!("mcp-code-executor: {e}");
                    run::exit::INFRA
                }
            }
        }
        Command::Bench(cmd) => {
            let sandbox = match connect(&cmd.sandbox).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mcp-code-executor: {e}");
                    return run::exit::INFRA;
                }
            };
            drop(sandbox);
            let opts = bench::BenchOptions {
                image: cmd
                    .sandbox
                    .image
                    .clone()
                    .unwrap_or_else(image::default_image),
                runtime: cmd.sandbox.runtime.clone(),
                samples: cmd.samples,
                pool_size: cmd.pool_size,
                throughput_runs: cmd.throughput_runs,
                concurrency: cmd.concurrency,
                burst: cmd.burst,
            };
            match bench::engine(&opts).await {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("mcp-code-executor: bench failed: {e}");
                    1
                }
            }
        }
        Command::Doctor(opts) => {
            let sandbox = match connect(&opts).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("FAIL  docker reachable  {e}");
                    return 1;
                }
            };
            let report = doctor::diagnose(&sandbox).await;
            sandbox.drain().await;
            print!("{}", report.table());
            if report.ok() {
                0
            } else {
                1
            }
        }
        Command::Run(cmd) => {
            let limits = Limits {
                timeout: cmd.timeout,
                memory_bytes: cmd.memory,
                cpus: cmd.cpus,
                pids: cmd.pids,
                output_bytes: cmd.output_limit,
                workspace_bytes: cmd.workspace_size,
                ..Limits::default()
            };
            if let Err(e) = config::validate_limits(&limits) {
                eprintln!("mcp-code-executor: {e}");
                return run::exit::USAGE;
            }
            let sandbox = match connect(&cmd.sandbox).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mcp-code-executor: {e}");
                    return run::exit::INFRA;
                }
            };
            let args = RunArgs {
                files: cmd.files,
                limits,
                json: cmd.json,
                junit: cmd.junit,
            };
            let code = tokio::select! {
                c = run::run_files(&sandbox, args) => c,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("mcp-code-executor: interrupted; removing the sandbox");
                    130
                }
            };
            sandbox.drain().await;
            code
        }
    }
}

/// Connect to Docker, sweep what dead processes left, and make sure the image exists
/// (building it on first use unless told not to).
async fn connect(opts: &SandboxOpts) -> Result<DockerSandbox, String> {
    connect_with_pool(opts, 0, Limits::default()).await
}

/// [`connect`], with a warm pool of `pool_size` sandboxes made with `pool_limits`.
async fn connect_with_pool(
    opts: &SandboxOpts,
    pool_size: usize,
    pool_limits: Limits,
) -> Result<DockerSandbox, String> {
    let image = opts.image.clone().unwrap_or_else(image::default_image);
    let config = DockerConfig {
        runtime: opts.runtime.clone(),
        pool_size,
        pool_limits,
        ..DockerConfig::new(image.clone())
    };
    let sandbox = DockerSandbox::connect(config)
        .await
        .map_err(|e| e.to_string())?;
    if let Err(e) = sandbox.sweep_leftovers().await {
        tracing::warn!(error = %e, "sweep of leftover containers failed");
    }
    if !opts.no_build {
        let built = image::ensure(&image, &BuildOptions::default(), &mut |l| {
            eprintln!("[image] {l}")
        })
        .await
        .map_err(|e| e.to_string())?;
        if built {
            eprintln!("[image] the sandbox image {image} was built on first use");
        }
    }
    Ok(sandbox)
}

/// `serve`: check the sandbox is safe, then serve until the client leaves or a signal comes;
/// then cancel runs, wait for their containers to be removed, and exit 0.
async fn serve(cmd: ServeCmd) -> anyhow::Result<()> {
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
        .unwrap_or_else(storage::default_dir);
    let code_storage = CodeStorage::open(&dir)?;
    eprintln!(
        "mcp-code-executor: code storage {}",
        code_storage.dir().display()
    );

    let sandbox = connect_with_pool(&cmd.sandbox, cmd.pool_size, limits.clone())
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
            sandbox.drain().await;
            anyhow::bail!(
                "refusing to serve: the isolation self-test failed (see the table above). \
                 Fix the host (`mcp-code-executor doctor`), or pass --allow-unsafe to serve anyway"
            );
        }
    }
    let environments = environments(&cmd, &sandbox).await?;
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
    };
    let sandbox = std::sync::Arc::new(sandbox);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let executor =
        mcp::CodeExecutor::new(sandbox.clone(), std::sync::Arc::new(code_storage), settings)
            .with_shutdown(shutdown.clone())
            .with_environments(std::sync::Arc::new(environments));
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            wait_for_signal().await;
            eprintln!("mcp-code-executor: shutting down; stopping runs");
            shutdown.cancel();
        }
    });
    let served = if cmd.stdio {
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
        let opts = mcp::http::HttpOptions {
            allowed_hosts: allowed,
            allowed_origins: cmd.allowed_origins.clone(),
            ..Default::default()
        };
        eprintln!("mcp-code-executor: serving Streamable HTTP at http://{addr}/mcp and legacy SSE at http://{addr}/sse");
        let router = mcp::http::router(executor, &opts, shutdown.clone());
        mcp::http::serve(listener, router, shutdown.clone()).await
    };
    shutdown.cancel();
    sandbox.shutdown().await;
    served.context("serving")?;
    Ok(())
}

/// The environment runs start in (from ENV_TYPE and friends, or the managed default),
/// validated in a sandbox; the warm pool is then made with it.
async fn environments(
    cmd: &ServeCmd,
    sandbox: &DockerSandbox,
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
        if k == state::vars::ENV_TYPE {
            cmd.env_type.clone()
        } else {
            get(k)
        }
    })?;
    let manager = EnvManager::new(data_dir, ca);
    let state = EnvState::init(sandbox, &manager, &cmd.tenant, request)
        .await
        .map_err(|e| anyhow::anyhow!("the configured Python environment cannot be used: {e}"))?;
    let report = state.report().await;
    eprintln!(
        "mcp-code-executor: environment {} at {} (Python {})",
        report.kind,
        report.path.display(),
        report.python_version
    );
    sandbox.prewarm(&state.current().await.run_env()).await;
    Ok(Environments { manager, state })
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
