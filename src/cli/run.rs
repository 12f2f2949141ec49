//! `mcp-code-executor run FILE... [-]`: each file in its own sandbox, for CI pipelines that
//! smoke-test untrusted code. Output is printed as it arrives; the exit code tells a CI job
//! what happened without parsing anything.

use std::io::Write;
use std::path::PathBuf;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::junit::{self, CaseResult};
use crate::app::{AppError, Executor};
use crate::job::{InputFile, JobSpec, Limits, Outcome, RunEvent, StreamKind};

/// Exit codes of `run`, documented in the README.
pub mod exit {
    /// Every file exited 0.
    pub const OK: i32 = 0;
    /// The code failed and gave no exit status of its own (or several files failed).
    pub const FAILED: i32 = 1;
    /// A file could not be read, or an argument was wrong.
    pub const USAGE: i32 = 2;
    /// The code was stopped at the deadline (as `timeout(1)`).
    pub const TIMEOUT: i32 = 124;
    /// The sandbox could not run the code: Docker, the image, the runner (as `docker run`).
    pub const INFRA: i32 = 125;
    /// The code was killed by the OOM killer (128 + SIGKILL).
    pub const OOM: i32 = 137;
}

/// The largest source file `run` accepts.
pub const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// What `run` was asked to do.
pub struct RunArgs {
    /// Paths, or `-` for stdin.
    pub files: Vec<String>,
    pub limits: Limits,
    /// One JSON outcome per line on stdout instead of the live output.
    pub json: bool,
    pub junit: Option<PathBuf>,
}

/// The exit code for one outcome.
pub fn exit_code_for(o: &Outcome) -> i32 {
    if o.timed_out {
        exit::TIMEOUT
    } else if o.oom_killed {
        exit::OOM
    } else if let Some(sig) = o.signal {
        128 + sig
    } else {
        match o.exit_code {
            Some(c) => (c & 0xff) as i32,
            None => exit::FAILED,
        }
    }
}

/// Run every file through `executor` (the same core the server uses, with the CLI's local
/// policy) and report; returns the process exit code.
pub async fn run_files(executor: &Executor, args: RunArgs) -> i32 {
    let mut results: Vec<(String, Result<Outcome, String>)> = Vec::new();
    let several = args.files.len() > 1;
    // Every file is read before any runs: a typo in the last name fails the job at once,
    // not after the others ran (and without a half-written report).
    let mut sources = Vec::with_capacity(args.files.len());
    for name in &args.files {
        match read_source(name).await {
            Ok(code) => sources.push(code),
            Err(e) => {
                eprintln!("mcp-code-executor: {e}");
                return exit::USAGE;
            }
        }
    }
    for (name, code) in args.files.iter().zip(sources) {
        if several && !args.json {
            eprintln!("==> {name} <==");
        }
        let result = run_one(executor, name, code, &args).await;
        match &result {
            Ok(o) if args.json => {
                let mut v = serde_json::to_value(o).expect("outcome serializes");
                v["file"] = name.clone().into();
                println!("{v}");
            }
            Ok(o) => {
                // A success is silent, unless several files ran or output was cut.
                if !o.success() || several || o.stdout_truncated || o.stderr_truncated {
                    eprintln!("mcp-code-executor: {name}: {}", o.status_line());
                }
            }
            Err(e) if args.json => {
                println!(
                    "{}",
                    serde_json::json!({"file": name, "error": e.to_string()})
                );
            }
            Err(e) => eprintln!("mcp-code-executor: {name}: {e}"),
        }
        results.push((name.clone(), result.map_err(|e| e.to_string())));
    }

    if let Some(path) = &args.junit {
        let cases: Vec<CaseResult<'_>> = results
            .iter()
            .map(|(n, r)| CaseResult {
                name: n,
                result: r.as_ref().map_err(Clone::clone),
            })
            .collect();
        if let Err(e) = std::fs::write(path, junit::render(&cases)) {
            eprintln!("mcp-code-executor: cannot write {}: {e}", path.display());
            return exit::USAGE;
        }
    }

    // One file: its own code. Several: the first failure's code, infrastructure first.
    if results.iter().any(|(_, r)| r.is_err()) {
        return exit::INFRA;
    }
    results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .map(exit_code_for)
        .find(|&c| c != exit::OK)
        .unwrap_or(exit::OK)
}

async fn run_one(
    executor: &Executor,
    name: &str,
    code: Vec<u8>,
    args: &RunArgs,
) -> Result<Outcome, AppError> {
    let mut job = JobSpec::python(Vec::new(), args.limits.clone());
    let entry = entry_name(name);
    job.files = vec![InputFile {
        path: entry.clone(),
        contents: code,
    }];
    job.entry = entry;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let live = !args.json;
    let printer = async move {
        while let Some(ev) = rx.recv().await {
            if let (true, RunEvent::Output { stream, data }) = (live, ev) {
                let _ = match stream {
                    StreamKind::Stdout => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&data).and_then(|_| out.flush())
                    }
                    StreamKind::Stderr => {
                        let mut err = std::io::stderr().lock();
                        err.write_all(&data).and_then(|_| err.flush())
                    }
                };
            }
        }
    };
    let cancel = CancellationToken::new();
    let (result, ()) = tokio::join!(executor.run(job, None, Some(tx), &cancel), printer);
    result
}

/// The name the file gets in the sandbox: its own base name when that is a plain `.py`
/// name (tracebacks then point at it), `main.py` otherwise.
fn entry_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or("");
    let plain = base.ends_with(".py")
        && base.len() <= 255
        && base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && !base.starts_with('.');
    if plain {
        base.to_string()
    } else {
        "main.py".to_string()
    }
}

async fn read_source(name: &str) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    if name == "-" {
        tokio::io::stdin()
            .take(MAX_SOURCE_BYTES + 1)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| format!("cannot read the code from stdin: {e}"))?;
    } else {
        let f = tokio::fs::File::open(name)
            .await
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        f.take(MAX_SOURCE_BYTES + 1)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| format!("cannot read {name}: {e}"))?;
    }
    if buf.len() as u64 > MAX_SOURCE_BYTES {
        return Err(format!(
            "{name} is larger than {} MiB",
            MAX_SOURCE_BYTES >> 20
        ));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_table() {
        let o = |f: fn(&mut Outcome)| {
            let mut o = Outcome::default();
            f(&mut o);
            exit_code_for(&o)
        };
        assert_eq!(o(|o| o.exit_code = Some(0)), 0);
        assert_eq!(o(|o| o.exit_code = Some(3)), 3);
        assert_eq!(o(|o| o.exit_code = Some(256 + 2)), 2);
        assert_eq!(o(|o| o.timed_out = true), exit::TIMEOUT);
        assert_eq!(
            o(|o| {
                o.oom_killed = true;
                o.signal = Some(9)
            }),
            exit::OOM
        );
        assert_eq!(o(|o| o.signal = Some(15)), 143);
        assert_eq!(o(|_| {}), exit::FAILED);
    }

    #[test]
    fn entry_names() {
        assert_eq!(entry_name("tests/smoke_1.py"), "smoke_1.py");
        assert_eq!(entry_name("-"), "main.py");
        assert_eq!(entry_name("weird name.py"), "main.py");
        assert_eq!(entry_name("script"), "main.py");
        assert_eq!(entry_name(".hidden.py"), "main.py");
    }
}
