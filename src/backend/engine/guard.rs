//! Removal of a sandbox on every path: a guard whose `Drop` removes it in the background,
//! on success, error, timeout, cancellation (the run's future dropped) and panic alike, and
//! the count of what is still held, so that shutdown can wait for it. How a sandbox is
//! removed is the driver's ([`Remover`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

/// How a driver removes one of its sandboxes.
#[async_trait::async_trait]
pub(crate) trait Remover: Send + Sync + 'static {
    /// Remove the sandbox `id`, retrying as the driver sees fit and saying in the log what
    /// it could not remove (the next sweep will). `confirmed`: its creation was answered
    /// (without that, the create may still land: look for it a while).
    async fn remove(&self, id: &str, confirmed: bool);
    /// Stop it at once (a timeout: the CPU belongs to the next run); removal still follows.
    async fn kill_now(&self, id: &str);
}

/// Where a driver's guards come from: how it removes a sandbox, and the count the engine
/// waits on at shutdown (one per backend, shared by the driver and the engine).
pub(crate) struct Guards {
    remover: Arc<dyn Remover>,
    count: Arc<Cleanup>,
}

impl Guards {
    /// Guards whose sandboxes `remover` removes, counted afresh.
    pub(crate) fn new(remover: impl Remover) -> Self {
        Guards {
            remover: Arc::new(remover),
            count: Arc::default(),
        }
    }

    /// A guard for the sandbox about to be created under `name`.
    pub(crate) fn guard(&self, name: &str) -> Guard {
        Guard::new(self.remover.clone(), name, &self.count)
    }

    /// The count of what these guards hold (the engine's, for drain and shutdown).
    pub(crate) fn count(&self) -> Arc<Cleanup> {
        self.count.clone()
    }
}

/// Counts the sandboxes this process holds and the removals still running in the
/// background.
#[derive(Default)]
pub(crate) struct Cleanup {
    pending: AtomicUsize,
    done: Notify,
    /// Sandboxes guarded and not yet removed (waiting in a pool, running, or being
    /// removed).
    live: AtomicUsize,
}

impl Cleanup {
    /// Sandboxes of this process that exist or are being made or removed.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Wait until no removal is in flight.
    pub(crate) async fn drain(&self) {
        loop {
            let notified = self.done.notified();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Wait until every guarded sandbox is removed: those still held by runs being
    /// cancelled too, not only removals already started. Gives up after `deadline` (what
    /// is left then is found by the next sweep); returns how many were left.
    pub(crate) async fn drain_all(&self, deadline: Duration) -> usize {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.done.notified();
            let left = self.live.load(Ordering::SeqCst);
            if left == 0 {
                return 0;
            }
            // Every guard wakes the waiters when it is gone (removed or disarmed).
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => return left,
            }
        }
    }

    fn gone(&self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        self.done.notify_waiters();
    }
}

/// How long the removal of a sandbox whose runner reported waits, so that it removes a
/// sandbox that has exited by itself (the runner leaves right after its report) rather
/// than kill a running one, and does not take the CPU from the answer on its way to the
/// client and from the next run. Measured with the refills' wait ([`crate::backend::pool`]):
/// see `settle` there.
pub(crate) const REMOVE_AFTER_EXIT: Duration = Duration::from_millis(150);

/// Removes its sandbox when dropped, in the background, whatever path dropped it.
///
/// The guard exists *before* the sandbox is created, holding the name asked for: a run
/// cancelled while the create is in flight still has its sandbox removed once it exists.
pub(crate) struct Guard {
    remover: Arc<dyn Remover>,
    /// The name until the create answered, the id it answered with after.
    id: String,
    /// The create answered: a "not found" on removal then really means "already gone".
    confirmed: bool,
    /// The create was refused: there is nothing to remove.
    disarmed: bool,
    /// Its runner reported and is leaving by itself (see [`Guard::exiting`]).
    exiting: bool,
    cleanup: Arc<Cleanup>,
}

impl Guard {
    /// A guard for the sandbox about to be created under `name`.
    pub(crate) fn new(remover: Arc<dyn Remover>, name: &str, cleanup: &Arc<Cleanup>) -> Self {
        cleanup.live.fetch_add(1, Ordering::SeqCst);
        Guard {
            remover,
            id: name.to_string(),
            confirmed: false,
            disarmed: false,
            exiting: false,
            cleanup: cleanup.clone(),
        }
    }

    /// The create answered, with this id.
    pub(crate) fn confirm(&mut self, id: &str) {
        self.id = id.to_string();
        self.confirmed = true;
    }

    /// The create was refused (no such image, a bad request): nothing exists, so nothing
    /// is looked for. A create that was cancelled or lost on the way stays armed: it may
    /// still land.
    pub(crate) fn disarm(&mut self) {
        self.disarmed = true;
    }

    /// Its runner has sent its report and exits by itself: the removal waits
    /// [`REMOVE_AFTER_EXIT`] first.
    pub(crate) fn exiting(&mut self) {
        self.exiting = true;
    }

    /// Its name (or id, once confirmed).
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Stop it at once (a timeout); removal still follows.
    pub(crate) async fn kill_now(&self) {
        self.remover.kill_now(&self.id).await
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let cleanup = self.cleanup.clone();
        if self.disarmed {
            cleanup.gone();
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            // No runtime left (process exit): the next sweep removes it.
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            return;
        };
        let remover = self.remover.clone();
        let id = std::mem::take(&mut self.id);
        let confirmed = self.confirmed;
        let exiting = self.exiting;
        cleanup.pending.fetch_add(1, Ordering::SeqCst);
        handle.spawn(async move {
            if exiting {
                tokio::time::sleep(REMOVE_AFTER_EXIT).await;
            }
            remover.remove(&id, confirmed).await;
            cleanup.pending.fetch_sub(1, Ordering::SeqCst);
            cleanup.gone();
        });
    }
}
