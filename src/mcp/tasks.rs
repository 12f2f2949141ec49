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
//!
//! rmcp forgets an expired task only when its own manager is called again (it has no
//! sweeper), so a user who stopped calling kept their tasks' results past their lifetime
//! while the tenant's bound ([`super::task_caps`]) counted them gone (issue 42): the real
//! bound was the number of users times the tenant's. Here each executor has a sweeper that
//! every [`SWEEP_EVERY`] has every manager of its tenant forget what expired, and drops the
//! manager of a principal with no task left; admission sweeps too, before it counts.

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

/// How long a finished task's result stays readable by `tasks/get` by default (rmcp keeps
/// a terminal task for one TTL after it ends), and the least TTL a task is given
/// (`--task-ttl` sets it).
pub const RESULT_TTL: Duration = crate::app::settings::defaults::TASK_TTL;

/// Suggested polling interval.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Marks a request context whose tool call runs as a task (its timeout may go up to the
/// task maximum).
#[derive(Debug, Clone, Copy)]
pub struct TaskRun;

/// Room beyond a task's timeout for the queue and container start-up.
pub const TTL_MARGIN: Duration = Duration::from_secs(5 * 60);

/// How often each tenant's managers are swept of what expired.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The TTL of a task whose run may take `timeout`, when a finished task's result is kept
/// `keep` (the tenant's [`crate::app::Settings::task_ttl`], by default [`RESULT_TTL`]): it
/// must outlive the run (rmcp fails a task still working at its TTL), with room for the
/// queue and container start-up ([`TTL_MARGIN`], or `keep` when that is shorter).
pub fn ttl(timeout: Duration, keep: Duration) -> Duration {
    (timeout + TTL_MARGIN.min(keep)).max(keep)
}

/// The task id clients see: rmcp's id with this replica's mark ([`crate::ids`]),
/// so that a call landing on another replica finds the one that runs the task.
pub fn external_id(id: &str) -> String {
    crate::ids::mint('t', id)
}

/// rmcp's id of a task id a client sends (one of another replica, or of no replica, stays
/// as it is and is unknown here).
pub fn internal_id(id: &str) -> &str {
    crate::ids::unwrap_mine(id)
}

/// The managers by (executor, principal).
type Managers = HashMap<(usize, Option<String>), (Weak<Executor>, TaskManager)>;
type Registry = Mutex<Managers>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

fn lock() -> std::sync::MutexGuard<'static, Managers> {
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

/// The executors whose sweeper runs.
fn sweepers() -> &'static Mutex<HashMap<usize, Weak<Executor>>> {
    static S: OnceLock<Mutex<HashMap<usize, Weak<Executor>>>> = OnceLock::new();
    S.get_or_init(Mutex::default)
}

/// The task manager of `executor`'s tenant for callers with the tenant's static token (or
/// without tenants): [`manager_for`] with no principal.
pub fn manager(executor: &Arc<Executor>) -> TaskManager {
    manager_for(executor, None)
}

/// The task manager of `executor`'s tenant and the principal `owner`
/// ([`crate::tenancy::oauth::Principal::owner`]): made on first use, dropped with the
/// executor, or by the sweeper once the principal has no task left.
pub fn manager_for(executor: &Arc<Executor>, owner: Option<&str>) -> TaskManager {
    let key = (Arc::as_ptr(executor) as usize, owner.map(str::to_string));
    let manager = {
        let mut map = lock();
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
    };
    start_sweeper(executor);
    manager
}

/// Count a new task of principal `owner` in its tenant's bound ([`super::task_caps::admit`])
/// after a sweep of what expired: what rmcp forgets is no longer counted.
pub fn admit(
    executor: &Arc<Executor>,
    owner: Option<&str>,
    ttl: Duration,
) -> Result<super::task_caps::Admitted, rmcp::ErrorData> {
    sweep(executor);
    super::task_caps::admit(executor, owner, ttl)
}

/// Have every manager of `executor`'s tenant forget the tasks whose lifetime ended (rmcp
/// fails a task still working at its TTL and drops one ended a TTL ago), then drop the
/// manager of each principal the tenant's ledger holds no task of.
pub fn sweep(executor: &Arc<Executor>) {
    let me = Arc::as_ptr(executor) as usize;
    let managers: Vec<TaskManager> = lock()
        .iter()
        .filter(|((ptr, _), _)| *ptr == me)
        .map(|(_, (_, m))| m.clone())
        .collect();
    for m in managers {
        // rmcp's sweep runs at each of its entry points; this one changes nothing else.
        let _ = m.running_task_count();
    }
    // Under the registry's lock: a task is admitted (counted in the ledger) before its
    // manager is looked up, so a manager with a task on its way is never dropped.
    let mut map = lock();
    let idle: Vec<(usize, Option<String>)> = map
        .keys()
        .filter(|(ptr, owner)| {
            *ptr == me && super::task_caps::held_by(executor, owner.as_deref()) == 0
        })
        .cloned()
        .collect();
    for key in idle {
        map.remove(&key);
    }
}

