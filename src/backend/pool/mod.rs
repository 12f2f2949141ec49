//! The warm pool every backend shares: pre-started, single-use sandboxes (Docker
//! containers, Kubernetes pods) whose runner already waits on stdin. The request path takes
//! one; killing, removing and refilling happen in the background. A sandbox is never given
//! a second job: taking it removes it from the pool for good. Pool sandboxes carry no tenant
//! data until a job is dispatched to them; on a multi-tenant server each tenant has its own
//! pool, so they carry its label from birth.
//!
//! What differs between backends is how a sandbox is made and what it is: each backend's
//! sandbox implements [`Waiting`], and its refill workers call [`refill`] with a function
//! that makes one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::preload;
use crate::job::{Limits, RunEnv};

mod depth;
mod late;
mod pools;
mod refill;
mod runs;
mod settle;
#[cfg(test)]
mod tests;

pub use pools::POOL_IDLE;
pub use runs::RunGate;

/// Sandboxes the warm pools of this process could not make, since start: every refill
/// failure counts (the retries with back-off too), for `/metrics`.
static REFILL_FAILURES: AtomicU64 = AtomicU64::new(0);

/// [`REFILL_FAILURES`]' value.
pub fn refill_failures() -> u64 {
    REFILL_FAILURES.load(Ordering::Relaxed)
}

/// The warm pool a backend keeps: both drivers take the same settings.
#[derive(Debug, Clone, Default)]
pub struct PoolConfig {
    /// Sandboxes kept started and waiting for a job (0 turns the warm pool off).
    pub size: usize,
    /// The limits pool sandboxes are made with; jobs with other memory/CPU/pids/tmpfs
    /// limits take the cold path.
    pub limits: Limits,
    /// The environment the shared pool's sandboxes are made with at start
    /// (`Backend::prewarm` changes it).
    pub env: RunEnv,
    /// One pool per tenant (multi-tenant servers): no shared pool is made at start; a
    /// tenant's pool is made, with its limits and environment, at its first run and
    /// removed after [`POOL_IDLE`] without a run. Its sandboxes carry the tenant's label.
    pub per_tenant: bool,
}
pub(crate) use pools::{PoolHandle, Pools};
#[cfg(feature = "kubernetes")]
pub(crate) use refill::refill;
pub(crate) use refill::refill_kinds;

/// A waiting sandbox older than this is replaced rather than used.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(600);
/// Refill workers per pool: sandboxes made at once, at most [`MAKING_PER_KIND`] plain and
/// as many preloaded ones, so that a plain refill never waits behind the imports (more
/// plain ones while the pool runs dry: see `depth` and `late`).
pub(crate) const REFILL_WORKERS: usize = 4;
/// Plain sandboxes a pool makes at once, at most, and preloaded ones (over all kinds).
const MAKING_PER_KIND: usize = 2;
/// How often waiting sandboxes are checked for death and age.
const PRUNE_EVERY: Duration = Duration::from_secs(2);

/// A sandbox as the pool holds it.
pub(crate) trait Waiting: Send + 'static {
    /// When it was made, while it is alive and still waiting for its job (`None`: it died).
    fn waiting_since(&mut self) -> Option<Instant>;
    /// A run takes it: make it ready for the job (false: it must not be used).
    fn claimed(&mut self) -> bool {
        true
    }
    /// A pool hands it to a run (after [`Waiting::claimed`]).
    fn taken(&mut self, _from: TakenFrom) {}
}

/// Where a warm sandbox came from: its pool's label and the modules it had preloaded
/// (empty: a plain one). Told to the sandbox as it is handed over ([`Waiting::taken`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TakenFrom {
    pub(crate) pool: String,
    pub(crate) preloaded: Vec<String>,
}

/// Alive, waiting, and not too old to be used.
fn usable<L: Waiting>(live: &mut L) -> bool {
    live.waiting_since()
        .is_some_and(|born| born.elapsed() < MAX_IDLE)
}

/// What a sandbox is fixed to at creation: a job fits a pool sandbox only when the job's
/// limits give the same shape (timeout and output cap are per job, not per sandbox).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shape {
    memory_bytes: u64,
    cpus_milli: u64,
    pids: i64,
    workspace_bytes: u64,
    tmp_bytes: u64,
    nofile: u64,
    env: RunEnv,
}

