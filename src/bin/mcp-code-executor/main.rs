//! The `mcp-code-executor` binary: parses the command line ([`args`]), sets up logging to
//! stderr, and calls into the library; `serve` is wired up in [`serve`].

mod args;
mod backend;
mod serve;

use std::process::ExitCode;

use clap::Parser;
use mcp_code_executor::app::{Capacity, Service, Settings, TenantParts};
use mcp_code_executor::cli::run::{self, RunArgs};
use mcp_code_executor::config;
use mcp_code_executor::job::Limits;
use mcp_code_executor::ops::{bench, doctor};

use args::{Cli, Command, ImageCmd, TenantCmd};
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
            let sandbox = match backend::connect(&cmd.sandbox).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("mcp-code-executor: {e}");
                    return run::exit::INFRA;
                }
            };
            // The same core the server uses, with a local policy: one tenant, one run at a
            // time, no quotas, no code storage.
            let mut service = Service::new(
                sandbox.clone(),
                Capacity {
                    max_concurrent: 1,
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
            let args = RunArgs {
                files: cmd.files,
                limits,
                json: cmd.json,
                junit: cmd.junit,
            };
            // SIGINT (Ctrl-C) or SIGTERM (a CI job cancelled): the run's future is dropped,
            // which kills and removes its sandbox; then wait for the removal.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            let code = tokio::select! {
                c = run::run_files(&executor, args) => c,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("mcp-code-executor: interrupted; removing the sandbox");
                    130
                }
                _ = term.recv() => {
                    eprintln!("mcp-code-executor: terminated; removing the sandbox");
                    143
                }
            };
            sandbox.drain().await;
            code
        }
    }
}
