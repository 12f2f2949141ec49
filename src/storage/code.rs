//! The storage directory and its files: create, append, replace, read and list, each file
//! under its own reader-writer lock. Stored code is created, appended to and read through
//! one principal's part of it (`CodeStorage::scope`, in `scope.rs`, which builds on this file).

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::error::io_err;
use super::locks::{FileLock, FileLocks};
use super::sweep::{sweep_older_tree, sweep_partial};
use super::{defaults, paths, printable, StorageError, StorageQuota, TEMP_PREFIX};

/// The storage directory and the locks that serialise appends.
pub struct CodeStorage {
    /// The directory as configured (clients may send paths under this spelling).
    root: PathBuf,
    /// The same directory with symlinks resolved (the one we actually use).
    canonical: PathBuf,
    max_file_bytes: u64,
    locks: FileLocks,
    /// The tenant's storage quota, shared with its workspaces.
    quota: std::sync::OnceLock<Arc<StorageQuota>>,
    /// Stored files not modified for this long are removed (at start-up, then at most
    /// every [`AGE_SWEEP_EVERY`] on a write).
    max_age: std::sync::OnceLock<std::time::Duration>,
    last_age_sweep: Mutex<Option<std::time::Instant>>,
    /// Whether a write reaches the disk (`fsync`) before it returns: not for a session's
    /// own workspace, which goes with the session and does not outlive a restart.
    durable: bool,
}

/// How often writes look for stored code past its age.
pub const AGE_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

impl CodeStorage {
    /// Create the directory if needed (mode 700) and remember its canonical form.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let root: PathBuf = root.into();
        let err = |source| StorageError::Root {
            root: root.display().to_string(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(err)?;
        let canonical = root.canonicalize().map_err(err)?;
        sweep_partial(&canonical);
        Ok(CodeStorage {
            root,
            canonical,
            max_file_bytes: defaults::MAX_FILE_BYTES,
            locks: FileLocks::default(),
            quota: std::sync::OnceLock::new(),
            max_age: std::sync::OnceLock::new(),
            last_age_sweep: Mutex::default(),
            durable: true,
        })
    }

    /// Writes return without waiting for the disk (a session's own workspace: removed with
    /// the session, gone after a restart anyway). A kept figure paid 0.7 ms p50, 2.6 ms p95
    /// for its `fsync` here, on the call's path.
    pub fn not_durable(mut self) -> Self {
        self.durable = false;
        self
    }

    /// Remove stored files not modified for `age` from now on: those already that old at
    /// once, later ones on writes (set once; later calls are ignored).
    pub fn set_max_age(&self, age: std::time::Duration) {
        if self.max_age.set(age).is_ok() {
            let n = sweep_older_tree(&self.canonical, age);
            if n > 0 {
                tracing::info!(removed = n, dir = %self.canonical.display(), "stored code past its age removed");
            }
            *self
                .last_age_sweep
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(std::time::Instant::now());
        }
    }

    /// On a write: sweep by age when the last sweep is [`AGE_SWEEP_EVERY`] old.
    pub(super) async fn age_sweep_due(&self) {
        let Some(age) = self.max_age.get().copied() else {
            return;
        };
        {
            let mut last = self
                .last_age_sweep
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| t.elapsed() < AGE_SWEEP_EVERY) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let dir = self.canonical.clone();
        let removed = tokio::task::spawn_blocking(move || sweep_older_tree(&dir, age))
            .await
            .unwrap_or(0);
        if let (true, Some(q)) = (removed > 0, self.quota.get()) {
            q.forget();
        }
    }

    /// Count every write against `quota` from now on (set once; later calls are ignored).
    pub fn set_quota(&self, quota: Arc<StorageQuota>) {
        let _ = self.quota.set(quota);
    }

    pub(super) async fn check_quota(
        &self,
        adding: u64,
        replacing: u64,
    ) -> Result<(), StorageError> {
        match self.quota.get() {
            Some(q) => q.check(adding, replacing).await,
            None => Ok(()),
        }
    }

    /// The storage directory (canonical form).
    pub fn dir(&self) -> &Path {
        &self.canonical
    }

    /// The storage directory as configured.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// The most bytes one file may hold.
    pub(super) fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes
    }

