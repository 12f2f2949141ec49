//! A pool of running, attached, single-use pods: the Docker backend's pool semantics. The
//! request path takes a pod whose runner already waits on stdin; deleting and refilling
//! happen in the background. A pod is never given a second job: taking it removes it from
//! the pool for good. Pool pods carry no tenant data until a job is dispatched to them.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::live::Live;
use super::spec::Lifetime;
use super::Inner;
use crate::job::{Limits, RunEnv};

/// A waiting pod older than this is replaced rather than used.
pub(super) const MAX_IDLE: Duration = Duration::from_secs(600);
/// Refill workers per pool: pods made at once.
pub(super) const REFILL_WORKERS: usize = 2;
/// How often waiting pods are checked for death and age.
const PRUNE_EVERY: Duration = Duration::from_secs(2);

/// What a pod is fixed to at creation: a job fits a pool pod only when the
/// job's limits give the same shape (timeout and output cap are per job, not per pod).
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
    /// Jobs served by a waiting pod.
    pub hits: u64,
    /// Jobs that found the pool empty (or of another shape) and took the cold path.
    pub misses: u64,
    /// Waiting pods found dead or too old, and replaced.
    pub discarded: u64,
    /// Containers waiting right now.
    pub ready: usize,
}

pub(super) struct Pool {
    pub(super) limits: Limits,
    pub(super) env: RunEnv,
    /// The tenant label of its pods (`pool` for a pool any tenant may take from).
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
        }
    }

    /// Are this pool's pods of the shape a job with `limits` and `env` needs?
    pub(super) fn fits(&self, limits: &Limits, env: &RunEnv) -> bool {
        Shape::of(limits, env) == self.shape
    }

    /// A live, waiting pod for a job with `limits`, if one fits.
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
                    if live.born.elapsed() < MAX_IDLE && live.still_waiting() {
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

    /// Stop refilling and drop every waiting pod (they are removed in the background).
    pub(super) fn close(&self) {
        let drained: Vec<Live> = {
            let mut q = self.ready.lock().expect("pool lock");
            self.closed.store(true, Ordering::SeqCst);
            q.drain(..).collect()
        };
        drop(drained);
        self.wake.notify_waiters();
    }

    /// Drop waiting pods that died or aged, then claim a slot for one more if
    /// waiting + being made stays within the target. All under the pool lock, which is
    /// also where a made pod moves from "being made" to "waiting".
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
/// pods is made at once, so that refilling cannot take all of the machine away from
/// the runs themselves, yet keeps up with a sustained load.
pub(super) async fn refill(inner: Arc<Inner>, pool: Arc<Pool>) {
    let mut failures: u32 = 0;
    loop {
        if pool.closed.load(Ordering::SeqCst) {
            return;
        }
        if pool.claim() {
            let made = async {
                inner
                    .launch(
                        &pool.limits,
                        &pool.env,
                        &pool.label,
                        &crate::job::new_job_id(),
                        Lifetime::Long,
                    )
                    .await
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
                    // never counts this pod neither as waiting nor as being made.
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
