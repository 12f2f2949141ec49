//! Preloading by demand (issue 29): the rows of `BENCH_ONLY=demand cargo bench --bench
//! execute` (last before code mode in a full run). Rates (back to back, 0.3 s, 2 s), one and
//! four clients, the four workloads and the mix, preloading off and on, runc and gVisor; the
//! back-to-back comparison runs off and default servers side by side in alternating rounds.

use std::time::{Duration, Instant};

use mcp_code_executor::ops::bench::Stats;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::RoleClient;

use super::{
    client, execute_code, knob, median, ms, pool_cost, sigterm, start_serve, PRELOAD_CODES,
};

/// The figure's drawing alone, timed inside the sandbox: what the figure goal of issue 29
/// allows above `print(1)` (the figure code with a clock around its plot and show).
const DRAWING_CODE: &str =
    "import time\nimport matplotlib.pyplot as plt\nt = time.perf_counter()\n\
plt.plot([1,2,3]); plt.show()\nprint((time.perf_counter() - t) * 1000)";

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
        match execute_code(&c, PRELOAD_CODES[i].1).await {
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

/// One `execute_code` call of `code` on `c`, 0.3 s after the last: the client's wall time,
/// ms, and the result's structured content; `None` when the call failed.
async fn call_after_pause(
    c: &RunningService<RoleClient, ()>,
    code: &str,
) -> Option<(f64, serde_json::Value)> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut args = serde_json::Map::new();
    args.insert("code".into(), code.into());
    let t = Instant::now();
    let r = c
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
        .await
        .ok()?;
    Some((ms(t.elapsed()), r.structured_content.unwrap_or_default()))
}

