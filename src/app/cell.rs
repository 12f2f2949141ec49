//! One `execute_python` cell in a connection's session (variables, imports and functions
//! survive between cells): wait for the session's turn, hold its environment, take a run
//! slot, open the session on first use, put in workspace files written since, run the
//! code, save the files it wrote. Each wait gives up (leaving the session as it was) when
//! the call is cancelled or the server shuts down.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::error::AppError;
use super::executor::{code_digest, Executor};
use super::sessions::{Live, Sessions, Slot, Synced};
use crate::backend::Events;
use crate::job::{JobSpec, Outcome};

/// The text of a lost session, for the model.
pub const LOST: &str = "The session has ended: its state (variables, imports, functions) is gone. The next execute_python call starts a fresh session; re-run any setup you need.";

const SHUTTING_DOWN: &str = "the server is shutting down";

/// The answer to a call that ended before its cell started: the session is as it was.
fn not_run(why: &str) -> AppError {
    AppError::Failed(format!(
        "the cell was not run: {why}. The session is unchanged (its state is kept)."
    ))
}

/// A cell that ran: its outcome, the limit that applied, and notes for the caller.
#[derive(Debug)]
pub struct CellDone {
    pub outcome: Outcome,
    pub timeout: Duration,
    pub note: Option<String>,
}

/// What every wait of a cell gives up on: the call's cancellation and the server's shutdown.
struct Waits<'a> {
    cancel: &'a CancellationToken,
    shutdown: &'a CancellationToken,
}

impl Waits<'_> {
    /// `fut`, unless the call is cancelled first (the cell is not run; `cancelled` says
    /// what it waited for) or the server shuts down first.
    async fn wait<T>(&self, fut: impl Future<Output = T>, cancelled: &str) -> Result<T, AppError> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(not_run(cancelled)),
            _ = self.shutdown.cancelled() => Err(not_run(SHUTTING_DOWN)),
            v = fut => Ok(v),
        }
    }
}

