//! The job model: what a run is asked to do ([`JobSpec`], [`Limits`]) and what came of it
//! ([`Outcome`]). Every front end (the `run` CLI, the MCP tools) speaks these types; no
//! backend type leaks through them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Serialize, Serializer};

/// One file the job brings into the sandbox workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    /// Relative path inside the workspace, `/`-separated, no `..`.
    pub path: String,
    pub contents: Vec<u8>,
}

/// Everything a sandbox needs to run one piece of code once.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Unique id, used in container names and labels so that logs and leftovers can be traced.
    pub id: String,
    /// The tenant the job runs for; `local` when the server serves a single user.
    pub tenant: String,
    /// Files unpacked into the workspace before the code starts.
    pub files: Vec<InputFile>,
    /// Which of `files` is run with Python.
    pub entry: String,
    pub limits: Limits,
    /// The Python environment, network and identity the job runs with.
    pub env: RunEnv,
    /// Return the files the code creates or changes under `/workspace` in
    /// [`Outcome::files`] (capped: 100 files, 8 MiB each, 32 MiB in all).
    pub return_files: bool,
    /// Jobs like this one (tenant, limits, environment) are the tenant's usual runs: a
    /// backend with per-tenant warm pools keeps one ready for them. Internal jobs (probes,
    /// installs, the self-test) leave it off.
    pub keep_warm: bool,
    /// Code mode (#26): the tools of other MCP servers the code may call through the
    /// runner's channel; `None`: the runner answers every call itself that none is there.
    pub tools: Option<Tools>,
    /// Egress by policy (#41): the proxy the code reaches through the runner's channel
    /// (`HTTP_PROXY` in the sandbox); `None`: no network at all, as always.
    pub egress: Option<Egress>,
    /// A session's first cell, when the session opens for one: its imports choose the
    /// waiting sandbox (plain, or preloaded with what it imports) as a one-shot run's
    /// entry file's do. Never sent to the sandbox; `None` for runs.
    pub first_cell: Option<String>,
}

/// Egress's side of a run, as a backend sees it: each run (or each session cell) gets a
/// fresh [`EgressRun`] (its budget; dropped, it ends every connection of the run), which
/// serves each stream the sandbox opens. Made by `crate::egress`; the backend only relays
/// bytes.
#[derive(Clone)]
pub struct Egress(pub std::sync::Arc<dyn EgressHost>);

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Egress")
    }
}

/// Where a run's connections go.
pub trait EgressHost: Send + Sync {
    /// The scope of one run (or one cell), named `run` in the egress log.
    fn start(&self, run: &str) -> std::sync::Arc<dyn EgressRun>;
    /// The interception CA's certificate (PEM, public): the sandbox trusts it besides
    /// its system CAs (`SSL_CERT_FILE`, ...), for the hosts whose requests the proxy
    /// intercepts to add a rule's headers.
    fn ca_pem(&self) -> String;
}

/// A connection the code opened, as the proxy's client stream: an in-memory duplex fed by
/// the runner's relay, or a Unix socket connection from the sandbox.
pub trait EgressStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin> EgressStream for T {}

/// The way a connection of the code reached the server (a metric's label; the proxy does
/// not care).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressChannel {
    /// The sandbox's own Unix socket, bind-mounted by the driver (Docker under runc).
    Socket,
    /// A numbered stream over the runner's stdin/stdout (every driver; the fallback).
    Relay,
}

impl EgressChannel {
    /// The label's value: `socket` or `relay`.
    pub fn label(self) -> &'static str {
        match self {
            EgressChannel::Socket => "socket",
            EgressChannel::Relay => "relay",
        }
    }
}

/// One run's connections.
pub trait EgressRun: Send + Sync {
    /// Serve one connection the code opened, as the proxy's client stream `io`, until it
    /// ends or the run does; `channel`: how it came.
    fn serve(
        &self,
        io: Box<dyn EgressStream>,
        channel: EgressChannel,
    ) -> futures::future::BoxFuture<'static, ()>;
    /// Connections the code may hold open at once through each of the backend's channels:
    /// each holds buffers there whether or not the proxy admitted a request on it.
    fn max_streams(&self) -> usize;
    /// Bytes the run sent upstream and received so far, all its connections together.
    fn spent(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// Code mode's side of a run, as a backend sees it: each run (or each session cell) gets
/// a fresh [`ToolRun`] (its budget), whose answers the backend writes back to the runner.
/// Made by `crate::codemode`; the backend only relays bytes.
#[derive(Clone)]
pub struct Tools(pub std::sync::Arc<dyn ToolHost>);

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tools")
    }
}

