//! A stdio upstream's transport: the child's stdin and stdout as rmcp's line transport,
//! with one difference that matters. rmcp drops an incoming line over its limit and keeps
//! the connection, so a call whose answer was dropped waits out its whole timeout; here a
//! line over [`LINE_LIMIT`] ends the connection instead: the calls in flight fail at once,
//! the child is killed, and the next call starts it again.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleClient;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The longest message an upstream may send, in bytes (rmcp's own default).
pub(super) const LINE_LIMIT: usize = 16 * 1024 * 1024;

/// How long a closed child may take to exit after its stdin closed, before it is killed.
const EXIT_WAIT: Duration = Duration::from_secs(3);

pub(super) struct ChildTransport {
    inner: AsyncRwTransport<RoleClient, Capped<ChildStdout>, ChildStdin>,
    child: Child,
}

/// Start `cmd` (its stdio ours, its stderr discarded, killed when dropped). `over` is set
/// when the child sends a line over [`LINE_LIMIT`].
pub(super) fn spawn(
    mut cmd: tokio::process::Command,
    over: Arc<AtomicBool>,
) -> io::Result<ChildTransport> {
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("the child's stdio was not piped"));
    };
    let read = Capped {
        inner: stdout,
        line: 0,
        limit: LINE_LIMIT,
        over,
    };
    // rmcp's own cap one byte above ours (its count includes the newline): ours ends the
    // stream before rmcp ever holds more than LINE_LIMIT bytes of one line.
    let inner = AsyncRwTransport::new(read, stdin).with_max_line_length(LINE_LIMIT + 2);
    Ok(ChildTransport { inner, child })
}

impl Transport<RoleClient> for ChildTransport {
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    /// Closes the child's stdin (an MCP server exits on it), then kills it if it has not
    /// exited within [`EXIT_WAIT`].
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await?;
        if tokio::time::timeout(EXIT_WAIT, self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// A reader that ends (EOF, for good) once a line grows past `limit` bytes: the whole
/// lines before it are handed on, none of that line's bytes in the crossing read.
pub(super) struct Capped<R> {
    inner: R,
    /// Bytes of the current line so far (its newline not counted).
    line: usize,
    limit: usize,
    over: Arc<AtomicBool>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Capped<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.over.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let mut line = this.line;
        let mut whole = 0;
        for (i, b) in buf.filled()[before..].iter().enumerate() {
            if *b == b'\n' {
                line = 0;
                whole = i + 1;
            } else {
                line += 1;
                if line > this.limit {
                    this.over.store(true, Ordering::Relaxed);
                    buf.set_filled(before + whole);
                    return Poll::Ready(Ok(()));
                }
            }
        }
        this.line = line;
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: &[u8], limit: usize) -> (Vec<u8>, bool) {
        let over = Arc::new(AtomicBool::new(false));
        let mut r = Capped {
            inner: input,
            line: 0,
            limit,
            over: over.clone(),
        };
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        (out, over.load(Ordering::Relaxed))
    }

    #[tokio::test]
    async fn lines_up_to_the_limit_pass_and_a_longer_one_ends_the_stream() {
        let (out, over) = read_all(b"abcd\nefgh\n\nij", 4).await;
        assert_eq!(out, b"abcd\nefgh\n\nij");
        assert!(!over);
        // The whole line before it passes; nothing of the long line or after it.
        let (out, over) = read_all(b"abc\nabcde\nok\n", 4).await;
        assert!(over);
        assert_eq!(out, b"abc\n");
        // A long line over several reads: what came in earlier reads was handed on (rmcp
        // holds it as an unfinished line, dropped at the end), nothing after the crossing.
        let (out, over) = read_all(b"abcde", 4).await;
        assert!(over);
        assert_eq!(out, b"");
    }
}
