//! How pods are deleted (for the engine's guards, on every path), and the sweep (by label
//! selector) of what a server that is gone left behind.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams};
use kube::Api;

use super::spec::{ANNOTATION_OWNER, ANNOTATION_OWNER_POD, LABEL_MANAGED};
use super::{classify, is_not_found};
use crate::backend::engine::guard::Remover;
use crate::backend::labels::{hostname, owner_is_dead};
use crate::backend::BackendError;

/// Deletes pods for the engine's guards.
pub(super) struct PodRemover(pub(super) Api<Pod>);

/// Delete at once: no grace period (the runner holds nothing worth a clean stop).
fn now() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}

#[async_trait::async_trait]
impl Remover for PodRemover {
    async fn remove(&self, name: &str, _confirmed: bool) {
        if let Err(e) = delete(&self.0, name).await {
            tracing::warn!(pod = %name, error = %e, "could not delete a sandbox pod; the next sweep will");
        }
    }

    /// Delete now (a timeout: the node's CPU belongs to the next run); the guard's own
    /// deletion still follows, and finds it gone.
    async fn kill_now(&self, name: &str) {
        if let Err(e) = self.0.delete(name, &now()).await {
            tracing::debug!(pod = %name, error = %e, "delete failed (already gone?)");
        }
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
    annotations
        .get(ANNOTATION_OWNER)
        .is_some_and(|owner| owner_is_dead(owner, host))
}

/// Delete the pods of ours (label `managed=true` in the namespace) whose owner is gone.
pub(super) async fn sweep(client: &kube::Client, api: &Api<Pod>) -> Result<usize, BackendError> {
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL_MANAGED}=true")))
        .await
        .map_err(|e| classify("listing pods", e))?;
    let host = hostname();
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
