//! A stateful session: one pod, one interpreter, cell after cell (the Docker backend's
//! semantics). Only a timeout, an OOM kill or a dead interpreter ends it; dropping it
//! deletes the pod.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::live::Live;
use super::Inner;
use crate::backend::collect::{session, Ended};
use crate::backend::{BackendError, Events, Session};
use crate::job::{Limits, Outcome};

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
impl session::Sandbox for KubeSession {
    fn name(&self) -> String {
        self.live.guard.name().to_string()
    }

    async fn execute(
        &mut self,
        message: &[u8],
        limits: &Limits,
        events: &Events,
    ) -> Result<Ended, BackendError> {
        self.live
            // Code mode is not wired on Kubernetes yet: a cell's tool requests are answered
            // that no tools are there (instead of failing the cell).
            .execute(
                message,
                false,
                limits,
                events,
                &crate::backend::protocol::tool_hook(&None, true),
            )
            .await
    }

    async fn outcome(&mut self, ended: Ended) -> Result<Outcome, BackendError> {
        self.inner.outcome_of(ended, &self.live.guard).await
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
        let limits = self.limits.clone();
        let (outcome, goes_on) = session::run_cell(self, &limits, code, timeout, &events).await;
        self.alive = goes_on;
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
        let limits = self.limits.clone();
        let (put, goes_on) = session::put(self, &limits, files, timeout).await;
        self.alive &= goes_on;
        put
    }

    fn alive(&self) -> bool {
        self.alive
    }
}