/// One cell in session `slot`: wait for this session's turn, then for a
/// run slot (both given up, leaving the session untouched, when the call is cancelled or the
/// server shuts down), open the session if needed, copy changed workspace files in, run
/// the code.
#[allow(clippy::too_many_arguments)]
pub(super) async fn cell(
    ex: &Executor,
    slot: &Arc<Slot>,
    code: &str,
    timeout: Duration,
    note: Option<String>,
    cancel: &CancellationToken,
    events: Events,
) -> Result<CellDone, AppError> {
    let x = &ex.sessions;
    let _busy = x.busy();
    let shutdown = x.shutdown.clone();
    if shutdown.is_cancelled() {
        return Err(not_run(SHUTTING_DOWN));
    }
    if let Err(e) = ex.admit() {
        return Err(AppError::Failed(format!("the cell was not run: {e}")));
    }
    crate::backend::emit(&events, crate::job::RunEvent::Admitted);
    x.start_reaper();
    let key = slot.workspace.as_str();
    let started = Instant::now();
    let waits = Waits {
        cancel,
        shutdown: &shutdown,
    };
    // This session's turn: cells of one session run one at a time.
    let mut cell = waits
        .wait(
            slot.cell.lock(),
            "the request was cancelled while it waited for the previous cell",
        )
        .await?;
    if cell.as_ref().is_some_and(|l| !l.session.alive()) {
        cell.take();
    }
    // The session's environment (the current one for a session about to open), held for
    // the cell: an install into it waits for the cell, and the cell for the install.
    let env = match cell.as_ref() {
        Some(l) => l.env.clone(),
        None => ex.current_env().await,
    };
    let _env_lock = match &env {
        Some(env) => {
            waits
                .wait(
                    ex.lock_env(env),
                    "the request was cancelled while it waited for an install to finish",
                )
                .await?
        }
        None => None,
    };
    // A session about to open takes its share of the tenant's memory budget first, for
    // its whole life (a paused container keeps its memory); before the slot, so that no
    // slot is held while it waits for the tenant's runs to give memory back.
    let memory = match cell.is_none() {
        true => Some(
            waits
                .wait(
                    ex.hold_memory(
                        crate::tenancy::memory::Holder::Session,
                        x.limits.memory_bytes,
                    ),
                    "the request was cancelled while it waited for memory",
                )
                .await?
                .map_err(|e| AppError::Failed(format!("no session could be opened: {e}")))?,
        ),
        false => None,
    };
    // A run slot, from the scheduler one-shot runs use (the tenant's max_concurrent_runs,
    // fair turns between tenants). Taken after the session's turn and its environment,
    // so that queued cells do not hold slots while they wait.
    let _permit = waits
        .wait(
            ex.acquire_slot(),
            "the request was cancelled while it waited for a run slot",
        )
        .await?
        .map_err(|e| not_run(&e.to_string()))?;
    slot.touch();
    let mut notes: Vec<String> = note.into_iter().collect();
    if let Some(memory) = memory {
        let files = ex
            .workspaces
            .input_files_stamped(key)
            .await
            .map_err(AppError::Failed)?;
        *cell = Some(open(ex, slot, code, files, env, memory, &waits).await?);
        notes.push("a new session was started".into());
    }
    let live = cell.as_mut().expect("opened above");
    let changed = changed_files(ex, key, live).await?;
    if let Err(e) = put_files(live, changed, timeout, &shutdown, &mut notes).await {
        cell.take();
        return Err(e);
    }
    if cancel.is_cancelled() {
        return Err(not_run("the request was cancelled before the cell started"));
    }
    let result = exec(ex, live, code, timeout, events, &waits, started).await;
    super::usage::record_cell(
        &x.tenant,
        slot.principal.as_deref(),
        result.as_ref(),
        started.elapsed().as_secs_f64(),
        x.limits.memory_bytes,
    );
    slot.touch();
    let outcome = match result {
        None => {
            cell.take();
            let why = if shutdown.is_cancelled() {
                "the server is shutting down; the cell was stopped while running"
            } else {
                "the call was cancelled while running"
            };
            return Err(AppError::Failed(format!("{why}. {LOST}")));
        }
        Some(Err(e)) => {
            let ended = !live.session.alive();
            if ended {
                cell.take();
            }
            return Err(AppError::Failed(format!(
                "the code could not be run: {e}{}",
                if ended {
                    format!("\n{LOST}")
                } else {
                    String::new()
                }
            )));
        }
        Some(Ok(o)) => o,
    };
    // Files the cell wrote are saved to the workspace; the session already has them.
    for f in &outcome.files {
        let digest = Sha256::digest(&f.data).into();
        live.synced.insert(
            f.path.clone(),
            Synced {
                digest,
                stamp: None,
            },
        );
    }
    if let Some(saved) = super::workspaces::save_returned(&ex.workspaces, key, &outcome).await {
        notes.push(saved);
    }
    if outcome.timed_out || outcome.oom_killed || !live.session.alive() {
        if !outcome.timed_out && !outcome.oom_killed {
            notes.push(
                "the session's Python interpreter exited (exit(), sys.exit(), os._exit() or a crash)"
                    .into(),
            );
        }
        cell.take();
        notes.push(LOST.into());
    } else if shutdown.is_cancelled() {
        // The shutdown sweep skipped this session while the cell ran.
        cell.take();
    }
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    Ok(CellDone {
        outcome,
        timeout,
        note,
    })
}

