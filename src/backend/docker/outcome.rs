//! How a run ended, in the user's words: the runner's report, a timeout, or a sandbox that
//! vanished, for which Docker is asked whether the OOM killer did it.

use std::time::Duration;

use super::guard::ContainerGuard;
use super::Inner;
use crate::backend::collect::Ended;
use crate::backend::BackendError;
use crate::job::Outcome;

/// How long to wait for Docker's verdict when the runner vanished without a report.
const POST_MORTEM_DEADLINE: Duration = Duration::from_secs(10);

impl Inner {
    /// Turn how a conversation ended into the user's outcome, or into an infrastructure
    /// error when the sandbox ended without its runner reporting and Docker does not say
    /// the code ran out of memory: then something outside stopped it (`docker kill`, a
    /// daemon restart) and nothing is known of the code's own outcome.
    pub(super) async fn outcome_of(
        &self,
        ended: Ended,
        guard: &ContainerGuard,
    ) -> Result<Outcome, BackendError> {
        Ok(match ended {
            Ended::Report(report, out) => out.into_outcome(&report),
            Ended::TimedOut(out) => {
                // Kill now rather than in the background: the CPU is the next run's.
                guard.kill_now().await;
                out.into_killed(true)
            }
            Ended::Vanished(out) => {
                // The runner died before it could report: the OOM killer chose it, or
                // something outside killed the container. Ask Docker which.
                let (exit_code, oom) = self.post_mortem(guard.id()).await;
                if !oom {
                    let how = match exit_code {
                        Some(c) if c > 128 => format!("killed by signal {}", c - 128),
                        Some(c) => format!("exit status {c}"),
                        None => "the container is gone".to_string(),
                    };
                    // Under gVisor the host's OOM killer ends the whole sandbox (its kernel
                    // process), and Docker now and then does not flag it (about 1 run in
                    // 35 of a memory bomb here): say so rather than guess.
                    let gvisor =
                        super::is_gvisor(self.config.runtime.as_deref()) && exit_code == Some(137);
                    return Err(BackendError::Runner(if gvisor {
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
                    }));
                }
                out.into_killed(false)
            }
        })
    }

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
