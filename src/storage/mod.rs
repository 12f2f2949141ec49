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
//!
//! Stored code belongs to a principal ([`CodeStorage::scope`]): the tenant's static token
//! (and a server without sign-in) keeps it in the directory itself, as it always did; a
//! signed-in user in `users/<owner>/` inside it, where nobody else's `file_path` reaches.
//!
//! The parts: `code` (the directory and its files, each under its lock from `locks`),
//! `scope` (one principal's part of the directory: its stored code),
//! `paths` (what a client's `file_path` may name, and the names shown to clients), `quota`
//! (the caps on the bytes stored), `claims` (a process's claim on a directory of session
//! workspaces) and `sweep` (what is removed by age or left behind by a crash).

mod claims;
mod code;
mod error;
mod locks;
mod paths;
mod quota;
mod scope;
mod sweep;

use std::path::{Path, PathBuf};

pub use claims::{claim_session_workspaces, WorkspaceClaim};
pub use code::{check_code_size, CodeStorage, Stamp, AGE_SWEEP_EVERY};
pub use error::StorageError;
pub use paths::{printable, sanitize_stem};
pub use quota::{StorageQuota, USAGE_FRESH};
pub use scope::{Scope, USERS_DIR};

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

/// Names of the temporary files replacements are written to (refused as client names, left
/// out of listings, swept at open when a crash left one).
pub const TEMP_PREFIX: &str = ".mcp-partial-";

/// The default storage directory: `code/` under the data directory (see
/// [`crate::config::data_dir`]), which the caller resolves: nothing here reads the process
/// environment.
pub fn default_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("code")
}

#[cfg(test)]
mod test_support {
    use super::CodeStorage;

    pub fn tmp() -> (tempdir::Dir, CodeStorage) {
        let d = tempdir::Dir::new();
        let s = CodeStorage::open(d.path().join("code")).unwrap();
        (d, s)
    }

    /// A throwaway directory removed on drop (no extra crate for this).
    pub mod tempdir {
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
}
