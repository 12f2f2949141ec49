//! A stateful session: one container, one interpreter, cell after cell. Only a timeout, an
//! OOM kill or a dead interpreter ends it; dropping it removes the container.
//!
//! Between cells the container is frozen (Docker pause, the cgroup freezer): a cell that
//! leaves threads or processes running gets no CPU outside its run slot; they go on
//! when the next cell runs. Its memory stays held, within the session's own limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::live::Live;
use super::Inner;
use crate::backend::collect::session;
use crate::backend::protocol;
use crate::backend::{emit, BackendError, Events, Session};
use crate::job::{Limits, Outcome, RunEvent};

/// A session: one container, one interpreter, cell after cell.
pub(super) struct DockerSession {
    inner: Arc<Inner>,
    live: Live,
    limits: Limits,
    alive: bool,
    /// The container is paused (between cells).
    frozen: bool,
}

impl DockerSession {
    /// A session over `live`, whose runner has been sent the session's opening input.
    pub(super) fn new(inner: Arc<Inner>, live: Live, limits: Limits) -> Self {
        DockerSession {
            inner,
            live,
            limits,
            alive: true,
            frozen: false,
        }
    }

    /// Freeze the container until the next message: nothing the code left running
    /// computes between cells. A failure ends the session (its container could not be
    /// held still, so it may not stay).
    async fn freeze(&mut self) {
        if !self.alive || self.frozen {
            return;
        }
        // A pause can fail for a moment on a loaded host (the freezer cgroup busy): tried
        // three times before the session is given up.
        let mut last = None;
        for attempt in 0..3u64 {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
            }
            match self
                .inner
                .docker
                .pause_container(self.live.guard.id())
                .await
            {
                Ok(()) => {
                    self.frozen = true;
                    return;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            tracing::warn!(error = %e, "could not pause a session between cells: ending it");
        }
        self.alive = false;
    }

    /// Thaw the container for the next message.
    async fn thaw(&mut self) -> Result<(), BackendError> {
        if !self.frozen {
            return Ok(());
        }
        let id = self.live.guard.id();
        if let Err(e) = self.inner.docker.unpause_container(id).await {
            // Running and not paused after all (a pause Docker reported failed that did not
            // take, say): as wanted. Anything else ends the session.
            let state = self.inner.docker.inspect_container(id, None).await.ok();
            let state = state.and_then(|c| c.state).unwrap_or_default();
            if state.running == Some(true) && state.paused != Some(true) {
                tracing::debug!(error = %e, "a session's container was not paused");
            } else {
                self.alive = false;
                return Err(BackendError::Runner(format!(
                    "the session's sandbox could not be resumed: {e}; open a new session"
                )));
            }
        }
        self.frozen = false;
        Ok(())
    }
}

#[async_trait]
impl Session for DockerSession {
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
        self.thaw().await?;
        let limits = Limits {
            timeout,
            ..self.limits.clone()
        };
        emit(
            &events,
            RunEvent::Created {
                container: self.live.guard.id().to_string(),
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
        self.freeze().await;
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
        self.thaw().await?;
        let limits = Limits {
            timeout,
            ..self.limits.clone()
        };
        let outcome = match self.live.execute(&msg, false, &limits, &None).await {
            Ok(ended) => self.inner.outcome_of(ended, &self.live.guard).await,
            Err(e) => Err(e),
        };
        self.freeze().await;
        let (put, goes_on) = session::files_put(outcome);
        self.alive &= goes_on;
        put
    }

    fn alive(&self) -> bool {
        self.alive
    }
}
