//! A stateful session: one pod, one interpreter, cell after cell (the Docker backend's
//! semantics). Only a timeout, an OOM kill or a dead interpreter ends it; dropping it
//! deletes the pod.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::live::Live;
use super::Inner;
use crate::backend::collect::session;
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
            return Err(session::ended());
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
        let kept = ended.kept_the_interpreter();
        let mut outcome = match self.inner.outcome_of(ended, &self.live.guard).await {
            Ok(o) => o,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        self.alive = session::goes_on(kept, &outcome);
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
            return Err(session::ended());
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
        let (put, goes_on) = session::files_put(outcome);
        self.alive &= goes_on;
        put
    }

    fn alive(&self) -> bool {
        self.alive
    }
}
