//! `execute_code` and the stored-code tools of the code-executor servers we replace:
//! `initialize_code_file`, `append_to_code_file`, `execute_code_file`, `read_code_file`.
//! Stored code is the caller's: a signed-in user's files are kept apart from every other
//! user's and from the tenant's static token ([`crate::storage::Scope`]).

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};

use super::{answer, as_task, stateless, CodeExecutor};
use crate::app::{Code, CodeRun, NotRun, Wanted};
use crate::mcp::args::{self, Args};
use crate::mcp::progress::Progress;
use crate::mcp::report::{tool_error, with_structured, FileReport, RunReport};
use crate::mcp::transports::auth::principal_of;

const EXECUTE_CODE: &str = "Run a complete Python script in a fresh, isolated sandbox and return its stdout, stderr and exit status. \
Each call starts a new Python process: variables and imports do not survive between calls (use execute_python for that). \
What does persist: your workspace files (write_file, and files the code writes to /workspace are saved back, to read_file or use in the next run) and packages added with install_dependencies. \
The result gives a session_id naming the session whose workspace the run used: pass it as `session_id` to keep using that workspace (needed on clients that keep no connection between calls). \
There is no network access. A long output comes back as its head and tail, with the whole of it kept in the workspace (the result says which file). \
Limits per run: the timeout (default given by get_environment_config, override with `timeout` in seconds up to the server maximum), memory, CPU and 1 MiB of code per call. \
The code is also stored under `filename` (plus a unique suffix) and the result names its file_path, which execute_code_file can run again. \
For scripts too long to send in one call, use initialize_code_file, append_to_code_file and execute_code_file instead.";

const INITIALIZE_CODE_FILE: &str = "Create a new Python file with the first part of a long script, and return its file_path. \
Use this, then append_to_code_file (as many times as needed), then execute_code_file, when the code is too long to send in one execute_code call. \
Pass the returned file_path unchanged to the next calls.";

const APPEND_TO_CODE_FILE: &str = "Append `content` to a file created by initialize_code_file (or stored by execute_code). \
The content is added exactly as given: include the newlines and indentation you need. At most 1 MiB per call; a file may grow to 8 MiB.";

const EXECUTE_CODE_FILE: &str = "Run a stored Python file (built with initialize_code_file/append_to_code_file, or stored by execute_code) in a fresh, isolated sandbox. \
Same limits, workspace (pass `session_id` as for execute_code) and results as execute_code. Use read_code_file first if you are unsure the file is complete.";

const READ_CODE_FILE: &str = "Return the current content of a stored Python file, to check it before appending more or running it.";

fn file_report(path: &std::path::Path, size: u64, content: Option<String>) -> FileReport {
    FileReport {
        file_path: path.display().to_string(),
        size_bytes: size,
        content,
    }
}

impl CodeExecutor {
    /// Whose stored code a call works on: the caller's ([`crate::app::Connection::owner`]:
    /// a signed-in user's digest; `None` for the tenant's static token and servers without
    /// sign-in). Another user's `file_path` is then not found.
    fn code_owner(&self, ctx: &RequestContext<RoleServer>) -> Option<String> {
        self.conn.owner(principal_of(ctx).as_ref())
    }

