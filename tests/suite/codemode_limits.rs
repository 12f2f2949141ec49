//! Code mode's bounds against hostile code (#42, findings 1 and 6): the memory one run's
//! tool calls make the server hold, and what refused calls cost (budget, log). The
//! upstream is a real MCP server written with the official Python SDK (`MCPServer`, from
//! `target/py-sdk`): a tool that takes a list and holds the call for seconds.

use std::time::Duration;

use crate::codemode::{last_json, run_with, start, TempDir};
use crate::{common, process};

/// An upstream whose `hold` tool takes any list and answers after `seconds`.
const HOLD: &str = r#"
import asyncio
from mcp.server.mcpserver import MCPServer

app = MCPServer("hold")


@app.tool()
async def hold(data: list, seconds: float = 2.0) -> str:
    """Wait `seconds`, then say how long `data` was."""
    await asyncio.sleep(seconds)
    return "held %d" % len(data)


app.run()
"#;

fn hold_tools(dir: &TempDir) -> String {
    let script = dir.0.join("hold.py");
    std::fs::write(&script, HOLD).unwrap();
    format!(
        "[limits]\ncall_timeout_s = 60\n[[servers]]\nname = \"hold\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        common::sdk_python().display(),
        script.display()
    )
}

const MIB: u64 = 1 << 20;

