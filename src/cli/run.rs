//! `mcp-code-executor run FILE|DIR|GLOB... [-]`: each file in its own sandbox, for CI
//! pipelines that smoke-test untrusted code; `--jobs N` at once, served by a warm pool.
//! The exit code tells a CI job what happened without parsing anything; a summary, JSON,
//! JUnit and GitHub annotations tell people and CI systems which file did what.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::files::SourceFile;
use super::junit::{self, Case, CaseResult};
use super::output::{err_line, FileReport, Format, Printer, Summary, Tail, SKIPPED_WHY};
use crate::app::{AppError, Executor};
use crate::backend::RunGate;
use crate::job::{InputFile, JobSpec, Limits, Outcome};

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
    /// `run` itself was interrupted (SIGINT); SIGTERM gives [`TERMINATED`].
    pub const INTERRUPTED: i32 = 130;
    /// `run` itself was terminated (SIGTERM, e.g. a cancelled CI job).
    pub const TERMINATED: i32 = 143;
}

/// What `run` was asked to do, besides the files.
pub struct RunOptions {
    pub limits: Limits,
    pub format: Format,
    /// Write a JUnit XML report here.
    pub junit: Option<PathBuf>,
    /// Files run at once (at least 1).
    pub jobs: usize,
    /// Start no new file after the first failure.
    pub fail_fast: bool,
    /// What each file passes before it takes a sandbox: the pool made for the run's files
    /// (see [`crate::backend::connect::connect_for_runs`]); `None`: it takes what waits.
    pub gate: Option<RunGate>,
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

/// The exit code of a whole run: infrastructure errors first (125), else the first
/// failure's code in the order the files were given (so it does not depend on `--jobs`),
/// else 0. Skipped files do not count.
pub fn exit_code_of<'a>(reports: impl IntoIterator<Item = &'a FileReport> + Clone) -> i32 {
    if reports
        .clone()
        .into_iter()
        .any(|r| matches!(r, FileReport::Error(_)))
    {
        return exit::INFRA;
    }
    reports
        .into_iter()
        .filter_map(|r| match r {
            FileReport::Ran(o) => Some(exit_code_for(o)),
            _ => None,
        })
        .find(|&c| c != exit::OK)
        .unwrap_or(exit::OK)
}

/// `--jobs` when not given: the number of CPUs, and no more than the host's memory holds
/// at `limits.memory_bytes` per sandbox; at least 1.
pub fn default_jobs(limits: &Limits) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let by_memory = host_memory_bytes()
        .map(|m| (m / limits.memory_bytes.max(1)) as usize)
        .unwrap_or(cpus);
    cpus.min(by_memory).max(1)
}

