//! The tool surface: one rmcp handler whose tools each parse their arguments, make one call
//! into the application core ([`crate::app`]) and format what comes back. Nothing here runs
//! code, counts quotas or holds locks.
//!
//! - [`code`]: `execute_code` and the stored-code tools of the tools we replace.
//! - [`env`](mod@env): packages and environments.
//! - [`session`]: `execute_python`, `reset_session`.
//! - [`workspace`]: `write_file`, `read_file`, `list_files`.

mod caller;
pub mod code;
pub mod env;
pub mod session;
mod traced;
pub mod workspace;

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

use super::args;
use super::report::tool_error;
use super::transports::auth::principal_of;
use super::INSTRUCTIONS;
use crate::app::{AppError, Connection, Executor, SessionRef, Wanted};

/// The MCP handler of one connection. Cloning shares the connection (rmcp clones handlers
/// per request); a new connection is made only by [`CodeExecutor::new`].
#[derive(Clone)]
pub struct CodeExecutor {
    conn: Arc<Connection>,
    tool_router: ToolRouter<CodeExecutor>,
    /// The least severe log level the client asked for (`logging/setLevel`); the server
    /// sends no log notifications today, so none goes below it.
    #[allow(deprecated)]
    log_level: Arc<std::sync::Mutex<Option<rmcp::model::LoggingLevel>>>,
}

impl CodeExecutor {
    /// The handler of `conn` (a [`Connection::new`]).
    pub fn new(conn: Connection) -> Self {
        CodeExecutor {
            conn: Arc::new(conn),
            tool_router: Self::routes(),
            log_level: Arc::default(),
        }
    }

    fn routes() -> ToolRouter<CodeExecutor> {
        Self::code_router() + Self::env_router() + Self::session_router() + Self::workspace_router()
    }

    /// The tools, as `tools/list` gives them: also for a server still starting up, which
    /// has no connection yet.
    pub fn tool_list() -> Vec<rmcp::model::Tool> {
        Self::routes().list_all()
    }

    /// What `initialize` answers (name, version, capabilities, instructions). Logging is
    /// declared for the revisions that have it (deprecated by 2026-07-28, hence the allow).
    #[allow(deprecated)]
    pub fn server_info() -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_resources()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "mcp-code-executor",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(INSTRUCTIONS)
    }

    /// A handler on a new connection to `executor`.
    pub fn connect(executor: &Arc<Executor>) -> Self {
        Self::new(Connection::new(executor.clone()))
    }

    fn executor(&self) -> &Arc<Executor> {
        self.conn.executor()
    }

    /// The tasks of the caller (its tenant and principal).
    fn tasks(&self, ctx: &RequestContext<RoleServer>) -> rmcp::task_manager::TaskManager {
        let owner = self.conn.owner(principal_of(ctx).as_ref());
        super::tasks::manager_for(self.executor(), owner.as_deref())
    }
}

/// True when the request came without a protocol session, so that this handler lives for
/// this one request: Streamable HTTP without `Mcp-Session-Id` (the 2026-07-28 revision has
/// no sessions; its clients send each request on its own). stdio, legacy SSE and the
/// sessions of the 2025 revisions keep a connection, whose own session is the default.
pub(crate) fn stateless(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .is_some_and(|p| !p.headers.contains_key("mcp-session-id"))
}

impl CodeExecutor {
    /// The session a call works on (see [`Wanted`]), or the tool error to answer with.
    fn session(
        &self,
        handle: Option<&str>,
        ctx: &RequestContext<RoleServer>,
        open: bool,
    ) -> Result<Option<SessionRef>, CallToolResult> {
        let handle = handle.map(str::trim).filter(|h| !h.is_empty());
        self.conn
            .session(Wanted {
                handle,
                stateless: stateless(ctx),
                open,
                principal: principal_of(ctx).as_ref(),
            })
            .map_err(|e| tool_error(e.to_string()))
    }
}

