//! A session's container between cells: frozen (Docker pause, the cgroup freezer), so that
//! a cell that leaves threads or processes running gets no CPU outside its run slot; they
//! go on when the next cell runs. Its memory stays held, within the session's own limit.
//! The session itself is the engine's ([`crate::backend::engine`]).

use bollard::Docker;

use crate::backend::engine::Freeze;
use crate::backend::BackendError;

/// Freeze container `id` until the next message. A pause can fail for a moment on a loaded
/// host (the freezer cgroup busy): tried three times before the session is given up.
pub(super) async fn freeze(docker: &Docker, id: &str) -> Freeze {
    let mut last = None;
    for attempt in 0..3u64 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50 * attempt)).await;
        }
        match docker.pause_container(id).await {
            Ok(()) => return Freeze::Frozen,
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        tracing::warn!(error = %e, "could not pause a session between cells: ending it");
    }
    Freeze::Failed
}

/// Thaw container `id` for the next message.
pub(super) async fn thaw(docker: &Docker, id: &str) -> Result<(), BackendError> {
    if let Err(e) = docker.unpause_container(id).await {
        // Running and not paused after all (a pause Docker reported failed that did not
        // take, say): as wanted. Anything else ends the session.
        let state = docker.inspect_container(id, None).await.ok();
        let state = state.and_then(|c| c.state).unwrap_or_default();
        if state.running == Some(true) && state.paused != Some(true) {
            tracing::debug!(error = %e, "a session's container was not paused");
        } else {
            return Err(BackendError::Runner(format!(
                "the session's sandbox could not be resumed: {e}; open a new session"
            )));
        }
    }
    Ok(())
}
