//! `mcp-code-executor bench`: latency and throughput of the engine, measured in one run
//! against baselines measured in the same run (plain `docker run --rm`, and `docker run
//! --rm` with the engine's hardening flags), so that the figures are ratios on the same
//! noisy machine rather than absolute promises. Ratios are to the plain one.
//!
//! Every engine row runs through the application core ([`crate::app`]: admission, a run
//! slot, the backend), as the server's tools do, so what it measures is what the server
//! does. The caller supplies the backend ([`Connect`]); the baselines use the `docker` CLI.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::app::{self, Capacity, Executor, Service, TenantParts};
use crate::backend::docker::docker_run_flags;
use crate::backend::Backend;
use crate::job::{JobSpec, Limits};

/// How the bench gets a backend with a warm pool of the given size (0: none).
pub type Connect =
    Arc<dyn Fn(usize) -> BoxFuture<'static, Result<Arc<dyn Backend>, String>> + Send + Sync>;

/// The code every measurement runs.
pub const CODE: &str = "print(1)";

/// What to measure.
#[derive(Clone)]
pub struct BenchOptions {
    /// The backend under test.
    pub connect: Connect,
    pub image: String,
    pub runtime: Option<String>,
    /// Sequential samples per latency row.
    pub samples: usize,
    /// Warm pool size for the pool-on rows.
    pub pool_size: usize,
    /// Runs per throughput row.
    pub throughput_runs: usize,
    /// Concurrency levels of the throughput rows.
    pub concurrency: Vec<usize>,
    /// Calls in the burst.
    pub burst: usize,
}

/// min / median / p95 of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub min: Duration,
    pub median: Duration,
    pub p95: Duration,
    pub n: usize,
}

impl Stats {
    pub fn of(mut samples: Vec<Duration>) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        samples.sort();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Some(Stats {
            min: samples[0],
            median: at(0.5),
            p95: at(0.95),
            n: samples.len(),
        })
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A latency row: name, stats, ratio of its median to the baseline's.
pub fn latency_row(name: &str, s: &Stats, baseline: Option<&Stats>) -> String {
    let ratio = baseline
        .map(|b| format!("{:.3}", ms(s.median) / ms(b.median)))
        .unwrap_or_else(|| "1.000".into());
    format!(
        "| {name} | {} | {:.1} | {:.1} | {:.1} | {ratio} |",
        s.n,
        ms(s.min),
        ms(s.median),
        ms(s.p95)
    )
}

/// Resident and peak memory of this process, bytes.
pub fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `docker run --rm` of the same code, through the CLI, as users compare against: plain
/// (`--network none` only), or with the engine's hardening flags.
async fn docker_run_once(image: &str, hardening: Option<&[String]>) -> Result<Duration, String> {
    let t = Instant::now();
    let mut cmd = tokio::process::Command::new("docker");
    cmd.args(["run", "--rm"]);
    match hardening {
        Some(flags) => cmd.args(flags),
        None => cmd.args(["--network", "none"]),
    };
    let out = cmd
        .args([image, crate::backend::image::PYTHON, "-c", CODE])
        .output()
        .await
        .map_err(|e| format!("cannot run the docker CLI: {e}"))?;
    if !out.status.success() || out.stdout != b"1\n" {
        return Err(format!("docker run failed: {out:?}"));
    }
    Ok(t.elapsed())
}

/// The core with the bench's local policy around `backend`: one tenant per name in
/// `tenants`, `slots` run slots shared fairly between them, no quotas.
fn local_service(backend: Arc<dyn Backend>, slots: usize, tenants: &[&str]) -> Service {
    let mut s = Service::new(
        backend,
        Capacity {
            max_concurrent: slots,
            max_queue: 1024,
        },
    );
    for t in tenants {
        s.add_tenant(TenantParts {
            settings: app::Settings {
                tenant: t.to_string(),
                ..app::Settings::default()
            },
            storage: None,
            environments: None,
        });
    }
    s
}

/// One run of `code` through `ex`, as the tools run one: the time from the call to the
/// outcome.
async fn run_once(ex: &Executor, code: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut job = JobSpec::python(code, Limits::default());
    job.tenant = ex.tenant().to_string();
    job.keep_warm = true;
    let o = ex
        .run(job, None, None, &CancellationToken::new())
        .await
        .map_err(|e| e.to_string())?;
    let d = t.elapsed();
    if !o.success() || (code == CODE && o.stdout != b"1\n") {
        return Err(format!("unexpected outcome {o:?}"));
    }
    Ok(d)
}

async fn engine_once(ex: &Executor) -> Result<Duration, String> {
    run_once(ex, CODE).await
}

/// Wait until the pool holds `n` waiting sandboxes (steady state between samples).
async fn pool_filled(s: &dyn Backend, n: usize) {
    let t = Instant::now();
    while s.stats().pool_target > 0
        && s.stats().pool_ready < n
        && t.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Run `total` calls of `call` with `concurrency` workers; returns per-call latencies,
/// failures and the wall time.
pub async fn load<F, Fut>(
    total: usize,
    concurrency: usize,
    call: F,
) -> (Vec<Duration>, usize, Duration)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Duration, String>> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let workers = (0..concurrency).map(|_| {
        let next = next.clone();
        let call = call.clone();
        tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut failed = 0;
            while next.fetch_add(1, Ordering::SeqCst) < total {
                match call().await {
                    Ok(d) => lat.push(d),
                    Err(e) => {
                        failed += 1;
                        eprintln!("bench: call failed: {e}");
                    }
                }
            }
            (lat, failed)
        })
    });
    let mut all = Vec::new();
    let mut failed = 0;
    for w in futures::future::join_all(workers).await {
        let (l, f) = w.expect("worker");
        all.extend(l);
        failed += f;
    }
    (all, failed, t.elapsed())
}