impl CodeExecutor {
    /// Start `request` as a task of this tenant: its run goes on after this request ends,
    /// until it finishes, its timeout, `tasks/cancel` or shutdown.
    fn spawn_task(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::Task, ErrorData> {
        use rmcp::task_manager::{TaskExit, TaskOptions};
        let asked = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("timeout"))
            .and_then(serde_json::Value::as_f64);
        let (run_for, _) = self
            .executor()
            .task_timeout(asked)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let owner = self.conn.owner(principal_of(&context).as_ref());
        // A client that can answer is asked through the task (`input_required`, then
        // `tasks/update`).
        let asks = super::asking::wanted(&context);
        let mut ctx = context;
        // The request's token ends with the request (or its connection); the task's ends
        // with tasks/cancel or the server's shutdown.
        ctx.ct = self.executor().shutdown_token().child_token();
        // Progress notifications would go to a request that is over.
        ctx.meta = Default::default();
        ctx.extensions.insert(super::tasks::TaskRun);
        let this = self.clone();
        let ttl_d = super::tasks::ttl(run_for, self.executor().settings().task_ttl);
        let ttl = ttl_d.as_millis() as u64;
        // Counted in the tenant's bound on kept tasks before anything starts, and before
        // its manager is looked up (the sweep drops the manager of a principal with none).
        let admitted = super::tasks::admit(self.executor(), owner.as_deref(), ttl_d)?;
        let tasks = super::tasks::manager_for(self.executor(), owner.as_deref());
        let options = TaskOptions::new()
            .with_ttl_ms(ttl)
            .with_poll_interval_ms(super::tasks::POLL_INTERVAL.as_millis() as u64)
            .with_status_message(format!("{} is running", request.name));
        let mut task = tasks.spawn(options, move |tc| {
            // Its run's spans go on after the request's span ends: under a span of their
            // own in the request's trace (made here, in the request's scope).
            let mut traced = crate::telemetry::span("task.run");
            // A task may run for 30 minutes: its runs take the slots long runs may hold.
            Box::pin(crate::app::executor::as_long_run(async move {
                let ended = traced
                    .scope(run_task(this, request, ctx, tc, admitted, asks))
                    .await;
                match &ended {
                    Ok(r) if r.is_error == Some(true) => traced.fail("tool_error"),
                    Ok(_) => {}
                    Err(TaskExit::Cancelled) => traced.fail("cancelled"),
                    Err(_) => traced.fail("error"),
                }
                ended
            }))
        });
        task.task_id = super::tasks::external_id(&task.task_id);
        Ok(task)
    }
}

/// The body of a task started by [`CodeExecutor::spawn_task`]: `request` run to its end
/// (or a cancel), its result kept for `tasks/result`.
async fn run_task(
    this: CodeExecutor,
    request: rmcp::model::CallToolRequestParams,
    mut ctx: RequestContext<RoleServer>,
    tc: rmcp::task_manager::TaskContext,
    admitted: super::task_caps::Admitted,
    asks: bool,
) -> Result<CallToolResult, rmcp::task_manager::TaskExit> {
    use rmcp::task_manager::TaskExit;
    if asks {
        super::asking::for_task(&mut ctx, tc.clone());
    }
    let ct = ctx.ct.clone();
    let tcc = rmcp::handler::server::tool::ToolCallContext::new(&this, request, ctx);
    let run = this.tool_router.call(tcc);
    tokio::pin!(run);
    let done = tokio::select! {
        // A cancel can end the run first (a question waiting for an answer
        // ends with it): the task is still `cancelled`.
        r = &mut run => {
            if tc.is_cancel_requested() {
                drop(admitted);
                return Err(TaskExit::Cancelled);
            }
            r
        }
        _ = tc.cancelled() => {
            // The core races every run against this token: the container is
            // killed and removed; wait for that before settling.
            ct.cancel();
            let _ = run.await;
            drop(admitted);
            return Err(TaskExit::Cancelled);
        }
    };
    let done = match done {
        Ok(rmcp::model::CallToolResponse::Complete(r)) => Ok(r),
        Ok(_) => Err(ErrorData::internal_error(
            "the tool gave no final result",
            None,
        )),
        Err(e) => Err(super::fit::capped_error(e)),
    };
    admitted.ended(done.as_ref());
    done.map_err(TaskExit::Error)
}

