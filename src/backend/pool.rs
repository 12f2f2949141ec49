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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::BackendError;
use crate::job::{Limits, RunEnv};

/// A waiting sandbox older than this is replaced rather than used.
pub(crate) const MAX_IDLE: Duration = Duration::from_secs(600);
/// Refill workers per pool: sandboxes made at once.
pub(crate) const REFILL_WORKERS: usize = 2;
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

/// One pool: sandboxes of one shape, for one tenant label.
pub(crate) struct Pool<L> {
    pub(crate) limits: Limits,
    pub(crate) env: RunEnv,
    /// The tenant label of its sandboxes (`pool` for a pool any tenant may take from).
    pub(crate) label: String,
    shape: Shape,
    target: usize,
    ready: Mutex<VecDeque<L>>,
    wake: Notify,
    closed: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    discarded: AtomicU64,
    /// Sandboxes being made right now by the refill workers.
    in_flight: AtomicUsize,
    /// The modules its sandboxes import before they say ready (configured, then learned;
    /// what was found missing or too big is left out). Empty where nothing is preloaded.
    preload: Mutex<Vec<String>>,
}

impl<L: Waiting> Pool<L> {
    pub(crate) fn new(limits: Limits, env: RunEnv, target: usize, label: &str) -> Self {
        Pool {
            shape: Shape::of(&limits, &env),
            limits,
            env,
            label: label.to_string(),
            target,
            ready: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            preload: Mutex::default(),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<L>> {
        self.ready.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn with_preload(self, list: Vec<String>) -> Self {
        self.set_preload(list);
        self
    }

    /// The list the next sandbox of this pool preloads.
    pub(crate) fn preload(&self) -> Vec<String> {
        self.preload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_preload(&self, list: Vec<String>) {
        *self.preload.lock().unwrap_or_else(|e| e.into_inner()) = list;
    }

    /// Are this pool's sandboxes of the shape a job with `limits` and `env` needs?
    pub(crate) fn fits(&self, limits: &Limits, env: &RunEnv) -> bool {
        Shape::of(limits, env) == self.shape
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Nothing waiting right now.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue().is_empty()
    }

    /// A live, waiting sandbox for a job with `limits`, if one fits.
    pub(crate) fn take(&self, limits: &Limits, env: &RunEnv) -> Option<L> {
        if self.is_closed() || Shape::of(limits, env) != self.shape {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let mut q = self.queue();
        let found = loop {
            match q.pop_front() {
                None => break None,
                Some(mut live) => {
                    if usable(&mut live) && live.claimed() {
                        break Some(live);
                    }
                    // Dropped here: its guard removes it in the background.
                    self.discarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        };
        drop(q);
        self.wake.notify_one();
        match &found {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        found
    }

    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            target: self.target,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            discarded: self.discarded.load(Ordering::Relaxed),
            ready: self.queue().len(),
        }
    }

    /// Stop refilling and drop every waiting sandbox (they are removed in the background).
    pub(crate) fn close(&self) {
        let drained: Vec<L> = {
            let mut q = self.queue();
            self.closed.store(true, Ordering::SeqCst);
            q.drain(..).collect()
        };
        drop(drained);
        self.wake.notify_waiters();
    }

    /// Drop waiting sandboxes that died or aged, then claim a slot for one more if
    /// waiting + being made stays within the target. All under the pool lock, which is
    /// also where a made sandbox moves from "being made" to "waiting".
    fn claim(&self) -> bool {
        let mut q = self.queue();
        let before = q.len();
        q.retain_mut(usable);
        self.discarded
            .fetch_add((before - q.len()) as u64, Ordering::Relaxed);
        let claimed = q.len() + self.in_flight.load(Ordering::SeqCst) < self.target;
        if claimed {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        claimed
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
    let mut failures: u32 = 0;
    loop {
        if pool.is_closed() {
            return;
        }
        if pool.claim() {
            let made = match make(pool.clone()).await {
                Some(made) => made,
                None => {
                    pool.in_flight.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
            };
            match made {
                Ok(live) => {
                    if failures > 0 {
                        tracing::info!(failures, "the warm pool refills again");
                    }
                    failures = 0;
                    // Checked under the lock that `close` takes: nothing is pushed after it.
                    // The slot is released under the same lock, so that another worker
                    // never counts this sandbox neither as waiting nor as being made.
                    let mut q = pool.queue();
                    pool.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if pool.is_closed() {
                        drop(q);
                        drop(live);
                        return;
                    }
                    q.push_back(live);
                    continue;
                }
                Err(e) => {
                    pool.in_flight.fetch_sub(1, Ordering::SeqCst);
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
    /// of its shape. With per-tenant pools, a tenant's usual run (`keep_warm`) starts its
    /// pool when it has none or one of another shape, and other tenants' pools unused for
    /// [`POOL_IDLE`] are removed.
    pub(crate) fn take(
        &self,
        tenant: &str,
        limits: &Limits,
        env: &RunEnv,
        keep_warm: bool,
    ) -> Option<L> {
        if self.size == 0 || self.is_closed() {
            return None;
        }
        let mut pools = self.map();
        if !self.per_tenant {
            return pools.get(SHARED_POOL)?.0.pool.take(limits, env);
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
                return h.pool.take(limits, env);
            }
        }
        if keep_warm {
            let h = (self.start)(Pool::new(limits.clone(), env.clone(), self.size, tenant));
            if let Some((old, _)) = pools.insert(tenant.to_string(), (h, Instant::now())) {
                self.retire(old);
            }
        }
        None
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