/// Print the engine part of the benchmark; returns the docker-run baseline for further rows.
pub async fn engine(opts: &BenchOptions) -> Result<Option<Stats>, String> {
    let (idle_rss, _) = rss();
    println!(
        "## Latency of `{CODE}`, sequential ({} samples each)\n",
        opts.samples
    );
    println!("| path | n | min ms | median ms | p95 ms | ratio to docker run |");
    println!("| --- | --- | --- | --- | --- | --- |");

    let mut base = Vec::new();
    docker_run_once(&opts.image, None).await?; // warm-up
    for _ in 0..opts.samples {
        base.push(docker_run_once(&opts.image, None).await?);
    }
    let baseline = Stats::of(base);
    if let Some(b) = &baseline {
        println!("{}", latency_row("`docker run --rm` (CLI)", b, None));
    }
    // The same with the engine's hardening, so that the engine is seen against both.
    let flags = docker_run_flags(&Limits::default(), opts.runtime.as_deref());
    let mut hardened = Vec::new();
    docker_run_once(&opts.image, Some(&flags)).await?; // warm-up
    for _ in 0..opts.samples {
        hardened.push(docker_run_once(&opts.image, Some(&flags)).await?);
    }
    if let Some(h) = Stats::of(hardened) {
        println!(
            "{}",
            latency_row(
                "`docker run --rm` (CLI) with the engine's hardening flags",
                &h,
                baseline.as_ref()
            )
        );
    }

    let cold = local_service((opts.connect)(0).await?, 4, &["bench"]);
    let ex = cold.tenants()[0].clone();
    let mut v = Vec::new();
    engine_once(&ex).await?;
    for _ in 0..opts.samples {
        cold.backend().drain().await;
        v.push(engine_once(&ex).await?);
    }
    cold.shutdown().await;
    if let Some(s) = Stats::of(v) {
        println!(
            "{}",
            latency_row("engine, pool off (cold container)", &s, baseline.as_ref())
        );
    }

    let slots = opts
        .concurrency
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(opts.burst);
    let warm_service = local_service(
        (opts.connect)(opts.pool_size.max(1)).await?,
        slots,
        &[crate::job::LOCAL_TENANT],
    );
    let warm = warm_service.backend().clone();
    let ex = warm_service.tenants()[0].clone();
    let mut v = Vec::new();
    for _ in 0..opts.samples {
        pool_filled(&*warm, opts.pool_size.max(1)).await;
        warm.drain().await;
        v.push(engine_once(&ex).await?);
    }
    if let Some(s) = Stats::of(v) {
        println!(
            "{}",
            latency_row("engine, pool on (warm container)", &s, baseline.as_ref())
        );
    }

    println!(
        "\n## Throughput, pool of {} on ({} runs per row)\n",
        opts.pool_size, opts.throughput_runs
    );
    println!("| concurrency | runs/s | p50 ms | p95 ms | failed | pool hits |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for &c in &opts.concurrency {
        pool_filled(&*warm, opts.pool_size).await;
        warm.drain().await;
        let hits0 = warm.stats().pool_hits;
        let w = ex.clone();
        let (lat, failed, wall) = load(opts.throughput_runs, c, move || {
            let w = w.clone();
            async move { engine_once(&w).await }
        })
        .await;
        let hits = warm.stats().pool_hits - hits0;
        let s = Stats::of(lat.clone());
        println!(
            "| {c} | {:.1} | {} | {} | {failed} | {hits}/{} |",
            lat.len() as f64 / wall.as_secs_f64(),
            s.map(|s| format!("{:.1}", ms(s.median)))
                .unwrap_or_default(),
            s.map(|s| format!("{:.1}", ms(s.p95))).unwrap_or_default(),
            opts.throughput_runs
        );
    }

    println!(
        "\n## Profile: the Docker ceiling (`/bin/true`, same hardening, no runner, no Python)\n"
    );
    println!("| concurrency | containers/s | create ms | start ms | wait ms | remove ms |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for &c in &opts.concurrency {
        let Some(f) = warm.lifecycle_ceiling(opts.throughput_runs, c).await else {
            break;
        };
        let f = f.map_err(|e| e.to_string())?;
        println!(
            "| {c} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} |",
            f.per_second,
            ms(f.create),
            ms(f.start),
            ms(f.wait),
            ms(f.remove)
        );
    }

    pool_filled(&*warm, opts.pool_size).await;
    warm.drain().await;
    let w = ex.clone();
    let (lat, failed, wall) = load(opts.burst, opts.burst, move || {
        let w = w.clone();
        async move { engine_once(&w).await }
    })
    .await;
    let (_, peak_rss) = rss();
    println!("\n## Burst of {} concurrent runs\n", opts.burst);
    let s = Stats::of(lat.clone());
    println!(
        "completed {}, failed {failed}, p50 {} ms, p95 {} ms, all done in {:.1} s",
        lat.len(),
        s.map(|s| format!("{:.0}", ms(s.median)))
            .unwrap_or_default(),
        s.map(|s| format!("{:.0}", ms(s.p95))).unwrap_or_default(),
        wall.as_secs_f64()
    );
    println!(
        "\nengine process memory: idle {:.1} MiB, peak {:.1} MiB",
        idle_rss as f64 / 1048576.0,
        peak_rss as f64 / 1048576.0
    );
    warm_service.shutdown().await;
    fairness(opts).await?;
    Ok(baseline)
}

