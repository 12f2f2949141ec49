//! Making a pod (create, wait until its container runs, attach) and the conversation with
//! its runner over `pods/attach`: the job goes in on stdin, frames come back on stdout
//! until the report, the deadline or the end. With the `v5.channel.k8s.io` subprotocol,
//! closing stdin is a clean EOF of stdin alone; the output keeps coming.

use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, AttachedProcess, PostParams};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use super::guard::PodGuard;
use super::spec::{self, Lifetime};
use super::{classify, Inner};
use crate::backend::collect::{Collected, Control, Ended};
use crate::backend::protocol::{Frame, FrameDecoder};
use crate::backend::{emit, BackendError, Events};
use crate::job::{Limits, RunEnv, RunEvent};

/// How long a pod may take from create to its container running (scheduling, pulling the
/// image on a new node, starting). Not part of the user's timeout.
pub(super) const START_DEADLINE: Duration = Duration::from_secs(30);

/// The attach pipes' buffers: the runner's frames are up to 64 KiB of output each.
const PIPE: usize = 64 << 10;

enum Chunk {
    Out(bytes::Bytes),
    Err(bytes::Bytes),
}

type Output = Pin<Box<dyn Stream<Item = std::io::Result<Chunk>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// A running pod whose runner waits for (or has been given) its job.
pub(super) struct Live {
    pub(super) guard: PodGuard,
    /// Holds the attach's WebSocket task: dropping it ends the attach.
    _attached: AttachedProcess,
    input: Option<Input>,
    output: Output,
    decoder: FrameDecoder,
    pub(super) born: Instant,
}

impl Inner {
    /// Create a pod of the given shape for `tenant`, wait until its container runs, and
    /// attach to it. The guard exists before the create call.
    pub(super) async fn launch(
        &self,
        limits: &Limits,
        env: &RunEnv,
        tenant: &str,
        id: &str,
        lifetime: Lifetime,
    ) -> Result<Live, BackendError> {
        let pod = spec::pod(&self.config, &self.owner, limits, env, tenant, id, lifetime)?;
        let name = pod.metadata.name.clone().expect("pods are named");
        let mut guard = PodGuard::new(&self.pods, &name, &self.cleanup);
        if let Err(e) = self.pods.create(&PostParams::default(), &pod).await {
            if let kube::Error::Api(s) = &e {
                if s.code != 409 {
                    guard.disarm();
                }
            }
            return Err(classify("creating the pod", e));
        }
        self.wait_running(&name).await?;
        let attached = self
            .pods
            .attach(
                &name,
                &AttachParams::default()
                    .container(spec::CONTAINER)
                    .stdin(true)
                    .stdout(true)
                    .stderr(true)
                    .max_stdin_buf_size(PIPE)
                    .max_stdout_buf_size(PIPE)
                    .max_stderr_buf_size(PIPE),
            )
            .await
            .map_err(|e| classify("attaching to the pod", e))?;
        Ok(Live::new(guard, attached))
    }

