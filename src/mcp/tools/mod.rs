//! The tool surface: one rmcp handler whose tools each parse their arguments, make one call
//! into the application core ([`crate::app`]) and format what comes back. Nothing here runs
//! code, counts quotas or holds locks.
//!
//! - [`code`]: `execute_code` and the stored-code tools of the tools we replace.
//! - [`env`]: packages and environments.
//! - [`session`]: `execute_python`, `reset_session`.
//! - [`workspace`]: `write_file`, `read_file`, `list_files`.

pub mod code;
pub mod env;
pub mod session;
pub mod workspace;

use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, ErrorData, RoleServer, ServerHandler};

use super::args;
use super::report::tool_error;
use super::INSTRUCTIONS;
use crate::app::{AppError, Connection, Executor};

/// The MCP handler of one connection. Cloning shares the connection (rmcp clones handlers
/// per request); a new connection is made only by [`CodeExecutor::new`].
#[derive(Clone)]
pub struct CodeExecutor {
    conn: Arc<Connection>,
    tool_router: ToolRouter<CodeExecutor>,
}

impl CodeExecutor {
    /// The handler of `conn` (from [`Executor::connect`]).
    pub fn new(conn: Connection) -> Self {
        CodeExecutor {
            conn: Arc::new(conn),
            tool_router: Self::routes(),
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

    /// What `initialize` answers (name, version, capabilities, instructions).
    pub fn server_info() -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
}

/// An application error as MCP says it: a malformed request is a protocol error
/// (`invalid_params`); everything else is a tool error the model reads.
pub(crate) fn answer(e: AppError) -> Result<CallToolResult, ErrorData> {
    match e {
        AppError::Invalid(m) => Err(ErrorData::invalid_params(m, None)),
        e => Ok(tool_error(e.to_string())),
    }
}

/// The timeout a call gets, or the protocol error for a bad one.
fn timeout(
    ex: &Executor,
    asked: Option<f64>,
) -> Result<(std::time::Duration, Option<String>), ErrorData> {
    ex.timeout(asked)
        .map_err(|e| ErrorData::invalid_params(e.to_string(), None))
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
        if let (Some(tool), Some(arguments)) =
            (self.tool_router.get(&request.name), &request.arguments)
        {
            args::check_known(&request.name, &tool.input_schema, arguments)?;
        }
        let tcc = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(tcc).await
    }

    fn get_info(&self) -> ServerConfig {
        Self::server_info()
    }
}
