//! A session's container held still through the host's cgroup freezer files, where the
//! server can write them (it runs on the Docker host with the rights to) and the runtime
//! allows it (runc; not gVisor): a write of microseconds, against the 10-40 ms of the
//! daemon's pause and unpause, each cell's unpause on its request path.
//!
//! Docker is not told: it sees the container running. That is safe under runc (a removal,
//! `docker rm -f`, of a container frozen so ends it at once: measured here), not under
//! gVisor (the removal waited until the container was thawed), where the daemon's pause
//! stays. Elsewhere (a remote daemon, the server in a container without the host's cgroup
//! tree, rootless) nothing is written and the daemon's pause is used.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a freeze may take before it is undone and the daemon asked instead.
const FREEZE_WITHIN: Duration = Duration::from_millis(500);

/// A container's freezer: the file to write and its values (frozen, thawed), and the file
/// that says when it is frozen, with the line that says so.
struct Freezer {
    file: PathBuf,
    frozen: &'static str,
    thawed: &'static str,
    state: PathBuf,
    done: &'static str,
}

/// Where container `id`'s freezer lives (cgroup v1 or v2, cgroupfs or systemd driver), if
/// the server can see it.
fn of(id: &str) -> Option<Freezer> {
    let v1 = |dir: String| Freezer {
        file: format!("{dir}/freezer.state").into(),
        frozen: "FROZEN",
        thawed: "THAWED",
        state: format!("{dir}/freezer.state").into(),
        done: "FROZEN",
    };
    let v2 = |dir: String| Freezer {
        file: format!("{dir}/cgroup.freeze").into(),
        frozen: "1",
        thawed: "0",
        state: format!("{dir}/cgroup.events").into(),
        done: "frozen 1",
    };
    [
        v1(format!("/sys/fs/cgroup/freezer/docker/{id}")),
        v1(format!(
            "/sys/fs/cgroup/freezer/system.slice/docker-{id}.scope"
        )),
        v2(format!("/sys/fs/cgroup/docker/{id}")),
        v2(format!("/sys/fs/cgroup/system.slice/docker-{id}.scope")),
    ]
    .into_iter()
    .find(|f| f.file.exists())
}

impl Freezer {
    fn is_frozen(&self) -> bool {
        std::fs::read_to_string(&self.state)
            .map(|s| s.lines().any(|l| l.trim() == self.done))
            .unwrap_or(false)
    }
}

/// Freeze container `id` through its freezer file, and wait until it is frozen (cgroup v1
/// passes through FREEZING while tasks are caught). False where that cannot be done from
/// here, or it did not take within [`FREEZE_WITHIN`] (then it is thawed again).
pub(super) async fn freeze(id: &str) -> bool {
    let Some(f) = of(id) else {
        return false;
    };
    let started = Instant::now();
    loop {
        if std::fs::write(&f.file, f.frozen).is_err() {
            let _ = std::fs::write(&f.file, f.thawed);
            return false;
        }
        if f.is_frozen() {
            return true;
        }
        if started.elapsed() > FREEZE_WITHIN {
            let _ = std::fs::write(&f.file, f.thawed);
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Thaw container `id` frozen by [`freeze`]; false when its freezer file cannot be written.
pub(super) fn thaw(id: &str) -> bool {
    of(id).is_some_and(|f| std::fs::write(&f.file, f.thawed).is_ok())
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn nothing_is_frozen_where_no_freezer_file_exists() {
        assert!(!super::freeze("no-such-container-0123456789abcdef").await);
        assert!(!super::thaw("no-such-container-0123456789abcdef"));
    }
}