/// Where a run's tool requests go.
pub trait ToolHost: Send + Sync {
    /// The state of one run (or one cell): its calls, its budget, its calls in flight.
    fn start(&self) -> std::sync::Arc<dyn ToolRun>;
}

/// One run's tool requests.
#[async_trait::async_trait]
pub trait ToolRun: Send + Sync {
    /// The message to write to the runner's stdin (`u32` length, JSON of kind `tool`)
    /// that answers `request` (the JSON the code sent, unchecked). Dropping the future
    /// cancels the call (the run ended).
    async fn answer(&self, request: Vec<u8>) -> Vec<u8>;
    /// Tool requests the run made so far (what its call budget counts).
    fn calls(&self) -> u64 {
        0
    }
}

/// Where a piece of a sandbox's environment (a venv, its base interpreter, an installer's
/// work directory, a CA bundle) comes from. The `env` module decides *which* environment a
/// run gets and says so with sources; the backend decides *how* each source reaches the
/// sandbox, and refuses (with [`BackendError::Rejected`](crate::backend::BackendError)) a
/// source it cannot provide. Each variant exists because some backend needs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A directory (or file) of the server's host, seen in the sandbox at the same path: a
    /// venv's `bin/python` and its `home` are absolute paths, so they must stay where they
    /// are. Only a backend whose sandboxes run on the server's host can provide it (Docker:
    /// a bind mount). What the `env` module produces today.
    HostPath {
        path: PathBuf,
        /// Read-only unless an installer needs to write into it.
        writable: bool,
    },
    /// A named volume of the backend (a Docker volume, a Kubernetes PersistentVolumeClaim),
    /// or `subpath` inside it, at `target` in the sandbox: for sandboxes that do not share
    /// the server's filesystem (pods on other nodes), environments live on storage both can
    /// reach. `target` is absolute, and where the environment's interpreter expects it.
    Volume {
        name: String,
        /// A directory inside the volume, relative; `None` is the whole volume.
        subpath: Option<PathBuf>,
        target: PathBuf,
        writable: bool,
    },
    /// Already in the sandbox image at `path` (an environment baked in at build time, as a
    /// cluster without shared storage needs): nothing to mount, and never writable, since
    /// the image's root is read-only.
    Image { path: PathBuf },
}

impl Source {
    /// The host's `path`, read-only.
    pub fn host(path: impl Into<PathBuf>) -> Source {
        Source::HostPath {
            path: path.into(),
            writable: false,
        }
    }

    /// The host's `path`, writable (installers).
    pub fn host_writable(path: impl Into<PathBuf>) -> Source {
        Source::HostPath {
            path: path.into(),
            writable: true,
        }
    }

    /// Where the source appears inside the sandbox.
    pub fn target(&self) -> &Path {
        match self {
            Source::HostPath { path, .. } | Source::Image { path } => path,
            Source::Volume { target, .. } => target,
        }
    }

    /// Can the sandbox write into it?
    pub fn writable(&self) -> bool {
        match self {
            Source::HostPath { writable, .. } | Source::Volume { writable, .. } => *writable,
            Source::Image { .. } => false,
        }
    }
}

/// What a sandbox runs with beyond its limits. The default is the image's own Python, no
/// sources, no network, uid 65534: what every one-shot run of untrusted code gets.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct RunEnv {
    /// The interpreter inside the sandbox; `None` is the image's `/usr/bin/python3`.
    pub python: Option<String>,
    /// What the sandbox needs beyond the image (the environment, an installer's
    /// directories), each provided by the backend its own way.
    pub sources: Vec<Source>,
    /// Extra environment variables (e.g. `SSL_CERT_FILE` for installers).
    pub vars: Vec<(String, String)>,
    /// Network access (installers only): the default bridge instead of `none`.
    pub network: bool,
    /// `uid:gid` to run as; `None` is 65534:65534.
    pub user: Option<String>,
}

