//! The verdict on a container whose runner vanished: Docker is asked whether the OOM
//! killer did it.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::query_parameters::EventsOptionsBuilder;
use futures::StreamExt;

use super::DockerDriver;
use crate::backend::collect::Collected;
use crate::backend::engine::guard::Guard;
use crate::backend::BackendError;
use crate::job::Outcome;

/// How long to wait for Docker's verdict when the runner vanished without a report.
const POST_MORTEM_DEADLINE: Duration = Duration::from_secs(10);

/// How long after the exit Docker's `oom` event may still come. Docker sets a container's
/// `State.OOMKilled` only when containerd's OOM event comes before its exit event; under
/// gVisor on a busy host it came after in 13 of 80 memory bombs here, up to 0.22 s later
/// (the event is still logged then).
const LATE_OOM_EVENT: Duration = Duration::from_millis(1500);

/// The outcome of a container whose runner vanished without a report (`out`: what it sent
/// before): Docker is asked whether the OOM killer did it; if not, something outside
/// stopped it (`docker kill`, a daemon restart) and nothing is known of the code's own
/// outcome: an infrastructure error.
pub(super) async fn vanished(
    d: &DockerDriver,
    guard: &Guard,
    out: Collected,
) -> Result<Outcome, BackendError> {
    let (exit_code, mut oom) = d.post_mortem(guard.id()).await;
    if !oom && exit_code == Some(137) {
        oom = d.oom_event(guard.id()).await;
    }
    if oom {
        return Ok(out.into_killed(false));
    }
    let how = match exit_code {
        Some(c) if c > 128 => format!("killed by signal {}", c - 128),
        Some(c) => format!("exit status {c}"),
        None => "the container is gone".to_string(),
    };
    // Under gVisor the host's OOM killer ends the whole sandbox (its kernel process); a
    // kill with neither witness of the OOM killer is most likely still that (or a docker
    // kill): say so rather than guess.
    let gvisor = super::is_gvisor(d.config.runtime.as_deref()) && exit_code == Some(137);
    Err(BackendError::Runner(if gvisor {
        format!(
            "the sandbox stopped before its runner reported ({how}): under \
             gVisor this is most likely the memory limit (the host's OOM \
             killer ends the whole sandbox, and Docker does not always flag \
             it), else a docker kill; run it again with less memory use or a \
             higher --memory"
        )
    } else {
        format!(
            "the sandbox stopped before its runner reported ({how}): it was \
             stopped from outside (docker kill or rm, a daemon restart) or the \
             runner crashed; the code's own outcome is unknown, run it again"
        )
    }))
}

impl DockerDriver {
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

    /// The second witness of an OOM kill: Docker's `oom` event for `id`, logged in the
    /// last minute or within [`LATE_OOM_EVENT`] from now.
    async fn oom_event(&self, id: &str) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let since = (now.as_secs().saturating_sub(60)).to_string();
        let until = (now + LATE_OOM_EVENT).as_secs_f64().to_string();
        let filters = HashMap::from([
            ("type", vec!["container"]),
            ("container", vec![id]),
            ("event", vec!["oom"]),
        ]);
        let options = EventsOptionsBuilder::default()
            .since(&since)
            .until(&until)
            .filters(&filters)
            .build();
        let mut events = self.docker.events(Some(options));
        let seen = tokio::time::timeout(LATE_OOM_EVENT * 2, events.next()).await;
        let oom = matches!(seen, Ok(Some(Ok(_))));
        tracing::debug!(container = %id, oom, "Docker's oom event, asked after an unflagged kill");
        oom
    }
}
