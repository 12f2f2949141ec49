//! The Docker backend: one fresh, hardened container per run. bollard types stay in here.
//!
//! Lifecycle of a run (see DESIGN.md for why each step is the way it is):
//! create (read-only root, tmpfs workspace, no network, no capabilities, log driver `none`)
//! → attach (before start, or output is lost) → start → stream the job into the runner's
//! stdin → decode its framed stdout → result as soon as the `X` frame arrives. The
//! container is removed in the background on every path, by a guard whose `Drop` runs on
//! success, error, timeout, cancellation (the future dropped) and panic alike.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use super::protocol::{self, Frame, FrameDecoder, Report};
use super::{emit, BackendInfo, Events, Sandbox, SandboxError};
use crate::job::{JobSpec, Limits, Outcome, RunEvent, StreamKind};

/// Label on everything this project creates: the sweep and tests find containers by it.
pub const LABEL_MANAGED: &str = "io.mcp-code-executor.managed";
/// Label with the job id.
pub const LABEL_JOB: &str = "io.mcp-code-executor.job";
/// Label with the tenant id.
pub const LABEL_TENANT: &str = "io.mcp-code-executor.tenant";
/// Label naming the process that made the container (`host/pid/start-time`), so that the
/// start-up sweep removes only what a dead process left behind.
pub const LABEL_OWNER: &str = "io.mcp-code-executor.owner";

/// How long a container may take from start to its runner being ready. Not part of the
/// user's timeout: a slow daemon must not eat the code's time.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long to wait for Docker's verdict when the runner vanished without a report.
const POST_MORTEM_DEADLINE: Duration = Duration::from_secs(10);
/// Uid and gid the code runs as (`nobody`).
const SANDBOX_USER: &str = "65534:65534";

/// Settings of the Docker backend.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The sandbox image (see [`crate::image`]).
    pub image: String,
    /// OCI runtime (`runc` when `None`; `crun` where the daemon knows it).
    pub runtime: Option<String>,
    /// The interpreter inside the sandbox that runs the code.
    pub python: String,
}

/// Counts the removals still running in the background, so that shutdown can wait for them.
#[derive(Default)]
struct Cleanup {
    pending: AtomicUsize,
    done: Notify,
}

/// The real backend.
pub struct DockerSandbox {
    docker: Docker,
    config: DockerConfig,
    cleanup: Arc<Cleanup>,
    owner: String,
}

impl DockerSandbox {
    /// Connect to the daemon named by `DOCKER_HOST` (or the local socket) and check it answers.
    pub async fn connect(config: DockerConfig) -> Result<Self, SandboxError> {
        let docker = connect_docker().await?;
        Ok(DockerSandbox {
            docker,
            config,
            cleanup: Arc::default(),
            owner: owner_id(std::process::id()).unwrap_or_else(|| "unknown".into()),
        })
    }

    /// Remove containers of ours whose owning process on this host is gone (a crash, a
    /// `kill -9`). Containers of live processes, and of other hosts, are left alone.
    pub async fn sweep_leftovers(&self) -> Result<usize, SandboxError> {
        let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|e| classify("listing containers", e))?;
        let host = hostname();
        let mut removed = 0;
        for c in list {
            let owner = c
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_OWNER))
                .cloned()
                .unwrap_or_default();
            if !owner_is_dead(&owner, &host) {
                continue;
            }
            if let Some(id) = c.id {
                if remove_now(&self.docker, &id).await.is_ok() {
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            tracing::info!(removed, "swept containers left by a process that is gone");
        }
        Ok(removed)
    }

    fn create_body(&self, job: &JobSpec) -> ContainerCreateBody {
        let l = &job.limits;
        let labels = HashMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_JOB.to_string(), job.id.clone()),
            (LABEL_TENANT.to_string(), job.tenant.clone()),
            (LABEL_OWNER.to_string(), self.owner.clone()),
        ]);
        ContainerCreateBody {
            image: Some(self.config.image.clone()),
            user: Some(SANDBOX_USER.to_string()),
            working_dir: Some(protocol::WORKDIR.to_string()),
            hostname: Some("sandbox".to_string()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            labels: Some(labels),
            host_config: Some(host_config(l, self.config.runtime.clone())),
            ..Default::default()
        }
    }
}

