//! The contract every backend keeps, written once and run against each: Docker
//! (`tests/engine.rs`), Kubernetes against the stand-in (`tests/kube_backend.rs`) and the
//! fake (`tests/engine.rs`), by [`contract_tests!`]. The code carries `#fake:` comments
//! (Python ignores them) that tell the fake what it would do.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use mcp_code_executor::backend::Backend;
use mcp_code_executor::job::{JobSpec, Limits};

fn job(tenant: &str, code: &str, limits: Limits) -> JobSpec {
    let mut j = JobSpec::python(code, limits);
    j.tenant = tenant.into();
    j
}

/// Wait (bounded) until the backend holds no sandbox any more, removals included.
pub async fn assert_nothing_held(b: &dyn Backend) {
    b.drain().await;
    for _ in 0..200 {
        if b.stats().live_containers == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        b.drain().await;
    }
    panic!("sandboxes still held: {}", b.stats().live_containers);
}

/// Output on both streams comes back apart, and the exit status passes through.
pub async fn output_and_exit_code(b: &dyn Backend) {
    let code = "import sys  #fake: out=hello err=oops exit=3\n\
                print('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n";
    let o = b
        .run(job("t-contract-run", code, Limits::default()), None)
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "hello\n", "{o:?}");
    assert!(o.stderr_text().contains("oops"), "{o:?}");
    assert_eq!(o.exit_code, Some(3));
    assert!(!o.success());
    assert_nothing_held(b).await;
}

/// A run past its timeout is killed at the deadline and says so.
pub async fn a_timeout_kills_the_run(b: &dyn Backend) {
    let limits = Limits {
        timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let t = Instant::now();
    let code = "import time  #fake: hang\nprint('start', flush=True)\ntime.sleep(1000)\n";
    let o = b
        .run(job("t-contract-timeout", code, limits), None)
        .await
        .unwrap();
    assert!(o.timed_out, "{o:?}");
    assert_eq!(o.signal, Some(9));
    assert!(!o.success());
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
    assert_nothing_held(b).await;
}

/// The memory limit holds and its end is reported as such.
pub async fn running_out_of_memory_is_reported(b: &dyn Backend) {
    let limits = Limits {
        memory_bytes: 96 << 20,
        ..Limits::default()
    };
    let code = "x = []  #fake: oom\nwhile True:\n    x.append(bytearray(16 << 20))\n";
    let o = b
        .run(job("t-contract-oom", code, limits), None)
        .await
        .unwrap();
    assert!(o.oom_killed, "{o:?}");
    assert!(!o.success());
    assert!(
        o.status_line().contains("out of memory"),
        "{}",
        o.status_line()
    );
    assert_nothing_held(b).await;
}

/// Output past the cap is cut there and flagged.
pub async fn output_past_the_cap_is_cut(b: &dyn Backend) {
    let limits = Limits {
        output_bytes: 1000,
        ..Limits::default()
    };
    let code = "import sys  #fake: flood\nsys.stdout.write('x' * 100000)\n";
    let o = b
        .run(job("t-contract-cap", code, limits), None)
        .await
        .unwrap();
    assert!(o.stdout_truncated, "{o:?}");
    assert_eq!(o.stdout.len(), 1000);
    assert!(o.success(), "{o:?}");
    assert_nothing_held(b).await;
}

/// A session keeps its state from cell to cell; a timeout ends it, and says so after.
pub async fn a_session_keeps_state_until_a_timeout_ends_it(b: &dyn Backend) {
    let mut s = b
        .open_session(job("t-contract-session", "", Limits::default()))
        .await
        .unwrap();
    let second = Duration::from_secs(10);
    let o = s
        .exec("x = 42  #fake: keep=42", second, None)
        .await
        .unwrap();
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    let o = s
        .exec("print(x)  #fake: recall", second, None)
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "42\n", "{o:?}");
    assert!(s.alive());
    let o = s
        .exec(
            "while True: pass  #fake: hang",
            Duration::from_secs(1),
            None,
        )
        .await
        .unwrap();
    assert!(o.timed_out, "{o:?}");
    assert!(!s.alive());
    let err = s.exec("x", second, None).await.unwrap_err();
    assert!(err.to_string().contains("session has ended"), "{err}");
    drop(s);
    assert_nothing_held(b).await;
}

/// Dropping a run's future (the client went away) removes its sandbox.
pub async fn a_cancelled_run_leaves_nothing(b: &dyn Backend) {
    let limits = Limits {
        timeout: Duration::from_secs(60),
        ..Limits::default()
    };
    let code = "import time  #fake: hang\ntime.sleep(1000)\n";
    let run = b.run(job("t-contract-cancel", code, limits), None);
    let cut = tokio::time::timeout(Duration::from_secs(3), run).await;
    assert!(cut.is_err(), "the run ended by itself: {cut:?}");
    assert_nothing_held(b).await;
}

/// The sweep answers (what it removes is each backend's own test), and leaves nothing of
/// this process's held.
pub async fn the_sweep_answers(b: &dyn Backend) {
    b.sweep().await.expect("the sweep");
    assert_nothing_held(b).await;
}

/// The contract's tests in a module `$name`, each on a backend made by `$make` (an async
/// block giving the backend and what must outlive it).
macro_rules! contract_tests {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            async fn on<F, Fut>(test: F)
            where
                F: FnOnce(std::sync::Arc<dyn mcp_code_executor::backend::Backend>) -> Fut,
                Fut: std::future::Future<Output = ()>,
            {
                // `_keep` (a stand-in) outlives the test and the shutdown.
                let (backend, _keep) = $make.await;
                test(backend.clone()).await;
                backend.shutdown().await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn output_and_exit_code() {
                on(|b| async move { contract::output_and_exit_code(&*b).await }).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn a_timeout_kills_the_run() {
                on(|b| async move { contract::a_timeout_kills_the_run(&*b).await }).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn running_out_of_memory_is_reported() {
                on(|b| async move { contract::running_out_of_memory_is_reported(&*b).await }).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn output_past_the_cap_is_cut() {
                on(|b| async move { contract::output_past_the_cap_is_cut(&*b).await }).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn a_session_keeps_state_until_a_timeout_ends_it() {
                on(
                    |b| async move {
                        contract::a_session_keeps_state_until_a_timeout_ends_it(&*b).await
                    },
                )
                .await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn a_cancelled_run_leaves_nothing() {
                on(|b| async move { contract::a_cancelled_run_leaves_nothing(&*b).await }).await
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn the_sweep_answers() {
                on(|b| async move { contract::the_sweep_answers(&*b).await }).await
            }
        }
    };
}
pub(crate) use contract_tests;

/// A backend for [`contract_tests!`]: `b` with nothing else to keep.
pub fn alone<B: Backend + 'static>(b: Arc<B>) -> (Arc<dyn Backend>, ()) {
    (b, ())
}
