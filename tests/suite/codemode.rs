//! Code mode (#26): sandboxed Python calls the tools of other MCP servers through this
//! server, against real upstream servers nobody here wrote: npm
//! `@modelcontextprotocol/server-everything`, `server-memory`, `server-filesystem` and
//! PyPI `mcp-server-time`, installed under `target/upstreams` by `scripts/test.sh`
//! (`MCP_CODEMODE_UPSTREAMS` names another directory). Each test starts the real binary
//! (`serve --tools FILE`) on real Docker and talks to it with the rmcp client.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

use crate::common;
use crate::process;

use process::Server;

/// A value the upstream is given in its environment: it must never reach the sandbox.
const MARKER: &str = "mcpx-marker-secret-5f1c2e9a";

fn upstreams() -> PathBuf {
    let dir = std::env::var_os("MCP_CODEMODE_UPSTREAMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/upstreams"));
    for need in [
        "node_modules/@modelcontextprotocol/server-everything/dist/index.js",
        "node_modules/@modelcontextprotocol/server-memory/dist/index.js",
        "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
        "time/bin/mcp-server-time",
    ] {
        assert!(
            dir.join(need).exists(),
            "{} is missing: run scripts/test.sh (it installs the upstream MCP servers under target/upstreams)",
            dir.join(need).display()
        );
    }
    dir
}

pub(crate) fn node_server(name: &str) -> String {
    upstreams()
        .join(format!(
            "node_modules/@modelcontextprotocol/server-{name}/dist/index.js"
        ))
        .display()
        .to_string()
}

fn time_server() -> String {
    upstreams()
        .join("time/bin/mcp-server-time")
        .display()
        .to_string()
}

/// A temporary directory removed on drop.
pub(crate) struct TempDir(pub(crate) PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "mcpx-codemode-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) async fn start(name: &str, tools_toml: &str, dir: &Path, extra: &[&str]) -> Server {
    let file = dir.join("tools.toml");
    std::fs::write(&file, tools_toml).unwrap();
    let mut args = vec!["--tools", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    // Code mode logs its calls at `info`: what the tests read.
    Server::start(
        name,
        &args,
        &[(
            "RUST_LOG",
            "mcp_code_executor=warn,mcp_code_executor::codemode=info",
        )],
    )
    .await
}

pub(crate) async fn call(peer: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(map) = args else { panic!() };
    peer.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(map))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// Run `code` with execute_code: (stdout, stderr, structured report).
pub(crate) async fn run(peer: &rmcp::Peer<RoleClient>, code: &str) -> (String, String, Value) {
    run_with(peer, code, 60).await
}

pub(crate) async fn run_with(
    peer: &rmcp::Peer<RoleClient>,
    code: &str,
    timeout: u64,
) -> (String, String, Value) {
    let r = call(
        peer,
        "execute_code",
        json!({"code": code, "timeout": timeout}),
    )
    .await;
    let s = r.structured_content.clone().expect("structured report");
    let mut err = s["stderr"].as_str().unwrap_or_default().to_string();
    if s["timed_out"] == true {
        err.push_str(&format!("\n[the run timed out: {s}]"));
    }
    (s["stdout"].as_str().unwrap_or_default().to_string(), err, s)
}

/// The last line of stdout, as JSON.
pub(crate) fn last_json(out: &str, err: &str) -> Value {
    let line = out
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output; stderr:\n{err}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}\nstderr:\n{err}"))
}