/// The hardening every sandbox gets. Each line is checked by `doctor` or the tests.
fn host_config(l: &Limits, runtime: Option<String>) -> HostConfig {
    let tmpfs = |size: u64| format!("rw,nosuid,nodev,noexec,size={size},mode=1777");
    HostConfig {
        network_mode: Some("none".to_string()),
        readonly_rootfs: Some(true),
        tmpfs: Some(HashMap::from([
            (protocol::WORKDIR.to_string(), tmpfs(l.workspace_bytes)),
            ("/tmp".to_string(), tmpfs(l.tmp_bytes)),
        ])),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec!["no-new-privileges".to_string()]),
        pids_limit: Some(l.pids),
        memory: Some(l.memory_bytes as i64),
        memory_swap: Some(l.memory_bytes as i64),
        nano_cpus: Some((l.cpus * 1e9) as i64),
        shm_size: Some(16 << 20),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".to_string()),
            soft: Some(l.nofile as i64),
            hard: Some(l.nofile as i64),
        }]),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        init: Some(false),
        auto_remove: Some(false),
        runtime,
        ..Default::default()
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    async fn run(&self, job: JobSpec, events: Events) -> Result<Outcome, SandboxError> {
        let started = Instant::now();
        let input = protocol::encode_job(&job, &self.config.python)
            .map_err(|e| SandboxError::Rejected(e.to_string()))?;
        let created = self
            .docker
            .create_container(
                Some(
                    CreateContainerOptionsBuilder::default()
                        .name(&format!("mcpx-{}", job.id))
                        .build(),
                ),
                self.create_body(&job),
            )
            .await
            .map_err(|e| match e {
                BollardError::DockerResponseServerError {
                    status_code: 404, ..
                } => SandboxError::ImageMissing {
                    image: self.config.image.clone(),
                },
                e => classify("creating the container", e),
            })?;
        let guard = ContainerGuard::new(&self.docker, &created.id, &self.cleanup);
        tracing::debug!(job_id = %job.id, container = %created.id, "container created");
        emit(
            &events,
            RunEvent::Created {
                container: created.id.clone(),
            },
        );

        let attached = self
            .docker
            .attach_container(
                &created.id,
                Some(
                    AttachContainerOptionsBuilder::default()
                        .stdin(true)
                        .stdout(true)
                        .stderr(true)
                        .stream(true)
                        .build(),
                ),
            )
            .await
            .map_err(|e| classify("attaching to the container", e))?;
        self.docker
            .start_container(&created.id, None)
            .await
            .map_err(|e| classify("starting the container", e))?;

        let mut stdin = attached.input;
        let writer = async move {
            let r = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
            r
        };
        let collected = collect(attached.output, writer, &job.limits, &events).await?;
        let mut outcome = match collected {
            Ended::Report(report, out) => out.into_outcome(&report, &job.limits),
            Ended::TimedOut(out) => {
                // Kill now rather than in the background: the CPU is the next run's.
                guard.kill_now().await;
                let mut o = out.into_outcome(&Report::default(), &job.limits);
                o.timed_out = true;
                o.signal = Some(9);
                o
            }
            Ended::Vanished(out) => {
                // The runner died before it could report (the OOM killer chose it, or
                // something killed the container): ask Docker what happened.
                let (exit_code, oom) = self.post_mortem(&created.id).await;
                let mut o = out.into_outcome(&Report::default(), &job.limits);
                o.oom_killed = oom;
                match exit_code {
                    Some(c) if c > 128 => o.signal = Some((c - 128) as i32),
                    c => o.exit_code = c,
                }
                o
            }
        };
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(job_id = %job.id, status = %outcome.status_line(), "run finished");
        drop(guard);
        Ok(outcome)
    }

    async fn info(&self) -> Result<BackendInfo, SandboxError> {
        let v = self
            .docker
            .version()
            .await
            .map_err(|e| classify("asking the daemon's version", e))?;
        let image_present = self.docker.inspect_image(&self.config.image).await.is_ok();
        Ok(BackendInfo {
            version: format!(
                "Docker {} (API {})",
                v.version.unwrap_or_default(),
                v.api_version.unwrap_or_default()
            ),
            image: self.config.image.clone(),
            image_present,
        })
    }

    async fn drain(&self) {
        loop {
            let notified = self.cleanup.done.notified();
            if self.cleanup.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl DockerSandbox {
    async fn post_mortem(&self, id: &str) -> (Option<i64>, bool) {
        let wait = async {
            loop {
                match self.docker.inspect_container(id, None).await {
                    Ok(c) => {
                        let state = c.state.unwrap_or_default();
                        if state.running != Some(true) {
                            return (state.exit_code, state.oom_killed.unwrap_or(false));
                        }
                    }
                    Err(_) => return (None, false),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(POST_MORTEM_DEADLINE, wait)
            .await
            .unwrap_or((None, false))
    }
}

/// Output gathered so far, capped per stream.
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_seen: u64,
    stderr_seen: u64,
}

impl Collected {
    fn into_outcome(self, report: &Report, limits: &Limits) -> Outcome {
        let cap = limits.output_bytes;
        Outcome {
            exit_code: report.exit_code,
            signal: report.signal,
            timed_out: false,
            oom_killed: report.oom_kills > 0 && report.signal == Some(9),
            stdout_truncated: self.stdout_seen.max(report.stdout_bytes) > cap,
            stderr_truncated: self.stderr_seen.max(report.stderr_bytes) > cap,
            stdout: self.stdout,
            stderr: self.stderr,
            duration_ms: 0,
            cpu_ms: report.cpu_ms,
            peak_memory_bytes: report.peak_memory_bytes,
        }
    }
}

enum Ended {
    Report(Report, Collected),
    TimedOut(Collected),
    Vanished(Collected),
}

/// Feed the job in and read the runner's frames until it reports, the deadline passes or
/// the stream ends.
async fn collect<S, W>(
    mut output: S,
    writer: W,
    limits: &Limits,
    events: &Events,
) -> Result<Ended, SandboxError>
where
    S: futures::Stream<Item = Result<LogOutput, BollardError>> + Unpin,
    W: std::future::Future<Output = std::io::Result<()>>,
{
    let cap = limits.output_bytes;
    let mut out = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        stdout_seen: 0,
        stderr_seen: 0,
    };
    let mut decoder = FrameDecoder::default();
    let mut deadline = tokio::time::Instant::now() + START_DEADLINE;
    let mut ready = false;
    let writer = futures::FutureExt::fuse(writer);
    tokio::pin!(writer);
    let mut runner_stderr = Vec::new();
    loop {
        let chunk = tokio::select! {
            r = &mut writer => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "writing the job into the sandbox failed");
                }
                continue;
            }
            _ = tokio::time::sleep_until(deadline) => {
                if !ready {
                    return Err(SandboxError::Runner(format!(
                        "the sandbox did not become ready within {}s",
                        START_DEADLINE.as_secs()
                    )));
                }
                return Ok(Ended::TimedOut(out));
            }
            c = output.next() => c,
        };
        match chunk {
            None => {
                if !runner_stderr.is_empty() {
                    tracing::warn!(stderr = %String::from_utf8_lossy(&runner_stderr), "runner wrote to stderr");
                }
                return Ok(Ended::Vanished(out));
            }
            Some(Err(e)) => return Err(classify("reading the sandbox output", e)),
            Some(Ok(LogOutput::StdOut { message })) => decoder.push(&message),
            Some(Ok(LogOutput::StdErr { message })) => {
                // The runner's own stderr (a crash of the runner itself); user output never
                // arrives here. Keep a little for the log.
                if runner_stderr.len() < 4096 {
                    runner_stderr.extend_from_slice(&message);
                }
                continue;
            }
            Some(Ok(_)) => continue,
        }
        while let Some(frame) = decoder
            .next_frame()
            .map_err(|e| SandboxError::Runner(e.to_string()))?
        {
            match frame {
                Frame::Ready => {
                    ready = true;
                    deadline = tokio::time::Instant::now() + limits.timeout;
                    emit(events, RunEvent::Started);
                }
                Frame::Stdout(data) => {
                    keep(&mut out.stdout, &mut out.stdout_seen, cap, &data);
                    emit(
                        events,
                        RunEvent::Output {
                            stream: StreamKind::Stdout,
                            data,
                        },
                    );
                }
                Frame::Stderr(data) => {
                    keep(&mut out.stderr, &mut out.stderr_seen, cap, &data);
                    emit(
                        events,
                        RunEvent::Output {
                            stream: StreamKind::Stderr,
                            data,
                        },
                    );
                }
                Frame::Exit(report) => return Ok(Ended::Report(report, out)),
                Frame::Failed(msg) => return Err(SandboxError::Rejected(msg)),
            }
        }
    }
}

