//! The MCP server: the tools ([`tools::CodeExecutor`]: the nine of the code-executor servers
//! we replace, `execute_python`/`reset_session` and the workspace file tools) and the
//! transports that carry them ([`transports`]: stdio, Streamable HTTP at `/mcp`, legacy SSE
//! at `/sse` + `/messages`). This layer only translates: it parses a request, makes one call
//! into the application core ([`crate::app`]) and formats what comes back ([`report`],
//! [`figures`], [`progress`]; what fits in one message: [`fit`]; a question for the user as a
//! 2026-07-28 `input_required` result: [`asking`]). Quotas, scheduling, sessions and metrics are the core's.

pub mod args;
pub(crate) mod asking;
pub mod figures;
pub mod fit;
pub mod progress;
pub mod report;
pub mod resources;
pub mod task_caps;
pub mod tasks;
pub mod tools;
pub mod transports;

pub use tools::CodeExecutor;
pub use transports::stdio::serve_stdio;

/// Named defaults of `serve`.
pub mod defaults {
    pub const PORT: u16 = 4000;
    pub const HOST: &str = "127.0.0.1";
    pub use crate::app::settings::defaults::{MAX_CONCURRENT, MAX_QUEUE, MAX_TIMEOUT};
    /// Largest HTTP request body (and stdio line) accepted: room for the largest write_file
    /// call (5 MiB, base64: 6.7 MiB) and 1 MiB of code with heavy JSON escaping; a 10 MiB
    /// request is refused (413).
    pub const MAX_BODY_BYTES: usize = 8 << 20;
    pub const ALLOWED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
}

/// What the model is told about how the tools fit together.
pub const INSTRUCTIONS: &str = "This server runs Python code in isolated, short-lived sandboxes (no network, limited time and memory; execute_code keeps no variables between runs). \
For notebook-style work where variables persist between calls, use execute_python (reset_session starts over). \
Files written with write_file are at /workspace for the code; files the code writes there can be read back with read_file (list_files lists them); matplotlib figures come back as images. \
A session (a Python REPL and its workspace) is named by the session_id results give: pass it back as session_id to execute_python, execute_code, execute_code_file, write_file, read_file, list_files and reset_session to keep the same state \
(necessary when the client keeps no connection between calls). Long output comes back as its head and tail, the whole of it kept as a workspace file to page through with read_file. \
For a short script call execute_code. For a script too long for one call, build it in pieces: initialize_code_file (returns a file_path), \
append_to_code_file with that file_path as often as needed, optionally read_code_file to check it, then execute_code_file. \
Results carry stdout, stderr and a status line; a non-zero exit, timeout or out-of-memory is reported as a tool error with the output. \
Use get_environment_config for the environment and the limits, check_installed_packages to see which libraries are available (numpy, pandas and matplotlib are in the default environment), \
install_dependencies to add packages from PyPI, and configure_environment to switch to another venv, uv venv or conda environment on the server.";
