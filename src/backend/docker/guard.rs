//! Container removal on every path, and the start-up sweep of what a dead process left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;
use tokio::sync::Notify;

use super::{classify, LABEL_MANAGED, LABEL_OWNER};
use crate::backend::BackendError;

/// Counts the removals still running in the background, so that shutdown can wait for them.
#[derive(Default)]
pub(super) struct Cleanup {
    pending: AtomicUsize,
    done: Notify,
    /// Containers guarded and not yet removed (waiting in the pool, running, or being
    /// removed).
    live: AtomicUsize,
}

impl Cleanup {
    /// Containers of this process that exist or are being made or removed.
    pub(super) fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Wait until no removal is in flight.
    pub(super) async fn drain(&self) {
        loop {
            let notified = self.done.notified();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Wait until every guarded container is removed: those still held by runs being
    /// cancelled too, not only removals already started. Gives up after `deadline` (what
    /// is left then is found by the next start-up sweep); returns how many were left.
    pub(super) async fn drain_all(&self, deadline: Duration) -> usize {
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
}

/// Removes its container when dropped, in the background, whatever path dropped it:
/// success, error, timeout, cancellation (the run's future dropped) or panic.
///
/// The guard exists *before* the container is created, holding the name asked for: a run
/// cancelled while `create` is in flight still has its container removed once the daemon
/// has made it.
pub(super) struct ContainerGuard {
    docker: Docker,
    /// The name until `create` answered, the id after.
    id: String,
    /// `create` answered: a 404 on removal then really means "already gone".
    confirmed: bool,
    /// `create` was refused by the daemon: there is nothing to remove.
    disarmed: bool,
    cleanup: Arc<Cleanup>,
}

impl ContainerGuard {
    /// A guard for the container about to be created under `name`.
    pub(super) fn new(docker: &Docker, name: &str, cleanup: &Arc<Cleanup>) -> Self {
        cleanup.live.fetch_add(1, Ordering::SeqCst);
        ContainerGuard {
            docker: docker.clone(),
            id: name.to_string(),
            confirmed: false,
            disarmed: false,
            cleanup: cleanup.clone(),
        }
    }

    /// The daemon created it, with this id.
    pub(super) fn confirm(&mut self, id: &str) {
        self.id = id.to_string();
        self.confirmed = true;
    }

    /// The daemon refused to create it (no such image, a bad request): nothing exists,
    /// so nothing is looked for. A create that was cancelled or lost on the way stays
    /// armed: the daemon may still make it.
    pub(super) fn disarm(&mut self) {
        self.disarmed = true;
    }

    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// Kill at once (a timeout: the CPU belongs to the next run); removal still follows.
    pub(super) async fn kill_now(&self) {
        if let Err(e) = self.docker.kill_container(&self.id, None).await {
            tracing::debug!(container = %self.id, error = %e, "kill failed (already gone?)");
        }
    }
}

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let docker = self.docker.clone();
        let id = std::mem::take(&mut self.id);
        let confirmed = self.confirmed;
        let cleanup = self.cleanup.clone();
        if self.disarmed {
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            cleanup.done.notify_waiters();
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            // No runtime left (process exit): the next start-up sweep removes it.
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            return;
        };
        cleanup.pending.fetch_add(1, Ordering::SeqCst);
        handle.spawn(async move {
            if !confirmed {
                // The create request may still be in the daemon: look again a little later.
                remove_unconfirmed(&docker, &id).await;
            } else if let Err(e) = remove_now(&docker, &id).await {
                tracing::warn!(container = %id, error = %e, "could not remove a sandbox container; the next start-up sweep will");
            }
            cleanup.live.fetch_sub(1, Ordering::SeqCst);
            cleanup.pending.fetch_sub(1, Ordering::SeqCst);
            cleanup.done.notify_waiters();
        });
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

/// Remove containers of ours whose owning process on this host is gone (a crash, a
/// `kill -9`), and containers of any owner that ended (or never started) over
/// [`STALE_AFTER`] ago: those of a server that ran elsewhere or in a container that was
/// recreated under another host name. Their runners stop them by themselves (a backstop
/// deadline, a limit on waiting for a job). Running containers of live processes, and of
/// other hosts, are left alone.
pub(super) async fn sweep(docker: &Docker) -> Result<usize, BackendError> {
    let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| classify("listing containers", e))?;
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
    let filters = HashMap::from([("label".to_string(), vec![format!("{LABEL_OWNER}={owner}")])]);
    let list = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::default()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .map_err(|e| classify("listing containers", e))?;
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `host/pid/start-time` of a process: the start time tells a reused pid apart.
pub(super) fn owner_id(pid: u32) -> Option<String> {
    Some(format!(
        "{}/{}/{}",
        hostname(),
        pid,
        process_start_time(pid)?
    ))
}

fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the parenthesised command name (which may hold spaces).
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

fn owner_is_dead(owner: &str, host: &str) -> bool {
    let mut parts = owner.splitn(3, '/');
    let (Some(h), Some(pid), Some(start)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    if h != host {
        return false;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    process_start_time(pid).map(|s| s.to_string()) != Some(start.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_of_this_process_is_alive_and_a_made_up_one_is_dead() {
        let host = hostname();
        let me = owner_id(std::process::id()).unwrap();
        assert!(!owner_is_dead(&me, &host));
        let pid = std::process::id();
        assert!(owner_is_dead(&format!("{host}/{pid}/1"), &host));
        assert!(!owner_is_dead(&format!("elsewhere/{pid}/1"), &host));
        assert!(!owner_is_dead("garbage", &host));
    }

    #[test]
    fn the_sweep_takes_dead_owners_and_stale_ended_containers_only() {
        let host = hostname();
        let me = owner_id(std::process::id()).unwrap();
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
