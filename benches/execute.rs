//! `cargo bench --bench execute`: the whole benchmark in one run. First the engine rows of
//! `mcp-code-executor bench` (plain `docker run --rm` as the baseline, the engine with the
//! pool off and on, throughput, the Docker ceiling, a burst), then the same code through
//! a real MCP client calling `execute_code` over Streamable HTTP on a real `serve`
//! process, with that server's resident memory idle and under load.
//!
//! Knobs (environment): BENCH_SAMPLES (20), BENCH_RUNS (40), BENCH_BURST (100);
//! BENCH_ONLY=preload runs only the preloading rows (issue 15); BENCH_PAUSE_MS (500), the
//! pause between its interleaved calls. BENCH_ONLY=demand runs only the rows of preloading
//! by demand (issue 29: rates, clients, workloads, the mix, runc and gVisor;
//! benches/execute/demand.rs); BENCH_GVISOR=0 leaves gVisor out of them.
//! BENCH_ONLY=codemode runs only the code-mode row (issue 26, benches/execute/codemode.rs).
//! BENCH_ONLY=egress runs only the egress rows (issue 41, benches/execute/egress.rs: a
//! fresh HTTPS GET through the proxy against the host's, a 200 MB download).
//! BENCH_ONLY=traces runs only the traces rows (issue 45, benches/execute/traces.rs: calls
//! with export off, on, and to a collector that never answers; last in a full run).

use std::time::{Duration, Instant};

use mcp_code_executor::backend::docker::{DockerBackend, DockerConfig};
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::{Backend, PoolConfig};
use mcp_code_executor::ops::bench::{self, latency_row, load, BenchOptions, Stats};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};