/// Where the milliseconds of a warm `print(1)` go, `n` calls 0.3 s apart on one client: the
/// client's wall time, the backend's (`duration_ms` of the result: dispatch to a waiting
/// sandbox, the job in, the runner, the result frame), and the code's own CPU inside the
/// sandbox (`cpu_ms`); the rest is the client, HTTP, MCP and the core.
async fn breakdown(url: &str, n: usize, runtime: &str) {
    let c = client(url).await;
    let (mut wall, mut backend, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let Some((w, s)) = call_after_pause(&c, "print(1)").await else {
            continue;
        };
        wall.push(w);
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

/// `n` figure calls 0.3 s apart, each timing its own drawing ([`DRAWING_CODE`]: the figure
/// code with a clock around `plt.plot` and `plt.show`): per call, the drawing time inside
/// the sandbox and the client's wall time, ms.
async fn drawing_ms(url: &str, n: usize) -> Vec<(f64, f64)> {
    let c = client(url).await;
    let mut out = Vec::new();
    for _ in 0..n {
        let Some((wall, s)) = call_after_pause(&c, DRAWING_CODE).await else {
            continue;
        };
        match s
            .get("stdout")
            .and_then(|v| v.as_str())
            .map(|t| t.trim().parse::<f64>())
        {
            Some(Ok(v)) => out.push((v, wall)),
            _ => eprintln!("bench: the drawing call printed no time: {s}"),
        }
    }
    let _ = c.cancel().await;
    out
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

/// The two settings every row compares: preloading and learning off, and the defaults.
const SETTINGS: [(&str, &[&str]); 2] = [
    ("off", &["--preload", "none", "--preload-learn", "false"]),
    ("default", &[]),
];

/// Back to back under runc, one client and four: a server with preloading off and one with
/// the defaults are both up (a server whose pool is full and gets no calls uses no CPU) and
/// are measured in alternating rounds, off first in the odd rounds and default first in the
/// even ones, so that the host's drift (one setting's calls per second moved by 30 % between
/// runs of one day, and by more than the goal's 5 % within one) falls on both alike. Each
/// round gives a ratio default ÷ off for one client and for four; the goal is judged on
/// their median.
async fn back_to_back(samples: usize) {
    const ROUNDS: usize = 5;
    let mut servers = Vec::new();
    for (label, args) in SETTINGS {
        let mut all = vec!["--pool-size", "2"];
        all.extend(args.iter().copied());
        match serve_retrying(&all, &format!("b2b-{label}")).await {
            Some(s) => servers.push(s),
            None => println!("\nBack to back: serve {label} did not start (3 tries)"),
        }
    }
    if servers.len() == SETTINGS.len() {
        tokio::time::sleep(Duration::from_secs(5)).await; // the pools fill
        for (_, _, url, _) in &servers {
            paced(url, &[0; 3], Duration::from_millis(300)).await;
        }
        // [setting][one client, four clients]: latencies, and calls per second per round.
        let mut lat: [[Vec<Duration>; 2]; 2] = Default::default();
        let mut cps: [[Vec<f64>; 2]; 2] = Default::default();
        for round in 0..ROUNDS {
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for s in order {
                for (k, (clients, per_client)) in
                    [(1, samples), (4, samples / 2)].into_iter().enumerate()
                {
                    tokio::time::sleep(Duration::from_secs(2)).await; // the pool refills
                    let (l, c) =
                        paced_clients(&servers[s].2, 0, clients, per_client, Duration::ZERO).await;
                    lat[s][k].extend(l);
                    cps[s][k].push(c);
                }
            }
        }
        println!(
            "\nBack to back, runc, `print(1)`: servers off and default side by side, {ROUNDS} \
             alternating rounds of {samples} calls on one client and {} on four; calls/s is \
             the median of the rounds.\n",
            4 * (samples / 2)
        );
        println!(
            "| runtime | preload | rate | clients | workload | n | p50 ms | p95 ms | calls/s |"
        );
        println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
        for (s, (label, _)) in SETTINGS.iter().enumerate() {
            for (k, clients) in [1, 4].into_iter().enumerate() {
                let rate = median(cps[s][k].clone());
                row(
                    "runc",
                    label,
                    "b2b",
                    clients,
                    PRELOAD_CODES[0].0,
                    std::mem::take(&mut lat[s][k]),
                    Some(rate),
                );
            }
        }
        println!();
        for (k, clients) in [1, 4].into_iter().enumerate() {
            let ratios: Vec<f64> = (0..ROUNDS).map(|r| cps[1][k][r] / cps[0][k][r]).collect();
            let m = median(ratios.clone());
            let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            println!(
                "Back to back, {clients} client(s): default ÷ off calls/s by round {}; median \
                 {m:.2}: goal ≥ 0.95 {}",
                shown.join(", "),
                if m >= 0.95 { "met" } else { "missed" }
            );
        }
    }
    for (mut server, pid, _, scratch) in servers {
        sigterm(pid);
        let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
        let _ = std::fs::remove_dir_all(&scratch);
    }
}

/// The rows of issue 29: a `serve` with preloading and learning off, and one with the
/// defaults (preloading by demand), each measured the same way in this one run, under runc
/// and (when registered) gVisor.
pub(crate) async fn rows(samples: usize) {
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
    let (mut print_p50, mut figure_p50) = (f64::NAN, f64::NAN);
    let mut drawings = Vec::new();
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
            for (label, args) in SETTINGS {
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
                                drawings = drawing_ms(&url, samples).await;
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
    back_to_back(samples).await;
    let drawing_p50 = median(drawings.iter().map(|d| d.0).collect());
    let above_drawing = median(drawings.iter().map(|d| d.1 - d.0).collect());
    let verdict = |met: bool| if met { "within" } else { "above" };
    println!(
        "\nFigure against `print(1)` (runc, default, 0.3 s, p50): figure {figure_p50:.1} ms; \
         `print(1)` {print_p50:.1} + drawing inside the sandbox (`plt.plot` and `plt.show`, \
         timed by the code, {} figure calls) {drawing_p50:.1} = {:.1} ms: {}. The same \
         figure calls one by one: wall time less that call's own drawing, median \
         {above_drawing:.1} ms against `print(1)`'s {print_p50:.1}: {}",
        drawings.len(),
        print_p50 + drawing_p50,
        verdict(figure_p50 <= print_p50 + drawing_p50),
        verdict(above_drawing <= print_p50),
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