impl JobSpec {
    /// A job that runs `code` as `main.py` with the given limits.
    pub fn python(code: impl Into<Vec<u8>>, limits: Limits) -> Self {
        JobSpec {
            id: new_job_id(),
            tenant: LOCAL_TENANT.to_string(),
            files: vec![InputFile {
                path: "main.py".to_string(),
                contents: code.into(),
            }],
            entry: "main.py".to_string(),
            limits,
            env: RunEnv::default(),
            return_files: false,
            keep_warm: false,
            tools: None,
            egress: None,
            first_cell: None,
        }
    }
}

/// The tenant of a server without a tenants file (and of the `run` CLI).
pub const LOCAL_TENANT: &str = "local";

/// A fresh random job id (12 hex characters: short enough for container names, random
/// enough not to collide across the lifetime of a daemon).
pub fn new_job_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// Resource limits of one run. Every field has a named default in [`Limits::default`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Limits {
    /// Wall-clock time the code may run, counted from the moment the sandbox is ready.
    #[serde(serialize_with = "ser_secs")]
    pub timeout: Duration,
    /// Memory of the whole container, swap included (no extra swap).
    pub memory_bytes: u64,
    /// CPU quota in cores (0.5 = half a core).
    pub cpus: f64,
    /// Processes and threads the container may hold at once.
    pub pids: i64,
    /// Bytes kept of stdout and of stderr, each; the rest is counted and dropped.
    pub output_bytes: u64,
    /// Size of the `/workspace` tmpfs (the code, its inputs and what it writes).
    pub workspace_bytes: u64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_bytes: u64,
    /// Open file descriptors per process.
    pub nofile: u64,
}

/// Named defaults: conservative enough for untrusted code, large enough for pandas.
pub mod defaults {
    use std::time::Duration;

    pub const TIMEOUT: Duration = Duration::from_secs(30);
    pub const MEMORY_BYTES: u64 = 512 << 20;
    pub const CPUS: f64 = 1.0;
    pub const PIDS: i64 = 128;
    pub const OUTPUT_BYTES: u64 = 1 << 20;
    pub const WORKSPACE_BYTES: u64 = 64 << 20;
    pub const TMP_BYTES: u64 = 64 << 20;
    pub const NOFILE: u64 = 1024;
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: defaults::TIMEOUT,
            memory_bytes: defaults::MEMORY_BYTES,
            cpus: defaults::CPUS,
            pids: defaults::PIDS,
            output_bytes: defaults::OUTPUT_BYTES,
            workspace_bytes: defaults::WORKSPACE_BYTES,
            tmp_bytes: defaults::TMP_BYTES,
            nofile: defaults::NOFILE,
        }
    }
}

fn ser_secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// What happens during a run, as it happens: for live output in the CLI and progress
/// notifications in MCP. The [`Outcome`] holds the same output in full (up to the cap).
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// The call passed admission (its quota): it now waits for its environment and a run
    /// slot. A refused call sends no event at all.
    Admitted,
    /// A container exists for the job (its backend id, for diagnostics).
    Created { container: String },
    /// The sandbox is up and the code is starting.
    Started,
    /// A chunk of output, only up to the output cap.
    Output { stream: StreamKind, data: Vec<u8> },
}

/// The result of a run of user code. A failure of the user's code (non-zero exit, timeout,
/// OOM) is an `Outcome`; a failure of the infrastructure is a
/// [`BackendError`](crate::backend::BackendError).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// Exit status of the code; `None` when it was killed by a signal or timed out.
    pub exit_code: Option<i64>,
    /// The signal that killed the code, if one did (9 for a timeout or the OOM killer).
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    #[serde(serialize_with = "ser_lossy")]
    pub stdout: Vec<u8>,
    #[serde(serialize_with = "ser_lossy")]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Wall time from the request to the result, container start-up included.
    pub duration_ms: u64,
    /// CPU time (user + system) the code used, where the runner could measure it.
    pub cpu_ms: Option<u64>,
    /// Peak memory of the sandbox, where the runner could measure it.
    pub peak_memory_bytes: Option<u64>,
    /// Figures the code produced (matplotlib, shown or left open), PNG.
    pub artifacts: Vec<Artifact>,
    /// Figures over the caps (10 per run, 4 MiB each), not returned.
    pub artifacts_dropped: u64,
    /// Files the code created or changed under `/workspace`, when the job asked for them.
    #[serde(skip)]
    pub files: Vec<OutputFile>,
    /// Such files over the caps, not returned.
    pub files_dropped: u64,
    /// What was left out of this result and why, one sentence each (figures and files
    /// over what one run may return in all, a figure that was not a PNG, a file name
    /// unfit to show, a workspace too deep or too large to walk).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What the run used outside its sandbox (usage, #45); not part of the result shown.
    #[serde(skip)]
    pub external: External,
}

