//! The bound on what a tenant's tasks keep (issue 24, item 2). rmcp's task manager keeps
//! every task until one TTL after it ends (15 minutes at least), result or error inlined,
//! with no bound of its own: a tenant could fill the server's memory with tasks. This
//! ledger counts, per tenant, the tasks the manager holds and the bytes of their results;
//! a new task past either bound is refused at once with a message that says which bound,
//! what is held and when room comes back. Nothing here touches the manager: a task is
//! counted from its admission to the moment rmcp forgets it (one TTL after it ended, and
//! [`GRACE`] more). The ledger counts the tasks of all the tenant's principals, each in its
//! own manager: what it forgets, the sweep ([`super::tasks::sweep`], run before every
//! admission and every [`super::tasks::SWEEP_EVERY`]) has had rmcp forget too, so that the
//! tenant's bound is the real one however many users it has (issue 42).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use rmcp::model::CallToolResult;
use rmcp::ErrorData;

use crate::app::Executor;

/// The most tasks a tenant's manager keeps at once (working, or ended and readable).
pub const MAX_TASKS: usize = 256;

/// What a task that is still working is counted as: the largest result may be
/// ([`super::fit::budget::MESSAGE`]), against the tenant's
/// [`crate::app::Settings::task_result_bytes`] (its results, serialized).
const WORKING_BYTES: u64 = super::fit::budget::MESSAGE as u64;

/// What an ended task without a result (cancelled, failed) is counted as, beside its error.
const ENDED_BYTES: u64 = 512;

/// Counted this much longer than rmcp keeps a task: rmcp notes the end just after the
/// ledger (when the task's future returns), and must have forgotten it first.
pub const GRACE: Duration = Duration::from_secs(1);

/// One tenant's tasks as rmcp keeps them.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<u64, Entry>,
    next: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The principal whose manager keeps it ([`crate::tenancy::oauth::Principal::owner`]).
    owner: Option<String>,
    bytes: u64,
    /// When rmcp forgets it: set when the task ends (its TTL after that).
    gone_at: Option<Instant>,
}

/// Why a task was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TaskRefused {
    #[error("too many tasks kept for this tenant: {held} (at most {max}); a task is kept until {ttl_min} minutes after it ends. Wait for one to end and expire, cancel one (tasks/cancel), or call without a task")]
    Count {
        held: usize,
        max: usize,
        ttl_min: u64,
    },
    #[error("the tasks kept for this tenant hold {held} bytes of results (at most {max}, a working task counting {working}); a task is kept until {ttl_min} minutes after it ends. Wait for some to expire, or call without a task")]
    Bytes {
        held: u64,
        max: u64,
        working: u64,
        ttl_min: u64,
    },
}

impl Ledger {
    /// Forget what rmcp has forgotten by `now`.
    fn sweep(&mut self, now: Instant) {
        self.entries
            .retain(|_, e| e.gone_at.is_none_or(|t| t > now));
    }

    /// Tasks held and their bytes.
    pub fn held(&mut self, now: Instant) -> (usize, u64) {
        self.sweep(now);
        (
            self.entries.len(),
            self.entries.values().map(|e| e.bytes).sum(),
        )
    }

    /// Tasks of principal `owner` held at `now`.
    fn held_by(&mut self, now: Instant, owner: Option<&str>) -> usize {
        self.sweep(now);
        self.entries
            .values()
            .filter(|e| e.owner.as_deref() == owner)
            .count()
    }

    /// Count a new working task of `owner` within `max_tasks` and `max_bytes`: its key.
    fn admit(
        &mut self,
        owner: Option<&str>,
        now: Instant,
        max_tasks: usize,
        max_bytes: u64,
        ttl: Duration,
    ) -> Result<u64, TaskRefused> {
        let (count, bytes) = self.held(now);
        let ttl_min = ttl.as_secs().div_ceil(60);
        if count >= max_tasks {
            return Err(TaskRefused::Count {
                held: count,
                max: max_tasks,
                ttl_min,
            });
        }
        if bytes + WORKING_BYTES > max_bytes {
            return Err(TaskRefused::Bytes {
                held: bytes,
                max: max_bytes,
                working: WORKING_BYTES,
                ttl_min,
            });
        }
        self.next += 1;
        self.entries.insert(
            self.next,
            Entry {
                owner: owner.map(str::to_string),
                bytes: WORKING_BYTES,
                gone_at: None,
            },
        );
        Ok(self.next)
    }

