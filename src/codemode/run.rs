//! One run's (or one cell's) requests from the sandbox: the catalog, and calls checked
//! against the policy, made upstream, bounded and answered.
//!
//! Every request is weighed before anything is built from it: a request over
//! `argument_bytes` is refused unparsed; an admitted call holds its request's bytes plus
//! what its arguments take once parsed ([`footprint`]) against the run's `pending_bytes`
//! until it ends, so the calls one run keeps waiting and in flight hold a bounded part of
//! the server's memory. The arguments are parsed once, after the call has its in-flight
//! slot, checked against the schema in place and moved into the upstream request.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, Tool};
use serde_json::{json, Map, Value};

use super::frame::{footprint, Envelope, Shown};
use super::{names, schema, Caller, Manager};
use crate::backend::protocol::encode_tool_answer;
use crate::job::ToolRun;

/// One run's (or one cell's) calls.
pub(super) struct Run {
    manager: Arc<Manager>,
    tenant: String,
    /// Call requests so far (refused and malformed ones too): past `calls_per_run`,
    /// `BudgetExceeded`.
    calls: AtomicU32,
    /// Catalog requests so far: at most `calls_per_run` too.
    catalogs: AtomicU32,
    /// The budget's refusal has been logged (once per run: later ones are counted only).
    over_logged: AtomicBool,
    in_flight: tokio::sync::Semaphore,
    /// The run's `pending_bytes`, in KiB: what its admitted calls hold.
    pending: tokio::sync::Semaphore,
    /// Our client: upstream progress goes to it, and it may consent to destructive tools.
    caller: Option<Arc<dyn Caller>>,
}

/// The unit of [`Run::pending`]'s permits.
const KIB: u64 = 1024;

impl Run {
    pub(super) fn new(
        manager: Arc<Manager>,
        tenant: String,
        caller: Option<Arc<dyn Caller>>,
    ) -> Run {
        let limits = &manager.config.limits;
        let in_flight = tokio::sync::Semaphore::new(limits.in_flight as usize);
        let pending = tokio::sync::Semaphore::new(
            (limits.pending_bytes / KIB).min(tokio::sync::Semaphore::MAX_PERMITS as u64) as usize,
        );
        Run {
            manager,
            tenant,
            calls: AtomicU32::new(0),
            catalogs: AtomicU32::new(0),
            over_logged: AtomicBool::new(false),
            in_flight,
            pending,
            caller,
        }
    }
}

/// Logs a call whose future was dropped before it ended: the run ended, timed out or was
/// cancelled, and the rmcp request went with it (`notifications/cancelled` upstream).
struct Cancelled<'a> {
    tenant: &'a str,
    server: &'a str,
    tool: &'a str,
    known: &'a Known,
    started: Instant,
    armed: bool,
}

/// What a call turned out to name: a server of the tenant's, a tool that server has.
#[derive(Default)]
struct Known {
    server: std::sync::atomic::AtomicBool,
    tool: std::sync::atomic::AtomicBool,
}

impl Known {
    fn get(&self) -> (bool, bool) {
        (
            self.server.load(Ordering::SeqCst),
            self.tool.load(Ordering::SeqCst),
        )
    }
}

impl Drop for Cancelled<'_> {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(tenant = %self.tenant, server = %Shown(self.server), tool = %Shown(self.tool), "code mode: tool call cancelled (the run ended)");
            let (s, t) = labels(self.known.get(), self.server, self.tool);
            crate::codemode::metrics::tool_calls().call(
                self.tenant,
                s,
                t,
                "cancelled",
                self.started.elapsed().as_secs_f64(),
            );
        }
    }
}

/// Metric labels: the server and tool a call named when they exist for the tenant, else
/// a fixed placeholder (a forged request must not mint label values).
fn labels<'a>(known: (bool, bool), server: &'a str, tool: &'a str) -> (&'a str, &'a str) {
    match known {
        (true, true) => (server, tool),
        (true, false) => (server, "(other)"),
        _ => ("(other)", "(other)"),
    }
}

