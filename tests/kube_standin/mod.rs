//! A stand-in for the Kubernetes API server, for tests: the pods subset the `kubernetes`
//! backend uses (create, get, list, watch, delete, `pods/attach` over WebSocket), served
//! over plain HTTP on 127.0.0.1, each pod run as a real Docker container built from its
//! PodSpec. See `README.md` beside this file for what it serves and what it does not prove.
//!
//! ```ignore
//! #[path = "kube_standin/mod.rs"]
//! mod kube_standin;
//! let k = kube_standin::StandIn::start();
//! ```
#![allow(dead_code)]

mod api;
mod attach;
mod kubelet;
mod selector;
mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bollard::query_parameters::ListContainersOptionsBuilder;
use bollard::Docker;

#[allow(unused_imports)]
pub use kubelet::{LABEL_INSTANCE, LABEL_MANAGED, LABEL_OWNER};

/// How to start a stand-in.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace written into the kubeconfig's context (any namespace is served).
    pub namespace: String,
    /// RuntimeClass name -> Docker runtime (`gvisor` -> `runsc` by default); a pod naming
    /// another class is refused as a real API server refuses an unknown RuntimeClass.
    pub runtime_classes: HashMap<String, String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: "mcp-code-executor".into(),
            runtime_classes: HashMap::from([("gvisor".to_string(), "runsc".to_string())]),
        }
    }
}

/// A running stand-in. Dropping it stops the server and removes every container it made.
pub struct StandIn {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// A kubeconfig whose current context points at `base_url` with `namespace`.
    pub kubeconfig_path: PathBuf,
    /// The kubeconfig context's namespace.
    pub namespace: String,
    /// The value of [`LABEL_INSTANCE`] on this stand-in's containers.
    pub instance: String,
    kubelet: Arc<kubelet::Kubelet>,
    dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The owner label the Docker backend puts on what process `pid` makes, so that the
/// project's start-up sweep removes containers a killed test process left.
fn owner_label() -> String {
    mcp_code_executor::backend::docker::owner_label(std::process::id())
        .expect("this process exists")
}

impl StandIn {
    /// Start with [`Options::default`]. Panics, loudly, when Docker is not reachable.
    pub fn start() -> StandIn {
        Self::start_with(Options::default())
    }

    pub fn start_with(opts: Options) -> StandIn {
        let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let inst = instance.clone();
        let classes = opts.runtime_classes.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kube-standin-{instance}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a tokio runtime for the stand-in");
                rt.block_on(async move {
                    let docker = match Docker::connect_with_local_defaults() {
                        Ok(d) => d,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("connecting to Docker: {e}")));
                            return;
                        }
                    };
                    if let Err(e) = docker.ping().await {
                        let _ = ready_tx.send(Err(format!("Docker does not answer: {e}")));
                        return;
                    }
                    let k = Arc::new(kubelet::Kubelet {
                        docker,
                        store: Arc::new(store::Store::new()),
                        instance: inst.clone(),
                        owner: owner_label(),
                        runtime_classes: classes,
                        stopping: AtomicBool::new(false),
                        creating: AtomicUsize::new(0),
                    });
                    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("binding 127.0.0.1:0: {e}")));
                            return;
                        }
                    };
                    let addr = listener.local_addr().expect("a bound address");
                    let _ = ready_tx.send(Ok((addr, k.clone())));
                    let app = api::router(k.clone());
                    tokio::select! {
                        r = axum::serve(listener, app) => {
                            if let Err(e) = r { eprintln!("[kube-standin] server ended: {e}"); }
                        }
                        _ = stop_rx => {}
                    }
                    // No new container from here on; the creations under way finish
                    // (bounded) and are labelled, so the removal below finds them.
                    k.stopping.store(true, Ordering::SeqCst);
                    for _ in 0..600 {
                        if k.creating.load(Ordering::SeqCst) == 0 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    remove_all(&k.docker, &inst).await;
                });
                rt.shutdown_timeout(Duration::from_secs(5));
            })
            .expect("a thread for the stand-in");
        let (addr, kubelet) = match ready_rx.recv() {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => panic!(
                "the Kubernetes stand-in needs a running Docker daemon (run .ci/run or \
                 scripts/setup-docker.sh): {e}"
            ),
            Err(_) => panic!("the Kubernetes stand-in's thread died while starting"),
        };
        let base_url = format!("http://{addr}");
        let dir = std::env::temp_dir().join(format!("kube-standin-{instance}"));
        std::fs::create_dir_all(&dir).expect("a directory for the kubeconfig");
        let kubeconfig_path = dir.join("kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig(&base_url, &opts.namespace))
            .expect("writing the kubeconfig");
        StandIn {
            base_url,
            kubeconfig_path,
            namespace: opts.namespace,
            instance,
            kubelet,
            dir,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// A kube-rs client from this stand-in's kubeconfig (inside a tokio runtime).
    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig_path).expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("a kube config from the stand-in's kubeconfig");
        kube::Client::try_from(cfg).expect("a kube client")
    }

    /// The stored pod `name` in [`Self::namespace`], as the API would return it.
    pub fn pod(&self, name: &str) -> Option<serde_json::Value> {
        self.kubelet
            .store
            .get(&self.namespace, name)
            .map(|p| serde_json::to_value(p).expect("a pod serialises"))
    }

    /// Every stored pod, all namespaces.
    pub fn pods(&self) -> Vec<serde_json::Value> {
        self.kubelet
            .store
            .all()
            .into_iter()
            .map(|p| serde_json::to_value(p).expect("a pod serialises"))
            .collect()
    }

    /// The Docker container running pod `name` of [`Self::namespace`].
    pub fn container_of(&self, name: &str) -> Option<String> {
        let pod = self.kubelet.store.get(&self.namespace, name)?;
        self.kubelet.store.container(pod.metadata.uid.as_deref()?)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Remove every container of stand-in `instance`.
async fn remove_all(docker: &Docker, instance: &str) {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("{LABEL_INSTANCE}={instance}")],
    )]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap_or_default();
    for c in list {
        if let Some(id) = c.id {
            kubelet::remove(docker, &id).await;
        }
    }
}

fn kubeconfig(server: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: {server}
users:
- name: standin
  user: {{}}
contexts:
- name: standin
  context:
    cluster: standin
    user: standin
    namespace: {namespace}
current-context: standin
preferences: {{}}
"
    )
}