/// What a tool says when a stateless request names no session for a call that only reads
/// one.
pub(crate) const NO_SESSION: &str = "no session was named: this client keeps no connection between calls (MCP 2026-07-28 over HTTP), \
so pass the session_id that execute_python, write_file or execute_code returned. There is nothing to read without it.";

/// An application error as MCP says it: a malformed request is a protocol error
/// (`invalid_params`); everything else is a tool error the model reads.
pub(crate) fn answer(e: AppError) -> Result<CallToolResult, ErrorData> {
    match e {
        AppError::Invalid(m) => Err(ErrorData::invalid_params(m, None)),
        e => Ok(tool_error(e.to_string())),
    }
}

/// Is this call a run started as a task ([`super::tasks::TaskRun`])? Its timeout is capped at
/// the task maximum, not the server's.
pub(crate) fn as_task(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.extensions.get::<super::tasks::TaskRun>().is_some()
}

/// The timeout a call gets (the core's policy: [`Executor::run_timeout`]), or the protocol
/// error for a bad one.
fn timeout(
    ex: &Executor,
    asked: Option<f64>,
    ctx: &RequestContext<RoleServer>,
) -> Result<(std::time::Duration, Option<String>), ErrorData> {
    ex.run_timeout(asked, as_task(ctx))
        .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
}

impl CodeExecutor {
    /// A call as a task (for a client that declared tasks, of a tool that may run long) or
    /// at once.
    async fn dispatch(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        // A task when the request itself declares the extension (a 2026-07-28 client sends
        // its capabilities with each request). A declaration at `initialize` alone asks
        // for none: the MCP Inspector CLI declares it there and does not poll, so its calls
        // must be answered.
        let wants_task = super::tasks::TOOLS.contains(&request.name.as_ref())
            && context
                .meta
                .client_capabilities()
                .is_some_and(|c| c.supports_tasks());
        if wants_task {
            return Ok(rmcp::model::CallToolResponse::Task(
                rmcp::model::CreateTaskResult::new(self.spawn_task(request, context)?),
            ));
        }
        let asks = super::tasks::TOOLS.contains(&request.name.as_ref());
        if asks {
            let who = super::asking::Caller {
                tenant: self.executor().tenant().to_string(),
                owner: self.conn.owner(principal_of(&context).as_ref()),
                tool: request.name.to_string(),
            };
            if let Some(state) = &request.request_state {
                return super::asking::resume(
                    who,
                    state,
                    request.input_responses.as_ref(),
                    context.ct.clone(),
                )
                .await;
            }
            if super::asking::wanted(&context) {
                let this = self.clone();
                let shutdown = self.executor().shutdown_token();
                return super::asking::start(who, context, &shutdown, move |ctx| {
                    Box::pin(async move {
                        let tcc =
                            rmcp::handler::server::tool::ToolCallContext::new(&this, request, ctx);
                        this.tool_router.call(tcc).await
                    })
                })
                .await;
            }
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }
}

impl CodeExecutor {
    /// `answer`, a request of `method` other than `tools/call`, under a server span of its
    /// own (traces on).
    async fn traced<T>(
        &self,
        method: &'static str,
        ctx: &RequestContext<RoleServer>,
        answer: impl std::future::Future<Output = Result<T, ErrorData>>,
    ) -> Result<T, ErrorData> {
        let ex = self.executor();
        let mut span = traced::request(ex.tracer(), ex.tenant(), method, ctx);
        let r = span.scope(answer).await;
        traced::answered(&mut span, &r);
        r
    }