impl Shape {
    pub(crate) fn of(l: &Limits, env: &RunEnv) -> Shape {
        Shape {
            memory_bytes: l.memory_bytes,
            cpus_milli: (l.cpus * 1000.0).round() as u64,
            pids: l.pids,
            workspace_bytes: l.workspace_bytes,
            tmp_bytes: l.tmp_bytes,
            nofile: l.nofile,
            env: env.clone(),
        }
    }
}

/// Figures for benchmarks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Sandboxes the pools aim to keep waiting (all pools together).
    pub target: usize,
    /// Jobs served by a pool sandbox (waiting, or made while they waited for it).
    pub hits: u64,
    /// Jobs that found none waiting that fits (the pool empty, or of another shape): they
    /// took the cold path, or waited for one being made (then a hit too).
    pub misses: u64,
    /// Waiting sandboxes found dead or too old, and replaced.
    pub discarded: u64,
    /// Sandboxes waiting right now.
    pub ready: usize,
}

impl std::ops::Add for PoolStats {
    type Output = PoolStats;
    fn add(self, o: PoolStats) -> PoolStats {
        PoolStats {
            target: self.target + o.target,
            hits: self.hits + o.hits,
            misses: self.misses + o.misses,
            discarded: self.discarded + o.discarded,
            ready: self.ready + o.ready,
        }
    }
}

/// Waiting sandboxes of one kind, and how many the pool aims to keep (see [`Pool::mix`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindStats {
    /// What its sandboxes preload (empty: plain).
    pub modules: Vec<String>,
    /// How many of them the pool aims to keep waiting.
    pub target: usize,
    /// How many wait right now.
    pub ready: usize,
    /// How many are being made.
    pub making: usize,
}

/// What a pool's lock guards: its waiting sandboxes with their preload lists, what is
/// being made, its plan, and the demand the plan follows.
struct State<L> {
    ready: VecDeque<(Vec<String>, L)>,
    /// Preload lists of the sandboxes being made right now by the refill workers.
    making: Vec<Vec<String>>,
    /// Sandboxes to keep waiting, per preload list (the first: plain).
    plan: Vec<(Vec<String>, usize)>,
    /// The imports of the pool's recent calls, oldest first (at most
    /// [`preload::DEMAND_WINDOW`]).
    demand: VecDeque<Vec<String>>,
    /// What the pool's recent sessions imported after their first cell, one entry per
    /// cell that imported something new to its session, oldest first (at most
    /// [`preload::DEMAND_WINDOW`]; see [`Pool::later_imports`]).
    later: VecDeque<Vec<String>>,
    /// The modules its sandboxes may preload (configured, then learned; what was found
    /// missing or too big is left out). Empty where nothing is preloaded.
    candidates: Vec<String>,
    /// Plain sandboxes made at once, at most ([`MAKING_PER_KIND`]; a one-shot `run`: its
    /// pool size, see [`Pool::expect_runs`]).
    plain_at_once: usize,
    /// A one-shot process's runs still to come, when it said how many (see
    /// [`Pool::expect_runs`]): the pool never holds more than that.
    runs: Option<runs::Runs>,
    /// The last sandbox the refill workers tried to make failed.
    failing: bool,
    /// Plain sandboxes kept beyond the plan's, after runs found the pool dry (see
    /// `depth`), and the runs served since the last such miss.
    deeper: usize,
    served_since_dry: usize,
    /// When a run last took a sandbox (see [`Pool::settle`]).
    last_take: Option<tokio::time::Instant>,
    /// Runs waiting for a plain sandbox being made, and how long those take (see `late`).
    late: late::Late<L>,
}

