//! An install's scratch directory on the host, the CA bundle copy it mounts, and the
//! setuid sweep after an install as root.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::{create_owned_dir, io_err, ManagerError};

/// Clear the setuid and setgid bits of everything under `root` (symlinks are not
/// followed). Returns how many entries had one. Run after an install as root, so that a
/// hostile wheel (or code run during the install) cannot leave a setuid-root binary on
/// the host.
pub fn strip_setid_bits(root: &Path) -> std::io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    let mut stripped = 0;
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)?;
        if m.file_type().is_symlink() {
            continue;
        }
        let mode = m.permissions().mode();
        if mode & 0o6000 != 0 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & 0o1777))?;
            stripped += 1;
        }
        if m.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(stripped)
}

/// The per-install scratch directory under the data directory: `wheels/` (the fetch
/// phase's download, read-only to the install phase) and `tmp/` (pip's temporary files).
/// Removed when dropped.
pub(super) struct InstallDir {
    pub(super) root: PathBuf,
}

/// Scratch directories older than this are leftovers of a killed server: removed.
pub(super) const STALE_INSTALL_DIR: Duration = Duration::from_secs(24 * 3600);

impl InstallDir {
    pub(super) fn create(data_dir: &Path) -> Result<InstallDir, ManagerError> {
        let base = data_dir.join("installs");
        std::fs::create_dir_all(&base).map_err(io_err(&base))?;
        if let Ok(entries) = std::fs::read_dir(&base) {
            for e in entries.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_INSTALL_DIR);
                if old {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let base = std::fs::canonicalize(&base).map_err(io_err(&base))?;
        let dir = InstallDir {
            root: base.join(crate::job::new_job_id()),
        };
        create_owned_dir(&dir.root)?;
        create_owned_dir(&dir.wheels())?;
        create_owned_dir(&dir.tmp())?;
        create_owned_dir(&dir.tools())?;
        Ok(dir)
    }

    pub(super) fn wheels(&self) -> PathBuf {
        self.root.join("wheels")
    }

    pub(super) fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// A pip wheel for environments whose Python the image's pip cannot run.
    pub(super) fn tools(&self) -> PathBuf {
        self.root.join("tools")
    }

    /// The pip wheel the fetch phase saved in `tools/`, looked up on the host.
    pub(super) fn pip_wheel(&self) -> Option<PathBuf> {
        std::fs::read_dir(self.tools())
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("pip-") && n.ends_with(".whl"))
                    && p.symlink_metadata().is_ok_and(|m| m.is_file())
            })
    }
}

impl Drop for InstallDir {
    /// Removes the downloaded wheels (possibly hundreds of MB) on the blocking pool, not on
    /// the async thread that dropped it.
    fn drop(&mut self) {
        let root = std::mem::take(&mut self.root);
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&root) {
                tracing::warn!(dir = %root.display(), error = %e, "install scratch directory not removed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// Copy `src` to `dest` (atomically, mode 0644) unless `dest` already holds the same bytes;
/// returns `dest`'s canonical path.
pub(super) fn copy_if_changed(src: &Path, dest: &Path) -> Result<PathBuf, ManagerError> {
    let bytes = std::fs::read(src).map_err(|e| ManagerError::Io {
        path: src.to_path_buf(),
        detail: format!("the CA bundle cannot be read ({e}); set MCP_EXECUTOR_CA_BUNDLE / --ca-bundle to a readable PEM file"),
    })?;
    crate::backend::publish_file(dest, &bytes).map_err(io_err(dest))?;
    std::fs::canonicalize(dest).map_err(io_err(dest))
}