/// Open session `slot`'s sandbox for its first cell `code` (whose imports choose the
/// warm sandbox) with the workspace's `files`, in `env`, holding `memory` and its place
/// among `max_sessions` for its life.
async fn open(
    ex: &Executor,
    slot: &Arc<Slot>,
    code: &str,
    files: Vec<(crate::job::InputFile, crate::storage::Stamp)>,
    env: Option<crate::env::Environment>,
    memory: crate::tenancy::memory::MemoryHold,
    waits: &Waits<'_>,
) -> Result<Live, AppError> {
    let x = &ex.sessions;
    // A standalone session already holds its place among max_sessions.
    let holds = slot
        .ticket
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .is_some();
    let ticket = if holds {
        None
    } else {
        match x.reserve() {
            Some(t) => Some(t),
            None => {
                return Err(AppError::Failed(format!(
                    "no session could be opened: tenant `{}` already has {} sessions open, its maximum (max_sessions). Close one (reset_session ends this connection's), wait for idle ones to expire, or use execute_code (no state).",
                    x.tenant, x.options.max_sessions
                )))
            }
        }
    };
    let mut job = JobSpec::python("", x.limits.clone());
    job.tenant = x.tenant.clone();
    job.tools = crate::codemode::tools_for(&job.tenant);
    job.egress = crate::egress::sandbox::for_tenant(&job.tenant);
    let synced = files
        .iter()
        .map(|(f, stamp)| {
            let digest = Sha256::digest(&f.contents).into();
            let stamp = Some(*stamp);
            (f.path.clone(), Synced { digest, stamp })
        })
        .collect();
    job.files = files.into_iter().map(|(f, _)| f).collect();
    job.return_files = true;
    job.keep_warm = true;
    job.first_cell = Some(code.to_string());
    job.env = env.as_ref().map(|e| e.run_env()).unwrap_or_default();
    // Dropping the future (cancelled, shutting down) removes a half-made container.
    let session = tokio::select! {
        s = ex.backend().open_session(job) => s,
        _ = waits.cancel.cancelled() => return Err(not_run("the request was cancelled while the session was being opened")),
        _ = waits.shutdown.cancelled() => return Err(not_run(SHUTTING_DOWN)),
    };
    match session {
        Ok(session) => Ok(Live {
            session,
            env,
            opened: Instant::now(),
            synced,
            _ticket: ticket,
            _memory: memory,
        }),
        Err(e) => Err(AppError::Failed(format!(
            "the session could not be opened: {e}"
        ))),
    }
}

/// Put what was kept in session `slot`'s workspace after a cell (its figures, output too
/// long for the answer) into its sandbox now, once the answer is out, so that the next cell
/// does not wait for the copy (and for holding the sandbox still and letting it go again
/// around it). Left to the next cell when no sandbox is open or it imports between cells
/// (the idle warm-up, which the copy would cut short); given up at the server's shutdown.
/// No run slot: like a write_file call's, this is the server's copy, not the user's code;
/// a cell that comes meanwhile waits for it (a few milliseconds) as for a previous cell.
pub(super) fn settle_soon(ex: &Arc<Executor>, slot: &Arc<Slot>) {
    // A session without a sandbox (one that only keeps files) has nothing to copy into:
    // and no task may hold it (a held session is in use, never the one removed).
    if slot.cell.try_lock().is_ok_and(|c| c.is_none()) {
        return;
    }
    let (ex, slot) = (ex.clone(), Arc::downgrade(slot));
    tokio::spawn(async move {
        if let Some(slot) = slot.upgrade() {
            settle(&ex, &slot).await;
        }
    });
}

async fn settle(ex: &Executor, slot: &Arc<Slot>) {
    let x = &ex.sessions;
    let _busy = x.busy();
    let shutdown = x.shutdown.clone();
    let mut cell = tokio::select! {
        c = slot.cell.lock() => c,
        _ = shutdown.cancelled() => return,
    };
    let Some(live) = cell
        .as_mut()
        .filter(|l| l.session.alive() && !l.session.busy_between_cells())
    else {
        return;
    };
    let changed = match changed_files(ex, slot.workspace.as_str(), live).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "kept files not copied into the session now (the next cell will)");
            return;
        }
    };
    let mut notes = Vec::new();
    if let Err(e) = put_files(live, changed, x.limits.timeout, &shutdown, &mut notes).await {
        tracing::info!(tenant = %x.tenant, error = %e, "a session ended while kept files were copied into it");
        cell.take();
    }
}

