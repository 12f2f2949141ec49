//! A stateful session: one container, one interpreter, cell after cell. Only a timeout, an
//! OOM kill or a dead interpreter ends it; dropping it removes the container.
//!
//! Between cells the container is frozen (Docker pause, the cgroup freezer): a cell that
//! leaves threads or processes running gets no CPU outside its run slot; they go on
//! when the next cell runs. Its memory stays held, within the session's own limit.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::live::Live;
use super::Inner;
use crate::backend::collect::{session, Ended};
use crate::backend::{BackendError, Events, Session};
use crate::job::{Limits, Outcome};

/// A session: one container, one interpreter, cell after cell.
pub(super) struct DockerSession {
    inner: Arc<Inner>,
    live: Live,
    limits: Limits,
    alive: bool,
    /// The container is paused (between cells).
    frozen: bool,
    /// Code mode (#26): what the session's code may call.
    pub(super) tools: Option<crate::job::Tools>,
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
            tools: None,
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
impl session::Sandbox for DockerSession {
    fn name(&self) -> String {
        self.live.guard.id().to_string()
    }

    async fn execute(
        &mut self,
        message: &[u8],
        limits: &Limits,
        events: &Events,
    ) -> Result<Ended, BackendError> {
        // Code mode (#26): each cell gets its own tool budget.
        let hook = crate::backend::protocol::tool_hook(&self.tools, true);
        self.live
            .execute(message, false, limits, events, &hook)
            .await
    }

    async fn outcome(&mut self, ended: Ended) -> Result<Outcome, BackendError> {
        self.inner.outcome_of(ended, &self.live.guard).await
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
        self.thaw().await?;
        let limits = self.limits.clone();
        let (outcome, goes_on) = session::run_cell(self, &limits, code, timeout, &events).await;
        self.alive = goes_on;
        self.freeze().await;
        outcome
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
        self.thaw().await?;
        let limits = self.limits.clone();
        let (put, goes_on) = session::put(self, &limits, files, timeout).await;
        self.freeze().await;
        self.alive &= goes_on;
        put
    }

    fn alive(&self) -> bool {
        self.alive
    }
}
