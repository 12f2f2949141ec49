//! The Docker backend: one fresh, hardened container per run, optionally
//! taken from a warm pool of pre-started ones. bollard types stay in here: nothing outside
//! `backend/docker/` uses bollard.
//!
//! Lifecycle of a run (see DESIGN.md for why each step is the way it is):
//! create (read-only root, tmpfs workspace, no network, no capabilities, log driver `none`)
//! → attach (before start, or output is lost) → start → stream the job into the runner's
//! stdin → decode its framed stdout → result as soon as the `X` frame arrives. The
//! container is removed in the background on every path, by a guard whose `Drop` runs on
//! success, error, timeout, cancellation (the future dropped) and panic alike.
//!
//! What every backend does the same way (the warm take, the cold launch and its retry,
//! the conversation with the runner, sessions, the removal guard, stats, sweeps, shutdown)
//! is the [`Engine`]'s; this is its `Driver` for Docker, one file per concern: [`spec`]
//! (what a container is made of: labels, command, the hardening, how environment sources
//! are mounted), `launch` (create, attach, start), `live` (the attach as the engine's
//! stream of chunks), `outcome` (the verdict on a runner that vanished), `pause` (a
//! session frozen between cells), `pool` (warm containers, preloading and its learning),
//! `guard` (how a container is removed, sweeps), `dirs` (each container's own directory on
//! the host, for the egress socket), [`image`] (building the image),
//! `lifecycle` (the benchmark's Docker ceiling). This file holds the configuration and
//! the driver.

use std::sync::Arc;

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::Docker;

use self::guard::DockerRemover;
pub use self::pool::{KindStats, PoolStats};
pub use self::spec::{docker_run_flags, is_gvisor, GVISOR_RUNTIME};
use super::collect::Collected;
use super::engine::guard::{Guard, Guards};
use super::engine::{Driver, Engine, Freeze, Live, Pool, Profile, Seen, Shape};
pub use super::labels::{LABEL_JOB, LABEL_MANAGED, LABEL_OWNER, LABEL_TENANT};
use super::pool::{PoolHandle, Pools};
use super::protocol::Report;
use super::{BackendError, BackendInfo, LifecycleFigures, PoolConfig};
use crate::job::{Outcome, RunEnv};

mod dirs;
mod freezer;
mod guard;
pub mod image;
mod launch;
mod lifecycle;
mod live;
mod outcome;
mod pause;
mod pool;
pub mod spec;
mod weight;

/// The [`LABEL_OWNER`] value of what process `pid` of this host makes
/// (`host/pid/start-time`); `None` when there is no such process.
pub fn owner_label(pid: u32) -> Option<String> {
    super::labels::owner_id(pid)
}

/// Settings of the Docker backend.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The sandbox image (see [`crate::backend::image`]).
    pub image: String,
    /// OCI runtime (`runc` when `None`; `crun` where the daemon knows it).
    pub runtime: Option<String>,
    /// The interpreter inside the sandbox that runs the code.
    pub python: String,
    /// The warm pool (none by default).
    pub pool: PoolConfig,
    /// The daemon's address (`unix://…`, `tcp://…`); `None`: `DOCKER_HOST`, else the local
    /// socket.
    pub docker_host: Option<String>,
    /// What pool sandboxes import before their job, and what is learned (see
    /// [`crate::backend::preload`]); off by default.
    pub preload: crate::backend::preload::PreloadConfig,
    /// A file on the daemon's host (see [`write_hosts_file`]) that sandboxes without a
    /// network get as their `/etc/hosts`: they are then created with Docker's networking
    /// disabled, not with `--network none`. Both give the container a network namespace of
    /// its own with only the loopback; `none` also runs two processes of the daemon's
    /// binary per container (the `libnetwork-setkey` prestart hook and `set-ipv6`),
    /// which took 0.1 s of host CPU of the 0.25 s a container cost here. Disabled
    /// networking gives the container an empty `/etc/hosts`, hence this file (`localhost`
    /// must resolve). `None`: `--network none`.
    pub hosts_file: Option<std::path::PathBuf>,
    /// Where each sandbox gets a directory of its own on the daemon's host, mounted at
    /// [`SANDBOX_DIR`](crate::backend::protocol::SANDBOX_DIR) (see
    /// [`crate::backend::sandbox_dir`]): the egress socket's (#41), whose bytes then skip
    /// the attach stream. Not under gVisor (runsc refuses a host socket unless run with
    /// `--host-uds=open`). `None`: no directory; egress goes over the runner's relay.
    pub sandbox_dirs: Option<std::path::PathBuf>,
}

/// What a sandbox's `/etc/hosts` says: the loopback names Docker's own file gives.
pub const SANDBOX_HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
    fe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n";

