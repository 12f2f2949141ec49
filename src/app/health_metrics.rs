//! Process-wide gauges and counters the alert rules of `deploy/prometheus/` watch beside
//! [`super::metrics`]'s per-tenant ones: the isolation self-test's result, the free space
//! of the code storage's file system, and sandboxes the warm pool could not make. Set once
//! at start-up (the self-test, the storage directory) or counted where they happen (the
//! pool's refill failures, [`crate::backend::pool::refill_failures`]); read at each scrape.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The self-test's result: not run, passed, failed (served only with `--allow-unsafe`).
static SELF_TEST: AtomicU8 = AtomicU8::new(NOT_RUN);
const NOT_RUN: u8 = 2;

/// The code storage directory whose file system `/metrics` reports.
static STORAGE_DIR: OnceLock<PathBuf> = OnceLock::new();

/// The isolation self-test passed (`true`) or failed and the server serves anyway.
pub fn set_self_test(passed: bool) {
    SELF_TEST.store(u8::from(passed), Ordering::Relaxed);
}

/// The code storage directory (the server's `CODE_STORAGE_DIR`), once, at start-up.
pub fn set_storage_dir(dir: PathBuf) {
    let _ = STORAGE_DIR.set(dir);
}

/// Size and free bytes (for an unprivileged user) of the file system holding `dir`.
pub fn disk_space(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path; `st` is written by statvfs(3) when it returns 0
    // and read only then.
    let st = unsafe {
        if libc::statvfs(c.as_ptr(), st.as_mut_ptr()) != 0 {
            return None;
        }
        st.assume_init()
    };
    let frag = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frag, st.f_bavail as u64 * frag))
}

/// The Prometheus lines.
pub fn render(out: &mut String) {
    match SELF_TEST.load(Ordering::Relaxed) {
        NOT_RUN => {}
        v => {
            let _ = write!(
                out,
                "# HELP mcp_executor_self_test_passed 1 when the isolation self-test passed at start-up, 0 when it failed and --allow-unsafe serves anyway.\n\
                 # TYPE mcp_executor_self_test_passed gauge\nmcp_executor_self_test_passed {v}\n"
            );
        }
    }
    if let Some((size, free)) = STORAGE_DIR.get().and_then(|d| disk_space(d)) {
        let _ = write!(
            out,
            "# HELP mcp_executor_code_storage_size_bytes Size of the file system holding the code storage directory.\n\
             # TYPE mcp_executor_code_storage_size_bytes gauge\nmcp_executor_code_storage_size_bytes {size}\n\
             # HELP mcp_executor_code_storage_free_bytes Bytes free (to unprivileged users) on the file system holding the code storage directory.\n\
             # TYPE mcp_executor_code_storage_free_bytes gauge\nmcp_executor_code_storage_free_bytes {free}\n"
        );
    }
    let _ = write!(
        out,
        "# HELP mcp_executor_pool_refill_failures_total Sandboxes the warm pool could not make (the image gone, the daemon refusing, ...).\n\
         # TYPE mcp_executor_pool_refill_failures_total counter\nmcp_executor_pool_refill_failures_total {}\n",
        crate::backend::pool::refill_failures()
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn disk_space_of_a_real_directory() {
        let (size, free) = super::disk_space(&std::env::temp_dir()).unwrap();
        assert!(size > 0 && free <= size, "{size} {free}");
        assert!(super::disk_space(std::path::Path::new("/no/such/dir")).is_none());
    }
}
