//! mcp-code-executor: run untrusted Python in short-lived, hardened sandboxes (Docker
//! containers under runc or gVisor, or Kubernetes pods), for MCP clients and CI pipelines.
//!
//! # Layout
//!
//! From the leaves up; each layer calls only the ones above it in this list, and no two
//! files of a module use each other (`tests/layering.rs` fails naming the first cycle).
//!
//! - [`ids`]: the replica id and the handles that carry it, a leaf that storage, the core
//!   and the MCP layer use.
//! - [`job`]: the job model. What to run ([`job::JobSpec`], [`job::Limits`], the
//!   environment's [`job::Source`]s) and what came of it ([`job::Outcome`]). No
//!   dependencies: every layer speaks these types.
//! - [`config`]: every environment variable declared once with its documentation
//!   ([`config::vars`]; a test checks each is in `docs/mcp.md`), sizes and durations, limit
//!   checks, what waiting sandboxes preload ([`config::preload`]), and
//!   [`config::ServeConfig`], resolved once from flags, variables and `.env`. Nothing else
//!   reads the process environment.
//! - [`telemetry`]: traces (OpenTelemetry over OTLP/HTTP JSON, off unless configured): W3C
//!   trace context, span guards whose scope is a task-local (hooks elsewhere are one line),
//!   and an exporter whose bounded queue drops and counts rather than wait. Above
//!   [`config`] only.
//! - [`backend`]: the seam. The [`backend::Backend`] and [`backend::Session`] traits (run,
//!   sessions and putting files into them, prewarm, stats, sweep, shutdown, info; no
//!   default methods: a wrapper implements `Wrap` and overrides only what it changes), the
//!   runner protocol ([`backend::protocol`], with code mode's tool frames; egress's streams
//!   over it in `backend::relay`), tar packing
//!   ([`backend::archive`]), the gathering of what a runner sends (`backend::collect`), the
//!   warm pools (`backend::pool`), preloading's report and learner ([`backend::preload`]),
//!   the neutral description of the sandbox image ([`backend::image`]), the labels every
//!   sandbox carries ([`backend::labels`]) and a fake for fast tests ([`backend::fake`]).
//!   [`backend::engine`] is what every backend does the same way, written once over a
//!   small `Driver` trait: warm take (from a dry pool, a sandbox being made), cold launch
//!   and its retry, the one frame loop with a runner (and its hook for frames it does not
//!   handle; code mode's is `engine/tools.rs`), sessions, the removal guard, stats, sweeps and shutdown. The two drivers keep only what differs:
//!   [`backend::docker`] (the container spec, launch and attach, the verdict, listing for
//!   the sweep, the image build; the only place the Docker client crate is used) and
//!   `backend::kubernetes` (the `kubernetes` cargo feature, on by default: a hardened pod
//!   per run or session attached over `pods/attach`, the verdict from the pod status;
//!   the only place kube-rs is used). The runner itself, PID 1 of every sandbox, is the
//!   Python package `images/sandbox/mcp_runner/`; the `tools` package code mode's stubs
//!   come from is `images/sandbox/tools/`.
//! - [`codemode`]: code mode. The operator's upstream MCP servers (`--tools FILE`, and a
//!   tenant's own in the tenants file), one rmcp client per tenant and upstream, the catalog the sandbox's stubs are made from,
//!   and the policy every call from sandboxed code passes (allow list, consent for
//!   destructive tools, arguments against the schema, calls per run, in flight, timeout,
//!   result size).
//! - [`egress`]: egress by policy (#41), the only way out sandboxed code will have. The
//!   operator's policy (`--egress FILE`: rules by host, wildcard, address or range and
//!   port, default deny, limits, the `[resolve]` test override), the address classes
//!   refused whatever a name resolves to, the resolver, and the HTTP proxy over any byte
//!   stream (`CONNECT` tunnels, plain HTTP forwarded) that resolves once, connects to the
//!   address it checked, streams under per-run and per-tenant limits and logs and counts
//!   each connection; sandboxes reach it through their runner's channel
//!   (`backend::relay`, docs/egress.md).
//! - [`env`](mod@env): which Python environment (venv, uv venv, conda, the managed
//!   default) and installs into it in sandboxed installer jobs; the backend decides how an
//!   environment reaches the sandbox.
//! - [`tenancy`]: the tenants file (with its `[[oauth_rules]]`), bearer tokens (stored as
//!   SHA-256), OAuth sign-in ([`tenancy::oauth`]: JWT access tokens checked against the
//!   issuers' keys, tenants from claims, the principal of a call), runs-per-minute
//!   buckets, the fair run scheduler and each tenant's memory budget (runs and open
//!   sessions together). [`storage`]: the code storage directory, where every client
//!   `file_path` is confined, and the storage quotas.
//! - [`app`]: the application core every front end calls. [`app::Service`] holds the
//!   backend, the run slots shared fairly by every tenant, the metrics, readiness and
//!   shutdown; a tenant's [`app::Executor`] admits a run (rate), holds its environment,
//!   takes its share of the memory budget and a run slot and calls the backend, racing cancellation and shutdown; a client's
//!   [`app::Connection`] owns its `execute_python` session and workspace. [`app::usage`]
//!   appends a record per finished run (usage by day, tenant and principal);
//!   [`app::health_metrics`] holds what the alert rules of `deploy/prometheus/` watch
//!   beside the per-tenant metrics.
//! - [`cluster`]: this replica among its peers behind a balancer without affinity: the
//!   shared secret, the peer table, draining on SIGTERM. It knows no MCP: the router that
//!   forwards a request on another replica's handle to its owner is in the HTTP transport
//!   ([`mcp::transports::http::route`]), the one layer that reads `Mcp-Session-Id`,
//!   `/messages` and the JSON-RPC body a handle is read from.
//! - [`mcp`]: the MCP server, which only translates. [`mcp::tools`] holds the fifteen
//!   tools (the nine of the code-executor servers we replace, `execute_python`,
//!   `install_package`, `reset_session` and the three workspace file tools): each parses its arguments, makes
//!   one call into [`app`] and formats the result ([`mcp::report`], [`mcp::figures`], within one message: [`mcp::fit`];
//!   progress in [`mcp::progress`]). Workspace files, long output and figures as resources
//!   in [`mcp::resources`]; long runs as MCP tasks in [`mcp::tasks`], what a tenant keeps of
//!   them bounded in [`mcp::task_caps`].
//!   [`mcp::transports`]: stdio, Streamable HTTP and legacy SSE, `/healthz`, `/readyz`,
//!   `/metrics`, who calls ([`mcp::transports::auth`]: tokens, OAuth metadata and challenges), served by our own accept loop within bounds (connections, streams,
//!   protocol sessions, unread result bytes: [`mcp::transports::bounds`],
//!   [`mcp::transports::sessions`]).
//! - [`cli`]: the `run` command for CI pipelines, through [`app`] with a local policy:
//!   files, directories and globs run `--jobs` at once on a warm pool; output blocks, a
//!   summary, JSON, JUnit, GitHub annotations, exit codes.
//! - [`ops`]: `doctor` (a live self-test that isolation is really enforced), the container
//!   healthcheck's client, and `bench` (through [`app`], against a `docker run` baseline
//!   from the same run).
//!
//! - [`server`]: the MCP server as one call, [`server::run`]`(config, shutdown)` (the
//!   binary's `serve` and the MCP tests call the same function): the front that answers at
//!   once, start-up (backend, self-test, one executor per tenant, each made from the
//!   configuration by conversions: [`server::settings`]), serving, shutdown.
//! - [`commands`]: one function per command of the binary (`serve`, `run`, `doctor`,
//!   `bench`, `image`, `tenant`, `healthcheck`). They and the server get their backend from
//!   [`backend::connect`], the one place that names the concrete backends.
//!
//! The binary (`src/bin/mcp-code-executor/`) only parses the command line (`args.rs`, which
//! turns it into the library's types), sets up logging to stderr and calls
//! [`commands::execute`], which runs the command on a runtime of its own (so the futures are
//! compiled once, here, not again in the binary).

/// `eprintln!` that never panics. A server's stderr may be a pipe whose reader is gone (a
/// supervisor that died, `serve 2>&1 | head`): `eprintln!` panics there, and a panic in the
/// signal watcher or the shutdown path left a server that SIGTERM could not stop.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod app;
pub mod backend;
pub mod cli;
pub mod cluster;
pub mod codemode;
pub mod commands;
pub mod config;
pub mod egress;
pub mod env;
pub mod ids;
pub mod job;
pub mod mcp;
pub mod ops;
#[cfg(test)]
pub(crate) mod scratch;
pub mod server;
pub mod storage;
pub mod telemetry;
pub mod tenancy;