/// Write [`SANDBOX_HOSTS`] to `dir/sandbox-hosts` (unless it is there already) for
/// [`DockerConfig::hosts_file`]; `dir` must be where the daemon sees it too (the data
/// directory: the environments are mounted from there as well). `None`, with a warning,
/// when it cannot be written.
pub fn write_hosts_file(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    let path = dir.join("sandbox-hosts");
    match crate::backend::publish_file(&path, SANDBOX_HOSTS.as_bytes()) {
        Ok(()) => Some(path),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the sandboxes' hosts file; sandboxes use `--network none` (slower to make)");
            None
        }
    }
}

pub use crate::backend::pool::POOL_IDLE;

impl DockerConfig {
    /// The image, runc, the image's Python, no pool.
    pub fn new(image: impl Into<String>) -> Self {
        DockerConfig {
            image: image.into(),
            runtime: None,
            python: crate::backend::image::PYTHON.into(),
            pool: PoolConfig::default(),
            docker_host: None,
            preload: Default::default(),
            hosts_file: None,
            sandbox_dirs: None,
        }
    }
}

/// What only the Docker backend knows: the daemon, the settings, the owner label, what
/// preloading learned. The request path and the pools' refill tasks share it.
pub struct DockerDriver {
    docker: Docker,
    config: DockerConfig,
    /// Guards for its sandboxes, made before each create.
    guards: Guards,
    owner: String,
    /// Preloading refills at once over all pools, and what was learned (see `pool`).
    preloads: pool::Preloads,
    /// Sessions' containers paused by the daemon: the daemon resumes them too.
    daemon_paused: pause::DaemonPaused,
}

/// The Docker backend: the [`Engine`] over Docker.
pub type DockerBackend = Engine<DockerDriver>;

/// The runtime the sandboxes run under: the configured one, refused when the daemon does
/// not have it registered (otherwise every container start fails later with Docker's
/// "unknown or invalid runtime name"); without one, the daemon's default when that is
/// gVisor, so that what depends on gVisor (the cgroup freezer left alone, the OOM verdict,
/// the spec's knobs) holds for a daemon whose default is `runsc` too.
async fn resolve_runtime(
    docker: &bollard::Docker,
    configured: Option<String>,
) -> Result<Option<String>, BackendError> {
    let info = docker
        .info()
        .await
        .map_err(|e| classify("asking the daemon's runtimes", e))?;
    let Some(runtime) = configured else {
        return Ok(default_if_gvisor(info.default_runtime));
    };
    let known: Vec<String> = info.runtimes.unwrap_or_default().into_keys().collect();
    if known.contains(&runtime) {
        return Ok(Some(runtime));
    }
    let fix = if is_gvisor(Some(&runtime)) {
        "install and register gVisor: `sudo scripts/setup-docker.sh --gvisor` (installs runsc, \
         adds it to /etc/docker/daemon.json, reloads dockerd with SIGHUP)"
    } else {
        "register it in /etc/docker/daemon.json (`runtimes`) and reload dockerd (SIGHUP)"
    };
    Err(BackendError::Failed {
        backend: "Docker",
        action: "checking the sandbox runtime",
        detail: format!(
            "the daemon has no runtime `{runtime}` registered (it has: {}); {fix}",
            known.join(", ")
        ),
    })
}

/// The daemon's default runtime, named when it is gVisor (a runc default stays unnamed).
fn default_if_gvisor(default: Option<String>) -> Option<String> {
    default.filter(|d| is_gvisor(Some(d)))
}

impl DockerBackend {
    /// Connect to the daemon named by `DOCKER_HOST` (or the local socket), check it answers,
    /// and start filling the warm pool if one is configured.
    pub async fn connect(mut config: DockerConfig) -> Result<Self, BackendError> {
        let docker = connect_docker_at(config.docker_host.as_deref()).await?;
        config.runtime = resolve_runtime(&docker, config.runtime.take()).await?;
        let daemon_paused = pause::DaemonPaused::default();
        let guards = Guards::new(DockerRemover {
            docker: docker.clone(),
            paused: daemon_paused.clone(),
        });
        let cleanup = guards.count();
        let driver = Arc::new(DockerDriver {
            docker,
            owner: super::labels::own_id(),
            guards,
            preloads: pool::Preloads::new(&config.preload),
            daemon_paused,
            config,
        });
        let pool = driver.config.pool.clone();
        Ok(Engine::new(driver, cleanup, &pool))
    }
}

#[async_trait]
impl Driver for DockerDriver {
    const PROFILE: Profile = Profile::held_at_shutdown(
        "containers still held at shutdown; the next start-up sweep removes them",
    )
    .preloading()
    .with_tools();

    fn python(&self, env: &RunEnv) -> Result<String, BackendError> {
        Ok(spec::python(&self.config, env).to_string())
    }

    async fn launch(&self, shape: Shape<'_>) -> Result<Live, BackendError> {
        self.launch_with(shape.limits, shape.env, shape.tenant, shape.id, &[])
            .await
    }

    /// A new pool preloads what is configured and learned for its key.
    fn start_pool(self: &Arc<Self>, pool: Pool) -> PoolHandle<Live> {
        let list = self
            .preloads
            .list_for(&self.config.preload, &pool.label, &pool.env);
        let driver = self.clone();
        PoolHandle::start(pool.with_preload(list), move |p| {
            pool::refill(driver.clone(), p)
        })
    }

