//! A connection: one client's view of its tenant's executor. A session (a REPL and its
//! workspace, [`super::sessions`]) is what a call works on: the connection's own (made on
//! first use, removed with the connection, the default on transports that keep a
//! connection: stdio, legacy SSE, Streamable HTTP of the 2025 revisions) or one a client
//! names by its handle (`session_id`), which is how clients without protocol sessions
//! (Streamable HTTP at 2026-07-28, a new connection per request) keep state. Made by an
//! explicit constructor, [`Connection::new`], once per MCP connection.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cell::{self, CellDone};
use super::error::AppError;
use super::executor::{code_digest, Executor};
use super::sessions::SessionRef;
use super::workspaces::{self, WriteError};
use crate::backend::Events;
use crate::job::{JobSpec, Outcome};
use crate::tenancy::oauth::Principal;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// One client of a tenant's executor.
pub struct Connection {
    id: u64,
    /// The handle of the connection's own session.
    handle: String,
    executor: Arc<Executor>,
    /// The principal of the connection: given for its whole life (a legacy SSE session),
    /// else the first a call names in [`Wanted::principal`] (Streamable HTTP: a connection
    /// per request, or per protocol session, which the HTTP front binds to the principal
    /// that made it, so that one connection never serves two principals).
    principal: std::sync::OnceLock<Principal>,
}

/// A one-shot run of stored code: its outcome, notes for the caller (a capped timeout,
/// workspace files saved or refused) and the session whose workspace it used (`None`: a
/// client without protocol sessions named none and the run left nothing to keep).
pub struct RunDone {
    pub outcome: Outcome,
    pub note: Option<String>,
    pub session: Option<SessionRef>,
}

/// Which session a call works on.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// The handle the client passed (`session_id`), if any.
    pub handle: Option<&'a str>,
    /// The request came without a protocol session (a new connection per request): without
    /// a handle there is no session to default to.
    pub stateless: bool,
    /// Then open a new standalone session (a call that makes state); else none.
    pub open: bool,
    /// Who calls (`None`: the connection's own principal, if any, else the tenant's static
    /// token or stdio). A session belongs to the principal that made it: another one naming
    /// its handle is told "not found".
    pub principal: Option<&'a Principal>,
}

impl Connection {
    /// A new connection to `executor`, with its own session and workspace (made on first
    /// use).
    pub fn new(executor: Arc<Executor>) -> Connection {
        Self::bound(executor, None)
    }

    /// [`Connection::new`] for one principal for the connection's whole life.
    pub fn bound(executor: Arc<Executor>, principal: Option<Principal>) -> Connection {
        Connection {
            id: NEXT_CONNECTION.fetch_add(1, Ordering::SeqCst),
            handle: super::sessions::new_handle(),
            executor,
            principal: principal.map(std::sync::OnceLock::from).unwrap_or_default(),
        }
    }

    /// The owner key ([`Principal::owner`]) of a call by `principal` on this connection:
    /// what its sessions and tasks are bound to.
    pub fn owner(&self, principal: Option<&Principal>) -> Option<String> {
        principal
            .or(self.principal.get())
            .and_then(Principal::owner)
    }

    /// The session a call works on: the one named by `w.handle` ("not found" when this
    /// tenant has none of that name), else the connection's own, else (a stateless request)
    /// a new standalone one when `w.open`, else none.
    pub fn session(&self, w: Wanted<'_>) -> Result<Option<SessionRef>, AppError> {
        let x = &self.executor;
        if let Some(p) = w.principal {
            let _ = self.principal.set(p.clone());
        }
        let owner = self.owner(w.principal);
        if let Some(h) = w.handle {
            let slot = x.sessions.find(h.trim(), owner.as_deref())?;
            return Ok(Some(SessionRef {
                slot,
                created: false,
            }));
        }
        if !w.stateless {
            let slot = x.sessions.own(
                &x.workspaces,
                (self.id, owner),
                &self.handle,
                &self.new_workspace_key(),
            );
            return Ok(Some(SessionRef {
                slot,
                created: false,
            }));
        }
        if !w.open {
            return Ok(None);
        }
        self.open_standalone(owner).map(Some)
    }

    /// A files session for what a one-shot run keeps ([`super::sessions::Sessions::open_for_files`]).
    fn open_for_files(&self) -> Result<SessionRef, AppError> {
        let x = &self.executor;
        let slot =
            x.sessions
                .open_for_files(&x.workspaces, self.new_workspace_key(), self.owner(None))?;
        Ok(SessionRef {
            slot,
            created: true,
        })
    }

    fn open_standalone(&self, owner: Option<String>) -> Result<SessionRef, AppError> {
        let x = &self.executor;
        let slot = x
            .sessions
            .open_standalone(&x.workspaces, self.new_workspace_key(), owner)?;
        Ok(SessionRef {
            slot,
            created: true,
        })
    }

    pub fn executor(&self) -> &Arc<Executor> {
        &self.executor
    }

    /// A workspace directory for a new session, under the workspace root: `<tenant>` when
    /// shared, else `<tenant>.sessions/<random>`.
    fn new_workspace_key(&self) -> String {
        let x = &self.executor;
        let tenant = crate::storage::sanitize_stem(Some(x.tenant()));
        if x.sessions.options().shared_workspace {
            tenant
        } else {
            workspaces::session_key(&tenant, &crate::job::new_job_id())
        }
    }

