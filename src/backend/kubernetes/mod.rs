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

pub use crate::backend::pool::POOL_IDLE;
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);
use crate::backend::pool::{PoolHandle, Pools};

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
    /// Warm pools: one shared, or one per tenant (see [`crate::backend::pool::Pools`]).
    pools: Pools<Live>,
    sweeper: std::sync::Mutex<Option<JoinHandle<()>>>,
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
        let starter = inner.clone();
        let start = move |pool: Pool| {
            let inner = starter.clone();
            PoolHandle::start(pool, move |p| pool::refill(inner.clone(), p))
        };
        let shared = (c.pool_limits.clone(), c.pool_env.clone());
        let pools = Pools::new(c.pool_size, c.pool_per_tenant, shared, Box::new(start));
        Ok(KubeBackend {
            inner,
            pools,
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

    /// Pool figures, all pools together; `None` when the pool is off.
    pub fn pool_stats(&self) -> Option<PoolStats> {
        self.pools.stats()
    }

    /// A waiting pod for `job`, if its pool has one of its shape (the Docker backend's
    /// rules, per-tenant pools included).
    fn take_warm(&self, job: &JobSpec) -> Option<Live> {
        self.pools
            .take(&job.tenant, &job.limits, &job.env, job.keep_warm)
    }

    async fn cold(&self, job: &JobSpec, lifetime: Lifetime) -> Result<Live, BackendError> {
        self.inner
            .launch(&job.limits, &job.env, &job.tenant, &job.id, lifetime)
            .await
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
        let mut ended = live
            .execute(&input, true, &job.limits, &events, &None)
            .await?;
        if let Ended::Vanished(out) = &ended {
            if pooled && out.is_empty() {
                tracing::warn!(job_id = %job.id, pod = %live.guard.name(), "warm pod was gone at dispatch; running the job in a fresh pod");
                live = self.cold(&job, Lifetime::Run(job.limits.timeout)).await?;
                ended = live
                    .execute(&input, true, &job.limits, &events, &None)
                    .await?;
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
        self.pools.prewarm(tenant, env);
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
        if let Some(t) = self.sweeper.lock().expect("sweeper lock").take() {
            t.abort();
        }
        self.pools.shutdown().await;
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
