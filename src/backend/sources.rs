//! What every backend checks of an environment's [`Source`](crate::job::Source)s before it
//! maps them to its own mounts.

use std::path::Path;

use super::BackendError;

/// A volume source (`what`: the backend's word for it, "volume" or "claim") needs a name
/// and an absolute target.
pub(crate) fn check_volume(what: &str, name: &str, target: &Path) -> Result<(), BackendError> {
    if name.is_empty() || !target.is_absolute() {
        return Err(BackendError::Rejected(format!(
            "{what} `{name}` at `{}`: a volume needs a name and an absolute target",
            target.display()
        )));
    }
    Ok(())
}

/// Put `bytes` at `dest` for sandboxes to mount read-only (the installers' CA bundle, the
/// sandboxes' `/etc/hosts`): left alone when it already holds them, else written beside it,
/// made mode 0644 (the sandbox user reads it whatever the server's umask) and renamed in
/// place, so a sandbox never mounts half a file. Creates `dest`'s directory.
pub(crate) fn publish_file(dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if std::fs::read(dest).is_ok_and(|b| b == bytes) {
        return Ok(());
    }
    let dir = dest.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".publish-{}.tmp", crate::job::new_job_id()));
    let written = std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)))
        .and_then(|()| std::fs::rename(&tmp, dest));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
