//! The stdio transport: one JSON-RPC message per line on stdin, answers on stdout, nothing
//! else on stdout. Unlike rmcp's own stdio transport, a line that is not a JSON-RPC message
//! gets a JSON-RPC error answer (-32700 parse error, -32600 invalid request) instead of
//! being dropped silently, and an over-long line is refused without being buffered whole.

use futures::channel::mpsc::{unbounded, SendError, UnboundedSender};
use futures::{SinkExt as _, StreamExt as _};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::{RoleServer, ServiceExt as _};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use crate::mcp::CodeExecutor;

/// Serve one client over stdin/stdout until it closes stdin or `shutdown` is cancelled.
pub async fn serve_stdio(
    executor: CodeExecutor,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_lines(executor, tokio::io::stdin(), tokio::io::stdout(), shutdown).await
}

/// Serve one client over a line-delimited byte stream pair.
pub async fn serve_lines<R, W>(
    executor: CodeExecutor,
    reader: R,
    mut writer: W,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
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

async fn read_lines<R: AsyncRead + Unpin>(
    reader: R,
    to_server: UnboundedSender<RxJsonRpcMessage<RoleServer>>,
    to_client: UnboundedSender<String>,
) {
    let mut lines = FramedRead::new(
        reader,
        LinesCodec::new_with_max_length(crate::mcp::defaults::MAX_BODY_BYTES),
    );
    while let Some(line) = lines.next().await {
        let answer = match line {
            Ok(line) if line.trim().is_empty() => continue,
            Ok(line) => match parse(&line) {
                Ok(message) => {
                    if to_server.unbounded_send(message).is_err() {
                        return;
                    }
                    continue;
                }
                Err(answer) => answer,
            },
            Err(LinesCodecError::MaxLineLengthExceeded) => error_line(
                serde_json::Value::Null,
                -32600,
                format!(
                    "message longer than {} bytes refused",
                    crate::mcp::defaults::MAX_BODY_BYTES
                ),
            ),
            Err(LinesCodecError::Io(e)) => {
                tracing::debug!(error = %e, "stdin closed");
                return;
            }
        };
        if to_client.unbounded_send(answer).is_err() {
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
