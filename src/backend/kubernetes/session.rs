//! A stateful session: one pod, one interpreter, cell after cell (the Docker backend's
//! semantics). Only a timeout, an OOM kill or a dead interpreter ends it; dropping it
//! deletes the pod.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::live::Live;
use super::Inner;
use crate::backend::collect::Ended;
use crate::backend::protocol;
use crate::backend::{emit, BackendError, Events, Session};
use crate::job::{Limits, Outcome, RunEvent};

/// A session: one pod, one interpreter, cell after cell.
pub(super) struct KubeSession {
    inner: Arc<Inner>,
    live: Live,
    limits: Limits,
    alive: bool,
}

impl KubeSession {
    /// A session over `live`, whose runner has been sent the session's opening input.
    pub(super) fn new(inner: Arc<Inner>, live: Live, limits: Limits) -> Self {
        KubeSession {
            inner,
            live,
            limits,
            alive: true,
        }
    }
}

#[async_trait]
impl Session for KubeSession {
    async fn exec(
        &mut self,
        code: &str,
        timeout: Duration,
        events: Events,
    ) -> Result<Outcome, BackendError> {
        if !self.alive {
            return Err(BackendError::Rejected(
                "this session has ended; open a new one".into(),
            ));
        }
        let started = Instant::now();
        let limits = Limits {
            timeout,
            ..self.limits.clone()
        };
        emit(
            &events,
            RunEvent::Created {
                container: self.live.guard.name().to_string(),
            },
        );
        let cell = protocol::encode_cell(code, limits.output_bytes);
        let ended = match self.live.execute(&cell, false, &limits, &events).await {
            Ok(e) => e,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        let report_ok = matches!(&ended, Ended::Report(r, _) if !r.ended && r.signal.is_none() && r.exit_code.is_some_and(|c| c <= 1));
        let mut outcome = match self.inner.outcome_of(ended, &self.live.guard).await {
            Ok(o) => o,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        // A timeout, an OOM kill or a dead interpreter (`exit()` included, whatever its
        // status) ends the session: its state is gone.
        if !report_ok || outcome.timed_out || outcome.oom_killed {
            self.alive = false;
        }
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        Ok(outcome)
    }

    async fn put_files(
        &mut self,
        files: &[crate::job::InputFile],
        timeout: Duration,
    ) -> Result<(), BackendError> {
        if files.is_empty() {
            return Ok(());
        }
        if !self.alive {
            return Err(BackendError::Rejected(
                "this session has ended; open a new one".into(),
            ));
        }
        // A message of the runner's session protocol: the runner unpacks the files itself,
        // the interpreter runs nothing and its state is untouched.
        let msg =
            protocol::encode_put_files(files).map_err(|e| BackendError::Rejected(e.to_string()))?;
        let limits = Limits {
            timeout,
            ..self.limits.clone()
        };
        let outcome = match self.live.execute(&msg, false, &limits, &None).await {
            Ok(ended) => self.inner.outcome_of(ended, &self.live.guard).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(o) if o.success() => Ok(()),
            Ok(o) => {
                // Exit code 1: refused or the workspace is full, and the session goes on.
                // A timeout, an OOM kill or a vanished runner end it.
                if o.exit_code != Some(1) || o.timed_out || o.oom_killed {
                    self.alive = false;
                }
                Err(BackendError::Runner(format!(
                    "workspace files could not be copied into the session: {}",
                    o.stderr_text().trim_end()
                )))
            }
            Err(e) => {
                self.alive = false;
                Err(e)
            }
        }
    }

    fn alive(&self) -> bool {
        self.alive
    }
}
