//! The Kubernetes backend: one fresh, hardened Pod per run (or per session), optionally
//! taken from a warm pool of running, attached pods. kube-rs and k8s-openapi types stay in
//! here, behind the `kubernetes` cargo feature.
//!
//! Lifecycle of a run: create the pod ([`spec`]: the runner as its command waiting on
//! stdin, `restartPolicy: Never`, the hardening in its securityContext, the job's limits,
//! memory-backed emptyDirs for `/workspace` and `/tmp`, `activeDeadlineSeconds` as a
//! backstop) → wait until its container runs → `pods/attach` (WebSocket,
//! `v5.channel.k8s.io`) → stream the job into the runner's stdin with the same protocol as
//! the Docker backend ([`protocol`]) and close it (a clean EOF with v5) → decode the framed
//! stdout → the result as soon as the `X` frame arrives. The pod is deleted in the
//! background on every path by a guard. A runner that vanished is judged by the pod's
//! status (`OOMKilled`, `DeadlineExceeded`).
//!
//! One file per concern: [`spec`] (the pod), `live` (create, attach, the conversation),
//! `session` (a pod per session), `pool` (warm pods), `guard` (deletion, sweeps by label).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use tokio::task::JoinHandle;

use self::guard::Cleanup;
use self::live::{Live, Verdict};
use self::pool::Pool;
pub use self::pool::PoolStats;
use self::session::KubeSession;
pub use self::spec::OwnerPod;
use self::spec::{Lifetime, LABEL_MANAGED, LABEL_OWNER};
use super::protocol;
use super::{emit, Backend, BackendError, BackendInfo, BackendStats, Events, Session};
use crate::backend::collect::Ended;
use crate::job::{JobSpec, Limits, Outcome, RunEnv, RunEvent};

mod guard;
mod live;
mod pool;
mod session;
pub mod spec;

/// Settings of the Kubernetes backend.
#[derive(Debug, Clone)]
pub struct KubeConfig {
    /// The sandbox image, as the nodes pull it.
    pub image: String,
    /// `imagePullPolicy` of sandbox pods (`IfNotPresent`).
    pub pull_policy: String,
    /// The interpreter inside the sandbox that runs the code.
    pub python: String,
    /// A kubeconfig file; `None`: in-cluster, else `KUBECONFIG` / `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// Where sandbox pods live; empty: the kubeconfig context's (or the in-cluster
    /// service account's) namespace.
    pub namespace: String,
    /// `runtimeClassName` of sandbox pods (e.g. `gvisor`); `None`: the cluster's default.
    pub runtime_class: Option<String>,
    /// Pods kept running and attached, waiting for a job (0: no warm pool).
    pub pool_size: usize,
    pub pool_limits: Limits,
    pub pool_env: RunEnv,
    /// One pool per tenant, made at its first run (see the Docker backend).
    pub pool_per_tenant: bool,
    /// The PVC that holds the server's data directory (environments, installs); `None`:
    /// sandboxes have the image's Python only and installs are refused.
    pub env_volume: Option<String>,
    /// The server's data directory (the environment volume's mount point on the server).
    pub data_dir: Option<PathBuf>,
    /// The server's own pod, when it runs in the cluster: sandboxes get an
    /// `ownerReference` to it (same namespace only) and an annotation the sweep reads.
    pub owner_pod: Option<OwnerPod>,
    /// `activeDeadlineSeconds` of warm pods and session pods.
    pub long_deadline: Duration,
}

impl KubeConfig {
    pub fn new(image: impl Into<String>) -> Self {
        KubeConfig {
            image: image.into(),
            pull_policy: "IfNotPresent".into(),
            python: crate::backend::image::PYTHON.into(),
            kubeconfig: None,
            namespace: String::new(),
            runtime_class: None,
            pool_size: 0,
            pool_limits: Limits::default(),
            pool_env: RunEnv::default(),
            pool_per_tenant: false,
            env_volume: None,
            data_dir: None,
            owner_pod: None,
            long_deadline: Duration::from_secs(4 * 3600),
        }
    }
}

/// A tenant's pool unused this long is removed (per-tenant pools only).
pub const POOL_IDLE: Duration = Duration::from_secs(600);
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);
const SHARED_POOL: &str = "pool";

