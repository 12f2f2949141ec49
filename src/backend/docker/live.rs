//! A started sandbox container and the conversation with its runner: the job goes in on
//! stdin, frames come back on stdout until the report, the deadline or the end.

use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use futures::{FutureExt, Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::classify;
use super::guard::ContainerGuard;
use crate::backend::collect::{Collected, Control, Ended};
use crate::backend::protocol::{Frame, FrameDecoder};
use crate::backend::{emit, BackendError, Events};
use crate::job::{Limits, RunEvent};

/// How long a container may take from start to its runner being ready. Not part of the
/// user's timeout: a slow daemon must not eat the code's time.
pub(super) const START_DEADLINE: Duration = Duration::from_secs(30);

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, BollardError>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// A started container whose runner waits for (or has been given) its one job.
pub(super) struct Live {
    pub(super) guard: ContainerGuard,
    input: Option<Input>,
    output: Output,
    decoder: FrameDecoder,
    /// The runner has said `R`.
    ready: bool,
    pub(super) born: Instant,
    /// Its CPU weight while it waits in a preloading pool, lowered (see [`super::weight`]).
    pub(super) weight: Option<super::weight::Lowered>,
    /// Code mode (#26): where the code's tool requests go; its stdin then stays open for
    /// the answers.
    pub(super) tools: Option<crate::job::Tools>,
}

impl Live {
    pub(super) fn new(guard: ContainerGuard, input: Input, output: Output) -> Self {
        Live {
            guard,
            input: Some(input),
            output,
            decoder: FrameDecoder::default(),
            ready: false,
            born: Instant::now(),
            weight: None,
            tools: None,
        }
    }

    /// Wait for the runner's `R` (pool containers do this before any job exists).
    pub(super) async fn wait_ready(&mut self) -> Result<(), BackendError> {
        let wait = async {
            while !self.ready {
                match self.output.next().await {
                    Some(Ok(LogOutput::StdOut { message })) => self.decoder.push(&message),
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Err(classify("waiting for the sandbox", e)),
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
    pub(super) async fn send(&mut self, bytes: &[u8]) -> Result<(), BackendError> {
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

    /// Is a waiting container still alive? A container that died while it waited (daemon
    /// restart, killed by hand) has its stream ended, or something unexpected on it.
    pub(super) fn still_waiting(&mut self) -> bool {
        self.ready && self.input.is_some() && self.output.next().now_or_never().is_none()
    }

    /// Feed the job in and read the runner's frames until it reports, the deadline passes
    /// or the stream ends. With `close_input` the runner's stdin is closed after the input
    /// (a one-shot run); without, it stays open for the next cell of a session.
    pub(super) async fn execute(
        &mut self,
        input: &[u8],
        close_input: bool,
        limits: &Limits,
        events: &Events,
    ) -> Result<Ended, BackendError> {
        let stdin = self
            .input
            .take()
            .ok_or_else(|| BackendError::Runner("the sandbox's input is already closed".into()))?;
        let writer = crate::backend::collect::write_input(stdin, input, close_input).fuse();
        tokio::pin!(writer);
        let mut back = None;
        let result = self
            .read_frames(writer.as_mut(), &mut back, limits, events)
            .await;
        self.input = back;
        result
    }

    async fn read_frames<W>(
        &mut self,
        mut writer: Pin<&mut futures::future::Fuse<W>>,
        back: &mut Option<Input>,
        limits: &Limits,
        events: &Events,
    ) -> Result<Ended, BackendError>
    where
        W: std::future::Future<Output = (std::io::Result<()>, Option<Input>)>,
    {
        let mut out = Collected::new(limits.output_bytes);
        let mut deadline = tokio::time::Instant::now()
            + if self.ready {
                emit(events, RunEvent::Started);
                limits.timeout
            } else {
                START_DEADLINE
            };
        let mut runner_stderr = Vec::new();
        // Code mode: each request is answered by a task of its own; the answers go back on
        // stdin. Returning drops the set: calls still in flight are cancelled upstream.
        let tool_run = self.tools.as_ref().map(|t| t.0.start());
        let mut calls = tokio::task::JoinSet::<Vec<u8>>::new();
        loop {
            let chunk = tokio::select! {
                Some(done) = calls.join_next(), if !calls.is_empty() => {
                    if let (Ok(answer), Some(stdin)) = (done, back.as_mut()) {
                        let w = async {
                            stdin.write_all(&answer).await?;
                            stdin.flush().await
                        };
                        if let Err(e) = w.await {
                            tracing::debug!(error = %e, "writing a tool answer into the sandbox failed");
                        }
                    }
                    continue;
                }
                (r, stdin) = &mut writer => {
                    tracing::trace!("job written");
                    *back = stdin;
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "writing the job into the sandbox failed");
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
                Some(Err(e)) => return Err(classify("reading the sandbox output", e)),
                Some(Ok(LogOutput::StdOut { message })) => {
                    tracing::trace!(bytes = message.len(), "runner output");
                    self.decoder.push(&message)
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    // The runner's own stderr (a crash of the runner itself); user output
                    // never arrives here. Keep a little for the log.
                    if runner_stderr.len() < 4096 {
                        runner_stderr.extend_from_slice(&message);
                    }
                    continue;
                }
                Some(Ok(_)) => continue,
            }
            while let Some(frame) = self
                .decoder
                .next_frame()
                .map_err(|e| BackendError::Runner(e.to_string()))?
            {
                match out.absorb(frame, events) {
                    None => {}
                    Some(Control::Ready) => {
                        self.ready = true;
                        deadline = tokio::time::Instant::now() + limits.timeout;
                        emit(events, RunEvent::Started);
                    }
                    Some(Control::Exit(report)) => return Ok(Ended::Report(report, out)),
                    Some(Control::Failed(msg)) => return Err(BackendError::Rejected(msg)),
                    Some(Control::Tool(request)) => match &tool_run {
                        Some(run) => {
                            let run = run.clone();
                            calls.spawn(async move { run.answer(request).await });
                        }
                        None => {
                            let answer = crate::backend::protocol::tool_unavailable(&request);
                            calls.spawn(async move { answer });
                        }
                    },
                }
            }
        }
    }
}