#[tokio::test]
async fn everything_and_filesystem_through_execute_code() {
    let dir = TempDir::new("e");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let host_file = root.join("notes.txt");
    std::fs::write(&host_file, "host-only content 42\n").unwrap();
    let outside = dir.0.join("outside.txt");
    std::fs::write(&outside, "not yours").unwrap();
    let conf = format!(
        r#"
[limits]
calls_per_run = 30

[[servers]]
name = "everything"
command = "node"
args = ["{everything}"]
env = {{ UPSTREAM_API_TOKEN = "{MARKER}" }}
allow = ["echo", "get-sum", "get-structured-content", "get-env"]

[[servers]]
name = "filesystem"
command = "node"
args = ["{fs}", "{root}"]
"#,
        everything = node_server("everything"),
        fs = node_server("filesystem"),
        root = root.display(),
    );
    let s = start("codemode-e", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    // The one-liner of the issue.
    let (out, err, rep) = run(
        &peer,
        "from tools import everything; print(everything.get_sum(a=1, b=2))",
    )
    .await;
    // The upstream answers with text, which the function returns as it is.
    assert_eq!(
        out.trim(),
        "The sum of 1 and 2 is 3.",
        "stderr {err:?} {rep}"
    );

    // Structured output: a dict matching the outputSchema; the docstring comes from the schema.
    let code = r#"
import json, tools, inspect
from tools import everything
r = everything.get_structured_content(location="Chicago")
doc = everything.get_structured_content.__doc__
print(json.dumps({"type": type(r).__name__, "r": r,
                  "schema": everything.__tools__["get_structured_content"]["outputSchema"],
                  "sig": str(inspect.signature(everything.get_sum)),
                  "doc_has_schema": "temperature" in doc and "Chicago" in doc,
                  "found": tools.search("sum"),
                  "has_hidden": hasattr(everything, "get_tiny_image")}))
"#;
    let (out, err, _) = run(&peer, code).await;
    let v = last_json(&out, &err);
    assert_eq!(v["type"], "dict", "{v}");
    let r = &v["r"];
    assert!(
        r["temperature"].is_number() && r["humidity"].is_number(),
        "{v}"
    );
    assert!(r["conditions"].is_string(), "{v}");
    // The dict matches the tool's outputSchema (checked as arguments are checked).
    assert!(v["schema"]["properties"]["temperature"].is_object(), "{v}");
    assert_eq!(
        mcp_code_executor::codemode::schema::check(&v["schema"], r),
        None,
        "{v}"
    );
    assert_eq!(v["sig"], "(*, a: float, b: float)");
    assert_eq!(v["doc_has_schema"], true, "{v}");
    assert!(v["found"].to_string().contains("everything.get_sum"), "{v}");
    assert_eq!(
        v["has_hidden"], false,
        "a tool outside the allow list has no stub: {v}"
    );

    // The filesystem server reads a host file that the sandbox cannot open; a path
    // outside its root and a missing file raise ToolError; write_file (destructive) is
    // refused without the operator's consent; bad arguments are refused before the call.
    let code = format!(
        r#"
import json, tools
from tools import filesystem as fs
out = {{}}
out["content"] = fs.read_text_file(path={host:?})
try:
    open({host:?}).read()
    out["open"] = "opened"
except OSError as e:
    out["open"] = type(e).__name__
for key, call in [("outside", lambda: fs.read_text_file(path={outside:?})),
                  ("missing", lambda: fs.read_text_file(path={missing:?})),
                  ("write", lambda: fs.write_file(path={newfile:?}, content="x")),
                  ("badargs", lambda: tools.call("filesystem", "read_text_file", path=5))]:
    try:
        call()
        out[key] = "no error"
    except tools.ToolError as e:
        out[key] = [type(e).__name__, str(e)[:200]]
print(json.dumps(out))
"#,
        host = host_file.display().to_string(),
        outside = outside.display().to_string(),
        missing = root.join("missing.txt").display().to_string(),
        newfile = root.join("new.txt").display().to_string(),
    );
    let (out, err, _) = run(&peer, &code).await;
    let v = last_json(&out, &err);
    // Its outputSchema makes the result a dict: {"content": TEXT}.
    assert_eq!(v["content"]["content"], "host-only content 42\n", "{v}");
    assert_eq!(v["open"], "FileNotFoundError", "{v}");
    assert_eq!(v["outside"][0], "ToolError", "{v}");
    assert_eq!(v["missing"][0], "ToolError", "{v}");
    assert_eq!(v["write"][0], "ToolDenied", "{v}");
    assert!(
        v["write"][1].as_str().unwrap().contains("destructive"),
        "{v}"
    );
    assert_eq!(v["badargs"][0], "ToolDenied", "{v}");
    assert!(!root.join("new.txt").exists());

    // The upstream's environment holds what it was given and nothing of ours; the
    // sandbox holds no trace of the upstream's secret (environment, files, catalog).
    let code = format!(
        r#"
import json, os, tools
from tools import everything
# Made of two halves: the script itself (in /workspace) must not hold the marker.
M = {m1:?} + {m2:?}
env = json.loads(everything.get_env())
hits = [k for k, v in os.environ.items() if M in v or M in k]
for top in ("/workspace", "/tmp", "/opt/mcp-code-executor", "/etc"):
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            try:
                with open(p, "rb") as fh:
                    if M.encode() in fh.read(4 << 20):
                        hits.append(p)
            except OSError:
                pass
try:
    with open("/proc/self/environ", "rb") as fh:
        if M.encode() in fh.read():
            hits.append("/proc/self/environ")
except OSError:
    pass
catalog = json.dumps([m.__tools__ for m in tools.servers().values()])
print(json.dumps({{"upstream_env": sorted(env), "marker_given": env.get("UPSTREAM_API_TOKEN") == M,
                  "hits": hits, "in_catalog": M in catalog or "node" in catalog}}))
"#,
        m1 = &MARKER[..10],
        m2 = &MARKER[10..],
    );
    let (out, err, _) = run(&peer, &code).await;
    let v = last_json(&out, &err);
    assert_eq!(v["marker_given"], true, "{v}");
    assert_eq!(v["hits"], json!([]), "{v}");
    assert_eq!(v["in_catalog"], false, "{v}");
    let names: Vec<&str> = v["upstream_env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for ours in [
        "MCP_EXECUTOR_TENANT",
        "MCP_EXECUTOR_DATA_DIR",
        "CODE_STORAGE_DIR",
    ] {
        assert!(
            !names.contains(&ours),
            "{ours} reached the upstream: {names:?}"
        );
    }
    assert!(
        names
            .iter()
            .all(|n| ["UPSTREAM_API_TOKEN", "PATH", "HOME"].contains(n)),
        "the upstream got variables it was not given: {names:?}"
    );

    // A frame the code forges on the channel is just another request: a tool outside the
    // allow list is refused; async calls gather; the budget ends a loop of calls.
    let code = r#"
import json, os, socket, struct, tools, asyncio
# Forged before the package opens its channel (whose reader thread would take the answer).
s = socket.socket(fileno=os.dup(5))
req = json.dumps({"id": 999999, "op": "call", "server": "everything", "tool": "get-tiny-image", "arguments": {}}).encode()
s.sendall(struct.pack(">I", len(req)) + req)
n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
forged = json.loads(s.recv(n, socket.MSG_WAITALL))
from tools import everything
async def many():
    return await asyncio.gather(*[everything.get_sum.aio(a=i, b=1) for i in range(5)])
gathered = asyncio.run(many())
# Calls that counted: the refused forged one and the 5 gathered (refused calls count).
calls = 6
try:
    while True:
        everything.echo(message="x")
        calls += 1
except tools.BudgetExceeded as e:
    budget = [calls, str(e)]
print(json.dumps({"forged": forged, "gathered": gathered, "budget": budget}))
"#;
    let (out, err, _) = run(&peer, code).await;
    let v = last_json(&out, &err);
    assert_eq!(v["forged"]["error"]["type"], "ToolDenied", "{v}");
    assert_eq!(v["forged"]["id"], 999999, "{v}");
    assert_eq!(v["gathered"].as_array().unwrap().len(), 5, "{v}");
    // 1 refused forged call + 5 gathered + 24 echoes = 30 = calls_per_run: refused calls
    // count too (a loop of refused calls ends at the budget).
    assert_eq!(v["budget"][0], 30, "{v}");
    assert!(v["budget"][1].as_str().unwrap().contains("30"), "{v}");

    // The log names tool and sizes, never values.
    let log = s.stderr();
    assert!(log.contains("code mode: tool call"), "{log}");
    assert!(
        !log.contains("host-only content 42"),
        "a result value was logged"
    );
    assert!(!log.contains(MARKER), "the secret was logged");
    drop(client);
}

#[tokio::test]
async fn consent_memory_across_runs_and_cells_and_the_time_server() {
    let dir = TempDir::new("m");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let conf = format!(
        r#"
[[servers]]
name = "filesystem"
command = "node"
args = ["{fs}", "{root}"]
allow_destructive = ["write_file"]

[[servers]]
name = "memory"
command = "node"
args = ["{memory}"]
env = {{ MEMORY_FILE_PATH = "{memfile}" }}
allow_destructive = ["*"]

[[servers]]
name = "time"
command = "{time}"
"#,
        fs = node_server("filesystem"),
        memory = node_server("memory"),
        time = time_server(),
        root = root.display(),
        memfile = dir.0.join("memory.jsonl").display(),
    );
    let s = start("codemode-m", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    // Consent given by the operator: write_file goes through to the host.
    let target = root.join("written.txt");
    let code = format!(
        "from tools import filesystem\nprint(filesystem.write_file(path={:?}, content='from the sandbox'))",
        target.display().to_string()
    );
    let (out, err, _) = run(&peer, &code).await;
    assert_eq!(
        std::fs::read_to_string(&target).ok().as_deref(),
        Some("from the sandbox"),
        "stdout {out} stderr {err}"
    );

    // State of the memory server across runs.
    let code = r#"
from tools import memory
memory.create_entities(entities=[{"name": "Ada", "entityType": "person", "observations": ["wrote the first program"]}])
print("created")
"#;
    let (out, err, _) = run(&peer, code).await;
    assert_eq!(out.trim(), "created", "{err}");
    let code = r#"
import json
from tools import memory
g = memory.read_graph()
print(json.dumps(g if isinstance(g, dict) else {"text": g}))
"#;
    let (out, err, _) = run(&peer, code).await;
    assert!(
        out.contains("wrote the first program"),
        "stdout {out} stderr {err}"
    );

    // In an execute_python session the stubs keep working across cells.
    let r = call(&peer, "execute_python", json!({"code": "from tools import memory\nn1 = memory.search_nodes(query='Ada')\n'Ada' in str(n1)"})).await;
    let t = serde_json::to_string(&r.structured_content).unwrap();
    assert!(t.contains("True"), "{t}");
    let r = call(&peer, "execute_python", json!({"code": "memory.add_observations(observations=[{'entityName': 'Ada', 'contents': ['cell two']}])\n'cell two' in str(memory.open_nodes(names=['Ada']))"})).await;
    let t = serde_json::to_string(&r.structured_content).unwrap();
    assert!(t.contains("True"), "{t}");

    // PyPI's mcp-server-time.
    let code = "from tools import time\nr = time.get_current_time(timezone='UTC')\nprint(r['timezone'] if isinstance(r, dict) else r)";
    let (out, err, _) = run(&peer, code).await;
    assert!(out.contains("UTC"), "stdout {out} stderr {err}");
    drop(client);
}

#[tokio::test]
async fn timeouts_cancel_upstream_calls() {
    let dir = TempDir::new("t");
    let conf = format!(
        r#"
[[servers]]
name = "everything"
command = "node"
args = ["{everything}"]

[[servers]]
name = "slow"
command = "node"
args = ["{everything}"]
call_timeout_s = 1.5
"#,
        everything = node_server("everything"),
    );
    let s = start("codemode-t", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    // Per-call timeout: ToolTimeout in the code, which goes on.
    let code = r#"
import tools
from tools import slow
try:
    slow.trigger_long_running_operation(duration=20, steps=20)
    print("returned")
except tools.ToolTimeout as e:
    print("ToolTimeout", e)
print(slow.get_sum(a=2, b=2))
"#;
    let t0 = Instant::now();
    let (out, err, _) = run(&peer, code).await;
    assert!(out.starts_with("ToolTimeout"), "stdout {out} stderr {err}");
    assert!(out.contains("The sum of 2 and 2 is 4."), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());

    // The run's own timeout: the sandbox is killed and its upstream call in flight is
    // dropped, which cancels it upstream.
    let code = "from tools import everything\neverything.trigger_long_running_operation(duration=30, steps=30)\nprint('returned')";
    let t0 = Instant::now();
    let (out, _, rep) = run_with(&peer, code, 4).await;
    assert_eq!(rep["timed_out"], true, "{rep}");
    assert!(!out.contains("returned"));
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = s.stderr();
        if log.contains("code mode: tool call cancelled") {
            assert!(log.contains("trigger-long-running-operation"), "{log}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no cancellation logged:\n{}",
            s.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Metrics: calls by tenant, upstream, tool and outcome; a latency histogram.
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let t = &s.tenant;
    for line in [
        format!("mcp_executor_tool_calls_total{{tenant=\"{t}\",upstream=\"slow\",tool=\"trigger-long-running-operation\",outcome=\"ToolTimeout\"}} 1"),
        format!("mcp_executor_tool_calls_total{{tenant=\"{t}\",upstream=\"slow\",tool=\"get-sum\",outcome=\"ok\"}} 1"),
        format!("mcp_executor_tool_calls_total{{tenant=\"{t}\",upstream=\"everything\",tool=\"trigger-long-running-operation\",outcome=\"cancelled\"}} 1"),
        format!("mcp_executor_tool_call_duration_seconds_count{{tenant=\"{t}\",upstream=\"slow\"}} 2"),
        format!("mcp_executor_tool_call_duration_seconds_bucket{{tenant=\"{t}\",upstream=\"slow\",le=\"1\"}} 1"),
    ] {
        assert!(text.contains(&line), "missing `{line}` in:\n{text}");
    }
    drop(client);
}

async fn client_with_token(s: &Server, token: &str) -> RunningService<RoleClient, ()> {
    let t = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(s.url("/mcp")).auth_header(token.to_string()),
    );
    ().serve(t).await.expect("connects")
}

/// A tenants file of two tenants with these entries' extra lines (`[[tenants.servers]]`
/// tables): (the file, a's id, b's id, a's token, b's token).
pub(crate) fn two_tenants(
    dir: &Path,
    tag: &str,
    a_extra: &str,
    b_extra: &str,
) -> (PathBuf, String, String, String, String) {
    use mcp_code_executor::tenancy::token;
    let id = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let (a, b) = (format!("t-{tag}a-{id}"), format!("t-{tag}b-{id}"));
    let (ta, tb) = (token::generate(), token::generate());
    let file = dir.join("tenants.toml");
    std::fs::write(
        &file,
        format!(
            "[[tenants]]\nid = \"{a}\"\ntoken_sha256 = \"{}\"\n{a_extra}\n[[tenants]]\nid = \"{b}\"\ntoken_sha256 = \"{}\"\n{b_extra}\n",
            token::to_hex(&token::hash(&ta)),
            token::to_hex(&token::hash(&tb))
        ),
    )
    .unwrap();
    (file, a, b, ta, tb)
}

/// Python that tries `tools.call(server, tool)` for each (server, tool) and prints the
/// tenant's servers and, per server, `called` or the error's class.
fn try_calls(calls: &[(&str, &str)]) -> String {
    let mut code =
        String::from("import json, tools\nout = {\"servers\": sorted(tools.servers())}\n");
    for (server, tool) in calls {
        code.push_str(&format!(
            "try:\n    tools.call({server:?}, {tool:?}, a=1, b=1)\n    out[{server:?}] = \"called\"\nexcept tools.ToolError as x:\n    out[{server:?}] = type(x).__name__\n"
        ));
    }
    code.push_str("print(json.dumps(out))\n");
    code
}

/// The `execute_code` / `execute_python` descriptions list `mine` (one line each, not
/// their tools) and none of `others`.
async fn descriptions_list(c: &RunningService<RoleClient, ()>, mine: &[&str], others: &[&str]) {
    let tools = c.peer().list_all_tools().await.unwrap();
    for name in ["execute_code", "execute_python"] {
        let t = tools.iter().find(|t| t.name == name).unwrap();
        let d = t.description.as_deref().unwrap();
        for m in mine {
            assert!(d.contains(&format!("\n- {m}: ")), "{name} lacks {m}: {d}");
        }
        for o in others {
            assert!(!d.contains(&format!("- {o}: ")), "{name} lists {o}: {d}");
        }
        assert!(!d.contains("get-sum") && !d.contains("get_sum"), "{d}");
    }
}

/// Tools-file servers restricted by `tenants`, and beside them a server of one tenant's
/// own from the tenants file (`[[tenants.servers]]`).
#[tokio::test]
async fn two_tenants_see_only_their_own_servers() {
    let dir = TempDir::new("ten");
    let b_own = format!(
        "[[tenants.servers]]\nname = \"bsum\"\ncommand = \"node\"\nargs = [\"{}\"]\nallow = [\"get-sum\"]\n",
        node_server("everything")
    );
    let (tenants, a, b, ta, tb) = two_tenants(&dir.0, "cm", "", &b_own);
    let conf = format!(
        r#"
[[servers]]
name = "everything"
command = "node"
args = ["{everything}"]
tenants = ["{a}"]

[[servers]]
name = "memory"
command = "node"
args = ["{memory}"]
env = {{ MEMORY_FILE_PATH = "{memfile}" }}
tenants = ["{b}"]
"#,
        everything = node_server("everything"),
        memory = node_server("memory"),
        memfile = dir.0.join("memory.jsonl").display(),
    );
    let s = start(
        "codemode-ten",
        &conf,
        &dir.0,
        &["--tenants", tenants.to_str().unwrap()],
    )
    .await;
    let _clean_a = common::remove_on_drop(&a);
    let _clean_b = common::remove_on_drop(&b);
    let code = try_calls(&[("everything", "get-sum"), ("bsum", "get-sum")]);
    let ca = client_with_token(&s, &ta).await;
    let cb = client_with_token(&s, &tb).await;
    descriptions_list(&ca, &["everything"], &["memory", "bsum"]).await;
    descriptions_list(&cb, &["memory", "bsum"], &["everything"]).await;
    let (out, err, _) = run(ca.peer(), &code).await;
    let v = last_json(&out, &err);
    assert_eq!(
        v,
        json!({"servers": ["everything"], "everything": "called", "bsum": "ToolDenied"})
    );
    let (out, err, _) = run(cb.peer(), &code).await;
    let v = last_json(&out, &err);
    assert_eq!(
        v,
        json!({"servers": ["bsum", "memory"], "everything": "ToolDenied", "bsum": "called"})
    );
    drop((ca, cb));
}

/// Code mode from the tenants file alone (no `--tools`): each tenant's own upstream, seen by
/// it only: the descriptions, `from tools import ...`, `tools.servers()`, and a frame the
/// code forges on the channel for the other tenant's tool, refused before any upstream of
/// the other's starts for it.
#[tokio::test]
async fn servers_of_the_tenants_file_are_their_tenants_alone() {
    let dir = TempDir::new("tfile");
    let alpha = format!(
        "[[tenants.servers]]\nname = \"alpha\"\ndescription = \"a's sums\"\ncommand = \"node\"\nargs = [\"{}\"]\nallow = [\"get-sum\", \"echo\"]\n",
        node_server("everything")
    );
    let beta = format!(
        "[[tenants.servers]]\nname = \"beta\"\ndescription = \"b's notes\"\ncommand = \"node\"\nargs = [\"{}\"]\nenv = {{ MEMORY_FILE_PATH = \"{}\" }}\n",
        node_server("memory"),
        dir.0.join("memory.jsonl").display()
    );
    let (tenants, a, b, ta, tb) = two_tenants(&dir.0, "tf", &alpha, &beta);
    let s = Server::start(
        "codemode-tfile",
        &["--tenants", tenants.to_str().unwrap()],
        &[(
            "RUST_LOG",
            "mcp_code_executor=warn,mcp_code_executor::codemode=info",
        )],
    )
    .await;
    let _clean_a = common::remove_on_drop(&a);
    let _clean_b = common::remove_on_drop(&b);
    let log = s.stderr();
    assert!(
        log.contains(&format!(
            "code mode: 2 tool servers: alpha (stdio, tenant {a}), beta (stdio, tenant {b})"
        )),
        "{log}"
    );
    let ca = client_with_token(&s, &ta).await;
    let cb = client_with_token(&s, &tb).await;
    descriptions_list(&ca, &["alpha"], &["beta"]).await;
    descriptions_list(&cb, &["beta"], &["alpha"]).await;
    // (tenant's client, its server, a call of it, the other's server, its tool)
    for (c, own, own_call, other, other_tool) in [
        (
            &ca,
            "alpha",
            "alpha.get_sum(a=1, b=2)",
            "beta",
            "read_graph",
        ),
        (&cb, "beta", "beta.read_graph()", "alpha", "get-sum"),
    ] {
        let code = format!(
            r#"
import json, os, socket, struct
# Forged before the package opens its channel (whose reader thread would take the answer).
s = socket.socket(fileno=os.dup(5))
req = json.dumps({{"id": 4242, "op": "call", "server": "{other}", "tool": "{other_tool}", "arguments": {{"a": 1, "b": 2}} if "{other_tool}" == "get-sum" else {{}}}}).encode()
s.sendall(struct.pack(">I", len(req)) + req)
n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
forged = json.loads(s.recv(n, socket.MSG_WAITALL))
import tools
try:
    from tools import {other}
    imported_other = "imported"
except ImportError as e:
    imported_other = "ImportError: " + str(e)
from tools import {own}
r = {own_call}
try:
    tools.call("{other}", "{other_tool}")
    called_other = "called"
except tools.ToolError as x:
    called_other = type(x).__name__
print(json.dumps({{"servers": sorted(tools.servers()), "forged": forged, "import": imported_other,
                  "call": called_other, "own": r if isinstance(r, str) else type(r).__name__}}))
"#
        );
        let (out, err, rep) = run(c.peer(), &code).await;
        let v = last_json(&out, &err);
        assert_eq!(v["servers"], json!([own]), "{v}");
        // The package's own message, naming the servers there are (not Python's bare
        // "cannot import name").
        assert_eq!(
            v["import"],
            format!("ImportError: no tool server '{other}' in this sandbox (have: {own}; tools.servers() lists them)"),
            "{v}"
        );
        assert_eq!(v["call"], "ToolDenied", "{v}");
        assert_eq!(v["forged"]["id"], 4242, "{v}");
        assert_eq!(v["forged"]["error"]["type"], "ToolDenied", "{v}");
        let m = v["forged"]["error"]["message"].as_str().unwrap();
        assert!(m.contains(&format!("no tool server `{other}`")), "{v}");
        if own == "alpha" {
            assert_eq!(v["own"], "The sum of 1 and 2 is 3.", "{v}\n{err}");
            // The same stored code again, through execute_code_file.
            let r = call(
                c.peer(),
                "execute_code_file",
                json!({"file_path": rep["file_path"], "timeout": 60}),
            )
            .await;
            let st = r.structured_content.clone().expect("structured report");
            let again = last_json(
                st["stdout"].as_str().unwrap_or_default(),
                st["stderr"].as_str().unwrap_or_default(),
            );
            assert_eq!(again["own"], v["own"], "{again}");
            assert_eq!(again["forged"]["error"]["type"], "ToolDenied", "{again}");
        } else {
            assert!(v["own"].is_string(), "{v}\n{err}");
        }
    }
    // One client per tenant and upstream, each started for its own tenant only.
    let log = s.stderr();
    let started: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("code mode: upstream server started"))
        .collect();
    assert!(
        started
            .iter()
            .any(|l| l.contains(&format!("tenant={a}")) && l.contains("server=alpha")),
        "{log}"
    );
    assert!(
        started
            .iter()
            .any(|l| l.contains(&format!("tenant={b}")) && l.contains("server=beta")),
        "{log}"
    );
    assert_eq!(started.len(), 2, "{started:?}");
    drop((ca, cb));
}

/// A tenant's own server with the name of a tools-file server it also sees: `serve`
/// refuses to start and says which and how to fix it (no Docker needed: it stops first).
#[tokio::test]
async fn a_name_clash_between_the_two_files_stops_the_start() {
    let dir = TempDir::new("clash");
    let own = "[[tenants.servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"x.js\"]\n";
    let (tenants, a, _b, _, _) = two_tenants(&dir.0, "cl", own, "");
    let tools = dir.0.join("tools.toml");
    std::fs::write(
        &tools,
        "[[servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"y.js\"]\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["serve", "--port", "0", "--pool-size", "0", "--tools"])
        .arg(&tools)
        .arg("--tenants")
        .arg(&tenants)
        .env("CODE_STORAGE_DIR", dir.0.join("code"))
        .env("MCP_EXECUTOR_DATA_DIR", dir.0.join("data"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("serve stops at once")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("tenant `{a}`"))
            && err.contains("`everything`")
            && err.contains("rename"),
        "{err}"
    );
    assert!(!err.contains("serving"), "{err}");
}

#[tokio::test]
async fn without_a_tools_file_the_package_is_there_and_empty() {
    let s = Server::start("codemode-none", &[], &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let code = r#"
import json, tools
try:
    tools.call("everything", "get-sum", a=1, b=1)
    e = "called"
except tools.ToolError as x:
    e = str(x)
try:
    from tools import everything
    imp = "imported"
except ImportError:
    imp = "ImportError"
print(json.dumps({"servers": sorted(tools.servers()), "call": e, "import": imp}))
"#;
    let (out, err, _) = run(client.peer(), code).await;
    let v = last_json(&out, &err);
    assert_eq!(v["servers"], json!([]), "{v}");
    assert_eq!(v["import"], "ImportError", "{v}");
    assert!(v["call"].as_str().unwrap().contains("not available"), "{v}");
    // And the descriptions name no tool server.
    let tools = client.peer().list_all_tools().await.unwrap();
    let d = tools.iter().find(|t| t.name == "execute_code").unwrap();
    assert!(
        !d.description.as_deref().unwrap().contains("Code mode:"),
        "{d:?}"
    );
    drop(client);
}

/// Mean of `mcp_executor_tool_call_duration_seconds` for `upstream` of `tenant` now:
/// (sum, count).
async fn call_seconds(s: &Server, upstream: &str) -> (f64, f64) {
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let l = format!("{{tenant=\"{}\",upstream=\"{upstream}\"}} ", s.tenant);
    let get = |name: &str| {
        text.lines()
            .find_map(|x| {
                x.strip_prefix(&format!(
                    "mcp_executor_tool_call_duration_seconds_{name}{l}"
                ))
            })
            .map_or(0.0, |v| v.parse().unwrap())
    };
    (get("sum"), get("count"))
}

/// What the bench row rests on (`BENCH_ONLY=codemode cargo bench --bench execute` measures
/// it: benches/execute/codemode.rs): one execute_code making 100 calls reaches the upstream
/// 100 times (this server's metrics count them), its answer is right, and the bytes that
/// reach the client are the answer's, fewer than the 100 results a client calling the
/// upstream itself receives; a proxied call stays within a loose bound (100 ms at p50).
#[tokio::test]
async fn a_hundred_calls_in_one_execute_code() {
    let dir = TempDir::new("b");
    let conf = format!(
        "[limits]\ncalls_per_run = 300\n[[servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"{}\"]\n",
        node_server("everything")
    );
    let s = start("codemode-b", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    // The bytes a client gets calling get-sum 100 times itself (an rmcp client straight
    // to the upstream).
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(node_server("everything"));
    let (t, _) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let direct = ().serve(t).await.unwrap();
    let mut direct_bytes = 0;
    for i in 0..100 {
        let mut args = serde_json::Map::new();
        args.insert("a".into(), json!(i));
        args.insert("b".into(), json!(1));
        let r = direct
            .call_tool(CallToolRequestParams::new("get-sum").with_arguments(args))
            .await
            .unwrap();
        direct_bytes += serde_json::to_vec(&r).unwrap().len();
    }
    let _ = direct.cancel().await;

    // The upstream starts on the first call.
    let (out, err, _) = run(
        &peer,
        "from tools import everything\nprint(everything.get_sum(a=0, b=0))",
    )
    .await;
    assert!(out.contains("The sum of 0 and 0 is 0."), "{err}");
    let (_, n0) = call_seconds(&s, "everything").await;

    let code = r#"
import json, time
from tools import everything
ms, total = [], 0
for i in range(100):
    t0 = time.perf_counter()
    total += int(everything.get_sum(a=i, b=1).split()[-1].rstrip('.'))
    ms.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"ms": sorted(ms)[50], "total": total}))
"#;
    let r = call(&peer, "execute_code", json!({"code": code, "timeout": 120})).await;
    let code_bytes = serde_json::to_vec(&r).unwrap().len();
    let st = r.structured_content.clone().unwrap();
    let v = last_json(
        st["stdout"].as_str().unwrap(),
        st["stderr"].as_str().unwrap_or_default(),
    );
    assert_eq!(v["total"], 5050, "{v}");
    let (_, n1) = call_seconds(&s, "everything").await;
    assert_eq!(n1 - n0, 100.0, "100 calls counted");
    assert!(
        code_bytes < direct_bytes,
        "code mode sent the client {code_bytes} bytes, 100 round trips {direct_bytes}"
    );
    let p50 = v["ms"].as_f64().unwrap();
    assert!(p50 < 100.0, "a proxied call took {p50} ms at p50");
    drop(client);
}

/// Pids of the `node` processes whose parent is `parent` (the upstreams a server started).
fn node_children(parent: u32) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next(), f.next().and_then(|p| p.parse::<u32>().ok()));
        if head.ends_with("(node") && ppid == Some(parent) && state != Some("Z") {
            out.push(pid);
        }
    }
    out
}