    /// Run `code`, stored at `path`, in a fresh sandbox with the files of `session`'s
    /// workspace; files the code writes to `/workspace` are saved back to it. Without a
    /// session (a stateless request that named none) the run starts with an empty
    /// workspace, and a files session is opened only when the code wrote files.
    pub async fn run_stored(
        &self,
        session: Option<SessionRef>,
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
        job.tools = crate::codemode::tools_for(&job.tenant);
        job.egress = crate::egress::sandbox::for_tenant(&job.tenant);
        if let Some(name) = entry_name(path) {
            job.files[0].path = name.clone();
            job.entry = name;
        }
        // The workspace's files are read once the run has its slot (Executor::run_with_workspace).
        job.return_files = true;
        tracing::info!(
            job_id = %job.id,
            tenant = %job.tenant,
            principal = %self.owner(None).map_or("static-token".to_string(), |d| format!("user:{d}")),
            code_sha256 = %code_digest(&job.files[0].contents),
            file = ?path.display().to_string(),
            "run requested"
        );
        let workspace = session.as_ref().map(|s| s.workspace().to_string());
        let (job_id, memory) = (job.id.clone(), job.limits.memory_bytes);
        let started = std::time::Instant::now();
        let result = x
            .run_with_workspace(
                job,
                x.current_env().await,
                workspace.as_deref(),
                events,
                cancel,
            )
            .await;
        // Usage: a finished (or stopped) run is recorded before it is answered.
        let label = match &result {
            Ok(o) => Some(super::metrics::outcome_label(o)),
            Err(e) => e.run_label(),
        };
        if let Some(label) = label {
            let principal = self
                .owner(None)
                .map_or("static-token".to_string(), |d| format!("user:{d}"));
            super::usage::record(&super::usage::Record::of(
                &job_id,
                x.tenant(),
                &principal,
                result.as_ref().ok(),
                label,
                started.elapsed().as_secs_f64(),
                memory,
            ));
        }
        let outcome = result?;
        let mut session = session;
        let mut notes: Vec<String> = note.into_iter().collect();
        let wrote = !outcome.files.is_empty() || outcome.files_dropped > 0;
        if session.is_none() && wrote {
            match self.open_for_files() {
                Ok(s) => session = Some(s),
                Err(e) => notes.push(format!("files written to /workspace were not kept: {e}")),
            }
        }
        if let Some(s) = &session {
            s.slot.touch();
            if let Some(said) =
                workspaces::save_returned(&x.workspaces, s.workspace(), &outcome).await
            {
                notes.push(said);
            }
        }
        let note = (!notes.is_empty()).then(|| notes.join("; "));
        Ok(RunDone {
            outcome,
            note,
            session,
        })
    }

    /// Keep `data` as workspace file `name` of `session` (opening a files session when
    /// there is none): output too large for a result, to be read back with read_file.
    /// Within the workspace caps, not those of one write_file call.
    pub async fn keep_file(
        &self,
        session: Option<SessionRef>,
        name: &str,
        data: &[u8],
    ) -> Result<SessionRef, AppError> {
        let s = match session {
            Some(s) => s,
            None => self.open_for_files()?,
        };
        let x = &self.executor;
        match x.workspaces.keep(s.workspace(), name, data).await {
            Ok(_) => Ok(s),
            Err(WriteError::Quota(e)) => {
                x.metrics().rejected(x.tenant(), "storage");
                Err(e)
            }
            Err(WriteError::Refused(e)) => Err(e),
        }
    }

    /// Run one cell in `session` (its REPL opened on first use).
    pub async fn cell(
        &self,
        session: &SessionRef,
        code: &str,
        (timeout, note): (Duration, Option<String>),
        events: Events,
        cancel: &CancellationToken,
    ) -> Result<CellDone, AppError> {
        crate::storage::check_code_size(code).map_err(|e| AppError::Invalid(e.to_string()))?;
        cell::cell(
            &self.executor,
            &session.slot,
            code,
            timeout,
            note,
            cancel,
            events,
        )
        .await
    }

    /// End the REPL of `session` (its workspace and handle stay): true when one was open.
    pub async fn reset_session(&self, session: &SessionRef) -> bool {
        cell::reset(&self.executor.sessions, &session.slot).await
    }

    /// Write a workspace file (`/workspace/x` and `./x` name `x`): its name and size.
    pub async fn write_file(
        &self,
        session: &SessionRef,
        path: &str,
        data: &[u8],
    ) -> Result<(String, u64), AppError> {
        let name = workspaces::name_of(path);
        // A file call is a use of the session: before (so that the reaper does not take it
        // during a slow write) and after.
        session.slot.touch();
        let wrote = self
            .executor
            .workspaces
            .write(session.workspace(), name, data)
            .await;
        session.slot.touch();
        match wrote {
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
    pub async fn read_file(
        &self,
        session: &SessionRef,
        path: &str,
    ) -> Result<(String, Vec<u8>), AppError> {
        let name = workspaces::name_of(path);
        session.slot.touch();
        let data = self
            .executor
            .workspaces
            .read(session.workspace(), name)
            .await;
        session.slot.touch();
        Ok((name.to_string(), data?))
    }

    /// The workspace's files (names starting with `prefix`, when given) and their sizes.
    pub async fn list_files(
        &self,
        session: &SessionRef,
        prefix: Option<&str>,
    ) -> Result<Vec<(String, u64)>, AppError> {
        let prefix = prefix
            .map(workspaces::name_of)
            .filter(|p| !matches!(*p, "" | "." | "/"))
            .unwrap_or("");
        session.slot.touch();
        let listed = self
            .executor
            .workspaces
            .list_prefixed(session.workspace(), prefix)
            .await;
        session.slot.touch();
        listed
    }
}

impl Drop for Connection {
    /// The connection's own session goes with it: its container once no call holds it,
    /// its workspace (unless shared by the tenant) with the session.
    fn drop(&mut self) {
        self.executor.sessions.forget(&self.handle);
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
