//! Traces (issue 45): the bench rows. `BENCH_ONLY=traces cargo bench --bench execute`
//! prints them alone; a plain `cargo bench --bench execute` prints them after the others.
//!
//! Three real `serve` processes side by side, the same pool size, traces off, exporting to
//! a collector that answers at once, and exporting to a black hole (it takes the connection
//! and never answers): `execute_code` `print(1)` through the rmcp client, the three servers
//! called in turn so that the machine's load falls on all alike, at three loads (one client
//! a call every 300 ms, one client back to back, four clients at once). p50 and p95 of each
//! and their ratio to traces off: export must never slow a call. Back to back and four at
//! once, each call takes a fresh sandbox and the pools run dry: cold starts, not export,
//! then set the figures. The same loads again as `execute_python` cells (each client one
//! session, opened before the timed calls) take sandbox starts out of the calls, so what
//! export costs a call shows (each cell is a trace of the same spans).
//!
//! The collector here only answers `200 {}` to each POST (what the spans contain is the
//! test's business: `tests/suite/traces.rs` decodes them with `opentelemetry-proto`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Calls per server and load (one-shot runs; cells: twice as many).
const CALLS: usize = 30;

/// A collector that answers each HTTP/1.1 POST `200 {}` once its body is read.
async fn collector() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16384];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + 4 + len {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..end + 4 + len);
                    let reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if s.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A collector that takes connections and never answers.
async fn black_hole() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    port
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub async fn rows() {
    let answer = collector().await;
    let hole = black_hole().await;
    let endpoint = |port: u16| format!("http://127.0.0.1:{port}");
    let (on_url, hole_url) = (endpoint(answer), endpoint(hole));
    let setups: [(&str, Vec<&str>); 3] = [
        ("off", vec!["--pool-size", "2"]),
        ("on", vec!["--pool-size", "2", "--otlp-endpoint", &on_url]),
        (
            "black hole",
            vec!["--pool-size", "2", "--otlp-endpoint", &hole_url],
        ),
    ];
    let mut servers = Vec::new();
    for (name, args) in &setups {
        let tag = format!("traces-{}", name.replace(' ', "-"));
        servers.push(super::start_serve(args, &tag).await);
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // the pools fill
    let urls: Vec<String> = servers.iter().map(|s| s.2.clone()).collect();

    println!("\n## Traces: `execute_code` `print(1)` with export off, on, and to a black hole\n");
    println!("| load | off p50 / p95 ms | on p50 / p95 ms | black hole p50 / p95 ms | on ÷ off p50 | hole ÷ off p50 |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (label, tool, calls, clients, gap) in [
        (
            "1 client, a call every 300 ms",
            "execute_code",
            CALLS,
            1usize,
            300u64,
        ),
        ("1 client, back to back", "execute_code", CALLS, 1, 0),
        ("4 clients at once", "execute_code", CALLS, 4, 0),
        (
            "cells: 1 client, back to back",
            "execute_python",
            2 * CALLS,
            1,
            0,
        ),
        (
            "cells: 4 clients at once",
            "execute_python",
            2 * CALLS,
            4,
            0,
        ),
    ] {
        let mut lat: [Vec<Duration>; 3] = Default::default();
        let mut conns = Vec::new();
        for url in &urls {
            let mut cs = Vec::new();
            for _ in 0..clients {
                let c = super::client(url).await;
                // The warm-up call (a cell: it opens the client's session).
                super::call_tool(&c, tool, super::bench::CODE)
                    .await
                    .expect("warm-up call");
                cs.push(c);
            }
            conns.push(cs);
        }
        for _ in 0..calls / clients {
            for (cs, l) in conns.iter().zip(lat.iter_mut()) {
                let each = cs
                    .iter()
                    .map(|c| super::call_tool(c, tool, super::bench::CODE));
                for r in futures::future::join_all(each).await {
                    l.push(r.expect("call"));
                }
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
        }
        for cs in conns {
            for c in cs {
                let _ = c.cancel().await;
            }
        }
        let [off, on, hole] = lat.map(|l| super::Stats::of(l).expect("figures"));
        println!(
            "| {label} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.2} | {:.2} |",
            ms(off.median),
            ms(off.p95),
            ms(on.median),
            ms(on.p95),
            ms(hole.median),
            ms(hole.p95),
            ms(on.median) / ms(off.median),
            ms(hole.median) / ms(off.median),
        );
    }
    println!(
        "load average at the end: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    for (mut server, pid, _, scratch) in servers {
        super::sigterm(pid);
        let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
