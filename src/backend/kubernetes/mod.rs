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
//! The conversation, sessions, the guard, stats, sweeps and shutdown are the [`Engine`]'s;
//! this is its `Driver` for Kubernetes, one file per concern: [`spec`] (the pod), `live`
//! (create, attach, the verdict from the pod status), `pool` (warm pods), `guard`
//! (deletion, sweeps by label).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};

use self::guard::PodRemover;
use self::live::Verdict;
pub use self::spec::OwnerPod;
use self::spec::{LABEL_MANAGED, LABEL_OWNER};
use super::collect::Collected;
use super::engine::guard::{Guard, Guards};
use super::engine::{Driver, Engine, Freeze, Live, Pool, Profile, Seen, Shape};
pub use super::pool::PoolStats;
use super::pool::{PoolHandle, Pools};
use super::protocol::Report;
use super::{BackendError, BackendInfo, LifecycleFigures, PoolConfig};
use crate::job::{Outcome, RunEnv};

mod guard;
mod live;
mod pool;
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
    /// Pods kept running and attached, waiting for a job (none by default).
    pub pool: PoolConfig,
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
            pool: PoolConfig::default(),
            env_volume: None,
            data_dir: None,
            owner_pod: None,
            long_deadline: Duration::from_secs(4 * 3600),
        }
    }
}

pub use crate::backend::pool::POOL_IDLE;

/// What only the Kubernetes backend knows: the API, the namespace's pods, the settings,
/// the owner. The request path and the pools' refill tasks share it.
pub struct KubeDriver {
    client: Client,
    pods: Api<Pod>,
    config: KubeConfig,
    /// Guards for its sandboxes, made before each create.
    guards: Guards,
    owner: String,
}

/// The Kubernetes backend: the [`Engine`] over Kubernetes.
pub type KubeBackend = Engine<KubeDriver>;

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
        let guards = Guards::new(PodRemover(pods.clone()));
        let cleanup = guards.count();
        let driver = Arc::new(KubeDriver {
            client,
            pods,
            owner: super::labels::own_id(),
            guards,
            config,
        });
        let pool = driver.config.pool.clone();
        Ok(Engine::new(driver, cleanup, &pool))
    }

    /// The namespace sandbox pods go to.
    pub fn namespace(&self) -> &str {
        &self.driver().config.namespace
    }

    /// The label selector of the pods this process made (tests, operators).
    pub fn own_pods_selector(&self) -> String {
        format!(
            "{LABEL_MANAGED}=true,{LABEL_OWNER}={}",
            spec::owner_label(&self.driver().owner)
        )
    }
}

#[async_trait]
impl Driver for KubeDriver {
    /// No preloading; code mode's requests travel over `pods/attach` as over Docker's attach.
    const PROFILE: Profile = Profile::held_at_shutdown(
        "pods still held at shutdown; the next sweep (or their owner reference) removes them",
    )
    .with_tools();

    /// The interpreter line of the job header: the one the pod's placement chose.
    fn python(&self, env: &RunEnv) -> Result<String, BackendError> {
        Ok(spec::place(&self.config, env)?
            .python
            .unwrap_or_else(|| self.config.python.clone()))
    }

    async fn launch(&self, shape: Shape<'_>) -> Result<Live, BackendError> {
        self.launch(
            shape.limits,
            shape.env,
            shape.tenant,
            shape.id,
            shape.lifetime,
        )
        .await
    }

    fn start_pool(self: &Arc<Self>, pool: Pool) -> PoolHandle<Live> {
        let driver = self.clone();
        PoolHandle::start(pool, move |p| pool::refill(driver.clone(), p))
    }

    /// A runner that vanished is judged by the pod's status.
    async fn vanished(&self, guard: &Guard, out: Collected) -> Result<Outcome, BackendError> {
        match live::verdict(&self.pods, guard.id()).await {
            Verdict::OomKilled => Ok(out.into_killed(false)),
            Verdict::Deadline => Ok(out.into_killed(true)),
            Verdict::Exited(code) => {
                let how = match code {
                    Some(c) if c > 128 => format!("killed by signal {}", c - 128),
                    Some(c) => format!("exit status {c}"),
                    None => "the pod is gone".to_string(),
                };
                Err(BackendError::Runner(format!(
                    "the sandbox pod stopped before its runner reported ({how}): it was \
                     deleted or evicted, its node went away, or the runner crashed; the \
                     code's own outcome is unknown, run it again"
                )))
            }
        }
    }

    /// Warm pods preload nothing: nothing to learn.
    fn observe(&self, _: &Pools<Live>, _: Seen<'_>, _: &Report) {}

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        self.pods
            .list(&ListParams::default().limit(1))
            .await
            .map_err(|e| classify("listing pods", e))?;
        let version = match self.client.apiserver_version().await {
            Ok(v) => format!("Kubernetes {}", v.git_version),
            Err(_) => "Kubernetes (version not given)".to_string(),
        };
        let c = &self.config;
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

    async fn sweep(&self) -> Result<usize, BackendError> {
        guard::sweep(&self.client, &self.pods).await
    }

    /// No measure of the cluster alone: the benchmark skips the profile.
    async fn lifecycle_ceiling(
        self: &Arc<Self>,
        _total: usize,
        _concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        None
    }

    /// A session's pod is not held still between cells.
    async fn freeze(&self, _: &str) -> Freeze {
        Freeze::Running
    }

    async fn thaw(&self, _: &str) -> Result<(), BackendError> {
        Ok(())
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
