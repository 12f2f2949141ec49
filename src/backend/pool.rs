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
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::preload;
use crate::backend::BackendError;
use crate::job::{Limits, RunEnv};

/// A waiting sandbox older than this is replaced rather than used.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(600);
/// Refill workers per pool: sandboxes made at once, at most [`MAKING_PER_KIND`] plain and
/// as many preloaded ones, so that a plain refill never waits behind the imports.
pub(crate) const REFILL_WORKERS: usize = 3;
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
    /// Jobs served by a waiting sandbox.
    pub hits: u64,
    /// Jobs that found the pool empty (or of another shape) and took the cold path.
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
    /// The modules its sandboxes may preload (configured, then learned; what was found
    /// missing or too big is left out). Empty where nothing is preloaded.
    candidates: Vec<String>,
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
                candidates: Vec::new(),
            }),
            wake: Notify::new(),
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
        if self.is_closed() || Shape::of(limits, env) != self.shape {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if let Some(i) = imports {
            self.note(i);
        }
        let mut st = self.state();
        let need = imports.map(|i| preload::need_of(i, &st.candidates));
        let mut dropped = Vec::new();
        let found = loop {
            let Some(at) =
                preload::choose(need.as_deref(), st.ready.iter().map(|(k, _)| k.as_slice()))
            else {
                break None;
            };
            let (kind, mut live) = st.ready.remove(at).expect("chosen index");
            if usable(&mut live) && live.claimed() {
                break Some((kind, live));
            }
            // Dropped below: its guard removes it in the background.
            self.discarded.fetch_add(1, Ordering::Relaxed);
            dropped.push(live);
        };
        drop(st);
        drop(dropped);
        self.wake.notify_one();
        match &found {
            Some((kind, _)) => {
                tracing::debug!(pool = %self.label, preloaded = ?kind, need = ?need, "warm sandbox taken");
                self.hits.fetch_add(1, Ordering::Relaxed)
            }
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found.map(|(_, l)| l)
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
            st.ready.drain(..).collect()
        };
        drop(drained);
        self.wake.notify_waiters();
    }

    /// Drop waiting sandboxes that died or aged, then claim a slot for one more of a kind
    /// the plan lacks, if waiting + being made stays within the plan: plain first (cheap,
    /// and most calls need nothing more), at most [`MAKING_PER_KIND`] plain and as many
    /// preloaded ones made at a time (a plain refill never waits behind the imports). When all is full but a kind lacks
    /// sandboxes, the oldest waiting sandbox of a kind over its target makes room. All
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
        let preloading = st.making.iter().filter(|m| !m.is_empty()).count();
        let plain = st.making.len() - preloading;
        let lacking = st
            .plan
            .iter()
            .filter(|(k, t)| {
                count(&st, k) < *t
                    && if k.is_empty() {
                        plain < MAKING_PER_KIND
                    } else {
                        preloading < MAKING_PER_KIND
                    }
            })
            .map(|(k, _)| k.clone())
            .next();
        let total: usize = st.plan.iter().map(|(_, t)| t).sum();
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
        match live {
            // Checked under the lock that `close` takes: nothing is pushed after it.
            Some(live) if !self.is_closed() => {
                st.ready.push_back((kind.to_vec(), live));
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

/// One refill worker; each pool runs [`REFILL_WORKERS`] of them, so a bounded number of
/// sandboxes is made at once: refilling cannot take all of the machine away from the runs
/// themselves, yet keeps up with a sustained load. `make` makes one sandbox of the pool,
/// ready for a job; `None` when the pool closed while it waited to begin.
pub(crate) async fn refill<L, F, Fut>(pool: Arc<Pool<L>>, make: F)
where
    L: Waiting,
    F: Fn(Arc<Pool<L>>) -> Fut,
    Fut: Future<Output = Option<Result<L, BackendError>>>,
{
    refill_kinds(pool, |pool, _kind| make(pool)).await
}

/// [`refill`], where `make` is told what the sandbox preloads (its kind).
pub(crate) async fn refill_kinds<L, F, Fut>(pool: Arc<Pool<L>>, make: F)
where
    L: Waiting,
    F: Fn(Arc<Pool<L>>, Vec<String>) -> Fut,
    Fut: Future<Output = Option<Result<L, BackendError>>>,
{
    let mut failures: u32 = 0;
    loop {
        if pool.is_closed() {
            return;
        }
        if let Some(kind) = pool.claim() {
            let made = match make(pool.clone(), kind.clone()).await {
                Some(made) => made,
                None => {
                    pool.made(&kind, None);
                    return;
                }
            };
            match made {
                Ok(live) => {
                    if failures > 0 {
                        tracing::info!(failures, "the warm pool refills again");
                    }
                    failures = 0;
                    if !pool.made(&kind, Some(live)) {
                        return;
                    }
                    continue;
                }
                Err(e) => {
                    pool.made(&kind, None);
                    failures = failures.saturating_add(1);
                    let backoff = Duration::from_millis(100 << failures.min(7));
                    // One warning per streak of failures, not one per retry; the retries
                    // (with their back-off) are at debug level.
                    if failures == 1 {
                        tracing::warn!(error = %e, "could not refill the warm pool; retrying with back-off");
                    } else {
                        tracing::debug!(error = %e, failures, retry_in_ms = backoff.as_millis() as u64, "could not refill the warm pool");
                    }
                    // Woken early when the pool closes (or a run takes from it).
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = pool.wake.notified() => {}
                    }
                    continue;
                }
            }
        }
        tokio::select! {
            _ = pool.wake.notified() => {}
            _ = tokio::time::sleep(PRUNE_EVERY) => {}
        }
    }
}

/// The key of the one pool every tenant takes from (without per-tenant pools).
pub(crate) const SHARED_POOL: &str = "pool";
/// A tenant's pool unused this long is removed (per-tenant pools only).
pub const POOL_IDLE: Duration = Duration::from_secs(600);

/// A running pool and its refill workers.
pub(crate) struct PoolHandle<L> {
    pub(crate) pool: Arc<Pool<L>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl<L: Waiting> PoolHandle<L> {
    /// Run `pool` with [`REFILL_WORKERS`] workers, each `worker(pool)`.
    pub(crate) fn start<W, Fut>(pool: Pool<L>, worker: W) -> Self
    where
        W: Fn(Arc<Pool<L>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let pool = Arc::new(pool);
        let workers = (0..REFILL_WORKERS)
            .map(|_| tokio::spawn(worker(pool.clone())))
            .collect();
        PoolHandle { pool, workers }
    }

    /// Close the pool and wait for its workers: a worker finishes the sandbox it is making,
    /// sees the pool closed and drops it (aborting mid-create would be safe too, the guard
    /// knows the name, but slower to clean).
    async fn stop(self) {
        self.pool.close();
        for w in self.workers {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
            while !w.is_finished() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            w.abort();
        }
    }
}

/// How a backend starts a new pool running (its refill workers, what it preloads).
pub(crate) type Starter<L> = Box<dyn Fn(Pool<L>) -> PoolHandle<L> + Send + Sync>;

/// A backend's warm pools by key: [`SHARED_POOL`], or tenant ids with per-tenant pools;
/// each with the time a run last took from it. Per-tenant pools start with a tenant's
/// usual run and go after [`POOL_IDLE`] without one; a pool whose shape or environment
/// changed is replaced, the old one stopped in the background.
pub(crate) struct Pools<L> {
    size: usize,
    per_tenant: bool,
    start: Starter<L>,
    map: Mutex<std::collections::HashMap<String, (PoolHandle<L>, Instant)>>,
    /// Pools replaced or removed, still stopping.
    retiring: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// [`Pools::shutdown`] has begun: no pool is started any more.
    closed: AtomicBool,
}

impl<L: Waiting> Pools<L> {
    /// Pools of `size` sandboxes each (`0`: none), per tenant or one shared pool of
    /// `shared` (limits, environment), started at once.
    pub(crate) fn new(
        size: usize,
        per_tenant: bool,
        shared: (Limits, RunEnv),
        start: Starter<L>,
    ) -> Self {
        let mut map = std::collections::HashMap::new();
        if size > 0 && !per_tenant {
            let h = start(Pool::new(shared.0, shared.1, size, SHARED_POOL));
            map.insert(SHARED_POOL.to_string(), (h, Instant::now()));
        }
        Pools {
            size,
            per_tenant,
            start,
            map: Mutex::new(map),
            retiring: Mutex::default(),
            closed: AtomicBool::new(false),
        }
    }

    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, (PoolHandle<L>, Instant)>>
    {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The key of the pool a job of `tenant` takes from.
    pub(crate) fn key<'a>(&self, tenant: &'a str) -> &'a str {
        if self.per_tenant {
            tenant
        } else {
            SHARED_POOL
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Figures of all pools together; `None` when pools are off.
    pub(crate) fn stats(&self) -> Option<PoolStats> {
        (self.size > 0).then(|| {
            self.map()
                .values()
                .map(|(h, _)| h.pool.stats())
                .fold(PoolStats::default(), |a, b| a + b)
        })
    }

    /// `f` of the pool `key`, when there is one.
    pub(crate) fn with_pool<R>(&self, key: &str, f: impl FnOnce(&Pool<L>) -> R) -> Option<R> {
        self.map().get(key).map(|(h, _)| f(&h.pool))
    }

    fn retire(&self, old: PoolHandle<L>) {
        old.pool.close();
        let stopping = tokio::spawn(old.stop());
        self.retiring
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(stopping);
    }

    /// A waiting sandbox for a job of `tenant` with `limits` and `env`, if its pool has one
    /// of its shape (a session's choice: see [`Pools::take_for`]).
    pub(crate) fn take(
        &self,
        tenant: &str,
        limits: &Limits,
        env: &RunEnv,
        keep_warm: bool,
    ) -> Option<L> {
        self.take_for(tenant, limits, env, keep_warm, None)
    }

    /// A waiting sandbox for a job of `tenant` with `limits` and `env`, if its pool has one
    /// of its shape: for code that imports `imports`, the kind that covers it (see
    /// [`Pool::take`]), and the pool's plan follows its calls. With per-tenant pools, a
    /// tenant's usual run (`keep_warm`) starts its pool when it has none or one of another
    /// shape, and other tenants' pools unused for [`POOL_IDLE`] are removed.
    pub(crate) fn take_for(
        &self,
        tenant: &str,
        limits: &Limits,
        env: &RunEnv,
        keep_warm: bool,
        imports: Option<&[String]>,
    ) -> Option<L> {
        if self.size == 0 || self.is_closed() {
            return None;
        }
        let mut pools = self.map();
        if !self.per_tenant {
            return pools.get(SHARED_POOL)?.0.pool.take(limits, env, imports);
        }
        let idle: Vec<String> = pools
            .iter()
            .filter(|(k, (_, used))| *k != tenant && used.elapsed() > POOL_IDLE)
            .map(|(k, _)| k.clone())
            .collect();
        for k in idle {
            if let Some((h, _)) = pools.remove(&k) {
                tracing::debug!(tenant = %k, "idle tenant pool removed");
                self.retire(h);
            }
        }
        if let Some((h, used)) = pools.get_mut(tenant) {
            *used = Instant::now();
            if h.pool.fits(limits, env) || !keep_warm {
                return h.pool.take(limits, env, imports);
            }
        }
        if keep_warm {
            let h = (self.start)(Pool::new(limits.clone(), env.clone(), self.size, tenant));
            // Its first call counts: a pool started by a pandas run makes a pandas sandbox.
            if let Some(i) = imports {
                h.pool.note(i);
            }
            if let Some((old, _)) = pools.insert(tenant.to_string(), (h, Instant::now())) {
                self.retire(old);
            }
        }
        None
    }

    /// The kinds of the pool of `tenant` (see [`Pool::mix`]); `None` without such a pool.
    pub(crate) fn mix(&self, tenant: &str) -> Option<Vec<KindStats>> {
        self.with_pool(self.key(tenant), |p| p.mix())
    }

    /// Make the pool of `tenant` serve `env` (the environment runs use changed): an
    /// existing pool of another environment is replaced by one of the same limits.
    pub(crate) fn prewarm(&self, tenant: &str, env: &RunEnv) {
        if self.size == 0 || self.is_closed() {
            return;
        }
        let key = self.key(tenant);
        let mut pools = self.map();
        let limits = match pools.get(key) {
            Some((h, _)) if &h.pool.env != env => h.pool.limits.clone(),
            _ => return,
        };
        let new = (self.start)(Pool::new(limits, env.clone(), self.size, key));
        if let Some((old, _)) = pools.insert(key.to_string(), (new, Instant::now())) {
            self.retire(old);
        }
    }

    /// Start no pool any more, stop every pool and wait for them (their sandboxes are
    /// dropped, so removed by their guards).
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let handles: Vec<PoolHandle<L>> = self.map().drain().map(|(_, (h, _))| h).collect();
        for h in handles {
            h.stop().await;
        }
        let retiring =
            std::mem::take(&mut *self.retiring.lock().unwrap_or_else(|e| e.into_inner()));
        for r in retiring {
            let _ = r.await;
        }
    }
}

impl<L> Drop for Pools<L> {
    fn drop(&mut self) {
        let map = self.map.get_mut().unwrap_or_else(|e| e.into_inner());
        for (h, _) in map.values() {
            // Workers stop by themselves once they see the pool closed.
            h.pool.closed.store(true, Ordering::SeqCst);
            h.pool.wake.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox that is alive until told otherwise, and says which one it is.
    struct Fake(u32, bool);

    impl Waiting for Fake {
        fn waiting_since(&mut self) -> Option<Instant> {
            self.1.then(Instant::now)
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn pool(size: usize) -> Pool<Fake> {
        Pool::new(Limits::default(), RunEnv::default(), size, "t").with_preload(s(&[
            "numpy",
            "pandas",
            "matplotlib.pyplot",
        ]))
    }

    /// Let the refill workers do all they would: claim and make until the plan is met.
    fn fill(p: &Pool<Fake>, next: &mut u32) -> Vec<Vec<String>> {
        fill_ids(p, next).into_iter().map(|(k, _)| k).collect()
    }

    /// [`fill`], with the ids of the sandboxes made.
    fn fill_ids(p: &Pool<Fake>, next: &mut u32) -> Vec<(Vec<String>, u32)> {
        let mut made = Vec::new();
        while let Some(kind) = p.claim() {
            *next += 1;
            p.made(&kind, Some(Fake(*next, true)));
            made.push((kind, *next));
        }
        made
    }

    fn take(p: &Pool<Fake>, code: &str) -> Option<Fake> {
        let imports = crate::backend::preload::imports_in(code.as_bytes());
        p.take(&Limits::default(), &RunEnv::default(), Some(&imports))
    }

    fn ready_of(p: &Pool<Fake>, kind: &[String]) -> usize {
        p.mix()
            .iter()
            .find(|k| k.modules == kind)
            .map_or(0, |k| k.ready)
    }

    #[test]
    fn without_demand_a_pool_is_all_plain_and_plain_calls_keep_it_so() {
        let p = pool(2);
        let mut n = 0;
        assert_eq!(fill(&p, &mut n), vec![Vec::<String>::new(); 2]);
        for _ in 0..20 {
            assert!(take(&p, "print(1)").is_some());
            assert!(fill(&p, &mut n).iter().all(|k| k.is_empty()));
        }
        assert_eq!(p.stats().target, 2);
        assert_eq!(p.mix().len(), 1, "{:?}", p.mix());
    }

    #[test]
    fn a_plain_call_takes_a_plain_sandbox_and_a_pandas_call_a_preloaded_one() {
        let p = pool(2);
        let mut n = 0;
        fill(&p, &mut n);
        // The first pandas call: none waits that has pandas, so a plain one (never cold).
        let first = take(&p, "import pandas as pd\nprint(1)").expect("a plain one");
        assert!(first.0 <= 2);
        let pandas: Vec<u32> = fill_ids(&p, &mut n)
            .into_iter()
            .filter(|(k, _)| k == &s(&["pandas"]))
            .map(|(_, id)| id)
            .collect();
        assert!(!pandas.is_empty(), "{:?}", p.mix());
        // A plain call never takes a pandas sandbox while a plain one waits.
        let plain = take(&p, "import os, json\nprint(1)").expect("plain");
        assert!(!pandas.contains(&plain.0));
        assert_eq!(ready_of(&p, &s(&["pandas"])), pandas.len());
        // The pandas call takes one.
        let got = take(&p, "import numpy as np\nimport pandas\n").expect("pandas");
        assert!(pandas.contains(&got.0));
        // With no plain sandbox waiting, a plain call takes a preloaded one, not cold.
        fill(&p, &mut n);
        while ready_of(&p, &[]) > 0 {
            take(&p, "print(1)").expect("plain");
        }
        assert!(ready_of(&p, &s(&["pandas"])) >= 1);
        assert!(take(&p, "print(1)").is_some());
    }

    #[test]
    fn the_mix_follows_demand_and_a_plain_refill_never_waits_behind_imports() {
        let p = pool(2);
        let mut n = 0;
        fill(&p, &mut n);
        let calls = [
            "print(1)",
            "print(2)",
            "import pandas",
            "print(3)",
            "import matplotlib.pyplot as plt",
            "x = 1",
            "import pandas",
            "print(4)",
            "print(5)",
            "y = 2",
        ];
        for c in calls.iter().cycle().take(30) {
            take(&p, c);
            // At most two preloaded being made at once, and two plain.
            let mut claimed = Vec::new();
            while let Some(k) = p.claim() {
                claimed.push(k);
            }
            let pre = claimed.iter().filter(|k| !k.is_empty()).count();
            assert!(pre <= MAKING_PER_KIND && claimed.len() - pre <= MAKING_PER_KIND);
            for k in claimed {
                p.made(&k, Some(Fake(0, true)));
            }
            fill(&p, &mut n);
        }
        let mix = p.mix();
        let want = |k: &[&str], t: usize| {
            let m = mix
                .iter()
                .find(|m| m.modules == s(k))
                .unwrap_or_else(|| panic!("{k:?} in {mix:?}"));
            assert_eq!((m.target, m.ready), (t, t), "{mix:?}");
        };
        want(&[], 2);
        want(&["pandas"], 1);
        want(&["matplotlib.pyplot"], 1);
        // Demand moves to plain only: the preloaded kinds leave the plan, and their waiting
        // sandboxes make room when a kind lacks one.
        for _ in 0..DEMAND_WINDOW_FOR_TESTS {
            take(&p, "print(1)");
            fill(&p, &mut n);
        }
        assert_eq!(p.stats().target, 2, "{:?}", p.mix());
        // The tenant turns to pandas: the plain surplus goes, pandas sandboxes come.
        for _ in 0..DEMAND_WINDOW_FOR_TESTS {
            take(&p, "import pandas");
            fill(&p, &mut n);
        }
        assert_eq!(ready_of(&p, &s(&["pandas"])), 2, "{:?}", p.mix());
        assert_eq!(ready_of(&p, &[]), 1, "{:?}", p.mix());
    }

    const DEMAND_WINDOW_FOR_TESTS: usize = crate::backend::preload::DEMAND_WINDOW;

    #[test]
    fn a_dead_sandbox_is_never_given_and_nothing_preloads_without_candidates() {
        let p: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 1, "t");
        let mut n = 0;
        fill(&p, &mut n);
        assert!(take(&p, "import pandas").is_some());
        assert_eq!(fill(&p, &mut n), vec![Vec::<String>::new()]);
        p.made(&[], Some(Fake(99, false)));
        assert!(take(&p, "print(1)").is_some_and(|got| got.0 != 99));
        assert!(take(&p, "print(1)").is_none());
        assert_eq!(p.stats().discarded, 1);
    }
}
