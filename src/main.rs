//! The `mcp-code-executor` binary: parses the command line, sets up logging to stderr, and
//! calls into the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use mcp_code_executor::cli::run::{self, RunArgs};
use mcp_code_executor::config::{self, vars};
use mcp_code_executor::job::{defaults, Limits};
use mcp_code_executor::sandbox::docker::{DockerConfig, DockerSandbox};
use mcp_code_executor::sandbox::image::{self, BuildOptions};
use mcp_code_executor::sandbox::Sandbox;
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
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let code = rt.block_on(dispatch(cli));
    ExitCode::from(code.clamp(0, 255) as u8)
}

async fn dispatch(cli: Cli) -> i32 {
    match cli.command {
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
    let image = opts.image.clone().unwrap_or_else(image::default_image);
    let config = DockerConfig {
        runtime: opts.runtime.clone(),
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