    /// Poll the pod until its container runs; a pod that cannot start (no such image, a
    /// bad spec, unschedulable for [`START_DEADLINE`]) is an error that says why.
    async fn wait_running(&self, name: &str) -> Result<(), BackendError> {
        let until = Instant::now() + START_DEADLINE;
        let mut delay = Duration::from_millis(10);
        loop {
            let pod = self
                .pods
                .get(name)
                .await
                .map_err(|e| classify("reading the pod", e))?;
            let status = pod.status.unwrap_or_default();
            let state = status
                .container_statuses
                .as_ref()
                .and_then(|c| c.first())
                .and_then(|c| c.state.clone())
                .unwrap_or_default();
            if state.running.is_some() {
                return Ok(());
            }
            if let Some(t) = state.terminated {
                return Err(BackendError::Runner(format!(
                    "the sandbox pod ended before it could be attached ({}, exit {})",
                    t.reason.unwrap_or_default(),
                    t.exit_code
                )));
            }
            if let Some(w) = state.waiting {
                let reason = w.reason.unwrap_or_default();
                match reason.as_str() {
                    "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"
                    | "ErrImageNeverPull" => {
                        return Err(BackendError::ImageMissing {
                            image: self.config.image.clone(),
                        })
                    }
                    "CreateContainerConfigError" | "CreateContainerError" | "RunContainerError" => {
                        return Err(BackendError::Failed {
                            backend: "Kubernetes",
                            action: "starting the sandbox pod",
                            detail: format!("{reason}: {}", w.message.unwrap_or_default()),
                        })
                    }
                    _ => {}
                }
            }
            if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) {
                return Err(BackendError::Runner(format!(
                    "the sandbox pod ended before it could be attached ({})",
                    status.reason.unwrap_or_default()
                )));
            }
            if Instant::now() > until {
                return Err(BackendError::Runner(format!(
                    "the sandbox pod did not start within {}s (phase {}): is the cluster \
                     out of room for its requests, or the image slow to pull?",
                    START_DEADLINE.as_secs(),
                    status.phase.unwrap_or_default()
                )));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }
}

impl Live {
    fn new(guard: PodGuard, mut attached: AttachedProcess) -> Self {
        let input: Input = Box::pin(attached.stdin().expect("stdin asked for"));
        let out = ReaderStream::with_capacity(attached.stdout().expect("stdout asked for"), PIPE)
            .map(|r| r.map(Chunk::Out));
        let err = ReaderStream::with_capacity(attached.stderr().expect("stderr asked for"), PIPE)
            .map(|r| r.map(Chunk::Err));
        Live {
            guard,
            _attached: attached,
            input: Some(input),
            output: Box::pin(futures::stream::select(out, err)),
            decoder: FrameDecoder::default(),
            born: Instant::now(),
        }
    }

    /// Is a waiting pod still there? One whose attach ended (the pod deleted, the node
    /// gone) has its stream ended, or something unexpected on it.
    /// The runner's `R` may arrive after the attach (it is not replayed when it came
    /// before): that is all a waiting runner may say.
    pub(super) fn still_waiting(&mut self) -> bool {
        if self.input.is_none() {
            return false;
        }
        loop {
            match self.output.next().now_or_never() {
                None => return true,
                Some(Some(Ok(Chunk::Out(data)))) => {
                    self.decoder.push(&data);
                    loop {
                        match self.decoder.next_frame() {
                            Ok(Some(Frame::Ready)) => continue,
                            Ok(None) => break,
                            _ => return false,
                        }
                    }
                }
                Some(_) => return false,
            }
        }
    }

    /// Write to the runner's stdin and keep it open (the opening of a session).
    pub(super) async fn send(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        let stdin = self
            .input
            .as_mut()
            .ok_or_else(|| BackendError::Runner("the sandbox's input is already closed".into()))?;
        let w = async {
            stdin.write_all(bytes).await?;
            stdin.flush().await
        };
        w.await
            .map_err(|e| BackendError::Runner(format!("writing into the sandbox failed: {e}")))
    }

