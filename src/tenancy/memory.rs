//! A tenant's memory budget: the memory limits of all its sandboxes that exist at once (its
//! one-shot runs, the probes and install phases of its environments, and its open
//! execute_python sessions, running a cell or paused between cells) add up to at most its
//! budget. A session holds its share for its whole life, not only while a cell runs: a
//! paused container keeps its memory.
//!
//! A run or a session that does not fit waits while the tenant's *runs* hold the rest
//! (they end by themselves); when its open *sessions* alone leave no room, it is refused at
//! once with a text that says so and what to do (waiting could last until an idle session
//! expires). Nothing waits here while holding a run slot: callers take their share before
//! their slot, so a run slot's holder never waits for memory.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// What holds a share of the budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// A one-shot run, a probe, an install phase: held while the sandbox runs.
    Run,
    /// An execute_python session: held while its container is open.
    Session,
}

/// Why a share was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MemoryError {
    #[error("tenant `{tenant}`'s sandboxes may hold {budget} of memory together (memory_budget), and its {sessions} open execute_python session(s) hold {held} of it, which leaves less than the {asked} this one needs. Free its share by ending a session you no longer need: call reset_session with that session's session_id (its variables are discarded, its workspace files kept); or wait for idle sessions to expire, or ask for less memory")]
    HeldBySessions {
        tenant: String,
        budget: Size,
        held: Size,
        sessions: usize,
        asked: Size,
    },
}

/// Bytes, shown in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} MiB", self.0.div_ceil(1 << 20))
    }
}

/// One tenant's budget and what holds it now.
#[derive(Debug)]
pub struct MemoryBudget {
    tenant: String,
    /// `None`: unlimited (shares are still counted, for the metrics).
    budget: Option<u64>,
    held: Mutex<Held>,
    freed: Notify,
}

/// Bytes held now, by holder.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub runs: u64,
    pub sessions: u64,
    /// Open sessions holding a share.
    pub session_count: usize,
}

/// A held share; dropping it gives it back and wakes whoever waits.
#[derive(Debug)]
pub struct MemoryHold {
    budget: Arc<MemoryBudget>,
    holder: Holder,
    bytes: u64,
}

impl Drop for MemoryHold {
    fn drop(&mut self) {
        {
            let mut h = self.budget.lock();
            match self.holder {
                Holder::Run => h.runs = h.runs.saturating_sub(self.bytes),
                Holder::Session => {
                    h.sessions = h.sessions.saturating_sub(self.bytes);
                    h.session_count = h.session_count.saturating_sub(1);
                }
            }
        }
        self.budget.freed.notify_waiters();
    }
}

