//! A connection: one client's view of its tenant's executor, with the state that belongs to
//! that client alone, its execute_python session and (unless the tenant shares one) its
//! workspace. Made by an explicit constructor, [`Connection::new`], once per MCP
//! connection; dropping it removes that session and that workspace.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cell::{self, CellDone};
use super::error::AppError;
use super::executor::{code_digest, Executor};
use super::workspaces::{self, WriteError};
use crate::backend::Events;
use crate::job::{JobSpec, Outcome};

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// One client of a tenant's executor.
pub struct Connection {
    id: u64,
    /// Random: names the connection's own workspace directory.
    key: String,
    executor: Arc<Executor>,
}

/// A one-shot run of stored code: its outcome and notes for the caller (a capped timeout,
/// workspace files saved or refused).
pub struct RunDone {
    pub outcome: Outcome,
    pub note: Option<String>,
}

impl Connection {
    /// A new connection to `executor`, with its own session and workspace.
    pub fn new(executor: Arc<Executor>) -> Connection {
        Connection {
            id: NEXT_CONNECTION.fetch_add(1, Ordering::SeqCst),
            key: crate::job::new_job_id(),
            executor,
        }
    }

    pub fn executor(&self) -> &Arc<Executor> {
        &self.executor
    }

    /// A short name of this connection's session, for results.
    pub fn session_name(&self) -> String {
        format!("<session {}>", self.id)
    }

    /// The workspace directory of this connection, under the workspace root: `<tenant>`
    /// when shared, else `<tenant>.sessions/<random>`.
    fn workspace_key(&self) -> String {
        let x = &self.executor;
        let tenant = crate::storage::sanitize_stem(Some(x.tenant()));
        if x.sessions.options().shared_workspace {
            tenant
        } else {
            format!("{tenant}.sessions/{}", self.key)
        }
    }

    /// Run `code`, stored at `path`, in a fresh sandbox with the workspace's files; files
    /// the code writes to `/workspace` are saved back to the workspace.
    pub async fn run_stored(
        &self,
        code: String,
        path: &Path,
        (timeout, note): (Duration, Option<String>),
        events: Events,
        cancel: &CancellationToken,
    ) -> Result<RunDone, AppError> {
        let x = &self.executor;
        let mut limits = x.settings.limits.clone();
        limits.timeout = timeout;
        let mut job = JobSpec::python(code, limits);
        job.tenant = x.tenant().to_string();
        job.keep_warm = true;
        if let Some(name) = entry_name(path) {
            job.files[0].path = name.clone();
            job.entry = name;
        }
        self.add_workspace_files(&mut job).await;
        tracing::info!(
            job_id = %job.id,
            tenant = %job.tenant,
            code_sha256 = %code_digest(&job.files[0].contents),
            file = %path.display(),
            "run requested"
        );
        let outcome = x.run(job, x.current_env().await, events, cancel).await?;
        let said = workspaces::save_returned(&x.workspaces, &self.workspace_key(), &outcome).await;
        let note = match (note, said) {
            (Some(n), Some(s)) => Some(format!("{n}; {s}")),
            (n, s) => n.or(s),
        };
        Ok(RunDone { outcome, note })
    }

    /// Put the workspace's files into a one-shot job (a file named like the job's entry is
    /// left out: the code wins).
    async fn add_workspace_files(&self, job: &mut JobSpec) {
        let x = &self.executor;
        match x.workspaces.input_files(&self.workspace_key()).await {
            Ok(files) => {
                let entry = job.entry.clone();
                job.files
                    .extend(files.into_iter().filter(|f| f.path != entry));
            }
            Err(e) => tracing::warn!(error = %e, "workspace files not sent"),
        }
        job.return_files = true;
    }

    /// Run one cell in this connection's session (opened on first use).
    pub async fn cell(
        &self,
        code: &str,
        (timeout, note): (Duration, Option<String>),
        events: Events,
        cancel: &CancellationToken,
    ) -> Result<CellDone, AppError> {
        crate::storage::check_code_size(code).map_err(|e| AppError::Invalid(e.to_string()))?;
        cell::cell(
            &self.executor,
            self.id,
            &self.workspace_key(),
            code,
            timeout,
            note,
            cancel,
            events,
        )
        .await
    }

    /// End this connection's session: true when there was one.
    pub async fn reset_session(&self) -> bool {
        cell::reset(&self.executor.sessions, self.id).await
    }

    /// Write a workspace file (`/workspace/x` and `./x` name `x`): its name and size.
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<(String, u64), AppError> {
        let name = workspaces::name_of(path);
        match self
            .executor
            .workspaces
            .write(&self.workspace_key(), name, data)
            .await
        {
            Ok(size) => Ok((name.to_string(), size)),
            Err(WriteError::Quota(e)) => {
                self.executor
                    .metrics()
                    .rejected(self.executor.tenant(), "storage");
                Err(e)
            }
            Err(WriteError::Refused(e)) => Err(e),
        }
    }

    /// Read a workspace file: its name and bytes.
    pub async fn read_file(&self, path: &str) -> Result<(String, Vec<u8>), AppError> {
        let name = workspaces::name_of(path);
        let data = self
            .executor
            .workspaces
            .read(&self.workspace_key(), name)
            .await?;
        Ok((name.to_string(), data))
    }

    /// The workspace's files (names starting with `prefix`, when given) and their sizes.
    pub async fn list_files(&self, prefix: Option<&str>) -> Result<Vec<(String, u64)>, AppError> {
        let prefix = prefix
            .map(workspaces::name_of)
            .filter(|p| !matches!(*p, "" | "." | "/"))
            .unwrap_or("");
        self.executor
            .workspaces
            .list_prefixed(&self.workspace_key(), prefix)
            .await
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let x = &self.executor;
        x.sessions.forget(self.id);
        if !x.sessions.options().shared_workspace {
            x.workspaces.remove(&self.workspace_key());
        }
    }
}

/// The stored file's name, when it is safe to use as the entry inside the workspace (so
/// tracebacks name the user's file); `None` falls back to `main.py`.
fn entry_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let ok = !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then(|| name.to_string())
}
