//! Traces (docs/hosting.md "Traces"): a real OTLP receiver built on the OpenTelemetry
//! project's own protobuf definitions (`tests/sdk/traces.py receive`: every body decoded
//! strictly into `ExportTraceServiceRequest` from PyPI `opentelemetry-proto`) and the
//! official MCP Python SDK as the client, with `opentelemetry-sdk` making its span and
//! putting `traceparent` into the request's `_meta`. One `execute_code` gives one trace
//! under the client's trace id, with the server span a child of the SDK's span and the
//! queue, sandbox and shaping spans its children (a raw request with the HTTP header
//! `traceparent` instead is continued too); a code-mode call adds its own span under
//! the run and the client span of the upstream request under that; nothing exported quotes
//! the code, its output or a tool's arguments. And a collector that never answers does not
//! slow calls, while the spans it does not take are counted as dropped; a server stopped by
//! SIGTERM sends the spans it still holds. The Python packages
//! come from `scripts/test.sh` (`target/otel-py`); without them these tests fail and say how
//! to make them.

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

/// A receiver writing into a temporary directory: its process (killed when dropped), its
/// port and the directory (removed when dropped).
pub(crate) struct Receiver {
    _child: tokio::process::Child,
    pub(crate) port: u16,
    pub(crate) dir: PathBuf,
    _dirs: common::TempDirs,
}