/// Fairness between tenants: a quiet tenant's sequential runs while a noisy one keeps
/// [`FLOOD_DEPTH`] calls waiting, with the server's scheduler (turns between tenants) and
/// with a first-come-first-served queue as the baseline (both tenants under one key).
pub async fn fairness(opts: &BenchOptions) -> Result<(), String> {
    const SLOTS: usize = 2;
    const FLOOD_DEPTH: usize = 8;
    const QUIET_SAMPLES: usize = 5;
    const NOISY_CODE: &str = "import time\ntime.sleep(1)";
    let sandbox = (opts.connect)(0).await?;
    println!(
        "\n## Fairness: a quiet tenant's `{CODE}` while a noisy tenant keeps {} calls of 1 s on {SLOTS} run slots\n",
        FLOOD_DEPTH + SLOTS
    );
    println!("| scheduling | n | min ms | median ms | p95 ms | ratio to quiet alone |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let service = local_service(sandbox.clone(), SLOTS, &["quiet"]);
    let mut alone = Vec::new();
    for _ in 0..QUIET_SAMPLES {
        alone.push(run_once(&service.tenants()[0], CODE).await?);
    }
    let alone = Stats::of(alone).expect("samples");
    println!("{}", latency_row("quiet tenant alone", &alone, None));
    for (name, fair) in [
        ("first come, first served (baseline)", false),
        ("turns between tenants (this server)", true),
    ] {
        // Two tenants take turns (the server's scheduler); one tenant for both is a
        // single first-come-first-served queue.
        let service = if fair {
            local_service(sandbox.clone(), SLOTS, &["noisy", "quiet"])
        } else {
            local_service(sandbox.clone(), SLOTS, &["all"])
        };
        let noisy = service.tenants()[0].clone();
        let quiet_ex = service.tenants().last().unwrap().clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..FLOOD_DEPTH + SLOTS)
            .map(|_| {
                let (ex, stop) = (noisy.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        if let Err(e) = run_once(&ex, NOISY_CODE).await {
                            eprintln!("bench: noisy run failed: {e}");
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut quiet = Vec::new();
        for _ in 0..QUIET_SAMPLES {
            quiet.push(run_once(&quiet_ex, CODE).await?);
        }
        stop.store(true, Ordering::SeqCst);
        for w in workers {
            let _ = w.await;
        }
        let q = Stats::of(quiet).expect("samples");
        println!("{}", latency_row(name, &q, Some(&alone)));
    }
    sandbox.drain().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_pick_the_right_samples() {
        let v: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let s = Stats::of(v).unwrap();
        assert_eq!(s.min, Duration::from_millis(1));
        assert_eq!(s.median, Duration::from_millis(51));
        assert_eq!(s.p95, Duration::from_millis(95));
        assert!(Stats::of(vec![]).is_none());
        let row = latency_row("x", &s, Some(&s));
        assert!(row.ends_with("| 1.000 |"), "{row}");
    }

    #[test]
    fn the_hardened_baseline_has_every_flag() {
        let f = docker_run_flags(&Limits::default(), None).join(" ");
        let l = Limits::default();
        for flag in [
            "--read-only".to_string(),
            "--network none".into(),
            "--cap-drop ALL".into(),
            "--security-opt no-new-privileges".into(),
            "--user 65534:65534".into(),
            "--log-driver none".into(),
            format!("--pids-limit {}", l.pids),
            format!("--memory {0} --memory-swap {0}", l.memory_bytes),
            format!("--cpus {}", l.cpus),
            format!("--ulimit nofile={0}:{0}", l.nofile),
            format!(
                "--tmpfs /tmp:rw,nosuid,nodev,noexec,size={},mode=1777",
                l.tmp_bytes
            ),
            format!(
                "--tmpfs /workspace:rw,nosuid,nodev,noexec,size={},mode=1777",
                l.workspace_bytes
            ),
        ] {
            assert!(f.contains(&flag), "{flag} missing in {f}");
        }
        assert!(!f.contains("--runtime"));
        assert!(docker_run_flags(&Limits::default(), Some("crun"))
            .join(" ")
            .contains("--runtime crun"));
    }
}
