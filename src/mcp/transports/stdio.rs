//! The stdio transport: one JSON-RPC message per line on stdin, answers on stdout, nothing
//! else on stdout. A server still starting up answers at once too ([`Pending`]): its tool
//! calls wait for the start-up to end. Unlike rmcp's own stdio transport, a line that is not a JSON-RPC message
//! gets a JSON-RPC error answer (-32700 parse error, -32600 invalid request) instead of
//! being dropped silently, and an over-long line is refused (-32600) without being buffered
//! whole; the server goes on with the next line.

use futures::channel::mpsc::{unbounded, SendError, UnboundedSender};
use futures::{SinkExt as _, StreamExt as _};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::{RoleServer, ServiceExt as _};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, ServerHandler};

use crate::app::Startup;
use crate::mcp::CodeExecutor;

/// Serve one client over stdin/stdout until it closes stdin or `shutdown` is cancelled.
pub async fn serve_stdio(
    executor: CodeExecutor,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_lines(executor, tokio::io::stdin(), tokio::io::stdout(), shutdown).await
}

/// How long a tool call that came during start-up waits for the server to be ready (a first
/// run builds the sandbox image, about five minutes on a fresh machine); then it gets an
/// error saying to retry.
pub const STARTUP_WAIT: Duration = Duration::from_secs(15 * 60);

/// How often a call waiting for start-up is told it still waits, when nothing changed.
const STARTUP_NOTICE_EVERY: Duration = Duration::from_secs(10);

/// The stdio handler of a server that is still starting up: it answers `initialize` and
/// `tools/list` at once; a tool call waits until [`Pending::ready`] hands over the
/// connection's handler (at most [`STARTUP_WAIT`]), with progress notifications saying
/// what start-up is doing when the client asked for progress.
pub struct Pending {
    startup: Arc<Startup>,
    executor: OnceLock<CodeExecutor>,
    tools: Vec<Tool>,
    wait: Duration,
}

impl Pending {
    pub fn new(startup: Arc<Startup>) -> Arc<Pending> {
        Self::with_wait(startup, STARTUP_WAIT)
    }

    /// [`Pending::new`], waiting at most `wait` for start-up.
    pub fn with_wait(startup: Arc<Startup>, wait: Duration) -> Arc<Pending> {
        Arc::new(Pending {
            startup,
            executor: OnceLock::new(),
            tools: CodeExecutor::tool_list(),
            wait,
        })
    }

    /// Start-up is over: calls go to `executor` from now on. Set it before the startup's
    /// phase becomes [`crate::app::Phase::Serving`].
    pub fn ready(&self, executor: CodeExecutor) {
        let _ = self.executor.set(executor);
    }

    /// The connection's handler, once start-up is over.
    async fn executor(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<CodeExecutor, ErrorData> {
        if let Some(e) = self.executor.get() {
            return Ok(e.clone());
        }
        let token = context.meta.get_progress_token();
        let peer = context.peer.clone();
        // Progress values below 1, rising: the run's own notifications (same token) count
        // from 1 on, and progress must increase.
        let sent = std::sync::atomic::AtomicU32::new(0);
        let notify = |message: String| {
            let Some(token) = token.clone() else { return };
            let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let progress = f64::from(n) / f64::from(n + 1);
            let param = ProgressNotificationParam::new(token, progress).with_message(message);
            let peer = peer.clone();
            tokio::spawn(async move {
                if let Err(e) = peer.notify_progress(param).await {
                    tracing::debug!(error = %e, "progress notification not delivered");
                }
            });
        };
        let mut last = String::new();
        let waited = async {
            let mut ticker = tokio::time::interval(STARTUP_NOTICE_EVERY);
            ticker.tick().await;
            let wait = self.startup.wait_serving(self.wait, |p| {
                let m = format!("waiting for the server to start: {}", p.describe());
                if m != last {
                    notify(m.clone());
                    last = m;
                }
            });
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    r = &mut wait => break r,
                    _ = ticker.tick() => {
                        notify(format!(
                            "waiting for the server to start: {}",
                            self.startup.phase().describe()
                        ));
                    }
                }
            }
        };
        let r = tokio::select! {
            r = waited => r,
            _ = context.ct.cancelled() => Err("the call was cancelled while the server started up".into()),
        };
        match r {
            Ok(()) => {
                self.executor.get().cloned().ok_or_else(|| {
                    ErrorData::internal_error("start-up ended without a handler", None)
                })
            }
            Err(message) => Err(ErrorData::internal_error(message, None)),
        }
    }
}

/// [`Pending`] as an rmcp handler.
#[derive(Clone)]
struct Deferred(Arc<Pending>);

