//! Making a pod (create, wait until its container runs, attach) and the conversation with
//! its runner over `pods/attach`: the job goes in on stdin, frames come back on stdout
//! until the report, the deadline or the end. With the `v5.channel.k8s.io` subprotocol,
//! closing stdin is a clean EOF of stdin alone; the output keeps coming.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, AttachedProcess, PostParams};
use tokio_util::io::ReaderStream;

use super::spec::{self, Lifetime};
use super::{classify, KubeDriver};
use crate::backend::engine::guard::Guard;
use crate::backend::engine::live::{Chunk, Input, ReadError};
use crate::backend::engine::Live;
use crate::backend::BackendError;
use crate::job::{Limits, RunEnv};

/// How long a pod may take from create to its container running (scheduling, pulling the
/// image on a new node, starting). Not part of the user's timeout.
pub(super) use crate::backend::engine::live::START_DEADLINE;

/// The attach pipes' buffers: the runner's frames are up to 64 KiB of output each.
const PIPE: usize = 64 << 10;

impl KubeDriver {
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
        let mut guard = self.guards.guard(&name);
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
        Ok(live(guard, attached))
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

/// The conversation over a pod's attach. The attach comes after the runner started, so
/// its `R` may have gone by: the runner is taken as ready (its stdin is a pipe, and the job
/// waits there until it reads it).
fn live(guard: Guard, mut attached: AttachedProcess) -> Live {
    let input: Input = Box::pin(attached.stdin().expect("stdin asked for"));
    let out = ReaderStream::with_capacity(attached.stdout().expect("stdout asked for"), PIPE)
        .map(|r| r.map(Chunk::Out));
    let err = ReaderStream::with_capacity(attached.stderr().expect("stderr asked for"), PIPE)
        .map(|r| r.map(Chunk::Err));
    let output = futures::stream::select(out, err).map(|r| {
        r.map_err(|e| {
            Box::new(move |action| BackendError::Failed {
                backend: "Kubernetes",
                action,
                detail: e.to_string(),
            }) as ReadError
        })
    });
    // Dropping the attach's handle ends the attach: it lives as long as the sandbox.
    Live::new(guard, input, Box::pin(output), true).holding(attached)
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
