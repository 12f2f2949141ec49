//! Traces (docs/hosting.md "Traces"): a real OTLP receiver built on the OpenTelemetry
//! project's own protobuf definitions (`tests/sdk/traces.py receive`: every body decoded
//! strictly into `ExportTraceServiceRequest` from PyPI `opentelemetry-proto`) and the
//! official MCP Python SDK as the client, with `opentelemetry-sdk` making its span and
//! putting `traceparent` into the request's `_meta`. One `execute_code` gives one trace
//! under the client's trace id, with the server span a child of the SDK's span and the
//! queue, sandbox and shaping spans its children; nothing exported quotes the code or its
//! output. And a collector that never answers does not slow calls, while the spans it does
//! not take are counted as dropped. The Python packages come from `scripts/test.sh`
//! (`target/otel-py`); without them this test fails and says how to make them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common;
use crate::mcp_support::{self, call, text};
use mcp_code_executor::config::traces::TraceConfig;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/traces.py");

/// The venv with `mcp`, `opentelemetry-sdk` and `opentelemetry-proto`.
fn otel_python() -> PathBuf {
    let p = std::env::var_os("MCP_OTEL_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/otel-py/bin/python"));
    let ok = std::process::Command::new(&p)
        .args([
            "-c",
            "import mcp, opentelemetry.sdk.trace, opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the OpenTelemetry test venv is needed at {}: run scripts/test.sh, or `python3 -m venv target/otel-py && \
         target/otel-py/bin/pip install mcp==2.3.0 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2`",
        p.display()
    );
    p
}

/// The receiver: its process (killed when dropped) and its port.
async fn receiver(dir: &Path) -> (tokio::process::Child, u16) {
    let mut child = tokio::process::Command::new(otel_python())
        .args([SCRIPT, "receive"])
        .arg(dir)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the receiver starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the receiver says its port within 30 s")
        .unwrap()
        .expect("a port line")
        .trim()
        .parse()
        .expect("a port");
    (child, port)
}