/// Files of workspace `key` written since session `live` received them (with write_file,
/// kept from a run), each with what it will be once put in. Only files whose stamp changed
/// are read (a 30 MiB workspace read and hashed before each cell cost a `print(1)` cell 3×).
async fn changed_files(
    ex: &Executor,
    key: &str,
    live: &mut Live,
) -> Result<Vec<(crate::job::InputFile, Synced)>, AppError> {
    let mut changed = Vec::new();
    for (path, stamp) in ex.workspaces.stamps(key).await.map_err(AppError::Failed)? {
        let known = live.synced.get(&path).copied();
        if known.is_some_and(|k| k.stamp == Some(stamp)) {
            continue;
        }
        let contents = ex.workspaces.read(key, &path).await?;
        let digest: [u8; 32] = Sha256::digest(&contents).into();
        let stamp = Some(stamp);
        if known.is_some_and(|k| k.digest == digest) {
            live.synced.insert(path, Synced { digest, stamp });
            continue;
        }
        changed.push((
            crate::job::InputFile { path, contents },
            Synced { digest, stamp },
        ));
    }
    Ok(changed)
}

/// Put `changed` ([`changed_files`]) into the session first. Not given up on cancellation
/// (that would leave the session half-synced); short. An error means the session is lost.
async fn put_files(
    live: &mut Live,
    changed: Vec<(crate::job::InputFile, Synced)>,
    timeout: Duration,
    shutdown: &CancellationToken,
    notes: &mut Vec<String>,
) -> Result<(), AppError> {
    if changed.is_empty() {
        return Ok(());
    }
    let (changed, read): (Vec<_>, Vec<_>) = changed.into_iter().unzip();
    let synced = tokio::select! {
        r = live.session.put_files(&changed, timeout) => Some(r),
        _ = shutdown.cancelled() => None,
    };
    match synced {
        None => {
            return Err(AppError::Failed(format!(
                "the cell was not run: {SHUTTING_DOWN}. {LOST}"
            )));
        }
        Some(Ok(())) => {
            for (f, synced) in changed.into_iter().zip(read) {
                live.synced.insert(f.path, synced);
            }
        }
        Some(Err(e)) => notes.push(format!(
            "workspace files could not be copied into the session: {e}"
        )),
    }
    if !live.session.alive() {
        return Err(AppError::Failed(format!(
            "the cell was not run: the session ended while workspace files were copied in. {LOST}"
        )));
    }
    Ok(())
}

/// Run the cell's code in the session, counted and logged; `None` when the call was
/// cancelled or the server shut down while it ran.
async fn exec(
    ex: &Executor,
    live: &mut Live,
    code: &str,
    timeout: Duration,
    events: Events,
    waits: &Waits<'_>,
    started: Instant,
) -> Option<Result<Outcome, crate::backend::BackendError>> {
    let x = &ex.sessions;
    let result = tokio::select! {
        r = live.session.exec(code, timeout, events) => Some(r),
        _ = waits.cancel.cancelled() => None,
        _ = waits.shutdown.cancelled() => None,
    };
    let label = match &result {
        None => "cancelled",
        Some(Err(_)) => "failed",
        Some(Ok(o)) => super::metrics::outcome_label(o),
    };
    let secs = started.elapsed().as_secs_f64();
    ex.metrics().run(&x.tenant, label, secs);
    tracing::info!(
        tenant = %x.tenant,
        code_sha256 = %code_digest(code.as_bytes()),
        outcome = label,
        "session cell ran"
    );
    result
}

/// End the REPL of session `slot` (its workspace stays): true when one was open.
pub(super) async fn reset(x: &Arc<Sessions>, slot: &Arc<Slot>) -> bool {
    let _busy = x.busy();
    let mut cell = slot.cell.lock().await;
    let had = cell.take().is_some();
    // A standalone session's place among max_sessions goes back now, not at idle expiry.
    x.release(slot);
    had
}
