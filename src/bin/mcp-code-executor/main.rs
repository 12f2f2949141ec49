//! The `mcp-code-executor` binary: parses the command line ([`args`], turned into the
//! library's types by [`requests`]), sets up logging to stderr, and hands the command to
//! [`mcp_code_executor::commands::execute`]. It awaits nothing itself: a future of the
//! library awaited here would be compiled again in this crate (47 s of a release build).

mod args;
mod requests;

use std::process::ExitCode;

use clap::Parser;
use mcp_code_executor::commands as cmd;
use mcp_code_executor::config::BackendConfig;

use args::{Cli, Command, TenantCmd};

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
    match command(cli.command) {
        Ok(command) => ExitCode::from(cmd::execute(command).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("mcp-code-executor: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The library's command for what the command line says (the serve configuration read
/// from the flags and the process environment here, so that its errors come first).
fn command(command: Command) -> Result<cmd::Command, mcp_code_executor::config::ConfigError> {
    Ok(match command {
        Command::Serve(serve) => cmd::Command::Serve(Box::new(serve.config_from_process()?)),
        Command::Run(run) => cmd::Command::Run(run.into()),
        Command::Doctor(opts) => cmd::Command::Doctor(BackendConfig::from(&opts)),
        Command::Bench(bench) => cmd::Command::Bench(bench.into()),
        Command::Image(image) => cmd::Command::Image(image.into()),
        Command::Healthcheck { url } => cmd::Command::Healthcheck(url),
        Command::Tenant(TenantCmd::Token { id }) => cmd::Command::TenantToken(id),
        Command::Usage {
            data_dir,
            tenant,
            from,
            to,
        } => cmd::Command::Usage {
            data_dir: data_dir
                .unwrap_or_else(|| mcp_code_executor::config::data_dir(|k| std::env::var(k).ok())),
            tenant,
            from,
            to,
        },
    })
}
