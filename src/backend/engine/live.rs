//! A started sandbox and the conversation with its runner, the same whatever carries it (a
//! Docker attach, a Kubernetes `pods/attach`): the job goes in on stdin, frames come back
//! on stdout until the report, the deadline or the end of the stream. A driver turns its
//! transport into an [`Output`] of [`Chunk`]s and an [`Input`]; everything else is here.
//!
//! Frames the engine does not handle itself (see [`crate::backend::collect::Control::Other`])
//! go to a [`FrameHook`], whose answers are written back into the runner's stdin while the
//! run goes on.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, Fuse, FusedFuture};
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::backend::collect::{write_input, Collected, Control, Ended};
use crate::backend::protocol::{Frame, FrameDecoder};
use crate::backend::{emit, BackendError, Events};
use crate::job::{Limits, RunEvent};

/// How long a sandbox may take from start to its runner being ready. Not part of the
/// user's timeout: a slow daemon (or cluster) must not eat the code's time.
pub(crate) const START_DEADLINE: Duration = Duration::from_secs(30);

/// How long a message still being written when the report arrives may take to finish.
const FINISH_WRITE: Duration = Duration::from_secs(5);

/// A piece of what the sandbox's runner wrote: on its stdout (frames) or its stderr (the
/// runner's own, never the user's).
pub(crate) enum Chunk {
    Out(bytes::Bytes),
    Err(bytes::Bytes),
}

/// A failure to read the sandbox's output, put in the driver's words once the action is
/// known ("reading the sandbox output", "waiting for the sandbox").
pub(crate) type ReadError = Box<dyn FnOnce(&'static str) -> BackendError + Send>;

/// The runner's output as a driver delivers it.
pub(crate) type Output = Pin<Box<dyn Stream<Item = Result<Chunk, ReadError>> + Send>>;
/// The runner's stdin.
pub(crate) type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// What a frame the engine does not handle itself comes to: the bytes to write back into
/// the runner's stdin, once they are known (`None`: nothing to write).
pub type Reply = BoxFuture<'static, Option<Vec<u8>>>;

/// Takes the frames the engine leaves to others (a runner's tool call, say), for plain runs
/// and sessions alike, on every driver. Called from the frame loop: it must not block; the
/// work goes into the returned [`Reply`], which the loop polls alongside the runner's
/// output and the deadline, and whose bytes it writes into the runner's stdin (in the
/// order the replies complete). The run's deadline keeps running meanwhile.
pub trait FrameHook: Send + Sync {
    /// `frame` arrived; an error ends the conversation with that error.
    fn frame(&self, frame: Frame) -> Result<Reply, BackendError>;

    /// What the hook sends into the runner's stdin on its own, not as the reply to one
    /// frame (egress's streams, see [`crate::backend::relay`]); taken once per
    /// conversation. Its sender bounds what it queues (the streams' windows).
    fn outgoing(&self) -> Option<futures::stream::BoxStream<'static, Vec<u8>>> {
        None
    }

    /// Take connections from the sandbox on a socket in `dir` (the sandbox's own
    /// directory, see [`Live::with_dir`]) until the returned guard is dropped; called once
    /// per conversation before the sandbox gets its input. `None`: no socket (the hook
    /// takes none, or it could not listen).
    fn listen(&self, _dir: &std::path::Path) -> Option<Box<dyn Send>> {
        None
    }
}

/// The hook of one conversation, if any.
pub type Hook = Option<Arc<dyn FrameHook>>;

/// A started sandbox whose runner waits for (or has been given) its job.
pub(crate) struct Live<G> {
    /// Removes the sandbox when dropped (see [`super::guard`]).
    pub(crate) guard: G,
    input: Option<Input>,
    output: Output,
    decoder: FrameDecoder,
    /// The runner has said `R` (or is known to be up: a driver that attaches after the
    /// start may not see it).
    ready: bool,
    pub(crate) born: Instant,
    /// Called when a pool hands it to a run; false: it must not be used (a driver's own
    /// preparation, e.g. giving a preloading container its CPU weight back).
    pub(crate) on_claim: Option<Box<dyn FnOnce() -> bool + Send>>,
    /// What the driver must keep while the sandbox is attached (a WebSocket's task: the
    /// Kubernetes driver's, built with `--features kubernetes`).
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    held: Option<Box<dyn std::any::Any + Send>>,
    /// The sandbox's own directory on the server's host, mounted inside (Docker under
    /// runc): where a hook may listen for the sandbox's connections. Removed with it.
    dir: Option<crate::backend::sandbox_dir::SandboxDir>,
    /// The pool that handed it to a run and what it had preloaded (`None`: started cold
    /// for its run), for the `sandbox.take` span.
    pub(crate) taken_from: Option<crate::backend::pool::TakenFrom>,
}

