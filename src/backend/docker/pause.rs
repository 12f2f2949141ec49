//! A session's container between cells: frozen (Docker pause, the cgroup freezer), so that
//! a cell that leaves threads or processes running gets no CPU outside its run slot; they
//! go on when the next cell runs. Its memory stays held, within the session's own limit.
//! The session itself is the engine's ([`crate::backend::engine`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bollard::Docker;

use crate::backend::engine::Freeze;
use crate::backend::BackendError;

/// The sessions' containers the daemon paused (their freezer file could not be used): the
/// daemon resumes them too. Shared with the remover, which forgets a container it removed
/// (a session closed while paused: otherwise its id stayed for the server's lifetime).
#[derive(Clone, Default)]
pub(super) struct DaemonPaused(Arc<Mutex<HashSet<String>>>);

impl DaemonPaused {
    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn insert(&self, id: &str) {
        self.ids().insert(id.to_string());
    }

    /// Whether `id` was paused by the daemon; it is no longer counted as such.
    pub(super) fn take(&self, id: &str) -> bool {
        self.ids().remove(id)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids().len()
    }
}

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

#[cfg(test)]
mod tests {
    use super::DaemonPaused;

    #[test]
    fn a_removed_container_is_no_longer_counted_as_paused() {
        let paused = DaemonPaused::default();
        let remover_side = paused.clone();
        paused.insert("a");
        paused.insert("b");
        // The remover forgets "a" (closed while paused): one id is left, and a thaw of "a"
        // would no longer go to the daemon.
        assert!(remover_side.take("a"));
        assert_eq!(paused.len(), 1);
        assert!(!paused.take("a"));
        assert!(paused.take("b"));
        assert_eq!(paused.len(), 0);
    }
}
