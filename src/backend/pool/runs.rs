//! A pool for a one-shot process that knows how many runs it will make (`run --jobs N` over
//! a list of files): it makes as many sandboxes at once as it holds, never more than the
//! runs still to come (a sandbox made for no run is pure waste: made, then removed at
//! exit), and a run that finds none waiting waits for one being made instead of starting
//! a cold one beside it (the same daemon work, twice at once, for one run).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Pool, State, Waiting, MAKING_PER_KIND};

/// How long a run waits at the gate at most, for a sandbox being made, before it starts
/// its own (a make that takes longer has failed somewhere; its own deadline is 30 s).
const GATE_LIMIT: Duration = Duration::from_secs(45);

/// The runs a one-shot process said it will make, as the pool counts them down.
#[derive(Debug, Clone, Copy)]
pub(super) struct Runs {
    /// Runs still to take a sandbox (every take counts, warm or cold).
    left: usize,
    /// Waiting sandboxes promised to runs that passed the gate and have not taken yet.
    promised: usize,
}

impl<L: Waiting> Pool<L> {
    /// A one-shot process will run `runs` jobs on this pool, and no more: from now on it
    /// makes up to its size at once (plain sandboxes), holds no more than the runs still to
    /// come, and [`Pool::pass`] lets a run wait for a sandbox being made.
    pub(crate) fn expect_runs(&self, runs: usize) {
        let mut st = self.state();
        st.runs = Some(Runs {
            left: runs,
            promised: 0,
        });
        st.plain_at_once = self.size.max(MAKING_PER_KIND);
        drop(st);
        // Workers asleep under the old limit claim now.
        self.wake.notify_waiters();
    }

    /// A run takes (or misses): one run less to come, its promise kept.
    pub(super) fn run_taken(&self) {
        let mut st = self.state();
        if let Some(r) = st.runs.as_mut() {
            r.left = r.left.saturating_sub(1);
            r.promised = r.promised.saturating_sub(1);
        }
    }

    /// May the refill workers make one more? Always, unless the runs still to come are all
    /// covered by what waits or is being made.
    pub(super) fn runs_allow_one_more(st: &State<L>) -> bool {
        st.runs
            .is_none_or(|r| st.ready.len() + st.making.len() < r.left)
    }

    /// Wait until a waiting sandbox can be promised to the next run (true), or none will
    /// come soon (false: the run starts its own): nothing is being made and nothing may
    /// be, the last make failed, the pool closed, or [`GATE_LIMIT`] passed. Without
    /// [`Pool::expect_runs`], false at once.
    pub(crate) async fn pass(&self) -> bool {
        let until = tokio::time::Instant::now() + GATE_LIMIT;
        loop {
            let notified = self.made_note.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.state();
                if self.is_closed() || st.failing {
                    return false;
                }
                let waiting = st.ready.len();
                let making = st.making.len();
                let may_make = Self::runs_allow_one_more(&st)
                    && waiting + making < st.plan.iter().map(|(_, t)| t).sum();
                let Some(r) = st.runs.as_mut() else {
                    return false;
                };
                if waiting > r.promised {
                    r.promised += 1;
                    return true;
                }
                if making == 0 && !may_make {
                    return false;
                }
                if making == 0 {
                    // A worker will claim it: make sure one is awake.
                    self.wake.notify_one();
                }
            }
            if tokio::time::timeout_at(until, notified).await.is_err() {
                return false;
            }
        }
    }
}

/// What a one-shot `run` waits at before each file (see [`Pool::pass`]): a sandbox is
/// being made for it, or it starts its own.
#[derive(Clone)]
pub struct RunGate(Arc<dyn Gate>);

/// A pool, as the gate sees it.
trait Gate: Send + Sync {
    fn pass(&self) -> BoxFuture<'_, bool>;
}

impl<L: Waiting> Gate for Pool<L> {
    fn pass(&self) -> BoxFuture<'_, bool> {
        Box::pin(Pool::pass(self))
    }
}

impl RunGate {
    pub(crate) fn new<L: Waiting>(pool: Arc<Pool<L>>) -> Self {
        RunGate(pool)
    }

    /// Wait for a sandbox for the next run: true when one waits for it now, false when it
    /// should not wait (it will start its own).
    pub async fn pass(&self) -> bool {
        self.0.pass().await
    }
}

impl std::fmt::Debug for RunGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunGate")
    }
}
