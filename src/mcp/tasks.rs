//! Long runs as MCP tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663, as
//! rmcp 3.11 implements it): a client that declares the extension gets a task for
//! `execute_code`, `execute_code_file`, `execute_python`, `install_dependencies` and `install_package`
//! instead of waiting on the request; it polls `tasks/get` (whose answer inlines the tool
//! result once the task is `completed`) and may `tasks/cancel`, which stops the run and
//! removes its container. A task run may ask for a timeout up to
//! [`crate::app::Settings::max_task_timeout`] (30 minutes unless the tenant allows less).
//!
//! The tasks of a tenant live in one [`TaskManager`] per executor and principal, shared by
//! all the principal's connections: a client without protocol sessions (2026-07-28) polls
//! on a new connection each time. Another tenant's task id is unknown ("not found"), like
//! one that expired, and so is another signed-in user's of the same tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rmcp::task_manager::TaskManager;

use crate::app::Executor;

/// The tools a task may run.
pub const TOOLS: [&str; 5] = [
    "execute_code",
    "execute_code_file",
    "execute_python",
    "install_dependencies",
    "install_package",
];

/// How long a finished task's result stays readable by `tasks/get` (rmcp keeps a terminal
/// task for one TTL after it ends), and the least TTL a task is given.
pub const RESULT_TTL: Duration = Duration::from_secs(15 * 60);

/// Suggested polling interval.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Marks a request context whose tool call runs as a task (its timeout may go up to the
/// task maximum).
#[derive(Debug, Clone, Copy)]
pub struct TaskRun;

/// The TTL of a task whose run may take `timeout`: it must outlive the run (rmcp fails a
/// task still working at its TTL), with room for the queue and container start-up.
pub fn ttl(timeout: Duration) -> Duration {
    (timeout + Duration::from_secs(5 * 60)).max(RESULT_TTL)
}

/// The task id clients see: rmcp's id with this replica's mark ([`crate::cluster::ids`]),
/// so that a call landing on another replica finds the one that runs the task.
pub fn external_id(id: &str) -> String {
    crate::cluster::ids::mint('t', id)
}

/// rmcp's id of a task id a client sends (one of another replica, or of no replica, stays
/// as it is and is unknown here).
pub fn internal_id(id: &str) -> &str {
    crate::cluster::ids::unwrap_mine(id)
}

type Registry = Mutex<HashMap<(usize, Option<String>), (Weak<Executor>, TaskManager)>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

/// The task manager of `executor`'s tenant for callers with the tenant's static token (or
/// without tenants): [`manager_for`] with no principal.
pub fn manager(executor: &Arc<Executor>) -> TaskManager {
    manager_for(executor, None)
}

/// The task manager of `executor`'s tenant and the principal `owner`
/// ([`crate::tenancy::oauth::Principal::owner`]): made on first use, dropped with the
/// executor.
pub fn manager_for(executor: &Arc<Executor>, owner: Option<&str>) -> TaskManager {
    let key = (Arc::as_ptr(executor) as usize, owner.map(str::to_string));
    let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
    map.retain(|_, (w, m)| {
        let alive = w.strong_count() > 0;
        if !alive {
            m.shutdown();
        }
        alive
    });
    map.entry(key)
        .or_insert_with(|| (Arc::downgrade(executor), TaskManager::new()))
        .1
        .clone()
}