impl<G: Send + 'static> crate::backend::pool::Waiting for Live<G> {
    fn waiting_since(&mut self) -> Option<Instant> {
        self.still_waiting().then_some(self.born)
    }

    fn claimed(&mut self) -> bool {
        self.on_claim.take().is_none_or(|f| f())
    }

    fn taken(&mut self, from: crate::backend::pool::TakenFrom) {
        self.taken_from = Some(from);
    }
}

/// The next of a hook's own messages; pending forever once they ended.
async fn next_pushed(
    pushed: &mut Option<futures::stream::BoxStream<'static, Vec<u8>>>,
) -> Option<Vec<u8>> {
    match pushed.as_mut()?.next().await {
        Some(bytes) => Some(bytes),
        None => {
            *pushed = None;
            None
        }
    }
}

type Writing<'a> = Fuse<BoxFuture<'a, (std::io::Result<()>, Option<Input>)>>;

/// Write `bytes` into `stdin`, keeping it open, and hand it back.
fn write_reply<'a>(stdin: Input, bytes: Vec<u8>) -> Writing<'a> {
    async move { write_input(stdin, &bytes, false).await }
        .boxed()
        .fuse()
}

impl<G> Live<G> {
    /// A sandbox over `input` and `output`; `ready` when its runner is known to be up.
    pub(crate) fn new(guard: G, input: Input, output: Output, ready: bool) -> Self {
        Live {
            guard,
            input: Some(input),
            output,
            decoder: FrameDecoder::default(),
            ready,
            born: Instant::now(),
            on_claim: None,
            held: None,
            dir: None,
            taken_from: None,
        }
    }

    /// Give it its own directory on the host (see [`FrameHook::listen`]); `None`: none.
    pub(crate) fn with_dir(mut self, dir: Option<crate::backend::sandbox_dir::SandboxDir>) -> Self {
        self.dir = dir;
        self
    }

    /// Keep `held` as long as the sandbox (what its attach needs to stay up).
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub(crate) fn holding(mut self, held: impl std::any::Any + Send) -> Self {
        self.held = Some(Box::new(held));
        self
    }

