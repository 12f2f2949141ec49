//! Egress by policy (issue 41): the bench rows. `BENCH_ONLY=egress cargo bench --bench
//! execute` prints them alone; a plain `cargo bench --bench execute` prints them last.
//!
//! A real HTTPS server on 127.0.0.1 (`tests/egress/tls_server.py`, its own test CA) stands
//! in for a host of the internet; a real `serve --egress FILE` lets its sandboxes reach it
//! by name. The same Python (`requests`, a fresh session each time: connection, TLS
//! handshake, GET) runs inside a sandbox, through its runner (over the sandbox's own socket
//! under runc, else the runner's relay) and the server's proxy, and on the host straight to
//! the server:
//!
//! - a fresh HTTPS GET at three loads: one client back to back, one client five per second,
//!   four clients at once (four `execute_code` calls against four host processes): p50 and
//!   p95 of each side and what the way out adds (goal: at most 10 ms at p50);
//! - a 200 MB download, streamed: MB/s of each side and their ratio (goal: at least half
//!   the host's own), the median of five, and of each download's ratio to the host's
//!   right after it.
//!
//! The Python with `requests` and `cryptography` is `MCP_EGRESS_PYTHON`, else
//! `target/egress-py` (installed by `scripts/test.sh`); missing, the bench stops with that
//! hint: it never prints a row it did not measure.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// GETs timed by each client of a row.
const ROUNDS: usize = 40;
/// The download's size, and how many times each side downloads it.
const DOWNLOAD_BYTES: u64 = 200_000_000;
const DOWNLOADS: usize = 5;

fn python() -> PathBuf {
    let p = std::env::var_os("MCP_EGRESS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/egress-py/bin/python")
        });
    let ok = std::process::Command::new(&p)
        .args(["-c", "import requests, cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "egress bench: no Python with requests and cryptography at {}: run scripts/test.sh \
         (it makes target/egress-py), or point MCP_EGRESS_PYTHON at one",
        p.display()
    );
    p
}

/// Timing code: `rounds` fresh GETs of `url`, `gap` seconds apart; prints the
/// milliseconds of each as JSON.
fn gets(url: &str, rounds: usize, gap: f64) -> String {
    format!(
        r#"
import json, time, requests
ms = []
for _ in range({rounds}):
    t = time.perf_counter()
    with requests.Session() as s:
        assert s.get('{url}', timeout=20).status_code == 200
    ms.append((time.perf_counter() - t) * 1000)
    time.sleep({gap})
print(json.dumps(ms))
"#
    )
}

/// Download code: `DOWNLOAD_BYTES` from `url`, streamed; prints MB/s.
fn download(url: &str) -> String {
    format!(
        r#"
import time, requests
n, got = {DOWNLOAD_BYTES}, 0
t = time.perf_counter()
with requests.get('{url}/big={DOWNLOAD_BYTES}', stream=True, timeout=60) as r:
    for chunk in r.iter_content(1 << 20):
        got += len(chunk)
s = time.perf_counter() - t
assert got >= n, got
print(got / s / 1e6)
"#
    )
}

/// The sandbox trusts the test CA, as a user's code would trust a private CA.
fn trusting(ca: &str) -> String {
    format!(
        "import os\nopen('/tmp/ca.pem', 'w').write({ca:?})\n\
         os.environ['SSL_CERT_FILE'] = os.environ['REQUESTS_CA_BUNDLE'] = '/tmp/ca.pem'\n"
    )
}

/// `code` in a sandbox through `url`'s `execute_code`: its stdout (panics on a failure).
async fn in_sandbox(url: &str, code: String) -> String {
    let c = super::client(url).await;
    let mut args = serde_json::Map::new();
    args.insert("code".into(), code.into());
    args.insert("timeout".into(), 300.into());
    let r = c
        .call_tool(CallToolRequestParams::new("execute_code").with_arguments(args))
        .await
        .expect("execute_code answers");
    let _ = c.cancel().await;
    let s = r.structured_content.unwrap_or(Value::Null);
    assert!(
        r.is_error != Some(true) && s["exit_code"] == 0,
        "egress bench: the sandbox's code failed: {s}"
    );
    s["stdout"].as_str().unwrap_or_default().to_string()
}

