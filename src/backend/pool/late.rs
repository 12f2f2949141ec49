//! A run that finds its pool dry while plain sandboxes are being made waits for one of
//! them instead of starting a cold one beside them. A make in flight began before the run
//! came, so it is ready sooner than a cold start begun now would be, and a cold start
//! beside it is the same daemon work twice at once on a host that is already short of
//! CPU (why the pool ran dry). The pool makes one more plain sandbox while a run waits
//! (the make its cold start would have been), so it holds as many as before for the runs
//! after it. Measured under gVisor, `print(1)` every 0.3 s from the official SDK, a pool
//! of two, servers side by side in alternating rounds: 11-17 of 120-160 calls found the
//! pool dry and started cold (about 0.7 s each); waiting instead, p95 677-820 ms became
//! 240-288 and the mean 109-131 ms 88-92, while p50 rose from 37-41 ms to 52-61 (more
//! calls served a second on the same two cores, each beside more makes).
//!
//! Only plain makes are waited for (a preloading one spends seconds importing at the lowest
//! CPU weight), and no longer than a plain make has lately taken from claim to ready (after
//! that, the run starts its own); never more runs wait than plain sandboxes are being made.

use std::time::Duration;

use super::{Pool, Waiting};
use crate::backend::preload;

/// A plain make's duration before the pool has timed one.
const FIRST_GUESS: Duration = Duration::from_secs(1);
/// The longest a run waits for a make in flight, whatever the pool's makes took.
const AT_MOST: Duration = Duration::from_secs(3);

/// How long the pool's plain makes take, claim to ready: a moving average.
#[derive(Debug, Default)]
pub(super) struct MakeTimes {
    /// When each plain make in flight was claimed, oldest first.
    started: std::collections::VecDeque<tokio::time::Instant>,
    average: Option<Duration>,
}

impl MakeTimes {
    pub(super) fn began(&mut self) {
        self.started.push_back(tokio::time::Instant::now());
    }

    /// A plain make ended; `ok`: it made a sandbox (only those are timed).
    pub(super) fn ended(&mut self, ok: bool) {
        let Some(began) = self.started.pop_front() else {
            return;
        };
        if ok {
            let took = began.elapsed();
            self.average = Some(match self.average {
                // Weight 1/4: a few slow makes move it, one does not.
                Some(a) => (a * 3 + took) / 4,
                None => took,
            });
        }
    }

    /// How long a run may wait for a make in flight.
    fn patience(&self) -> Duration {
        self.average.unwrap_or(FIRST_GUESS).min(AT_MOST)
    }
}

/// One run waiting for a make in flight: counted while it waits.
struct Waiter<'a, L: Waiting>(&'a Pool<L>);

impl<L: Waiting> Drop for Waiter<'_, L> {
    fn drop(&mut self) {
        let mut st = self.0.state();
        st.late_waiting = st.late_waiting.saturating_sub(1);
    }
}

impl<L: Waiting> Pool<L> {
    /// A run that found this pool dry (a miss, see [`Pool::take`]; served here, a hit too): wait for
    /// a plain sandbox being made, and take the sandbox [`preload::choose`] picks for code
    /// that imports `imports` once one is made. `None` at once when no plain one is being
    /// made for it (or this is a one-shot `run`'s pool, whose runs wait at the gate), and
    /// when none came in time: the run then starts its own.
    pub(crate) async fn take_late(&self, imports: Option<&[String]>) -> Option<L> {
        let deadline = {
            let mut st = self.state();
            let plain_making = st.making.iter().filter(|k| k.is_empty()).count();
            if self.is_closed() || st.failing || st.runs.is_some() {
                return None;
            }
            if plain_making <= st.late_waiting {
                return None;
            }
            st.late_waiting += 1;
            tokio::time::Instant::now() + st.make_times.patience()
        };
        let _waiter = Waiter(self);
        // The pool makes one more plain sandbox while this run waits (see `Pool::claim`).
        self.wake.notify_one();
        loop {
            let made = self.made_any.notified();
            tokio::pin!(made);
            made.as_mut().enable();
            {
                let mut st = self.state();
                let need = imports.map(|i| preload::need_of(i, &st.candidates));
                if let Some(live) = self.take_ready(&mut st, need.as_deref()) {
                    drop(st);
                    self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(pool = %self.label, "a sandbox being made taken by a run that found the pool dry");
                    return Some(live);
                }
                if self.is_closed() || st.failing || !st.making.iter().any(|k| k.is_empty()) {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, made).await.is_err() {
                tracing::debug!(pool = %self.label, "no sandbox being made came in time; the run starts its own");
                return None;
            }
        }
    }
}
