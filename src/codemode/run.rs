//! One run's (or one cell's) requests from the sandbox: the catalog, and calls checked
//! against the policy, made upstream, bounded and answered.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, Tool};
use serde_json::{json, Value};

use super::{names, schema, Caller, Manager};
use crate::backend::protocol::encode_tool_answer;
use crate::job::ToolRun;

/// One run's (or one cell's) calls.
pub(super) struct Run {
    manager: Arc<Manager>,
    tenant: String,
    calls: AtomicU32,
    in_flight: tokio::sync::Semaphore,
    /// Our client: upstream progress goes to it, and it may consent to destructive tools.
    caller: Option<Arc<dyn Caller>>,
}

impl Run {
    pub(super) fn new(
        manager: Arc<Manager>,
        tenant: String,
        caller: Option<Arc<dyn Caller>>,
    ) -> Run {
        let in_flight = tokio::sync::Semaphore::new(manager.config.limits.in_flight as usize);
        Run {
            manager,
            tenant,
            calls: AtomicU32::new(0),
            in_flight,
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
            tracing::info!(tenant = %self.tenant, server = %self.server, tool = %self.tool, "code mode: tool call cancelled (the run ended)");
            let (s, t) = labels(self.known.get(), self.server, self.tool);
            crate::app::metrics::tool_calls().call(
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

fn denied(msg: String) -> Raise {
    Raise("ToolDenied", msg, None)
}

#[async_trait::async_trait]
impl ToolRun for Run {
    async fn answer(&self, request: Vec<u8>) -> Vec<u8> {
        let req: Value = serde_json::from_slice(&request).unwrap_or(Value::Null);
        let id = req.get("id").cloned().unwrap_or(Value::Null);
        let body = match req.get("op").and_then(Value::as_str) {
            Some("catalog") => Ok(self.catalog().await),
            Some("call") => self.call(&req, request.len()).await,
            _ => Err(Raise(
                "ToolError",
                "a malformed request (no known `op`)".into(),
                None,
            )),
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
        answer["id"] = id;
        encode_tool_answer(&answer)
    }
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

    async fn call(&self, req: &Value, request_bytes: usize) -> Result<Value, Raise> {
        let server = req.get("server").and_then(Value::as_str).unwrap_or("");
        let tool = req.get("tool").and_then(Value::as_str).unwrap_or("");
        let started = Instant::now();
        let limits = &self.manager.config.limits;
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
        let result = self
            .checked_call(server, tool, req, request_bytes, &known, &mut upstream_us)
            .await;
        guard.armed = false;
        let (outcome, result_bytes) = match &result {
            Ok((_, n)) => ("ok", *n),
            Err(Raise(kind, _, _)) => (*kind, 0),
        };
        tracing::info!(
            tenant = %self.tenant, server = %server, tool = %tool,
            argument_bytes = request_bytes, result_bytes, outcome,
            ms = started.elapsed().as_millis() as u64,
            us = started.elapsed().as_micros() as u64, upstream_us,
            calls = self.calls.load(Ordering::SeqCst), budget = limits.calls_per_run,
            "code mode: tool call"
        );
        let (s, t) = labels(known.get(), server, tool);
        crate::app::metrics::tool_calls().call(
            &self.tenant,
            s,
            t,
            outcome,
            started.elapsed().as_secs_f64(),
        );
        result.map(|(v, _)| v)
    }

    async fn checked_call(
        &self,
        server: &str,
        tool: &str,
        req: &Value,
        request_bytes: usize,
        known: &Known,
        upstream_us: &mut u64,
    ) -> Result<(Value, usize), Raise> {
        let m = &self.manager;
        let limits = &m.config.limits;
        let Some(u) = m.upstream(&self.tenant, server) else {
            return Err(denied(format!(
                "no tool server `{server}` is available here"
            )));
        };
        known.server.store(true, Ordering::SeqCst);
        let conf = &u.server;
        if !conf.allows(tool) {
            return Err(denied(format!(
                "tool `{tool}` of `{server}` is not allowed here"
            )));
        }
        let (peer, tools) = m.connect(&u).await.map_err(|e| {
            Raise(
                "ToolError",
                format!("tool server `{server}` is unavailable: {e}"),
                None,
            )
        })?;
        let Some(t) = tools.iter().find(|t| t.name == tool) else {
            return Err(denied(format!(
                "tool server `{server}` has no tool `{tool}`"
            )));
        };
        known.tool.store(true, Ordering::SeqCst);
        let destructive = t
            .annotations
            .as_ref()
            .and_then(|a| a.destructive_hint)
            .unwrap_or(false)
            || conf.destructive.iter().any(|d| d == tool);
        let args = req.get("arguments").cloned().unwrap_or_else(|| json!({}));
        let Value::Object(args) = args else {
            return Err(denied("the arguments must be an object".into()));
        };
        if request_bytes as u64 > limits.argument_bytes {
            return Err(denied(format!(
                "the arguments are over {} bytes",
                limits.argument_bytes
            )));
        }
        if let Some(why) = schema::check(
            &Value::Object((*t.input_schema).clone()),
            &Value::Object(args.clone()),
        ) {
            return Err(denied(format!("`{server}.{tool}`: {why}")));
        }
        if destructive && !conf.consented(tool) {
            self.consent(server, tool, conf.call_timeout(limits))
                .await?;
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n > limits.calls_per_run {
            return Err(Raise(
                "BudgetExceeded",
                format!(
                    "this run has made its {} tool calls (calls_per_run)",
                    limits.calls_per_run
                ),
                None,
            ));
        }
        let _slot = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| Raise("ToolError", "closed".into(), None))?;
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
                return Err(Raise(
                    "ToolTimeout",
                    format!(
                        "`{server}.{tool}` did not answer within {:.1}s; the call was cancelled",
                        timeout.as_secs_f64()
                    ),
                    None,
                ))
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