    /// Wait for the runner's `R` (a pool sandbox before any job exists, a session).
    pub(crate) async fn wait_ready(&mut self) -> Result<(), BackendError> {
        let wait = async {
            while !self.ready {
                match self.output.next().await {
                    Some(Ok(Chunk::Out(message))) => self.decoder.push(&message),
                    Some(Ok(Chunk::Err(_))) => continue,
                    Some(Err(e)) => return Err(e("waiting for the sandbox")),
                    None => {
                        return Err(BackendError::Runner(
                            "the sandbox exited before it was ready".into(),
                        ))
                    }
                }
                match self.decoder.next_frame() {
                    Ok(Some(Frame::Ready)) => self.ready = true,
                    Ok(None) => {}
                    Ok(Some(f)) => {
                        return Err(BackendError::Runner(format!(
                            "unexpected first frame {f:?}"
                        )))
                    }
                    Err(e) => return Err(BackendError::Runner(e.to_string())),
                }
            }
            Ok(())
        };
        tokio::time::timeout(START_DEADLINE, wait)
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::Runner(format!(
                    "the sandbox did not become ready within {}s",
                    START_DEADLINE.as_secs()
                )))
            })
    }

    /// Write to the runner's stdin and keep it open (the opening of a session).
    pub(crate) async fn send(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
        let stdin = self
            .input
            .as_mut()
            .ok_or_else(|| BackendError::Runner("the sandbox's input is already closed".into()))?;
        let w = async {
            stdin.write_all(bytes).await?;
            stdin.flush().await
        };
        w.await
            .map_err(|e| BackendError::Runner(format!("writing into the sandbox failed: {e}")))
    }

    /// Is a waiting sandbox still alive? One that died while it waited (a daemon restart, a
    /// kill from outside, its pod deleted, its node gone) has its stream ended, or something
    /// unexpected on it. The runner's `R` is all a waiting runner may say (a driver that
    /// attaches after the start may see it late).
    pub(crate) fn still_waiting(&mut self) -> bool {
        if !self.ready || self.input.is_none() {
            return false;
        }
        loop {
            match self.output.next().now_or_never() {
                None => return true,
                Some(Some(Ok(Chunk::Out(data)))) => {
                    self.decoder.push(&data);
                    loop {
                        match self.decoder.next_frame() {
                            Ok(Some(Frame::Ready)) => continue,
                            Ok(None) => break,
                            _ => return false,
                        }
                    }
                }
                Some(_) => return false,
            }
        }
    }

    /// Feed `input` in and read the runner's frames until it reports, the deadline passes
    /// or the stream ends. With `close_input` the runner's stdin is closed after the input
    /// (a one-shot run; kept open while a `hook` may still write replies); without, it
    /// stays open for the next message of a session. A runner not yet ready gets
    /// [`START_DEADLINE`] to say `R`; the user's timeout starts then.
    pub(crate) async fn execute(
        &mut self,
        input: &[u8],
        close_input: bool,
        limits: &Limits,
        events: &Events,
        hook: &Hook,
    ) -> Result<Ended, BackendError> {
        let stdin = self
            .input
            .take()
            .ok_or_else(|| BackendError::Runner("the sandbox's input is already closed".into()))?;
        let close = close_input && hook.is_none();
        // Listening before the input goes in: the code may connect as soon as it runs.
        let _listening = match (hook, &self.dir) {
            (Some(h), Some(dir)) => h.listen(dir.path()),
            _ => None,
        };
        let mut writer: Writing<'_> = write_input(stdin, input, close).boxed().fuse();
        let mut idle = None;
        let result = self
            .converse(&mut writer, &mut idle, limits, events, hook)
            .await;
        if idle.is_none() && !writer.is_terminated() && matches!(result, Ok(Ended::Report(..))) {
            // The report came while a message was still being written (a stream's bytes,
            // a reply): finish it, so that the input stays whole and open for the next
            // message of a session (the runner reads and drops what a finished cell was
            // sent). Dropped half-written, the input was lost: the next cell failed with
            // "already closed" (seen under gVisor, whose runner is slower to read).
            if let Ok((r, stdin)) = tokio::time::timeout(FINISH_WRITE, &mut writer).await {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "writing into the sandbox failed");
                }
                idle = stdin;
            }
        }
        self.input = idle;
        result
    }

    /// The frame loop of [`Live::execute`]: `writer` writes into the runner's stdin and
    /// hands it back into `idle` when done.
    async fn converse<'a>(
        &mut self,
        writer: &mut Writing<'a>,
        idle: &mut Option<Input>,
        limits: &Limits,
        events: &Events,
        hook: &Hook,
    ) -> Result<Ended, BackendError> {
        let mut out = Collected::new(limits.output_bytes);
        let mut deadline = tokio::time::Instant::now()
            + if self.ready {
                emit(events, RunEvent::Started);
                limits.timeout
            } else {
                START_DEADLINE
            };
        let mut runner_stderr = Vec::new();
        let mut replies: FuturesUnordered<Reply> = FuturesUnordered::new();
        let mut outbox: VecDeque<Vec<u8>> = VecDeque::new();
        let mut pushed = hook.as_ref().and_then(|h| h.outgoing());
        loop {
            let chunk = tokio::select! {
                (r, stdin) = &mut *writer, if !writer.is_terminated() => {
                    tracing::trace!("input written");
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "writing into the sandbox failed");
                    }
                    match (stdin, outbox.pop_front()) {
                        (Some(s), Some(bytes)) => *writer = write_reply(s, bytes),
                        (s, _) => *idle = s,
                    }
                    continue;
                }
                Some(bytes) = next_pushed(&mut pushed), if pushed.is_some() => {
                    match idle.take() {
                        Some(s) => *writer = write_reply(s, bytes),
                        None if !writer.is_terminated() => outbox.push_back(bytes),
                        None => tracing::debug!("a stream's bytes for the sandbox found its input closed"),
                    }
                    continue;
                }
                Some(reply) = replies.next(), if !replies.is_empty() => {
                    if let Some(bytes) = reply {
                        match idle.take() {
                            Some(s) => *writer = write_reply(s, bytes),
                            None if !writer.is_terminated() => outbox.push_back(bytes),
                            None => tracing::debug!("a reply for the sandbox found its input closed"),
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    if !self.ready {
                        return Err(BackendError::Runner(format!(
                            "the sandbox did not become ready within {}s",
                            START_DEADLINE.as_secs()
                        )));
                    }
                    return Ok(Ended::TimedOut(out));
                }
                c = self.output.next() => c,
            };
            match chunk {
                None => {
                    if !runner_stderr.is_empty() {
                        tracing::warn!(stderr = %String::from_utf8_lossy(&runner_stderr), "the runner wrote to stderr");
                    }
                    return Ok(Ended::Vanished(out));
                }
                Some(Err(e)) => return Err(e("reading the sandbox output")),
                Some(Ok(Chunk::Out(message))) => {
                    tracing::trace!(bytes = message.len(), "runner output");
                    self.decoder.push(&message)
                }
                Some(Ok(Chunk::Err(message))) => {
                    // The runner's own stderr (a crash of the runner itself); user output
                    // never arrives here. Keep a little for the log.
                    if runner_stderr.len() < 4096 {
                        runner_stderr.extend_from_slice(&message);
                    }
                    continue;
                }
            }
            while let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| BackendError::Runner(e.to_string()))?
            {
                match out.absorb(frame, events) {
                    // A runner known to be up may say `R` late: nothing changes.
                    None | Some(Control::Ready) if self.ready => {}
                    None => {}
                    Some(Control::Ready) => {
                        self.ready = true;
                        deadline = tokio::time::Instant::now() + limits.timeout;
                        emit(events, RunEvent::Started);
                    }
                    Some(Control::Exit(report)) => return Ok(Ended::Report(Box::new(report), out)),
                    Some(Control::Failed(msg)) => return Err(BackendError::Rejected(msg)),
                    Some(Control::Other(frame)) => match hook {
                        Some(h) => replies.push(h.frame(frame)?),
                        None => {
                            return Err(BackendError::Runner(format!(
                                "the runner sent a frame this conversation does not take: {frame:?}"
                            )))
                        }
                    },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::protocol::Frame;
    use std::sync::Mutex;
    use tokio::io::AsyncReadExt;

    /// A hook whose only part is one push of its own (a stream's bytes).
    struct Pushes(Mutex<Option<futures::stream::BoxStream<'static, Vec<u8>>>>);

    impl FrameHook for Pushes {
        fn frame(&self, _: Frame) -> Result<Reply, BackendError> {
            Ok(async { None }.boxed())
        }
        fn outgoing(&self) -> Option<futures::stream::BoxStream<'static, Vec<u8>>> {
            self.0.lock().unwrap().take()
        }
    }

    fn frame(kind: u8, payload: &[u8]) -> bytes::Bytes {
        let mut v = vec![kind];
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v.into()
    }

    /// The runner reports while the server is still writing a pushed message (its stdin
    /// pipe full): the message is finished and the input stays open for the next one.
    /// Before, the half-written message and the input were dropped, and the session's
    /// next cell failed with "the sandbox's input is already closed".
    #[tokio::test]
    async fn a_report_during_a_write_keeps_the_input_whole_for_the_next_message() {
        let (stdin, mut runner_in) = tokio::io::duplex(64);
        let (out_tx, out_rx) = futures::channel::mpsc::unbounded::<Result<Chunk, ReadError>>();
        let mut live = Live::new(
            (),
            Box::pin(stdin) as Input,
            Box::pin(out_rx) as Output,
            true,
        );
        let push = vec![b'n'; 4096];
        let hook: Hook = Some(Arc::new(Pushes(Mutex::new(Some(
            futures::stream::iter(vec![push.clone()]).boxed(),
        )))));
        let runner = tokio::spawn(async move {
            let mut cell = [0u8; 4];
            runner_in.read_exact(&mut cell).await.unwrap();
            // The push is under way (64 bytes fit the pipe); the cell ends meanwhile.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let report = br#"{"exit_code":0,"signal":null,"cpu_ms":1,"peak_memory_bytes":1}"#;
            out_tx
                .unbounded_send(Ok(Chunk::Out(frame(b'X', report))))
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut rest = vec![0u8; 4096 + 4];
            runner_in.read_exact(&mut rest).await.unwrap();
            (cell, rest)
        });
        let ended = live
            .execute(b"cell", false, &Limits::default(), &None, &hook)
            .await
            .unwrap();
        assert!(matches!(ended, Ended::Report(..)));
        live.send(b"next").await.unwrap();
        let (cell, rest) = runner.await.unwrap();
        assert_eq!(&cell, b"cell");
        assert_eq!(&rest[..4096], &push[..]);
        assert_eq!(&rest[4096..], b"next");
    }
}
