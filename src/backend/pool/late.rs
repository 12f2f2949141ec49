//! A run that finds its pool dry while plain sandboxes are being made waits for one of
//! them instead of starting a cold one beside them. A make in flight began before the run
//! came, so it is ready sooner than a cold start begun now would be, and a cold start
//! beside it is the same daemon work twice at once on a host that is already short of
//! CPU (why the pool ran dry). The pool makes one more plain sandbox while a run waits
//! (the make its cold start would have been), so it holds as many as before for the runs
//! after it.
//!
//! What it changes where the pool runs dry (official SDK, `print(1)`, a pool of two,
//! servers side by side in alternating rounds, before -> after): under gVisor, one client
//! every 0.3 s, p95 753 -> 255 ms and mean 111 -> 83, p50 41 -> 49 (more calls served a
//! second on the same two cores, each beside more makes); under runc, four clients every
//! 0.3 s, p95 1065 -> 604, mean 365 -> 392, p50 114 -> 395 (a queue instead of some warm
//! and some cold calls); four clients back to back 6.6 -> 7.5 calls/s, p95 1154 -> 683.
//! Where the pool keeps up (one client under runc) nothing changes.
//!
//! Only plain makes are waited for (a preloading one spends seconds importing at the lowest
//! CPU weight); never more runs wait than plain sandboxes are being made. Each plain
//! sandbox made goes to the run that has waited longest, before any run that comes later
//! (which would otherwise take it from under the waiting ones: with four clients calling
//! at once, runs waited twice a make's time and then started cold anyway). A run waits no
//! longer than twice what a plain make lately took, claim to ready (then it starts its
//! own), and a failed make sends every waiting run its own way.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::sync::oneshot;

use super::{Pool, State, Waiting};

/// A plain make's duration before the pool has timed one.
const FIRST_GUESS: Duration = Duration::from_secs(1);
/// The longest a run waits for a make in flight, whatever the pool's makes took.
const AT_MOST: Duration = Duration::from_secs(3);

/// The runs waiting for a plain sandbox being made, first come first served, and how long
/// the pool's plain makes take, claim to ready.
pub(super) struct Late<L> {
    waiting: VecDeque<oneshot::Sender<L>>,
    /// When each plain make in flight was claimed, oldest first.
    started: VecDeque<tokio::time::Instant>,
    /// A moving average of the plain makes' durations.
    average: Option<Duration>,
}

impl<L> Default for Late<L> {
    fn default() -> Self {
        Late {
            waiting: VecDeque::new(),
            started: VecDeque::new(),
            average: None,
        }
    }
}

impl<L> Late<L> {
    /// Runs still waiting (a run that gave up has dropped its receiver).
    pub(super) fn waiting(&mut self) -> usize {
        self.waiting.retain(|w| !w.is_closed());
        self.waiting.len()
    }

    pub(super) fn began(&mut self) {
        self.started.push_back(tokio::time::Instant::now());
    }

    /// A plain make ended; `ok`: it made a sandbox (only those are timed). A failed one
    /// sends every waiting run its own way.
    pub(super) fn ended(&mut self, ok: bool) {
        if let Some(began) = self.started.pop_front() {
            if ok {
                let took = began.elapsed();
                self.average = Some(match self.average {
                    // Weight 1/4: a few slow makes move it, one does not.
                    Some(a) => (a * 3 + took) / 4,
                    None => took,
                });
            }
        }
        if !ok {
            self.waiting.clear();
        }
    }

    /// Give `live`, a plain sandbox just made, to the run that has waited longest; back
    /// when none waits any more.
    pub(super) fn hand_over(&mut self, mut live: L) -> Option<L> {
        while let Some(w) = self.waiting.pop_front() {
            match w.send(live) {
                Ok(()) => return None,
                Err(back) => live = back,
            }
        }
        Some(live)
    }

    pub(super) fn close(&mut self) {
        self.waiting.clear();
    }

    /// How long a run may wait for a make in flight.
    fn patience(&self) -> Duration {
        (self.average.unwrap_or(FIRST_GUESS) * 2).min(AT_MOST)
    }
}

impl<L: Waiting> Pool<L> {
    /// A run that found this pool dry (a miss, see [`Pool::take`]; served here, a hit too):
    /// wait for a plain sandbox being made and take it once made. `None` at once when no
    /// plain one is being made for it (or this is a one-shot `run`'s pool, whose runs wait
    /// at the gate), and when none came in time or a make failed: the run then starts its
    /// own.
    pub(crate) async fn take_late(&self) -> Option<L> {
        let (made, deadline) = {
            let mut st = self.state();
            if self.is_closed() || st.failing || st.runs.is_some() {
                return None;
            }
            let plain_making = st.making.iter().filter(|k| k.is_empty()).count();
            if plain_making <= st.late.waiting() {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            st.late.waiting.push_back(tx);
            (rx, tokio::time::Instant::now() + st.late.patience())
        };
        // The pool makes one more plain sandbox while this run waits (see `Pool::claim`).
        self.wake.notify_one();
        match tokio::time::timeout_at(deadline, made).await {
            Ok(Ok(mut live)) => {
                self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(pool = %self.label, "dry pool: a sandbox made meanwhile taken");
                live.taken(super::TakenFrom {
                    pool: self.label.clone(),
                    preloaded: Vec::new(),
                });
                Some(live)
            }
            Ok(Err(_)) => None,
            Err(_) => {
                tracing::debug!(pool = %self.label, "dry pool: none made in time, a cold start");
                None
            }
        }
    }

    /// A plain sandbox was made: the run that has waited longest takes it (see
    /// [`Late::hand_over`]); back when none waits, or it may not be used.
    pub(super) fn to_waiting_run(&self, st: &mut State<L>, mut live: L) -> Option<L> {
        if st.late.waiting() == 0 {
            return Some(live);
        }
        if !live.claimed() {
            self.discarded
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return None;
        }
        let back = st.late.hand_over(live)?;
        // Nobody took it after all (each gave up meanwhile): it waits in the pool, claimed.
        Some(back)
    }
}