/// Start `executor`'s sweeper once (from inside the runtime); it ends with the executor or
/// the server's shutdown.
fn start_sweeper(executor: &Arc<Executor>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    {
        let mut running = sweepers().lock().unwrap_or_else(|e| e.into_inner());
        running.retain(|_, w| w.strong_count() > 0);
        let key = Arc::as_ptr(executor) as usize;
        if running.contains_key(&key) {
            return;
        }
        running.insert(key, Arc::downgrade(executor));
    }
    let weak = Arc::downgrade(executor);
    let shutdown = executor.shutdown_token();
    rt.spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = shutdown.cancelled() => return,
            }
            let Some(executor) = weak.upgrade() else {
                return;
            };
            sweep(&executor);
        }
    });
}

/// Managers kept for `executor` (tests).
#[cfg(test)]
pub(crate) fn managers_of(executor: &Arc<Executor>) -> usize {
    let me = Arc::as_ptr(executor) as usize;
    lock().keys().filter(|(ptr, _)| *ptr == me).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::{Capacity, Service, Settings, TenantParts};
    use crate::backend::fake::FakeBackend;
    use rmcp::model::{CallToolResult, ContentBlock};
    use rmcp::task_manager::TaskOptions;

    fn executor(tenant: &str) -> (Service, Arc<Executor>) {
        let mut s = Service::new(
            FakeBackend::new(),
            Capacity {
                max_concurrent: 2,
                max_queue: 8,
            },
        );
        let settings = Settings {
            tenant: tenant.into(),
            ..Settings::default()
        };
        let ex = s.add_tenant(TenantParts {
            settings,
            storage: None,
            environments: None,
        });
        (s, ex)
    }

    /// Issue 42, finding 3: a user's ended task is forgotten by rmcp at the end of its
    /// lifetime though nobody calls that user's manager again, and the manager of a user
    /// with no task left goes too. Before the sweeper rmcp kept it until that user's next
    /// call, while the tenant's ledger counted it gone.
    #[tokio::test]
    async fn an_expired_task_is_freed_without_a_call_by_its_user() {
        let (_s, ex) = executor("t-task-sweep");
        let ttl = Duration::from_millis(300);
        let admitted = admit(&ex, Some("0a"), ttl).unwrap();
        let manager = manager_for(&ex, Some("0a"));
        let (gone_tx, gone_rx) = tokio::sync::oneshot::channel::<()>();
        let opts = TaskOptions::new().with_ttl_ms(ttl.as_millis() as u64);
        let task = manager.spawn(opts, move |tc| {
            // Resolves when rmcp drops the task's entry (no cancel is ever asked for).
            let watch = tc.clone();
            tokio::spawn(async move {
                watch.cancelled().await;
                let _ = gone_tx.send(());
            });
            Box::pin(async move {
                let r = CallToolResult::success(vec![ContentBlock::text("x".repeat(100_000))]);
                admitted.ended(Ok(&r));
                Ok(r)
            })
        });
        drop(manager);
        assert_eq!(managers_of(&ex), 1);
        // Within the TTL, a sweep keeps it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        sweep(&ex);
        assert_eq!(super::super::task_caps::held_by(&ex, Some("0a")), 1);
        assert_eq!(managers_of(&ex), 1);
        // Past it, the sweeper alone frees it: nobody calls the manager.
        tokio::time::timeout(
            ttl * 2 + super::super::task_caps::GRACE + SWEEP_EVERY * 2,
            gone_rx,
        )
        .await
        .expect("rmcp still holds the expired task")
        .unwrap();
        // And the user's manager goes once the ledger holds nothing of theirs.
        let t0 = std::time::Instant::now();
        while managers_of(&ex) > 0 {
            assert!(t0.elapsed() < SWEEP_EVERY * 3, "the empty manager is kept");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(super::super::task_caps::held_by(&ex, Some("0a")), 0);
        let e = manager_for(&ex, Some("0a"))
            .get_task(&task.task_id)
            .unwrap_err();
        assert!(e.message.contains("unknown task"), "{e:?}");
    }

    #[test]
    fn the_ttl_outlives_the_run_and_keeps_the_result() {
        let m = 60;
        assert_eq!(ttl(Duration::from_secs(30), RESULT_TTL), RESULT_TTL);
        assert_eq!(
            ttl(Duration::from_secs(30 * m), RESULT_TTL),
            Duration::from_secs(35 * m)
        );
        // A shorter keep (`--task-ttl`) shortens the margin too.
        assert_eq!(
            ttl(Duration::from_secs(10), Duration::from_secs(20)),
            Duration::from_secs(30)
        );
    }
}
