//! The caps on the bytes stored: a tenant's (its code storage and workspaces) and the
//! server's (every tenant's together).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::StorageError;

/// A cap on the bytes under some directories together (a tenant's code storage and
/// workspaces; or, server-wide, those of every tenant), checked before each write, with
/// the cap it sits within. Two writes racing may pass it by one write.
///
/// What the directories hold is walked at most once per [`USAGE_FRESH`] (or after
/// [`StorageQuota::forget`]), not on every write: between walks each granted write adds its
/// bytes (less those of the file it replaces) to the last walk's figure, so a burst of
/// writes is held to the cap while the walk, which grows with every file stored (the
/// server-wide quota walks every tenant's), stays off most requests.
#[derive(Debug)]
pub struct StorageQuota {
    limit: u64,
    roots: Vec<PathBuf>,
    server: bool,
    within: Option<Arc<StorageQuota>>,
    /// Bytes used as of the last walk plus the writes granted since, and when it walked.
    usage: Mutex<Option<(std::time::Instant, u64)>>,
}

/// How long a walk of a quota's directories stands in for them.
pub const USAGE_FRESH: std::time::Duration = std::time::Duration::from_secs(2);

impl StorageQuota {
    /// A tenant's quota.
    pub fn new(limit: u64, roots: Vec<PathBuf>) -> Self {
        StorageQuota {
            limit,
            roots,
            server: false,
            within: None,
            usage: Mutex::default(),
        }
    }

    /// The server-wide quota over every tenant's storage (`--storage-limit-total`).
    pub fn server_wide(limit: u64, roots: Vec<PathBuf>) -> Self {
        StorageQuota {
            server: true,
            ..StorageQuota::new(limit, roots)
        }
    }

    /// This quota, checked within `outer` too (a tenant's within the server's).
    pub fn within(self, outer: Option<Arc<StorageQuota>>) -> Self {
        StorageQuota {
            within: outer,
            ..self
        }
    }

    /// Bytes of the regular files under the roots (symlinks not followed).
    pub fn used(&self) -> u64 {
        fn walk(dir: &Path, depth: usize) -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            let mut sum = 0;
            for e in entries.flatten() {
                let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
                    continue;
                };
                if meta.is_file() {
                    sum += meta.len();
                } else if meta.is_dir() && depth < 4 {
                    sum += walk(&e.path(), depth + 1);
                }
            }
            sum
        }
        self.roots.iter().map(|r| walk(r, 0)).sum()
    }

    /// Would `adding` bytes more (replacing a file of `replacing` bytes) fit, in this quota
    /// and every one it sits within? When they do, the write is counted in each.
    pub async fn check(self: &Arc<Self>, adding: u64, replacing: u64) -> Result<(), StorageError> {
        let mut chain = vec![self.clone()];
        while let Some(outer) = chain.last().and_then(|q| q.within.clone()) {
            chain.push(outer);
        }
        for quota in &chain {
            let used = quota.current().await;
            if used.saturating_sub(replacing) + adding > quota.limit {
                return Err(StorageError::Quota {
                    used,
                    adding,
                    limit: quota.limit,
                    server: quota.server,
                });
            }
        }
        for quota in &chain {
            if let Some((_, used)) = quota.lock_usage().as_mut() {
                *used = used.saturating_sub(replacing) + adding;
            }
        }
        Ok(())
    }

    /// Walk again at the next check (files were removed: a workspace, stored code).
    pub fn forget(&self) {
        *self.lock_usage() = None;
        if let Some(outer) = &self.within {
            outer.forget();
        }
    }

    fn lock_usage(&self) -> std::sync::MutexGuard<'_, Option<(std::time::Instant, u64)>> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes used: the last walk's figure with the writes since, or a new walk.
    async fn current(self: &Arc<Self>) -> u64 {
        if let Some((at, used)) = *self.lock_usage() {
            if at.elapsed() < USAGE_FRESH {
                return used;
            }
        }
        let me = self.clone();
        let used = tokio::task::spawn_blocking(move || me.used())
            .await
            .unwrap_or(0);
        *self.lock_usage() = Some((std::time::Instant::now(), used));
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quota walks once, then counts granted writes (a burst stays within the cap
    /// without a walk each), and walks again after `forget`.
    #[tokio::test]
    async fn the_quota_counts_writes_between_walks_and_walks_again_when_told() {
        let dir =
            std::env::temp_dir().join(format!("mcpx-quota-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), vec![0u8; 600]).unwrap();
        let q = Arc::new(StorageQuota::new(1000, vec![dir.clone()]));
        q.check(300, 0).await.expect("600 + 300 fit");
        // Not written yet, but granted: the next 300 would pass 1000.
        assert!(matches!(
            q.check(300, 0).await,
            Err(StorageError::Quota { used: 900, .. })
        ));
        // Replacing the 600-byte file by an empty one gives its bytes back at once.
        q.check(0, 600).await.expect("shrinking always fits");
        q.check(300, 0).await.expect("room again");
        // A file removed behind the quota's back is seen after `forget`.
        std::fs::write(dir.join("b"), vec![0u8; 900]).unwrap();
        q.forget();
        assert!(q.check(200, 0).await.is_err(), "600 + 900 on disk");
        std::fs::remove_file(dir.join("b")).unwrap();
        q.forget();
        q.check(200, 0).await.expect("600 on disk");
        let outer = Arc::new(StorageQuota::server_wide(700, vec![dir.clone()]));
        let inner =
            Arc::new(StorageQuota::new(10_000, vec![dir.clone()]).within(Some(outer.clone())));
        assert!(inner.check(200, 0).await.is_err(), "the outer cap holds");
        // A refusal by the outer cap counts nothing in the inner one.
        assert_eq!(inner.lock_usage().map(|u| u.1), Some(600));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