impl ServerHandler for Deferred {
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.call_tool(request, context).await
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        match self.0.executor.get() {
            Some(e) => e.list_tools(request, context).await,
            None => Ok(ListToolsResult::with_all_items(self.0.tools.clone())),
        }
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.0.tools.iter().find(|t| t.name == name).cloned()
    }

    // Resources, tasks and logging go to the handler once it is there, like tools/call.
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.list_resources(request, context).await
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.read_resource(request, context).await
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: rmcp::model::SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.set_level(request, context).await
    }

    async fn get_task(
        &self,
        request: rmcp::model::GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetTaskResult, ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.get_task(request, context).await
    }

    async fn cancel_task(
        &self,
        request: rmcp::model::CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.cancel_task(request, context).await
    }

    async fn update_task(
        &self,
        request: rmcp::model::UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let executor = self.0.executor(&context).await?;
        executor.update_task(request, context).await
    }

    fn get_info(&self) -> ServerConfig {
        CodeExecutor::server_info()
    }
}

/// Serve one client over stdin/stdout while the server starts up: see [`Pending`].
pub async fn serve_stdio_starting(
    pending: Arc<Pending>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_lines(
        Deferred(pending),
        tokio::io::stdin(),
        tokio::io::stdout(),
        shutdown,
    )
    .await
}

/// Serve one client over a line-delimited byte stream pair.
pub async fn serve_lines<H, R, W>(
    executor: H,
    reader: R,
    mut writer: W,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    H: ServerHandler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (to_client, mut lines_out) = unbounded::<String>();
    let (to_server, from_client) = unbounded::<RxJsonRpcMessage<RoleServer>>();

    // One writer, so protocol answers and our own error answers never interleave.
    let writer_task = tokio::spawn(async move {
        while let Some(mut line) = lines_out.next().await {
            line.push('\n');
            writer.write_all(line.as_bytes()).await?;
            writer.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let reader_task = tokio::spawn(read_lines(reader, to_server, to_client.clone()));

    let sink = to_client.with(|m: TxJsonRpcMessage<RoleServer>| {
        futures::future::ready(Ok::<_, SendError>(
            serde_json::to_string(&m).unwrap_or_default(),
        ))
    });
    let served = match executor.serve_with_ct((sink, from_client), shutdown).await {
        Ok(running) => running
            .waiting()
            .await
            .map(|_| ())
            .map_err(std::io::Error::other),
        Err(e) => Err(std::io::Error::other(e)),
    };
    reader_task.abort();
    // The writer ends once every sender is gone: flush what is queued, then stop.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer_task).await;
    served
}

/// Read one message per line. A line longer than the limit is skipped as it comes (never
/// buffered whole) and answered with -32600; reading goes on with the next line.
async fn read_lines<R: AsyncRead + Unpin>(
    reader: R,
    to_server: UnboundedSender<RxJsonRpcMessage<RoleServer>>,
    to_client: UnboundedSender<String>,
) {
    use tokio::io::AsyncBufReadExt as _;
    let max = crate::mcp::defaults::MAX_BODY_BYTES;
    let mut reader = tokio::io::BufReader::with_capacity(64 << 10, reader);
    let mut line: Vec<u8> = Vec::new();
    let mut too_long = false;
    loop {
        let buf = match reader.fill_buf().await {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "stdin closed");
                return;
            }
        };
        let eof = buf.is_empty();
        let (chunk, ended) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, eof),
        };
        let used = chunk.len() + usize::from(!eof && ended);
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line = Vec::new();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if !ended {
            continue;
        }
        let answer = if too_long {
            too_long = false;
            Some(error_line(
                serde_json::Value::Null,
                -32600,
                format!("message longer than {max} bytes refused"),
            ))
        } else {
            let text = std::mem::take(&mut line);
            match std::str::from_utf8(&text) {
                Ok(l) if l.trim().is_empty() => None,
                Ok(l) => match parse(l.trim_end_matches('\r')) {
                    Ok(message) => {
                        if to_server.unbounded_send(message).is_err() {
                            return;
                        }
                        None
                    }
                    Err(answer) => Some(answer),
                },
                Err(e) => Some(error_line(
                    serde_json::Value::Null,
                    -32700,
                    format!("parse error: {e}"),
                )),
            }
        };
        line.clear();
        if let Some(answer) = answer {
            if to_client.unbounded_send(answer).is_err() {
                return;
            }
        }
        if eof {
            return;
        }
    }
}

/// A client message, or the error line that answers a malformed one.
fn parse(line: &str) -> Result<RxJsonRpcMessage<RoleServer>, String> {
    serde_json::from_str(line).map_err(|e| match serde_json::from_str::<serde_json::Value>(line) {
        Ok(v) => {
            let id = v.get("id").cloned().unwrap_or(serde_json::Value::Null);
            error_line(id, -32600, format!("invalid JSON-RPC message: {e}"))
        }
        Err(e) => error_line(serde_json::Value::Null, -32700, format!("parse error: {e}")),
    })
}

fn error_line(id: serde_json::Value, code: i32, message: String) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_lines_get_error_answers() {
        let e = parse("garbage").unwrap_err();
        assert!(e.contains("-32700"), "{e}");
        assert!(e.contains("\"id\":null"), "{e}");
        let e = parse(r#"{"jsonrpc":"2.0","id":7,"nonsense":true}"#).unwrap_err();
        assert!(e.contains("-32600") && e.contains("\"id\":7"), "{e}");
        assert!(parse(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_ok());
    }
}
