//! Code mode (issue 26): the bench row. `BENCH_ONLY=codemode cargo bench --bench execute`
//! prints it alone; a plain `cargo bench --bench execute` prints it last.
//!
//! - A tool call proxied from the sandbox (the code's stub, the runner, this server's frame
//!   loop and policy, its rmcp client, the upstream) against the same call made straight
//!   to the upstream with an rmcp client: p50 and p95 of each, and their difference (goal:
//!   at most 2 ms at p50). Where the difference goes: a request the server refuses at once
//!   (the relay's round trip, no upstream), and this server's own time per call (its
//!   metrics: policy, its rmcp client, the upstream).
//! - One `execute_code` that makes 100 calls and prints only the answer, against 100 MCP
//!   round trips from the client to the upstream: wall time and the bytes that reached the
//!   client, with their ratios.
//!
//! The upstream is the npm `@modelcontextprotocol/server-everything` (`get-sum`) run with
//! `node`, found where the tests find it: `MCP_CODEMODE_UPSTREAMS`, else
//! `target/upstreams` (installed by `scripts/test.sh`). Missing, the bench stops with that
//! hint: it never prints a row it did not measure.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mcp_code_executor::ops::bench::Stats;
use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;
use serde_json::{json, Value};

/// Calls timed on each side for the p50 / p95.
const CALLS: usize = 200;

/// `server-everything`'s entry point, or a panic that says how to install it.
fn everything() -> PathBuf {
    let dir = std::env::var_os("MCP_CODEMODE_UPSTREAMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/upstreams"));
    let js = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        js.exists(),
        "code mode bench: {} is missing: run scripts/test.sh (it installs the upstream MCP servers under target/upstreams), or point MCP_CODEMODE_UPSTREAMS at a directory that has them",
        js.display()
    );
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(
        node.as_ref().is_ok_and(|o| o.status.success()),
        "code mode bench: `node` does not run ({node:?}): install Node.js (scripts/test.sh needs it too)"
    );
    js
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn stats_ms(v: &[f64]) -> Stats {
    Stats::of(
        v.iter()
            .map(|m| Duration::from_secs_f64(m / 1000.0))
            .collect(),
    )
    .expect("samples")
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// `execute_code` of `code` (timeout `timeout` s): the result, its wall time from the
/// client, and its size as JSON (what reached the client).
async fn execute_code(
    c: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    code: &str,
    timeout: u64,
) -> (rmcp::model::CallToolResult, Duration, usize) {
    let Value::Object(args) = json!({"code": code, "timeout": timeout}) else {
        unreachable!()
    };
    let t = Instant::now();
    let r = c
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
        .await
        .expect("execute_code answers");
    let wall = t.elapsed();
    assert_ne!(r.is_error, Some(true), "execute_code failed: {r:?}");
    let bytes = serde_json::to_vec(&r).unwrap().len();
    (r, wall, bytes)
}

/// The stdout of a report, its last line as JSON.
fn last_json(r: &rmcp::model::CallToolResult) -> Value {
    let s = r.structured_content.as_ref().expect("a structured report");
    let out = s["stdout"].as_str().unwrap_or_default();
    let line = out.lines().last().unwrap_or_else(|| {
        panic!(
            "no output; stderr:\n{}",
            s["stderr"].as_str().unwrap_or_default()
        )
    });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}\n{s}"))
}