    async fn vanished(&self, guard: &Guard, out: Collected) -> Result<Outcome, BackendError> {
        outcome::vanished(self, guard, out).await
    }

    fn observe(&self, pools: &Pools<Live>, seen: Seen<'_>, report: &Report) {
        self.observe_preload(pools, seen, report)
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        let docker = &self.docker;
        let v = docker
            .version()
            .await
            .map_err(|e| classify("asking the daemon's version", e))?;
        let image_present = docker.inspect_image(&self.config.image).await.is_ok();
        let runtime = self.config.runtime.as_deref();
        let mut details = vec![("runtime".to_string(), runtime.unwrap_or("runc").to_string())];
        if is_gvisor(runtime) {
            // What `doctor` checks the sandbox's kernel against.
            details.push(("isolation".to_string(), "gvisor".to_string()));
            details.push((
                "host kernel".to_string(),
                v.kernel_version.unwrap_or_default(),
            ));
        }
        Ok(BackendInfo {
            kind: "docker",
            details,
            version: format!(
                "Docker {} (API {})",
                v.version.unwrap_or_default(),
                v.api_version.unwrap_or_default()
            ),
            image: self.config.image.clone(),
            image_present,
        })
    }

    /// Remove containers of ours whose owning process on this host is gone (a crash, a
    /// `kill -9`). Containers of live processes, and of other hosts, are left alone.
    async fn sweep(&self) -> Result<usize, BackendError> {
        let removed = guard::sweep(&self.docker).await?;
        self.sweep_dirs().await;
        Ok(removed)
    }

    /// Bare containers of `/bin/true` with the same hardening: what Docker alone allows.
    async fn lifecycle_ceiling(
        self: &Arc<Self>,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>> {
        Some(lifecycle::ceiling(self, total, concurrency).await)
    }

    /// Under runc, through the freezer file when the server can write it (see
    /// [`freezer`]); else the daemon's pause. Under gVisor, not at all: the runner stops
    /// every process of the code between cells itself (`session.hold` in the runner), and
    /// the daemon's unpause cost every later cell 300-400 ms (issue 43).
    async fn freeze(&self, id: &str) -> Freeze {
        if is_gvisor(self.config.runtime.as_deref()) {
            return Freeze::Running;
        }
        if freezer::freeze(id).await {
            return Freeze::Frozen;
        }
        let frozen = pause::freeze(&self.docker, id).await;
        if let Freeze::Frozen = frozen {
            self.daemon_paused.insert(id);
        }
        frozen
    }

    async fn thaw(&self, id: &str) -> Result<(), BackendError> {
        if self.daemon_paused.take(id) || !freezer::thaw(id) {
            return pause::thaw(&self.docker, id).await;
        }
        Ok(())
    }
}

/// Remove now every container this process made, over a connection of its own (the
/// caller may run on another runtime than the backend, whose tasks may be stuck): what a
/// shutdown past its deadline does before the process exits. Their count.
pub async fn remove_own_containers(docker_host: Option<&str>) -> Result<usize, BackendError> {
    let docker = connect_docker_at(docker_host).await?;
    guard::remove_owned(&docker, &super::labels::own_id()).await
}

/// Connect to the daemon named by `DOCKER_HOST` (`unix://` or `tcp://`; the local socket
/// when unset) and check it answers.
pub(crate) async fn connect_docker() -> Result<Docker, BackendError> {
    connect_docker_at(None).await
}

/// [`connect_docker`], to `host` when given.
async fn connect_docker_at(host: Option<&str>) -> Result<Docker, BackendError> {
    let docker = match host {
        Some(h) => Docker::connect_with_host(h),
        None => Docker::connect_with_defaults(),
    }
    .map_err(|e| unreachable(e.to_string()))?;
    docker
        .ping()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    Ok(docker)
}

/// The daemon does not answer: in Docker's words, with what to do.
pub(crate) fn unreachable(detail: String) -> BackendError {
    BackendError::Unreachable {
        what: "the Docker daemon",
        detail,
        hint: "Is it running? Start it (`dockerd &` or `systemctl start docker`) or point DOCKER_HOST at it",
    }
}

/// Sort a bollard error into "the daemon is not there" and "the daemon said no".
pub(crate) fn classify(action: &'static str, e: BollardError) -> BackendError {
    match e {
        BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::SocketNotFoundError(_)
        | BollardError::HttpClientError { .. } => unreachable(e.to_string()),
        e => BackendError::Failed {
            backend: "Docker",
            action,
            detail: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::default_if_gvisor;

    #[test]
    fn a_gvisor_default_runtime_is_named_and_a_runc_one_is_not() {
        assert_eq!(
            default_if_gvisor(Some("runsc".into())).as_deref(),
            Some("runsc")
        );
        assert_eq!(default_if_gvisor(Some("runc".into())), None);
        assert_eq!(default_if_gvisor(None), None);
    }
}
