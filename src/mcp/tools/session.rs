//! Stateful execution: `execute_python` runs cells in a session (the connection's own, or
//! the one its `session_id` names), `reset_session` ends its REPL. The sessions themselves live in [`crate::app::sessions`].

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{answer, stateless, timeout, CodeExecutor, NO_SESSION};
use crate::mcp::args::{self, Args};
use crate::mcp::progress::Progress;
use crate::mcp::report::{tool_error, with_structured, RunReport};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutePython {
    /// Python code to run in your session: statements, and optionally a final expression whose value is shown.
    pub code: String,
    /// Wall-clock limit of this call in seconds; capped by the server's maximum. Running over it ends the session.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// The session to continue: the session_id an earlier call returned. Omit it to use your connection's own session; a client without one (MCP 2026-07-28 over HTTP) gets a new session, whose session_id the result gives.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResetSession {
    /// The session whose REPL to end: the session_id an earlier call returned. Omit it for your connection's own session.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// The answer of reset_session.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ResetReport {
    /// True when a REPL was open and has been ended; false when there was none.
    pub reset: bool,
    /// The session (its workspace files are kept; its handle stays valid); null when none was named.
    pub session_id: Option<String>,
}

const EXECUTE_PYTHON: &str = "Run Python in your persistent session, like a notebook or REPL: variables, imports and functions defined in one call are still there in the next. \
The value of a final expression is shown as a REPL shows it (`x + 1` shows `42`). An exception returns the traceback as an error and keeps the session. \
matplotlib figures (plt.show() or left open) come back as PNG images. Your workspace files (write_file) are at /workspace. No network. \
The result gives a session_id: pass it back as `session_id` in your next calls (execute_python, execute_code, write_file, read_file, list_files, reset_session) to keep the same variables and workspace. \
Some clients keep no connection between calls, and without session_id each call starts a new session. \
A call that runs over its timeout or out of memory ends the REPL: all state is lost and the next call starts fresh. \
Sessions end after a period without calls, after a maximum lifetime, with reset_session, or when the connection closes.";

const RESET_SESSION: &str = "End your persistent execute_python session's REPL: its variables, imports and sandbox are discarded. The next execute_python call starts a fresh one (with the current environment, e.g. after install_dependencies or configure_environment). \
Workspace files are kept, and the session_id stays valid. Pass session_id to name the session (needed on clients that keep no connection between calls).";

#[tool_router(router = session_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        title = "Run Python in a persistent session",
        description = EXECUTE_PYTHON,
        input_schema = args::schema::<ExecutePython>(),
        output_schema = args::output_schema::<RunReport>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn execute_python(
        &self,
        Args(a): Args<ExecutePython>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        crate::storage::check_code_size(&a.code)
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let timeout = timeout(self.executor(), a.timeout, &ctx)?;
        let session = match self.session(a.session_id.as_deref(), &ctx, true) {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(tool_error(NO_SESSION)),
            Err(r) => return Ok(r),
        };
        let shutdown = self.executor().shutdown_token();
        let (progress, events) = Progress::start(&ctx);
        // Code mode's upstream calls report to this call's client (progress, consent).
        let caller = super::caller::caller(&ctx, progress.as_ref());
        let result = crate::codemode::with_caller(
            caller,
            self.conn.cell(&session, &a.code, timeout, events, &ctx.ct),
        )
        .await;
        match progress {
            // At shutdown the client may be gone: do not hold the shutdown up for it.
            Some(p) if !shutdown.is_cancelled() => p.finish().await,
            _ => {}
        }
        match result {
            Ok(done) => {
                let report = RunReport::new(
                    &done.outcome,
                    done.timeout.as_secs_f64(),
                    "<session>".into(),
                );
                let kept = self.conn.keep_files(Some(session), report.to_keep()).await;
                Ok(report
                    .kept(
                        kept.session.as_ref().map(|s| s.handle()),
                        kept.names,
                        kept.refused,
                    )
                    .into_result(done.note))
            }
            Err(e) => {
                let mut r = answer(e)?;
                if session.created || stateless(&ctx) {
                    if let Some(rmcp::model::ContentBlock::Text(t)) = r.content.first_mut() {
                        t.text
                            .push_str(&format!("\nsession_id: {}", session.handle()));
                    }
                }
                Ok(r)
            }
        }
    }

    #[tool(
        title = "Reset the Python session",
        description = RESET_SESSION,
        input_schema = args::schema::<ResetSession>(),
        output_schema = args::output_schema::<ResetReport>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn reset_session(
        &self,
        Args(a): Args<ResetSession>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = match self.session(a.session_id.as_deref(), &ctx, false) {
            Ok(Some(s)) => s,
            Ok(None) => {
                let r = ResetReport {
                    reset: false,
                    session_id: None,
                };
                return Ok(with_structured(
                    "no session was named, so there was nothing to reset; the next execute_python call without session_id starts a fresh session".into(),
                    &r,
                    false,
                ));
            }
            Err(r) => return Ok(r),
        };
        let had = self.conn.reset_session(&session).await;
        let text = if had {
            "the session was reset: its state is gone and its sandbox removed; the next execute_python call starts fresh (workspace files are kept)"
        } else {
            "there was no open REPL in this session; the next execute_python call starts fresh"
        };
        let r = ResetReport {
            reset: had,
            session_id: Some(session.handle().to_string()),
        };
        Ok(with_structured(
            format!("{text}\nsession_id: {}", session.handle()),
            &r,
            false,
        ))
    }
}