fn keep(buf: &mut Vec<u8>, seen: &mut u64, cap: u64, data: &[u8]) {
    *seen += data.len() as u64;
    let room = (cap as usize).saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// Removes its container when dropped, in the background, whatever path dropped it.
struct ContainerGuard {
    docker: Docker,
    id: String,
    cleanup: Arc<Cleanup>,
}

impl ContainerGuard {
    fn new(docker: &Docker, id: &str, cleanup: &Arc<Cleanup>) -> Self {
        ContainerGuard {
            docker: docker.clone(),
            id: id.to_string(),
            cleanup: cleanup.clone(),
        }
    }

    async fn kill_now(&self) {
        if let Err(e) = self.docker.kill_container(&self.id, None).await {
            tracing::debug!(container = %self.id, error = %e, "kill failed (already gone?)");
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let docker = self.docker.clone();
        let id = std::mem::take(&mut self.id);
        let cleanup = self.cleanup.clone();
        cleanup.pending.fetch_add(1, Ordering::SeqCst);
        let task = async move {
            if let Err(e) = remove_now(&docker, &id).await {
                tracing::warn!(container = %id, error = %e, "could not remove a sandbox container; the next start-up sweep will");
            }
            cleanup.pending.fetch_sub(1, Ordering::SeqCst);
            cleanup.done.notify_waiters();
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(task);
            }
            Err(_) => {
                // No runtime (dropped during shutdown): nothing can run the removal now.
                self.cleanup.pending.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

async fn remove_now(docker: &Docker, id: &str) -> Result<(), BollardError> {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    let mut last = None;
    for attempt in 0..5u64 {
        match docker.remove_container(id, Some(opts.clone())).await {
            Ok(()) => return Ok(()),
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
            }
        }
    }
    Err(last.expect("loop ran"))
}

/// Connect to the daemon and check it answers.
pub(crate) async fn connect_docker() -> Result<Docker, SandboxError> {
    let docker =
        Docker::connect_with_local_defaults().map_err(|e| SandboxError::DaemonUnreachable {
            detail: e.to_string(),
        })?;
    docker
        .ping()
        .await
        .map_err(|e| SandboxError::DaemonUnreachable {
            detail: e.to_string(),
        })?;
    Ok(docker)
}

/// Sort a bollard error into "the daemon is not there" and "the daemon said no".
pub(crate) fn classify(action: &'static str, e: BollardError) -> SandboxError {
    match e {
        BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::SocketNotFoundError(_)
        | BollardError::HttpClientError { .. } => SandboxError::DaemonUnreachable {
            detail: e.to_string(),
        },
        e => SandboxError::Docker {
            action,
            detail: e.to_string(),
        },
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `host/pid/start-time` of a process: the start time tells a reused pid apart.
fn owner_id(pid: u32) -> Option<String> {
    Some(format!(
        "{}/{}/{}",
        hostname(),
        pid,
        process_start_time(pid)?
    ))
}

fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the parenthesised command name (which may hold spaces).
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

fn owner_is_dead(owner: &str, host: &str) -> bool {
    let mut parts = owner.splitn(3, '/');
    let (Some(h), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if h != host {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    process_start_time(pid).map(|s| s.to_string()) != Some(start.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_of_this_process_is_alive_and_a_made_up_one_is_dead() {
        let host = hostname();
        let me = owner_id(std::process::id()).unwrap();
        assert!(!owner_is_dead(&me, &host));
        let pid = std::process::id();
        assert!(owner_is_dead(&format!("{host}/{pid}/1"), &host));
        assert!(!owner_is_dead(&format!("elsewhere/{pid}/1"), &host));
        assert!(!owner_is_dead("garbage", &host));
    }

    #[test]
    fn hardening_is_all_there() {
        let hc = host_config(&Limits::default(), None);
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.memory, hc.memory_swap);
        assert_eq!(hc.log_config.unwrap().typ.as_deref(), Some("none"));
        assert!(hc.tmpfs.unwrap()["/workspace"].contains("size=67108864"));
    }

    #[test]
    fn output_beyond_the_cap_is_counted_not_kept() {
        let (mut buf, mut seen) = (Vec::new(), 0);
        keep(&mut buf, &mut seen, 5, b"abc");
        keep(&mut buf, &mut seen, 5, b"defgh");
        assert_eq!(buf, b"abcde");
        assert_eq!(seen, 8);
    }
}
