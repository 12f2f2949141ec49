//! How `run` prints: one file's output live as it arrives (one file, or `--jobs 1`), or
//! each file's output as one block under its name once it is done (files in parallel), in
//! the order the files were given, so blocks never interleave and the log reads the same
//! whatever `--jobs` was. Then a status line per file, and a summary on stderr.

use std::io::Write;

use tokio::sync::mpsc::UnboundedReceiver;

use super::files::SourceFile;
use super::github;
use crate::job::{Outcome, RunEvent, StreamKind};

/// `run --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The output as the code wrote it (stdout to stdout, stderr to stderr), a status line
    /// on stderr.
    Text,
    /// One JSON object per file on stdout, nothing else there.
    Json,
    /// GitHub Actions: every file's output (both streams) on stdout in a `::group::`,
    /// failures as `::error` annotations.
    Github,
}

/// What became of one file.
#[derive(Debug)]
// One per file of a `run`, a handful at once: boxing the outcome would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum FileReport {
    Ran(Outcome),
    /// The sandbox could not run it (Docker, the image, the runner; or a bug of ours).
    Error(String),
    /// Not started: `--fail-fast` after another file failed.
    Skipped,
}

/// Why a skipped file was not run, in reports.
pub const SKIPPED_WHY: &str = "not run: --fail-fast stopped after a failure";

impl FileReport {
    pub fn passed(&self) -> bool {
        matches!(self, FileReport::Ran(o) if o.success())
    }
}

/// Whether a live file's streams ended mid-line (the next line written must not join it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Tail {
    stdout_open: bool,
    stderr_open: bool,
}

pub struct Printer {
    format: Format,
    /// Several files: each gets a header and a status line, and a summary ends the run.
    several: bool,
    /// Output is printed per file once it is done, not as it arrives.
    blocks: bool,
    /// GitHub: the `::stop-commands::` token that fences the code's output.
    token: String,
}

impl Printer {
    pub fn new(format: Format, several: bool, blocks: bool) -> Printer {
        Printer {
            format,
            several,
            blocks,
            token: uuid::Uuid::new_v4().simple().to_string(),
        }
    }

    /// Does a running file stream its output (then its task prints through
    /// [`Printer::stream`])?
    pub fn live(&self) -> bool {
        !self.blocks && self.format != Format::Json
    }

    /// A file is starting (live mode): its header.
    pub fn started(&self, f: &SourceFile) {
        if !self.live() {
            return;
        }
        match self.format {
            Format::Text if self.several => err_line(&format!("==> {} <==", f.name)),
            Format::Github => {
                let mut out = std::io::stdout().lock();
                let _ = out
                    .write_all(self.github_open(&f.name).as_bytes())
                    .and_then(|_| out.flush());
            }
            _ => {}
        }
    }

    /// Print a live file's events as they arrive; says how its streams ended.
    pub async fn stream(format: Format, mut rx: UnboundedReceiver<RunEvent>) -> Tail {
        let mut tail = Tail::default();
        while let Some(ev) = rx.recv().await {
            let RunEvent::Output { stream, data } = ev else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            let open = !data.ends_with(b"\n");
            // GitHub: both streams on stdout, so the fence around them holds.
            let _ = match (stream, format) {
                (StreamKind::Stderr, Format::Text) => {
                    tail.stderr_open = open;
                    let mut err = std::io::stderr().lock();
                    err.write_all(&data).and_then(|_| err.flush())
                }
                _ => {
                    tail.stdout_open = open;
                    let mut out = std::io::stdout().lock();
                    out.write_all(&data).and_then(|_| out.flush())
                }
            };
        }
        tail
    }

    /// A file is done: its block (blocks mode) or the end of its live output, then its
    /// status line and, for GitHub, its annotation; in JSON, its object.
    pub fn finished(&self, f: &SourceFile, report: &FileReport, tail: Tail) {
        if self.format == Format::Json {
            let v = match report {
                FileReport::Ran(o) => {
                    let mut v = serde_json::to_value(o).expect("outcome serializes");
                    v["file"] = f.name.clone().into();
                    v
                }
                FileReport::Error(e) => serde_json::json!({"file": f.name, "error": e}),
                FileReport::Skipped => {
                    serde_json::json!({"file": f.name, "skipped": true, "reason": SKIPPED_WHY})
                }
            };
            out_line(&v.to_string());
            return;
        }
        if matches!(report, FileReport::Skipped) {
            return;
        }
        // Both locks for the whole block (stdout first, always): nothing else is written
        // in between, whatever the two streams are joined into.
        let mut out = std::io::stdout().lock();
        let mut err = std::io::stderr().lock();
        let mut o: Vec<u8> = Vec::new();
        let mut e: Vec<u8> = Vec::new();
        match self.format {
            Format::Github => {
                if self.blocks {
                    o.extend(self.github_open(&f.name).as_bytes());
                    if let FileReport::Ran(r) = report {
                        push_terminated(&mut o, &r.stdout);
                        push_terminated(&mut o, &r.stderr);
                    }
                } else if tail.stdout_open {
                    o.push(b'\n');
                }
                o.extend(format!("::{}::\n::endgroup::\n", self.token).as_bytes());
                match report {
                    FileReport::Ran(r) if !r.success() => {
                        let failure = github::failure(r, &f.entry);
                        let title = format!("{} failed: {}", shown(&f.name), title_of(r));
                        o.extend(github::error_command(&f.name, &title, &failure).as_bytes());
                        o.push(b'\n');
                    }
                    FileReport::Error(msg) => {
                        let failure = github::Failure {
                            line: None,
                            message: msg.clone(),
                        };
                        let title = format!("{}: the sandbox failed", shown(&f.name));
                        o.extend(github::error_command(&f.name, &title, &failure).as_bytes());
                        o.push(b'\n');
                    }
                    _ => {}
                }
            }
            _ => {
                if self.blocks {
                    e.extend(format!("==> {} <==\n", f.name).as_bytes());
                    flush_pair(&mut out, &mut err, &mut o, &mut e);
                    if let FileReport::Ran(r) = report {
                        push_terminated(&mut o, &r.stdout);
                        flush_pair(&mut out, &mut err, &mut o, &mut e);
                        push_terminated(&mut e, &r.stderr);
                    }
                } else {
                    // Several files, live: the status line starts a line of its own.
                    if self.several && tail.stdout_open {
                        o.push(b'\n');
                    }
                    if self.several && tail.stderr_open {
                        e.push(b'\n');
                    }
                }
            }
        }
        flush_pair(&mut out, &mut err, &mut o, &mut e);
        if let Some(line) = self.status_line(f, report) {
            let _ = writeln!(err, "{line}").and_then(|_| err.flush());
        }
    }

