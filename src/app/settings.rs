//! What one tenant's executor may do: the limits of its runs, the longest timeout, its
//! quotas and its sessions. Built once per tenant at start-up ([`Settings::for_tenant`]
//! applies a tenant's own limits over the server's); never read from the process
//! environment (the binary's configuration fills these in).

use std::path::PathBuf;
use std::time::Duration;

use crate::job::Limits;

/// Named defaults of the application core (the binary's flags show them).
pub mod defaults {
    use std::time::Duration;

    /// The longest timeout a call may ask for.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);
    /// The longest timeout a run started as an MCP task may ask for (a task outlives the
    /// request that started it, so it may run longer than a call a client waits for).
    pub const MAX_TASK_TIMEOUT: Duration = Duration::from_secs(30 * 60);
    /// How long a finished task's result stays readable at least (`--task-ttl`).
    pub const TASK_TTL: Duration = Duration::from_secs(15 * 60);
    /// Bytes of results a tenant's kept tasks may hold (`--task-results-limit`).
    pub const TASK_RESULT_BYTES: u64 = 64 << 20;
    /// Runs at once over all tenants; further calls queue.
    pub const MAX_CONCURRENT: usize = 4;
    /// Large enough that a burst of 100 calls from one client all wait their turn; each
    /// waiting call holds only its request.
    pub const MAX_QUEUE: usize = 256;
    /// A session unused this long is removed.
    pub const SESSION_IDLE: Duration = Duration::from_secs(600);
    /// A session older than this is removed (at the end of its current cell).
    pub const SESSION_MAX_LIFETIME: Duration = Duration::from_secs(3600);
    /// Sessions alive at once, per tenant.
    pub const MAX_SESSIONS: usize = 16;
    /// Bytes of stored code and workspace files a tenant may keep, when nothing lower is
    /// set (`--storage-limit`, a tenant's `storage_limit`).
    pub const STORAGE_BYTES: u64 = 1 << 30;
    /// Stored code files untouched this long are removed (`--code-max-age`).
    pub const CODE_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
    /// The interpreter of the sandbox image.
    pub const IMAGE_PYTHON: &str = crate::backend::image::PYTHON;
}

/// How long shutdown waits for execute_python calls to stop and sessions to close before it
/// shuts the backend down anyway (what is left then is removed by the next start-up sweep).
pub use crate::config::defaults::SHUTDOWN_DEADLINE;

/// What one tenant's executor needs to know about the server's configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Limits of each run; `timeout` is the default a call gets.
    pub limits: Limits,
    /// The most a call's `timeout` may ask for.
    pub max_timeout: Duration,
    /// The most the `timeout` of a run started as an MCP task may ask for.
    pub max_task_timeout: Duration,
    /// How long a finished MCP task's result is kept at least, and the least TTL a task is
    /// given (`--task-ttl`; see [`crate::mcp::tasks::ttl`]).
    pub task_ttl: Duration,
    /// Bytes of results the tenant's kept tasks may hold, a working task counting as a full
    /// result (`--task-results-limit`; see [`crate::mcp::task_caps`]).
    pub task_result_bytes: u64,
    /// Sandbox image and interpreter, for get_environment_config.
    pub image: String,
    pub python: String,
    /// ENV_TYPE as configured, reported by get_environment_config.
    pub requested_env_type: Option<String>,
    /// Tenant label on the jobs (`local` for a single-user server).
    pub tenant: String,
    /// Stateful sessions (execute_python) and workspaces.
    pub sessions: SessionOptions,
    /// The tenant's quotas beyond the run limits above.
    pub quota: Quota,
}

