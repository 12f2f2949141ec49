//! A backend's pools by key (shared, or one per tenant), each run by its refill workers.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{KindStats, Pool, PoolStats, RunGate, Waiting, REFILL_WORKERS};
use crate::job::{Limits, RunEnv};

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
    /// Run `pool` with [`REFILL_WORKERS`] workers (or as many as it holds, for a one-shot
    /// `run` that makes them all at once: see [`Pool::expect_runs`]), each `worker(pool)`.
    pub(crate) fn start<W, Fut>(pool: Pool<L>, worker: W) -> Self
    where
        W: Fn(Arc<Pool<L>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let pool = Arc::new(pool);
        let workers = (0..REFILL_WORKERS.max(pool.size))
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

    /// The pool a job of `tenant` with `limits` and `env` takes from, if it has one of its
    /// shape (for [`Pool::take_late`]).
    pub(crate) fn pool_of(
        &self,
        tenant: &str,
        limits: &Limits,
        env: &RunEnv,
    ) -> Option<Arc<Pool<L>>> {
        let pools = self.map();
        let (h, _) = pools.get(self.key(tenant))?;
        h.pool.fits(limits, env).then(|| h.pool.clone())
    }

    /// A one-shot process will run `runs` jobs on the shared pool (see
    /// [`Pool::expect_runs`]): the gate its runs pass before they take a sandbox; `None`
    /// without a shared pool.
    pub(crate) fn expect_runs(&self, runs: usize) -> Option<RunGate> {
        let pools = self.map();
        let (h, _) = pools.get(SHARED_POOL)?;
        h.pool.expect_runs(runs);
        Some(RunGate::new(h.pool.clone()))
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