/// Is `pid` alive (there, and not a zombie)?
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// An upstream that died is started again at the next call; after the server's shutdown
/// no upstream process is left (closed by the server, or ending at its stdin's end).
#[tokio::test]
async fn a_dead_upstream_starts_again_and_none_outlives_the_server() {
    let dir = TempDir::new("dead");
    let conf = format!(
        "[[servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"{}\"]\n",
        node_server("everything")
    );
    let mut s = start("codemode-dead", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let sum = "from tools import everything\nprint(everything.get_sum(a=1, b=2))";
    let (out, err, _) = run(client.peer(), sum).await;
    assert_eq!(out.trim(), "The sum of 1 and 2 is 3.", "{err}");
    let first = node_children(s.pid());
    assert_eq!(first.len(), 1, "one upstream process: {first:?}");
    // SAFETY: killing the upstream process the server started (a test's own grandchild).
    unsafe {
        libc::kill(first[0] as i32, libc::SIGKILL);
    }
    let t0 = Instant::now();
    while alive(first[0]) && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(first[0]), "the upstream did not die");
    // The client notices the end of its stdio transport.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (out, err, _) = run(client.peer(), sum).await;
    assert_eq!(
        out.trim(),
        "The sum of 1 and 2 is 3.",
        "{err}\n{}",
        s.stderr()
    );
    assert!(
        s.stderr()
            .contains("code mode: the upstream server has gone; starting it again"),
        "{}",
        s.stderr()
    );
    let second = node_children(s.pid());
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    drop(client);
    assert!(
        s.terminate(Duration::from_secs(60)).await.is_some(),
        "the server did not stop"
    );
    let t0 = Instant::now();
    while alive(second[0]) && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !alive(second[0]),
        "the upstream outlived the server's shutdown"
    );
}

