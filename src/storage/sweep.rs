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

/// [`sweep_older`] in `dir` and in each signed-in user's part (`users/<owner>/`), whose
/// directory goes too once empty; how many files.
pub(super) fn sweep_older_tree(dir: &Path, age: std::time::Duration) -> usize {
    let mut removed = sweep_older(dir, age);
    let users = dir.join(super::USERS_DIR);
    let is_dir = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    if !is_dir(&users) {
        return removed;
    }
    let Ok(entries) = std::fs::read_dir(&users) else {
        return removed;
    };
    for e in entries.flatten() {
        if is_dir(&e.path()) {
            removed += sweep_older(&e.path(), age);
            // Fails while a file is left (or one was just made): kept then.
            let _ = std::fs::remove_dir(e.path());
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
    use super::super::{CodeStorage, TEMP_PREFIX, USERS_DIR};

    /// Stored code past its age goes in the users' parts too, and a part left empty with it.
    #[tokio::test]
    async fn the_age_sweep_reaches_every_users_part() {
        let d = tempdir::Dir::new();
        let s = CodeStorage::open(d.path().join("code")).unwrap();
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        let age = |p: &std::path::Path| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(old)
                .unwrap()
        };
        let a = s.scope(Some("0a")).create(None, "a").await.unwrap();
        let b_old = s.scope(Some("0b")).create(None, "b").await.unwrap();
        let b_new = s.scope(Some("0b")).create(None, "b").await.unwrap();
        let mine = s.create(None, "static").await.unwrap();
        for p in [&a, &b_old, &mine] {
            age(p);
        }
        s.set_max_age(std::time::Duration::from_secs(3600));
        assert!(!a.exists() && !b_old.exists() && !mine.exists());
        assert!(b_new.exists());
        assert!(
            !s.dir().join(USERS_DIR).join("0a").exists(),
            "an empty part goes"
        );
        assert!(s.dir().join(USERS_DIR).join("0b").exists());
        // A part swept away is made again on the user's next file.
        s.scope(Some("0a")).create(None, "again").await.unwrap();
    }

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