impl MemoryBudget {
    /// The budget of `tenant`: `budget` bytes (`None`: unlimited).
    pub fn new(tenant: &str, budget: Option<u64>) -> Arc<Self> {
        Arc::new(MemoryBudget {
            tenant: tenant.to_string(),
            budget,
            held: Mutex::default(),
            freed: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is held now.
    pub fn held(&self) -> Held {
        *self.lock()
    }

    /// The budget (`None`: unlimited).
    pub fn limit(&self) -> Option<u64> {
        self.budget
    }

    /// Take `bytes` for `holder` (a sandbox larger than the whole budget, an installer
    /// say, takes all of it): at once when they fit, after the tenant's runs give back
    /// enough when they do not, refused at once when its sessions leave too little.
    /// Dropping the future gives up its place.
    pub async fn hold(
        self: &Arc<Self>,
        holder: Holder,
        bytes: u64,
    ) -> Result<MemoryHold, MemoryError> {
        let bytes = self.budget.map_or(bytes, |b| bytes.min(b));
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(holder, bytes)? {
                return Ok(MemoryHold {
                    budget: self.clone(),
                    holder,
                    bytes,
                });
            }
            freed.await;
        }
    }

    /// `Ok(true)`: taken; `Ok(false)`: runs hold what is missing, wait.
    fn try_take(&self, holder: Holder, bytes: u64) -> Result<bool, MemoryError> {
        let mut h = self.lock();
        if let Some(budget) = self.budget {
            if h.sessions + bytes > budget {
                return Err(MemoryError::HeldBySessions {
                    tenant: self.tenant.clone(),
                    budget: Size(budget),
                    held: Size(h.sessions),
                    sessions: h.session_count,
                    asked: Size(bytes),
                });
            }
            if h.runs + h.sessions + bytes > budget {
                return Ok(false);
            }
        }
        match holder {
            Holder::Run => h.runs += bytes,
            Holder::Session => {
                h.sessions += bytes;
                h.session_count += 1;
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;

    #[tokio::test]
    async fn shares_add_up_to_the_budget_and_are_given_back() {
        let b = MemoryBudget::new("t", Some(1024 * MIB));
        let s1 = b.hold(Holder::Session, 512 * MIB).await.unwrap();
        let r1 = b.hold(Holder::Run, 512 * MIB).await.unwrap();
        assert_eq!(
            b.held(),
            Held {
                runs: 512 * MIB,
                sessions: 512 * MIB,
                session_count: 1
            }
        );
        drop(r1);
        drop(s1);
        assert_eq!(b.held(), Held::default());
    }

    #[tokio::test]
    async fn a_run_waits_for_runs_and_goes_when_one_ends() {
        let b = MemoryBudget::new("t", Some(1024 * MIB));
        let r1 = b.hold(Holder::Run, 512 * MIB).await.unwrap();
        let _r2 = b.hold(Holder::Run, 512 * MIB).await.unwrap();
        let b2 = b.clone();
        let waiter = tokio::spawn(async move { b2.hold(Holder::Run, 512 * MIB).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "a third run must wait");
        drop(r1);
        let r3 = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken when a run ends")
            .unwrap();
        assert!(r3.is_ok());
    }

    /// Issue 42: the text named a `close_session` tool, which does not exist; ending a
    /// session is `reset_session` with its `session_id`.
    #[tokio::test]
    async fn sessions_that_leave_no_room_refuse_at_once_and_say_so() {
        let b = MemoryBudget::new("acme", Some(1024 * MIB));
        let _s1 = b.hold(Holder::Session, 512 * MIB).await.unwrap();
        let _s2 = b.hold(Holder::Session, 512 * MIB).await.unwrap();
        for holder in [Holder::Run, Holder::Session] {
            let e = tokio::time::timeout(Duration::from_secs(1), b.hold(holder, 512 * MIB))
                .await
                .expect("refused at once, not left waiting")
                .unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("acme")
                    && text.contains("2 open execute_python session(s) hold 1024 MiB")
                    && text.contains("memory_budget")
                    && text.contains("reset_session with that session's session_id")
                    && !text.contains("close_session"),
                "{text}"
            );
        }
        assert_eq!(b.held().session_count, 2);
    }

    #[tokio::test]
    async fn a_sandbox_above_the_budget_takes_all_of_it_and_unlimited_counts_only() {
        // An installer (2 GiB) under a budget of 256 MiB: it runs alone, holding it all.
        let b = MemoryBudget::new("t", Some(256 * MIB));
        let install = b.hold(Holder::Run, 2048 * MIB).await.unwrap();
        assert_eq!(b.held().runs, 256 * MIB);
        let b2 = b.clone();
        let run = tokio::spawn(async move { b2.hold(Holder::Run, 128 * MIB).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!run.is_finished(), "a run waits for the installer");
        drop(install);
        let run = tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .unwrap()
            .unwrap();
        assert!(run.is_ok());
        let free = MemoryBudget::new("t", None);
        let holds: Vec<_> =
            futures::future::join_all((0..8).map(|_| free.hold(Holder::Session, 1024 * MIB))).await;
        assert!(holds.iter().all(Result::is_ok));
        assert_eq!(free.held().sessions, 8 * 1024 * MIB);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_takes_nothing() {
        let b = MemoryBudget::new("t", Some(512 * MIB));
        let r1 = b.hold(Holder::Run, 512 * MIB).await.unwrap();
        let gave_up =
            tokio::time::timeout(Duration::from_millis(50), b.hold(Holder::Run, 512 * MIB)).await;
        assert!(gave_up.is_err());
        drop(r1);
        assert_eq!(b.held(), Held::default());
    }
}
