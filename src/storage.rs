//! Code storage: the directory (`CODE_STORAGE_DIR`) where `execute_code` keeps what it ran and
//! where the incremental-file tools build a script across several calls.
//!
//! Every `file_path` a client sends is untrusted. [`CodeStorage::resolve`] accepts a bare file
//! name or an absolute path directly inside the storage directory and nothing else: other
//! absolute paths, `..`, subdirectories, NUL bytes and over-long names are refused before the
//! file system is touched. Files are then opened with `O_NOFOLLOW` (a symlink planted in the
//! directory is refused, not followed) and must be regular files. Each file has a
//! reader-writer lock: appends and replacements of one file run one at a time (concurrent
//! appends never interleave or lose data) and a read never sees half of either. A
//! replacement ([`CodeStorage::write_bytes`]) is written to a temporary file beside the
//! target and renamed over it, so an error or a quota refusal leaves the old content. A
//! lock lives only while someone holds or waits for it.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Named defaults and caps.
pub mod defaults {
    /// Largest piece of code one call may send (`code` or `content`).
    pub const MAX_CODE_BYTES: usize = 1 << 20;
    /// Largest a stored file may grow through appends.
    pub const MAX_FILE_BYTES: u64 = 8 << 20;
    /// Longest file name accepted (most file systems stop at 255 bytes).
    pub const MAX_NAME_BYTES: usize = 200;
    /// Longest part of a file name taken from the client's `filename`.
    pub const MAX_STEM_CHARS: usize = 64;
}

/// What went wrong with a stored file; every message names the path the client sent.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("file_path `{path}` contains a NUL byte")]
    NulByte { path: String },
    #[error(
        "file_path is empty: pass the file_path returned by initialize_code_file or execute_code"
    )]
    Empty,
    #[error("file_path `{path}` is too long (at most {max} bytes for a file name)")]
    TooLong { path: String, max: usize },
    #[error("file_path `{path}` is outside the code storage directory `{root}`: pass a file name or a path inside it, as returned by initialize_code_file")]
    Outside { path: String, root: String },
    #[error("file_path `{path}` is refused: `..`, `.` and subdirectories are not allowed, only files directly inside the code storage directory")]
    Traversal { path: String },
    #[error("file_path `{path}` is a symbolic link; links are never followed")]
    Symlink { path: String },
    #[error("file_path `{path}` is not a regular file")]
    NotRegular { path: String },
    #[error("file `{path}` does not exist in the code storage directory: create it with initialize_code_file first")]
    NotFound { path: String },
    #[error("{what} is {size} bytes; the limit is {max} bytes. Split the code into several append_to_code_file calls")]
    TooLarge {
        what: &'static str,
        size: u64,
        max: u64,
    },
    #[error("{}", quota_message(*server, *used, *adding, *limit))]
    Quota {
        used: u64,
        adding: u64,
        limit: u64,
        /// The server-wide quota (`--storage-limit-total`), not the tenant's.
        server: bool,
    },
    #[error("file_path `{path}` is refused: names starting with `{TEMP_PREFIX}` are reserved for files being written")]
    Reserved { path: String },
    #[error("file_path \"{path}\" is refused: names may not hold control characters, format characters or separators (newlines, tabs, escapes, U+2028, U+202E, zero-width and non-breaking spaces)")]
    Control { path: String },
    #[error("file `{path}` is not valid UTF-8 text")]
    NotText { path: String },
    #[error("cannot use the code storage directory `{root}`: {source}. Set CODE_STORAGE_DIR to a writable directory")]
    Root { root: String, source: io::Error },
    #[error("I/O error on `{path}`: {source}")]
    Io { path: String, source: io::Error },
}

/// The storage directory and the locks that serialise appends.
pub struct CodeStorage {
    /// The directory as configured (clients may send paths under this spelling).
    root: PathBuf,
    /// The same directory with symlinks resolved (the one we actually use).
    canonical: PathBuf,
    max_file_bytes: u64,
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::RwLock<()>>>>,
    /// The tenant's storage quota, shared with its workspaces.
    quota: std::sync::OnceLock<Arc<StorageQuota>>,
    /// Stored files not modified for this long are removed (at start-up, then at most
    /// every [`AGE_SWEEP_EVERY`] on a write).
    max_age: std::sync::OnceLock<std::time::Duration>,
    last_age_sweep: Mutex<Option<std::time::Instant>>,
}