/// What the request path and the pool's refill task share.
pub(super) struct Inner {
    client: Client,
    pods: Api<Pod>,
    config: KubeConfig,
    cleanup: Arc<Cleanup>,
    owner: String,
}

/// The Kubernetes backend.
pub struct KubeBackend {
    inner: Arc<Inner>,
    pools: std::sync::Mutex<HashMap<String, (PoolHandle, Instant)>>,
    retiring: std::sync::Mutex<Vec<JoinHandle<()>>>,
    closed: std::sync::atomic::AtomicBool,
    sweeper: std::sync::Mutex<Option<JoinHandle<()>>>,
}

struct PoolHandle {
    pool: Arc<Pool>,
    workers: Vec<JoinHandle<()>>,
}

impl PoolHandle {
    fn start(inner: &Arc<Inner>, limits: Limits, env: RunEnv, size: usize, label: &str) -> Self {
        let pool = Arc::new(Pool::new(limits, env, size, label));
        let workers = (0..crate::backend::pool::REFILL_WORKERS)
            .map(|_| tokio::spawn(pool::refill(inner.clone(), pool.clone())))
            .collect();
        PoolHandle { pool, workers }
    }

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

/// A client from `kubeconfig` (or the usual places: in-cluster, `KUBECONFIG`,
/// `~/.kube/config`), and the namespace it defaults to.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, BackendError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                BackendError::Unreachable {
                    what: "the Kubernetes API",
                    detail: format!("reading {}: {e}", path.display()),
                    hint: "Check the --kubeconfig file",
                }
            })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| unreachable(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| unreachable(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| unreachable(e.to_string()))
}

impl KubeBackend {
    /// Connect, check that pods can be listed in the namespace, and start filling the
    /// warm pool if one is configured.
    pub async fn connect(mut config: KubeConfig) -> Result<Self, BackendError> {
        let client = client(config.kubeconfig.as_deref()).await?;
        if config.namespace.is_empty() {
            config.namespace = client.default_namespace().to_string();
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
        pods.list(&ListParams::default().limit(1))
            .await
            .map_err(|e| classify("listing pods", e))?;
        let inner = Arc::new(Inner {
            client,
            pods,
            owner: crate::backend::docker::owner_label(std::process::id())
                .unwrap_or_else(|| "unknown".into()),
            cleanup: Arc::default(),
            config,
        });
        let c = &inner.config;
        let mut pools = HashMap::new();
        if c.pool_size > 0 && !c.pool_per_tenant {
            let h = PoolHandle::start(
                &inner,
                c.pool_limits.clone(),
                c.pool_env.clone(),
                c.pool_size,
                SHARED_POOL,
            );
            pools.insert(SHARED_POOL.to_string(), (h, Instant::now()));
        }
        Ok(KubeBackend {
            inner,
            pools: std::sync::Mutex::new(pools),
            retiring: std::sync::Mutex::default(),
            closed: std::sync::atomic::AtomicBool::new(false),
            sweeper: std::sync::Mutex::default(),
        })
    }

    /// The namespace sandbox pods go to.
    pub fn namespace(&self) -> &str {
        &self.inner.config.namespace
    }

    /// The label selector of the pods this process made (tests, operators).
    pub fn own_pods_selector(&self) -> String {
        format!(
            "{LABEL_MANAGED}=true,{LABEL_OWNER}={}",
            spec::owner_label(&self.inner.owner)
        )
    }

    fn pools(&self) -> std::sync::MutexGuard<'_, HashMap<String, (PoolHandle, Instant)>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pool figures, all pools together; `None` when the pool is off.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        if self.inner.config.pool_size == 0 {
            return None;
        }
        Some(
            self.pools()
                .values()
                .map(|(h, _)| h.pool.stats())
                .fold(PoolStats::default(), |a, b| a + b),
        )
    }

    fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn retire(&self, old: PoolHandle) {
        old.pool.close();
        let stopping = tokio::spawn(old.stop());
        self.retiring.lock().expect("retiring lock").push(stopping);
    }

    /// A waiting pod for `job`, if its pool has one of its shape (the Docker backend's
    /// rules, per-tenant pools included).
    fn take_warm(&self, job: &JobSpec) -> Option<Live> {
        if self.inner.config.pool_size == 0 || self.is_closed() {
            return None;
        }
        let mut pools = self.pools();
        if !self.inner.config.pool_per_tenant {
            return pools.get(SHARED_POOL)?.0.pool.take(&job.limits, &job.env);
        }
        let idle: Vec<String> = pools
            .iter()
            .filter(|(k, (_, used))| **k != job.tenant && used.elapsed() > POOL_IDLE)
            .map(|(k, _)| k.clone())
            .collect();
        for k in idle {
            if let Some((h, _)) = pools.remove(&k) {
                self.retire(h);
            }
        }
        if let Some((h, used)) = pools.get_mut(&job.tenant) {
            *used = Instant::now();
            if h.pool.fits(&job.limits, &job.env) || !job.keep_warm {
                return h.pool.take(&job.limits, &job.env);
            }
        }
        if job.keep_warm {
            let h = PoolHandle::start(
                &self.inner,
                job.limits.clone(),
                job.env.clone(),
                self.inner.config.pool_size,
                &job.tenant,
            );
            if let Some((old, _)) = pools.insert(job.tenant.clone(), (h, Instant::now())) {
                self.retire(old);
            }
        }
        None
    }

    async fn cold(&self, job: &JobSpec, lifetime: Lifetime) -> Result<Live, BackendError> {
        self.inner
            .launch(&job.limits, &job.env, &job.tenant, &job.id, lifetime)
            .await
    }
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        for (h, _) in self.pools().values() {
            h.pool.close();
        }
    }
}

