//! The caps on the bytes stored: a tenant's (its code storage and workspaces) and the
//! server's (every tenant's together).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::StorageError;

/// A cap on the bytes under some directories together (a tenant's code storage and
/// workspaces; or, server-wide, those of every tenant), checked before each write, with
/// the cap it sits within. Two writes racing may pass it by one write.
///
/// What the directories hold is walked at most once per [`USAGE_FRESH`], and off the
/// request path: between walks each granted write adds its bytes (less those of the file
/// it replaces) to the last walk's figure, so a burst of writes is held to the cap; a
/// check that finds the figure older than that answers from it and starts a walk in the
/// background for the next one. The walk grows with every file stored (the server-wide
/// quota walks every tenant's: 1,700 stored files took some 9 ms, on every call of a
/// client that called every 2 s, before it left the request path). A check waits for a
/// walk only when there is no figure at all: the first, and after
/// [`StorageQuota::forget`] (files were removed, the figure would refuse writes that fit).
#[derive(Debug)]
pub struct StorageQuota {
    limit: u64,
    roots: Vec<PathBuf>,
    server: bool,
    within: Option<Arc<StorageQuota>>,
    /// Bytes used as of the last walk plus the writes granted since, and when it walked.
    usage: Mutex<Option<(std::time::Instant, u64)>>,
    /// A background walk is under way (at most one).
    walking: std::sync::atomic::AtomicBool,
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
            walking: Default::default(),
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

    /// Bytes used: the last walk's figure with the writes since; a new walk when there is
    /// none (waited for) or it is stale (in the background, for the next check).
    async fn current(self: &Arc<Self>) -> u64 {
        let last = *self.lock_usage();
        match last {
            Some((at, used)) if at.elapsed() < USAGE_FRESH => used,
            Some((_, used)) => {
                self.walk_in_background(used);
                used
            }
            None => {
                let me = self.clone();
                let used = tokio::task::spawn_blocking(move || me.used())
                    .await
                    .unwrap_or(0);
                *self.lock_usage() = Some((std::time::Instant::now(), used));
                used
            }
        }
    }

    /// Walk on a blocking thread, unless a walk is under way; the writes granted while it
    /// walks (`before` was the figure when it started) are added to what it found, so a
    /// write it missed is not forgotten (one it saw is counted twice until the next walk).
    fn walk_in_background(self: &Arc<Self>, before: u64) {
        use std::sync::atomic::Ordering;
        if self.walking.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let walked = me.used();
            {
                let mut usage = me.lock_usage();
                // Forgotten meanwhile: the next check walks afresh.
                if let Some((_, now)) = *usage {
                    let granted = now.saturating_sub(before);
                    *usage = Some((std::time::Instant::now(), walked + granted));
                }
            }
            me.walking.store(false, Ordering::Release);
        });
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

    /// A stale figure answers the check at once (no walk on the request path) and a walk
    /// in the background replaces it, keeping the write granted while it walked.
    #[tokio::test]
    async fn a_stale_figure_answers_at_once_and_is_walked_again_in_the_background() {
        let dir = crate::scratch::scratch_root()
            .join(format!("quota-stale-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), vec![0u8; 600]).unwrap();
        let q = Arc::new(StorageQuota::new(1000, vec![dir.clone()]));
        let long_ago = std::time::Instant::now() - USAGE_FRESH * 2;
        *q.lock_usage() = Some((long_ago, 100));
        // Answered from the stale 100 (a walk would have found 600: 600 + 800 > 1000).
        q.check(800, 0).await.expect("the stale figure answers");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let (at, used) = q.lock_usage().expect("a figure");
            if at > long_ago && !q.walking.load(std::sync::atomic::Ordering::Acquire) {
                assert_eq!(used, 600 + 800, "the walk's 600 and the write granted");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no background walk");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(q.check(1, 0).await.is_err(), "fresh again, and full");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
