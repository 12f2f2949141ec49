//! The one place a concrete backend is named: every command (and the server) gets its
//! sandboxes from here, as a [`Backend`] (Docker, or Kubernetes with the `kubernetes`
//! feature), and builds its images through [`image`].

use std::sync::Arc;

use crate::backend::docker::{write_hosts_file, DockerBackend, DockerConfig};
use crate::backend::sandbox_dir;
use crate::backend::{Backend, PoolConfig, RunGate};
use crate::config::serve::BackendKind;
use crate::config::BackendConfig;
use crate::job::Limits;

use self::image::BuildOptions;

/// The sandbox image: what names and packs it (backend-neutral), and the backend's build of
/// it (`ensure`, `build_server`), under one name for the image commands.
pub mod image {
    pub use crate::backend::docker::image::{build_server, ensure};
    pub use crate::backend::image::*;
}

/// The backend `cfg` names, without a warm pool: the image made sure of (built on first
/// use unless told not to, its progress as `[image]` lines), and what dead processes left
/// swept.
pub async fn connect(cfg: &BackendConfig) -> Result<Arc<dyn Backend>, String> {
    let cfg = BackendConfig {
        pool_size: 0,
        ..cfg.clone()
    };
    connect_with_pool(&cfg, Limits::default(), false, &mut print_build).await
}

/// A build's progress as `[image] …` lines on stderr.
pub fn print_build(e: &image::BuildEvent) {
    eprintln!("[image] {e}");
}

/// The backend `cfg` names, with a warm pool of `cfg.pool_size` sandboxes made with
/// `pool_limits` (or, with `per_tenant`, one such pool per tenant, made at its first run),
/// and the build's progress told to `report`. The image comes first: the pool starts
/// filling only once it exists, so that a first run is not a stream of failed refills.
pub async fn connect_with_pool(
    cfg: &BackendConfig,
    pool_limits: Limits,
    per_tenant: bool,
    report: &mut (dyn FnMut(&image::BuildEvent) + Send),
) -> Result<Arc<dyn Backend>, String> {
    Ok(connect_planned(cfg, pool_limits, per_tenant, None, report)
        .await?
        .0)
}

/// [`connect_with_pool`]; with `runs`, the shared pool serves that many runs of a one-shot
/// process (see [`connect_for_runs`]).
async fn connect_planned(
    cfg: &BackendConfig,
    pool_limits: Limits,
    per_tenant: bool,
    runs: Option<usize>,
    report: &mut (dyn FnMut(&image::BuildEvent) + Send),
) -> Result<(Arc<dyn Backend>, Option<RunGate>), String> {
    let pool = PoolConfig {
        size: cfg.pool_size,
        limits: pool_limits,
        per_tenant,
        ..PoolConfig::default()
    };
    match cfg.kind {
        BackendKind::Docker => {
            let image = cfg.image.clone().unwrap_or_else(image::default_image);
            let config = DockerConfig {
                runtime: cfg.runtime.clone(),
                docker_host: cfg.docker_host.clone(),
                pool,
                preload: cfg.preload.clone(),
                hosts_file: local_data_dir(cfg).and_then(|d| write_hosts_file(&d)),
                sandbox_dirs: local_data_dir(cfg).map(|d| d.join(sandbox_dir::ROOT)),
                ..DockerConfig::new(image.clone())
            };
            if cfg.build_missing {
                image::ensure(&image, &BuildOptions::default(), report)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let sandbox = DockerBackend::connect(config)
                .await
                .map_err(|e| e.to_string())?;
            if let Err(e) = sandbox.sweep().await {
                tracing::warn!(error = %e, "sweep of leftover containers failed");
            }
            let gate = runs.and_then(|n| sandbox.pools().expect_runs(n));
            Ok((Arc::new(sandbox), gate))
        }
        BackendKind::Kubernetes => kubernetes(cfg, pool, runs).await,
    }
}

/// The data directory when the daemon is local and sees it at the same path
/// (docker-compose.yml mounts it so): where the sandboxes' `/etc/hosts` (see
/// [`DockerConfig::hosts_file`]) and their own directories (see
/// [`DockerConfig::sandbox_dirs`]) live. None for a daemon elsewhere (`tcp://`, `ssh://`),
/// which would not find them.
fn local_data_dir(cfg: &BackendConfig) -> Option<std::path::PathBuf> {
    let local = cfg
        .docker_host
        .as_deref()
        .is_none_or(|h| h.starts_with("unix://"));
    if !local {
        return None;
    }
    Some(
        cfg.data_dir
            .clone()
            .unwrap_or_else(crate::config::process_data_dir),
    )
}

/// The backend for a one-shot `run` of `runs` files, with a warm pool of `cfg.pool_size`
/// sandboxes of `pool_limits` that makes them all at once and never more than the files
/// still to come, and the gate each file passes before it takes one (it waits for a
/// sandbox being made instead of starting another beside it); `None` without a pool.
pub async fn connect_for_runs(
    cfg: &BackendConfig,
    pool_limits: Limits,
    runs: usize,
    report: &mut (dyn FnMut(&image::BuildEvent) + Send),
) -> Result<(Arc<dyn Backend>, Option<RunGate>), String> {
    connect_planned(cfg, pool_limits, false, Some(runs), report).await
}

/// The Kubernetes backend: the image is not built here (the nodes pull it from a
/// registry; see docs/kubernetes.md), what servers that are gone left is swept.
#[cfg(feature = "kubernetes")]
async fn kubernetes(
    cfg: &BackendConfig,
    pool: PoolConfig,
    runs: Option<usize>,
) -> Result<(Arc<dyn Backend>, Option<RunGate>), String> {
    use crate::backend::kubernetes::{KubeBackend, KubeConfig, OwnerPod};
    let k = &cfg.kubernetes;
    let config = KubeConfig {
        kubeconfig: k.kubeconfig.clone(),
        namespace: k.namespace.clone().unwrap_or_default(),
        runtime_class: cfg.runtime.clone(),
        pool,
        env_volume: k.env_volume.clone(),
        data_dir: cfg.data_dir.clone(),
        owner_pod: k.own_pod.clone().map(|(namespace, name, uid)| OwnerPod {
            namespace,
            name,
            uid,
        }),
        ..KubeConfig::new(cfg.image.clone().unwrap_or_else(image::default_image))
    };
    let sandbox = KubeBackend::connect(config)
        .await
        .map_err(|e| e.to_string())?;
    if let Err(e) = sandbox.sweep().await {
        tracing::warn!(error = %e, "sweep of leftover pods failed");
    }
    let gate = runs.and_then(|n| sandbox.pools().expect_runs(n));
    Ok((Arc::new(sandbox), gate))
}

#[cfg(not(feature = "kubernetes"))]
async fn kubernetes(
    _cfg: &BackendConfig,
    _pool: PoolConfig,
    _runs: Option<usize>,
) -> Result<(Arc<dyn Backend>, Option<RunGate>), String> {
    Err(
        "this binary was built without the `kubernetes` feature: rebuild it with \
         `cargo build --release --features kubernetes`"
            .to_string(),
    )
}
