//! Stateful execution: `execute_python` runs cells in this connection's session,
//! `reset_session` drops it. The sessions themselves live in [`crate::app::sessions`].

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{answer, timeout, CodeExecutor};
use crate::mcp::args::{self, Args};
use crate::mcp::progress::Progress;
use crate::mcp::report::RunReport;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutePython {
    /// Python code to run in your session: statements, and optionally a final expression whose value is shown.
    pub code: String,
    /// Wall-clock limit of this call in seconds; capped by the server's maximum. Running over it ends the session.
    #[serde(default)]
    pub timeout: Option<f64>,
}

const EXECUTE_PYTHON: &str = "Run Python in your persistent session, like a notebook or REPL: variables, imports and functions defined in one call are still there in the next. \
The value of a final expression is shown as a REPL shows it (`x + 1` shows `42`). An exception returns the traceback as an error and keeps the session. \
matplotlib figures (plt.show() or left open) come back as PNG images. Your workspace files (write_file) are at /workspace. No network. \
A call that runs over its timeout or out of memory ends the session: all state is lost and the next call starts fresh. \
Sessions end after a period without calls, after a maximum lifetime, with reset_session, or when the connection closes.";

const RESET_SESSION: &str = "End your persistent execute_python session: its variables, imports and sandbox are discarded. The next execute_python call starts a fresh session (with the current environment, e.g. after install_dependencies or configure_environment). Workspace files are kept.";

#[tool_router(router = session_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        description = EXECUTE_PYTHON,
        input_schema = args::schema::<ExecutePython>(),
        output_schema = schema_for_output::<RunReport>()
    )]
    async fn execute_python(
        &self,
        Args(a): Args<ExecutePython>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let timeout = timeout(self.executor(), a.timeout)?;
        let shutdown = self.executor().shutdown_token();
        let (progress, events) = Progress::start(&ctx);
        let result = self.conn.cell(&a.code, timeout, events, &ctx.ct).await;
        match progress {
            // At shutdown the client may be gone: do not hold the shutdown up for it.
            Some(p) if !shutdown.is_cancelled() => p.finish().await,
            _ => {}
        }
        match result {
            Ok(done) => Ok(RunReport::new(
                &done.outcome,
                done.timeout.as_secs_f64(),
                self.conn.session_name(),
            )
            .into_result(done.note)),
            Err(e) => answer(e),
        }
    }

    #[tool(description = RESET_SESSION)]
    async fn reset_session(&self) -> Result<CallToolResult, ErrorData> {
        let had = self.conn.reset_session().await;
        Ok(CallToolResult::success(vec![
            rmcp::model::ContentBlock::text(if had {
                "the session was reset: its state is gone and its sandbox removed; the next execute_python call starts fresh"
            } else {
                "there was no open session; the next execute_python call starts fresh"
            }),
        ]))
    }
}
