//! One-shot runs of code as a front end asks for them (`execute_code`, `execute_code_file`),
//! in one call: the timeout, the session, the code stored (or read back), the run, and what
//! the result cannot carry kept in the session's workspace. Each refusal is said by the step
//! that made it ([`NotRun`]), so that the front end answers it its own way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::connection::{Connection, Wanted};
use super::error::AppError;
use super::sessions::SessionRef;
use crate::backend::Events;
use crate::job::Outcome;

/// The code of a one-shot run.
#[derive(Debug, Clone, Copy)]
pub enum Code<'a> {
    /// New code, stored first under `filename` (sanitised, plus a unique suffix).
    New {
        filename: Option<&'a str>,
        code: &'a str,
    },
    /// Code stored before, at `file_path` as the client sent it.
    Stored { file_path: &'a str },
}

/// A one-shot run as asked for.
#[derive(Debug, Clone, Copy)]
pub struct CodeRun<'a> {
    pub code: Code<'a>,
    /// The session whose workspace the run uses (none opened for it: `open` is ignored).
    pub session: Wanted<'a>,
    /// The timeout asked for, in seconds.
    pub timeout: Option<f64>,
    /// The run was started as a task (its timeout is capped at the task maximum).
    pub as_task: bool,
}

/// Why a one-shot run gave no outcome, by the step that said no.
#[derive(Debug)]
pub enum NotRun {
    /// The timeout asked for is malformed: nothing was attempted.
    Timeout(AppError),
    /// The session named cannot be used.
    Session(AppError),
    /// The code could not be stored, or the stored code read.
    Code(AppError),
    /// The run failed; its code is stored at `path`.
    Run { error: AppError, path: PathBuf },
}

/// Workspace files kept for a result: the session that keeps them (opened for them when
/// there was none), their names, and why some were not kept.
pub struct Kept {
    pub session: Option<SessionRef>,
    pub names: Vec<String>,
    pub refused: Option<String>,
}

/// A one-shot run that ran: its outcome, notes for the caller, where its code is stored,
/// the timeout it had, what the front end made of it, and the files kept for its result.
pub struct Ran<T> {
    pub outcome: Outcome,
    pub note: Option<String>,
    pub path: PathBuf,
    pub timeout: Duration,
    pub made: T,
    pub kept: Kept,
}

/// What a result cannot carry and the workspace should keep: (file name, bytes).
pub type Keep = Vec<(String, Vec<u8>)>;

impl Connection {
    /// Run `run.code` in a fresh sandbox with the session's workspace files (see
    /// [`Connection::run_stored`]). `made` turns the outcome (with the timeout it had and
    /// where the code is stored) into the front end's answer and the files that answer
    /// cannot carry, which are then kept ([`Connection::keep_files`]).
    pub async fn execute_code<T>(
        &self,
        run: CodeRun<'_>,
        events: Events,
        cancel: &CancellationToken,
        made: impl FnOnce(&Outcome, Duration, &Path) -> (T, Keep),
    ) -> Result<Ran<T>, NotRun> {
        let x = self.executor();
        let timeout = x
            .run_timeout(run.timeout, run.as_task)
            .map_err(NotRun::Timeout)?;
        let wanted = Wanted {
            open: false,
            ..run.session
        };
        let session = self.session(wanted).map_err(NotRun::Session)?;
        // Stored code is the caller's own: another user's file_path is not found.
        let owner = self.owner(run.session.principal);
        let owner = owner.as_deref();
        let (path, code) = match run.code {
            Code::New { filename, code } => {
                let path = x
                    .create_code(owner, filename, code)
                    .await
                    .map_err(NotRun::Code)?;
                (path, code.to_string())
            }
            Code::Stored { file_path } => {
                x.read_code(owner, file_path).await.map_err(NotRun::Code)?
            }
        };
        let secs = timeout.0;
        let done = match self
            .run_stored(session, code, &path, timeout, events, cancel)
            .await
        {
            Ok(done) => done,
            Err(error) => return Err(NotRun::Run { error, path }),
        };
        let (made, keep) = made(&done.outcome, secs, &path);
        let kept = self.keep_files(done.session, keep).await;
        Ok(Ran {
            outcome: done.outcome,
            note: done.note,
            path,
            timeout: secs,
            made,
            kept,
        })
    }

    /// Keep in the workspace what a result cannot carry (opening a session when there is
    /// none); a refused file (a quota, the workspace caps) does not stop the others.
    pub async fn keep_files(&self, mut session: Option<SessionRef>, keep: Keep) -> Kept {
        let mut names = Vec::new();
        let mut refused = Vec::new();
        for (name, data) in keep {
            match self.keep_file(session.clone(), &name, &data).await {
                Ok(s) => {
                    session = Some(s);
                    names.push(name);
                }
                Err(e) => refused.push(format!("{name}: {e}")),
            }
        }
        if let Some(s) = session.as_ref().filter(|_| !names.is_empty()) {
            super::cell::settle_soon(self.executor(), &s.slot);
        }
        let refused = (!refused.is_empty()).then(|| refused.join("; "));
        Kept {
            session,
            names,
            refused,
        }
    }
}
