//! One principal's part of the storage directory: the stored code the incremental-file
//! tools and `execute_code` make, find and run. The tenant's static token (and a server
//! without sign-in: stdio, a single-user `serve`) has the directory itself, as before; each
//! signed-in user has `users/<owner>/` inside it, `<owner>` being the digest of the user's
//! issuer and subject ([`crate::tenancy::oauth::Principal::owner`]). A `file_path` is
//! resolved inside the caller's part only: another user's file, by name or by absolute
//! path, is "does not exist" or "outside the code storage directory", never read, appended
//! to or run.

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

use super::code::{check_code_size, open_checked, CodeStorage};
use super::error::io_err;
use super::{paths, sanitize_stem, StorageError};

/// The directory of the signed-in users' parts, inside the storage directory (a name
/// [`Scope::create`] never gives a file: those end in `.py`).
pub const USERS_DIR: &str = "users";

/// The part of a [`CodeStorage`] one principal sees ([`CodeStorage::scope`]).
pub struct Scope<'a> {
    storage: &'a CodeStorage,
    /// Its directory, canonical (the storage's canonical directory, or a user's inside it).
    canonical: PathBuf,
    /// The same under the storage directory's configured spelling (clients may send either).
    root: PathBuf,
    /// A signed-in user's part (made on first use), not the directory itself.
    user: bool,
}