/// everything + filesystem, the configuration of the SDK and gVisor tests.
pub(crate) fn everything_and_filesystem(root: &Path) -> String {
    format!(
        r#"
[[servers]]
name = "everything"
command = "node"
args = ["{everything}"]

[[servers]]
name = "filesystem"
command = "node"
args = ["{fs}", "{root}"]
"#,
        everything = node_server("everything"),
        fs = node_server("filesystem"),
        root = root.display(),
    )
}

/// `tests/sdk/codemode.py` against `s`: the official Python SDK in its default
/// (2026-07-28) and legacy modes.
async fn sdk_client(s: &Server, missing: &Path) -> String {
    sdk_script(s, "codemode.py", &[missing.as_os_str()]).await
}

/// `tests/sdk/SCRIPT URL ARGS...` with the official Python SDK's interpreter, against `s`:
/// its standard output, after asserting that it exited 0 within 5 minutes.
pub(crate) async fn sdk_script(s: &Server, script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = sdk_output(&s.url("/mcp"), script, args).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the SDK client {script} failed: {stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log_tail(30)
    );
    stdout
}

/// `tests/sdk/SCRIPT URL ARGS…` with the official SDK's Python, ended within 5 minutes.
pub(crate) async fn sdk_output(
    url: &str,
    script: &str,
    args: &[&std::ffi::OsStr],
) -> std::process::Output {
    let out = tokio::process::Command::new(common::sdk_python())
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/sdk")
                .join(script),
        )
        .arg(url)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("the SDK client ends within 5 minutes")
        .expect("python starts")
}