/// What a run used outside its sandbox, for usage records (#45): code-mode tool requests
/// (refused and malformed ones too, as the run's call budget counts them) and egress
/// bytes through the proxy, all the run's connections together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct External {
    pub tool_calls: u64,
    pub egress_up_bytes: u64,
    pub egress_down_bytes: u64,
}

/// A file the code wrote under `/workspace`. The path comes from the sandbox: check it
/// (as any client path) before writing it anywhere.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputFile {
    /// Relative to `/workspace`.
    pub path: String,
    pub data: Vec<u8>,
}

/// A file a run produced, returned with its outcome.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Artifact {
    /// e.g. `figure-001.png`, or `figure-002-downscaled.png` when it was scaled down to fit.
    pub name: String,
    pub data: Vec<u8>,
}

impl Artifact {
    /// The media type, from the name.
    pub fn mime(&self) -> &'static str {
        if self.name.ends_with(".png") {
            "image/png"
        } else {
            "application/octet-stream"
        }
    }
}

impl Serialize for Artifact {
    /// Name, type and size: the bytes travel as MCP image content, not inside JSON.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Artifact", 3)?;
        st.serialize_field("name", &self.name)?;
        st.serialize_field("mime", self.mime())?;
        st.serialize_field("bytes", &self.data.len())?;
        st.end()
    }
}

impl Outcome {
    /// Did the code exit 0 without being stopped?
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && !self.oom_killed && self.signal.is_none()
    }

    /// stdout as text (invalid UTF-8 replaced).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (invalid UTF-8 replaced).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// One line an LLM or a person reads first: how the run ended.
    pub fn status_line(&self) -> String {
        let mut s = if self.timed_out {
            "timed out (killed at the deadline)".to_string()
        } else if self.oom_killed {
            "killed: out of memory".to_string()
        } else if let Some(sig) = self.signal {
            format!("killed by signal {sig}")
        } else {
            match self.exit_code {
                Some(c) => format!("exit code {c}"),
                None => "ended without an exit code".to_string(),
            }
        };
        if self.stdout_truncated {
            s.push_str(", stdout truncated");
        }
        if self.stderr_truncated {
            s.push_str(", stderr truncated");
        }
        s.push_str(&format!(", {} ms", self.duration_ms));
        for note in &self.notes {
            s.push_str("; ");
            s.push_str(note);
        }
        s
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.status_line())
    }
}

fn ser_lossy<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_line_names_the_ending() {
        let ok = Outcome {
            exit_code: Some(0),
            duration_ms: 5,
            ..Default::default()
        };
        assert!(ok.success());
        assert_eq!(ok.status_line(), "exit code 0, 5 ms");
        let t = Outcome {
            timed_out: true,
            signal: Some(9),
            stdout_truncated: true,
            ..Default::default()
        };
        assert!(!t.success());
        assert!(t.status_line().starts_with("timed out"));
        assert!(t.status_line().contains("stdout truncated"));
        let oom = Outcome {
            oom_killed: true,
            signal: Some(9),
            ..Default::default()
        };
        assert!(oom.status_line().contains("out of memory"));
    }

    #[test]
    fn outcome_json_has_the_documented_fields() {
        let o = Outcome {
            exit_code: Some(3),
            stdout: b"caf\xc3\xa9 \xff".to_vec(),
            ..Default::default()
        };
        let v = serde_json::to_value(&o).unwrap();
        for k in [
            "exit_code",
            "signal",
            "timed_out",
            "oom_killed",
            "stdout_truncated",
            "stderr_truncated",
            "duration_ms",
            "cpu_ms",
            "peak_memory_bytes",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["stdout"], "café \u{fffd}");
    }
}