/// `mcp_executor_tool_call_duration_seconds` of `upstream` now: (sum, count).
async fn call_seconds(base: &str, upstream: &str) -> (f64, f64) {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("/metrics answers")
        .text()
        .await
        .unwrap();
    let get = |name: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with(&format!("mcp_executor_tool_call_duration_seconds_{name}{{"))
                    && l.contains(&format!("upstream=\"{upstream}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (get("sum"), get("count"))
}

pub async fn rows() {
    let js = everything();
    let load_before = load_average();
    let scratch =
        std::env::temp_dir().join(format!("mcpx-bench-codemode-tools-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let tools = scratch.join("tools.toml");
    std::fs::write(
        &tools,
        format!(
            "[limits]\ncalls_per_run = 1000\n[[servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [{:?}]\n",
            js.display().to_string()
        ),
    )
    .unwrap();

    // Direct: an rmcp client to the upstream over stdio, as an agent without code mode
    // calls a tool: every result reaches the client.
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&js);
    let (t, _) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("server-everything starts");
    let direct = ().serve(t).await.expect("server-everything answers");
    let get_sum = |i: usize| {
        let Value::Object(args) = json!({"a": i, "b": 1}) else {
            unreachable!()
        };
        CallToolRequestParams::new("get-sum").with_arguments(args)
    };
    for i in 0..20 {
        direct.call_tool(get_sum(i)).await.expect("warm-up call");
    }
    let mut direct_ms = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let t0 = Instant::now();
        direct.call_tool(get_sum(i)).await.expect("get-sum");
        direct_ms.push(ms(t0.elapsed()));
    }
    // 100 MCP round trips from the client: wall time and bytes of the results.
    let t_direct = Instant::now();
    let mut direct_bytes = 0;
    for i in 0..100 {
        let r = direct.call_tool(get_sum(i)).await.expect("get-sum");
        direct_bytes += serde_json::to_vec(&r).unwrap().len();
    }
    let direct_wall = t_direct.elapsed();
    let _ = direct.cancel().await;

    // The server: pool of one (the 100-call run starts warm), the tools file above.
    let tools_arg = tools.display().to_string();
    let (mut server, pid, url, data) =
        super::start_serve(&["--pool-size", "1", "--tools", &tools_arg], "codemode").await;
    let base = url.trim_end_matches("/mcp").to_string();
    let c = super::client(&url).await;
    // The upstream starts at the first call of the tenant's code: before anything is timed.
    let (r, _, _) = execute_code(
        &c,
        "from tools import everything\nprint(everything.get_sum(a=0, b=0))",
        120,
    )
    .await;
    let s = r.structured_content.clone().unwrap_or_default();
    assert!(
        s["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("The sum of 0 and 0 is 0."),
        "the first proxied call: {s}"
    );
    let (sum0, n0) = call_seconds(&base, "everything").await;

    // Proxied: CALLS calls from one execute_code, each timed in the sandbox (20 first, not
    // timed); then 100 requests the server refuses at once (no such server): the relay.
    let code = format!(
        r#"
import json, time, tools
from tools import everything
for i in range(20):
    everything.get_sum(a=i, b=1)
ms, relay = [], []
for i in range({CALLS}):
    t0 = time.perf_counter()
    everything.get_sum(a=i, b=1)
    ms.append((time.perf_counter() - t0) * 1000)
for i in range(100):
    t0 = time.perf_counter()
    try:
        tools.call("nope", "x")
    except tools.ToolDenied:
        pass
    relay.append((time.perf_counter() - t0) * 1000)
print(json.dumps({{"ms": ms, "relay": relay}}))
"#
    );
    let (r, _, _) = execute_code(&c, &code, 120).await;
    let v = last_json(&r);
    let floats = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("no {k} in {v}"))
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let proxied_ms = floats("ms");
    let relay_ms = floats("relay");
    let (sum1, n1) = call_seconds(&base, "everything").await;
    assert_eq!(
        n1 - n0,
        (CALLS + 20) as f64,
        "the server counted every call"
    );
    let server_ms = (sum1 - sum0) / (n1 - n0) * 1000.0;

    // One execute_code making 100 calls and printing only the answer (the pool refilled
    // first: its sandbox is a warm one, as a served call's would be).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let answer = "from tools import everything\nprint(sum(int(everything.get_sum(a=i, b=1).split()[-1].rstrip('.')) for i in range(100)))";
    let (r, code_wall, code_bytes) = execute_code(&c, answer, 120).await;
    assert_eq!(
        r.structured_content.as_ref().unwrap()["stdout"],
        "5050\n",
        "{r:?}"
    );
    let _ = c.cancel().await;
    super::sigterm(pid);
    let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_dir_all(&scratch);
    let load_after = load_average();

    let (d, p, rl) = (
        stats_ms(&direct_ms),
        stats_ms(&proxied_ms),
        stats_ms(&relay_ms),
    );
    let (d50, d95) = (ms(d.median), ms(d.p95));
    let (p50, p95) = (ms(p.median), ms(p.p95));
    println!("\n## Code mode (issue 26): a tool call proxied from the sandbox, against the upstream called directly\n");
    println!(
        "`serve --pool-size 1 --tools` with one `@modelcontextprotocol/server-everything` over stdio; `get-sum`; \
         {CALLS} calls each side after 20 untimed; load average {load_before} before, {load_after} after\n"
    );
    println!("| path | n | p50 ms | p95 ms |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| direct: an rmcp client to the upstream | {} | {d50:.2} | {d95:.2} |",
        d.n
    );
    println!(
        "| proxied: the sandbox's stub, runner, this server, its rmcp client, the upstream (timed in the sandbox) | {} | {p50:.2} | {p95:.2} |",
        p.n
    );
    println!(
        "| **overhead** (proxied - direct) | | **{:.2}** | {:.2} |",
        p50 - d50,
        p95 - d95
    );
    println!(
        "| of which: the relay's round trip of a request refused at once (no upstream) | {} | {:.2} | {:.2} |",
        rl.n,
        ms(rl.median),
        ms(rl.p95)
    );
    println!("| this server's time per call (its metrics, mean: policy, rmcp client, upstream) | {} | {server_ms:.2} (mean) | |", n1 - n0);
    println!(
        "\ngoal: at most 2 ms over at p50: {}",
        if p50 - d50 <= 2.0 { "met" } else { "NOT met" }
    );
    println!("\n| 100 calls | wall ms | bytes to the client |");
    println!("| --- | --- | --- |");
    println!(
        "| one `execute_code` making 100 calls, printing only the answer (warm sandbox) | {:.0} | {code_bytes} |",
        ms(code_wall)
    );
    println!(
        "| 100 MCP round trips from the client to the upstream | {:.0} | {direct_bytes} |",
        ms(direct_wall)
    );
    println!(
        "| ratio (code mode / round trips) | {:.2} | {:.3} |",
        ms(code_wall) / ms(direct_wall),
        code_bytes as f64 / direct_bytes as f64
    );
}
