//! The `mcp-code-executor` binary: parses the command line ([`args`]), sets up logging to
//! stderr, and calls into the library; `serve` is wired up in [`serve`].

mod args;
mod backend;
mod serve;

use std::process::ExitCode;

use clap::Parser;
use mcp_code_executor::app::{Capacity, Service, Settings, TenantParts};
use mcp_code_executor::cli::files;
use mcp_code_executor::cli::output::Format;
use mcp_code_executor::cli::run::{self, RunOptions};
use mcp_code_executor::config;
use mcp_code_executor::job::Limits;
use mcp_code_executor::ops::{bench, doctor};

use args::{Cli, Command, FormatArg, ImageCmd, RunCmd, TenantCmd};
use backend::image::{self, BuildOptions};

fn main() -> ExitCode {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs collected by Docker or a file stay plain text.
        .with_ansi(std::io::stderr().is_terminal())
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
        Command::Serve(cmd) => match serve::serve(*cmd).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("mcp-code-executor: {e:#}");
                1
            }
        },
        Command::Tenant(TenantCmd::Token { id }) => {
            use mcp_code_executor::tenancy::{self, token};
            if !tenancy::valid_id(&id) {
                eprintln!("mcp-code-executor: `{id}` is not a valid tenant id (1 to 63 of a-z, 0-9, `_`, `-`, starting and ending with a letter or digit)");
                return 2;
            }
            let t = token::generate();
            eprintln!("# Give this token to the tenant (it is not stored anywhere):\n#   {t}");
            println!(
                "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"",
                token::to_hex(&token::hash(&t))
            );
            0
        }
        Command::Image(ImageCmd::Server {
            tag,
            offline,
            mirror,
        }) => {
            let opts = BuildOptions {
                offline,
                mirror: Some(mirror),
                ..BuildOptions::default()
            };
            let exe = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("mcp-code-executor: cannot find this binary: {e}");
                    return run::exit::INFRA;
                }
            };
            match image::build_server(&exe, &tag, &opts, &mut |l| eprintln!("{l}")).await {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("mcp-code-executor: {e}");
                    run::exit::INFRA
                }
            }
        }
        Command::Healthcheck { url } => match mcp_code_executor::ops::health::check(&url).await {
            Ok(status) => {
                println!("{url}: {status}");
                0
            }
            Err(e) => {
                eprintln!("unhealthy: {url}: {e}");
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
            let sandbox = match backend::connect(&cmd.sandbox).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mcp-code-executor: {e}");
                    return run::exit::INFRA;
                }
            };
            drop(sandbox);
            let opts = bench::BenchOptions {
                connect: backend::bench_connect(cmd.sandbox.clone()),
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
            let result = if cmd.fairness_only {
                bench::fairness(&opts).await.map(|_| None)
            } else {
                bench::engine(&opts).await
            };
            match result {
                Ok(_) => 0,
                Err(e) => {
                    eprintln!("mcp-code-executor: bench failed: {e}");
                    1
                }
            }
        }
        Command::Doctor(opts) => {
            let sandbox = match backend::connect(&opts).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("FAIL  {}  {e}", doctor::REACHABLE);
                    return 1;
                }
            };
            let report = doctor::diagnose(&*sandbox).await;
            sandbox.drain().await;
            print!("{}", report.table());
            if report.ok() {
                0
            } else {
                1
            }
        }
        Command::Run(cmd) => run_command(cmd).await,
    }
}

/// `run`: read the files, connect (with a warm pool sized to `--jobs` when several files
/// run), run them through the application core, and remove every sandbox before exiting,
/// whether the run ended, failed, or was interrupted (SIGINT, SIGTERM).
async fn run_command(cmd: RunCmd) -> i32 {
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

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
    let format = match (cmd.json, cmd.format) {
        (true, _) | (_, FormatArg::Json) => Format::Json,
        (_, FormatArg::Text) => Format::Text,
        (_, FormatArg::Github) => Format::Github,
    };
    // Every file is found and read before any runs: a typo in the last name fails the job
    // at once, not after the others ran (and without a half-written report).
    let mut files = match files::expand(&cmd.files) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mcp-code-executor: {e}");
            return run::exit::USAGE;
        }
    };
    if files.iter().filter(|f| f.path.is_none()).count() > 1 {
        eprintln!("mcp-code-executor: `-` (stdin) may be given once");
        return run::exit::USAGE;
    }
    if let Err(e) = files::read_all(&mut files).await {
        eprintln!("mcp-code-executor: {e}");
        return run::exit::USAGE;
    }
    let jobs = cmd
        .jobs
        .map_or_else(|| run::default_jobs(&limits), usize::from)
        .min(files.len())
        .max(1);

    // SIGINT (Ctrl-C) or SIGTERM (a cancelled CI job) from here on: no new file starts, the
    // running ones are cancelled, and every sandbox is removed before exiting.
    let stop = CancellationToken::new();
    let signalled = Arc::new(AtomicI32::new(0));
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("mcp-code-executor: cannot handle SIGTERM: {e}");
            return run::exit::INFRA;
        }
    };
    let watcher = tokio::spawn({
        let (stop, signalled) = (stop.clone(), signalled.clone());
        async move {
            let code = tokio::select! {
                _ = tokio::signal::ctrl_c() => run::exit::INTERRUPTED,
                _ = term.recv() => run::exit::TERMINATED,
            };
            let what = if code == run::exit::INTERRUPTED {
                "interrupted"
            } else {
                "terminated"
            };
            eprintln!("mcp-code-executor: {what}; removing the sandboxes");
            signalled.store(code, Ordering::SeqCst);
            stop.cancel();
        }
    });
    let interrupted = || match signalled.load(Ordering::SeqCst) {
        0 => None,
        code => Some(code),
    };

    // Connect (and build the image on first use) without a pool, so that a signal meanwhile
    // leaves no sandbox behind; then, for several files, a backend with a warm pool of
    // `jobs` sandboxes of the run's shape (one file keeps no pool).
    let plain = tokio::select! {
        r = backend::connect(&cmd.sandbox) => r,
        _ = stop.cancelled() => return interrupted().unwrap_or(run::exit::INTERRUPTED),
    };
    let sandbox = match plain {
        Ok(s) if files.len() > 1 => {
            drop(s);
            let mut cfg = cmd.sandbox.config_from_process(jobs);
            cfg.build_missing = false;
            backend::connect_with_pool(&cfg, limits.clone(), false, &mut backend::print_build).await
        }
        other => other,
    };
    let sandbox = match sandbox {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mcp-code-executor: {e}");
            return run::exit::INFRA;
        }
    };
    // The same core the server uses, with a local policy: one tenant, `jobs` runs at once,
    // no quotas, no code storage.
    let mut service = Service::new(
        sandbox.clone(),
        Capacity {
            max_concurrent: jobs,
            ..Capacity::default()
        },
    );
    let executor = service.add_tenant(TenantParts {
        settings: Settings {
            limits: limits.clone(),
            ..Settings::default()
        },
        storage: None,
        environments: None,
    });
    let opts = RunOptions {
        limits,
        format,
        junit: cmd.junit,
        jobs,
        fail_fast: cmd.fail_fast,
    };
    let code = run::run_files(executor, files, opts, stop).await;
    // Pools stopped, every sandbox removed (bounded; what is left goes to the next sweep).
    sandbox.shutdown().await;
    watcher.abort();
    interrupted().unwrap_or(code)
}