pub(crate) async fn receiver() -> Receiver {
    let dir = std::env::temp_dir().join(format!("mcpx-traces-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let dirs = common::TempDirs(vec![dir.clone()]);
    let mut child = tokio::process::Command::new(otel_python())
        .args([SCRIPT, "receive"])
        .arg(&dir)
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
    Receiver {
        _child: child,
        port,
        dir,
        _dirs: dirs,
    }
}

impl Receiver {
    fn traces_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1/traces", self.port)
    }

    fn spans_of(&self, trace_id: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("spans.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .filter(|s| s["trace_id"] == trace_id)
            .collect()
    }
}

fn metric(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics:\n{body}"))
}

async fn metrics(url: String) -> String {
    reqwest::get(url).await.unwrap().text().await.unwrap()
}

/// The spans every `execute_code` has: the server span's children.
const CALL_SPANS: [&str; 5] = [
    "executor.admit",
    "executor.queue",
    "sandbox.take",
    "sandbox.run",
    "result.shape",
];

pub(crate) fn named<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span {name} in {spans:#?}"))
}

/// Run the SDK client (`tests/sdk/traces.py ARGS`): its JSON line, checked: the call was
/// answered in 2026-07-28 and its text has `marker`.
pub(crate) async fn sdk_client(args: &[&str], marker: &str) -> Value {
    sdk_client_in(args, marker, "2026-07-28").await
}

/// [`sdk_client`], the call answered in protocol `version`.
async fn sdk_client_in(args: &[&str], marker: &str, version: &str) -> Value {
    let out = tokio::process::Command::new(otel_python())
        .arg(SCRIPT)
        .args(args)
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
    assert_eq!(client["version"], version, "{client}");
    assert!(
        client["text"].as_str().unwrap().contains(marker),
        "{client}"
    );
    client
}

impl Receiver {
    /// Every span of `trace_id` once those named `expected` all arrived (within `limit`),
    /// checked: every body decoded, none quoting `marker` (the code, its output, the
    /// arguments it passes on), one span of each expected name.
    pub(crate) async fn wait_for(
        &self,
        trace_id: &str,
        expected: &[&str],
        marker: &str,
        limit: Duration,
    ) -> Vec<Value> {
        let waited = Instant::now();
        let spans = loop {
            let spans = self.spans_of(trace_id);
            let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
            if expected.iter().all(|e| names.contains(e)) {
                break spans;
            }
            assert!(
                waited.elapsed() < limit,
                "after {limit:?} the receiver has only {names:?} of trace {trace_id}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let errors = std::fs::read_to_string(self.dir.join("errors.txt")).unwrap_or_default();
        assert!(
            errors.is_empty(),
            "bodies the receiver could not decode: {errors}"
        );
        for name in expected {
            let n = spans.iter().filter(|s| s["name"] == *name).count();
            assert_eq!(n, 1, "{n} spans {name} in {spans:#?}");
        }
        // Nothing exported quotes the code or its output: not a span, not a byte of a body.
        let bodies = std::fs::read_to_string(self.dir.join("bodies.jsonl")).unwrap();
        assert!(
            !bodies.contains(marker),
            "an exported body quotes the code, its output or its arguments"
        );
        spans
    }
}

/// Check `root` is the server span of a `tools/call` of `tool`, the child of the SDK's span
/// `client` names, with the MCP conventions' attributes.
pub(crate) fn check_root(root: &Value, client: &Value, tool: &str) {
    assert_eq!(root["name"], format!("tools/call {tool}"), "{root}");
    assert_eq!(root["parent_span_id"], client["parent_span_id"], "{root}");
    assert_eq!(root["trace_id"], client["trace_id"], "{root}");
    assert_eq!(root["kind"], 2, "a server span: {root}");
    let a = &root["attributes"];
    assert_eq!(a["mcp.method.name"], "tools/call", "{root}");
    assert_eq!(a["gen_ai.tool.name"], tool, "{root}");
    assert_eq!(a["gen_ai.operation.name"], "execute_tool", "{root}");
}

/// One `execute_code` of `code` (default: a print of `marker`) from the SDK client to `url`:
/// every span of its trace once the server span, [`CALL_SPANS`] and `more` arrived at `rx`,
/// and the server span, checked ([`check_root`]), its [`CALL_SPANS`] children within it in
/// time.
async fn traced_call(
    rx: &Receiver,
    url: &str,
    marker: &str,
    code: Option<&str>,
    more: &[&str],
) -> (Vec<Value>, Value) {
    let mut args = vec!["call", url, marker];
    args.extend(code);
    let client = sdk_client(&args, marker).await;
    let trace_id = client["trace_id"].as_str().unwrap();
    let root_name = "tools/call execute_code";
    let expected: Vec<&str> = [root_name]
        .iter()
        .chain(&CALL_SPANS)
        .chain(more)
        .copied()
        .collect();
    let spans = rx
        .wait_for(trace_id, &expected, marker, Duration::from_secs(20))
        .await;
    let root = named(&spans, root_name).clone();
    check_root(&root, &client, "execute_code");
    for name in CALL_SPANS {
        let s = named(&spans, name);
        assert_eq!(s["parent_span_id"], root["span_id"], "{name}: {s}");
        assert!(
            s["start"].as_u64() >= root["start"].as_u64()
                && s["end"].as_u64() <= root["end"].as_u64(),
            "{name} lies outside its parent: {s} {root}"
        );
    }
    (spans, root)
}

fn traces_to(rx: &Receiver) -> TraceConfig {
    TraceConfig {
        endpoint: Some(rx.traces_url()),
        service_name: "traces-test".into(),
        schedule_delay: Duration::from_millis(100),
        ..TraceConfig::default()
    }
}

#[tokio::test]
async fn a_call_from_the_official_sdk_continues_the_clients_trace() {
    let tenant = "t-traces";
    let _clean = common::remove_on_drop(tenant);
    let rx = receiver().await;
    let server = mcp_support::server_configured(tenant, |s| s.traces = traces_to(&rx)).await;
    let marker = format!("secret-marker-{}", uuid::Uuid::new_v4().simple());
    let (spans, root) = traced_call(&rx, &server.url("/mcp"), &marker, None, &RUNNER_PHASES).await;
    assert_eq!(root["service"], "traces-test");
    assert_eq!(root["attributes"]["mcp_executor.tenant"], tenant, "{root}");
    assert_eq!(root["status"], 0, "{root}");
    let run = named(&spans, "sandbox.run");
    assert_eq!(run["attributes"]["process.exit.code"], 0, "{run}");
    let take = named(&spans, "sandbox.take");
    assert_eq!(
        take["attributes"]["mcp_executor.sandbox.warm"], false,
        "no pool: {take}"
    );
    assert!(take["attributes"]["mcp_executor.pool"].is_null(), "{take}");
    within_the_run(&spans, &RUNNER_PHASES);
    // The SDK's legacy mode (2025-11-25, over a protocol session): its trace goes on here too.
    let legacy = sdk_client_in(
        &["legacy", &server.url("/mcp"), &marker],
        &marker,
        "2025-11-25",
    )
    .await;
    let name = "tools/call execute_code";
    let spans = rx
        .wait_for(
            legacy["trace_id"].as_str().unwrap(),
            &[name, "sandbox.run"],
            &marker,
            Duration::from_secs(20),
        )
        .await;
    check_root(named(&spans, name), &legacy, "execute_code");
    // A client that sends the trace context as the HTTP header (no `_meta` traceparent):
    // a raw 2026-07-28 request of a tool that starts no sandbox.
    let (trace_id, parent) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let answer = raw_call(
        &server.url("/mcp"),
        "get_environment_config",
        json!({}),
        json!({}),
        &format!("00-{trace_id}-{parent}-01"),
    )
    .await;
    assert!(answer.contains("\"result\""), "{answer}");
    let name = "tools/call get_environment_config";
    let spans = rx
        .wait_for(trace_id, &[name], &marker, Duration::from_secs(20))
        .await;
    let header_root = named(&spans, name);
    assert_eq!(header_root["parent_span_id"], parent, "{header_root}");
    assert_eq!(header_root["kind"], 2, "{header_root}");
    // A run started as a task (the tasks extension): its spans, after the request's span
    // ended, go under a `task.run` span in the request's trace.
    let (trace_id, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let created = raw_call(
        &server.url("/mcp"),
        "execute_code",
        json!({"code": format!("print('{marker}')")}),
        json!({"extensions": {"io.modelcontextprotocol/tasks": {}}}),
        &format!("00-{trace_id}-{parent}-01"),
    )
    .await;
    assert!(created.contains("\"taskId\""), "{created}");
    let name = "tools/call execute_code";
    let spans = rx
        .wait_for(
            trace_id,
            &[
                name,
                "task.run",
                "executor.queue",
                "sandbox.run",
                "sandbox.code",
            ],
            &marker,
            Duration::from_secs(30),
        )
        .await;
    let root = named(&spans, name);
    assert_eq!(root["parent_span_id"], parent, "{root}");
    let task = named(&spans, "task.run");
    assert_eq!(task["parent_span_id"], root["span_id"], "{task}");
    for child in ["executor.queue", "sandbox.run"] {
        let c = named(&spans, child);
        assert_eq!(c["parent_span_id"], task["span_id"], "{child}: {c}");
    }
    within_the_run(&spans, &["sandbox.code"]);
    // Requests other than tools/call: a server span each, named after the method, in the
    // caller's trace (a task's state, the tool list).
    let task_id = created
        .split("\"taskId\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("a taskId")
        .to_string();
    let (trace_id, parent) = ("5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8");
    let traceparent = format!("00-{trace_id}-{parent}-01");
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    let got = raw_request(
        &server.url("/mcp"),
        "tasks/get",
        json!({"taskId": task_id}),
        tasks,
        &traceparent,
    )
    .await;
    assert!(got.contains(&task_id), "{got}");
    let listed = raw_request(
        &server.url("/mcp"),
        "tools/list",
        json!({}),
        json!({}),
        &traceparent,
    )
    .await;
    assert!(listed.contains("execute_code"), "{listed}");
    let spans = rx
        .wait_for(
            trace_id,
            &["tasks/get", "tools/list"],
            &marker,
            Duration::from_secs(30),
        )
        .await;
    for name in ["tasks/get", "tools/list"] {
        let s = named(&spans, name);
        assert_eq!(s["parent_span_id"], parent, "{s}");
        assert_eq!(s["kind"], 2, "a server span: {s}");
        assert_eq!(s["attributes"]["mcp.method.name"], name, "{s}");
        assert_eq!(s["status"], 0, "{s}");
    }
    let m = metrics(server.url("/metrics")).await;
    assert!(metric(&m, "mcp_executor_trace_spans_exported_total") >= 6);
    assert_eq!(metric(&m, "mcp_executor_trace_spans_dropped_total"), 0);
    server.finish().await;
}

/// The runner's own timings of a one-shot run, children of `sandbox.run`.
const RUNNER_PHASES: [&str; 3] = ["sandbox.job_in", "sandbox.code", "sandbox.report"];

/// Each of `phases` is a child of `sandbox.run`, within it in time, in order (one starts
/// where the last ended, or later).
pub(crate) fn within_the_run(spans: &[Value], phases: &[&str]) {
    let run = named(spans, "sandbox.run");
    let mut last_end = run["start"].as_u64().unwrap();
    for name in phases {
        let p = named(spans, name);
        assert_eq!(p["parent_span_id"], run["span_id"], "{name}: {p}");
        let (start, end) = (p["start"].as_u64().unwrap(), p["end"].as_u64().unwrap());
        assert!(
            last_end <= start && start <= end && end <= run["end"].as_u64().unwrap(),
            "{name} is out of order or outside sandbox.run: {p} {run}"
        );
        last_end = end;
    }
}

/// A run on a warm sandbox says which pool it came from and that it was a plain one (the
/// code needs nothing preloaded), and its runner's phases come as they do from a cold one.
/// The real binary: the suite's in-process servers share one sandbox without a pool.
#[tokio::test]
async fn a_warm_take_names_its_pool() {
    let rx = receiver().await;
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    let s = crate::process::Server::start(
        "traces-warm",
        &["--pool-size", "1", "--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    // The pool's sandbox is waiting.
    let waited = Instant::now();
    while metric(&metrics(s.url("/metrics")).await, "mcp_executor_pool_ready") < 1 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the pool never filled:\n{}",
            s.stderr()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let marker = format!("secret-marker-{}", uuid::Uuid::new_v4().simple());
    let (spans, _) = traced_call(&rx, &s.url("/mcp"), &marker, None, &RUNNER_PHASES).await;
    let take = named(&spans, "sandbox.take");
    let a = &take["attributes"];
    assert_eq!(a["mcp_executor.sandbox.warm"], true, "{take}");
    // One tenant: the server's one shared pool.
    assert_eq!(a["mcp_executor.pool"], "pool", "{take}");
    assert_eq!(a["mcp_executor.sandbox.preloaded"], 0, "{take}");
    within_the_run(&spans, &RUNNER_PHASES);
    // A stopping server removes its pool's sandboxes (dropped, it is killed: the drop
    // removes what it owned).
    let mut s = s;
    assert!(
        s.terminate(Duration::from_secs(60)).await.is_some(),
        "{}",
        s.stderr()
    );
}

/// A raw `tools/call` of `tool` with `arguments` at protocol 2026-07-28, from a client of
/// `capabilities`, with `traceparent` as an HTTP header: the answer's text.
async fn raw_call(
    url: &str,
    tool: &str,
    arguments: Value,
    capabilities: Value,
    traceparent: &str,
) -> String {
    let params = json!({"name": tool, "arguments": arguments});
    raw_request(url, "tools/call", params, capabilities, traceparent).await
}

/// A raw request of `method` with `params` at protocol 2026-07-28, from a client of
/// `capabilities`, with `traceparent` as an HTTP header: the answer's text.
async fn raw_request(
    url: &str,
    method: &str,
    params: Value,
    capabilities: Value,
    traceparent: &str,
) -> String {
    let headers = [("traceparent", traceparent)];
    mcp_support::raw_2026_text(url, method, params, capabilities, &headers)
        .await
        .1
}

#[tokio::test]
async fn a_code_mode_call_is_traced_to_the_upstream_and_passes_the_context_on() {
    let rx = receiver().await;
    let conf = format!(
        "[[servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"{}\"]\nallow = [\"echo\"]\n",
        crate::codemode::node_server("everything")
    );
    let tools = rx.dir.join("tools.toml");
    std::fs::write(&tools, conf).unwrap();
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    let s = crate::process::Server::start(
        "traces-cm",
        &[
            "--tools",
            tools.to_str().unwrap(),
            "--otlp-endpoint",
            &endpoint,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let marker = format!("secret-marker-{}", uuid::Uuid::new_v4().simple());
    let code = format!("from tools import everything\nprint(everything.echo(message='{marker}'))");
    let (spans, root) = traced_call(
        &rx,
        &s.url("/mcp"),
        &marker,
        Some(&code),
        &["code_mode.call", "tools/call echo"],
    )
    .await;
    assert_eq!(
        root["service"], "mcp-code-executor",
        "the default service.name"
    );
    let run = named(&spans, "sandbox.run");
    let cm = named(&spans, "code_mode.call");
    assert_eq!(
        cm["parent_span_id"], run["span_id"],
        "the call is the run's: {cm}"
    );
    assert_eq!(
        cm["attributes"]["mcp_executor.upstream"], "everything",
        "{cm}"
    );
    assert_eq!(cm["attributes"]["gen_ai.tool.name"], "echo", "{cm}");
    assert_eq!(cm["status"], 0, "{cm}");
    let up = named(&spans, "tools/call echo");
    assert_eq!(up["parent_span_id"], cm["span_id"], "{up}");
    assert_eq!(up["kind"], 3, "a client span: {up}");
    assert_eq!(up["attributes"]["mcp.method.name"], "tools/call", "{up}");
    assert_eq!(up["attributes"]["gen_ai.tool.name"], "echo", "{up}");
}

/// p50 and p95 of `v` (ms).
fn p50_p95(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.95))
}

#[tokio::test]
async fn a_collector_that_never_answers_slows_no_call_and_drops_are_counted() {
    let tenant = "t-traces-hole";
    let _clean = [
        common::remove_on_drop(tenant),
        common::remove_on_drop(&format!("{tenant}-off")),
        common::remove_on_drop(&format!("{tenant}-on")),
    ];
    // A black hole: takes connections and never answers.
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_port = hole.local_addr().unwrap().port();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hole.accept().await {
            held.push(s);
        }
    });
    let rx = receiver().await;
    let off = mcp_support::server_configured(&format!("{tenant}-off"), |_| {}).await;
    let on = mcp_support::server_configured(&format!("{tenant}-on"), |s| s.traces = traces_to(&rx))
        .await;
    let hole_server = mcp_support::server_configured(tenant, |s| {
        s.traces = TraceConfig {
            endpoint: Some(format!("http://127.0.0.1:{hole_port}/v1/traces")),
            schedule_delay: Duration::from_millis(20),
            queue_size: 8,
            ..TraceConfig::default()
        };
    })
    .await;
    let clients = [
        off.client().await,
        on.client().await,
        hole_server.client().await,
    ];
    let code = json!({"code": "print(1)"});
    let mut times: [Vec<f64>; 3] = Default::default();
    // Round robin, so that the machine's load falls on all alike; a first call each warms up.
    for i in 0..13 {
        for (c, t) in clients.iter().zip(times.iter_mut()) {
            let t0 = Instant::now();
            let r = call(c, "execute_code", code.clone()).await;
            assert_eq!(r.is_error, Some(false), "{}", text(&r));
            if i > 0 {
                t.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    let [(off50, off95), (on50, on95), (hole50, hole95)] = times.clone().map(p50_p95);
    eprintln!(
        "execute_code print(1), no pool, 12 calls each, round robin (ms): export off p50 {off50:.1} p95 {off95:.1}; \
         on p50 {on50:.1} p95 {on95:.1}; black hole p50 {hole50:.1} p95 {hole95:.1}"
    );
    assert!(
        hole50 <= off50 * 1.5 + 50.0,
        "calls with a black-hole collector took {hole50:.1} ms (median) against {off50:.1} ms with traces off: {times:?}"
    );
    let m = metrics(hole_server.url("/metrics")).await;
    // 13 calls of 5 spans each, a queue of 8, the first batch stuck in its send: most are
    // dropped, and counted.
    let dropped = metric(&m, "mcp_executor_trace_spans_dropped_total");
    assert!(
        dropped >= 20,
        "only {dropped} spans counted as dropped:\n{m}"
    );
    assert_eq!(metric(&m, "mcp_executor_trace_spans_exported_total"), 0);
    let m = metrics(off.url("/metrics")).await;
    assert!(
        !m.contains("mcp_executor_trace_"),
        "a server without traces reports no trace counters"
    );
    drop(clients);
    for s in [off, on, hole_server] {
        s.finish().await;
    }
    holder.abort();
}

#[tokio::test]
async fn a_stopping_server_sends_its_last_spans() {
    let rx = receiver().await;
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    // Batches gathered for ten minutes: only the flush at shutdown sends this one.
    let mut s = crate::process::Server::start(
        "traces-stop",
        &["--otlp-endpoint", &endpoint],
        &[("OTEL_BSP_SCHEDULE_DELAY", "600000")],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let (trace_id, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let answer = raw_call(
        &s.url("/mcp"),
        "get_environment_config",
        json!({}),
        json!({}),
        &format!("00-{trace_id}-{parent}-01"),
    )
    .await;
    assert!(answer.contains("\"result\""), "{answer}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.spans_of(trace_id).is_empty(),
        "sent before the batch delay"
    );
    s.terminate(Duration::from_secs(30))
        .await
        .expect("the server stops on SIGTERM");
    let name = "tools/call get_environment_config";
    let spans = rx
        .wait_for(trace_id, &[name], "no-marker-here", Duration::from_secs(5))
        .await;
    assert_eq!(named(&spans, name)["parent_span_id"], parent);
}
