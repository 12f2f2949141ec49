//! The storage directory and its files: create, append, replace, read and list, each file
//! under its own reader-writer lock.

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::error::io_err;
use super::locks::{FileLock, FileLocks};
use super::sweep::{sweep_older, sweep_partial};
use super::{defaults, paths, printable, sanitize_stem, StorageError, StorageQuota, TEMP_PREFIX};

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
        paths::resolve(&self.canonical, &self.root, file_path)
    }

    /// Store `content` in a new file named from `filename` (sanitised) plus this replica's
    /// id and a unique suffix (`STEM_REPLICA_RANDOM.py`: with several replicas that do not
    /// share this directory, a call on the file is forwarded to the one that has it).
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
            let replica = crate::cluster::ids::replica();
            let path = self.canonical.join(format!("{stem}_{replica}_{suffix}.py"));
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

    /// The lock of one file; see [`FileLocks::lock_for`].
    fn lock_for(&self, path: &Path) -> FileLock<'_> {
        self.locks.lock_for(path)
    }

    /// Per-file locks currently in the map (held or waited for).
    #[cfg(test)]
    fn lock_entries(&self) -> usize {
        self.locks.len()
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

#[cfg(test)]
mod tests {
    use super::super::test_support::{tempdir, tmp};
    use super::*;

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
}