/// An answer the code raises: `ToolError`, `ToolDenied`, `ToolTimeout`, `BudgetExceeded`.
struct Raise(&'static str, String, Option<Value>);

/// Describe a code-mode call's span: the upstream and tool as the metrics label them
/// (names the code made up are `(other)`), and a failure's kind.
fn traced(span: &mut crate::telemetry::Span, server: &str, tool: &str, outcome: &'static str) {
    span.set("mcp_executor.upstream", server.to_string());
    span.set("gen_ai.tool.name", tool.to_string());
    if outcome != "ok" {
        span.fail(outcome);
    }
}

fn denied(msg: String) -> Raise {
    Raise("ToolDenied", msg, None)
}

#[async_trait::async_trait]
impl ToolRun for Run {
    async fn answer(&self, request: Vec<u8>) -> Vec<u8> {
        let envelope = Envelope::parse(&request);
        let body = match envelope.op.as_deref() {
            Some("catalog") => self.catalog_request().await,
            Some("call") => self.call(&envelope, request.len()).await,
            _ => {
                // Counted as a call: a flood of malformed requests ends at the budget too.
                self.calls.fetch_add(1, Ordering::SeqCst);
                Err(Raise(
                    "ToolError",
                    "a malformed request (no known `op`)".into(),
                    None,
                ))
            }
        };
        let mut answer = match body {
            Ok(Value::Object(m)) => Value::Object(m),
            Ok(other) => json!({ "value": other }),
            Err(Raise(kind, message, content)) => {
                let mut e = json!({ "type": kind, "message": message });
                if let Some(c) = content {
                    e["content"] = c;
                }
                json!({ "error": e })
            }
        };
        answer["kind"] = json!("tool");
        answer["id"] = envelope.id();
        encode_tool_answer(&answer)
    }

    fn calls(&self) -> u64 {
        u64::from(self.calls.load(Ordering::SeqCst))
    }
}

/// The refusal of a call past the run's budget.
fn over_budget(limit: u32) -> Raise {
    Raise(
        "BudgetExceeded",
        format!("this run has made its {limit} tool calls (calls_per_run)"),
        None,
    )
}

impl Run {
    /// A destructive tool the operator has not allowed: our client's user may approve it
    /// through MCP elicitation, when the client declared that it can be asked.
    async fn consent(&self, server: &str, tool: &str, limit: Duration) -> Result<(), Raise> {
        let refused =
            |why: &str| denied(format!("tool `{tool}` of `{server}` is destructive: {why}"));
        let Some(caller) = &self.caller else {
            return Err(refused(
                "the operator has not allowed it (allow_destructive) and no client is there to ask",
            ));
        };
        let question = format!(
            "Code running in the sandbox asks to call `{tool}` of the tool server `{server}`, which may change or delete data. Allow this call?"
        );
        match caller.consent(question, limit).await {
            Some(true) => {
                tracing::info!(tenant = %self.tenant, server = %server, tool = %tool, "code mode: destructive call approved by the client's user");
                Ok(())
            }
            Some(false) => Err(refused("the user declined it")),
            None => Err(refused("the operator has not allowed it (allow_destructive) and the client cannot be asked (no elicitation)")),
        }
    }

    async fn catalog(&self) -> Value {
        let mut servers = vec![];
        for s in self.manager.config.servers_for(&self.tenant) {
            let module = names::module(&s.name);
            let Some(u) = self.manager.upstream(&self.tenant, &s.name) else {
                continue;
            };
            let tools = match self.manager.connect(&u).await {
                Ok((_, tools)) => tools,
                Err(e) => {
                    tracing::warn!(tenant = %self.tenant, server = %s.name, error = %e, "code mode: upstream server unavailable");
                    servers.push(json!({
                        "name": s.name, "module": module, "tools": [],
                        "description": format!("unavailable: {e}"),
                    }));
                    continue;
                }
            };
            let allowed: Vec<&Tool> = tools.iter().filter(|t| s.allows(&t.name)).collect();
            let fnames =
                names::unique(&allowed.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>());
            let entries: Vec<Value> = allowed
                .iter()
                .zip(fnames)
                .map(|(t, f)| {
                    let props: Vec<&String> = t
                        .input_schema
                        .get("properties")
                        .and_then(Value::as_object)
                        .map(|p| p.keys().collect())
                        .unwrap_or_default();
                    let pnames =
                        names::unique(&props.iter().map(|p| p.as_str()).collect::<Vec<_>>());
                    let params: Vec<Value> = props
                        .iter()
                        .zip(pnames)
                        .map(|(p, n)| json!({ "name": n, "property": p }))
                        .collect();
                    json!({
                        "name": t.name,
                        "function": f,
                        "description": t.description,
                        "inputSchema": t.input_schema,
                        "outputSchema": t.output_schema,
                        "annotations": t.annotations,
                        "params": params,
                    })
                })
                .collect();
            servers.push(json!({ "name": s.name, "module": module, "tools": entries }));
        }
        json!({ "servers": servers })
    }

    /// A catalog request, within the run's budget of them.
    async fn catalog_request(&self) -> Result<Value, Raise> {
        let limit = self.manager.config.limits.calls_per_run;
        if self.catalogs.fetch_add(1, Ordering::SeqCst) >= limit {
            return Err(Raise(
                "BudgetExceeded",
                format!("this run has asked for the catalog {limit} times (calls_per_run)"),
                None,
            ));
        }
        Ok(self.catalog().await)
    }

    async fn call(&self, req: &Envelope<'_>, request_bytes: usize) -> Result<Value, Raise> {
        let server = req.server.as_deref().unwrap_or("");
        let tool = req.tool.as_deref().unwrap_or("");
        let started = Instant::now();
        let limits = &self.manager.config.limits;
        // Every call request counts, refused ones too: past the budget each is answered
        // at once, and only the first such refusal of a run is logged.
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n > limits.calls_per_run {
            if !self.over_logged.swap(true, Ordering::SeqCst) {
                tracing::info!(
                    tenant = %self.tenant, budget = limits.calls_per_run,
                    "code mode: the run has used its tool-call budget; its further calls are refused and counted, not logged"
                );
            }
            crate::codemode::metrics::tool_calls().call(
                &self.tenant,
                "(other)",
                "(other)",
                "BudgetExceeded",
                0.0,
            );
            return Err(over_budget(limits.calls_per_run));
        }
        let mut span = crate::telemetry::span("code_mode.call");
        let known = Known::default();
        let mut guard = Cancelled {
            tenant: &self.tenant,
            server,
            tool,
            known: &known,
            started,
            armed: true,
        };
        let mut upstream_us = 0;
        let result = span
            .scope(self.checked_call(server, tool, req, request_bytes, &known, &mut upstream_us))
            .await;
        guard.armed = false;
        let (outcome, result_bytes) = match &result {
            Ok((_, n)) => ("ok", *n),
            Err(Raise(kind, _, _)) => (*kind, 0),
        };
        tracing::info!(
            tenant = %self.tenant, server = %Shown(server), tool = %Shown(tool),
            argument_bytes = request_bytes, result_bytes, outcome,
            ms = started.elapsed().as_millis() as u64,
            us = started.elapsed().as_micros() as u64, upstream_us,
            calls = n, budget = limits.calls_per_run,
            "code mode: tool call"
        );
        let (s, t) = labels(known.get(), server, tool);
        traced(&mut span, s, t, outcome);
        crate::codemode::metrics::tool_calls().call(
            &self.tenant,
            s,
            t,
            outcome,
            started.elapsed().as_secs_f64(),
        );
        result.map(|(v, _)| v)
    }

    /// The weight of a call's request held against the run's `pending_bytes` until the
    /// call ends: its bytes and its arguments' parsed footprint. Refused at once when the
    /// run's calls hold too much already (waiting for room would hold the request anyway).
    fn admit(
        &self,
        req: &Envelope<'_>,
        request_bytes: usize,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, Raise> {
        let limits = &self.manager.config.limits;
        let parsed = match req.arguments {
            Some(raw) => {
                footprint(raw).ok_or_else(|| denied("the arguments are not valid JSON".into()))?
            }
            None => 0,
        };
        let weight = request_bytes as u64 + parsed;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        if weight > limits.pending_bytes {
            return Err(Raise(
                "ToolError",
                format!(
                    "the arguments would take {:.1} MiB of the server's memory once parsed, over the {:.1} MiB a run's calls may hold (pending_bytes): send less per call",
                    mib(weight),
                    mib(limits.pending_bytes)
                ),
                None,
            ));
        }
        let permits = weight.div_ceil(KIB).max(1) as u32;
        self.pending.try_acquire_many(permits).map_err(|_| {
            Raise(
                "ToolError",
                format!(
                    "this run's calls in flight and waiting already hold most of the {:.1} MiB they may (pending_bytes); this call needs {:.1} MiB: wait for some calls to end",
                    mib(limits.pending_bytes),
                    mib(weight)
                ),
                None,
            )
        })
    }

    async fn checked_call(
        &self,
        server: &str,
        tool: &str,
        req: &Envelope<'_>,
        request_bytes: usize,
        known: &Known,
        upstream_us: &mut u64,
    ) -> Result<(Value, usize), Raise> {
        let m = &self.manager;
        let limits = &m.config.limits;
        if request_bytes as u64 > limits.argument_bytes {
            return Err(denied(format!(
                "the arguments are over {} bytes (argument_bytes)",
                limits.argument_bytes
            )));
        }
        let Some(u) = m.upstream(&self.tenant, server) else {
            return Err(denied(format!(
                "no tool server `{}` is available here",
                Shown(server)
            )));
        };
        known.server.store(true, Ordering::SeqCst);
        let conf = &u.server;
        if !conf.allows(tool) {
            return Err(denied(format!(
                "tool `{}` of `{server}` is not allowed here",
                Shown(tool)
            )));
        }
        if req
            .arguments
            .is_some_and(|a| !a.get().trim_start().starts_with(['{', 'n']))
        {
            return Err(denied("the arguments must be an object".into()));
        }
        let _weight = self.admit(req, request_bytes)?;
        let (peer, tools) = m.connect(&u).await.map_err(|e| {
            Raise(
                "ToolError",
                format!("tool server `{server}` is unavailable: {e}"),
                None,
            )
        })?;
        let Some(t) = tools.iter().find(|t| t.name == tool) else {
            return Err(denied(format!(
                "tool server `{server}` has no tool `{}`",
                Shown(tool)
            )));
        };
        known.tool.store(true, Ordering::SeqCst);
        let destructive = t
            .annotations
            .as_ref()
            .and_then(|a| a.destructive_hint)
            .unwrap_or(false)
            || conf.destructive.iter().any(|d| d == tool);
        if destructive && !conf.consented(tool) {
            self.consent(server, tool, conf.call_timeout(limits))
                .await?;
        }
        let _slot = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| Raise("ToolError", "closed".into(), None))?;
        // Parsed once, with a slot: checked in place, then moved into the request.
        let args: Map<String, Value> = match req.arguments {
            Some(raw) if raw.get() != "null" => serde_json::from_str(raw.get())
                .map_err(|_| denied("the arguments must be an object".into()))?,
            _ => Map::new(),
        };
        let args = schema::check_object(&t.input_schema, args)
            .map_err(|why| denied(format!("`{server}.{tool}`: {why}")))?;
        let timeout = conf.call_timeout(limits);
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
        // The upstream's progress goes to our client as progress of its call.
        let progress = self
            .caller
            .as_ref()
            .map(|c| (format!("{server}.{tool}"), c.clone()));
        let upstream_started = Instant::now();
        let result = tokio::time::timeout(timeout, u.call_tool(&peer, params, progress)).await;
        *upstream_us = upstream_started.elapsed().as_micros() as u64;
        let result = match result {
            Err(_) => {
                u.clone().check_after_timeout();
                return Err(Raise(
                    "ToolTimeout",
                    format!(
                        "`{server}.{tool}` did not answer within {:.1}s; the call was cancelled",
                        timeout.as_secs_f64()
                    ),
                    None,
                ));
            }
            Ok(Err(e)) => {
                return Err(Raise(
                    "ToolError",
                    format!("`{server}.{tool}` failed: {e}"),
                    None,
                ))
            }
            Ok(Ok(r)) => r,
        };
        let content = serde_json::to_value(&result.content).unwrap_or(Value::Null);
        let mut body = json!({ "content": content });
        if let Some(s) = &result.structured_content {
            body["structured"] = s.clone();
        }
        let size = serde_json::to_vec(&body).map(|v| v.len()).unwrap_or(0);
        let cap = conf.result_bytes.unwrap_or(limits.result_bytes);
        if size as u64 > cap {
            return Err(Raise(
                "ToolError",
                format!("the result of `{server}.{tool}` is {size} bytes, over the {cap} bytes a call may return"),
                None,
            ));
        }
        if result.is_error == Some(true) {
            let text: String = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect::<Vec<_>>()
                .join("\n");
            let msg = if text.is_empty() {
                format!("`{server}.{tool}` reported an error")
            } else {
                text
            };
            return Err(Raise("ToolError", msg, Some(content)));
        }
        Ok((body, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codemode::Config;

    fn run_of(conf: &str, tenant: &str) -> Arc<dyn ToolRun> {
        let m = Manager::new(Config::parse(conf).unwrap(), None, None);
        Arc::new(Run::new(m, tenant.into(), None))
    }

    async fn ask(run: &Arc<dyn ToolRun>, req: Value) -> Value {
        let bytes = run.answer(serde_json::to_vec(&req).unwrap()).await;
        let n = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(n + 4, bytes.len());
        serde_json::from_slice(&bytes[4..]).unwrap()
    }

    #[tokio::test]
    async fn requests_outside_the_policy_are_refused_before_any_upstream_starts() {
        // The command does not exist: any attempt to start it would answer ToolError, not
        // ToolDenied.
        let conf = "[[servers]]\nname = \"fs\"\ncommand = \"/nonexistent/x\"\nallow = [\"read\"]\ntenants = [\"a\"]\n";
        let run = run_of(conf, "a");
        let a = ask(
            &run,
            json!({"id": 7, "op": "call", "server": "fs", "tool": "write", "arguments": {}}),
        )
        .await;
        assert_eq!(a["kind"], "tool");
        assert_eq!(a["id"], 7);
        assert_eq!(a["error"]["type"], "ToolDenied", "{a}");
        let a = ask(
            &run,
            json!({"id": 8, "op": "call", "server": "other", "tool": "read"}),
        )
        .await;
        assert_eq!(a["error"]["type"], "ToolDenied", "{a}");
        let a = ask(&run, json!({"id": 9, "op": "nope"})).await;
        assert_eq!(a["error"]["type"], "ToolError", "{a}");
        let a = ask(
            &run,
            json!({"id": 10, "op": "call", "server": "fs", "tool": "read"}),
        )
        .await;
        assert_eq!(a["error"]["type"], "ToolError", "{a}");
        assert!(
            a["error"]["message"]
                .as_str()
                .unwrap()
                .contains("unavailable"),
            "{a}"
        );
        // Another tenant does not see the server at all.
        let b = run_of(conf, "b");
        let a = ask(
            &b,
            json!({"id": 1, "op": "call", "server": "fs", "tool": "read"}),
        )
        .await;
        assert_eq!(a["error"]["type"], "ToolDenied", "{a}");
        let a = ask(&b, json!({"id": 2, "op": "catalog"})).await;
        assert_eq!(a["servers"], json!([]));
        // Garbage is answered, not fatal.
        let bytes = b.answer(b"\xff not json".to_vec()).await;
        let v: Value = serde_json::from_slice(&bytes[4..]).unwrap();
        assert_eq!(v["error"]["type"], "ToolError");
    }
}
