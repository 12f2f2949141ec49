//! One function per command of the binary, each taking what the command line resolved to
//! (library types, never clap's) and returning the process's exit status: the binary only
//! parses, sets up logging and calls one of these. They get their sandboxes from
//! [`crate::backend::connect`], the one place that names the concrete backends (the server
//! gets its own there too, which is why it is not here: `server` stays below `commands`).

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

/// Tell `e` on stderr as this program's error and return `code`.
fn fail(e: impl std::fmt::Display, code: Exit) -> Exit {
    eprintln!("mcp-code-executor: {e}");
    code
}
