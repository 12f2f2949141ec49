//! The integration tests, in one test binary: the crate and its dependencies are linked
//! once for all of them. Each file here is one area (what was one test binary before);
//! `common` (the real daemon, clean-up checks, temporary directories), `mcp_support` (a
//! real server through `server::run` and a real client) and the Kubernetes API stand-in
//! are shared. Run one area with `cargo test --test suite AREA::` (e.g. `mcp_http::`).
//!
//! `tests/pool.rs` and `tests/preload.rs` stay binaries of their own: they count the warm
//! pool containers this process made, which other areas' pools would disturb.
//!
//! A new area: a file `tests/suite/NAME.rs` and its `mod NAME;` below.

#[path = "../common/mod.rs"]
mod common;
#[path = "../contract/mod.rs"]
mod contract;
#[path = "../kube_standin/mod.rs"]
mod kube_standin;
#[path = "../mcp_support/mod.rs"]
mod mcp_support;
#[path = "../common/process.rs"]
mod process;

mod cli;
mod cli_jobs;
mod codemode;
mod codemode_limits;
mod compose;
mod conformance;
mod consent;
mod egress;
mod egress_inject;
mod egress_limits;
mod egress_sandbox;
mod egress_sandbox_limits;
mod engine;
mod env;
mod first_run;
mod fuzz_args;
mod gvisor;
mod harden_http;
mod harden_limits;
mod harden_sandbox;
mod harden_tenant;
mod inspector;
mod kube_backend;
mod kube_standin_clients;
mod manifests;
mod mcp_env;
mod mcp_http;
mod mcp_lifecycle;
mod mcp_resources;
mod mcp_sessions;
mod mcp_sse;
mod mcp_stdio;
mod mcp_tasks;
mod oauth;
mod oauth_users;
mod prometheus_rules;
mod python_sdk;
mod replicas;
mod session;
mod session_files;
mod tenants;
mod test_script;
mod tool_hints;
mod traces;
mod usage;
mod watchdog;

/// `kube_backend` compiles only with the `kubernetes` feature (off by default; scripts/test.sh
/// turns it on). Built without it where CI runs the suite, this fails instead of letting those
/// tests vanish unnoticed.
#[cfg(not(feature = "kubernetes"))]
#[test]
fn ci_builds_the_suite_with_the_kubernetes_backend() {
    let ci = std::env::var("CI").unwrap_or_default();
    assert!(
        ci.is_empty() || ci == "false",
        "CI={ci}: the suite was built without the `kubernetes` feature, so the Kubernetes \
         backend's tests (kube_backend::) did not compile: build with `--features kubernetes` \
         (as scripts/test.sh does)"
    );
}
