//! Code mode (#26): the sandboxed code calls the tools of other MCP servers as Python
//! functions, through this server. The sandbox keeps no network; the upstream servers'
//! commands, URLs and credentials stay here.
//!
//! - [`config`]: the tools file (`--tools FILE`): upstream servers (a stdio command or a
//!   Streamable HTTP URL with headers), their allow lists, destructive consent, the tenants
//!   that see them, and the limits of a run; and the tenants file's servers of one tenant
//!   (`[[tenants.servers]]`, [`configure`]).
//! - [`Manager`] (`upstream`): one official rmcp client per tenant and upstream, started at the first
//!   request of that tenant's code, started again when it died, closed on shutdown. A stdio
//!   upstream speaks through `stdio`: a message over 16 MiB ends its connection (the calls
//!   in flight fail at once) rather than being dropped while its call waits.
//! - A run's requests (`run`, [`crate::job::ToolRun`]): the runner relays each request of the
//!   code as a `T` frame (see `images/sandbox/mcp_runner/toolrelay.py`); this module
//!   checks it (the server and tool exist for the tenant and are allowed, consent for a
//!   destructive tool, the arguments against the tool's `inputSchema` ([`schema`]), the
//!   run's call budget, calls in flight), calls the upstream under the per-call timeout,
//!   bounds the result, and answers. Dropping the answer's future (the run ended or timed
//!   out) drops the rmcp request, which sends `notifications/cancelled` upstream.
//! - The catalog the code's `tools` package asks for: names, Python names ([`names`]),
//!   descriptions, schemas and annotations of the allowed tools; never a URL, a command or
//!   a credential.
//!
//! Logs record the tenant, server, tool, the sizes of arguments and results and the
//! outcome, never their values.

mod caller;
pub mod config;
mod frame;
mod health;
pub mod metrics;
pub mod names;
mod run;
pub mod schema;
mod stdio;
mod upstream;

use std::path::Path;
use std::sync::{Arc, OnceLock};

use crate::job::{ToolHost, ToolRun, Tools};
pub use caller::{with_caller, Caller};
pub use config::Config;
pub use upstream::Manager;

static INSTALLED: OnceLock<Arc<Manager>> = OnceLock::new();

/// Make `manager` the server's (once, at start-up).
pub fn install(manager: Arc<Manager>) {
    let _ = INSTALLED.set(manager);
}

/// The code mode of `serve`: the tools file's servers (every tenant's, or those its
/// `tenants` names) and the tenants file's (`[[tenants.servers]]`, each its tenant's
/// alone: `tenant_servers`, each tenant's id and servers). `None` when neither declares code mode: no tools file, no tenant with servers.
/// A tenant's server with the Python name of a tools-file server it sees is an error.
/// Without a tools file the limits are its defaults.
pub fn configure(
    tools_file: Option<&Path>,
    tenant_servers: &[(&str, &[config::Server])],
    path: Option<std::ffi::OsString>,
    home: Option<std::path::PathBuf>,
) -> Result<Option<Arc<Manager>>, String> {
    let mut config = match tools_file {
        Some(p) => Config::load(p)?,
        None if tenant_servers.iter().all(|(_, s)| s.is_empty()) => return Ok(None),
        None => Config::default(),
    };
    for (tenant, servers) in tenant_servers {
        config
            .add_tenant(tenant, servers)
            .map_err(|e| format!("code mode: the tenants file: {e}"))?;
    }
    Ok(Some(Manager::new(config, path, home)))
}

/// What the runs of `tenant` may call: `None` without code mode or when no server is
/// configured for the tenant (in the tools file or as its own in the tenants file).
pub fn tools_for(tenant: &str) -> Option<Tools> {
    let m = INSTALLED.get()?;
    m.config.servers_for(tenant).next()?;
    Some(Tools(Arc::new(TenantTools {
        manager: m.clone(),
        tenant: tenant.to_string(),
        caller: caller::current(),
    })))
}

/// Servers listed in a tool description, at most: there may be many.
const LISTED: usize = 30;

/// What the `execute_code` / `execute_python` descriptions add for `tenant`: one line per
/// server it sees (not every tool: there may be hundreds), or `None` without any.
pub fn description_for(tenant: &str) -> Option<String> {
    let m = INSTALLED.get()?;
    let lines = m.lines_for(tenant);
    if lines.is_empty() {
        return None;
    }
    let mut text = String::from(
        "\n\nCode mode: the code can call the tools of these MCP servers as Python functions \
         (`from tools import NAME`; `tools.help()` and `tools.search(\"words\")` list their tools; \
         errors raise tools.ToolError):",
    );
    for l in lines.iter().take(LISTED) {
        text.push_str("\n- ");
        text.push_str(l);
    }
    if lines.len() > LISTED {
        text.push_str(&format!(
            "\n- … and {} more (tools.servers())",
            lines.len() - LISTED
        ));
    }
    Some(text)
}

/// Append [`description_for`]`(tenant)` to the descriptions of `execute_code` and
/// `execute_python` in `tools`; `true` when there was something to append.
pub fn describe(tools: &mut [rmcp::model::Tool], tenant: &str) -> bool {
    let Some(extra) = description_for(tenant) else {
        return false;
    };
    for t in tools.iter_mut() {
        if t.name == "execute_code" || t.name == "execute_python" {
            let d = t.description.as_deref().unwrap_or_default();
            t.description = Some(format!("{d}{extra}").into());
        }
    }
    true
}

/// Close every upstream client (shutdown).
pub async fn shutdown() {
    if let Some(m) = INSTALLED.get() {
        m.close().await;
    }
}

struct TenantTools {
    manager: Arc<Manager>,
    tenant: String,
    /// The client of the call that made the job (a session's: the call that opened it).
    caller: Option<Arc<dyn Caller>>,
}

impl ToolHost for TenantTools {
    /// A run's (or a cell's) calls; their client is the call being served now (a cell's
    /// own call), else the one that made the job.
    fn start(&self) -> Arc<dyn ToolRun> {
        let caller = caller::current().or_else(|| self.caller.clone());
        Arc::new(run::Run::new(
            self.manager.clone(),
            self.tenant.clone(),
            caller,
        ))
    }
}
