//! Issue 24, the general defence: a fuzzer over every tool's arguments, through a real
//! client (rmcp over Streamable HTTP) against the real server binary on real Docker.
//!
//! The tools come from `tools/list`, so a tool added later is covered without a change
//! here. For each tool and each argument of its `inputSchema`, the argument is given
//! boundary values (0, 1, -1, the schema's maximum and one past it, 2^53, 2^63, 2^64, the
//! extremes of i64 and f64, empty and very long strings, wrong types, nulls, deep JSON,
//! Unicode separators and bidi controls, control characters, paths) while the other
//! required arguments keep plausible values. Each call must answer within [`CALL_LIMIT`]
//! with a result or a structured error (a protocol error names the argument, and quotes at
//! most a short prefix of a value); between tools `/healthz` must answer at once, and the
//! server's RSS stays within [`RSS_GROWTH`] of where it started.
//!
//! `MCE_TEST_BIN=/path/to/mcp-code-executor` fuzzes another build (an older one, say).
//!
//! Bounded in time: values refused before a run cost a few milliseconds; the values that
//! do run code run `pass`-sized programs. Installs go to a package index that does not
//! exist (a missing directory), so they fail fast instead of fetching.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rmcp::model::{CallToolRequestParams, Tool};
use rmcp::RoleClient;
use serde_json::{json, Map, Value};

use crate::common;
use crate::process;

use process::Server;

/// The longest a call may take, run or not (a cold sandbox on a loaded 2-core host takes
/// a second or two; a call that never answers is what this catches).
const CALL_LIMIT: Duration = Duration::from_secs(15);
/// `/healthz` between tools.
const HEALTH_LIMIT: Duration = Duration::from_secs(3);
/// Calls of one tool at once (the server's run slots: 4 by default).
const CONCURRENCY: usize = 4;
/// How much the server's RSS may grow over the whole fuzz.
const RSS_GROWTH: u64 = 400 << 20;
/// The longest message of a protocol error (it names the argument and quotes at most a
/// prefix of the value).
const ERROR_MESSAGE_MAX: usize = 1024;

/// The longest text of a tool error that is a refusal (no run): it quotes at most a short
/// prefix of what was sent.
const REFUSAL_MAX: usize = 4096;
/// The longest a call of a tool that reaches out (`openWorldHint`: installs from the
/// package index, missing here) may take.
const OPEN_WORLD_CALL_LIMIT: Duration = Duration::from_secs(60);

/// JSON nested `depth` levels: arrays, or objects.
fn deep(depth: usize, objects: bool) -> Value {
    let mut v = json!(1);
    for _ in 0..depth {
        v = if objects {
            json!({ "a": v })
        } else {
            json!([v])
        };
    }
    v
}

/// The values every argument gets, whatever its type (each a wrong type for most).
fn universal_values() -> Vec<(String, Value)> {
    let long = "a".repeat((2 << 20) + 1);
    let mut v: Vec<(String, Value)> = vec![
        ("null".into(), Value::Null),
        ("true".into(), json!(true)),
        ("false".into(), json!(false)),
        ("0".into(), json!(0)),
        ("1".into(), json!(1)),
        ("-1".into(), json!(-1)),
        ("0.5".into(), json!(0.5)),
        ("1.5".into(), json!(1.5)),
        ("-0.0".into(), json!(-0.0)),
        ("2^31".into(), json!(1u64 << 31)),
        ("2^32".into(), json!(1u64 << 32)),
        ("2^53+1".into(), json!((1u64 << 53) + 1)),
        ("2^63-1".into(), json!(i64::MAX)),
        ("2^63".into(), json!(1u64 << 63)),
        ("2^64-1".into(), json!(u64::MAX)),
        ("2^64".into(), json!(18446744073709551616.0f64)),
        ("-2^63".into(), json!(i64::MIN)),
        ("1e308".into(), json!(1e308)),
        ("-1e308".into(), json!(-1e308)),
        ("5e-324".into(), json!(5e-324)),
        ("\"\"".into(), json!("")),
        ("\" \"".into(), json!(" ")),
        ("\"a\"".into(), json!("a")),
        ("\"0\"".into(), json!("0")),
        ("\"-1\"".into(), json!("-1")),
        ("\"1e999\"".into(), json!("1e999")),
        ("\"NaN\"".into(), json!("NaN")),
        ("2 MiB string".into(), json!(long)),
        ("64 KiB of é".into(), json!("é".repeat(32 << 10))),
        ("U+2028".into(), json!("a\u{2028}b")),
        ("U+2029".into(), json!("\u{2029}")),
        ("U+202E".into(), json!("a\u{202E}txt.py")),
        ("U+FEFF".into(), json!("\u{FEFF}a")),
        ("U+200B".into(), json!("a\u{200B}")),
        ("NUL".into(), json!("a\u{0}b")),
        ("control chars".into(), json!("\u{1}\u{7}\u{1b}[2J\r\n\t")),
        ("newline".into(), json!("a\nb")),
        ("emoji".into(), json!("😀")),
        ("dotdot".into(), json!("../../../../etc/passwd")),
        ("absolute".into(), json!("/etc/passwd")),
        ("slash".into(), json!("/")),
        ("dot".into(), json!(".")),
        ("backslash".into(), json!("a\\..\\b")),
        ("percent".into(), json!("%00%2e%2e%2f")),
        ("[]".into(), json!([])),
        ("[\"\"]".into(), json!([""])),
        ("[null]".into(), json!([null])),
        ("[1]".into(), json!([1])),
        ("10,000 empty strings".into(), json!(vec![""; 10_000])),
        ("[2 MiB string]".into(), json!(["b".repeat(2 << 20)])),
        ("{}".into(), json!({})),
        ("{\"a\":1}".into(), json!({"a": 1})),
        ("deep array (100)".into(), deep(100, false)),
        ("deep object (100)".into(), deep(100, true)),
    ];
    v.shrink_to_fit();
    v
}

