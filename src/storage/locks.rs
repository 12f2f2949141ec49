//! One reader-writer lock per stored file: appends and replacements of one file run one at a
//! time and a read never sees half of either. A lock lives only while someone holds or waits
//! for it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The locks of the files someone holds or waits for, by path.
#[derive(Default)]
pub(super) struct FileLocks(Mutex<HashMap<PathBuf, Arc<tokio::sync::RwLock<()>>>>);

impl FileLocks {
    /// The lock of one file, shared by everyone who holds or waits for it; the entry is
    /// dropped from the map when the last of them lets go.
    pub(super) fn lock_for(&self, path: &Path) -> FileLock<'_> {
        let mut locks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let lock = locks.entry(path.to_path_buf()).or_default().clone();
        FileLock {
            locks: self,
            path: path.to_path_buf(),
            lock: Some(lock),
        }
    }

    /// Per-file locks currently in the map (held or waited for).
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A handle on one file's lock; see [`FileLocks::lock_for`]. Clones of the `Arc` are only
/// made under the map's mutex, so a count of one, seen under it, means nobody else holds or
/// waits for this lock.
pub(super) struct FileLock<'a> {
    locks: &'a FileLocks,
    path: PathBuf,
    lock: Option<Arc<tokio::sync::RwLock<()>>>,
}

impl FileLock<'_> {
    pub(super) async fn read(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.lock.as_ref().expect("set until drop").read().await
    }

    pub(super) async fn write(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.lock.as_ref().expect("set until drop").write().await
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        drop(self.lock.take());
        let mut locks = self.locks.0.lock().unwrap_or_else(|e| e.into_inner());
        if locks
            .get(&self.path)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.path);
        }
    }
}
