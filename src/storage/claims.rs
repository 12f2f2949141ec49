//! A process's claim on a directory of session workspaces, and the sweep of what a dead
//! process left there.

use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// A claim of this process on a directory of session workspaces (`<tenant>.sessions`):
/// an exclusive `flock` on `<dir>.owner-<pid>` held while the value lives. Processes
/// sharing the directory each hold their own.
#[derive(Debug)]
pub struct WorkspaceClaim {
    _file: std::fs::File,
    path: PathBuf,
}

impl Drop for WorkspaceClaim {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Claim the session workspaces directory `dir` for this process, and sweep what a
/// process that died (`kill -9`, a crash) left there: every workspace in it when no other
/// live process holds a claim (a claim file nobody holds locked is a dead process's, and
/// goes too). Returns the claim (hold it while sessions may be opened) and how many
/// workspaces were removed.
pub fn claim_session_workspaces(dir: &Path) -> (Option<WorkspaceClaim>, usize) {
    use std::os::unix::io::AsRawFd as _;
    let Some(parent) = dir.parent() else {
        return (None, 0);
    };
    let Some(name) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return (None, 0);
    };
    if std::fs::create_dir_all(parent).is_err() {
        return (None, 0);
    }
    let prefix = format!("{name}.owner-");
    let mine = parent.join(format!("{prefix}{}", std::process::id()));
    let lock = |f: &std::fs::File| {
        // SAFETY: flock on a descriptor this function owns.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    };
    let claim = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&mine)
        .ok()
        .filter(lock)
        .map(|f| WorkspaceClaim {
            _file: f,
            path: mine.clone(),
        });
    let mut others_alive = false;
    if let Ok(entries) = std::fs::read_dir(parent) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if !n.starts_with(&prefix) || e.path() == mine {
                continue;
            }
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(e.path())
            {
                Ok(f) if lock(&f) => {
                    let _ = std::fs::remove_file(e.path());
                }
                Ok(_) => others_alive = true,
                Err(_) => {}
            }
        }
    }
    let mut removed = 0;
    if !others_alive && claim.is_some() {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let is_dir = std::fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir());
                let gone = if is_dir {
                    std::fs::remove_dir_all(e.path())
                } else {
                    std::fs::remove_file(e.path())
                };
                if gone.is_ok() {
                    removed += 1;
                }
            }
        }
    }
    (claim, removed)
}