    /// Feed the input and read the runner's frames until it reports, the deadline passes
    /// or the stream ends. With `close_input` stdin is closed after the input (a run).
    /// The attach comes after the runner started, so its `R` may have gone by: the
    /// runner's stdin is a pipe, and the job waits there until it reads it.
    pub(super) async fn execute(
        &mut self,
        input: &[u8],
        close_input: bool,
        limits: &Limits,
        events: &Events,
    ) -> Result<Ended, BackendError> {
        let stdin = self
            .input
            .take()
            .ok_or_else(|| BackendError::Runner("the sandbox's input is already closed".into()))?;
        let writer = crate::backend::collect::write_input(stdin, input, close_input).fuse();
        tokio::pin!(writer);
        let mut out = Collected::new(limits.output_bytes);
        emit(events, RunEvent::Started);
        let deadline = tokio::time::Instant::now() + limits.timeout;
        let mut runner_stderr = Vec::new();
        loop {
            let chunk = tokio::select! {
                (r, stdin) = &mut writer => {
                    self.input = stdin;
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "writing the job into the sandbox failed");
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(deadline) => return Ok(Ended::TimedOut(out)),
                c = self.output.next() => c,
            };
            match chunk {
                None => {
                    if !runner_stderr.is_empty() {
                        tracing::warn!(stderr = %String::from_utf8_lossy(&runner_stderr), "the runner wrote to stderr");
                    }
                    return Ok(Ended::Vanished(out));
                }
                Some(Err(e)) => {
                    return Err(BackendError::Failed {
                        backend: "Kubernetes",
                        action: "reading the sandbox output",
                        detail: e.to_string(),
                    })
                }
                Some(Ok(Chunk::Out(data))) => self.decoder.push(&data),
                Some(Ok(Chunk::Err(data))) => {
                    if runner_stderr.len() < 4096 {
                        runner_stderr.extend_from_slice(&data);
                    }
                    continue;
                }
            }
            while let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| BackendError::Runner(e.to_string()))?
            {
                match out.absorb(frame, events) {
                    // Code mode is not wired here yet: the runner's stdin is closed after
                    // the job, so it answers the code's tool requests itself.
                    None | Some(Control::Ready) | Some(Control::Tool(_)) => {}
                    Some(Control::Exit(report)) => return Ok(Ended::Report(report, out)),
                    Some(Control::Failed(msg)) => return Err(BackendError::Rejected(msg)),
                }
            }
        }
    }
}

/// Read the pod's verdict once its runner vanished: did the kernel's OOM killer end the
/// container (`OOMKilled`), or the kubelet the pod (`DeadlineExceeded`)? Waits (bounded)
/// for the container to be reported terminated.
pub(super) async fn verdict(api: &kube::Api<Pod>, name: &str) -> Verdict {
    let wait = async {
        loop {
            match api.get_opt(name).await {
                Ok(Some(p)) => {
                    if let Some(v) = verdict_of(&p.status.unwrap_or_default()) {
                        return v;
                    }
                }
                Ok(None) | Err(_) => return Verdict::Exited(None),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or(Verdict::Exited(None))
}

/// The verdict a pod's status gives, once it gives one: the kubelet's deadline
/// (`status.reason: DeadlineExceeded`), the OOM killer (the container terminated with
/// `reason: OOMKilled`), or another end with its exit code; `None` while the container
/// still runs.
pub(super) fn verdict_of(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<Verdict> {
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return Some(Verdict::Deadline);
    }
    let t = status
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?;
    Some(if t.reason.as_deref() == Some("OOMKilled") {
        Verdict::OomKilled
    } else {
        Verdict::Exited(Some(t.exit_code))
    })
}

/// What the pod's status says of a runner that vanished.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    OomKilled,
    Deadline,
    Exited(Option<i32>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;

    fn status(json: serde_json::Value) -> PodStatus {
        serde_json::from_value(json).unwrap()
    }

    /// Pod statuses as the API reports them (the kubelet's words) give the verdict.
    #[test]
    fn the_pod_status_says_oom_or_deadline() {
        let oom = status(serde_json::json!({
            "phase": "Failed",
            "containerStatuses": [{"name": "sandbox", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]
        }));
        assert_eq!(verdict_of(&oom), Some(Verdict::OomKilled));
        let deadline = status(serde_json::json!({
            "phase": "Failed", "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline"
        }));
        assert_eq!(verdict_of(&deadline), Some(Verdict::Deadline));
        let error = status(serde_json::json!({
            "phase": "Failed",
            "containerStatuses": [{"name": "sandbox", "image": "i", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]
        }));
        assert_eq!(verdict_of(&error), Some(Verdict::Exited(Some(2))));
        let running = status(serde_json::json!({
            "phase": "Running",
            "containerStatuses": [{"name": "sandbox", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]
        }));
        assert_eq!(verdict_of(&running), None);
    }
}