impl Inner {
    /// The interpreter line of the job header: the one the pod's placement chose.
    fn python(&self, env: &RunEnv) -> Result<String, BackendError> {
        Ok(spec::place(&self.config, env)?
            .python
            .unwrap_or_else(|| self.config.python.clone()))
    }

    /// Turn how a conversation ended into the user's outcome; a runner that vanished is
    /// judged by the pod's status.
    async fn outcome_of(
        &self,
        ended: Ended,
        guard: &guard::PodGuard,
    ) -> Result<Outcome, BackendError> {
        Ok(match ended {
            Ended::Report(report, out) => out.into_outcome(&report),
            Ended::TimedOut(out) => {
                guard.kill_now().await;
                out.into_killed(true)
            }
            Ended::Vanished(out) => match live::verdict(&self.pods, guard.name()).await {
                Verdict::OomKilled => out.into_killed(false),
                Verdict::Deadline => out.into_killed(true),
                Verdict::Exited(code) => {
                    let how = match code {
                        Some(c) if c > 128 => format!("killed by signal {}", c - 128),
                        Some(c) => format!("exit status {c}"),
                        None => "the pod is gone".to_string(),
                    };
                    return Err(BackendError::Runner(format!(
                        "the sandbox pod stopped before its runner reported ({how}): it was \
                         deleted or evicted, its node went away, or the runner crashed; the \
                         code's own outcome is unknown, run it again"
                    )));
                }
            },
        })
    }
}

