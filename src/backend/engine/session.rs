//! A stateful session over any driver: one sandbox, one interpreter, cell after cell. Only
//! a timeout, an OOM kill or a dead interpreter ends it; dropping it removes the sandbox.
//! Between cells a driver that can holds the sandbox still (Docker: paused with the cgroup
//! freezer), so that what a cell left running gets no CPU outside its run slot.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{outcome_of, Driver, Freeze, Live};
use crate::backend::collect::{session, Ended};
use crate::backend::{BackendError, Events, Session};
use crate::job::{InputFile, Limits, Outcome};

/// A session: one sandbox, one interpreter, cell after cell.
pub(super) struct EngineSession<D: Driver> {
    driver: Arc<D>,
    live: Live,
    limits: Limits,
    /// Code mode (#26): what the session's code may call.
    tools: Option<crate::job::Tools>,
    /// Egress (#41) and the session's job id: each cell gets its own scope (its byte
    /// budget; its connections end with the cell), named `<job id>-<cell>`.
    egress: Option<(crate::job::Egress, String)>,
    cells: u64,
    alive: bool,
    /// The sandbox is held still (between cells).
    frozen: bool,
}

impl<D: Driver> EngineSession<D> {
    /// A session over `live`, whose runner has been sent the session's opening input.
    pub(super) fn new(
        driver: Arc<D>,
        live: Live,
        limits: Limits,
        tools: Option<crate::job::Tools>,
        egress: Option<(crate::job::Egress, String)>,
    ) -> Self {
        EngineSession {
            driver,
            live,
            limits,
            tools,
            egress,
            cells: 0,
            alive: true,
            frozen: false,
        }
    }

    /// Hold the sandbox still until the next message; a failure ends the session (its
    /// sandbox could not be held still, so it may not stay).
    async fn freeze(&mut self) {
        if !self.alive || self.frozen {
            return;
        }
        match self.driver.freeze(&self.live.guard).await {
            Freeze::Frozen => self.frozen = true,
            Freeze::Running => {}
            Freeze::Failed => self.alive = false,
        }
    }

    /// Let it go on for the next message.
    async fn thaw(&mut self) -> Result<(), BackendError> {
        if !self.frozen {
            return Ok(());
        }
        if let Err(e) = self.driver.thaw(&self.live.guard).await {
            self.alive = false;
            return Err(e);
        }
        self.frozen = false;
        Ok(())
    }
}

#[async_trait]
impl<D: Driver> session::Sandbox for EngineSession<D> {
    fn name(&self) -> String {
        self.live.guard.id().to_string()
    }

    async fn execute(
        &mut self,
        message: &[u8],
        limits: &Limits,
        events: &Events,
    ) -> Result<Ended, BackendError> {
        // Code mode (#26): each cell gets its own tool budget; without tools, a cell's tool
        // requests are answered that no tools are there (instead of failing the cell).
        let mut hook = super::tools::tool_hook(&self.tools, true);
        if let Some((egress, id)) = &self.egress {
            self.cells += 1;
            let run = egress.0.start(&format!("{id}-{}", self.cells));
            hook = crate::backend::relay::hook(run, hook);
        }
        self.live
            .execute(message, false, limits, events, &hook)
            .await
    }

    async fn outcome(&mut self, ended: Ended) -> Result<Outcome, BackendError> {
        outcome_of(&*self.driver, ended, &self.live.guard).await
    }
}

#[async_trait]
impl<D: Driver> Session for EngineSession<D> {
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
        files: &[InputFile],
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