    /// Run `code` in a fresh sandbox (one call into the core) and format the outcome.
    async fn run_code(
        &self,
        code: Code<'_>,
        session_id: Option<&str>,
        timeout: Option<f64>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let principal = principal_of(&ctx);
        let run = CodeRun {
            code,
            session: Wanted {
                handle: session_id.map(str::trim).filter(|h| !h.is_empty()),
                stateless: stateless(&ctx),
                open: false,
                principal: principal.as_ref(),
            },
            timeout,
            as_task: as_task(&ctx),
        };
        let (progress, events) = Progress::start(&ctx);
        // Code mode's upstream calls report to this call's client (progress, consent).
        let caller = super::caller::caller(&ctx, progress.as_ref());
        let result = crate::codemode::with_caller(
            caller,
            self.conn
                .execute_code(run, events, &ctx.ct, |outcome, timeout, path| {
                    let _shaping = crate::telemetry::span("result.shape");
                    let report =
                        RunReport::new(outcome, timeout.as_secs_f64(), path.display().to_string());
                    let keep = report.to_keep();
                    (report, keep)
                }),
        )
        .await;
        if let Some(p) = progress {
            p.finish().await;
        }
        match result {
            Ok(ran) => {
                let kept = ran.kept;
                Ok(ran
                    .made
                    .kept(
                        kept.session.as_ref().map(|s| s.handle()),
                        kept.names,
                        kept.refused,
                    )
                    .into_result(ran.note))
            }
            Err(NotRun::Timeout(e)) => Err(ErrorData::invalid_params(e.to_string(), None)),
            Err(NotRun::Session(e)) => Ok(tool_error(e.to_string())),
            Err(NotRun::Code(e)) => answer(e),
            Err(NotRun::Run { error, path }) => Ok(tool_error(format!(
                "the code could not be run: {error}\nfile_path: {}",
                path.display()
            ))),
        }
    }
}

#[tool_router(router = code_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        title = "Run a Python script",
        description = EXECUTE_CODE,
        input_schema = args::schema::<args::ExecuteCode>(),
        output_schema = args::output_schema::<RunReport>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn execute_code(
        &self,
        Args(a): Args<args::ExecuteCode>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let code = Code::New {
            filename: a.filename.as_deref(),
            code: &a.code,
        };
        self.run_code(code, a.session_id.as_deref(), a.timeout, ctx)
            .await
    }

    #[tool(
        title = "Start a long script file",
        description = INITIALIZE_CODE_FILE,
        input_schema = args::schema::<args::InitializeCodeFile>(),
        output_schema = args::output_schema::<FileReport>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn initialize_code_file(
        &self,
        Args(a): Args<args::InitializeCodeFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let owner = self.code_owner(&ctx);
        match self
            .executor()
            .create_code_file(owner.as_deref(), a.filename.as_deref(), &a.content)
            .await
        {
            Ok(path) => {
                let r = file_report(&path, a.content.len() as u64, None);
                let text = format!(
                    "created {} ({} bytes). Pass this file_path to append_to_code_file and execute_code_file.",
                    r.file_path, r.size_bytes
                );
                Ok(with_structured(text, &r, false))
            }
            Err(e) => answer(e),
        }
    }

    #[tool(
        title = "Append to a script file",
        description = APPEND_TO_CODE_FILE,
        input_schema = args::schema::<args::AppendToCodeFile>(),
        output_schema = args::output_schema::<FileReport>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn append_to_code_file(
        &self,
        Args(a): Args<args::AppendToCodeFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let owner = self.code_owner(&ctx);
        match self
            .executor()
            .append_code(owner.as_deref(), &a.file_path, &a.content)
            .await
        {
            Ok((path, size)) => {
                let r = file_report(&path, size, None);
                let text = format!(
                    "appended {} bytes to {} (now {} bytes)",
                    a.content.len(),
                    r.file_path,
                    size
                );
                Ok(with_structured(text, &r, false))
            }
            Err(e) => answer(e),
        }
    }

    #[tool(
        title = "Run a stored script file",
        description = EXECUTE_CODE_FILE,
        input_schema = args::schema::<args::ExecuteCodeFile>(),
        output_schema = args::output_schema::<RunReport>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn execute_code_file(
        &self,
        Args(a): Args<args::ExecuteCodeFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let code = Code::Stored {
            file_path: &a.file_path,
        };
        self.run_code(code, a.session_id.as_deref(), a.timeout, ctx)
            .await
    }

    #[tool(
        title = "Read a script file",
        description = READ_CODE_FILE,
        input_schema = args::schema::<args::ReadCodeFile>(),
        output_schema = args::output_schema::<FileReport>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_code_file(
        &self,
        Args(a): Args<args::ReadCodeFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let owner = self.code_owner(&ctx);
        match self
            .executor()
            .read_code(owner.as_deref(), &a.file_path)
            .await
        {
            Ok((path, text)) => {
                let r = file_report(&path, text.len() as u64, Some(text.clone()));
                Ok(with_structured(text, &r, false))
            }
            Err(e) => answer(e),
        }
    }
}