    /// The task `key` ended at `now` with `bytes` kept; rmcp forgets it `ttl` later (at
    /// the sweep that follows), counted until [`GRACE`] after that.
    fn ended(&mut self, key: u64, bytes: u64, now: Instant, ttl: Duration) {
        if let Some(e) = self.entries.get_mut(&key) {
            e.bytes = bytes;
            e.gone_at = Some(now + ttl + GRACE);
        }
    }
}

/// A task counted in its tenant's ledger: [`Admitted::ended`] when it settles; dropped
/// without that (aborted at its TTL, the manager shut down), it counts as ended then.
pub struct Admitted {
    ledger: Arc<Mutex<Ledger>>,
    key: u64,
    ttl: Duration,
    settled: bool,
}

impl Admitted {
    /// The task ended with this result or error (what rmcp keeps for one more TTL).
    pub fn ended(mut self, outcome: Result<&CallToolResult, &ErrorData>) {
        let bytes = match outcome {
            Ok(r) => serde_json::to_vec(r).map_or(WORKING_BYTES, |v| v.len() as u64),
            Err(e) => e.message.len() as u64 + ENDED_BYTES,
        };
        self.settle(bytes);
    }

    fn settle(&mut self, bytes: u64) {
        self.settled = true;
        lock(&self.ledger).ended(self.key, bytes, Instant::now(), self.ttl);
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if !self.settled {
            self.settle(ENDED_BYTES);
        }
    }
}

fn lock(l: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

type Registry = Mutex<HashMap<usize, (Weak<Executor>, Arc<Mutex<Ledger>>)>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Registry::default)
}

/// The ledger of `executor`'s tenant (made on first use, dropped with the executor).
fn ledger(executor: &Arc<Executor>) -> Arc<Mutex<Ledger>> {
    let key = Arc::as_ptr(executor) as usize;
    let mut map = registry().lock().unwrap_or_else(|e| e.into_inner());
    map.retain(|_, (w, _)| w.strong_count() > 0);
    map.entry(key)
        .or_insert_with(|| (Arc::downgrade(executor), Arc::default()))
        .1
        .clone()
}

/// Tasks of principal `owner` that `executor`'s tenant holds (working, or ended and kept).
pub fn held_by(executor: &Arc<Executor>, owner: Option<&str>) -> usize {
    lock(&ledger(executor)).held_by(Instant::now(), owner)
}

/// Count a new task of principal `owner` of `executor`'s tenant, kept by rmcp until `ttl`
/// after it ends; past [`MAX_TASKS`] or the tenant's
/// [`crate::app::Settings::task_result_bytes`] (over all the tenant's
/// principals; the caller sweeps what expired first: [`super::tasks::admit`]) the call is refused (a JSON-RPC error,
/// -32000, that says which bound), counted in `mcp_executor_rejected_total{reason="tasks"}`.
pub fn admit(
    executor: &Arc<Executor>,
    owner: Option<&str>,
    ttl: Duration,
) -> Result<Admitted, ErrorData> {
    let ledger = ledger(executor);
    let max_bytes = executor.settings().task_result_bytes;
    let key = lock(&ledger)
        .admit(owner, Instant::now(), MAX_TASKS, max_bytes, ttl)
        .map_err(|e| {
            executor.metrics().rejected(executor.tenant(), "tasks");
            ErrorData::new(rmcp::model::ErrorCode(-32000), e.to_string(), None)
        })?;
    Ok(Admitted {
        ledger,
        key,
        ttl,
        settled: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_bytes_are_bounded_and_come_back_after_the_ttl() {
        let mut l = Ledger::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(900);
        let a = l.admit(None, t0, 2, 10 << 20, ttl).unwrap();
        let _b = l.admit(None, t0, 2, 10 << 20, ttl).unwrap();
        let e = l.admit(None, t0, 2, 10 << 20, ttl).unwrap_err();
        assert!(
            matches!(
                e,
                TaskRefused::Count {
                    held: 2,
                    max: 2,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("15 minutes"), "{e}");
        l.ended(a, 100, t0, ttl);
        // Still kept until its TTL has passed, then gone.
        assert!(l
            .admit(None, t0 + Duration::from_secs(899), 2, 10 << 20, ttl)
            .is_err());
        assert!(l
            .admit(None, t0 + Duration::from_secs(902), 2, 10 << 20, ttl)
            .is_ok());
        // Bytes: a working task counts as a whole result.
        let mut l = Ledger::default();
        let one = WORKING_BYTES;
        l.admit(None, t0, 100, 2 * one, ttl).unwrap();
        l.admit(None, t0, 100, 2 * one, ttl).unwrap();
        let e = l.admit(None, t0, 100, 2 * one, ttl).unwrap_err();
        assert!(matches!(e, TaskRefused::Bytes { .. }), "{e}");
    }
}
