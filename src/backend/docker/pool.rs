//! A pool of pre-started, single-use containers. The request path takes a container whose
//! runner already waits on stdin; killing, removing and refilling happen in the
//! background. A container is never given a second job: taking it removes it from the
//! pool for good. Pool containers carry no tenant data until a job is dispatched to them;
//! on a multi-tenant server each tenant has its own pool, so they carry its label from birth.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::live::Live;
use super::{DockerBackend, Inner, SHARED_POOL};
use crate::backend::preload::{Learner, PreloadConfig};
use crate::backend::protocol::Report;
use crate::job::{JobSpec, Limits, RunEnv};

/// A waiting container older than this is replaced rather than used.
const MAX_IDLE: Duration = Duration::from_secs(600);
/// Refill workers per pool: containers made at once.
pub(super) const REFILL_WORKERS: usize = 2;
/// How often waiting containers are checked for death and age.
const PRUNE_EVERY: Duration = Duration::from_secs(2);

/// What a container is fixed to at creation: a job fits a pool container only when the
/// job's limits give the same shape (timeout and output cap are per job, not per container).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Shape {
    memory_bytes: u64,
    cpus_milli: u64,
    pids: i64,
    workspace_bytes: u64,
    tmp_bytes: u64,
    nofile: u64,
    env: RunEnv,
}

