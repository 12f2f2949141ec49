//! What comes back from a runner, gathered the same way whatever carried it (a Docker
//! attach, a Kubernetes `pods/attach`): output capped per stream, figures and files under
//! the bound of what one run may return, names fit to be shown, and how the conversation
//! ended. Each backend reads its own transport and hands the decoded frames to
//! [`Collected::absorb`].

use crate::backend::protocol::{self, Frame, Report};
use crate::backend::{emit, Events};
use crate::job::{Artifact, Outcome, OutputFile, RunEvent, StreamKind};

/// How a conversation with a runner ended.
pub(crate) enum Ended {
    Report(Box<Report>, Collected),
    TimedOut(Collected),
    /// The stream ended without a report: the runner itself died (or its sandbox went).
    Vanished(Collected),
}

/// Write `input` to a runner's stdin, then close it (a one-shot run) or hand it back for
/// the next message (a session).
pub(crate) async fn write_input<W>(
    mut stdin: W,
    input: &[u8],
    close: bool,
) -> (std::io::Result<()>, Option<W>)
where
    W: tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    let mut r = stdin.write_all(input).await;
    if r.is_ok() {
        r = stdin.flush().await;
    }
    if close {
        let _ = stdin.shutdown().await;
        (r, None)
    } else {
        (r, Some(stdin))
    }
}

impl Ended {
    /// Did a session's cell end with its interpreter still there: a report of the cell (not
    /// of the runner's end), no signal, exit status 0 or 1 (1: the code raised)?
    pub(crate) fn kept_the_interpreter(&self) -> bool {
        matches!(self, Ended::Report(r, _) if !r.ended && r.signal.is_none() && r.exit_code.is_some_and(|c| c <= 1))
    }
}

/// The rules of a session (one sandbox, one interpreter, cell after cell) that every
/// backend keeps the same way.
pub(crate) mod session {
    use std::time::{Duration, Instant};

    use super::Ended;
    use crate::backend::{emit, protocol, BackendError, Events};
    use crate::job::{InputFile, Limits, Outcome, RunEvent};

    /// A session's sandbox as the shared steps see it: one message in, what came back.
    #[async_trait::async_trait]
    pub(crate) trait Sandbox: Send {
        /// Its name in progress events.
        fn name(&self) -> String;
        /// Send `message` to the runner (its input stays open) and gather what comes back.
        async fn execute(
            &mut self,
            message: &[u8],
            limits: &Limits,
            events: &Events,
        ) -> Result<Ended, BackendError>;
        /// The outcome of what ended.
        async fn outcome(&mut self, ended: Ended) -> Result<Outcome, BackendError>;
        /// What the interpreter imports after the next cell, while the session waits.
        fn warm_up(&self) -> Vec<String> {
            Vec::new()
        }
    }

    /// Run one cell under the session's `limits` with `timeout`: its outcome, and whether
    /// the session goes on after it.
    pub(crate) async fn run_cell<S: Sandbox>(
        s: &mut S,
        limits: &Limits,
        code: &str,
        timeout: Duration,
        events: &Events,
    ) -> (Result<Outcome, BackendError>, bool) {
        let started = Instant::now();
        let limits = Limits {
            timeout,
            ..limits.clone()
        };
        emit(
            events,
            RunEvent::Created {
                container: s.name(),
            },
        );
        let cell = protocol::encode_cell(code, limits.output_bytes, &s.warm_up());
        let ended = match s.execute(&cell, &limits, events).await {
            Ok(e) => e,
            Err(e) => return (Err(e), false),
        };
        let kept = ended.kept_the_interpreter();
        match s.outcome(ended).await {
            Ok(mut o) => {
                let on = goes_on(kept, &o);
                o.duration_ms = started.elapsed().as_millis() as u64;
                (Ok(o), on)
            }
            Err(e) => (Err(e), false),
        }
    }

    /// Put workspace files into the session: a message of the runner's session protocol,
    /// which the runner unpacks itself (the interpreter runs nothing, its state is
    /// untouched). What it came to, and whether the session goes on.
    pub(crate) async fn put<S: Sandbox>(
        s: &mut S,
        limits: &Limits,
        files: &[InputFile],
        timeout: Duration,
    ) -> (Result<(), BackendError>, bool) {
        let message = match protocol::encode_put_files(files) {
            Ok(m) => m,
            Err(e) => return (Err(BackendError::Rejected(e.to_string())), true),
        };
        let limits = Limits {
            timeout,
            ..limits.clone()
        };
        let outcome = match s.execute(&message, &limits, &None).await {
            Ok(ended) => s.outcome(ended).await,
            Err(e) => Err(e),
        };
        files_put(outcome)
    }

    /// The answer to a call into a session that has ended.
    pub(crate) fn ended() -> BackendError {
        BackendError::Rejected("this session has ended; open a new one".into())
    }

    /// After a cell whose end [`super::Ended::kept_the_interpreter`] (or not): does the
    /// session go on? A timeout, an OOM kill or a dead interpreter (`exit()` included,
    /// whatever its status) ends it: its state is gone.
    pub(crate) fn goes_on(kept_the_interpreter: bool, o: &Outcome) -> bool {
        kept_the_interpreter && !o.timed_out && !o.oom_killed
    }

