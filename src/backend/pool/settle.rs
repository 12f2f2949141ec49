//! A refill waits a moment after a run takes a sandbox. Making a sandbox is the heaviest
//! work on the host (the daemon, the runtime, under gVisor the sandbox kernel's boot:
//! 0.14 CPU s per container under runc, 0.3 under gVisor); started the moment a run takes
//! a sandbox, it runs beside that run and beside its answer on the way to the client, and
//! on a host of two cores it slows both. So a refill waits until [`REFILL_DEFER`] after
//! the last take (and no longer than that from when it began to wait) while the pool still
//! has a sandbox waiting; a pool with none waiting refills at once, and so does a one-shot
//! `run`'s pool (which makes exactly what its runs need).
//!
//! Measured on this machine (official Python SDK, `print(1)` every 0.3 s, p50 of 25
//! calls, same runs, with the removal's wait of [`crate::backend::engine`]): under gVisor
//! 32-44 ms without the waits, 25 with them; under runc 15 and 12. Ending the wait at the
//! run's report instead gained nothing: the refill then competes with the answer.

use std::time::Duration;

use super::{Pool, Waiting};

/// How long after a take a refill waits, at most.
pub(crate) const REFILL_DEFER: Duration = Duration::from_millis(150);

impl<L: Waiting> Pool<L> {
    /// Until when a refill about to start should wait (`None`: start now).
    fn refill_waits_until(&self, began: tokio::time::Instant) -> Option<tokio::time::Instant> {
        if self.is_closed() {
            return None;
        }
        let st = self.state();
        if st.runs.is_some() || st.ready.is_empty() {
            return None;
        }
        let after_take = st.last_take? + REFILL_DEFER;
        let until = after_take.min(began + REFILL_DEFER);
        (until > tokio::time::Instant::now()).then_some(until)
    }

    /// Wait while [`Pool::refill_waits_until`] says so; a take (which may leave the pool
    /// with none waiting) or the pool's close makes it look again.
    pub(super) async fn settle(&self) {
        let began = tokio::time::Instant::now();
        loop {
            let taken = self.taken.notified();
            tokio::pin!(taken);
            taken.as_mut().enable();
            let Some(until) = self.refill_waits_until(began) else {
                return;
            };
            tokio::select! {
                _ = &mut taken => {}
                _ = tokio::time::sleep_until(until) => return,
            }
        }
    }
}
