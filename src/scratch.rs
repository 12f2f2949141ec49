//! Scratch directories for the unit tests, removed when the test process exits. A leaf, so
//! that a test of any layer can use it without reaching into another layer.

use std::path::{Path, PathBuf};

/// A fresh directory, its canonical path. It lives under this test process's scratch
/// root, removed when the process exits, whether the tests passed or failed.
pub fn tempdir() -> PathBuf {
    let d = scratch_root().join(format!("env-{}", crate::job::new_job_id()));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::canonicalize(d).unwrap()
}

static SCRATCH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// `mcpx-unit-{pid}` under the system's temporary directory. libtest ends the process
/// with `exit`, passed or failed, and `exit` runs the `atexit` handler that removes it.
pub fn scratch_root() -> &'static Path {
    extern "C" fn remove() {
        if let Some(root) = SCRATCH.get() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
    SCRATCH.get_or_init(|| {
        // SAFETY: registers a plain function that takes no locks held elsewhere.
        unsafe { libc::atexit(remove) };
        std::env::temp_dir().join(format!("mcpx-unit-{}", std::process::id()))
    })
}
