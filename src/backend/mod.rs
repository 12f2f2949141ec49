//! The sandbox backend: runs one [`JobSpec`] in a fresh, isolated environment and reports
//! its [`Outcome`]. The [`Backend`] trait (with [`Session`]) is the seam: the Docker backend
//! ([`docker::DockerBackend`]) is the real one; unit tests above it may use a fake. What a
//! backend must provide is said in neutral words ([`BackendInfo`], [`BackendStats`],
//! [`LifecycleFigures`], environments as [`Source`](crate::job::Source)s it resolves); the
//! sandbox image is described in [`image`] and built by the backend. Both real backends are
//! the one [`engine::Engine`] over a driver; what marks a sandbox as ours is in [`labels`];
//! wrappers implement [`Wrap`].

pub mod archive;
pub(crate) mod collect;
pub mod connect;
pub mod docker;
pub(crate) mod egress_socket;
pub mod engine;
pub mod fake;
pub mod image;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
pub mod labels;
pub(crate) mod pool;
pub use pool::PoolConfig;
pub use pool::RunGate;
pub mod preload;
pub mod protocol;
pub(crate) mod relay;
pub(crate) mod sandbox_dir;
mod sources;
pub(crate) use sources::publish_file;
mod wrap;

pub use self::wrap::{Inert, Wrap};

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc::UnboundedSender;

use crate::job::{JobSpec, Outcome, RunEnv, RunEvent};

/// Where a run's live events go; `None` when nobody listens.
pub type Events = Option<UnboundedSender<RunEvent>>;

/// Send an event if somebody listens; a listener that went away is not an error.
pub fn emit(events: &Events, event: RunEvent) {
    if let Some(tx) = events {
        let _ = tx.send(event);
    }
}

/// A failure of the infrastructure, never of the user's code: the message says what to do.
/// Backend-neutral variants; each backend fills in its own words (what it could not reach,
/// what to do about it).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend itself does not answer (`what`: e.g. "the Docker daemon").
    #[error("cannot reach {what}: {detail}. {hint}")]
    Unreachable {
        what: &'static str,
        detail: String,
        hint: &'static str,
    },
    #[error(
        "the sandbox image `{image}` is not present. Build it with `mcp-code-executor image build`"
    )]
    ImageMissing { image: String },
    #[error("the job was refused before it ran: {0}")]
    Rejected(String),
    #[error("the sandbox runner failed: {0}")]
    Runner(String),
    /// The backend answered with an error (`backend`: e.g. "Docker").
    #[error("{backend} error while {action}: {detail}")]
    Failed {
        backend: &'static str,
        action: &'static str,
        detail: String,
    },
}

/// A stateful sandbox: variables, imports and functions of one cell are there in the next.
/// The only case where a sandbox serves more than one call; dropping it removes the
/// container.
#[async_trait]
pub trait Session: Send {
    /// Run one cell REPL-style (the value of a final expression is shown). An exception
    /// gives exit code 1 and keeps the session; a timeout or an OOM kill ends it.
    async fn exec(
        &mut self,
        code: &str,
        timeout: std::time::Duration,
        events: Events,
    ) -> Result<Outcome, BackendError>;

    /// Put `files` into the session's `/workspace` (written since it opened, e.g. with
    /// `write_file`) without touching the interpreter's state. How they travel is the
    /// backend's business; callers only say what should be there.
    async fn put_files(
        &mut self,
        files: &[crate::job::InputFile],
        timeout: std::time::Duration,
    ) -> Result<(), BackendError>;

    /// Can it run another cell? False once its interpreter or container is gone.
    fn alive(&self) -> bool;

    /// May it be working between cells (the idle warm-up asked after its last cell)? A
    /// message other than the next cell would cut that work short: a copy that can wait
    /// for the next cell waits.
    fn busy_between_cells(&self) -> bool {
        false
    }
}

/// Facts about the backend, for `doctor`, `/readyz` and health checks, in words every
/// backend can use; what only one backend knows travels in `details` (Docker: `runtime`).
#[derive(Debug, Clone)]
pub struct BackendInfo {
    /// Which backend: `docker`.
    pub kind: &'static str,
    /// e.g. "Docker 20.10.24 (API 1.41)".
    pub version: String,
    /// The image runs use, and whether it is present.
    pub image: String,
    pub image_present: bool,
    /// Backend-specific facts (name, value), e.g. the OCI runtime.
    pub details: Vec<(String, String)>,
}

/// Gauges of a backend, for metrics and readiness.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendStats {
    /// Containers this process made that are not removed yet.
    pub live_containers: usize,
    /// Warm sandboxes waiting for a run, and how many the pool aims at (0: no pool).
    pub pool_ready: usize,
    pub pool_target: usize,
    /// Runs served by a warm sandbox, and runs that found none of their shape, since start.
    pub pool_hits: u64,
    pub pool_misses: u64,
}

/// The backend's own ceiling, for the benchmark's profile: how long each step of a bare
/// sandbox's life takes (same hardening, no runner, no Python), medians, and sandboxes per
/// second at the concurrency asked, so the engine's figures can be read against what the
/// backend alone allows.
#[derive(Debug, Clone)]
pub struct LifecycleFigures {
    pub create: Duration,
    pub start: Duration,
    pub wait: Duration,
    pub remove: Duration,
    pub per_second: f64,
}

/// Runs jobs, one fresh sandbox each. Dropping the future of [`Backend::run`] cancels the
/// run: its container is killed and removed in the background. Everything specific to one
/// kind of sandbox (containers, pools, sweeps, images) stays behind this trait.
///
/// Every method is required: a backend says what it does for each, and a wrapper that
/// forgets one does not compile. A wrapper that changes a few implements [`Wrap`] (the
/// rest forwards); a test double that answers only a few wraps [`Inert`].
#[async_trait]
pub trait Backend: Send + Sync {
    /// Run one job to its end (exit, timeout, OOM) and report the outcome.
    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, BackendError>;

    /// Is the backend reachable, and what is it?
    async fn info(&self) -> Result<BackendInfo, BackendError>;

    /// Wait until every sandbox this backend made has been removed (clean-ups run in the
    /// background, off the request path).
    async fn drain(&self);

    /// Open a stateful session: one sandbox that runs cell after cell in one interpreter.
    /// `job` gives its limits, environment and initial files (its `entry` is unused); each
    /// cell's timeout is given to [`Session::exec`].
    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError>;

    /// `tenant`'s runs will mostly use `env` from now on: a backend with a warm pool makes
    /// its waiting sandboxes (the tenant's, or the shared ones) with it and discards those
    /// made for the previous one.
    async fn prewarm(&self, tenant: &str, env: &RunEnv);

    /// Gauges right now (cheap: no call to the backend).
    fn stats(&self) -> BackendStats;

    /// Remove what processes that are gone left behind (a crash, a `kill -9`); how many.
    async fn sweep(&self) -> Result<usize, BackendError>;

    /// Sweep every `every` too, while the backend lives (a long-lived server).
    fn sweep_periodically(&self, every: std::time::Duration);

    /// Stop making sandboxes (pools included), remove those still held, and wait for the
    /// removals (bounded); what is left goes to the next start-up sweep.
    async fn shutdown(&self);

    /// Measure [`LifecycleFigures`] over `total` bare sandboxes, `concurrency` at once;
    /// `None` where the backend has no such measure (the benchmark then skips the profile).
    async fn lifecycle_ceiling(
        &self,
        total: usize,
        concurrency: usize,
    ) -> Option<Result<LifecycleFigures, BackendError>>;
}
