//! A stateful session over any driver: one sandbox, one interpreter, cell after cell. Only
//! a timeout, an OOM kill or a dead interpreter ends it; dropping it removes the sandbox.
//! Between cells a driver that can holds the sandbox still (Docker: paused with the cgroup
//! freezer), so that what a cell left running gets no CPU outside its run slot.
//!
//! What a session's cells import is learned as a run's imports are (the driver's
//! [`Driver::observe`]), and each module a session imports after its first cell is noted
//! once in its pool ([`crate::backend::pool::Pool::note_later`]): what the pool's sessions
//! commonly import later is then asked for by each session that opens, with its first
//! cell's imports, so sessions open on sandboxes that have it loaded and the pool's demand
//! follows. A session whose sandbox has not got them imports them while it waits between
//! cells (the idle warm-up: each cell names them, see [`EngineSession::warm_up`] and the
//! runner's `session.warm_up`); the runner then holds the sandbox still itself once the
//! warm-up is done, so the engine does not freeze it after such a cell.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::task::JoinHandle;

use super::{outcome_of, Driver, Freeze, Live, Seen};
use crate::backend::collect::{session, Ended};
use crate::backend::pool::Pools;
use crate::backend::protocol::Report;
use crate::backend::{BackendError, Events, Session};
use crate::job::{InputFile, Limits, Outcome, RunEnv};

/// Where a session's imports are learned: its engine's pools, its tenant and environment.
pub(super) struct Learn {
    pub(super) pools: Arc<Pools<Live>>,
    pub(super) tenant: String,
    pub(super) env: RunEnv,
}

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
    alive: bool,
    /// The sandbox is held still (between cells).
    frozen: bool,
    /// The hold after the last message, made off its answer's path: the next message
    /// waits for it first.
    freezing: Option<JoinHandle<Freeze>>,
    learn: Learn,
    /// The modules its cells imported so far, and the cells that ran.
    imported: BTreeSet<String>,
    cells: u64,
    /// What the current cell asks its interpreter to import afterwards (see
    /// [`EngineSession::warm_up`]), and what warm-ups imported or skipped so far.
    warm: Vec<String>,
    warmed: BTreeSet<String>,
    /// What the last message's run used outside the sandbox (tool requests, egress
    /// bytes): a cell's, once it has ended, for its usage record (#45).
    spent: crate::job::External,
}

impl<D: Driver> EngineSession<D> {
    /// A session over `live`, whose runner has been sent the session's opening input.
    pub(super) fn new(
        driver: Arc<D>,
        live: Live,
        limits: Limits,
        tools: Option<crate::job::Tools>,
        egress: Option<(crate::job::Egress, String)>,
        learn: Learn,
    ) -> Self {
        EngineSession {
            driver,
            live,
            limits,
            tools,
            egress,
            alive: true,
            frozen: false,
            freezing: None,
            learn,
            imported: BTreeSet::new(),
            cells: 0,
            warm: Vec::new(),
            warmed: BTreeSet::new(),
            spent: crate::job::External::default(),
        }
    }

    /// A cell's report: the modules it imported for the first time in this session are
    /// learned, and (after the first cell) noted in the pool.
    fn learn_from(&mut self, report: &Report) {
        let fresh: Vec<String> = report
            .imported
            .iter()
            .filter(|n| !self.imported.contains(*n))
            .cloned()
            .collect();
        if fresh.is_empty() {
            return;
        }
        self.imported.extend(fresh.iter().cloned());
        let l = &self.learn;
        let seen = Seen {
            tenant: &l.tenant,
            env: &l.env,
            pooled: false,
        };
        let fresh_report = Report {
            imported: fresh.clone(),
            ..Report::default()
        };
        self.driver.observe(&l.pools, seen, &fresh_report);
        if self.cells > 1 {
            if let Some(pool) = l.pools.pool_of(&l.tenant, &self.limits, &l.env) {
                pool.note_later(&fresh);
            }
        }
    }

    /// What the pool's sessions commonly import later and this one has not imported (on a
    /// preloading driver): imported while the session waits after the next cell.
    fn to_warm(&self) -> Vec<String> {
        if !D::PROFILE.preloads {
            return Vec::new();
        }
        let l = &self.learn;
        let Some(pool) = l.pools.pool_of(&l.tenant, &self.limits, &l.env) else {
            return Vec::new();
        };
        pool.later_imports()
            .into_iter()
            .filter(|m| !self.imported.contains(m) && !self.warmed.contains(m))
            .collect()
    }

    /// Hold the sandbox still until the next message, in the background: the answer to
    /// this one goes out now (a pause is some 10-40 ms of the daemon's), and the next
    /// message waits for the hold to be made before it lets the sandbox go on.
    fn freeze(&mut self) {
        if !self.alive || self.frozen || self.freezing.is_some() {
            return;
        }
        let (driver, id) = (self.driver.clone(), self.live.guard.id().to_string());
        self.freezing = Some(tokio::spawn(async move { driver.freeze(&id).await }));
    }

    /// The hold made after the last message, once made; a failure ends the session (its
    /// sandbox could not be held still, so it may not stay).
    async fn settle(&mut self) {
        let Some(task) = self.freezing.take() else {
            return;
        };
        match task.await.unwrap_or(Freeze::Failed) {
            Freeze::Frozen => self.frozen = true,
            Freeze::Running => {}
            Freeze::Failed => self.alive = false,
        }
    }

    /// Let it go on for the next message.
    async fn thaw(&mut self) -> Result<(), BackendError> {
        self.settle().await;
        if !self.alive {
            return Err(session::ended());
        }
        if !self.frozen {
            return Ok(());
        }
        if let Err(e) = self.driver.thaw(self.live.guard.id()).await {
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
        // Both kept to read what the cell used (usage, #45) once it has ended.
        let tool_run = self.tools.as_ref().map(|t| t.0.start());
        let mut hook = super::tools::tool_hook_of(tool_run.clone(), true);
        let egress_run = self
            .egress
            .as_ref()
            .map(|(egress, id)| egress.0.start(&format!("{id}-{}", self.cells)));
        if let Some(run) = &egress_run {
            hook = crate::backend::relay::hook(run.clone(), hook);
        }
        let run = crate::telemetry::span("sandbox.run").with("mcp_executor.session", true);
        let ended = run
            .scope(self.live.execute(message, false, limits, events, &hook))
            .await;
        if let Ok(Ended::Report(report, _)) = &ended {
            super::phases::record(&run, report, std::time::SystemTime::now());
        }
        self.spent = super::tools::spent(tool_run, egress_run);
        ended
    }

    fn warm_up(&self) -> Vec<String> {
        self.warm.clone()
    }

    async fn outcome(&mut self, ended: Ended) -> Result<Outcome, BackendError> {
        if let Ended::Report(report, _) = &ended {
            self.warmed.extend(report.warmed.iter().cloned());
            self.learn_from(report);
        }
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
        self.cells += 1;
        let limits = self.limits.clone();
        self.warm = self.to_warm();
        let (mut outcome, goes_on) = session::run_cell(self, &limits, code, timeout, &events).await;
        if let Ok(o) = &mut outcome {
            o.external = std::mem::take(&mut self.spent);
        }
        self.alive = goes_on;
        if self.warm.is_empty() {
            // After a warm-up the runner holds the sandbox still itself, once it is done.
            self.freeze();
        }
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
        self.alive &= goes_on;
        self.freeze();
        put
    }

    fn alive(&self) -> bool {
        self.alive
    }

    fn busy_between_cells(&self) -> bool {
        !self.warm.is_empty()
    }
}