/// `MemTotal` of `/proc/meminfo`.
fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Run `files` (already read, see [`files`](super::files)) through `executor` (the same core
/// the server uses, with the CLI's local policy), at most `opts.jobs` at once, and report;
/// returns the process exit code. Each file runs in a task of its own: a panic in one
/// becomes that file's error (its sandbox is removed as its run unwinds) and the others go
/// on. When `stop` fires (SIGINT, SIGTERM) no new file starts, the running ones are
/// cancelled (their sandboxes removed), and this returns without reports.
pub async fn run_files(
    executor: Arc<Executor>,
    mut files: Vec<SourceFile>,
    opts: RunOptions,
    stop: CancellationToken,
) -> i32 {
    let started = Instant::now();
    let n = files.len();
    let jobs = opts.jobs.max(1);
    let printer = Printer::new(opts.format, n > 1, jobs > 1 && n > 1);
    let mut reports: Vec<Option<(FileReport, Tail)>> = (0..n).map(|_| None).collect();
    let mut tasks = JoinSet::new();
    let mut index_of = HashMap::new();
    let (mut next, mut printed) = (0, 0);
    let mut starting = true;
    loop {
        while starting && next < n && tasks.len() < jobs && !stop.is_cancelled() {
            let f = &mut files[next];
            printer.started(f);
            let code = std::mem::take(&mut f.code);
            let job = job_for(f, code, &opts.limits);
            let live = printer.live().then_some(opts.format);
            let gate = opts.gate.clone();
            let task = tasks.spawn(run_one(
                executor.clone(),
                job,
                live,
                gate,
                stop.child_token(),
            ));
            index_of.insert(task.id(), next);
            next += 1;
        }
        let Some(joined) = tasks.join_next_with_id().await else {
            break;
        };
        let (i, report, tail) = match joined {
            Ok((id, (result, tail))) => {
                let report = match result {
                    Ok(o) => FileReport::Ran(o),
                    Err(e) => FileReport::Error(e.to_string()),
                };
                (index_of[&id], report, tail)
            }
            Err(e) => {
                let i = index_of[&e.id()];
                let why = if e.is_panic() {
                    panic_text(e.into_panic())
                } else {
                    "the run was aborted".to_string()
                };
                let report = FileReport::Error(format!("internal error (a bug of ours): {why}"));
                (i, report, Tail::default())
            }
        };
        if opts.fail_fast && !report.passed() && starting {
            starting = false;
            for r in &mut reports[next..] {
                *r = Some((FileReport::Skipped, Tail::default()));
            }
            next = n;
        }
        reports[i] = Some((report, tail));
        if stop.is_cancelled() {
            continue;
        }
        while let Some(Some((report, tail))) = reports.get(printed) {
            printer.finished(&files[printed], report, *tail);
            printed += 1;
        }
    }
    if stop.is_cancelled() {
        return exit::INTERRUPTED;
    }
    let wall = started.elapsed();
    let reports: Vec<FileReport> = reports
        .into_iter()
        .map(|r| r.expect("every file has a report").0)
        .collect();
    if n > 1 {
        err_line(&Summary::of(&reports).line(wall, jobs));
    }
    if let Some(path) = &opts.junit {
        let cases: Vec<CaseResult<'_>> = files
            .iter()
            .zip(&reports)
            .map(|(f, r)| CaseResult {
                name: &f.name,
                result: match r {
                    FileReport::Ran(o) => Case::Ran(o),
                    FileReport::Error(e) => Case::Error(e.clone()),
                    FileReport::Skipped => Case::Skipped(SKIPPED_WHY),
                },
            })
            .collect();
        let wall_ms = (jobs > 1).then_some(wall.as_millis() as u64);
        if let Err(e) = std::fs::write(path, junit::render(&cases, wall_ms)) {
            eprintln!("mcp-code-executor: cannot write {}: {e}", path.display());
            return exit::USAGE;
        }
    }
    exit_code_of(&reports)
}

fn job_for(f: &SourceFile, code: Vec<u8>, limits: &Limits) -> JobSpec {
    let mut job = JobSpec::python(Vec::new(), limits.clone());
    job.files = vec![InputFile {
        path: f.entry.clone(),
        contents: code,
    }];
    job.entry = f.entry.clone();
    job
}

/// One file's run; with `live`, its output printed as it arrives.
async fn run_one(
    executor: Arc<Executor>,
    job: JobSpec,
    live: Option<Format>,
    gate: Option<RunGate>,
    cancel: CancellationToken,
) -> (Result<Outcome, AppError>, Tail) {
    if let Some(gate) = gate {
        // A sandbox being made for this file, rather than a cold one made beside it.
        tokio::select! {
            _ = gate.pass() => {}
            _ = cancel.cancelled() => {}
        }
    }
    let Some(format) = live else {
        return (
            executor.run(job, None, None, &cancel).await,
            Tail::default(),
        );
    };
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::join!(
        executor.run(job, None, Some(tx), &cancel),
        Printer::stream(format, rx)
    )
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::app::{Capacity, Service, Settings, TenantParts};
    use crate::backend::{Backend, BackendError, BackendInfo, Events};

    /// A backend whose outcome is what the code says: `fail` exits 1, `panic` panics while
    /// holding a sandbox, `slow` takes 300 ms; it counts sandboxes alive and runs at once.
    #[derive(Default)]
    struct Scripted {
        live: Arc<AtomicUsize>,
        running: AtomicUsize,
        max_running: AtomicUsize,
        started: Mutex<Vec<String>>,
    }

    struct Alive(Arc<AtomicUsize>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[async_trait]
    impl crate::backend::Wrap for Scripted {
        fn inner(&self) -> &dyn Backend {
            &crate::backend::Inert
        }

        async fn run(&self, job: JobSpec, _events: Events) -> Result<Outcome, BackendError> {
            self.live.fetch_add(1, Ordering::SeqCst);
            let _alive = Alive(self.live.clone());
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_running.fetch_max(now, Ordering::SeqCst);
            self.started.lock().unwrap().push(job.entry.clone());
            let code = String::from_utf8_lossy(&job.files[0].contents).into_owned();
            tokio::time::sleep(Duration::from_millis(if code.contains("slow") {
                300
            } else {
                5
            }))
            .await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            if code.contains("panic") {
                panic!("scripted panic");
            }
            Ok(Outcome {
                exit_code: Some(if code.contains("fail") { 1 } else { 0 }),
                stdout: format!("ran {}\n", job.entry).into_bytes(),
                ..Outcome::default()
            })
        }

        async fn info(&self) -> Result<BackendInfo, BackendError> {
            Err(BackendError::Rejected("scripted".into()))
        }

        async fn drain(&self) {}
    }

    fn files(codes: &[&str]) -> Vec<SourceFile> {
        codes
            .iter()
            .enumerate()
            .map(|(i, c)| SourceFile {
                name: format!("f{i}.py"),
                path: None,
                entry: format!("f{i}.py"),
                code: c.as_bytes().to_vec(),
            })
            .collect()
    }

    async fn run(
        backend: Arc<Scripted>,
        codes: &[&str],
        jobs: usize,
        fail_fast: bool,
        junit: Option<PathBuf>,
    ) -> i32 {
        let mut service = Service::new(
            backend,
            Capacity {
                max_concurrent: jobs,
                ..Capacity::default()
            },
        );
        let executor = service.add_tenant(TenantParts {
            settings: Settings::default(),
            storage: None,
            environments: None,
        });
        let opts = RunOptions {
            limits: Limits::default(),
            format: Format::Json,
            junit,
            jobs,
            fail_fast,
            gate: None,
        };
        run_files(executor, files(codes), opts, CancellationToken::new()).await
    }

    #[tokio::test]
    async fn a_panic_in_one_job_is_that_files_error_and_the_others_run() {
        let b = Arc::new(Scripted::default());
        let codes = ["ok", "panic", "slow", "ok", "ok"];
        let code = run(b.clone(), &codes, 3, false, None).await;
        assert_eq!(code, exit::INFRA);
        assert_eq!(b.started.lock().unwrap().len(), 5, "every file ran");
        assert_eq!(
            b.live.load(Ordering::SeqCst),
            0,
            "the panicking run let go of its sandbox"
        );
        assert!(
            b.max_running.load(Ordering::SeqCst) > 1,
            "files ran at once"
        );
        assert!(
            b.max_running.load(Ordering::SeqCst) <= 3,
            "no more than --jobs"
        );
    }

    #[tokio::test]
    async fn fail_fast_starts_nothing_after_a_failure_and_reports_the_rest_skipped() {
        let b = Arc::new(Scripted::default());
        let junit = std::env::temp_dir().join(format!("mcpx-ff-{}.xml", uuid::Uuid::new_v4()));
        let codes = ["fail", "slow", "ok", "ok", "ok"];
        let code = run(b.clone(), &codes, 2, true, Some(junit.clone())).await;
        assert_eq!(code, exit::FAILED);
        // The first two started together; the second one finished; nothing else started.
        assert_eq!(*b.started.lock().unwrap(), ["f0.py", "f1.py"]);
        let xml = std::fs::read_to_string(&junit).unwrap();
        std::fs::remove_file(&junit).ok();
        assert!(
            xml.contains("tests=\"5\" failures=\"1\" errors=\"0\" skipped=\"3\""),
            "{xml}"
        );
        assert!(
            xml.contains("name=\"f1.py\" time=\"0.000\">\n    <system-out>ran f1.py"),
            "{xml}"
        );
    }

    #[tokio::test]
    async fn files_start_in_order_and_the_exit_code_is_the_first_failure_in_order() {
        let b = Arc::new(Scripted::default());
        let codes = ["slow", "slow fail", "ok", "fail", "ok"];
        let code = run(b.clone(), &codes, 4, false, None).await;
        assert_eq!(code, exit::FAILED);
        let started = b.started.lock().unwrap().clone();
        assert_eq!(started, ["f0.py", "f1.py", "f2.py", "f3.py", "f4.py"]);
        assert_eq!(
            exit_code_of(&[
                FileReport::Skipped,
                FileReport::Ran(Outcome {
                    exit_code: Some(0),
                    ..Default::default()
                })
            ]),
            0
        );
        let failed = |c| {
            FileReport::Ran(Outcome {
                exit_code: Some(c),
                ..Default::default()
            })
        };
        assert_eq!(exit_code_of(&[failed(0), failed(4), failed(3)]), 4);
        assert_eq!(
            exit_code_of(&[failed(4), FileReport::Error("x".into())]),
            exit::INFRA
        );
    }

    #[test]
    fn default_jobs_is_bounded_by_cpus_and_memory() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        let small = Limits {
            memory_bytes: 64 << 20,
            ..Limits::default()
        };
        assert_eq!(default_jobs(&small), cpus);
        let huge = Limits {
            memory_bytes: 1 << 50,
            ..Limits::default()
        };
        assert_eq!(default_jobs(&huge), 1);
    }

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
}