    /// Map a client's `file_path` to a path directly inside the storage directory, or refuse.
    /// Pure: looks only at the string (symlinks are refused when the file is opened).
    pub fn resolve(&self, file_path: &str) -> Result<PathBuf, StorageError> {
        paths::resolve(&self.canonical, &self.root, file_path)
    }

    /// The same checks with another per-file cap (the workspace's).
    pub fn with_max_file_bytes(mut self, max: u64) -> Self {
        self.max_file_bytes = max;
        self
    }

    /// Create or replace a file directly inside the directory with `data` (same refusals as
    /// [`CodeStorage::resolve`]; a planted symlink is refused, not followed). The data goes to
    /// a temporary file in the same directory, renamed over the target under the file's
    /// lock: readers see the old content or the new, never a part, and a failure (the
    /// quota, a full disk) leaves the old content in place.
    pub async fn write_bytes(
        &self,
        file_path: &str,
        data: &[u8],
    ) -> Result<(PathBuf, u64), StorageError> {
        if data.len() as u64 > self.max_file_bytes {
            return Err(StorageError::TooLarge {
                what: "the file",
                size: data.len() as u64,
                max: self.max_file_bytes,
            });
        }
        let path = self.resolve(file_path)?;
        let lock = self.lock_for(&path);
        let _guard = lock.write().await;
        let replacing = match tokio::fs::symlink_metadata(&path).await {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(StorageError::Symlink {
                    path: file_path.to_string(),
                })
            }
            Ok(m) if !m.is_file() => {
                return Err(StorageError::NotRegular {
                    path: file_path.to_string(),
                })
            }
            Ok(m) => m.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err(&path, e)),
        };
        self.check_quota(data.len() as u64, replacing).await?;
        let temp = self
            .canonical
            .join(format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        let written = async {
            let mut file = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&temp)
                .await?;
            file.write_all(data).await?;
            file.flush().await?;
            if self.durable {
                file.sync_data().await?;
            }
            drop(file);
            tokio::fs::rename(&temp, &path).await
        }
        .await;
        if let Err(e) = written {
            let _ = tokio::fs::remove_file(&temp).await;
            return Err(io_err(&path, e));
        }
        Ok((path, data.len() as u64))
    }

    /// Read a file directly inside the directory as bytes (never half of an append or of a
    /// replacement: under the file's lock, shared with other readers).
    pub async fn read_bytes(&self, file_path: &str) -> Result<(PathBuf, Vec<u8>), StorageError> {
        let path = self.resolve(file_path)?;
        let buf = self.read_path(file_path, &path).await?;
        Ok((path, buf))
    }

    /// Read `path` (resolved from the client's `shown`) under its lock, within the cap.
    pub(super) async fn read_path(
        &self,
        shown: &str,
        path: &Path,
    ) -> Result<Vec<u8>, StorageError> {
        let lock = self.lock_for(path);
        let _guard = lock.read().await;
        let mut file = open_checked(shown, path, tokio::fs::OpenOptions::new().read(true)).await?;
        let mut buf = Vec::new();
        (&mut file)
            .take(self.max_file_bytes + 1)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| io_err(path, e))?;
        if buf.len() as u64 > self.max_file_bytes {
            return Err(StorageError::TooLarge {
                what: "the file",
                size: buf.len() as u64,
                max: self.max_file_bytes,
            });
        }
        Ok(buf)
    }

    /// The regular files directly inside the directory (symlinks and others skipped), by
    /// name, with their sizes.
    pub async fn list(&self) -> Result<Vec<(String, u64)>, StorageError> {
        let stamped = self.stamps().await?;
        Ok(stamped.into_iter().map(|(n, s)| (n, s.len)).collect())
    }

    /// [`CodeStorage::list`] with each file's [`Stamp`].
    pub async fn stamps(&self) -> Result<Vec<(String, Stamp)>, StorageError> {
        let mut out = Vec::new();
        let mut dir = tokio::fs::read_dir(&self.canonical)
            .await
            .map_err(|e| io_err(&self.canonical, e))?;
        while let Some(entry) = dir
            .next_entry()
            .await
            .map_err(|e| io_err(&self.canonical, e))?
        {
            let Ok(meta) = tokio::fs::symlink_metadata(entry.path()).await else {
                continue;
            };
            if let (true, Some(name)) = (meta.is_file(), entry.file_name().to_str()) {
                // A name no client could have written (a control character) is not shown.
                if !name.starts_with(TEMP_PREFIX) && name.chars().all(printable) {
                    out.push((name.to_string(), Stamp::of(&meta)));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The stamp of file `name` (`None`: not there, or not a regular file).
    pub async fn stamp(&self, name: &str) -> Result<Option<Stamp>, StorageError> {
        let path = self.resolve(name)?;
        Ok(tokio::fs::symlink_metadata(&path)
            .await
            .ok()
            .filter(|m| m.is_file())
            .map(|m| Stamp::of(&m)))
    }

    /// Remove file `name` if it is still the version `stamp` names (nobody wrote it since),
    /// under its lock; whether it was removed.
    pub async fn remove_unchanged(&self, name: &str, stamp: Stamp) -> Result<bool, StorageError> {
        let path = self.resolve(name)?;
        let lock = self.lock_for(&path);
        let _guard = lock.write().await;
        let same = tokio::fs::symlink_metadata(&path)
            .await
            .is_ok_and(|m| m.is_file() && Stamp::of(&m) == stamp);
        if !same {
            return Ok(false);
        }
        tokio::fs::remove_file(&path)
            .await
            .map_err(|e| io_err(&path, e))?;
        if let Some(q) = self.quota.get() {
            q.forget();
        }
        Ok(true)
    }

    /// The lock of one file; see [`FileLocks::lock_for`].
    pub(super) fn lock_for(&self, path: &Path) -> FileLock<'_> {
        self.locks.lock_for(path)
    }

    /// Per-file locks currently in the map (held or waited for).
    #[cfg(test)]
    fn lock_entries(&self) -> usize {
        self.locks.len()
    }
}

/// A version of a file as the file system tells it: its size, modification and change
/// times and inode. A replacement (written aside, then renamed) has a new inode, an append
/// a new size and times: equal stamps mean the file was not written in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    pub len: u64,
    times: [i64; 4],
    ino: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt as _;
        Stamp {
            len: meta.len(),
            times: [
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ctime(),
                meta.ctime_nsec(),
            ],
            ino: meta.ino(),
        }
    }
}

/// Refuse code larger than one call may carry.
pub fn check_code_size(code: &str) -> Result<(), StorageError> {
    if code.len() > defaults::MAX_CODE_BYTES {
        return Err(StorageError::TooLarge {
            what: "the code sent in one call",
            size: code.len() as u64,
            max: defaults::MAX_CODE_BYTES as u64,
        });
    }
    Ok(())
}

/// Open without following a final symlink and without blocking on a FIFO; then insist on a
/// regular file. `resolve` already refused every other path component.
pub(super) async fn open_checked(
    shown: &str,
    path: &Path,
    opts: &mut tokio::fs::OpenOptions,
) -> Result<tokio::fs::File, StorageError> {
    let file = opts
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .await
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => StorageError::Symlink {
                path: shown.to_string(),
            },
            _ if e.kind() == io::ErrorKind::NotFound => StorageError::NotFound {
                path: shown.to_string(),
            },
            _ => io_err(path, e),
        })?;
    let meta = file.metadata().await.map_err(|e| io_err(path, e))?;
    if !meta.is_file() {
        return Err(StorageError::NotRegular {
            path: shown.to_string(),
        });
    }
    Ok(file)
}

#[cfg(test)]
mod tests;
