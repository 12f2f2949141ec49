//! `cargo bench --bench execute`: the whole benchmark in one run. First the engine rows of
//! `mcp-code-executor bench` (plain `docker run --rm` as the baseline, the engine with the
//! pool off and on, throughput, the Docker ceiling, a burst), then the same code through
//! a real MCP client calling `execute_code` over Streamable HTTP on a real `serve`
//! process, with that server's resident memory idle and under load.
//!
//! Knobs (environment): BENCH_SAMPLES (20), BENCH_RUNS (40), BENCH_BURST (100);
//! BENCH_ONLY=preload runs only the preloading rows (issue 15); BENCH_PAUSE_MS (500), the
//! pause between its interleaved calls. BENCH_ONLY=demand runs only the rows of preloading
//! by demand (issue 29: rates, clients, workloads, the mix, runc and gVisor); BENCH_GVISOR=0
//! leaves gVisor out of them. BENCH_ONLY=codemode runs only the code-mode row (issue 26,
//! benches/execute/codemode.rs; last in a full run).

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
    let t = Instant::now();
    let mut args = serde_json::Map::new();
    args.insert("code".into(), bench::CODE.into());
    let r = c
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
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
        demand_rows(samples).await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("codemode") {
        codemode::rows().await;
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
    demand_rows(samples).await;
    codemode::rows().await;
}

/// One `execute_code` call of `code` over MCP.
async fn execute_code(c: &RunningService<RoleClient, ()>, code: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut args = serde_json::Map::new();
    args.insert("code".into(), code.into());
    let r = c
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
        .await
        .map_err(|e| e.to_string())?;
    if r.is_error == Some(true) {
        return Err(format!("tool error: {:?}", r.content));
    }
    Ok(t.elapsed())
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

/// The figure's drawing alone, timed inside the sandbox: what the figure goal of issue 29
/// allows above `print(1)` (the figure code with a clock around its plot and show).
const DRAWING_CODE: &str =
    "import time\nimport matplotlib.pyplot as plt\nt = time.perf_counter()\n\
plt.plot([1,2,3]); plt.show()\nprint((time.perf_counter() - t) * 1000)";

/// A module the default list lacks and the image has: the learned row imports it.
const LEARNED_CODE: &str = "import scipy.stats; print(scipy.stats.norm.cdf(0))";

async fn call_code(c: &RunningService<RoleClient, ()>, code: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut args = serde_json::Map::new();
    args.insert("code".into(), code.into());
    let r = c
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
        .await
        .map_err(|e| e.to_string())?;
    let d = t.elapsed();
    if r.is_error == Some(true) {
        return Err(format!("tool error: {:?}", r.content));
    }
    Ok(d)
}

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
        call_code(&c, code).await.expect("warm-up call");
    }
    let mut lat: Vec<Vec<Duration>> = vec![Vec::new(); codes.len()];
    for _ in 0..samples {
        for (i, code) in codes.iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(knob("BENCH_PAUSE_MS", 500) as u64)).await;
            lat[i].push(call_code(&c, code).await.expect("call"));
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
            let r = call_code(&c, &code).await;
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
                before.push(call_code(&c, LEARNED_CODE).await.expect("call"));
            }
            tokio::time::sleep(Duration::from_secs(8)).await; // refilled with the learned list
            let mut after = Vec::new();
            for _ in 0..samples {
                tokio::time::sleep(Duration::from_millis(500)).await;
                after.push(call_code(&c, LEARNED_CODE).await.expect("call"));
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

// ---- Preloading by demand (issue 29): rates, clients, workloads, the mix -------------------

/// A seeded shuffle of the mix: 70 % `print(1)`, 20 % pandas, 10 % figures, `n` calls; each
/// call is (index into PRELOAD_CODES, code).
fn mix_calls(n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n)
        .map(|i| match i % 10 {
            0..=6 => 0,
            7 | 8 => 2,
            _ => 3,
        })
        .collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// One client: `calls` (indices into PRELOAD_CODES) one after another, `pause` between a
/// call's answer and the next call; latencies per code index.
async fn paced(url: &str, calls: &[usize], pause: Duration) -> Vec<Vec<Duration>> {
    let c = client(url).await;
    let mut lat = vec![Vec::new(); PRELOAD_CODES.len()];
    for &i in calls {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        match call_code(&c, PRELOAD_CODES[i].1).await {
            Ok(d) => lat[i].push(d),
            Err(e) => eprintln!("bench: call failed: {e}"),
        }
    }
    let _ = c.cancel().await;
    lat
}

/// `clients` clients at once, each `per_client` calls of code `i` with `pause` between:
/// all latencies, and calls per second over the whole.
async fn paced_clients(
    url: &str,
    i: usize,
    clients: usize,
    per_client: usize,
    pause: Duration,
) -> (Vec<Duration>, f64) {
    let t = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let url = url.to_string();
            tokio::spawn(async move { paced(&url, &vec![i; per_client], pause).await })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        if let Ok(mut l) = t.await {
            all.append(&mut l[i]);
        }
    }
    let rate = all.len() as f64 / t.elapsed().as_secs_f64();
    (all, rate)
}

