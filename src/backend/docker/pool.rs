//! The Docker backend's warm pool: the shared pool ([`crate::backend::pool`]) of waiting
//! containers, how a container is made for it (preloading, its CPU weight while it starts
//! and waits),
//! and what preloading learns from the runs' reports.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{DockerBackend, DockerDriver};
use crate::backend::engine::{Live, Pool, Seen};
use crate::backend::pool::Pools;
use crate::backend::preload::{Learner, PreloadConfig};
use crate::backend::protocol::Report;
use crate::job::RunEnv;

pub use crate::backend::pool::{KindStats, PoolStats};

/// One refill worker of `pool` (see [`crate::backend::pool::refill_kinds`]).
pub(super) async fn refill(inner: Arc<DockerDriver>, pool: Arc<Pool>) {
    crate::backend::pool::refill_kinds(pool, |pool, kind| make(inner.clone(), pool, kind)).await
}

/// Make one container for `pool` preloading `preload` (its kind; empty: plain), ready for
/// a job; `None` when the pool closed while it waited for a preloading permit.
async fn make(
    inner: Arc<DockerDriver>,
    pool: Arc<Pool>,
    preload: Vec<String>,
) -> Option<Result<Live, crate::backend::BackendError>> {
    // Preloading refills take CPU for a while (imports): only so many at once over all
    // pools. The request path never waits for this permit; a closing pool stops waiting
    // for it.
    let mut permit = None;
    while !preload.is_empty() && permit.is_none() {
        if pool.is_closed() {
            return None;
        }
        // A pool with no sandbox of this kind waiting may also take one of the extra
        // permits: its next run of this kind would import for itself otherwise. Looked at
        // again every 200 ms.
        let empty = pool.lacks(&preload);
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
    let _permit = permit;
    let made = async {
        let mut live = inner
            .launch_with(
                &pool.limits,
                &pool.env,
                &pool.label,
                &crate::job::new_job_id(),
                &preload,
            )
            .await?;
        // Its imports yield to the server, the daemon and the runs; so does a plain
        // sandbox's start under gVisor (its kernel boots and the runner starts through
        // it: some 180 of the 430 ms of host CPU a gVisor container takes to make here).
        // Measured at one call every 0.3 s, `print(1)` under gVisor, five alternating
        // rounds: the backend's p50 17-23 ms against 20-25 ms unlowered, p95 32-60
        // against 40-78 (better in 5 of 5 and 4 of 5). Under runc a plain start is too
        // short to matter and is left alone. The weight comes back before the job goes in.
        let gvisor = super::is_gvisor(inner.config.runtime.as_deref());
        if !preload.is_empty() || gvisor {
            if let Some(w) = super::weight::lower(live.guard.id()) {
                live.on_claim = Some(Box::new(move || w.restore()));
            }
        }
        live.wait_ready().await?;
        Ok(live)
    }
    .await;
    Some(made)
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

impl DockerDriver {
    /// What a run's report says about preloading: a pool container's preload (modules
    /// missing from the environment, or dropped because they failed or did not fit under
    /// the memory budget, are left out of that pool's list from now on, said once in the
    /// log), and the modules the run imported (learned for its tenant and environment).
    pub(super) fn observe_preload(&self, pools: &Pools<Live>, seen: Seen<'_>, report: &Report) {
        let (tenant, env, pooled) = (seen.tenant, seen.env, seen.pooled);
        let config = &self.config.preload;
        if self.config.pool.size == 0 || !config.enabled() {
            return;
        }
        let key = pools.key(tenant).to_string();
        let k = (key.clone(), env.clone());
        let mut changed = false;
        if let (true, Some(p)) = (pooled, report.preload.as_deref()) {
            let mut learner = self.preloads.learner();
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
            && self.preloads.learner().observe(&k, &imported).is_some()
        {
            tracing::info!(pool = %key, learned = ?self.preloads.learned(&key, env), "preload: learned modules changed");
            changed = true;
        }
        if changed {
            let list = self.preloads.list_for(config, &key, env);
            pools.with_pool(&key, |pool| {
                if pool.env == *env {
                    pool.set_preload(list);
                }
            });
        }
    }
}

impl DockerBackend {
    /// The modules the pool of `tenant` (the shared pool's key without per-tenant pools)
    /// may preload, each of its kinds some of them (see [`DockerBackend::pool_mix`]);
    /// `None` without such a pool.
    pub fn preload_list(&self, tenant: &str) -> Option<Vec<String>> {
        let pools = self.pools();
        pools.with_pool(pools.key(tenant), |pool| pool.preload())
    }

    /// The kinds of sandboxes the pool of `tenant` keeps (plain first), with how many it
    /// aims to keep and how many wait: the mix its recent calls needed. `None` without
    /// such a pool.
    pub fn pool_mix(&self, tenant: &str) -> Option<Vec<KindStats>> {
        self.pools().mix(tenant)
    }

    /// The modules learned for the pool of `tenant` with `env`.
    pub fn learned_preloads(&self, tenant: &str, env: &RunEnv) -> Vec<String> {
        self.driver()
            .preloads
            .learned(self.pools().key(tenant), env)
    }
}