/// How often writes look for stored code past its age.
pub const AGE_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

fn quota_message(server: bool, used: u64, adding: u64, limit: u64) -> String {
    if server {
        format!(
            "quota exceeded: the stored code and workspace files of every tenant take {used} \
             bytes, and {adding} more would pass the server's --storage-limit-total of {limit} \
             bytes. Free space first (write_file an empty file), or ask the operator, then retry"
        )
    } else {
        format!(
            "quota exceeded: the tenant's stored code and workspace files take {used} bytes, \
             and {adding} more would pass its storage_limit of {limit} bytes. Free space first \
             (write_file an empty file, or ask the operator), then retry"
        )
    }
}

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

/// Names of the temporary files replacements are written to (refused as client names, left
/// out of listings, swept at open when a crash left one).
pub const TEMP_PREFIX: &str = ".mcp-partial-";

/// The default storage directory: `code/` under the data directory (see
/// [`crate::config::data_dir`]), which the caller resolves: nothing here reads the process
/// environment.
pub fn default_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("code")
}

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
            locks: Mutex::default(),
            quota: std::sync::OnceLock::new(),
            max_age: std::sync::OnceLock::new(),
            last_age_sweep: Mutex::default(),
        })
    }

    /// Remove stored files not modified for `age` from now on: those already that old at
    /// once, later ones on writes (set once; later calls are ignored).
    pub fn set_max_age(&self, age: std::time::Duration) {
        if self.max_age.set(age).is_ok() {
            let n = sweep_older(&self.canonical, age);
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
    async fn age_sweep_due(&self) {
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
        let removed = tokio::task::spawn_blocking(move || sweep_older(&dir, age))
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

    async fn check_quota(&self, adding: u64, replacing: u64) -> Result<(), StorageError> {
        match self.quota.get() {
            Some(q) => q.check(adding, replacing).await,
            None => Ok(()),
        }
    }

    /// The storage directory (canonical form).
    pub fn dir(&self) -> &Path {
        &self.canonical
    }

    /// Map a client's `file_path` to a path directly inside the storage directory, or refuse.
    /// Pure: looks only at the string (symlinks are refused when the file is opened).
    pub fn resolve(&self, file_path: &str) -> Result<PathBuf, StorageError> {
        let shown = || file_path.to_string();
        if file_path.contains('\0') {
            return Err(StorageError::NulByte { path: shown() });
        }
        if file_path.trim().is_empty() {
            return Err(StorageError::Empty);
        }
        if !file_path.chars().all(printable) {
            // A newline in a name would let it forge a line of a result or a listing.
            return Err(StorageError::Control {
                path: file_path.escape_debug().take(200).collect(),
            });
        }
        if file_path.len() > 4096 {
            return Err(StorageError::TooLong {
                path: format!("{}…", file_path.chars().take(64).collect::<String>()),
                max: defaults::MAX_NAME_BYTES,
            });
        }
        let p = Path::new(file_path);
        let rest = if p.is_absolute() {
            [&self.canonical, &self.root]
                .iter()
                .find_map(|r| p.strip_prefix(r).ok())
                .ok_or_else(|| {
                    // `/storage/../etc/passwd` starts with the root but is traversal.
                    if p.components().any(|c| c == Component::ParentDir) {
                        StorageError::Traversal { path: shown() }
                    } else {
                        StorageError::Outside {
                            path: shown(),
                            root: self.canonical.display().to_string(),
                        }
                    }
                })?
        } else {
            p
        };
        let mut comps = rest.components();
        let name = match (comps.next(), comps.next()) {
            (Some(Component::Normal(name)), None) if !file_path.ends_with('/') => name,
            _ => return Err(StorageError::Traversal { path: shown() }),
        };
        if name.len() > defaults::MAX_NAME_BYTES {
            return Err(StorageError::TooLong {
                path: shown(),
                max: defaults::MAX_NAME_BYTES,
            });
        }
        if name.to_string_lossy().starts_with(TEMP_PREFIX) {
            return Err(StorageError::Reserved { path: shown() });
        }
        Ok(self.canonical.join(name))
    }

    /// Store `content` in a new file named from `filename` (sanitised) plus a unique suffix.
    pub async fn create(
        &self,
        filename: Option<&str>,
        content: &str,
    ) -> Result<PathBuf, StorageError> {
        check_code_size(content)?;
        self.age_sweep_due().await;
        self.check_quota(content.len() as u64, 0).await?;
        let stem = sanitize_stem(filename);
        loop {
            let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
            let path = self.canonical.join(format!("{stem}_{suffix}.py"));
            let opened = tokio::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .await;
            let mut file = match opened {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(&path, e)),
            };
            file.write_all(content.as_bytes())
                .await
                .map_err(|e| io_err(&path, e))?;
            file.flush().await.map_err(|e| io_err(&path, e))?;
            return Ok(path);
        }
    }

    /// Append `content` to an existing stored file in one write, under the file's lock.
    /// Returns the resolved path and the file's new size.
    pub async fn append(
        &self,
        file_path: &str,
        content: &str,
    ) -> Result<(PathBuf, u64), StorageError> {
        check_code_size(content)?;
        let path = self.resolve(file_path)?;
        let lock = self.lock_for(&path);
        let _guard = lock.write().await;
        let mut file =
            open_checked(file_path, &path, tokio::fs::OpenOptions::new().append(true)).await?;
        let size = file.metadata().await.map_err(|e| io_err(&path, e))?.len();
        let new_size = size + content.len() as u64;
        if new_size > self.max_file_bytes {
            return Err(StorageError::TooLarge {
                what: "the file after this append",
                size: new_size,
                max: self.max_file_bytes,
            });
        }
        self.check_quota(content.len() as u64, 0).await?;
        file.write_all(content.as_bytes())
            .await
            .map_err(|e| io_err(&path, e))?;
        file.flush().await.map_err(|e| io_err(&path, e))?;
        Ok((path, new_size))
    }

    /// Read a stored file as text.
    pub async fn read(&self, file_path: &str) -> Result<(PathBuf, String), StorageError> {
        let (path, buf) = self.read_bytes(file_path).await?;
        let text = String::from_utf8(buf).map_err(|_| StorageError::NotText {
            path: file_path.to_string(),
        })?;
        Ok((path, text))
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
            file.sync_data().await?;
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
        let lock = self.lock_for(&path);
        let _guard = lock.read().await;
        let mut file =
            open_checked(file_path, &path, tokio::fs::OpenOptions::new().read(true)).await?;
        let mut buf = Vec::new();
        (&mut file)
            .take(self.max_file_bytes + 1)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| io_err(&path, e))?;
        if buf.len() as u64 > self.max_file_bytes {
            return Err(StorageError::TooLarge {
                what: "the file",
                size: buf.len() as u64,
                max: self.max_file_bytes,
            });
        }
        Ok((path, buf))
    }

    /// The regular files directly inside the directory (symlinks and others skipped), by
    /// name, with their sizes.
    pub async fn list(&self) -> Result<Vec<(String, u64)>, StorageError> {
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
                    out.push((name.to_string(), meta.len()));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The lock of one file, shared by everyone who holds or waits for it; the entry is
    /// dropped from the map when the last of them lets go.
    fn lock_for(&self, path: &Path) -> FileLock<'_> {
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        let lock = locks.entry(path.to_path_buf()).or_default().clone();
        FileLock {
            storage: self,
            path: path.to_path_buf(),
            lock: Some(lock),
        }
    }

    /// Per-file locks currently in the map (held or waited for).
    #[cfg(test)]
    fn lock_entries(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A handle on one file's lock; see [`CodeStorage::lock_for`]. Clones of the `Arc` are only
/// made under the map's mutex, so a count of one, seen under it, means nobody else holds or
/// waits for this lock.
struct FileLock<'a> {
    storage: &'a CodeStorage,
    path: PathBuf,
    lock: Option<Arc<tokio::sync::RwLock<()>>>,
}

impl FileLock<'_> {
    async fn read(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.lock.as_ref().expect("set until drop").read().await
    }

    async fn write(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.lock.as_ref().expect("set until drop").write().await
    }
}

