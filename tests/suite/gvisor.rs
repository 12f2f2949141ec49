//! The gVisor tier (`--runtime runsc`) on the real daemon: `doctor` passes every check with
//! every sandbox under gVisor, and a daemon without the runtime is refused at connect with
//! what to run. (The isolation and hostile battery itself runs under gVisor as a second
//! pass of the suite: `MCP_TEST_RUNTIME=runsc`, see scripts/test.sh.) These tests need
//! runsc registered (`scripts/setup-docker.sh --gvisor`) and fail, saying so, without it.

use crate::common;

use mcp_code_executor::backend::docker::{DockerBackend, DockerConfig, GVISOR_RUNTIME};
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::{Backend, BackendError};
use mcp_code_executor::ops::doctor;

/// The doctor's jobs are the local tenant's, and each test removes what this process left of
/// that tenant's at its end: one test of this file at a time, so that one's clean-up never
/// removes the other's sandboxes (all tests share one process).
pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_doctor_passes_every_check_under_gvisor() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _clean = common::remove_on_drop(mcp_code_executor::job::LOCAL_TENANT);
    common::sandbox().await; // the image is there
    let config = DockerConfig {
        runtime: Some(GVISOR_RUNTIME.into()),
        ..DockerConfig::new(image::default_image())
    };
    let b = DockerBackend::connect(config).await.unwrap_or_else(|e| {
        panic!("runsc must be registered with dockerd (sudo scripts/setup-docker.sh --gvisor): {e}")
    });
    let report = doctor::diagnose(&b).await;
    let table = report.table();
    assert!(report.ok(), "{table}");
    let names: Vec<_> = report.checks.iter().map(|c| c.name).collect();
    for check in [
        "gVisor kernel",
        "memory limit",
        "memory bomb OOM-killed",
        "fork bomb contained",
        "seccomp filter",
        "no outbound connections",
    ] {
        assert!(names.contains(&check), "{check} missing: {table}");
    }
    b.drain().await;
}

#[tokio::test]
async fn an_unregistered_runtime_is_refused_with_what_to_run() {
    for (runtime, says) in [
        ("runsc-not-registered", "setup-docker.sh --gvisor"),
        ("no-such-runtime", "daemon.json"),
    ] {
        let config = DockerConfig {
            runtime: Some(runtime.into()),
            ..DockerConfig::new(image::default_image())
        };
        match DockerBackend::connect(config).await {
            Err(e @ BackendError::Failed { .. }) => {
                let m = e.to_string();
                assert!(m.contains(runtime) && m.contains(says), "{m}");
            }
            Err(e) => panic!("{runtime}: not the runtime refusal: {e}"),
            Ok(_) => panic!("{runtime}: a runtime the daemon lacks was accepted"),
        }
    }
}

/// The CPU quota under gVisor is measured by what busy loops achieve (gVisor's own CPU
/// accounting counts throttled time as run). Under the quota the check passes, whatever
/// the load; with the whole host's cores in place of the quota it fails. A saturated host
/// gives a container without a quota no more than the quota either (Docker's containers
/// share one CPU weight against the host's own processes: with ten compilers busy on two
/// cores both sides measured 0.5 cores; in a CI run with the suite at three threads, 0.2-0.4),
/// so that side is asked only when the host had a core idle over the last second, three
/// seconds apart, for three minutes at most, and the test fails if the host never lets it tell.
#[tokio::test]
async fn the_gvisor_cpu_check_passes_under_the_quota_and_fails_without_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let _clean = common::remove_on_drop(mcp_code_executor::job::LOCAL_TENANT);
    common::sandbox().await;
    let config = DockerConfig {
        runtime: Some(GVISOR_RUNTIME.into()),
        ..DockerConfig::new(image::default_image())
    };
    let b = DockerBackend::connect(config).await.unwrap_or_else(|e| {
        panic!("runsc must be registered with dockerd (sudo scripts/setup-docker.sh --gvisor): {e}")
    });
    let host_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    // Asked only while the host has a core to spare (a saturated host gives a container
    // without a quota no more than the quota: CI once failed here five times running),
    // for three minutes at most.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        let idle = idle_cores(std::time::Duration::from_secs(1)).await;
        if idle < 1.0 {
            continue;
        }
        let enforced = doctor::cpu_quota_check(&b, 0.5).await;
        assert!(enforced.ok, "under the 0.5-core quota: {}", enforced.detail);
        let none = doctor::cpu_quota_check(&b, host_cores).await;
        assert!(
            none.detail.contains("busy processes ran for"),
            "{}",
            none.detail
        );
        eprintln!(
            "quota 0.5: {}\nquota {host_cores} ({idle:.2} cores idle before): {}",
            enforced.detail, none.detail
        );
        seen.push(none.detail);
        if !none.ok {
            b.drain().await;
            return;
        }
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    }
    b.drain().await;
    panic!(
        "with {host_cores} cores the check passed every time the host had a core idle, for three minutes: {seen:#?}"
    );
}

/// The host's idle cores over `over` (idle and iowait of every CPU in /proc/stat).
async fn idle_cores(over: std::time::Duration) -> f64 {
    fn read() -> (u64, u64) {
        let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
        let cpu: Vec<u64> = stat
            .lines()
            .next()
            .expect("the cpu line")
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        (cpu[3] + cpu[4], cpu.iter().sum())
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let (idle0, total0) = read();
    tokio::time::sleep(over).await;
    let (idle1, total1) = read();
    let total = (total1 - total0).max(1) as f64;
    cores * (idle1 - idle0) as f64 / total
}