/// `code` on the host's Python, trusting `ca`: its stdout.
async fn on_host(python: &PathBuf, ca: &str, code: String) -> String {
    let out = tokio::process::Command::new(python)
        .args(["-c", &code])
        .env("SSL_CERT_FILE", ca)
        .env("REQUESTS_CA_BUNDLE", ca)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .output()
        .await
        .expect("python runs");
    assert!(
        out.status.success(),
        "egress bench: the host's code failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn millis(out: &str) -> Vec<Duration> {
    serde_json::from_str::<Vec<f64>>(out.trim().lines().last().unwrap_or("[]"))
        .expect("a list of milliseconds")
        .into_iter()
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub async fn rows() {
    let python = python();
    let dir = std::env::temp_dir().join(format!("mcpx-bench-egress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut upstream = tokio::process::Command::new(&python)
        .args(["-c", include_str!("../../tests/egress/tls_server.py")])
        .arg(&dir)
        .arg("data.example.test")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the HTTPS server starts");
    let mut first = BufReader::new(upstream.stdout.take().unwrap()).lines();
    let port: u16 = first
        .next_line()
        .await
        .unwrap()
        .expect("the HTTPS server prints its port")
        .trim()
        .parse()
        .unwrap();
    let ca_file = dir.join("ca.pem");
    let ca_path = ca_file.to_str().unwrap().to_string();
    let ca = std::fs::read_to_string(&ca_file).unwrap();
    let policy = dir.join("egress.toml");
    std::fs::write(
        &policy,
        format!(
            "# Four clients back to back open more than the default 20 a second.\n\
             [limits]\nconnections_per_second = 200\n\n\
             [resolve]\n\"data.example.test\" = \"127.0.0.1\"\n\n\
             [[rules]]\nhost = \"data.example.test\"\nports = [{port}]\n\n\
             # Loopback is refused unless a rule names it: the stand-in lives there.\n\
             [[rules]]\nhost = \"127.0.0.1\"\nports = [{port}]\n"
        ),
    )
    .unwrap();
    let (mut server, pid, url, scratch) = super::start_serve(
        &["--pool-size", "4", "--egress", policy.to_str().unwrap()],
        "egress",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // the pool fills
    let through = format!("https://data.example.test:{port}");
    let direct = format!("https://127.0.0.1:{port}");
    in_sandbox(&url, format!("{}{}", trusting(&ca), gets(&through, 2, 0.0))).await; // warm-up

    println!(
        "\n## Egress: a fresh HTTPS GET from the sandbox through the proxy, and from the host\n"
    );
    println!(
        "| load | n | sandbox p50 ms | sandbox p95 ms | host p50 ms | host p95 ms | added p50 ms | added p95 ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (label, clients, gap) in [
        ("1 client, back to back", 1usize, 0.0),
        ("1 client, 5 per second", 1, 0.2),
        ("4 clients at once", 4, 0.0),
    ] {
        let rounds = if clients == 1 { ROUNDS } else { ROUNDS / 2 };
        let mut sandbox = Vec::new();
        let runs = (0..clients).map(|_| {
            in_sandbox(
                &url,
                format!("{}{}", trusting(&ca), gets(&through, rounds, gap)),
            )
        });
        for out in futures::future::join_all(runs).await {
            sandbox.extend(millis(&out));
        }
        let mut host = Vec::new();
        let runs = (0..clients).map(|_| on_host(&python, &ca_path, gets(&direct, rounds, gap)));
        for out in futures::future::join_all(runs).await {
            host.extend(millis(&out));
        }
        let (s, h) = (
            super::Stats::of(sandbox).expect("sandbox figures"),
            super::Stats::of(host).expect("host figures"),
        );
        println!(
            "| {label} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:+.1} | {:+.1} |",
            rounds * clients,
            ms(s.median),
            ms(s.p95),
            ms(h.median),
            ms(h.p95),
            ms(s.median) - ms(h.median),
            ms(s.p95) - ms(h.p95),
        );
    }

    let mut sandbox = Vec::new();
    let mut host = Vec::new();
    for _ in 0..DOWNLOADS {
        let out = in_sandbox(&url, format!("{}{}", trusting(&ca), download(&through))).await;
        sandbox.push(out.trim().parse::<f64>().expect("MB/s"));
        let out = on_host(&python, &ca_path, download(&direct)).await;
        host.push(out.trim().parse::<f64>().expect("MB/s"));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // Each sandbox download beside the host's right after it: the machine's speed drifts
    // (the host's own figure moved 870 to 1,230 MB/s between runs), a pair shares it.
    let mut ratios: Vec<f64> = sandbox.iter().zip(&host).map(|(s, h)| s / h).collect();
    let (s, h, r) = (median(&mut sandbox), median(&mut host), median(&mut ratios));
    println!(
        "\n200 MB HTTPS download, median of {DOWNLOADS}: sandbox through the proxy {s:.0} MB/s, host direct {h:.0} MB/s ({:.0} % of the host's; median of the {DOWNLOADS} pairs' ratios {:.0} %, range {:.0}-{:.0} %)",
        100.0 * s / h,
        100.0 * r,
        100.0 * ratios[0],
        100.0 * ratios[ratios.len() - 1],
    );
    println!(
        "load average at the end: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );

    super::sigterm(pid);
    let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
    let _ = upstream.kill().await;
    let _ = std::fs::remove_dir_all(&scratch);
    let _ = std::fs::remove_dir_all(&dir);
}
