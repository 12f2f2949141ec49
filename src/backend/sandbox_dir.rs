//! A directory of the server's host given to one sandbox alone (Docker under runc), mounted
//! read-only inside at [`SANDBOX_DIR`](super::protocol::SANDBOX_DIR): where the server puts
//! the sandbox's egress socket during a run with egress ([`super::egress_socket`]). Made
//! with the sandbox (pool sandboxes have one too), removed with it, and what a process that
//! is gone left is removed by the sweep ([`sweep`]).

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The sandboxes' directories under the data directory.
pub(crate) const ROOT: &str = "sandboxes";

/// A directory older than this whose sandbox does not exist is a leftover (a younger one
/// may be of a sandbox still being created: its directory comes first).
pub(crate) const LEFTOVER_AFTER: Duration = Duration::from_secs(600);

/// One sandbox's directory: removed, with what is in it, when dropped.
#[derive(Debug)]
pub(crate) struct SandboxDir {
    path: PathBuf,
}

impl SandboxDir {
    /// `root/name` (`name`: the sandbox's), made afresh: any leftover of that name is
    /// removed first. Readable and searchable by every uid (the sandbox's user differs
    /// from the server's), writable by the server's alone: the code cannot remove or
    /// replace the socket in it.
    pub(crate) fn create(root: &Path, name: &str) -> std::io::Result<SandboxDir> {
        std::fs::create_dir_all(root)?;
        let path = root.join(name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(SandboxDir { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SandboxDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.path.display(), error = %e, "could not remove a sandbox's directory; the next sweep will");
            }
        }
    }
}

/// Remove the directories under `root` of sandboxes that do not exist (`live`: the names
/// of those that do) and that are older than `older_than`; their count.
pub(crate) fn sweep(root: &Path, live: &HashSet<String>, older_than: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if live.contains(&name) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= older_than);
        if old && std::fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        tracing::info!(removed, "swept the directories of sandboxes that are gone");
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_the_sandboxs_own_and_gone_with_it() {
        let root = crate::scratch::tempdir().join(ROOT);
        let d = SandboxDir::create(&root, "mcpx-a").unwrap();
        let mode = std::fs::metadata(d.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        std::fs::write(d.path().join("egress.sock"), b"").unwrap();
        let path = d.path().to_path_buf();
        drop(d);
        assert!(!path.exists());
    }

    #[test]
    fn the_sweep_removes_old_directories_of_sandboxes_that_are_gone() {
        let root = crate::scratch::tempdir().join(ROOT);
        let gone = SandboxDir::create(&root, "mcpx-gone").unwrap();
        let live = SandboxDir::create(&root, "mcpx-live").unwrap();
        let names = HashSet::from(["mcpx-live".to_string()]);
        // Young: it may be a sandbox still being created.
        assert_eq!(sweep(&root, &names, Duration::from_secs(600)), 0);
        assert_eq!(sweep(&root, &names, Duration::ZERO), 1);
        assert!(!gone.path().exists() && live.path().exists());
    }
}
