//! The MCP server: the tools ([`tools::CodeExecutor`]: the nine of the code-executor servers
//! we replace, `execute_python`/`reset_session` and the workspace file tools) and the
//! transports that carry them ([`transports`]: stdio, Streamable HTTP at `/mcp`, legacy SSE
//! at `/sse` + `/messages`). This layer only translates: it parses a request, makes one call
//! into the application core ([`crate::app`]) and formats what comes back ([`report`],
//! [`figures`], [`progress`]). Quotas, scheduling, sessions and metrics are the core's.

pub mod args;
pub mod figures;
pub mod progress;
pub mod report;
pub mod tools;
pub mod transports;

pub use tools::CodeExecutor;
pub use transports::stdio::serve_stdio;

/// Environment variables of `serve` (each also has a flag; see `docs/mcp.md`).
pub mod vars {
    /// Where stored code lives.
    pub const CODE_STORAGE_DIR: &str = "CODE_STORAGE_DIR";
    /// HTTP port (default 4000).
    pub const PORT: &str = "PORT";
    /// HTTP bind address (default 127.0.0.1).
    pub const HOST: &str = "MCP_EXECUTOR_HOST";
    /// Comma-separated `Host` header values the HTTP transports accept (DNS-rebinding guard).
    pub const ALLOWED_HOSTS: &str = "MCP_EXECUTOR_ALLOWED_HOSTS";
    /// Comma-separated browser `Origin` values accepted besides loopback pages and the
    /// allowed hosts (`*`: any).
    pub const ALLOWED_ORIGINS: &str = "MCP_EXECUTOR_ALLOWED_ORIGINS";
    /// Longest timeout a call may ask for, seconds.
    pub const MAX_TIMEOUT: &str = "MCP_EXECUTOR_MAX_TIMEOUT";
    /// Runs at once; further calls queue.
    pub const MAX_CONCURRENT: &str = "MCP_EXECUTOR_MAX_CONCURRENT";
    /// Tenant label on this server's containers (default `local`).
    pub const TENANT: &str = "MCP_EXECUTOR_TENANT";
    /// Requested environment type (`conda`, `venv`, `venv-uv`): reported, not honoured yet.
    pub const ENV_TYPE: &str = "ENV_TYPE";
    /// Seconds without a call after which an execute_python session is removed (default 600).
    pub const SESSION_IDLE: &str = "MCP_EXECUTOR_SESSION_IDLE";
    /// Seconds after which a session is removed however busy (default 3600).
    pub const SESSION_MAX_LIFETIME: &str = "MCP_EXECUTOR_SESSION_MAX_LIFETIME";
    /// Sessions alive at once (default 16).
    pub const MAX_SESSIONS: &str = "MCP_EXECUTOR_MAX_SESSIONS";
    /// Where the per-tenant workspaces live (default `<data dir>/workspaces`).
    pub const WORKSPACE_DIR: &str = "MCP_EXECUTOR_WORKSPACE_DIR";
    /// `1`/`true`: one workspace per tenant, shared by its MCP sessions and kept; default:
    /// one per MCP session, deleted when it ends.
    pub const SHARED_WORKSPACE: &str = "MCP_EXECUTOR_SHARED_WORKSPACE";
    /// The tenants file (TOML); unset: one local tenant, no authentication.
    pub const TENANTS: &str = "MCP_EXECUTOR_TENANTS";
    /// Calls of one tenant that may wait for a run slot; past it calls are refused.
    pub const MAX_QUEUE: &str = "MCP_EXECUTOR_MAX_QUEUE";
    /// `0`/`false`: no `/metrics` route.
    pub const METRICS: &str = "MCP_EXECUTOR_METRICS";
}

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
pub const INSTRUCTIONS: &str = "This server runs Python code in isolated, short-lived sandboxes (no network, limited time and memory; execute_code keeps nothing between runs). \
For notebook-style work where variables persist between calls, use execute_python (reset_session starts over). \
Files written with write_file are at /workspace for the code; files the code writes there can be read back with read_file (list_files lists them); matplotlib figures come back as images. \
For a short script call execute_code. For a script too long for one call, build it in pieces: initialize_code_file (returns a file_path), \
append_to_code_file with that file_path as often as needed, optionally read_code_file to check it, then execute_code_file. \
Results carry stdout, stderr and a status line; a non-zero exit, timeout or out-of-memory is reported as a tool error with the output. \
Use get_environment_config for the environment and the limits, check_installed_packages to see which libraries are available (numpy, pandas and matplotlib are in the default environment), \
install_dependencies to add packages from PyPI, and configure_environment to switch to another venv, uv venv or conda environment on the server.";