fn row(
    runtime: &str,
    preload: &str,
    rate: &str,
    clients: usize,
    work: &str,
    lat: Vec<Duration>,
    cps: Option<f64>,
) {
    let n = lat.len();
    let (p50, p95) = Stats::of(lat)
        .map(|s| (format!("{:.1}", ms(s.median)), format!("{:.1}", ms(s.p95))))
        .unwrap_or_default();
    let cps = cps.map(|c| format!("{c:.1}")).unwrap_or_default();
    println!(
        "| {runtime} | {preload} | {rate} | {clients} | {work} | {n} | {p50} | {p95} | {cps} |"
    );
}

/// Where the milliseconds of a warm `print(1)` go, `n` calls 0.3 s apart on one client: the
/// client's wall time, the backend's (`duration_ms` of the result: dispatch to a waiting
/// sandbox, the job in, the runner, the result frame), and the code's own CPU inside the
/// sandbox (`cpu_ms`); the rest is the client, HTTP, MCP and the core.
async fn breakdown(url: &str, n: usize, runtime: &str) {
    let c = client(url).await;
    let (mut wall, mut backend, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut args = serde_json::Map::new();
        args.insert("code".into(), "print(1)".into());
        let t = Instant::now();
        let Ok(r) = c
            .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
            .await
        else {
            continue;
        };
        wall.push(ms(t.elapsed()));
        let s = r.structured_content.unwrap_or_default();
        if let Some(d) = s.get("duration_ms").and_then(|v| v.as_f64()) {
            backend.push(d);
        }
        if let Some(d) = s.get("cpu_ms").and_then(|v| v.as_f64()) {
            cpu.push(d);
        }
    }
    let _ = c.cancel().await;
    let (w, b, c) = (median(wall), median(backend), median(cpu));
    println!(
        "\nWhere a warm `print(1)` goes (default server, {runtime}, {n} calls 0.3 s apart, medians):\n"
    );
    println!("| part | ms |\n| --- | --- |");
    println!("| client wall time (rmcp client → HTTP → MCP → core → backend → back) | {w:.1} |");
    println!("| backend: take a waiting sandbox, job in, runner, code, result frame (`duration_ms`) | {b:.1} |");
    println!("| the code's CPU inside the sandbox (`cpu_ms`) | {c:.1} |");
    println!(
        "| client, HTTP, MCP and the core (wall − backend) | {:.1} |",
        w - b
    );
}