/// The values an argument gets beyond the universal ones, from its own schema: the
/// maximum and one past it, the length limits and one past them, the enum values.
fn schema_values(prop: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut schemas = vec![prop.clone()];
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(a)) = prop.get(key) {
            schemas.extend(a.iter().cloned());
        }
    }
    for s in &schemas {
        for key in ["maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"] {
            if let Some(n) = s.get(key).and_then(Value::as_f64) {
                out.push((key.to_string(), json!(n)));
                out.push((format!("{key}+1"), json!(n + 1.0)));
                out.push((format!("{key}-1"), json!(n - 1.0)));
            }
        }
        for key in ["maxLength", "minLength"] {
            if let Some(n) = s.get(key).and_then(Value::as_u64) {
                out.push((key.to_string(), json!("x".repeat(n as usize))));
                out.push((format!("{key}+1"), json!("x".repeat(n as usize + 1))));
            }
        }
        if let Some(Value::Array(e)) = s.get("enum") {
            for (i, x) in e.iter().enumerate() {
                out.push((format!("enum[{i}]"), x.clone()));
            }
        }
    }
    out
}

/// A plausible value for an argument that is not the one being fuzzed: the known names
/// first, else one of its type. Chosen so that a call with only plausible values runs
/// little (`pass`) or nothing.
fn plausible(name: &str, prop: &Value, seeds: &Seeds) -> Value {
    match name {
        "code" => return json!("pass"),
        "content" => return json!("x = 1\n"),
        "path" => return json!("fuzz.txt"),
        "file_path" => return json!(seeds.code_file.clone()),
        "filename" => return json!("fuzz"),
        "packages" => return json!(["fuzz-no-such-package"]),
        "type" => return json!("venv"),
        "encoding" => return json!("text"),
        "timeout" => return json!(5),
        _ => {}
    }
    let ty = |s: &Value| s.get("type").and_then(Value::as_str).map(str::to_string);
    let t = ty(prop).or_else(|| {
        prop.get("anyOf")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().filter_map(ty).find(|t| t != "null"))
    });
    match t.as_deref() {
        Some("integer") | Some("number") => json!(1),
        Some("boolean") => json!(false),
        Some("array") => json!([]),
        Some("object") => json!({}),
        _ => json!("fuzz"),
    }
}

/// What the fuzz made on the server first, for the arguments that name existing things.
struct Seeds {
    code_file: String,
}

/// What one call did.
enum Answer {
    /// A tool result; for a tool error without structured content (a refusal, not a run
    /// that failed), the length of its text.
    Result { refusal_len: Option<usize> },
    /// A protocol error: its message.
    Error(String),
    /// No answer within [`CALL_LIMIT`].
    Hung,
}