impl Shape {
    pub(super) fn of(l: &Limits, env: &RunEnv) -> Shape {
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
    /// Containers the pools aim to keep waiting (all pools together).
    pub target: usize,
    /// Jobs served by a waiting container.
    pub hits: u64,
    /// Jobs that found the pool empty (or of another shape) and took the cold path.
    pub misses: u64,
    /// Waiting containers found dead or too old, and replaced.
    pub discarded: u64,
    /// Containers waiting right now.
    pub ready: usize,
}

pub(super) struct Pool {
    pub(super) limits: Limits,
    pub(super) env: RunEnv,
    /// The tenant label of its containers (`pool` for a pool any tenant may take from).
    pub(super) label: String,
    shape: Shape,
    target: usize,
    ready: Mutex<VecDeque<Live>>,
    wake: Notify,
    closed: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    discarded: AtomicU64,
    /// Containers being made right now by the refill workers.
    in_flight: AtomicUsize,
    /// The modules its containers import before they say ready (configured, then
    /// learned; what was found missing or too big is left out).
    preload: Mutex<Vec<String>>,
}

impl Pool {
    pub(super) fn new(limits: Limits, env: RunEnv, target: usize, label: &str) -> Self {
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

    pub(super) fn with_preload(self, list: Vec<String>) -> Self {
        *self.preload.lock().expect("pool lock") = list;
        self
    }

    /// The list the next container of this pool preloads.
    pub(super) fn preload(&self) -> Vec<String> {
        self.preload.lock().expect("pool lock").clone()
    }

    /// Are this pool's containers of the shape a job with `limits` and `env` needs?
    pub(super) fn fits(&self, limits: &Limits, env: &RunEnv) -> bool {
        Shape::of(limits, env) == self.shape
    }

    /// A live, waiting container for a job with `limits`, if one fits.
    pub(super) fn take(&self, limits: &Limits, env: &RunEnv) -> Option<Live> {
        if self.closed.load(Ordering::SeqCst) || Shape::of(limits, env) != self.shape {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let mut q = self.ready.lock().expect("pool lock");
        let found = loop {
            match q.pop_front() {
                None => break None,
                Some(mut live) => {
                    // A preloading container gets its CPU weight back before it runs.
                    let weighted = live.weight.take().is_none_or(|w| w.restore());
                    if weighted && live.born.elapsed() < MAX_IDLE && live.still_waiting() {
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

    pub(super) fn stats(&self) -> PoolStats {
        PoolStats {
            target: self.target,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            discarded: self.discarded.load(Ordering::Relaxed),
            ready: self.ready.lock().expect("pool lock").len(),
        }
    }

    /// Stop refilling and drop every waiting container (they are removed in the background).
    pub(super) fn close(&self) {
        let drained: Vec<Live> = {
            let mut q = self.ready.lock().expect("pool lock");
            self.closed.store(true, Ordering::SeqCst);
            q.drain(..).collect()
        };
        drop(drained);
        self.wake.notify_waiters();
    }

    /// Drop waiting containers that died or aged, then claim a slot for one more if
    /// waiting + being made stays within the target. All under the pool lock, which is
    /// also where a made container moves from "being made" to "waiting".
    fn claim(&self) -> bool {
        let mut q = self.ready.lock().expect("pool lock");
        let before = q.len();
        q.retain_mut(|live| live.born.elapsed() < MAX_IDLE && live.still_waiting());
        self.discarded
            .fetch_add((before - q.len()) as u64, Ordering::Relaxed);
        let claimed = q.len() + self.in_flight.load(Ordering::SeqCst) < self.target;
        if claimed {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        claimed
    }
}

/// One refill worker. The pool runs [`REFILL_WORKERS`] of them: a bounded number of
/// containers is made at once, so that refilling cannot take all of the machine away from
/// the runs themselves, yet keeps up with a sustained load.
pub(super) async fn refill(inner: Arc<Inner>, pool: Arc<Pool>) {
    let mut failures: u32 = 0;
    loop {
        if pool.closed.load(Ordering::SeqCst) {
            return;
        }
        if pool.claim() {
            let preload = pool.preload();
            // Preloading refills take CPU for a while (imports): only so many at once over
            // all pools. The request path never waits for this permit; a closing pool
            // stops waiting for it.
            let mut permit = None;
            while !preload.is_empty() && permit.is_none() {
                if pool.closed.load(Ordering::SeqCst) {
                    pool.in_flight.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                // A pool with nothing waiting may also take one of the extra permits:
                // its next run would go cold otherwise. Looked at again every 200 ms.
                let empty = pool.ready.lock().expect("pool lock").is_empty();
                let slots = &inner.preloads;
                let wait = async {
                    if empty {
                        tokio::select! {
                            p = slots.slots.acquire() => p,
                            p = slots.extra.acquire() => p,
                        }
                    } else {
                        slots.slots.acquire().await
                    }
                };
                if let Ok(p) = tokio::time::timeout(Duration::from_millis(200), wait).await {
                    permit = Some(p);
                }
            }
            let made = async {
                let _permit = permit;
                let mut live = inner
                    .launch_with(
                        &pool.limits,
                        &pool.env,
                        &pool.label,
                        &crate::job::new_job_id(),
                        &preload,
                    )
                    .await?;
                if !preload.is_empty() {
                    // Its imports yield to the server, the daemon and the runs.
                    live.weight = super::weight::lower(live.guard.id());
                }
                live.wait_ready().await?;
                Ok::<_, crate::backend::BackendError>(live)
            }
            .await;
            match made {
                Ok(live) => {
                    if failures > 0 {
                        tracing::info!(failures, "the warm pool refills again");
                    }
                    failures = 0;
                    // Checked under the lock that `close` takes: nothing is pushed after it.
                    // The slot is released under the same lock, so that another worker
                    // never counts this container neither as waiting nor as being made.
                    let mut q = pool.ready.lock().expect("pool lock");
                    pool.in_flight.fetch_sub(1, Ordering::SeqCst);
                    if pool.closed.load(Ordering::SeqCst) {
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

/// What preloading shares over all pools of a backend: how many preloading refills may run
/// at once, and what was learned per pool key (tenant, or the shared pool) and environment.
pub(super) struct Preloads {
    pub(super) slots: tokio::sync::Semaphore,
    /// The rest of the cores, for refills of a pool with nothing waiting (see
    /// [`preload_slots`]).
    pub(super) extra: tokio::sync::Semaphore,
    learner: Mutex<Learner<(String, RunEnv)>>,
}

/// Preloading refills at once over all pools: one per two cores (at least one), and up to
/// one per core while a pool has nothing waiting. Imports keep a core busy for about half
/// a second per sandbox; with half the cores left to the server, the Docker daemon and the
/// runs, a refill does not slow the runs it serves (on two cores, two preloading refills
/// at once made `print(1)` some 30% slower), but an empty pool means the next run goes
/// cold, which costs it far more. The bound also keeps many pools (tenants) from
/// importing all at once. Returns (always, only for an empty pool).
pub(super) fn preload_slots() -> (usize, usize) {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(1);
    let base = (cores / 2).max(1);
    (base, cores - base)
}

impl Preloads {
    pub(super) fn new(config: &PreloadConfig) -> Self {
        let (base, extra) = preload_slots();
        Preloads {
            slots: tokio::sync::Semaphore::new(base),
            extra: tokio::sync::Semaphore::new(extra),
            learner: Mutex::new(Learner::new(config.learn_max)),
        }
    }

    fn learner(&self) -> std::sync::MutexGuard<'_, Learner<(String, RunEnv)>> {
        self.learner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The preload list of the pool `key` with `env`: the configured modules, then the
    /// learned ones, less what this key found missing or too big.
    pub(super) fn list_for(&self, config: &PreloadConfig, key: &str, env: &RunEnv) -> Vec<String> {
        let k = (key.to_string(), env.clone());
        let learner = self.learner();
        let banned = learner.banned(&k);
        let mut out: Vec<String> = Vec::new();
        let learned = if config.learn {
            learner.learned(&k)
        } else {
            Vec::new()
        };
        for n in config.modules_for(key).iter().chain(learned.iter()) {
            if !banned.contains(n) && !out.contains(n) {
                out.push(n.clone());
            }
        }
        out
    }

    /// The modules learned for the pool `key` with `env` (for tests and the docs' example).
    pub(super) fn learned(&self, key: &str, env: &RunEnv) -> Vec<String> {
        self.learner().learned(&(key.to_string(), env.clone()))
    }
}

impl DockerBackend {
    /// The key of the pool a job of `job.tenant` takes from.
    fn pool_key<'a>(&self, job: &'a JobSpec) -> &'a str {
        if self.inner.config.pool_per_tenant {
            &job.tenant
        } else {
            SHARED_POOL
        }
    }

    /// What a run's report says about preloading: a pool container's preload (modules
    /// missing from the environment, or dropped because they failed or did not fit under
    /// the memory budget, are left out of that pool's list from now on, said once in the
    /// log), and the modules the run imported (learned for its tenant and environment).
    pub(super) fn observe_preload(&self, job: &JobSpec, pooled: bool, report: &Report) {
        let config = &self.inner.config.preload;
        if self.inner.config.pool_size == 0 || !config.enabled() {
            return;
        }
        let key = self.pool_key(job).to_string();
        let k = (key.clone(), job.env.clone());
        let mut changed = false;
        if let (true, Some(p)) = (pooled, report.preload.as_deref()) {
            let mut learner = self.inner.preloads.learner();
            let banned = learner.banned(&k);
            let fresh: Vec<String> = p
                .missing
                .iter()
                .chain(p.dropped.iter())
                .filter(|n| !banned.contains(*n))
                .take(32)
                .cloned()
                .collect();
            if !fresh.is_empty() {
                let missing: Vec<&String> =
                    fresh.iter().filter(|n| p.missing.contains(n)).collect();
                let dropped: Vec<&String> =
                    fresh.iter().filter(|n| p.dropped.contains(n)).collect();
                if !missing.is_empty() {
                    tracing::info!(pool = %key, modules = ?missing, "preload: not in the environment, skipped from now on");
                }
                if !dropped.is_empty() {
                    tracing::warn!(pool = %key, modules = ?dropped, memory_percent = config.memory_percent, "preload: dropped for this pool (did not fit under its memory limit, or failed at import)");
                }
                learner.ban(&k, &fresh);
                changed = true;
            }
        }
        // What the configured list preloads anyway is not learned (`matplotlib` is
        // covered by `matplotlib.pyplot`, `numpy.linalg` by `numpy`).
        let configured = config.modules_for(&key);
        let imported: Vec<String> = report
            .imported
            .iter()
            .filter(|n| {
                !configured.iter().any(|m| {
                    m == *n || m.starts_with(&format!("{n}.")) || n.starts_with(&format!("{m}."))
                })
            })
            .cloned()
            .collect();
        if config.learn
            && !imported.is_empty()
            && self
                .inner
                .preloads
                .learner()
                .observe(&k, &imported)
                .is_some()
        {
            tracing::info!(pool = %key, learned = ?self.inner.preloads.learned(&key, &job.env), "preload: learned modules changed");
            changed = true;
        }
        if changed {
            let pools = self.pools();
            if let Some((h, _)) = pools.get(&key) {
                if h.pool.env == job.env {
                    let list = self.inner.preloads.list_for(config, &key, &job.env);
                    *h.pool.preload.lock().expect("pool lock") = list;
                }
            }
        }
    }

    /// The preload list the pool of `tenant` (the shared pool's key without per-tenant
    /// pools) makes its next container with; `None` without such a pool.
    pub fn preload_list(&self, tenant: &str) -> Option<Vec<String>> {
        let key = if self.inner.config.pool_per_tenant {
            tenant
        } else {
            SHARED_POOL
        };
        self.pools().get(key).map(|(h, _)| h.pool.preload())
    }

    /// The modules learned for the pool of `tenant` with `env`.
    pub fn learned_preloads(&self, tenant: &str, env: &RunEnv) -> Vec<String> {
        let key = if self.inner.config.pool_per_tenant {
            tenant
        } else {
            SHARED_POOL
        };
        self.inner.preloads.learned(key, env)
    }
}