/// One pool: sandboxes of one shape, for one tenant label, of the kinds its calls need
/// (plain, or preloaded with some of its candidate modules; see
/// [`crate::backend::preload::plan`]).
pub(crate) struct Pool<L> {
    pub(crate) limits: Limits,
    pub(crate) env: RunEnv,
    /// The tenant label of its sandboxes (`pool` for a pool any tenant may take from).
    pub(crate) label: String,
    shape: Shape,
    /// Sandboxes of all kinds the plan starts from (`--pool-size`).
    size: usize,
    state: Mutex<State<L>>,
    wake: Notify,
    /// A run took a sandbox, or the pool closed: a refill waiting in [`Pool::settle`]
    /// looks again.
    taken: Notify,
    /// A sandbox was made, or failed to be, or the pool closed (what [`RunGate`] waits on).
    made_note: Notify,
    closed: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    discarded: AtomicU64,
}

impl<L: Waiting> Pool<L> {
    pub(crate) fn new(limits: Limits, env: RunEnv, size: usize, label: &str) -> Self {
        Pool {
            shape: Shape::of(&limits, &env),
            limits,
            env,
            label: label.to_string(),
            size,
            state: Mutex::new(State {
                ready: VecDeque::new(),
                making: Vec::new(),
                plan: preload::plan(size, &[], &[]),
                demand: VecDeque::new(),
                later: VecDeque::new(),
                candidates: Vec::new(),
                plain_at_once: MAKING_PER_KIND,
                runs: None,
                failing: false,
                deeper: 0,
                served_since_dry: 0,
                last_take: None,
                late: late::Late::default(),
            }),
            wake: Notify::new(),
            taken: Notify::new(),
            made_note: Notify::new(),
            closed: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<L>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn with_preload(self, list: Vec<String>) -> Self {
        self.set_preload(list);
        self
    }

    /// The modules this pool's sandboxes may preload (each kind some of them).
    pub(crate) fn preload(&self) -> Vec<String> {
        self.state().candidates.clone()
    }

    pub(crate) fn set_preload(&self, list: Vec<String>) {
        let mut st = self.state();
        st.candidates = list;
        self.replan(&mut st);
        drop(st);
        self.wake.notify_one();
    }

    fn replan(&self, st: &mut State<L>) {
        let needs: Vec<Vec<String>> = st
            .demand
            .iter()
            .map(|i| preload::need_of(i, &st.candidates))
            .collect();
        st.plan = preload::plan(self.size, &needs, &st.candidates);
        Self::deepen_plan(st);
    }

    /// One call with `imports` came to this pool (its shape): the plan follows.
    pub(crate) fn note(&self, imports: &[String]) {
        let mut st = self.state();
        st.demand.push_back(imports.to_vec());
        while st.demand.len() > preload::DEMAND_WINDOW {
            st.demand.pop_front();
        }
        let before = st.plan.clone();
        self.replan(&mut st);
        let changed = st.plan != before;
        drop(st);
        if changed {
            self.wake.notify_one();
        }
    }

    /// A session of this pool imported `modules` after its first cell, none of them before.
    pub(crate) fn note_later(&self, modules: &[String]) {
        let mut st = self.state();
        st.later.push_back(modules.to_vec());
        while st.later.len() > preload::DEMAND_WINDOW {
            st.later.pop_front();
        }
    }

    /// What the pool's sessions commonly import after their first cell: the modules at
    /// least [`preload::LEARN_MIN_RUNS`] of its recent sessions did. A session opens on a
    /// sandbox that preloaded them as well as what its first cell imports, so that its
    /// later cells find them loaded (and the pool's demand, so its plan, follows).
    pub(crate) fn later_imports(&self) -> Vec<String> {
        let st = self.state();
        let mut counts: Vec<(&String, usize)> = Vec::new();
        for m in st.later.iter().flatten() {
            match counts.iter_mut().find(|(n, _)| *n == m) {
                Some(c) => c.1 += 1,
                None => counts.push((m, 1)),
            }
        }
        counts
            .into_iter()
            .filter(|(_, c)| *c >= preload::LEARN_MIN_RUNS)
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// Its kinds: what each preloads, how many it aims to keep, how many wait.
    pub(crate) fn mix(&self) -> Vec<KindStats> {
        let st = self.state();
        let mut out: Vec<KindStats> = st
            .plan
            .iter()
            .map(|(k, t)| KindStats {
                modules: k.clone(),
                target: *t,
                ready: 0,
                making: 0,
            })
            .collect();
        let mut at = |k: &Vec<String>| -> usize {
            match out.iter().position(|s| &s.modules == k) {
                Some(i) => i,
                None => {
                    out.push(KindStats {
                        modules: k.clone(),
                        target: 0,
                        ready: 0,
                        making: 0,
                    });
                    out.len() - 1
                }
            }
        };
        let ready: Vec<Vec<String>> = st.ready.iter().map(|(k, _)| k.clone()).collect();
        let mut idx = Vec::new();
        for k in &ready {
            idx.push((at(k), true));
        }
        for k in &st.making {
            idx.push((at(k), false));
        }
        for (i, r) in idx {
            if r {
                out[i].ready += 1;
            } else {
                out[i].making += 1;
            }
        }
        out
    }

    /// Are this pool's sandboxes of the shape a job with `limits` and `env` needs?
    pub(crate) fn fits(&self, limits: &Limits, env: &RunEnv) -> bool {
        Shape::of(limits, env) == self.shape
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// No sandbox preloading `kind` waiting right now.
    pub(crate) fn lacks(&self, kind: &[String]) -> bool {
        !self.state().ready.iter().any(|(k, _)| k == kind)
    }

    /// A live, waiting sandbox for a job with `limits`, if one fits: the one
    /// [`preload::choose`] picks for a call that imports `imports` (`None`: a session).
    pub(crate) fn take(
        &self,
        limits: &Limits,
        env: &RunEnv,
        imports: Option<&[String]>,
    ) -> Option<L> {
        self.run_taken();
        if self.is_closed() || Shape::of(limits, env) != self.shape {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if let Some(i) = imports {
            self.note(i);
        }
        let mut st = self.state();
        let need = imports.map(|i| preload::need_of(i, &st.candidates));
        let found = self.take_ready(&mut st, need.as_deref());
        self.after_take(&mut st, found.is_some());
        drop(st);
        match &found {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    /// The waiting sandbox [`preload::choose`] picks for code that needs `need` (`None`: a
    /// session), if one is usable; those found dead on the way are discarded. Wakes the
    /// refill workers either way (a take, or a miss, may leave the pool short).
    fn take_ready(
        &self,
        st: &mut std::sync::MutexGuard<'_, State<L>>,
        need: Option<&[String]>,
    ) -> Option<L> {
        let found = loop {
            let Some(at) = preload::choose(need, st.ready.iter().map(|(k, _)| k.as_slice())) else {
                break None;
            };
            let (kind, mut live) = st.ready.remove(at).expect("chosen index");
            if usable(&mut live) && live.claimed() {
                break Some((kind, live));
            }
            // Its guard removes it in the background.
            self.discarded.fetch_add(1, Ordering::Relaxed);
            drop(live);
        };
        st.last_take = Some(tokio::time::Instant::now());
        self.wake.notify_one();
        self.taken.notify_waiters();
        found.map(|(kind, mut live)| {
            tracing::debug!(pool = %self.label, preloaded = ?kind, need = ?need, "warm sandbox taken");
            live.taken(TakenFrom {
                pool: self.label.clone(),
                preloaded: kind,
            });
            live
        })
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let st = self.state();
        PoolStats {
            target: st.plan.iter().map(|(_, t)| t).sum(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            discarded: self.discarded.load(Ordering::Relaxed),
            ready: st.ready.len(),
        }
    }

    /// Stop refilling and drop every waiting sandbox (they are removed in the background).
    pub(crate) fn close(&self) {
        let drained: Vec<(Vec<String>, L)> = {
            let mut st = self.state();
            self.closed.store(true, Ordering::SeqCst);
            st.late.close();
            st.ready.drain(..).collect()
        };
        drop(drained);
        self.wake.notify_waiters();
        self.made_note.notify_waiters();
        self.taken.notify_waiters();
    }

    /// Drop waiting sandboxes that died or aged, then claim a slot for one more of a kind
    /// the plan lacks, if waiting + being made stays within the plan: plain first (cheap,
    /// and most calls need nothing more), at most [`MAKING_PER_KIND`] plain and as many
    /// preloaded ones made at a time (a plain refill never waits behind the imports; more
    /// plain ones for a pool found dry, see `depth` and `late`). When all is full but a kind
    /// lacks sandboxes, the oldest waiting sandbox of a kind over its target makes room. All
    /// under the pool lock, which is also where a made sandbox moves from "being made" to
    /// "waiting". Returns the preload list of the sandbox to make.
    fn claim(&self) -> Option<Vec<String>> {
        let mut st = self.state();
        let before = st.ready.len();
        let mut dead = Vec::new();
        let mut keep = VecDeque::with_capacity(before);
        for (k, mut live) in st.ready.drain(..) {
            if usable(&mut live) {
                keep.push_back((k, live));
            } else {
                dead.push(live);
            }
        }
        st.ready = keep;
        self.discarded
            .fetch_add(dead.len() as u64, Ordering::Relaxed);
        let count = |st: &State<L>, k: &Vec<String>| {
            st.ready.iter().filter(|(r, _)| r == k).count()
                + st.making.iter().filter(|m| *m == k).count()
        };
        if !Self::runs_allow_one_more(&st) {
            drop(st);
            drop(dead);
            return None;
        }
        let preloading = st.making.iter().filter(|m| !m.is_empty()).count();
        let plain = st.making.len() - preloading;
        // Each run waiting for a plain sandbox being made (see `late`) will take one of
        // them: the pool makes one more for it, the make its cold start would have been.
        let late = st.late.waiting();
        let lacking = st
            .plan
            .iter()
            .filter(|(k, t)| {
                if k.is_empty() {
                    // A pool that runs dry also makes more at once (see `depth`).
                    count(&st, k) < *t + late && plain < st.plain_at_once + st.deeper + late
                } else {
                    count(&st, k) < *t && preloading < MAKING_PER_KIND
                }
            })
            .map(|(k, _)| k.clone())
            .next();
        let total: usize = st.plan.iter().map(|(_, t)| t).sum::<usize>() + late;
        let held = st.ready.len() + st.making.len();
        let target_of = |k: &Vec<String>| st.plan.iter().find(|(p, _)| p == k).map_or(0, |p| p.1);
        let claimed = match lacking {
            Some(k) if held < total => Some(k),
            Some(k) => {
                // Make room: the oldest waiting sandbox of a kind with more waiting than its
                // target, plain ones first (the cheapest to make again). A kind over its
                // target only by what is being made loses nothing: the pool holds one more
                // than its target for a while instead.
                let over = |r: &Vec<String>| {
                    st.ready.iter().filter(|(o, _)| o == r).count() > target_of(r)
                };
                let at = st
                    .ready
                    .iter()
                    .position(|(r, _)| r.is_empty() && over(r))
                    .or_else(|| st.ready.iter().position(|(r, _)| over(r)));
                match at {
                    Some(i) => {
                        if let Some((_, l)) = st.ready.remove(i) {
                            dead.push(l);
                        }
                        Some(k)
                    }
                    None if held < total + 1 => Some(k),
                    None => None,
                }
            }
            None => None,
        };
        if let Some(k) = &claimed {
            st.making.push(k.clone());
            if k.is_empty() {
                st.late.began();
            }
        }
        drop(st);
        drop(dead);
        claimed
    }

    /// A sandbox preloading `kind` was made (or failed, `None`): no longer being made.
    fn made(&self, kind: &[String], live: Option<L>) -> bool {
        let mut st = self.state();
        if let Some(i) = st.making.iter().position(|m| m == kind) {
            st.making.remove(i);
        }
        if kind.is_empty() {
            st.late.ended(live.is_some());
        }
        st.failing = live.is_none();
        if live.is_some() {
            self.made_note.notify_one();
        } else {
            // Every run waiting at the gate goes its own way (cold, with the real error).
            self.made_note.notify_waiters();
        }
        match live {
            // Checked under the lock that `close` takes: nothing is pushed after it.
            Some(live) if !self.is_closed() => {
                // A plain one goes to a run waiting for it first (see `late`).
                let left = if kind.is_empty() {
                    self.to_waiting_run(&mut st, live)
                } else {
                    Some(live)
                };
                if let Some(live) = left {
                    st.ready.push_back((kind.to_vec(), live));
                }
                true
            }
            other => {
                drop(st);
                drop(other);
                false
            }
        }
    }
}