/// The directory name of `owner`'s part: the owner key itself when it is a plain hex
/// digest (what [`crate::tenancy::oauth::Principal::owner`] gives), else a digest of it, so
/// that no key can name a path.
fn user_dir_name(owner: &str) -> String {
    if !owner.is_empty() && owner.len() <= 64 && owner.bytes().all(|b| b.is_ascii_hexdigit()) {
        return owner.to_ascii_lowercase();
    }
    use sha2::Digest as _;
    sha2::Sha256::digest(owner.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl<'a> Scope<'a> {
    pub(super) fn new(storage: &'a CodeStorage, owner: Option<&str>) -> Scope<'a> {
        match owner {
            None => Scope {
                storage,
                canonical: storage.dir().to_path_buf(),
                root: storage.root().to_path_buf(),
                user: false,
            },
            Some(owner) => {
                let name = user_dir_name(owner);
                Scope {
                    storage,
                    canonical: storage.dir().join(USERS_DIR).join(&name),
                    root: storage.root().join(USERS_DIR).join(&name),
                    user: true,
                }
            }
        }
    }

    /// This part's directory (canonical form).
    pub fn dir(&self) -> &Path {
        &self.canonical
    }

    /// Map a client's `file_path` to a path directly inside this part, or refuse (see
    /// [`CodeStorage::resolve`]).
    pub fn resolve(&self, file_path: &str) -> Result<PathBuf, StorageError> {
        paths::resolve(&self.canonical, &self.root, file_path)
    }

    /// A user's part must be real directories (`users/` and its own), never a link planted
    /// on the host: refused as a link otherwise. `Ok(false)`: not made yet.
    fn check_dirs(&self) -> Result<bool, StorageError> {
        if !self.user {
            return Ok(true);
        }
        let users = self.storage.dir().join(USERS_DIR);
        for dir in [&users, &self.canonical] {
            match std::fs::symlink_metadata(dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(StorageError::Symlink {
                        path: dir.display().to_string(),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(io_err(dir, e)),
            }
        }
        Ok(true)
    }

    /// Make a user's part (mode 700), if needed.
    fn make_dirs(&self) -> Result<(), StorageError> {
        if self.user {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.canonical)
                .map_err(|e| io_err(&self.canonical, e))?;
        }
        self.check_dirs().map(|_| ())
    }

    /// Resolve `file_path` in a part that must exist already (append, read): a user's part
    /// not made yet holds no file.
    fn existing(&self, file_path: &str) -> Result<PathBuf, StorageError> {
        let path = self.resolve(file_path)?;
        if !self.check_dirs()? {
            return Err(StorageError::NotFound {
                path: file_path.to_string(),
            });
        }
        Ok(path)
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
        self.storage.age_sweep_due().await;
        self.storage.check_quota(content.len() as u64, 0).await?;
        let stem = sanitize_stem(filename);
        // A user's part swept away as empty between making it and the file: made again.
        let mut remade = 0;
        self.make_dirs()?;
        loop {
            let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
            let replica = crate::ids::replica();
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
                Err(e) if e.kind() == io::ErrorKind::NotFound && self.user && remade < 3 => {
                    remade += 1;
                    self.make_dirs()?;
                    continue;
                }
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
        let path = self.existing(file_path)?;
        let lock = self.storage.lock_for(&path);
        let _guard = lock.write().await;
        let mut file =
            open_checked(file_path, &path, tokio::fs::OpenOptions::new().append(true)).await?;
        let size = file.metadata().await.map_err(|e| io_err(&path, e))?.len();
        let new_size = size + content.len() as u64;
        let max = self.storage.max_file_bytes();
        if new_size > max {
            return Err(StorageError::TooLarge {
                what: "the file after this append",
                size: new_size,
                max,
            });
        }
        self.storage.check_quota(content.len() as u64, 0).await?;
        file.write_all(content.as_bytes())
            .await
            .map_err(|e| io_err(&path, e))?;
        file.flush().await.map_err(|e| io_err(&path, e))?;
        Ok((path, new_size))
    }

    /// Read a stored file as text.
    pub async fn read(&self, file_path: &str) -> Result<(PathBuf, String), StorageError> {
        let path = self.existing(file_path)?;
        let buf = self.storage.read_path(file_path, &path).await?;
        let text = String::from_utf8(buf).map_err(|_| StorageError::NotText {
            path: file_path.to_string(),
        })?;
        Ok((path, text))
    }
}

/// A principal's part, and the directory itself for the tenant's static token. Here, not in
/// `code.rs`: a scope is built on the storage, and the storage does not know it.
impl CodeStorage {
    /// The part of the directory whose code `owner` sees ([`Scope`]): the directory itself
    /// for the tenant's static token (and a server without sign-in), `users/<owner>/`
    /// inside it for a signed-in user ([`crate::tenancy::oauth::Principal::owner`]).
    pub fn scope(&self, owner: Option<&str>) -> Scope<'_> {
        Scope::new(self, owner)
    }

    /// Store new code in the directory itself: [`Scope::create`] for the tenant's static
    /// token.
    pub async fn create(
        &self,
        filename: Option<&str>,
        content: &str,
    ) -> Result<PathBuf, StorageError> {
        self.scope(None).create(filename, content).await
    }

    /// [`Scope::append`] for the tenant's static token.
    pub async fn append(
        &self,
        file_path: &str,
        content: &str,
    ) -> Result<(PathBuf, u64), StorageError> {
        self.scope(None).append(file_path, content).await
    }

    /// [`Scope::read`] for the tenant's static token.
    pub async fn read(&self, file_path: &str) -> Result<(PathBuf, String), StorageError> {
        self.scope(None).read(file_path).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::tmp;
    use super::*;

    /// Two users and the tenant's static token: each finds, appends to and reads only its
    /// own files, by name or by absolute path, and the static token's stay where they were.
    #[tokio::test]
    async fn each_principal_sees_only_its_own_code() {
        let (_d, s) = tmp();
        let (a, b) = ("00aa11bb22cc33dd", "44ee55ff66007788");
        let pa = s
            .scope(Some(a))
            .create(Some("flow"), "KEY = 'sk-a'\n")
            .await
            .unwrap();
        assert_eq!(pa.parent().unwrap(), s.dir().join(USERS_DIR).join(a));
        let name = pa.file_name().unwrap().to_str().unwrap().to_string();
        let full = pa.to_str().unwrap().to_string();
        // The same file by name and by path, for its owner.
        for p in [&name, &full] {
            let (_, text) = s.scope(Some(a)).read(p).await.unwrap();
            assert_eq!(text, "KEY = 'sk-a'\n");
        }
        s.scope(Some(a))
            .append(&name, "print(KEY)\n")
            .await
            .unwrap();
        // Another user, by name: not found; by A's path: outside B's directory.
        let sb = s.scope(Some(b));
        let e = sb.read(&name).await.unwrap_err();
        assert!(matches!(e, StorageError::NotFound { .. }), "{e}");
        let e = sb.read(&full).await.unwrap_err();
        assert!(matches!(e, StorageError::Outside { .. }), "{e}");
        assert!(!e.to_string().contains("sk-a"));
        for p in [&name, &full] {
            assert!(sb.append(p, "print('B')\n").await.is_err(), "{p}");
        }
        // B's own part is made only when B stores code.
        assert!(!s.dir().join(USERS_DIR).join(b).exists());
        let pb = sb.create(Some("flow"), "print('B')\n").await.unwrap();
        let e = s
            .scope(Some(a))
            .read(pb.to_str().unwrap())
            .await
            .unwrap_err();
        assert!(matches!(e, StorageError::Outside { .. }), "{e}");
        // The static token: the directory itself, as before; it reaches no user's file
        // (a subdirectory), and users do not reach its files.
        let ps = s.create(Some("ci"), "print('static')\n").await.unwrap();
        assert_eq!(ps.parent().unwrap(), s.dir());
        let e = s.read(&full).await.unwrap_err();
        assert!(matches!(e, StorageError::Traversal { .. }), "{e}");
        let e = s.read(&name).await.unwrap_err();
        assert!(matches!(e, StorageError::NotFound { .. }), "{e}");
        let ps_name = ps.file_name().unwrap().to_str().unwrap();
        assert!(s.scope(Some(a)).read(ps_name).await.is_err());
        assert!(s.scope(Some(a)).read(ps.to_str().unwrap()).await.is_err());
        // A's file is what A made.
        let (_, text) = s.scope(Some(a)).read(&name).await.unwrap();
        assert_eq!(text, "KEY = 'sk-a'\nprint(KEY)\n");
    }

    #[test]
    fn owner_keys_never_name_a_path() {
        assert_eq!(user_dir_name("00AA11bb"), "00aa11bb");
        for odd in ["", "..", "../x", "a/b", &"f".repeat(65), "é"] {
            let n = user_dir_name(odd);
            assert_eq!(n.len(), 16, "{odd:?}");
            assert!(n.bytes().all(|b| b.is_ascii_hexdigit()), "{odd:?}");
        }
    }

    /// A planted link in place of `users/` is refused, not followed.
    #[tokio::test]
    async fn a_linked_users_directory_is_refused() {
        let (d, s) = tmp();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("00aa11bb22cc33dd")).unwrap();
        std::fs::write(elsewhere.join("00aa11bb22cc33dd/x.py"), "secret").unwrap();
        std::os::unix::fs::symlink(&elsewhere, s.dir().join(USERS_DIR)).unwrap();
        let u = s.scope(Some("00aa11bb22cc33dd"));
        let e = u.read("x.py").await.unwrap_err();
        assert!(matches!(e, StorageError::Symlink { .. }), "{e}");
        assert!(u.create(None, "x").await.is_err());
        assert!(u.append("x.py", "y").await.is_err());
    }
}