#[path = "execute/codemode.rs"]
mod codemode;
#[path = "execute/demand.rs"]
mod demand;
#[path = "execute/egress.rs"]
mod egress;
#[path = "execute/traces.rs"]
mod traces;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_of(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn client(url: &str) -> RunningService<RoleClient, ()> {
    ().serve(StreamableHttpClientTransport::from_uri(url.to_string()))
        .await
        .expect("the MCP client connects")
}

async fn execute(c: &RunningService<RoleClient, ()>) -> Result<Duration, String> {
    call_tool(c, "execute_code", bench::CODE).await
}

/// One call of `tool` with `code` as its `code` argument: its wall time, or why it failed.
async fn call_tool(
    c: &RunningService<RoleClient, ()>,
    tool: &str,
    code: &str,
) -> Result<Duration, String> {
    let t = Instant::now();
    let mut args = serde_json::Map::new();
    args.insert("code".into(), code.into());
    let r = c
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .map_err(|e| e.to_string())?;
    let d = t.elapsed();
    if r.is_error == Some(true) {
        return Err(format!("tool error: {:?}", r.content));
    }
    Ok(d)
}

/// `total` calls, `concurrency` at once, each on its own client session.
async fn mcp_load(url: &str, total: usize, concurrency: usize) -> (Vec<Duration>, usize, Duration) {
    let url = url.to_string();
    load(total, concurrency, move || {
        let url = url.clone();
        async move {
            let c = client(&url).await;
            let r = execute(&c).await;
            let _ = c.cancel().await;
            r
        }
    })
    .await
}

#[tokio::main]
async fn main() {
    let samples = knob("BENCH_SAMPLES", 20);
    let runs = knob("BENCH_RUNS", 40);
    let burst = knob("BENCH_BURST", 100);
    if knob("BENCH_RUNTIMES_ONLY", 0) == 1 {
        runtime_rows(samples, runs).await;
        return;
    }
    let pool_size = 4;
    if std::env::var("BENCH_ONLY").as_deref() == Ok("preload") {
        preload_rows(samples, runs).await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("demand") {
        demand::rows(samples).await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("codemode") {
        codemode::rows().await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("egress") {
        egress::rows().await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("traces") {
        traces::rows().await;
        return;
    }
    println!("# mcp-code-executor benchmark\n");
    println!(
        "machine: {} cores, {}; code: `{}`\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        bench::CODE
    );
    let opts = BenchOptions {
        connect: std::sync::Arc::new(|pool_size| {
            Box::pin(async move {
                let config = DockerConfig {
                    pool: PoolConfig {
                        size: pool_size,
                        ..PoolConfig::default()
                    },
                    ..DockerConfig::new(image::default_image())
                };
                let b = DockerBackend::connect(config)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(std::sync::Arc::new(b) as std::sync::Arc<dyn Backend>)
            })
        }),
        image: image::default_image(),
        runtime: None,
        samples,
        pool_size,
        throughput_runs: runs,
        concurrency: vec![1, 4, 8],
        burst,
    };
    let baseline = bench::engine(&opts).await.expect("engine benchmark");

    // A real server process, on a free port, with its own data and storage. The burst
    // sends BENCH_BURST calls of one tenant at once: above the hosted default of 64 open
    // responses per tenant, which would answer the rest 429.
    let size = pool_size.to_string();
    let args = ["--pool-size", &size, "--max-streams-per-tenant", "256"];
    let (mut server, pid, url, scratch) = start_serve(&args, "mcp").await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the pool fills
    let (idle_rss, _) = rss_of(pid);

    println!("\n## MCP `execute_code` over Streamable HTTP (real client, real `serve`, pool of {pool_size})\n");
    println!("| path | n | min ms | median ms | p95 ms | ratio to docker run |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let c = client(&url).await;
    execute(&c).await.expect("warm-up call");
    let mut lat = Vec::new();
    for _ in 0..samples {
        tokio::time::sleep(Duration::from_millis(1000)).await; // steady state: pool refilled, removals done
        lat.push(execute(&c).await.expect("call"));
    }
    if let Some(s) = Stats::of(lat) {
        println!(
            "{}",
            latency_row("MCP execute_code, pool on", &s, baseline.as_ref())
        );
    }

    println!("\n| concurrency | calls/s | p50 ms | p95 ms | failed |");
    println!("| --- | --- | --- | --- | --- |");
    for conc in [1usize, 4, 8] {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (lat, failed, wall) = mcp_load(&url, runs, conc).await;
        let s = Stats::of(lat.clone());
        println!(
            "| {conc} | {:.1} | {} | {} | {failed} |",
            lat.len() as f64 / wall.as_secs_f64(),
            s.map(|s| format!("{:.0}", s.median.as_secs_f64() * 1000.0))
                .unwrap_or_default(),
            s.map(|s| format!("{:.0}", s.p95.as_secs_f64() * 1000.0))
                .unwrap_or_default(),
        );
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let (lat, failed, wall) = mcp_load(&url, burst, burst).await;
    let s = Stats::of(lat.clone());
    println!(
        "\nburst of {burst} concurrent MCP calls: completed {}, failed {failed}, p50 {} ms, p95 {} ms, all answered in {:.1} s",
        lat.len(),
        s.map(|s| format!("{:.0}", s.median.as_secs_f64() * 1000.0)).unwrap_or_default(),
        s.map(|s| format!("{:.0}", s.p95.as_secs_f64() * 1000.0)).unwrap_or_default(),
        wall.as_secs_f64()
    );
    let (_, peak) = rss_of(pid);
    println!("\nserver resident memory: idle {idle_rss:.1} MiB, peak under load {peak:.1} MiB");

    let _ = c.cancel().await;
    // SIGTERM: the server stops its runs, removes its containers (pool included), exits 0.
    sigterm(pid);
    let status = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("serve exits after SIGTERM")
        .unwrap();
    println!("server exited with {status}");
    let _ = std::fs::remove_dir_all(&scratch);
    runtime_rows(samples, runs).await;
    preload_rows(samples, runs).await;
    demand::rows(samples).await;
    codemode::rows().await;
    egress::rows().await;
    traces::rows().await;
}

/// One `execute_code` call of `code` over MCP.
async fn execute_code(c: &RunningService<RoleClient, ()>, code: &str) -> Result<Duration, String> {
    call_tool(c, "execute_code", code).await
}

/// Memory in use (host cgroup v1, MiB) of each sandbox container the process `pid` owns.
fn sandbox_memory_of(pid: u32) -> Vec<f64> {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "--no-trunc",
            "--filter",
            "label=io.mcp-code-executor.managed=true",
            "--format",
            "{{.ID}} {{.Label \"io.mcp-code-executor.owner\"}}",
        ])
        .output()
        .expect("docker ps");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mine = format!("{}/{pid}/", host.trim());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, owner)| owner.starts_with(&mine))
        .filter_map(|(id, _)| {
            std::fs::read_to_string(format!(
                "/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"
            ))
            .ok()
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .map(|b| b / (1024.0 * 1024.0))
        .collect()
}

/// runc against gVisor (`--runtime runsc`), same code, same machine, one after the other:
/// a cold run (no pool), `print(1)` and `import pandas` over MCP on a real `serve` with a
/// warm pool of 4, throughput at concurrency 4, and the memory of an idle pool sandbox
/// (its whole cgroup: under gVisor that includes gVisor's own kernel).
async fn runtime_rows(samples: usize, runs: usize) {
    println!("\n## Isolation tiers: runc against gVisor (runsc, ptrace platform)\n");
    println!("| runtime | cold run p50 ms | MCP warm p50 ms | MCP `import pandas` p50 ms | calls/s at 4 | idle sandbox MiB |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for runtime in [None, Some("runsc")] {
        let name = runtime.unwrap_or("runc");
        let config = DockerConfig {
            runtime: runtime.map(str::to_string),
            ..DockerConfig::new(image::default_image())
        };
        let b = match DockerBackend::connect(config).await {
            Ok(b) => b,
            Err(e) => {
                println!("| {name} | {e} | | | | |");
                continue;
            }
        };
        let mut cold = Vec::new();
        for _ in 0..samples.min(10) {
            let job = mcp_code_executor::job::JobSpec::python(
                bench::CODE,
                mcp_code_executor::job::Limits::default(),
            );
            let t = Instant::now();
            b.run(job, None).await.expect("cold run");
            cold.push(t.elapsed());
        }
        b.drain().await;
        drop(b);

        let mut args = vec!["--pool-size", "4"];
        if let Some(r) = runtime {
            args.extend(["--runtime", r]);
        }
        let (mut server, pid, url, scratch) = start_serve(&args, name).await;
        tokio::time::sleep(Duration::from_secs(5)).await; // the pool fills
        let c = client(&url).await;
        execute(&c).await.expect("warm-up call");
        let mut warm = Vec::new();
        let mut pandas = Vec::new();
        for _ in 0..samples.min(10) {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            warm.push(execute(&c).await.expect("call"));
            tokio::time::sleep(Duration::from_millis(1000)).await;
            pandas.push(
                execute_code(&c, "import pandas")
                    .await
                    .expect("import pandas"),
            );
        }
        let _ = c.cancel().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The pool refilled and idle: what one waiting sandbox holds.
        let memory = sandbox_memory_of(pid);
        let (lat, failed, wall) = mcp_load(&url, runs, 4).await;
        sigterm(pid);
        let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
        let _ = std::fs::remove_dir_all(&scratch);
        let p50 = |v: Vec<Duration>| {
            Stats::of(v)
                .map(|s| format!("{:.0}", s.median.as_secs_f64() * 1000.0))
                .unwrap_or_default()
        };
        println!(
            "| {name} | {} | {} | {} | {:.1}{} | {} |",
            p50(cold),
            p50(warm),
            p50(pandas),
            lat.len() as f64 / wall.as_secs_f64(),
            if failed > 0 {
                format!(" ({failed} failed)")
            } else {
                String::new()
            },
            if memory.is_empty() {
                "?".to_string()
            } else {
                format!(
                    "{:.1} (mean of {})",
                    memory.iter().sum::<f64>() / memory.len() as f64,
                    memory.len()
                )
            }
        );
    }
}

/// SIGTERM through the `kill` command (no unsafe libc call needed).
fn sigterm(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

// ---- Preloading (issue 15): the four codes with and without preloading --------------------

/// The codes of the preloading rows: what people send, not only `print(1)`.
const PRELOAD_CODES: &[(&str, &str)] = &[
    ("`print(1)`", "print(1)"),
    (
        "numpy example",
        "import numpy as np; print(np.random.rand(3,3))",
    ),
    (
        "pandas example",
        "import pandas as pd; print(pd.DataFrame({'a': [1, 2]}).sum().a)",
    ),
    (
        "figure",
        "import matplotlib.pyplot as plt; plt.plot([1,2,3]); plt.show()",
    ),
];

/// A module the default list lacks and the image has: the learned row imports it.
const LEARNED_CODE: &str = "import scipy.stats; print(scipy.stats.norm.cdf(0))";

/// A `serve` process on a free port with `args`, its own data; returns it, its pid, its
/// Streamable HTTP URL and its scratch directory.
async fn start_serve(
    args: &[&str],
    tag: &str,
) -> (tokio::process::Child, u32, String, std::path::PathBuf) {
    let scratch = std::env::temp_dir().join(format!("mcpx-bench-{tag}-{}", std::process::id()));
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["serve", "--port", "0"])
        .args(args)
        .env("MCP_EXECUTOR_DATA_DIR", scratch.join("data"))
        .env("CODE_STORAGE_DIR", scratch.join("code"))
        .env("MCP_EXECUTOR_MAX_CONCURRENT", "8")
        .env("RUST_LOG", "mcp_code_executor=warn")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let pid = server.id().expect("pid");
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let url = loop {
        let line = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
            .await
            .expect("serve prints its address")
            .unwrap()
            .expect("serve is running");
        if let Some(rest) = line.split("Streamable HTTP at ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (server, pid, url, scratch)
}

/// A container's CPU (seconds) and memory (MiB) so far, from the host's cgroup files
/// (cgroup v1 or v2, cgroupfs or systemd driver); `None` where none is found.
fn container_usage(id: &str) -> Option<(f64, f64)> {
    let read = |p: String| -> Option<u64> {
        std::fs::read_to_string(p)
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let v1 = (
        read(format!("/sys/fs/cgroup/cpuacct/docker/{id}/cpuacct.usage")),
        read(format!(
            "/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"
        )),
    );
    if let (Some(cpu), Some(mem)) = v1 {
        return Some((cpu as f64 / 1e9, mem as f64 / 1048576.0));
    }
    for dir in [
        format!("/sys/fs/cgroup/docker/{id}"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope"),
    ] {
        let stat = std::fs::read_to_string(format!("{dir}/cpu.stat")).ok();
        let usec = stat.and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("usage_usec "))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        });
        if let (Some(u), Some(m)) = (usec, read(format!("{dir}/memory.current"))) {
            return Some((u as f64 / 1e6, m as f64 / 1048576.0));
        }
    }
    None
}

/// The waiting pool containers of the server `pid`: mean CPU seconds they used to get
/// ready (runner, interpreter, preload) and mean memory each holds while waiting.
fn pool_cost(pid: u32) -> Option<(f64, f64, usize)> {
    let owner = mcp_code_executor::backend::docker::owner_label(pid)?;
    let out = std::process::Command::new("docker")
        .args(["ps", "-q", "--no-trunc", "--filter"])
        .arg(format!(
            "label={}={owner}",
            mcp_code_executor::backend::docker::LABEL_OWNER
        ))
        .output()
        .ok()?;
    let usage: Vec<(f64, f64)> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(container_usage)
        .collect();
    if usage.is_empty() {
        return None;
    }
    let n = usage.len() as f64;
    Some((
        usage.iter().map(|u| u.0).sum::<f64>() / n,
        usage.iter().map(|u| u.1).sum::<f64>() / n,
        usage.len(),
    ))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Interleaved samples of each code (a pause between calls: the pool refills), p50 and p95.
async fn interleaved(url: &str, codes: &[&str], samples: usize) -> Vec<Option<Stats>> {
    let c = client(url).await;
    for code in codes {
        execute_code(&c, code).await.expect("warm-up call");
    }
    let mut lat: Vec<Vec<Duration>> = vec![Vec::new(); codes.len()];
    for _ in 0..samples {
        for (i, code) in codes.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(knob("BENCH_PAUSE_MS", 500) as u64)).await;
            lat[i].push(execute_code(&c, code).await.expect("call"));
        }
    }
    let _ = c.cancel().await;
    lat.into_iter().map(Stats::of).collect()
}

/// Calls per second of `code` at `concurrency`, each call on its own client session.
async fn code_throughput(url: &str, code: &str, total: usize, concurrency: usize) -> (f64, usize) {
    let (url, code) = (url.to_string(), code.to_string());
    let (lat, failed, wall) = load(total, concurrency, move || {
        let (url, code) = (url.clone(), code.clone());
        async move {
            let c = client(&url).await;
            let r = execute_code(&c, &code).await;
            let _ = c.cancel().await;
            r
        }
    })
    .await;
    (lat.len() as f64 / wall.as_secs_f64(), failed)
}

/// The preloading rows: a `serve` without preloading, then one with the default list and
/// learning, each measured the same way in this one run.
async fn preload_rows(samples: usize, runs: usize) {
    let pool_size = 2;
    println!(
        "\n## Preloading (issue 15): `execute_code` over Streamable HTTP, `serve --pool-size {pool_size}`\n"
    );
    println!(
        "Interleaved calls, 0.5 s apart (the pool refills), {samples} samples each; calls/s at \
         concurrency 4 over {runs} calls; refill CPU and memory are means over the waiting pool \
         containers (host cgroup files), measured with the pool full and idle.\n"
    );
    println!("| preload | code | p50 ms | p95 ms | x print(1) | calls/s at 4 | failed |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut costs = Vec::new();
    for (label, args) in [
        ("off", vec!["--preload", "none", "--preload-learn", "false"]),
        ("default", vec![]),
    ] {
        let mut all = vec!["--pool-size", "2"];
        all.extend(args.iter().copied());
        let (mut server, pid, url, scratch) = start_serve(&all, label).await;
        tokio::time::sleep(Duration::from_secs(8)).await; // the pool fills
        costs.push((label, pool_cost(pid)));
        let codes: Vec<&str> = PRELOAD_CODES.iter().map(|(_, c)| *c).collect();
        let stats = interleaved(&url, &codes, samples).await;
        let base = stats[0].map(|s| ms(s.median));
        for (i, (name, code)) in PRELOAD_CODES.iter().enumerate() {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (rate, failed) = code_throughput(&url, code, runs, 4).await;
            let (p50, p95) = stats[i]
                .map(|s| (ms(s.median), ms(s.p95)))
                .unwrap_or((f64::NAN, f64::NAN));
            println!(
                "| {label} | {name} | {p50:.1} | {p95:.1} | {:.1} | {rate:.1} | {failed} |",
                base.map(|b| p50 / b).unwrap_or(f64::NAN)
            );
        }
        if label == "default" {
            // Learned preloads: scipy is on no list; after runs import it the pool
            // preloads it.
            let c = client(&url).await;
            let mut before = Vec::new();
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                before.push(execute_code(&c, LEARNED_CODE).await.expect("call"));
            }
            tokio::time::sleep(Duration::from_secs(8)).await; // refilled with the learned list
            let mut after = Vec::new();
            for _ in 0..samples {
                tokio::time::sleep(Duration::from_millis(500)).await;
                after.push(execute_code(&c, LEARNED_CODE).await.expect("call"));
            }
            let _ = c.cancel().await;
            for (when, lat) in [("first 5 runs", before), ("after learning", after)] {
                if let Some(s) = Stats::of(lat) {
                    println!(
                        "| learned | `import scipy.stats` ({when}) | {:.1} | {:.1} | {:.1} | | |",
                        ms(s.median),
                        ms(s.p95),
                        base.map(|b| ms(s.median) / b).unwrap_or(f64::NAN)
                    );
                }
            }
            tokio::time::sleep(Duration::from_secs(8)).await;
            costs.push(("default + learned scipy", pool_cost(pid)));
        }
        sigterm(pid);
        let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
        let _ = std::fs::remove_dir_all(&scratch);
    }
    println!("\n| preload | refill CPU s per sandbox | pool memory MiB per sandbox | containers measured |");
    println!("| --- | --- | --- | --- |");
    for (label, cost) in costs {
        match cost {
            Some((cpu, mem, n)) => println!("| {label} | {cpu:.2} | {mem:.1} | {n} |"),
            None => println!("| {label} | n/a | n/a | 0 |"),
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
