//! What goes wrong with a stored file, each message naming the path the client sent.

use std::io;
use std::path::Path;

use super::TEMP_PREFIX;

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

pub(super) fn io_err(path: &Path, source: io::Error) -> StorageError {
    StorageError::Io {
        path: path.display().to_string(),
        source,
    }
}