fn spans_of(dir: &Path, trace_id: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join("spans.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|s| s["trace_id"] == trace_id)
        .collect()
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics:\n{body}"))
}

#[tokio::test]
async fn a_call_from_the_official_sdk_continues_the_clients_trace() {
    let tenant = "t-traces";
    let _clean = common::remove_on_drop(tenant);
    let dir = std::env::temp_dir().join(format!("mcpx-traces-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let _dirs = common::TempDirs(vec![dir.clone()]);
    let (_receiver, port) = receiver(&dir).await;
    let server = mcp_support::server_configured(tenant, |s| {
        s.traces = TraceConfig {
            endpoint: Some(format!("http://127.0.0.1:{port}/v1/traces")),
            service_name: "traces-test".into(),
            schedule_delay: Duration::from_millis(100),
            ..TraceConfig::default()
        };
    })
    .await;
    let marker = format!("secret-marker-{}", uuid::Uuid::new_v4().simple());
    let out = tokio::process::Command::new(otel_python())
        .args([SCRIPT, "call", &server.url("/mcp"), &marker])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let client: Value = serde_json::from_slice(&out.stdout).expect("the client's JSON line");
    assert_eq!(client["version"], "2026-07-28", "{client}");
    assert!(
        client["text"].as_str().unwrap().contains(&marker),
        "{client}"
    );
    let trace_id = client["trace_id"].as_str().unwrap().to_string();
    let expected = [
        "tools/call execute_code",
        "executor.queue",
        "sandbox.take",
        "sandbox.run",
        "result.shape",
    ];
    // Batches go out every 100 ms: wait until every expected span arrived.
    let waited = Instant::now();
    let spans = loop {
        let spans = spans_of(&dir, &trace_id);
        let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
        if expected.iter().all(|e| names.contains(e)) {
            break spans;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "after 20 s the receiver has only {names:?} of trace {trace_id}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let errors = std::fs::read_to_string(dir.join("errors.txt")).unwrap_or_default();
    assert!(
        errors.is_empty(),
        "bodies the receiver could not decode: {errors}"
    );
    // One server span, the child of the SDK's span, with the MCP conventions' attributes.
    let roots: Vec<&Value> = spans
        .iter()
        .filter(|s| s["name"] == "tools/call execute_code")
        .collect();
    assert_eq!(roots.len(), 1, "{spans:#?}");
    let root = roots[0];
    assert_eq!(root["parent_span_id"], client["parent_span_id"], "{root}");
    assert_eq!(root["kind"], 2, "a server span: {root}");
    assert_eq!(root["service"], "traces-test");
    let a = &root["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call", "{root}");
    assert_eq!(a["gen_ai.tool.name"], "execute_code", "{root}");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool", "{root}");
    assert_eq!(a["mcp_executor.tenant"], tenant, "{root}");
    // The work inside it: its children, in time within it.
    for name in &expected[1..] {
        let s = spans
            .iter()
            .find(|s| s["name"] == *name)
            .unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(s["parent_span_id"], root["span_id"], "{name}: {s}");
        assert!(
            s["start"].as_u64() >= root["start"].as_u64()
                && s["end"].as_u64() <= root["end"].as_u64(),
            "{name} lies outside its parent: {s} {root}"
        );
    }
    let run = spans.iter().find(|s| s["name"] == "sandbox.run").unwrap();
    assert_eq!(run["attributes"]["process.exit.code"], 0, "{run}");
    let take = spans.iter().find(|s| s["name"] == "sandbox.take").unwrap();
    assert_eq!(
        take["attributes"]["mcp_executor.sandbox.warm"], false,
        "no pool: {take}"
    );
    // Nothing exported quotes the code or its output: not a span, not a byte of a body.
    let bodies = std::fs::read_to_string(dir.join("bodies.jsonl")).unwrap();
    assert!(
        !bodies.contains(&marker),
        "an exported body quotes the code or its output"
    );
    assert!(
        !bodies.contains("secret-marker"),
        "an exported body quotes the code"
    );
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&metrics, "mcp_executor_trace_spans_exported_total") >= 5);
    assert_eq!(
        metric(&metrics, "mcp_executor_trace_spans_dropped_total"),
        0
    );
    server.finish().await;
}

/// The median of `v`, in ms.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::test]
async fn a_collector_that_never_answers_slows_no_call_and_drops_are_counted() {
    let tenant = "t-traces-hole";
    let _clean = common::remove_on_drop(tenant);
    // A black hole: takes connections and never answers.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            held.push(s);
        }
    });
    let off = mcp_support::server_configured(&format!("{tenant}-off"), |_| {}).await;
    let _clean_off = common::remove_on_drop(&format!("{tenant}-off"));
    let on = mcp_support::server_configured(tenant, |s| {
        s.traces = TraceConfig {
            endpoint: Some(format!("http://127.0.0.1:{hole_port}/v1/traces")),
            schedule_delay: Duration::from_millis(20),
            queue_size: 8,
            ..TraceConfig::default()
        };
    })
    .await;
    let (c_off, c_on) = (off.client().await, on.client().await);
    let code = json!({"code": "print(1)"});
    let (mut t_off, mut t_on) = (Vec::new(), Vec::new());
    // Alternated, so that the machine's load falls on both alike; a first call each warms up.
    for i in 0..9 {
        for (c, t) in [(&c_off, &mut t_off), (&c_on, &mut t_on)] {
            let t0 = Instant::now();
            let r = call(c, "execute_code", code.clone()).await;
            assert_eq!(r.is_error, Some(false), "{}", text(&r));
            if i > 0 {
                t.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    let (m_off, m_on) = (median(t_off.clone()), median(t_on.clone()));
    eprintln!(
        "traces off: median {m_off:.1} ms {t_off:?}; to a black hole: median {m_on:.1} ms {t_on:?}"
    );
    assert!(
        m_on <= m_off * 1.5 + 50.0,
        "calls with a black-hole collector took {m_on:.1} ms (median) against {m_off:.1} ms with traces off"
    );
    let metrics = reqwest::get(on.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // 9 calls of 5 spans or more, a queue of 8, the first batch stuck in its send: most are
    // dropped, and counted.
    let dropped = metric(&metrics, "mcp_executor_trace_spans_dropped_total");
    assert!(
        dropped >= 20,
        "only {dropped} spans counted as dropped:\n{metrics}"
    );
    assert_eq!(
        metric(&metrics, "mcp_executor_trace_spans_exported_total"),
        0
    );
    let off_metrics = reqwest::get(off.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !off_metrics.contains("mcp_executor_trace_"),
        "a server without traces reports no trace counters"
    );
    drop((c_off, c_on));
    off.finish().await;
    on.finish().await;
    holder.abort();
}
