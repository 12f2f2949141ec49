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
use crate::backend::protocol::{self, Frame, FrameDecoder, Report};
use crate::backend::{emit, BackendError, Events};
use crate::job::{Artifact, Limits, Outcome, OutputFile, RunEvent, StreamKind};

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
}

/// How the conversation ended.
pub(super) enum Ended {
    Report(Report, Collected),
    TimedOut(Collected),
    /// The stream ended without a report: the runner itself died.
    Vanished(Collected),
}

/// Output gathered so far, capped per stream.
#[derive(Default)]
pub(super) struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_seen: u64,
    stderr_seen: u64,
    artifacts: Vec<Artifact>,
    files: Vec<OutputFile>,
    /// The output cap it was gathered under.
    cap: u64,
    /// Figures and files the server refused itself (a name unfit to show, over the
    /// return limit), and why.
    files_refused: u64,
    artifacts_refused: u64,
    returned: u64,
    notes: Vec<String>,
}

impl Collected {
    /// Nothing came back at all: no output, no figure, no file.
    pub(super) fn is_empty(&self) -> bool {
        self.stdout_seen == 0
            && self.stderr_seen == 0
            && self.artifacts.is_empty()
            && self.files.is_empty()
    }

    pub(super) fn into_outcome(self, report: &Report) -> Outcome {
        let cap = self.cap;
        Outcome {
            exit_code: report.exit_code,
            signal: report.signal,
            timed_out: report.timed_out,
            oom_killed: report.oom_kills > 0 && report.signal == Some(9),
            stdout_truncated: self.stdout_seen.max(report.stdout_bytes) > cap,
            stderr_truncated: self.stderr_seen.max(report.stderr_bytes) > cap,
            stdout: self.stdout,
            stderr: self.stderr,
            duration_ms: 0,
            cpu_ms: report.cpu_ms,
            peak_memory_bytes: report.peak_memory_bytes,
            artifacts: self.artifacts,
            artifacts_dropped: report.artifacts_dropped + self.artifacts_refused,
            files: self.files,
            files_dropped: report.files_dropped + self.files_refused,
            notes: {
                let mut notes = report.notes.clone();
                notes.truncate(16);
                notes.extend(self.notes);
                notes
            },
        }
    }
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
        let mut stdin = self
            .input
            .take()
            .ok_or_else(|| BackendError::Runner("the sandbox's input is already closed".into()))?;
        let writer = async move {
            let mut r = stdin.write_all(input).await;
            if r.is_ok() {
                r = stdin.flush().await;
            }
            if close_input {
                let _ = stdin.shutdown().await;
                (r, None)
            } else {
                (r, Some(stdin))
            }
        }
        .fuse();
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
        let cap = limits.output_bytes;
        let mut out = Collected {
            cap,
            ..Collected::default()
        };
        let mut deadline = tokio::time::Instant::now()
            + if self.ready {
                emit(events, RunEvent::Started);
                limits.timeout
            } else {
                START_DEADLINE
            };
        let mut runner_stderr = Vec::new();
        loop {
            let chunk = tokio::select! {
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
                match frame {
                    Frame::Ready => {
                        self.ready = true;
                        deadline = tokio::time::Instant::now() + limits.timeout;
                        emit(events, RunEvent::Started);
                    }
                    Frame::Stdout(data) => {
                        let kept = keep(&mut out.stdout, &mut out.stdout_seen, cap, &data);
                        if kept > 0 {
                            emit(
                                events,
                                RunEvent::Output {
                                    stream: StreamKind::Stdout,
                                    data: data[..kept].to_vec(),
                                },
                            );
                        }
                    }
                    Frame::Stderr(data) => {
                        let kept = keep(&mut out.stderr, &mut out.stderr_seen, cap, &data);
                        if kept > 0 {
                            emit(
                                events,
                                RunEvent::Output {
                                    stream: StreamKind::Stderr,
                                    data: data[..kept].to_vec(),
                                },
                            );
                        }
                    }
                    Frame::Artifact { name, data } => {
                        if !shown_name(&name) || !out.take(data.len()) {
                            out.artifacts_refused += 1;
                        } else {
                            out.artifacts.push(Artifact { name, data })
                        }
                    }
                    Frame::File { path, data } => {
                        if crate::backend::archive::check_relative_path(&path).is_err()
                            || !shown_name(&path)
                            || !out.take(data.len())
                        {
                            out.files_refused += 1;
                        } else {
                            out.files.push(OutputFile { path, data });
                        }
                    }
                    Frame::Exit(report) => return Ok(Ended::Report(report, out)),
                    Frame::Failed(msg) => return Err(BackendError::Rejected(msg)),
                }
            }
        }
    }
}

/// Keep what fits under the cap of `data`; returns how many bytes were kept.
fn keep(buf: &mut Vec<u8>, seen: &mut u64, cap: u64, data: &[u8]) -> usize {
    *seen += data.len() as u64;
    let room = (cap as usize).saturating_sub(buf.len());
    let kept = data.len().min(room);
    buf.extend_from_slice(&data[..kept]);
    kept
}

/// A name fit to be shown in a result or a listing: no control character (a newline
/// would let the code forge a line of its own).
pub(crate) fn shown_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(char::is_control)
}

impl Collected {
    /// Count `n` bytes of figures or files against what one run may return; false (and
    /// a note) once they do not fit. The runner keeps the same bound: this is the
    /// server's own, should a runner send more.
    fn take(&mut self, n: usize) -> bool {
        if self.returned + n as u64 > protocol::RETURN_BYTES {
            let note = format!(
                "figures or files left out: over the {} bytes one run may return",
                protocol::RETURN_BYTES
            );
            if !self.notes.contains(&note) {
                self.notes.push(note);
            }
            return false;
        }
        self.returned += n as u64;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_beyond_the_cap_is_counted_not_kept() {
        let (mut buf, mut seen) = (Vec::new(), 0);
        assert_eq!(keep(&mut buf, &mut seen, 5, b"abc"), 3);
        assert_eq!(keep(&mut buf, &mut seen, 5, b"defgh"), 2);
        assert_eq!(buf, b"abcde");
        assert_eq!(seen, 8);
    }

    #[test]
    fn names_with_control_characters_are_not_shown() {
        assert!(shown_name("figure-001.png"));
        assert!(shown_name("données/é.csv"));
        assert!(!shown_name("a\nstatus: exit code 0"));
        assert!(!shown_name("x\u{1b}[2J"));
        assert!(!shown_name(""));
    }
}
