//! The CPU weight of a preloading pool container (and of any pool container under
//! gVisor), through the host's cgroup files.
//!
//! A preloading refill imports for about half a second of CPU, and on a small machine that
//! lands on the runs it is meant to serve. While it waits, its container gets the lowest
//! CPU weight, so that the server, the Docker daemon and the runs going on get the CPU
//! first; when a run takes it, the default weight is written back before the job goes in.
//! Both are one write to the container's `cpu.shares` (cgroup v1) or `cpu.weight` (v2)
//! file: microseconds, against the several milliseconds of a `docker update` on the
//! request path (tried, and dropped for that).
//!
//! Only where the server can write those files (it runs on the Docker host with the
//! rights to): elsewhere (a remote daemon, the server in a container without the host's
//! cgroup tree, rootless) nothing is lowered and nothing changes.

use std::path::PathBuf;

/// A container whose weight was lowered: the file, and the value to write back.
#[derive(Debug)]
pub(super) struct Lowered {
    file: PathBuf,
    normal: &'static str,
}

/// Where a container's weight lives (cgroup v1 or v2, cgroupfs or systemd driver), with
/// the lowest and the default values there.
fn candidates(id: &str) -> [(PathBuf, &'static str, &'static str); 5] {
    let v1 = |root: &str| -> PathBuf { format!("{root}/docker/{id}/cpu.shares").into() };
    [
        (v1("/sys/fs/cgroup/cpu"), "2", "1024"),
        (v1("/sys/fs/cgroup/cpu,cpuacct"), "2", "1024"),
        (
            format!("/sys/fs/cgroup/cpu/system.slice/docker-{id}.scope/cpu.shares").into(),
            "2",
            "1024",
        ),
        (
            format!("/sys/fs/cgroup/docker/{id}/cpu.weight").into(),
            "1",
            "100",
        ),
        (
            format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/cpu.weight").into(),
            "1",
            "100",
        ),
    ]
}

/// Give container `id` (its full id) the lowest CPU weight; `None` where that cannot be
/// done from here.
pub(super) fn lower(id: &str) -> Option<Lowered> {
    candidates(id).into_iter().find_map(|(file, low, normal)| {
        std::fs::write(&file, low)
            .ok()
            .map(|()| Lowered { file, normal })
    })
}

impl Lowered {
    /// Give the container its default weight back; false when that failed (then it must
    /// not run a job: it would get less CPU than any other run).
    pub(super) fn restore(&self) -> bool {
        match std::fs::write(&self.file, self.normal) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(file = %self.file.display(), error = %e, "could not give a pool container its CPU weight back");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_lowered_where_no_cgroup_file_exists() {
        assert!(lower("no-such-container-0123456789abcdef").is_none());
    }

    #[test]
    fn a_lowered_weight_is_written_back() {
        let dir = std::env::temp_dir().join(format!("mcpx-weight-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cpu.shares");
        std::fs::write(&file, "2").unwrap();
        let l = Lowered {
            file: file.clone(),
            normal: "1024",
        };
        assert!(l.restore());
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "1024");
        std::fs::remove_dir_all(&dir).unwrap();
        let gone = Lowered {
            file: dir.join("cpu.shares"),
            normal: "1024",
        };
        assert!(!gone.restore());
    }
}
