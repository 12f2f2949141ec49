//! How containers are removed (for the engine's guards, on every path), and the start-up
//! sweep of what a dead process left.

use std::collections::HashMap;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::models::{ContainerSummary, ContainerSummaryStateEnum};
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;

use super::{classify, LABEL_MANAGED, LABEL_OWNER};
use crate::backend::engine::guard::Remover;
use crate::backend::labels::{hostname, owner_is_dead};
use crate::backend::BackendError;

/// Removes containers for the engine's guards, and forgets that the daemon paused them.
pub(super) struct DockerRemover {
    pub(super) docker: Docker,
    pub(super) paused: super::pause::DaemonPaused,
}

#[async_trait::async_trait]
impl Remover for DockerRemover {
    async fn remove(&self, id: &str, confirmed: bool) {
        self.paused.take(id);
        if !confirmed {
            // The create request may still be in the daemon: look again a little later.
            remove_unconfirmed(&self.docker, id).await;
        } else if let Err(e) = remove_now(&self.docker, id).await {
            tracing::warn!(container = %id, error = %e, "could not remove a sandbox container; the next start-up sweep will");
        }
    }

    /// Kill at once (a timeout: the CPU belongs to the next run); removal still follows.
    async fn kill_now(&self, id: &str) {
        if let Err(e) = self.docker.kill_container(id, None).await {
            tracing::debug!(container = %id, error = %e, "kill failed (already gone?)");
        }
    }
}

/// Force-remove (kills if running), retrying briefly; a container already gone is fine.
pub(super) async fn remove_now(docker: &Docker, id: &str) -> Result<(), BollardError> {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    let mut last = None;
    for attempt in 0..5u64 {
        match docker.remove_container(id, Some(opts.clone())).await {
            Ok(()) => return Ok(()),
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await;
            }
        }
    }
    Err(last.expect("loop ran"))
}

/// Remove a container whose creation was cancelled midway: it may appear a while later (a
/// `create` takes seconds on a daemon busy with a burst), so look for a minute.
async fn remove_unconfirmed(docker: &Docker, name: &str) {
    for delay_ms in [0u64, 200, 500, 1000, 2000, 4000, 8000, 15000, 30000] {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        match docker.inspect_container(name, None).await {
            Ok(_) => {
                if let Err(e) = remove_now(docker, name).await {
                    tracing::warn!(container = %name, error = %e, "could not remove a cancelled container");
                }
                return;
            }
            Err(_) => continue,
        }
    }
}

/// A container of ours that is not running and was created this long ago is garbage,
/// whoever made it: containers are never started a second time, and a live server removes
/// its own within moments of their end.
pub(super) const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Every container, running or not, that carries `label` (`key=value`).
async fn labelled(docker: &Docker, label: String) -> Result<Vec<ContainerSummary>, BackendError> {
    let filters = HashMap::from([("label".to_string(), vec![label])]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| classify("listing containers", e))
}

/// Remove containers of ours whose owning process on this host is gone (a crash, a
/// `kill -9`), and containers of any owner that ended (or never started) over
/// [`STALE_AFTER`] ago: those of a server that ran elsewhere or in a container that was
/// recreated under another host name. Their runners stop them by themselves (a backstop
/// deadline, a limit on waiting for a job). Running containers of live processes, and of
/// other hosts, are left alone.
pub(super) async fn sweep(docker: &Docker) -> Result<usize, BackendError> {
    let list = labelled(docker, format!("{LABEL_MANAGED}=true")).await?;
    let host = hostname();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let mut removed = 0;
    for c in list {
        let owner = c
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER))
            .cloned()
            .unwrap_or_default();
        let ended = matches!(
            c.state,
            Some(ContainerSummaryStateEnum::EXITED)
                | Some(ContainerSummaryStateEnum::DEAD)
                | Some(ContainerSummaryStateEnum::CREATED)
        );
        let age = c
            .created
            .map(|t| Duration::from_secs(now.saturating_sub(t).max(0) as u64));
        if !is_leftover(&owner, &host, ended, age) {
            continue;
        }
        if let Some(id) = c.id {
            if remove_now(docker, &id).await.is_ok() {
                removed += 1;
            }
        }
    }
    if removed > 0 {
        tracing::info!(removed, "swept containers left by a process that is gone");
    }
    Ok(removed)
}

/// Remove every container labelled as made by `owner` (this process, at a shutdown that
/// can wait no longer for its runs): their count.
pub(super) async fn remove_owned(docker: &Docker, owner: &str) -> Result<usize, BackendError> {
    let list = labelled(docker, format!("{LABEL_OWNER}={owner}")).await?;
    let mut removed = 0;
    for id in list.into_iter().filter_map(|c| c.id) {
        if remove_now(docker, &id).await.is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Should the sweep remove a container of ours? Yes when its owner on this host is dead,
/// or when it is not running and older than [`STALE_AFTER`], whoever owns it.
fn is_leftover(owner: &str, host: &str, ended: bool, age: Option<Duration>) -> bool {
    owner_is_dead(owner, host) || (ended && age.is_some_and(|a| a > STALE_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_takes_dead_owners_and_stale_ended_containers_only() {
        let host = hostname();
        let me = crate::backend::labels::owner_id(std::process::id()).unwrap();
        let dead = format!("{host}/{}/1", std::process::id());
        let hour = Some(STALE_AFTER + Duration::from_secs(1));
        let fresh = Some(Duration::from_secs(60));
        // (owner, ended, age) -> removed?
        let table = [
            (dead.as_str(), false, fresh, true),
            (me.as_str(), false, hour, false), // running, however old: a live session
            (me.as_str(), true, fresh, false), // just ended: its own guard removes it
            (me.as_str(), true, hour, true),
            ("elsewhere/1/1", true, hour, true), // a recreated service's leftovers
            ("elsewhere/1/1", true, fresh, false),
            ("elsewhere/1/1", false, hour, false), // another host's live run
            ("", true, None, false),
        ];
        for (owner, ended, age, want) in table {
            assert_eq!(
                is_leftover(owner, &host, ended, age),
                want,
                "{owner} {ended} {age:?}"
            );
        }
    }
}
