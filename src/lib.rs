//! mcp-code-executor: run untrusted Python in short-lived, hardened Docker containers.
//!
//! # Layout
//!
//! - [`job`]: the job model. What to run ([`job::JobSpec`], [`job::Limits`]) and what came
//!   of it ([`job::Outcome`]). Every front end speaks these types.
//! - [`sandbox`]: the backend seam. [`sandbox::Sandbox`] runs one job in a fresh sandbox;
//!   [`sandbox::docker`] is the Docker implementation (the only place bollard appears),
//!   [`sandbox::protocol`] the wire format spoken with the runner inside the container
//!   (`images/sandbox/runner.py`), [`sandbox::archive`] the tar packing of input files,
//!   [`sandbox::image`] the build of the sandbox image from the embedded `images/`.
//! - [`env`](mod@env): Python environments (venv, uv venv, conda, the managed default): resolution
//!   into read-only mounts, package-spec validation, installs in sandboxed installer
//!   containers ([`env::manager`]).
//! - [`mcp`]: the MCP server. [`mcp::tools::CodeExecutor`] holds the nine tools; they turn
//!   requests into jobs and storage calls and format outcomes ([`mcp::report`]), with
//!   arguments parsed in [`mcp::args`], progress notifications sent by [`mcp::progress`],
//!   and the environment tools translated in [`mcp::environment`].
//!   Transports: stdio ([`mcp::stdio`]), Streamable HTTP and legacy SSE ([`mcp::http`],
//!   [`mcp::sse`]).
//!   Beside them (issue 7): stateful `execute_python` sessions ([`mcp::sessions`]), the
//!   workspace file tools ([`mcp::workspace`]) and figures as image content
//!   ([`mcp::figures`]).
//! - [`storage`]: the code storage directory; every client `file_path` is confined to it.
//! - [`config`]: environment variables, sizes and durations, limit validation.
//! - [`doctor`]: live self-test that isolation is really enforced on this host.
//! - [`tenancy`]: tenants of a hosted server (issue 6): the tenants file, bearer tokens
//!   (stored as SHA-256), runs-per-minute buckets and the fair run scheduler. Each tenant
//!   gets its own [`mcp::CodeExecutor`]; [`mcp::http`] picks it by token.
//! - [`metrics`]: Prometheus counters and gauges (`/metrics`); [`health`]: the client
//!   side of the container healthcheck.
//! - [`cli`]: the `run` command for CI pipelines (files, directories and globs run `--jobs` at
//!   once through the application core; output blocks, summary, JSON, JUnit, GitHub
//!   annotations, exit codes).
//! - [`bench`](mod@bench): latency and throughput against a `docker run` baseline from the same run.
//!
//! The binary (`src/bin/mcp-code-executor/`) only parses the command line (`args.rs`), sets
//! up logging to stderr and calls in here; `serve.rs` wires the server together.

pub mod app;
pub mod backend;
pub mod cli;
pub mod config;
pub mod env;
pub mod job;
pub mod mcp;
pub mod ops;
pub mod storage;
pub mod tenancy;
