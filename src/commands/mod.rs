//! One function per command of the binary, each taking what the command line resolved to
//! (library types, never clap's) and returning the process's exit status: the binary only
//! parses, sets up logging and calls one of these. They get their sandboxes from
//! [`crate::backend::connect`], the one place that names the concrete backends (the server
//! gets its own there too, which is why it is not here: `server` stays below `commands`).
//! [`execute`] is the binary's one call: it runs a [`Command`] on a runtime of its own.

use crate::backend::connect as backend;
mod bench;
mod doctor;
mod image;
mod run;
mod serve;
mod tenant;

pub use bench::{bench, BenchRequest};
pub use doctor::doctor;
pub use image::{image, image_build, image_name, image_server, ImageBuild, ImageRequest};
pub use run::{run, RunRequest};
pub use serve::{serve, SHUTDOWN_LIMIT};
pub use tenant::{healthcheck, tenant_token, usage};

/// An exit status; `0` is success.
pub type Exit = i32;

/// A command of the binary, as its command line resolved it.
pub enum Command {
    Serve(Box<crate::config::ServeConfig>),
    Run(RunRequest),
    Doctor(crate::config::BackendConfig),
    Bench(BenchRequest),
    Image(ImageRequest),
    Healthcheck(String),
    TenantToken(String),
    Usage {
        data_dir: std::path::PathBuf,
        tenant: Option<String>,
        from: Option<String>,
        to: Option<String>,
    },
}

/// Run `command` to its end on a Tokio runtime made here, and return the exit status.
///
/// Synchronous on purpose: every command's future is then compiled once, in this crate.
/// When the binary awaited these futures itself, a release build instantiated the whole
/// server again in the binary crate (its drop glue and polls: 7,555 items naming this
/// crate; 47 s of the binary's own build on a quiet machine).
#[inline(never)]
pub fn execute(command: Command) -> Exit {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the Tokio runtime: {e}"), 1),
    };
    rt.block_on(async move {
        match command {
            Command::Serve(config) => serve(*config).await,
            Command::Run(req) => run(req).await,
            Command::Doctor(cfg) => doctor(&cfg).await,
            Command::Bench(req) => bench(req).await,
            Command::Image(req) => image(req).await,
            Command::Healthcheck(url) => healthcheck(&url).await,
            Command::TenantToken(id) => tenant_token(&id),
            Command::Usage {
                data_dir,
                tenant,
                from,
                to,
            } => usage(&data_dir, tenant.as_deref(), from.as_deref(), to.as_deref()),
        }
    })
}

/// Tell `e` on stderr as this program's error and return `code`.
fn fail(e: impl std::fmt::Display, code: Exit) -> Exit {
    eprintln!("mcp-code-executor: {e}");
    code
}