impl Drop for FileLock<'_> {
    fn drop(&mut self) {
        drop(self.lock.take());
        let mut locks = self.storage.locks.lock().unwrap_or_else(|e| e.into_inner());
        if locks
            .get(&self.path)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.path);
        }
    }
}

/// Remove temporary files a crash left behind (older than a minute: a write in progress in
/// another process sharing the directory is left alone).
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

/// Remove the regular files directly in `dir` not modified for `age` (symlinks and
/// directories left alone); how many.
fn sweep_older(dir: &Path, age: std::time::Duration) -> usize {
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

fn sweep_partial(dir: &Path) {
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
async fn open_checked(
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

fn io_err(path: &Path, source: io::Error) -> StorageError {
    StorageError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The client's `filename` reduced to `[A-Za-z0-9_-]`, without directories or `.py`;
/// `script` when nothing is left.
pub fn sanitize_stem(filename: Option<&str>) -> String {
    let raw = filename.unwrap_or("");
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let base = base.strip_suffix(".py").unwrap_or(base);
    let stem: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(defaults::MAX_STEM_CHARS)
        .collect();
    let stem = stem.trim_matches('_');
    if stem.is_empty() {
        "script".to_string()
    } else {
        stem.to_string()
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

    fn tmp() -> (tempdir::Dir, CodeStorage) {
        let d = tempdir::Dir::new();
        let s = CodeStorage::open(d.path().join("code")).unwrap();
        (d, s)
    }

    /// A throwaway directory removed on drop (no extra crate for this).
    mod tempdir {
        use std::path::{Path, PathBuf};
        pub struct Dir(PathBuf);
        impl Dir {
            pub fn new() -> Self {
                let p = std::env::temp_dir().join(format!(
                    "mcp-storage-test-{}",
                    uuid::Uuid::new_v4().simple()
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
            pub fn path(&self) -> &Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn stems_are_sanitised() {
        assert_eq!(sanitize_stem(Some("matrix_gen")), "matrix_gen");
        assert_eq!(sanitize_stem(Some("my script.py")), "my_script");
        assert_eq!(sanitize_stem(Some("../../etc/passwd")), "passwd");
        assert_eq!(sanitize_stem(Some("..")), "script");
        assert_eq!(sanitize_stem(None), "script");
        assert_eq!(sanitize_stem(Some(&"a".repeat(500))).len(), 64);
    }

    #[test]
    fn resolve_accepts_names_and_paths_inside() {
        let (_d, s) = tmp();
        let inside = s.dir().join("a_1.py");
        assert_eq!(s.resolve("a_1.py").unwrap(), inside);
        assert_eq!(s.resolve(inside.to_str().unwrap()).unwrap(), inside);
    }

    #[test]
    fn resolve_refuses_traversal() {
        let (_d, s) = tmp();
        let root = s.dir().display().to_string();
        let cases: Vec<(String, &str)> = vec![
            ("/etc/passwd".into(), "outside"),
            ("../../x".into(), "not allowed"),
            ("..".into(), "not allowed"),
            ("sub/x.py".into(), "not allowed"),
            ("./x.py".into(), "not allowed"),
            (format!("{root}/../x.py"), "not allowed"),
            (format!("{root}/sub/x.py"), "not allowed"),
            (format!("{root}/"), "not allowed"),
            ("x\0.py".into(), "NUL"),
            ("a\nstatus: exit code 0".into(), "control characters"),
            ("bell\u{7}.txt".into(), "control characters"),
            // Issue 24, item 8: what the sandbox refuses for files the code writes.
            ("a\u{2028}b.txt".into(), "control characters"),
            ("x\u{202e}txt.py".into(), "control characters"),
            ("zero\u{200b}width".into(), "control characters"),
            ("".into(), "empty"),
            ("a".repeat(300), "too long"),
            ("a".repeat(5000), "too long"),
        ];
        for (p, want) in cases {
            let e = s.resolve(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{p:?}: {e}");
        }
    }

    #[tokio::test]
    async fn planted_symlink_is_refused_not_followed() {
        let (d, s) = tmp();
        let secret = d.path().join("secret.txt");
        std::fs::write(&secret, "top secret").unwrap();
        std::os::unix::fs::symlink(&secret, s.dir().join("evil.py")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", s.dir().join("passwd.py")).unwrap();
        for name in ["evil.py", "passwd.py"] {
            let e = s.read(name).await.unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{e}");
            let e = s.append(name, "x").await.unwrap_err().to_string();
            assert!(e.contains("symbolic link"), "{e}");
        }
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "top secret");
    }

    #[tokio::test]
    async fn a_symlinked_storage_dir_is_accepted_under_both_spellings() {
        let d = tempdir::Dir::new();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink(d.path().join("real"), d.path().join("link")).unwrap();
        let s = CodeStorage::open(d.path().join("link")).unwrap();
        let p = s.create(Some("x"), "print(1)\n").await.unwrap();
        let name = p.file_name().unwrap().to_str().unwrap();
        let via_link = d.path().join("link").join(name);
        let (_, text) = s.read(via_link.to_str().unwrap()).await.unwrap();
        assert_eq!(text, "print(1)\n");
    }

    #[tokio::test]
    async fn create_append_read() {
        let (_d, s) = tmp();
        let p = s.create(Some("my_script"), "a = 1\n").await.unwrap();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        assert!(
            name.starts_with("my_script_") && name.ends_with(".py"),
            "{name}"
        );
        let (_, size) = s.append(&name, "b = 2\n").await.unwrap();
        assert_eq!(size, 12);
        let (_, text) = s.read(p.to_str().unwrap()).await.unwrap();
        assert_eq!(text, "a = 1\nb = 2\n");
        let e = s.read("missing.py").await.unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        let p2 = s.create(Some("my_script"), "").await.unwrap();
        assert_ne!(p, p2, "unique suffixes");
    }

    #[tokio::test]
    async fn size_caps_hold() {
        let (_d, s) = tmp();
        let big = "x".repeat(defaults::MAX_CODE_BYTES + 1);
        assert!(s.create(None, &big).await.is_err());
        let p = s.create(None, "").await.unwrap();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let chunk = "y".repeat(defaults::MAX_CODE_BYTES);
        for _ in 0..8 {
            s.append(&name, &chunk).await.unwrap();
        }
        let e = s.append(&name, "z").await.unwrap_err().to_string();
        assert!(e.contains("limit"), "{e}");
    }

    #[tokio::test]
    async fn concurrent_appends_never_interleave() {
        let (_d, s) = tmp();
        let s = Arc::new(s);
        let p = s.create(Some("c"), "").await.unwrap();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let mut tasks = Vec::new();
        for i in 0..32u8 {
            let s = s.clone();
            let name = name.clone();
            tasks.push(tokio::spawn(async move {
                let line = format!(
                    "{}\n",
                    ((b'a' + (i % 26)) as char).to_string().repeat(20_000)
                );
                s.append(&name, &line).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let (_, text) = s.read(&name).await.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 32);
        for l in lines {
            assert_eq!(l.len(), 20_000);
            let c = l.as_bytes()[0];
            assert!(l.bytes().all(|b| b == c), "an append was interleaved");
        }
    }

    #[tokio::test]
    async fn a_replacement_is_never_seen_half_written() {
        let (_d, s) = tmp();
        let s = Arc::new(s.with_max_file_bytes(8 << 20));
        let size = 4 << 20;
        s.write_bytes("f.bin", &vec![b'a'; size]).await.unwrap();
        let writer = tokio::spawn({
            let s = s.clone();
            async move {
                for i in 0..12 {
                    let byte = if i % 2 == 0 { b'b' } else { b'a' };
                    s.write_bytes("f.bin", &vec![byte; size]).await.unwrap();
                }
            }
        });
        let mut reads = 0;
        while !writer.is_finished() {
            let (_, data) = s.read_bytes("f.bin").await.unwrap();
            assert_eq!(data.len(), size, "a partial file was read");
            assert!(
                data.iter().all(|b| *b == data[0]),
                "a mix of two versions was read"
            );
            reads += 1;
        }
        writer.await.unwrap();
        assert!(reads > 0);
        assert_eq!(
            s.list().await.unwrap(),
            vec![("f.bin".to_string(), size as u64)]
        );
        assert_eq!(s.lock_entries(), 0, "the lock map keeps unused entries");
    }

    #[tokio::test]
    async fn a_refused_replacement_keeps_the_old_content() {
        let (d, s) = tmp();
        let quota = Arc::new(StorageQuota::new(100, vec![s.dir().to_path_buf()]));
        s.set_quota(quota);
        s.write_bytes("keep.txt", b"old content").await.unwrap();
        let e = s.write_bytes("keep.txt", &[b'x'; 200]).await.unwrap_err();
        assert!(matches!(e, StorageError::Quota { .. }), "{e}");
        let (_, data) = s.read_bytes("keep.txt").await.unwrap();
        assert_eq!(data, b"old content");
        // Refused as a new file: no empty file is left behind.
        let e = s.write_bytes("new.txt", &[b'x'; 200]).await.unwrap_err();
        assert!(matches!(e, StorageError::Quota { .. }), "{e}");
        assert!(!s.dir().join("new.txt").exists());
        // A failed write (here: the target is a directory) leaves no temporary file.
        std::fs::create_dir(s.dir().join("sub")).unwrap();
        let e = s.write_bytes("sub", b"x").await.unwrap_err();
        assert!(matches!(e, StorageError::NotRegular { .. }), "{e}");
        // Planted links are refused, not followed or replaced.
        let outside = d.path().join("outside.txt");
        std::fs::write(&outside, "untouched").unwrap();
        std::os::unix::fs::symlink(&outside, s.dir().join("link")).unwrap();
        let e = s.write_bytes("link", b"x").await.unwrap_err();
        assert!(matches!(e, StorageError::Symlink { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched");
        let names: Vec<String> = std::fs::read_dir(s.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with(TEMP_PREFIX)),
            "{names:?}"
        );
        // The temporary names are not the clients' to use.
        let e = s
            .write_bytes(&format!("{TEMP_PREFIX}x"), b"x")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        assert_eq!(s.lock_entries(), 0);
    }

    #[tokio::test]
    async fn reads_never_see_half_an_append() {
        let (_d, s) = tmp();
        let s = Arc::new(s);
        let p = s.create(Some("grow"), "").await.unwrap();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let chunk = "z".repeat(defaults::MAX_CODE_BYTES);
        let writer = tokio::spawn({
            let (s, name) = (s.clone(), name.clone());
            async move {
                for _ in 0..6 {
                    s.append(&name, &chunk).await.unwrap();
                }
            }
        });
        while !writer.is_finished() {
            let (_, data) = s.read_bytes(&name).await.unwrap();
            assert_eq!(
                data.len() % defaults::MAX_CODE_BYTES,
                0,
                "part of an append was read"
            );
        }
        writer.await.unwrap();
        assert_eq!(s.lock_entries(), 0);
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

/// Whether `c` may stand in a file name shown to a client (a result, a listing): the rule
/// of every name, written by `write_file` or by code (the sandbox's runner applies Python's
/// `str.isprintable`, which this follows): no control character (a newline would forge a
/// line), no format character (U+202E turns `gpj.py` around, U+200B hides), no separator
/// other than the space (U+2028 is a line break to many readers), no private-use character.
/// Code points not yet assigned are the one difference (Python refuses them; no Unicode
/// table here).
pub fn printable(c: char) -> bool {
    let u = c as u32;
    let format = matches!(u,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F | 0xFEFF
        | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F);
    let separator = matches!(
        u,
        0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000
    );
    let private = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let nonchar = (u & 0xFFFE) == 0xFFFE || (0xFDD0..=0xFDEF).contains(&u);
    !(c.is_control() || format || separator || private || nonchar)
}

#[cfg(test)]
mod printable_tests {
    use super::printable;
    use proptest::prelude::*;

    #[test]
    fn what_python_does_not_print_is_refused() {
        for c in [
            '\n',
            '\t',
            '\u{0}',
            '\u{7f}',
            '\u{85}',
            '\u{2028}',
            '\u{2029}',
            '\u{202e}',
            '\u{200b}',
            '\u{feff}',
            '\u{a0}',
            '\u{3000}',
            '\u{e000}',
            '\u{fffe}',
            '\u{e0041}',
        ] {
            assert!(!printable(c), "{:?}", c);
        }
        for c in ['a', ' ', '.', '-', 'é', '€', '😀', '中', '\u{300}'] {
            assert!(printable(c), "{:?}", c);
        }
    }

    proptest! {
        /// Every character Python's `isprintable` refuses among those below is refused here
        /// too (checked once against the host's Python: tests/fuzz_args.rs sends them).
        #[test]
        fn names_of_plain_letters_pass(s in "[a-zA-Z0-9 ._éü€中-]{1,40}") {
            prop_assert!(s.chars().all(printable));
        }

        #[test]
        fn one_bad_character_is_enough(s in "[a-z]{0,10}", bad in prop::sample::select(vec!['\n', '\u{2028}', '\u{202e}', '\u{200b}', '\u{1b}']), t in "[a-z]{0,10}") {
            let name = format!("{s}{bad}{t}");
            prop_assert!(!name.chars().all(printable));
        }
    }
}