/// Options of stateful sessions and workspaces.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// A session unused this long is removed.
    pub idle: Duration,
    /// A session older than this is removed (at the end of its current cell).
    pub max_lifetime: Duration,
    /// Sessions alive at once, over all connections of the tenant.
    pub max_sessions: usize,
    /// Where the workspaces live (the binary gives `<data dir>/workspaces`); empty: not
    /// configured, and the workspace tools say so.
    pub workspace_root: PathBuf,
    /// One workspace per tenant, shared by its connections and kept across them; otherwise
    /// (the default) each connection has its own, deleted when it ends.
    pub shared_workspace: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            idle: defaults::SESSION_IDLE,
            max_lifetime: defaults::SESSION_MAX_LIFETIME,
            max_sessions: defaults::MAX_SESSIONS,
            workspace_root: PathBuf::new(),
            shared_workspace: false,
        }
    }
}

/// What a tenant may do beyond the limits of each run; all checked before a container exists.
#[derive(Debug, Clone)]
pub struct Quota {
    /// Runs of this tenant at once (`None`: up to the server's run slots).
    pub max_concurrent_runs: Option<usize>,
    /// Runs started per minute (`None`: unlimited).
    pub runs_per_minute: Option<u32>,
    /// May install_dependencies use the network?
    pub install_network: bool,
    /// Bytes of stored code and workspace files together (`None`: only the per-file caps).
    pub storage_bytes: Option<u64>,
    /// Stored code files not modified for this long are removed (`None`: kept forever).
    pub code_max_age: Option<Duration>,
    /// Memory all of the tenant's sandboxes may hold at once: runs, probes, installs and
    /// open execute_python sessions (`None`: unlimited; see [`crate::tenancy::memory`]).
    pub memory_budget: Option<u64>,
}

impl Default for Quota {
    fn default() -> Self {
        Quota {
            max_concurrent_runs: None,
            runs_per_minute: None,
            install_network: true,
            storage_bytes: Some(defaults::STORAGE_BYTES),
            code_max_age: Some(defaults::CODE_MAX_AGE),
            memory_budget: None,
        }
    }
}

impl Settings {
    /// The settings of `tenant`: the server's, with each of the tenant's limits applied
    /// where it is lower (a tenant never gets more than the server allows).
    pub fn for_tenant(&self, tenant: &crate::tenancy::Tenant) -> Settings {
        let t = &tenant.limits;
        let mut s = self.clone();
        s.tenant = tenant.id.clone();
        if let Some(m) = t.max_timeout {
            s.max_timeout = s.max_timeout.min(m);
            s.max_task_timeout = s.max_task_timeout.min(m);
            s.limits.timeout = s.limits.timeout.min(m);
        }
        if let Some(m) = t.max_memory {
            s.limits.memory_bytes = s.limits.memory_bytes.min(m);
        }
        if let Some(c) = t.max_cpus {
            s.limits.cpus = s.limits.cpus.min(c);
        }
        if let Some(o) = t.output_limit {
            s.limits.output_bytes = s.limits.output_bytes.min(o);
        }
        if let Some(n) = t.max_sessions {
            s.sessions.max_sessions = s.sessions.max_sessions.min(n);
        }
        s.quota = Quota {
            max_concurrent_runs: t.max_concurrent_runs,
            runs_per_minute: t.runs_per_minute,
            install_network: t.install_network,
            storage_bytes: match (t.storage_limit, self.quota.storage_bytes) {
                (Some(t), Some(s)) => Some(t.min(s)),
                (t, s) => t.or(s),
            },
            code_max_age: self.quota.code_max_age,
            memory_budget: match (t.memory_budget, self.quota.memory_budget) {
                (Some(t), Some(s)) => Some(t.min(s)),
                (t, s) => t.or(s),
            },
        };
        s
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            limits: Limits::default(),
            max_timeout: defaults::MAX_TIMEOUT,
            max_task_timeout: defaults::MAX_TASK_TIMEOUT,
            task_ttl: defaults::TASK_TTL,
            task_result_bytes: defaults::TASK_RESULT_BYTES,
            image: crate::backend::image::default_image(),
            python: defaults::IMAGE_PYTHON.into(),
            requested_env_type: None,
            tenant: crate::tenancy::LOCAL.into(),
            sessions: SessionOptions::default(),
            quota: Quota::default(),
        }
    }
}
