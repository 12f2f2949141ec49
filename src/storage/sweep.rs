//! What is removed from the storage directory without a client asking: stored code past its
//! age, and temporary files a crash left behind.

use std::path::Path;

use super::TEMP_PREFIX;

/// Remove the regular files directly in `dir` not modified for `age` (symlinks and
/// directories left alone); how many.
pub(super) fn sweep_older(dir: &Path, age: std::time::Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let Some(cutoff) = std::time::SystemTime::now().checked_sub(age) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if meta.is_file()
            && meta.modified().is_ok_and(|m| m < cutoff)
            && std::fs::remove_file(e.path()).is_ok()
        {
            removed += 1;
        }
    }
    removed
}

/// Remove temporary files a crash left behind (older than a minute: a write in progress in
/// another process sharing the directory is left alone).
pub(super) fn sweep_partial(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let stale = e
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_PREFIX))
            && e.metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(60));
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::tempdir;
    use super::super::{CodeStorage, TEMP_PREFIX};

    #[test]
    fn stale_partial_files_are_swept_at_open() {
        let d = tempdir::Dir::new();
        let dir = d.path().join("code");
        std::fs::create_dir(&dir).unwrap();
        let stale = dir.join(format!("{TEMP_PREFIX}old"));
        std::fs::write(&stale, "x").unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let fresh = dir.join(format!("{TEMP_PREFIX}new"));
        std::fs::write(&fresh, "x").unwrap();
        let _s = CodeStorage::open(&dir).unwrap();
        assert!(!stale.exists());
        assert!(
            fresh.exists(),
            "a write in progress elsewhere is left alone"
        );
    }
}