    /// `mcp-code-executor: NAME: STATUS`, when there is something to say: a failure, cut
    /// output, or any file when several ran.
    fn status_line(&self, f: &SourceFile, report: &FileReport) -> Option<String> {
        match report {
            FileReport::Ran(o)
                if o.success() && !self.several && !o.stdout_truncated && !o.stderr_truncated =>
            {
                None
            }
            FileReport::Ran(o) => Some(format!(
                "mcp-code-executor: {}: {}",
                f.name,
                o.status_line()
            )),
            FileReport::Error(e) => Some(format!("mcp-code-executor: {}: {e}", f.name)),
            FileReport::Skipped => None,
        }
    }

    fn github_open(&self, name: &str) -> String {
        format!(
            "::group::{}\n::stop-commands::{}\n",
            github::data(name),
            self.token
        )
    }
}

/// A file's name in a title: `stdin` for `-`.
fn shown(name: &str) -> &str {
    if name == "-" {
        "stdin"
    } else {
        name
    }
}

/// A short title for a failed outcome's annotation.
fn title_of(o: &Outcome) -> String {
    if o.timed_out {
        "timed out".into()
    } else if o.oom_killed {
        "out of memory".into()
    } else if let Some(sig) = o.signal {
        format!("killed by signal {sig}")
    } else {
        match o.exit_code {
            Some(c) => format!("exit code {c}"),
            None => "no exit code".into(),
        }
    }
}

/// Print a line on stdout; a reader that went away (`| head`) is not an error (and must not
/// panic, which would leave sandboxes to the next start-up sweep).
pub fn out_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

/// Print a line on stderr, as [`out_line`].
pub fn err_line(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Append `data`, ending it with a newline if it has none.
fn push_terminated(buf: &mut Vec<u8>, data: &[u8]) {
    buf.extend_from_slice(data);
    if !data.is_empty() && !data.ends_with(b"\n") {
        buf.push(b'\n');
    }
}

/// Write and flush what is pending, stdout's part first.
fn flush_pair(
    out: &mut std::io::StdoutLock<'_>,
    err: &mut std::io::StderrLock<'_>,
    o: &mut Vec<u8>,
    e: &mut Vec<u8>,
) {
    if !o.is_empty() {
        let _ = out.write_all(o).and_then(|_| out.flush());
        o.clear();
    }
    if !e.is_empty() {
        let _ = err.write_all(e).and_then(|_| err.flush());
        e.clear();
    }
}

/// Counts for the summary.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub files: usize,
    pub passed: usize,
    pub failed: usize,
    pub timed_out: usize,
    pub oom_killed: usize,
    pub skipped: usize,
    pub errors: usize,
}

impl Summary {
    pub fn of<'a>(reports: impl IntoIterator<Item = &'a FileReport>) -> Summary {
        let mut s = Summary::default();
        for r in reports {
            s.files += 1;
            match r {
                FileReport::Ran(o) if o.success() => s.passed += 1,
                FileReport::Ran(o) if o.timed_out => s.timed_out += 1,
                FileReport::Ran(o) if o.oom_killed => s.oom_killed += 1,
                FileReport::Ran(_) => s.failed += 1,
                FileReport::Error(_) => s.errors += 1,
                FileReport::Skipped => s.skipped += 1,
            }
        }
        s
    }

    /// One line: `summary: 20 files, 14 passed, 3 failed, 2 timed out, 1 OOM-killed,
    /// 0 skipped, 0 errors in 4.21 s (--jobs 4)`.
    pub fn line(&self, wall: std::time::Duration, jobs: usize) -> String {
        format!(
            "summary: {} files, {} passed, {} failed, {} timed out, {} OOM-killed, {} skipped, {} errors in {:.2} s (--jobs {jobs})",
            self.files,
            self.passed,
            self.failed,
            self.timed_out,
            self.oom_killed,
            self.skipped,
            self.errors,
            wall.as_secs_f64()
        )
    }
}