/// The drawing time inside the sandbox, ms: `n` calls of [`DRAWING_CODE`] 0.3 s apart, each
/// printing its own figure.
async fn drawing_ms(url: &str, n: usize) -> Vec<f64> {
    let c = client(url).await;
    let mut out = Vec::new();
    for _ in 0..n {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut args = serde_json::Map::new();
        args.insert("code".into(), DRAWING_CODE.into());
        let Ok(r) = c
            .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
            .await
        else {
            continue;
        };
        let s = r.structured_content.unwrap_or_default();
        match s
            .get("stdout")
            .and_then(|v| v.as_str())
            .map(|t| t.trim().parse::<f64>())
        {
            Some(Ok(v)) => out.push(v),
            _ => eprintln!("bench: the drawing call printed no time: {s}"),
        }
    }
    let _ = c.cancel().await;
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// [`start_serve`], tried up to 3 times: gVisor's CPU-quota self-test at start-up sometimes
/// refuses a busy machine (DESIGN.md).
async fn serve_retrying(
    all: &[&str],
    label: &str,
) -> Option<(tokio::process::Child, u32, String, std::path::PathBuf)> {
    for attempt in 0..3 {
        let args: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        let tag = format!("demand-{label}-{attempt}");
        let h = tokio::spawn(async move {
            let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            start_serve(&a, &tag).await
        });
        match h.await {
            Ok(s) => return Some(s),
            Err(_) => {
                eprintln!("bench: serve {all:?} did not start (try {attempt})");
                let tag = format!("demand-{label}-{attempt}");
                let scratch =
                    std::env::temp_dir().join(format!("mcpx-bench-{tag}-{}", std::process::id()));
                let _ = std::fs::remove_dir_all(scratch);
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    None
}

/// Is gVisor registered with the daemon?
fn gvisor_registered() -> bool {
    std::process::Command::new("docker")
        .args(["info", "--format", "{{json .Runtimes}}"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("runsc"))
        .unwrap_or(false)
}

/// The rows of issue 29: a `serve` with preloading and learning off, and one with the
/// defaults (preloading by demand), each measured the same way in this one run, under runc
/// and (when registered) gVisor.
async fn demand_rows(samples: usize) {
    let pause = Duration::from_millis(300);
    println!("\n## Preloading by demand (issue 29): `execute_code` over Streamable HTTP, `serve --pool-size 2`\n");
    println!(
        "One rmcp client session per client; \"0.3 s\" and \"2 s\" are pauses between a call's \
         answer and the next call, \"b2b\" none. Each single-workload row follows 3 \
         unmeasured calls of the same code (the pool learns what the calls need); the mix of {} calls \
         (70 % print(1), 20 % pandas, 10 % figures, seeded shuffle) follows them. {samples} \
         samples per single-workload row.\n",
        4 * samples
    );
    println!("| runtime | preload | rate | clients | workload | n | p50 ms | p95 ms | calls/s |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let mut runtimes = vec![None];
    if knob("BENCH_GVISOR", 1) == 1 && gvisor_registered() {
        runtimes.push(Some("runsc"));
    }
    let mut costs = Vec::new();
    let mut breakdown_done = false;
    // The figure goal, from this run: runc's default `print(1)` and figure at 0.3 s, and
    // the drawing timed inside the sandbox.
    let (mut print_p50, mut figure_p50, mut drawing_p50) = (f64::NAN, f64::NAN, f64::NAN);
    for runtime in runtimes {
        let rt = runtime.unwrap_or("runc");
        // Each workload on a fresh server ("preloading on with only that kind of call"), the
        // mix on another; print(1)'s server also gives the other rates and four clients.
        let workloads: Vec<Option<usize>> = if runtime.is_some() {
            vec![Some(0), Some(2)]
        } else {
            vec![Some(0), Some(1), Some(2), Some(3), None]
        };
        for work in workloads {
            for (label, args) in [
                ("off", vec!["--preload", "none", "--preload-learn", "false"]),
                ("default", vec![]),
            ] {
                let mut all = vec!["--pool-size", "2"];
                all.extend(args.iter().copied());
                if let Some(r) = runtime {
                    all.extend(["--runtime", r]);
                }
                let Some((mut server, pid, url, scratch)) = serve_retrying(&all, label).await
                else {
                    println!("| {rt} | {label} | | | serve did not start (3 tries) | | | | |");
                    continue;
                };
                tokio::time::sleep(Duration::from_secs(5)).await; // the pool fills
                match work {
                    Some(i) => {
                        // The pool learns what these calls need, then makes it.
                        paced(&url, &[i; 3], pause).await;
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        let lat = paced(&url, &vec![i; samples], pause).await;
                        if runtime.is_none() && label == "default" && (i == 0 || i == 3) {
                            let p50 = median(lat[i].iter().map(|d| ms(*d)).collect());
                            if i == 0 {
                                print_p50 = p50;
                            } else {
                                figure_p50 = p50;
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                drawing_p50 = median(drawing_ms(&url, samples / 2).await);
                            }
                        }
                        row(
                            rt,
                            label,
                            "0.3 s",
                            1,
                            PRELOAD_CODES[i].0,
                            lat[i].clone(),
                            None,
                        );
                    }
                    None => {
                        paced(&url, &mix_calls(10), pause).await;
                        let lat = paced(&url, &mix_calls(4 * samples), pause).await;
                        for i in [0, 2, 3] {
                            let name = format!("mix: {}", PRELOAD_CODES[i].0);
                            row(rt, label, "0.3 s", 1, &name, lat[i].clone(), None);
                        }
                        costs.push((label, pool_cost(pid)));
                    }
                }
                if work == Some(0) {
                    // Under gVisor too: a call that no refill runs beside (a make there
                    // takes some 0.6 s, longer than 0.3 s between calls).
                    let lat = paced(&url, &vec![0; samples / 2], Duration::from_secs(2)).await;
                    row(
                        rt,
                        label,
                        "2 s",
                        1,
                        PRELOAD_CODES[0].0,
                        lat[0].clone(),
                        None,
                    );
                }
                if work == Some(0) && runtime.is_some() && label == "default" {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    breakdown(&url, samples, rt).await;
                    println!("\n| runtime | preload | rate | clients | workload | n | p50 ms | p95 ms | calls/s |");
                    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
                }
                if work == Some(0) && runtime.is_none() {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let (lat, cps) = paced_clients(&url, 0, 1, samples, Duration::ZERO).await;
                    row(rt, label, "b2b", 1, PRELOAD_CODES[0].0, lat, Some(cps));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let (lat, cps) = paced_clients(&url, 0, 4, samples / 2, Duration::ZERO).await;
                    row(rt, label, "b2b", 4, PRELOAD_CODES[0].0, lat, Some(cps));
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let (lat, cps) = paced_clients(&url, 0, 4, samples / 2, pause).await;
                    row(rt, label, "0.3 s", 4, PRELOAD_CODES[0].0, lat, Some(cps));
                    if label == "default" && !breakdown_done {
                        breakdown_done = true;
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        breakdown(&url, samples, rt).await;
                        println!("\n| runtime | preload | rate | clients | workload | n | p50 ms | p95 ms | calls/s |");
                        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
                    }
                }
                sigterm(pid);
                let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
                let _ = std::fs::remove_dir_all(&scratch);
            }
        }
    }
    println!(
        "\nFigure against `print(1)` (runc, default, 0.3 s, p50): figure {figure_p50:.1} ms; \
         `print(1)` {print_p50:.1} + drawing inside the sandbox (`plt.plot` and `plt.show`, \
         timed by the code, {} calls) {drawing_p50:.1} = {:.1} ms: {}",
        samples / 2,
        print_p50 + drawing_p50,
        if figure_p50 <= print_p50 + drawing_p50 {
            "within"
        } else {
            "above"
        }
    );
    println!("\n| preload | refill CPU s per waiting sandbox (after the mix) | memory MiB per waiting sandbox | containers measured |");
    println!("| --- | --- | --- | --- |");
    for (label, cost) in costs {
        match cost {
            Some((cpu, mem, n)) => println!("| {label} | {cpu:.2} | {mem:.1} | {n} |"),
            None => println!("| {label} | n/a | n/a | 0 |"),
        }
    }
}