    /// What putting workspace files into a session came to, and whether the session goes
    /// on: exit status 1 is a refusal (a name, the workspace full) and the session goes on;
    /// a timeout, an OOM kill or a vanished runner end it.
    pub(crate) fn files_put(
        outcome: Result<Outcome, BackendError>,
    ) -> (Result<(), BackendError>, bool) {
        match outcome {
            Ok(o) if o.success() => (Ok(()), true),
            Ok(o) => (
                Err(BackendError::Runner(format!(
                    "workspace files could not be copied into the session: {}",
                    o.stderr_text().trim_end()
                ))),
                o.exit_code == Some(1) && !o.timed_out && !o.oom_killed,
            ),
            Err(e) => (Err(e), false),
        }
    }
}

/// A frame [`Collected::absorb`] leaves to the caller: it changes the conversation, not
/// the result.
pub(crate) enum Control {
    Ready,
    Exit(Report),
    Failed(String),
    /// A kind of frame the collector does not gather (a runner's call to the server, say):
    /// the frame loop hands it to its [`crate::backend::engine::live::FrameHook`].
    #[allow(dead_code)]
    Other(Frame),
}

/// Output gathered so far, capped per stream.
#[derive(Default)]
pub(crate) struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_seen: u64,
    stderr_seen: u64,
    artifacts: Vec<Artifact>,
    files: Vec<OutputFile>,
    /// The output cap it was gathered under.
    cap: u64,
    /// Figures and files refused here (a name unfit to show, over the return limit).
    files_refused: u64,
    artifacts_refused: u64,
    returned: u64,
    notes: Vec<String>,
    /// The runner said `S`: it had the job.
    started: bool,
}

impl Collected {
    /// Nothing gathered yet, under an output cap of `cap` bytes per stream.
    pub(crate) fn new(cap: u64) -> Self {
        Collected {
            cap,
            ..Collected::default()
        }
    }

    /// Did the runner get the job (its `S`)? A sandbox that vanished before it never ran
    /// the code; one that vanished after may have, silently (a memory bomb under gVisor).
    pub(crate) fn started(&self) -> bool {
        self.started
    }

    /// Take one frame: output, figures and files are kept (output within the cap is also
    /// sent as a live event); the frames that steer the conversation are handed back.
    pub(crate) fn absorb(&mut self, frame: Frame, events: &Events) -> Option<Control> {
        match frame {
            Frame::Ready => return Some(Control::Ready),
            Frame::Started => self.started = true,
            Frame::Exit(report) => return Some(Control::Exit(report)),
            Frame::Failed(msg) => return Some(Control::Failed(msg)),
            Frame::Stdout(data) => {
                let kept = keep(&mut self.stdout, &mut self.stdout_seen, self.cap, &data);
                live_output(events, StreamKind::Stdout, &data[..kept]);
            }
            Frame::Stderr(data) => {
                let kept = keep(&mut self.stderr, &mut self.stderr_seen, self.cap, &data);
                live_output(events, StreamKind::Stderr, &data[..kept]);
            }
            Frame::Artifact { name, data } => {
                if !shown_name(&name) || !self.take(data.len()) {
                    self.artifacts_refused += 1;
                } else {
                    self.artifacts.push(Artifact { name, data })
                }
            }
            Frame::File { path, data } => {
                if crate::backend::archive::check_relative_path(&path).is_err()
                    || !shown_name(&path)
                    || !self.take(data.len())
                {
                    self.files_refused += 1;
                } else {
                    self.files.push(OutputFile { path, data });
                }
            }
            // Kinds added to the protocol for others (see `Control::Other`).
            #[allow(unreachable_patterns)]
            other => return Some(Control::Other(other)),
        }
        None
    }

    /// The outcome the runner reported, with what was gathered.
    pub(crate) fn into_outcome(self, report: &Report) -> Outcome {
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
            external: Default::default(),
        }
    }

    /// The outcome of a sandbox killed before its runner reported: by its deadline
    /// (`timed_out`) or by the OOM killer.
    pub(crate) fn into_killed(self, timed_out: bool) -> Outcome {
        let mut o = self.into_outcome(&Report::default());
        o.timed_out = timed_out;
        o.oom_killed = !timed_out;
        o.signal = Some(9);
        o
    }

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

fn live_output(events: &Events, stream: StreamKind, data: &[u8]) {
    if !data.is_empty() {
        emit(
            events,
            RunEvent::Output {
                stream,
                data: data.to_vec(),
            },
        );
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

/// A name fit to be shown in a result or a listing: the one name rule
/// ([`crate::storage::printable`]), as for `write_file`.
pub(crate) fn shown_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(crate::storage::printable)
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

    #[test]
    fn figures_past_the_return_bound_are_refused_with_a_note() {
        let mut c = Collected::new(10);
        let big = vec![0u8; protocol::RETURN_BYTES as usize / 2 + 1];
        for _ in 0..2 {
            c.absorb(
                Frame::Artifact {
                    name: "figure-001.png".into(),
                    data: big.clone(),
                },
                &None,
            );
        }
        let o = c.into_outcome(&Report::default());
        assert_eq!(o.artifacts.len(), 1);
        assert_eq!(o.artifacts_dropped, 1);
        assert_eq!(o.notes.len(), 1);
    }
}