    /// [`Self::dispatch`], after refusing arguments the tool does not know.
    async fn checked_dispatch(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        if let (Some(tool), Some(arguments)) =
            (self.tool_router.get(&request.name), &request.arguments)
        {
            args::check_known(&request.name, &tool.input_schema, arguments)
                .map_err(super::fit::capped_error)?;
        }
        self.dispatch(request, context)
            .await
            .map_err(super::fit::capped_error)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeExecutor {
    /// rmcp's dispatch, after refusing arguments the tool does not know (every tool, those
    /// without arguments too): a misspelt argument must not be silently ignored.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, ErrorData> {
        let ex = self.executor();
        let mut span = traced::root(ex.tracer(), ex.tenant(), &request, &context);
        let answered = span.scope(self.checked_dispatch(request, context)).await;
        traced::ended(&mut span, &answered);
        answered
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        self.traced("tasks/get", &ctx, async {
            let internal = super::tasks::internal_id(&request.task_id);
            let mut task = self.tasks(&ctx).get_task(internal)?;
            task.task.task_id = super::tasks::external_id(&task.task.task_id);
            Ok(rmcp::model::GetTaskResult::new(task))
        })
        .await
    }

    /// Stop the task's run (its container is removed) and settle it as `cancelled`.
    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.traced("tasks/cancel", &ctx, async {
            self.tasks(&ctx)
                .cancel_task(super::tasks::internal_id(&request.task_id))
        })
        .await
    }

    /// The answers to a task's questions (code mode's consent, [`super::asking`]); answers
    /// to keys the task does not wait on are ignored, as the spec says.
    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.traced("tasks/update", &ctx, async {
            self.tasks(&ctx).update_task(
                super::tasks::internal_id(&request.task_id),
                request.input_responses,
            )
        })
        .await
    }

    fn get_info(&self) -> ServerConfig {
        Self::server_info()
    }