#[tokio::test]
async fn the_official_python_sdk_in_default_and_legacy_modes() {
    let dir = TempDir::new("sdk");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let s = start(
        "codemode-sdk",
        &everything_and_filesystem(&root),
        &dir.0,
        &[],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let out = sdk_client(&s, &root.join("missing.txt")).await;
    assert!(out.contains("ok: auto 2026-07-28"), "{out}");
    assert!(out.contains("ok: legacy 2025-11-25"), "{out}");
}

#[tokio::test]
async fn under_gvisor_through_the_official_python_sdk() {
    // gVisor runs take turns with the other gVisor tests (their CPU-quota checks).
    let _one = crate::gvisor::ONE_AT_A_TIME.lock().await;
    let dir = TempDir::new("gv");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let s = start(
        "codemode-gv",
        &everything_and_filesystem(&root),
        &dir.0,
        &["--runtime", "runsc"],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    // The sandboxes really are gVisor's (its kernel says 4.4.0).
    let client = s.client().await;
    let (out, err, _) = run(
        client.peer(),
        "import os\nfrom tools import everything\nprint(os.uname().release)\nprint(everything.get_sum(a=1, b=2))",
    )
    .await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["4.4.0", "The sum of 1 and 2 is 3."],
        "stderr {err}"
    );
    drop(client);
    let out = sdk_client(&s, &root.join("missing.txt")).await;
    assert!(out.contains("ok: auto 2026-07-28"), "{out}");
}

/// `run --tools FILE` (the CI runner): the files' code calls the upstream servers too, one
/// file alone (no pool) and two at once (from a warm pool); every sandbox removed.
#[tokio::test]
async fn the_run_command_takes_a_tools_file() {
    let dir = TempDir::new("run");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.0.join("tools.toml"), everything_and_filesystem(&root)).unwrap();
    std::fs::write(
        dir.0.join("a.py"),
        "from tools import everything\nprint(everything.get_sum(a=1, b=2))\n",
    )
    .unwrap();
    std::fs::write(
        dir.0.join("b.py"),
        "import tools\nfrom tools import everything\nprint(everything.echo(message='from b'))\ntry:\n    tools.call('filesystem', 'write_file', path='/x', content='x')\nexcept tools.ToolDenied as e:\n    print('ToolDenied')\n",
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_mcp-code-executor");
    let tools = dir.0.join("tools.toml");
    for files in [vec!["a.py"], vec!["a.py", "b.py"]] {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("run")
            .arg("--json")
            .arg("--tools")
            .arg(&tools)
            .args(files.iter().map(|f| dir.0.join(f)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let child = cmd.spawn().expect("the binary starts");
        let pid = child.id().unwrap();
        // Should the test fail while it runs: its sandboxes go with it.
        struct Left(u32);
        impl Drop for Left {
            fn drop(&mut self) {
                common::remove_containers(&common::containers_left_by(self.0, true));
            }
        }
        let _left = Left(pid);
        let out = tokio::time::timeout(Duration::from_secs(240), child.wait_with_output())
            .await
            .expect("run ends within 4 minutes")
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
        let reports: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(reports.len(), files.len(), "{stdout}");
        for r in &reports {
            let f = r["file"].as_str().unwrap();
            let want = if f.ends_with("a.py") {
                "The sum of 1 and 2 is 3.\n"
            } else {
                "Echo: from b\nToolDenied\n"
            };
            assert_eq!(r["stdout"], want, "{r}\n{stderr}");
        }
        common::assert_nothing_left_by(pid);
    }
}

/// A JSON-RPC request at protocol 2026-07-28 over raw HTTP, with the tasks extension
/// declared (the official SDKs have no client side for tasks): its `result` or `error`.
async fn task_rpc(url: &str, method: &str, params: Value) -> Value {
    let tasks = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    crate::mcp_support::raw_2026(url, method, params, tasks, &[]).await
}

/// A task-augmented execute_code (the tasks extension) calls the upstream servers as a
/// plain call does.
#[tokio::test]
async fn code_mode_inside_a_task() {
    let dir = TempDir::new("task");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let s = start(
        "codemode-task",
        &everything_and_filesystem(&root),
        &dir.0,
        &[],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let url = s.url("/mcp");
    let code = "from tools import everything\nprint(everything.get_sum(a=20, b=22))";
    let created = task_rpc(
        &url,
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": code}}),
    )
    .await;
    assert_eq!(created["resultType"], "task", "{created}");
    let id = created["taskId"].as_str().expect("taskId").to_string();
    let t0 = Instant::now();
    let done = loop {
        let t = task_rpc(&url, "tasks/get", json!({ "taskId": id })).await;
        let status = t["status"].as_str().unwrap_or_else(|| panic!("{t}"));
        if status != "working" {
            break t;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "{t}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["result"]["structuredContent"]["stdout"], "The sum of 20 and 22 is 42.\n",
        "{done}"
    );
}

/// server-everything serving Streamable HTTP on a free loopback port; killed on drop.
struct HttpEverything {
    _child: tokio::process::Child,
    port: u16,
}

async fn http_everything() -> HttpEverything {
    use tokio::io::AsyncBufReadExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new("node")
        .arg(node_server("everything"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            if l.contains("listening on port") {
                return;
            }
        }
        panic!("server-everything (streamableHttp) ended before it listened");
    })
    .await
    .expect("server-everything listens within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    HttpEverything {
        _child: child,
        port,
    }
}

/// Our test client: records the progress notifications it gets; with `consent`, declares
/// form elicitation (at 2025-11-25, where a server may ask) and answers it so.
#[derive(Clone, Default)]
struct Recorder {
    progress: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    consent: Option<bool>,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl rmcp::ClientHandler for Recorder {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let Some(_) = self.consent else {
            return rmcp::model::ClientConfig::default();
        };
        let caps: rmcp::model::ClientCapabilities =
            serde_json::from_value(json!({"elicitation": {"form": {}}})).unwrap();
        rmcp::model::ClientConfig::new(caps, rmcp::model::Implementation::new("recorder", "0"))
            .with_protocol_version(rmcp::model::ProtocolVersion::V_2025_11_25)
    }

    async fn on_progress(
        &self,
        p: rmcp::model::ProgressNotificationParam,
        _: rmcp::service::NotificationContext<RoleClient>,
    ) {
        let line = format!("{} {}", p.progress, p.message.unwrap_or_default());
        self.progress.lock().unwrap().push(line);
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        Ok(match self.consent {
            Some(true) => rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Accept)
                .with_content(json!({"approve": true})),
            _ => rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Decline),
        })
    }
}

async fn recorder_client(s: &Server, r: &Recorder) -> RunningService<RoleClient, Recorder> {
    let t = StreamableHttpClientTransport::from_uri(s.url("/mcp"));
    r.clone().serve(t).await.expect("connects")
}

/// The items of the issue tested together on one server: a Streamable HTTP upstream;
/// calls in flight bounded per run; an upstream's progress reaching our client as progress
/// of its execute_code; and a run killed at its timeout whose in-flight call is cancelled
/// upstream (the upstream itself records the cancellation).
#[tokio::test]
async fn http_upstream_in_flight_limit_progress_and_cancellation_upstream() {
    let dir = TempDir::new("h");
    let http = http_everything().await;
    let cancel_log = dir.0.join("cancel.log");
    let conf = format!(
        r#"
[limits]
in_flight = 2

[[servers]]
name = "remote"
url = "http://127.0.0.1:{port}/mcp"
description = "server-everything over Streamable HTTP"

[[servers]]
name = "check"
command = "{python}"
args = ["{script}", "{log}"]
"#,
        port = http.port,
        python = common::sdk_python().display(),
        script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/upstream_cancel.py"),
        log = cancel_log.display(),
    );
    let s = start("codemode-h", &conf, &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let rec = Recorder::default();
    let client = recorder_client(&s, &rec).await;
    let peer = client.peer().clone();

    // A Streamable HTTP upstream, and the operator's one-line description.
    let (out, err, _) = run(
        &peer,
        "from tools import remote\nprint(remote.get_sum(a=1, b=2))",
    )
    .await;
    assert_eq!(out.trim(), "The sum of 1 and 2 is 3.", "{err}");
    let tools = peer.list_all_tools().await.unwrap();
    let d = tools.iter().find(|t| t.name == "execute_code").unwrap();
    assert!(
        d.description
            .as_deref()
            .unwrap()
            .contains("\n- remote: server-everything over Streamable HTTP"),
        "{:?}",
        d.description
    );

    // Six 1-second calls gathered, at most two in flight: three waves, about 3 s (with
    // no bound, about 1 s).
    let code = r#"
import asyncio, json, time
from tools import remote
async def six():
    return await asyncio.gather(*[remote.trigger_long_running_operation.aio(duration=1, steps=1) for _ in range(6)])
t = time.perf_counter()
r = asyncio.run(six())
print(json.dumps({"n": len(r), "s": time.perf_counter() - t}))
"#;
    let (out, err, _) = run(&peer, code).await;
    let v = last_json(&out, &err);
    assert_eq!(v["n"], 6, "{v}");
    let secs = v["s"].as_f64().unwrap();
    assert!(
        (2.8..6.0).contains(&secs),
        "6 calls of 1 s, 2 at once: {secs} s"
    );

    // Progress of the upstream call reaches our client as progress of execute_code (rmcp's
    // client asks for progress on every request).
    rec.progress.lock().unwrap().clear();
    let mut args = serde_json::Map::new();
    args.insert(
        "code".into(),
        json!("from tools import remote\nprint(remote.trigger_long_running_operation(duration=2, steps=4))"),
    );
    let params = CallToolRequestParams::new("execute_code").with_arguments(args);
    let r = peer.call_tool(params).await.unwrap();
    let out = r.structured_content.unwrap()["stdout"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(out.contains("Long running operation completed"), "{out}");
    let got = rec.progress.lock().unwrap().clone();
    let upstream: Vec<&String> = got
        .iter()
        .filter(|l| l.contains("remote.trigger-long-running-operation"))
        .collect();
    assert!(upstream.len() >= 3, "upstream progress: {got:?}");
    assert!(
        got.iter()
            .any(|l| l.contains("remote.trigger-long-running-operation: 4/4")),
        "{got:?}"
    );
    let values: Vec<f64> = got
        .iter()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "progress values must increase: {got:?}"
    );

    // The run's timeout kills it while a call is in flight: the upstream sees the call
    // cancelled (notifications/cancelled), well before the call would have ended.
    let (out, err, rep) = run_with(
        &peer,
        "from tools import check\ncheck.wait(seconds=60)\nprint('returned')",
        5,
    )
    .await;
    assert_eq!(rep["timed_out"], true, "{rep} {err}");
    assert!(!out.contains("returned"));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let log = std::fs::read_to_string(&cancel_log).unwrap_or_default();
        if log.contains("cancelled") {
            assert_eq!(log, "started\ncancelled\n");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the upstream saw no cancellation: {log:?}\n{}",
            s.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(client);
}

/// A destructive tool the operator has not allowed: our client's user is asked through
/// MCP elicitation when the client declared it; approved, the call goes through;
/// declined, ToolDenied. (Without the capability: ToolDenied without asking, tested in
/// everything_and_filesystem_through_execute_code.)
#[tokio::test]
async fn destructive_tools_ask_the_clients_user() {
    let dir = TempDir::new("c");
    let root = dir.0.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let s = start("codemode-c", &everything_and_filesystem(&root), &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    for approve in [true, false] {
        let rec = Recorder {
            consent: Some(approve),
            ..Recorder::default()
        };
        let client = recorder_client(&s, &rec).await;
        let target = root.join(format!("consent-{approve}.txt"));
        let code = format!(
            "import tools\nfrom tools import filesystem\ntry:\n    filesystem.write_file(path={:?}, content='approved')\n    print('written')\nexcept tools.ToolDenied as e:\n    print('ToolDenied', e)",
            target.display().to_string()
        );
        let (out, err, _) = run(client.peer(), &code).await;
        let asked = rec.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "{asked:?} {out} {err}");
        assert!(
            asked[0].contains("write_file") && asked[0].contains("filesystem"),
            "{asked:?}"
        );
        if approve {
            assert_eq!(out.trim(), "written", "{err}");
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "approved");
        } else {
            assert!(
                out.starts_with("ToolDenied") && out.contains("declined"),
                "{out} {err}"
            );
            assert!(!target.exists());
        }
        drop(client);
    }
}
