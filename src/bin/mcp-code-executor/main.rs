//! The `mcp-code-executor` binary: parses the command line ([`args`], turned into the
//! library's types by [`requests`]), sets up logging to stderr, and calls one function of
//! [`mcp_code_executor::commands`] per command.

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
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let code = rt.block_on(dispatch(cli.command));
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// One call per command.
async fn dispatch(command: Command) -> cmd::Exit {
    match command {
        Command::Serve(serve) => match serve.config_from_process() {
            Ok(config) => cmd::serve(config).await,
            Err(e) => {
                eprintln!("mcp-code-executor: {e:#}");
                1
            }
        },
        Command::Run(run) => cmd::run(run.into()).await,
        Command::Doctor(opts) => cmd::doctor(&BackendConfig::from(&opts)).await,
        Command::Bench(bench) => cmd::bench(bench.into()).await,
        Command::Image(image) => cmd::image(image.into()).await,
        Command::Healthcheck { url } => cmd::healthcheck(&url).await,
        Command::Tenant(TenantCmd::Token { id }) => cmd::tenant_token(&id),
        Command::Usage {
            data_dir,
            tenant,
            from,
            to,
        } => cmd::usage(
            &data_dir
                .unwrap_or_else(|| mcp_code_executor::config::data_dir(|k| std::env::var(k).ok())),
            tenant.as_deref(),
            from.as_deref(),
            to.as_deref(),
        ),
    }
}