#[async_trait]
impl Backend for KubeBackend {
    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError> {
        let started = Instant::now();
        let python = self.inner.python(&job.env)?;
        let input = protocol::encode_job(&job, &python)
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let warm = self.take_warm(&job);
        let pooled = warm.is_some();
        let mut live = match warm {
            Some(live) => live,
            None => self.cold(&job, Lifetime::Run(job.limits.timeout)).await?,
        };
        tracing::debug!(job_id = %job.id, tenant = %job.tenant, pod = %live.guard.name(), pooled, ms = started.elapsed().as_millis() as u64, "sandbox pod attached");
        emit(
            &events,
            RunEvent::Created {
                container: live.guard.name().to_string(),
            },
        );
        let mut ended = live.execute(&input, true, &job.limits, &events).await?;
        if let Ended::Vanished(out) = &ended {
            if pooled && out.is_empty() {
                tracing::warn!(job_id = %job.id, pod = %live.guard.name(), "warm pod was gone at dispatch; running the job in a fresh pod");
                live = self.cold(&job, Lifetime::Run(job.limits.timeout)).await?;
                ended = live.execute(&input, true, &job.limits, &events).await?;
            }
        }
        let mut outcome = self.inner.outcome_of(ended, &live.guard).await?;
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        Ok(outcome)
    }

    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        let python = self.inner.python(&job.env)?;
        let input = protocol::encode_session(&job, &python)
            .map_err(|e| BackendError::Rejected(e.to_string()))?;
        let mut live = match self.take_warm(&job) {
            Some(live) => live,
            None => self.cold(&job, Lifetime::Long).await?,
        };
        live.send(&input).await?;
        tracing::debug!(job_id = %job.id, tenant = %job.tenant, pod = %live.guard.name(), "session opened");
        Ok(Box::new(KubeSession::new(
            self.inner.clone(),
            live,
            job.limits,
        )))
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        self.inner
            .pods
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| classify("listing pods", e))?;
        let version = match self.inner.client.apiserver_version().await {
            Ok(v) => format!("Kubernetes {}", v.git_version),
            Err(_) => "Kubernetes (version not given)".to_string(),
        };
        let c = &self.inner.config;
        Ok(BackendInfo {
            kind: "kubernetes",
            version,
            image: c.image.clone(),
            // The nodes pull it: present as far as this server can tell.
            image_present: true,
            details: vec![
                ("namespace".into(), c.namespace.clone()),
                (
                    "runtimeClassName".into(),
                    c.runtime_class
                        .clone()
                        .unwrap_or_else(|| "(default)".into()),
                ),
                (
                    "environment volume".into(),
                    c.env_volume.clone().unwrap_or_else(|| "(none)".into()),
                ),
            ],
        })
    }

    async fn drain(&self) {
        self.inner.cleanup.drain().await
    }

    async fn prewarm(&self, tenant: &str, env: &RunEnv) {
        let key = if self.inner.config.pool_per_tenant {
            tenant
        } else {
            SHARED_POOL
        };
        let current = self
            .pools()
            .get(key)
            .map(|(h, _)| (h.pool.limits.clone(), h.pool.env.clone()));
        if let Some((limits, old)) = current {
            if &old != env && !self.is_closed() {
                let size = self.inner.config.pool_size;
                let new = PoolHandle::start(&self.inner, limits, env.clone(), size, key);
                if let Some((old, _)) = self.pools().insert(key.to_string(), (new, Instant::now()))
                {
                    self.retire(old);
                }
            }
        }
    }

    fn stats(&self) -> BackendStats {
        let pool = self.pool_stats().unwrap_or_default();
        BackendStats {
            live_containers: self.inner.cleanup.live(),
            pool_ready: pool.ready,
            pool_target: pool.target,
            pool_hits: pool.hits,
            pool_misses: pool.misses,
        }
    }

    async fn sweep(&self) -> Result<usize, BackendError> {
        guard::sweep(&self.inner.client, &self.inner.pods).await
    }

    fn sweep_periodically(&self, every: Duration) {
        let inner = self.inner.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = guard::sweep(&inner.client, &inner.pods).await {
                    tracing::warn!(error = %e, "periodic sweep of sandbox pods failed");
                }
            }
        });
        if let Some(old) = self.sweeper.lock().expect("sweeper lock").replace(task) {
            old.abort();
        }
    }

    async fn shutdown(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.sweeper.lock().expect("sweeper lock").take() {
            t.abort();
        }
        let handles: Vec<PoolHandle> = self.pools().drain().map(|(_, (h, _))| h).collect();
        for h in handles {
            h.stop().await;
        }
        let retiring = std::mem::take(&mut *self.retiring.lock().expect("retiring lock"));
        for r in retiring {
            let _ = r.await;
        }
        let left = self.inner.cleanup.drain_all(SHUTDOWN_DEADLINE).await;
        if left > 0 {
            tracing::warn!(left, "pods still held at shutdown; the next sweep (or their owner reference) removes them");
        }
    }
}

/// The API server does not answer: in Kubernetes' words, with what to do.
fn unreachable(detail: String) -> BackendError {
    BackendError::Unreachable {
        what: "the Kubernetes API",
        detail,
        hint: "Check --kubeconfig (or KUBECONFIG, or the in-cluster service account) and that the server is up",
    }
}

pub(super) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Sort a kube error into "the API is not there" and "the API said no".
fn classify(action: &'static str, e: kube::Error) -> BackendError {
    match e {
        kube::Error::Api(s) => BackendError::Failed {
            backend: "Kubernetes",
            action,
            detail: format!("{} ({}): {}", s.reason, s.code, s.message),
        },
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::HttpError(_)
        | kube::Error::Auth(_) => unreachable(format!("{action}: {e}")),
        e => BackendError::Failed {
            backend: "Kubernetes",
            action,
            detail: e.to_string(),
        },
    }
}