async fn call_once(
    client: &rmcp::Peer<RoleClient>,
    tool: &str,
    args: Map<String, Value>,
    limit: Duration,
) -> (Answer, Duration) {
    let t0 = Instant::now();
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    let answer = match tokio::time::timeout(limit, client.call_tool(params)).await {
        Ok(Ok(r)) => Answer::Result {
            refusal_len: (r.is_error == Some(true) && r.structured_content.is_none()).then(|| {
                r.content
                    .iter()
                    .filter_map(|c| c.as_text())
                    .map(|t| t.text.len())
                    .sum()
            }),
        },
        Ok(Err(rmcp::ServiceError::McpError(e))) => Answer::Error(e.message.to_string()),
        Ok(Err(e)) => Answer::Error(e.to_string()),
        Err(_) => Answer::Hung,
    };
    (answer, t0.elapsed())
}

/// The fuzz: every tool from `tools/list`, every argument, every value. Fails with the list
/// of calls that did not answer in time, protocol errors that quote too much, or the
/// moments the server stopped answering `/healthz`; prints the case count and the time.
#[tokio::test]
async fn every_tool_argument_at_its_boundaries_answers_and_the_server_stays_up() {
    let t_start = Instant::now();
    let s = Server::start(
        "fuzz",
        &[],
        &[
            // Installs fail at once: an index that is a missing directory (no network, no
            // retries).
            ("PIP_INDEX_URL", "file:///nonexistent-fuzz-index/simple"),
        ],
    )
    .await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let tools: Vec<Tool> = peer.list_all_tools().await.expect("tools/list");
    assert!(tools.len() >= 14, "tools/list: {}", tools.len());

    // What the plausible values name: a stored code file, a workspace file.
    let made = peer
        .call_tool(
            CallToolRequestParams::new("initialize_code_file").with_arguments(
                json!({"content": "pass\n", "filename": "fuzz"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .expect("initialize_code_file");
    let code_file = made
        .structured_content
        .as_ref()
        .and_then(|v| v["file_path"].as_str())
        .expect("file_path")
        .to_string();
    let seeds = Seeds { code_file };
    let wrote = peer
        .call_tool(
            CallToolRequestParams::new("write_file").with_arguments(
                json!({"path": "fuzz.txt", "content": "hi"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .expect("write_file");
    assert_ne!(wrote.is_error, Some(true), "{wrote:?}");

    let rss_start = s.rss();
    let peak = process::Peak::start(s.pid());

    let universal = universal_values();
    let mut problems: Vec<String> = Vec::new();
    let mut cases = 0usize;
    let mut slowest: (Duration, String) = (Duration::ZERO, String::new());
    let mut per_tool: BTreeMap<String, (usize, Duration)> = BTreeMap::new();
    let mut dead = false;
    'tools: for tool in &tools {
        let name = tool.name.to_string();
        let t_tool = Instant::now();
        let open_world = tool
            .annotations
            .as_ref()
            .and_then(|a| a.open_world_hint)
            .unwrap_or(true);
        let limit = if open_world {
            OPEN_WORLD_CALL_LIMIT
        } else {
            CALL_LIMIT
        };
        let props: Map<String, Value> = tool
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let required: Vec<String> = tool
            .input_schema
            .get("required")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let base: Map<String, Value> = required
            .iter()
            .map(|r| {
                (
                    r.clone(),
                    plausible(r, props.get(r).unwrap_or(&Value::Null), &seeds),
                )
            })
            .collect();
        // The call as a whole: nothing, an unknown argument, the plausible one.
        let mut calls: Vec<(String, Map<String, Value>)> = vec![
            ("no arguments".into(), Map::new()),
            ("unknown argument".into(), {
                let mut m = base.clone();
                m.insert(
                    "no_such_argument\u{2028}".into(),
                    json!("x".repeat(100_000)),
                );
                m
            }),
            ("plausible".into(), base.clone()),
        ];
        for (arg, prop) in &props {
            let mut values = universal.clone();
            values.extend(schema_values(prop));
            for (label, v) in values {
                let mut m = base.clone();
                // Optional arguments other than this one are left out.
                m.insert(arg.clone(), v);
                calls.push((format!("{arg}={label}"), m));
            }
        }
        let mut answers = futures::stream::iter(calls.into_iter().map(|(label, args)| {
            let (peer, name) = (peer.clone(), name.clone());
            async move {
                let (answer, took) = call_once(&peer, &name, args, limit).await;
                (label, answer, took)
            }
        }))
        // Installs into one environment go one at a time in the server: a tool that reaches
        // out is called one value at a time, so that each call's time is its own.
        .buffer_unordered(if open_world { 1 } else { CONCURRENCY });
        while let Some((label, answer, took)) = answers.next().await {
            cases += 1;
            let case = format!("{name}({label})");
            if took > slowest.0 {
                slowest = (took, case.clone());
            }
            match answer {
                Answer::Hung => {
                    problems.push(format!("{case}: no answer within {limit:?}"));
                    if let Err(e) = s.healthy(HEALTH_LIMIT).await {
                        problems.push(format!("after {case}: {e}: the server stopped answering"));
                        dead = true;
                        break 'tools;
                    }
                }
                Answer::Error(m) if m.len() > ERROR_MESSAGE_MAX => problems.push(format!(
                    "{case}: a protocol error of {} bytes (at most {ERROR_MESSAGE_MAX}): {}…",
                    m.len(),
                    m.chars().take(200).collect::<String>()
                )),
                Answer::Result {
                    refusal_len: Some(n),
                } if n > REFUSAL_MAX => problems.push(format!(
                    "{case}: a tool error (refusal) of {n} bytes (at most {REFUSAL_MAX})"
                )),
                Answer::Error(_) | Answer::Result { .. } => {}
            }
        }
        let e = per_tool.entry(name.clone()).or_default();
        e.1 += t_tool.elapsed();
        e.0 = cases;
        if let Err(e) = s.healthy(HEALTH_LIMIT).await {
            problems.push(format!("after {name}: {e}"));
            dead = true;
            break;
        }
    }
    // The retry of a 2026-07-28 call that asked the user (#46): `requestState` and
    // `inputResponses` of every shape, on every tool that may ask. None names a run
    // waiting here: each must be refused at once with a short protocol error.
    if !dead {
        let states: Vec<(String, Value)> = universal
            .iter()
            .filter(|(_, v)| v.is_string())
            .cloned()
            .chain([(
                "a well-formed state".to_string(),
                json!(format!("q_{}_{}", "0".repeat(8), "f".repeat(32))),
            )])
            .collect();
        for tool in ["execute_code", "execute_code_file", "execute_python"] {
            for (slabel, state) in &states {
                for (rlabel, response) in universal.iter().take(12) {
                    cases += 1;
                    let case = format!("{tool}(requestState={slabel}, consent={rlabel})");
                    let mut params = CallToolRequestParams::new(tool.to_string())
                        .with_arguments(json!({"code": "pass"}).as_object().unwrap().clone());
                    params.request_state = Some(state.as_str().unwrap().to_string());
                    params.input_responses =
                        Some([("consent".to_string(), response.clone())].into());
                    let t0 = Instant::now();
                    match tokio::time::timeout(CALL_LIMIT, peer.call_tool(params)).await {
                        Ok(Err(rmcp::ServiceError::McpError(e)))
                            if e.message.len() <= ERROR_MESSAGE_MAX => {}
                        Ok(other) => problems.push(format!(
                            "{case}: not a short protocol error: {}",
                            format!("{other:?}").chars().take(300).collect::<String>()
                        )),
                        Err(_) => problems.push(format!("{case}: no answer within {CALL_LIMIT:?}")),
                    }
                    if t0.elapsed() > slowest.0 {
                        slowest = (t0.elapsed(), case);
                    }
                }
            }
        }
    }
    let peak = peak.get();
    let took = t_start.elapsed();
    println!(
        "fuzz: {cases} calls over {} tools in {:.1} s; slowest call {:.2} s ({}); RSS {} MiB at the start, peak {} MiB",
        tools.len(),
        took.as_secs_f64(),
        slowest.0.as_secs_f64(),
        slowest.1,
        rss_start >> 20,
        peak >> 20
    );
    for (t, (_, d)) in &per_tool {
        println!("  {t}: {:.1} s", d.as_secs_f64());
    }
    if peak > rss_start + RSS_GROWTH {
        problems.push(format!(
            "RSS grew from {} MiB to {} MiB (at most {} MiB more)",
            rss_start >> 20,
            peak >> 20,
            RSS_GROWTH >> 20
        ));
    }
    if !dead {
        drop(client);
    }
    assert!(
        problems.is_empty(),
        "{} problems in {cases} calls:\n{}\n--- server log (tail) ---\n{}",
        problems.len(),
        problems.join("\n"),
        s.log_tail(40)
    );
}
