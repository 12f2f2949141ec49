//! Pod deletion on every path, and the sweep (by label selector) of what a server that is
//! gone left behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use tokio::sync::Notify;

use super::spec::{ANNOTATION_OWNER, ANNOTATION_OWNER_POD, LABEL_MANAGED};
use super::{classify, is_not_found};
use crate::backend::BackendError;

/// Counts the pods this process holds and the deletions still running in the background.
#[derive(Default)]
pub(super) struct Cleanup {
    pending: AtomicUsize,
    done: Notify,
    live: AtomicUsize,
}

impl Cleanup {
    pub(super) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Wait until no deletion is in flight.
    pub(super) async fn drain(&self) {
        loop {
            let notified = self.done.notified();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Wait until every guarded pod is deleted, for at most `deadline`; how many are left.
    pub(super) async fn drain_all(&self, deadline: Duration) -> usize {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let notified = self.done.notified();
            let left = self.live.load(Ordering::SeqCst);
            if left == 0 {
                return 0;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => return left,
            }
        }
    }
}

/// Deletes its pod when dropped, in the background, whatever path dropped it: success,
/// error, timeout, cancellation or panic. It exists before the create call: a run
/// cancelled while `create` is in flight still has its pod deleted.
pub(super) struct PodGuard {
    api: Api<Pod>,
    name: String,
    /// `create` was refused: there is nothing to delete.
    disarmed: bool,
    cleanup: Arc<Cleanup>,
}

/// Delete at once: no grace period (the runner holds nothing worth a clean stop).
fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}

impl PodGuard {
    pub(super) fn new(api: &Api<Pod>, name: &str, cleanup: &Arc<Cleanup>) -> Self {
        cleanup.live.fetch_add(1, Ordering::SeqCst);
        PodGuard {
            api: api.clone(),
            name: name.to_string(),
            disarmed: false,
            cleanup: cleanup.clone(),
        }
    }

    pub(super) fn disarm(&mut self) {
        self.disarmed = true;
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Delete now (a timeout: the node's CPU belongs to the next run); the guard's own
    /// deletion still follows, and finds it gone.
    pub(super) async fn kill_now(&self) {
        if let Err(e) = self.api.delete(&self.name, &now()).await {
            tracing::debug!(pod = %self.name, error = %e, "delete failed (already gone?)");
        }
    }
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        let cleanup = self.cleanup.clone();
        if self.disarmed {
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            cleanup.done.notify_waiters();
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            // No runtime left (process exit): the next sweep, or the owner reference.
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            return;
        };
        let api = self.api.clone();
        let name = std::mem::take(&mut self.name);
        cleanup.pending.fetch_add(1, Ordering::SeqCst);
        handle.spawn(async move {
            if let Err(e) = delete(&api, &name).await {
                tracing::warn!(pod = %name, error = %e, "could not delete a sandbox pod; the next sweep will");
            }
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            cleanup.pending.fetch_sub(1, Ordering::SeqCst);
            cleanup.done.notify_waiters();
        });
    }
}

/// Delete, retrying briefly; a pod already gone is fine. A create cancelled midway may
/// land a moment later: a 404 right away is looked at again a few times.
async fn delete(api: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    let mut last = None;
    for delay_ms in [0u64, 100, 300, 1000, 3000] {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        match api.delete(name, &now()).await {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {
                if delay_ms >= 300 {
                    return Ok(());
                }
            }
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Is the owner of a pod gone? Its annotations say who made it: a server pod in the
/// cluster (`namespace/name/uid`: gone when no pod of that name and uid exists), or a
/// process on a host (`host/pid/start-time`: gone when that host is ours and the process
/// is not there). Anything else is left alone.
async fn owner_gone(
    client: &kube::Client,
    annotations: &std::collections::BTreeMap<String, String>,
    host: &str,
) -> bool {
    if let Some(op) = annotations.get(ANNOTATION_OWNER_POD) {
        let mut parts = op.splitn(3, '/');
        if let (Some(ns), Some(name), Some(uid)) = (parts.next(), parts.next(), parts.next()) {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            return match api.get_opt(name).await {
                Ok(Some(p)) => p.metadata.uid.as_deref() != Some(uid),
                Ok(None) => true,
                Err(_) => false,
            };
        }
    }
    let Some(owner) = annotations.get(ANNOTATION_OWNER) else {
        return false;
    };
    let mut parts = owner.splitn(3, '/');
    let (Some(h), Some(pid)) = (parts.next(), parts.next()) else {
        return false;
    };
    if h != host {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    crate::backend::docker::owner_label(pid).as_deref() != Some(owner.as_str())
}

/// Delete the pods of ours (label `managed=true` in the namespace) whose owner is gone.
pub(super) async fn sweep(client: &kube::Client, api: &Api<Pod>) -> Result<usize, BackendError> {
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL_MANAGED}=true")))
        .await
        .map_err(|e| classify("listing pods", e))?;
    let me = crate::backend::docker::owner_label(std::process::id()).unwrap_or_default();
    let host = me.split('/').next().unwrap_or_default().to_string();
    let mut removed = 0;
    for p in list.items {
        let Some(name) = p.metadata.name.clone() else {
            continue;
        };
        let ann = p.metadata.annotations.clone().unwrap_or_default();
        if owner_gone(client, &ann, &host).await && delete(api, &name).await.is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, "swept pods left by a server that is gone");
    }
    Ok(removed)
}