    /// The router's tools, as rmcp's `tool_handler` lists them, except that `execute_code`
    /// and `execute_python` also name the code-mode servers of this tenant (one line each):
    /// such a list is the tenant's own, not for shared caches.
    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, ErrorData> {
        self.traced("tools/list", &context, async {
            let mut tools = self.tool_router.list_all();
            let own = crate::codemode::describe(&mut tools, self.executor().tenant());
            let hints = context
                .protocol_version()
                .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28);
            let scope = match own {
                true => rmcp::model::CacheScope::Private,
                false => rmcp::model::CacheScope::Public,
            };
            Ok(rmcp::model::ListToolsResult {
                result_type: Some(rmcp::model::ResultType::COMPLETE),
                tools,
                meta: None,
                next_cursor: None,
                ttl_ms: hints.then_some(0),
                cache_scope: hints.then_some(scope),
            })
        })
        .await
    }

    /// The files of the session's workspace (the connection's own; none for a request
    /// without a protocol session, which names its session in the URIs results give).
    async fn list_resources(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        self.traced("resources/list", &ctx, async {
            let session = self
                .conn
                .session(Wanted {
                    handle: None,
                    stateless: stateless(&ctx),
                    open: false,
                    principal: principal_of(&ctx).as_ref(),
                })
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
            let mut resources = Vec::new();
            if let Some(s) = session {
                // A workspace not made yet (no file written) lists nothing.
                if let Ok(files) = self.conn.list_files(&s, None).await {
                    for (name, size) in files {
                        resources.push(super::resources::listed(s.handle(), &name, size));
                    }
                }
            }
            Ok(rmcp::model::ListResourcesResult::with_all_items(resources))
        })
        .await
    }

    /// A workspace file named by a URI a result gave (tenant- and session-scoped: another
    /// tenant's session, an expired one and a missing file are all "resource not found").
    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        self.traced("resources/read", &ctx, async {
            let _ = &ctx;
            let not_found = || {
                ErrorData::resource_not_found(
                    format!("resource not found: {}", request.uri),
                    Some(serde_json::json!({ "uri": request.uri })),
                )
            };
            let parsed = super::resources::parse(&request.uri).ok_or_else(not_found)?;
            let session = self
                .conn
                .session(Wanted {
                    handle: Some(&parsed.handle),
                    stateless: true,
                    open: false,
                    principal: principal_of(&ctx).as_ref(),
                })
                .map_err(|_| not_found())?
                .ok_or_else(not_found)?;
            let (_, data) = self
                .conn
                .read_file(&session, &parsed.name)
                .await
                .map_err(|_| not_found())?;
            let contents = super::resources::contents(&request.uri, &parsed, &data)?;
            Ok(rmcp::model::ReadResourceResult::new(vec![contents]).into())
        })
        .await
    }

    /// Log notifications at or above `level` (the server sends none below it).
    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.traced("logging/setLevel", &ctx, async {
            *self.log_level.lock().unwrap_or_else(|e| e.into_inner()) = Some(request.level);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn all_tools() -> Vec<rmcp::model::Tool> {
        (CodeExecutor::code_router()
            + CodeExecutor::env_router()
            + CodeExecutor::session_router()
            + CodeExecutor::workspace_router())
        .list_all()
    }

    /// Every problem of `schema` a portable client (or the Inspector's `--strict`) would
    /// report, with its path.
    fn problems(schema: &Value, path: &str, out: &mut Vec<String>) {
        match schema {
            Value::Object(o) => {
                if o.get("type").is_some_and(Value::is_array) {
                    out.push(format!("{path}: `type` is an array"));
                }
                if let Some(f) = o.get("format").and_then(Value::as_str) {
                    if !["date-time", "date", "time", "email", "uri", "uuid", "byte"].contains(&f) {
                        out.push(format!("{path}: non-standard format `{f}`"));
                    }
                }
                if let Some(Value::Object(props)) = o.get("properties") {
                    for (name, p) in props {
                        if p.get("description").and_then(Value::as_str).is_none() {
                            out.push(format!("{path}.{name}: no description"));
                        }
                    }
                }
                for (k, v) in o {
                    problems(v, &format!("{path}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    problems(v, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_tool_has_a_title_annotations_and_portable_described_schemas() {
        let tools = all_tools();
        assert_eq!(tools.len(), 15);
        let mut found = Vec::new();
        for t in &tools {
            let name = t.name.to_string();
            assert!(t.title.is_some(), "{name}: no title");
            let a = t
                .annotations
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: no annotations"));
            for (hint, v) in [
                ("readOnlyHint", a.read_only_hint),
                ("destructiveHint", a.destructive_hint),
                ("idempotentHint", a.idempotent_hint),
                ("openWorldHint", a.open_world_hint),
            ] {
                assert!(v.is_some(), "{name}: no {hint}");
            }
            // Every tool answers with structuredContent, so every tool declares its shape.
            let out = t
                .output_schema
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: no outputSchema"));
            problems(
                &Value::Object((**out).clone()),
                &format!("{name} output"),
                &mut found,
            );
            problems(
                &Value::Object((*t.input_schema).clone()),
                &format!("{name} input"),
                &mut found,
            );
        }
        assert!(found.is_empty(), "{found:#?}");
        let by = |n: &str| tools.iter().find(|t| t.name == n).unwrap().clone();
        let install = by("install_dependencies").annotations.unwrap();
        assert_eq!(install.open_world_hint, Some(true));
        assert_eq!(
            by("read_file").annotations.unwrap().read_only_hint,
            Some(true)
        );
        for n in [
            "execute_python",
            "execute_code",
            "execute_code_file",
            "write_file",
            "read_file",
            "list_files",
            "reset_session",
        ] {
            let props = by(n).input_schema["properties"].clone();
            assert!(props.get("session_id").is_some(), "{n} takes session_id");
        }
    }

    #[test]
    fn nullable_fields_become_any_of_single_types() {
        let s = crate::mcp::args::output_schema::<crate::mcp::report::RunReport>();
        let exit = &s["properties"]["exit_code"];
        assert!(exit.get("type").is_none(), "{exit}");
        assert_eq!(exit["anyOf"][0]["type"], "integer", "{exit}");
        assert_eq!(exit["anyOf"][1]["type"], "null", "{exit}");
        assert!(exit["description"].is_string(), "{exit}");
        assert!(exit["anyOf"][0].get("format").is_none(), "{exit}");
    }
}