/// The review's attack: 100 concurrent calls of about 1 MB each (a list of 340,000 zeros,
/// about 17 MB once parsed) to a slow tool. Before: every request was parsed at once and
/// held (and cloned) while waiting for one of 8 slots: the server went from 32 to 2,200
/// MiB. Now a run's calls hold at most `pending_bytes` (64 MiB by default, weighed as
/// parsed): the first calls run, the rest are refused at once with a clear reason. The
/// frames are written straight onto the channel, all before any answer is read, and the
/// tool holds each call 15 s, so that every call is pending at once.
#[tokio::test]
async fn a_hundred_big_concurrent_calls_keep_the_server_small() {
    let dir = TempDir::new("mem");
    let s = start("codemode-mem", &hold_tools(&dir), &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    // The upstream starts (and the run's path warms) before the measure.
    let (out, err, _) = run_with(
        &peer,
        "from tools import hold\nprint(hold.hold(data=[1, 2], seconds=0))",
        60,
    )
    .await;
    assert!(out.contains("held 2"), "{out}\n{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = process::rss(s.pid());
    let peak = process::Peak::start(s.pid());
    // The frames go straight onto the channel, all 100 before any answer is read (the
    // package's own calls may be spaced by its threads).
    let code = r#"
import json, os, socket, struct
s = socket.socket(fileno=os.dup(5))
data = [0] * 340000
for i in range(100):
    b = json.dumps({"id": i, "op": "call", "server": "hold", "tool": "hold",
                    "arguments": {"data": data, "seconds": 15}}).encode()
    s.sendall(struct.pack(">I", len(b)) + b)
r = []
for i in range(100):
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    a = json.loads(s.recv(n, socket.MSG_WAITALL))
    r.append("ok:" + json.dumps(a["content"]) if "content" in a else a["error"]["type"] + ":" + a["error"]["message"])
refused = [x for x in r if "pending_bytes" in x]
print(json.dumps({"ok": sum(x.startswith("ok:") for x in r), "refused": len(refused),
                  "sample": refused[:1], "other": [x for x in r if not x.startswith("ok:") and x not in refused][:3]}))
"#;
    let (out, err, _) = run_with(&peer, code, 90).await;
    let peak = peak.get();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = process::rss(s.pid());
    eprintln!(
        "server RSS: {} MiB before, peak {} MiB, {} MiB after",
        before / MIB,
        peak / MIB,
        after / MIB
    );
    let v = last_json(&out, &err);
    assert_eq!(v["other"], serde_json::json!([]), "{v}");
    assert!(v["ok"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(
        v["ok"].as_u64().unwrap() + v["refused"].as_u64().unwrap(),
        100,
        "{v}"
    );
    let sample = v["sample"][0].as_str().unwrap_or_default();
    assert!(
        sample.starts_with("ToolError:") && sample.contains("wait for some calls to end"),
        "{v}"
    );
    assert!(
        peak < before + 200 * MIB,
        "the server grew from {} to {} MiB during one run's calls",
        before / MIB,
        peak / MIB
    );
    drop(client);
}

/// Refused calls count against the run's budget (before: 20,000 refused calls in 7.4 s,
/// none refused for the budget, each logged), only the first refusal past the budget is
/// logged, and a name the code sends reaches the log escaped and capped (before: a name
/// holding a newline and a fake `INFO …oauth: FORGED admin sign-in` was a log line of its
/// own; 1 MiB names were logged whole).
#[tokio::test]
async fn refused_calls_count_and_names_never_forge_or_flood_the_log() {
    let dir = TempDir::new("log");
    let s = start("codemode-log", &hold_tools(&dir), &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let code = r#"
import json, os, socket, struct
s = socket.socket(fileno=os.dup(5))
def ask(req):
    b = json.dumps(req).encode()
    s.sendall(struct.pack(">I", len(b)) + b)
    n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]
    return json.loads(s.recv(n, socket.MSG_WAITALL))
forged = ask({"id": 1, "op": "call", "tool": "t",
              "server": "x\n2026-11-28T00:00:00.000000Z  INFO mcp_code_executor::tenancy::oauth: FORGED admin sign-in"})
named = ask({"id": 2, "op": "call", "server": "hold", "tool": "y" * 500000})
kinds = {}
for i in range(2000):
    a = ask({"id": 3 + i, "op": "call", "server": "nope", "tool": "t"})
    kinds[a["error"]["type"]] = kinds.get(a["error"]["type"], 0) + 1
print(json.dumps({"forged": forged["error"]["type"], "named": named["error"], "kinds": kinds}))
"#;
    let (out, err, _) = run_with(&peer, code, 120).await;
    let v = last_json(&out, &err);
    assert_eq!(v["forged"], "ToolDenied", "{v}");
    assert_eq!(v["named"]["type"], "ToolDenied", "{v}");
    assert!(
        v["named"]["message"].as_str().unwrap().len() < 300,
        "the refusal repeats the name whole: {} bytes",
        v["named"]["message"].as_str().unwrap().len()
    );
    // 100 calls: the forged one, the long name, 98 to a server that is not there; then
    // the budget.
    assert_eq!(v["kinds"]["ToolDenied"], 98, "{v}");
    assert_eq!(v["kinds"]["BudgetExceeded"], 1902, "{v}");
    let log = s.stderr();
    assert!(
        !log.lines().any(|l| l.starts_with("2026-11-28T00:00:00")),
        "a forged log line:\n{log}"
    );
    assert!(
        log.lines()
            .filter(|l| l.contains("FORGED"))
            .all(|l| l.contains("x\\n2026")),
        "{log}"
    );
    let lines = log
        .lines()
        .filter(|l| l.contains("code mode: tool call"))
        .count();
    assert_eq!(lines, 100, "one log line per call within the budget");
    assert_eq!(
        log.matches("has used its tool-call budget").count(),
        1,
        "{log}"
    );
    assert!(
        log.len() < 200_000,
        "{} bytes of log for 2,002 refused calls",
        log.len()
    );
    drop(client);
}

/// An upstream that crashes on `crash`, blocks its own loop on `wedge` and answers `big`
/// with `n` bytes of text.
const FLAKY: &str = r#"
import os
import time
from mcp.server.mcpserver import MCPServer

app = MCPServer("flaky")


@app.tool()
async def crash() -> str:
    """Exit the server."""
    os._exit(1)


@app.tool()
async def wedge() -> str:
    """Block the server's loop for two minutes."""
    time.sleep(120)
    return "late"


@app.tool()
async def echo(message: str) -> str:
    """Say it back."""
    return message


@app.tool()
async def big(n: int) -> str:
    """Answer with n bytes of text."""
    return "x" * n


app.run()
"#;

fn flaky_tools(dir: &TempDir, call_timeout_s: u64) -> String {
    let script = dir.0.join("flaky.py");
    std::fs::write(&script, FLAKY).unwrap();
    format!(
        "[limits]\ncall_timeout_s = {call_timeout_s}\n[[servers]]\nname = \"flaky\"\ncommand = \"{}\"\nargs = [\"{}\"]\n",
        common::sdk_python().display(),
        script.display()
    )
}

/// Finding 7: a crashing upstream is started again at once the first time, then only
/// after a doubling wait, during which calls fail at once saying why (before: one run
/// restarted it 99 times in 27.8 s). A hung upstream (a tool blocking its loop) is replaced
/// after a call times out and a ping goes unanswered (before: it wedged the tenant's
/// upstream, and another run's `echo` timed out).
#[tokio::test]
async fn a_crashing_upstream_backs_off_and_a_hung_one_is_replaced() {
    let dir = TempDir::new("flaky");
    let s = start("codemode-flaky", &flaky_tools(&dir, 3), &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let code = r#"
import json, time, tools
from tools import flaky
msgs, t0 = [], time.time()
for i in range(20):
    try:
        flaky.crash()
    except tools.ToolError as e:
        msgs.append(str(e))
print(json.dumps({"s": time.time() - t0, "msgs": msgs}))
"#;
    let (out, err, _) = run_with(&peer, code, 120).await;
    let v = last_json(&out, &err);
    let starts = s.stderr().matches("upstream server started").count();
    assert!(
        (1..=3).contains(&starts),
        "{starts} starts for 20 crashing calls: {v}"
    );
    assert!(
        v["msgs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().contains("it is started again in")),
        "{v}"
    );

    // Past the wait, a healthy call works and ends the streak; then a hung upstream.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (out, err, _) = run_with(
        &peer,
        "import tools\nfrom tools import flaky\nprint(flaky.echo(message='back'))\ntry:\n    flaky.wedge()\nexcept tools.ToolTimeout as e:\n    print('timeout', e)",
        60,
    )
    .await;
    assert!(
        out.contains("back") && out.contains("timeout"),
        "{out}\n{err}"
    );
    // The ping after the timeout goes unanswered within 5 s.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let (out, err, _) = run_with(
        &peer,
        "from tools import flaky\nprint('ok', flaky.echo(message='hi'))",
        60,
    )
    .await;
    assert!(
        out.starts_with("ok ") && out.contains("hi"),
        "{out}\n{err}\n{}",
        s.log_tail(20)
    );
    assert!(
        s.stderr().contains("did not answer a ping"),
        "{}",
        s.log_tail(20)
    );
    drop(client);
}

/// Finding 7, the rest: an upstream's answer over rmcp's 16 MiB line limit was dropped by
/// rmcp and the call waited out `call_timeout_s` (here 60 s). Now a message over the limit
/// ends that upstream's connection: the call fails at once saying why, and the next call
/// starts the upstream again.
#[tokio::test]
async fn an_answer_over_sixteen_mib_fails_at_once_and_the_upstream_starts_again() {
    let dir = TempDir::new("big");
    let s = start("codemode-big", &flaky_tools(&dir, 60), &dir.0, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let code = r#"
import json, time, tools
from tools import flaky
def size(a):
    return len(a["result"] if isinstance(a, dict) else a)
r = {"small": size(flaky.big(n=1000))}
t0 = time.time()
try:
    flaky.big(n=17 * 1024 * 1024)
    r["big"] = "answered"
except tools.ToolError as e:
    r["big"] = str(e)
r["s"] = time.time() - t0
r["again"] = size(flaky.big(n=10))
print(json.dumps(r))
"#;
    let (out, err, _) = run_with(&peer, code, 120).await;
    let v = last_json(&out, &err);
    assert_eq!(v["small"], 1000, "{v}");
    assert!(
        v["big"].as_str().unwrap().contains("over 16 MiB"),
        "{v}\n{}",
        s.log_tail(20)
    );
    assert!(v["s"].as_f64().unwrap() < 20.0, "the call waited: {v}");
    assert_eq!(v["again"], 10, "{v}");
    assert_eq!(
        s.stderr().matches("upstream server started").count(),
        2,
        "{}",
        s.log_tail(20)
    );
    drop(client);
}
