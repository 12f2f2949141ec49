//! A fake backend for fast tests of the logic above the seam (the application core): no
//! containers, but the same contract. Every run and session counts as a live sandbox until
//! its future or session is dropped (so a test sees cancellation remove it); runs can be
//! held at a gate to observe queueing and concurrency; a session keeps state between cells
//! (each cell prints how many cells its session has run). The contract tests run it with
//! the real backends from one body: code may carry [`Directive`]s in `#fake:` comments
//! (Python ignores them) saying what the code would do.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use super::{Backend, BackendError, BackendInfo, BackendStats, Events, Inert, Session, Wrap};
use crate::job::{InputFile, JobSpec, Limits, Outcome};

/// The fake. Cheap to make; share it as `Arc<FakeBackend>`.
pub struct FakeBackend {
    jobs: Mutex<Vec<JobSpec>>,
    live: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    max_running: Arc<AtomicUsize>,
    /// While true, runs wait (after they were counted running) until it turns false.
    held: watch::Sender<bool>,
    shut_down: AtomicBool,
    /// Files put into sessions, by name, in order.
    put: Arc<Mutex<Vec<String>>>,
}

impl Default for FakeBackend {
    fn default() -> Self {
        FakeBackend {
            jobs: Mutex::default(),
            live: Arc::default(),
            running: Arc::default(),
            max_running: Arc::default(),
            held: watch::channel(false).0,
            shut_down: AtomicBool::new(false),
            put: Arc::default(),
        }
    }
}

/// Counts one live sandbox until dropped.
struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    fn new(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        LiveGuard(live.clone())
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FakeBackend {
    pub fn new() -> Arc<Self> {
        Arc::new(FakeBackend::default())
    }

    /// Hold every run from now on at the gate (until [`FakeBackend::release`]).
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Let held runs (and later ones) finish.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// Every job the backend was given to run (sessions included), in order.
    pub fn jobs(&self) -> Vec<JobSpec> {
        self.jobs.lock().unwrap().clone()
    }

    /// Sandboxes (runs and sessions) not yet removed.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Runs going right now, and the most that ever went at once.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    pub fn max_running(&self) -> usize {
        self.max_running.load(Ordering::SeqCst)
    }

    /// Names of the files put into sessions after they opened.
    pub fn put_files(&self) -> Vec<String> {
        self.put.lock().unwrap().clone()
    }

    pub fn was_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Wait (at most 5 s) until `n` runs are going; panics otherwise.
    pub async fn wait_running(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.running() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} runs going, expected {n}",
                self.running()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Counts one running run until dropped.
struct RunningGuard(Arc<AtomicUsize>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What code would do, said to the fake in a comment: `#fake: out=TEXT err=TEXT exit=N`
/// (output lines and the exit status), `hang` (runs until its timeout, then is killed),
/// `oom` (killed by the OOM killer), `flood` (writes past the output cap), and in a
/// session `keep=VALUE` (the session keeps it) and `recall` (prints what it keeps).
#[derive(Debug, PartialEq)]
enum Directive {
    Out(String),
    Err(String),
    Exit(i64),
    Hang,
    Oom,
    Flood,
    Keep(String),
    Recall,
}

/// The directives in `code`; empty when it has none (the fake's plain answers).
fn directives(code: &str) -> Vec<Directive> {
    code.lines()
        .filter_map(|l| l.split_once("#fake:").map(|(_, d)| d))
        .flat_map(str::split_whitespace)
        .filter_map(|t| {
            Some(match t.split_once('=') {
                Some(("out", v)) => Directive::Out(v.into()),
                Some(("err", v)) => Directive::Err(v.into()),
                Some(("exit", v)) => Directive::Exit(v.parse().ok()?),
                Some(("keep", v)) => Directive::Keep(v.into()),
                None if t == "hang" => Directive::Hang,
                None if t == "oom" => Directive::Oom,
                None if t == "flood" => Directive::Flood,
                None if t == "recall" => Directive::Recall,
                _ => return None,
            })
        })
        .collect()
}

/// The outcome `ds` describe under `limits` (a hang waits for the timeout first); what a
/// session keeps is `kept`.
async fn act(ds: &[Directive], limits: &Limits, kept: &mut Option<String>) -> Outcome {
    let mut o = Outcome {
        exit_code: Some(0),
        ..Outcome::default()
    };
    let cap = limits.output_bytes as usize;
    for d in ds {
        match d {
            Directive::Out(t) => o.stdout.extend(format!("{t}\n").bytes()),
            Directive::Err(t) => o.stderr.extend(format!("{t}\n").bytes()),
            Directive::Exit(c) => o.exit_code = Some(*c),
            Directive::Keep(v) => *kept = Some(v.clone()),
            Directive::Recall => {
                let v = kept.clone().unwrap_or_default();
                o.stdout.extend(format!("{v}\n").bytes());
            }
            Directive::Flood => {
                o.stdout = vec![b'x'; cap];
                o.stdout_truncated = true;
            }
            Directive::Hang | Directive::Oom => {
                if *d == Directive::Hang {
                    tokio::time::sleep(limits.timeout).await;
                }
                o.exit_code = None;
                o.signal = Some(9);
                o.timed_out = *d == Directive::Hang;
                o.oom_killed = *d == Directive::Oom;
            }
        }
    }
    o
}

/// No pool, no sweep, no ceiling: those go to [`Inert`].
#[async_trait]
impl Wrap for FakeBackend {
    fn inner(&self) -> &dyn Backend {
        &Inert
    }

    async fn run(&self, job: JobSpec, _events: Events) -> Result<Outcome, BackendError> {
        let _live = LiveGuard::new(&self.live);
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        let _running = RunningGuard(self.running.clone());
        self.max_running.fetch_max(now, Ordering::SeqCst);
        let entry = job.entry.clone();
        let code = job.files.iter().find(|f| f.path == entry);
        let ds = directives(&String::from_utf8_lossy(
            code.map_or(&[][..], |f| &f.contents),
        ));
        let limits = job.limits.clone();
        self.jobs.lock().unwrap().push(job);
        let mut held = self.held.subscribe();
        while *held.borrow_and_update() {
            if held.changed().await.is_err() {
                break;
            }
        }
        if !ds.is_empty() {
            return Ok(act(&ds, &limits, &mut None).await);
        }
        Ok(Outcome {
            exit_code: Some(0),
            stdout: format!("ran {entry}\n").into_bytes(),
            ..Outcome::default()
        })
    }

    async fn info(&self) -> Result<BackendInfo, BackendError> {
        Ok(BackendInfo {
            kind: "fake",
            version: "fake 1".into(),
            image: "none".into(),
            image_present: true,
            details: Vec::new(),
        })
    }

    async fn drain(&self) {}

    async fn open_session(&self, job: JobSpec) -> Result<Box<dyn Session>, BackendError> {
        let files = job.files.iter().map(|f| f.path.clone()).collect();
        let limits = job.limits.clone();
        self.jobs.lock().unwrap().push(job);
        Ok(Box::new(FakeSession {
            limits,
            kept: None,
            _live: LiveGuard::new(&self.live),
            cells: 0,
            files,
            put: self.put.clone(),
            alive: true,
        }))
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            live_containers: self.live(),
            ..BackendStats::default()
        }
    }

    async fn shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
    }
}

/// A session that counts its cells: its state is the count.
struct FakeSession {
    limits: Limits,
    /// What `keep=` directives left.
    kept: Option<String>,
    _live: LiveGuard,
    cells: u32,
    /// Files it has in its workspace.
    files: Vec<String>,
    put: Arc<Mutex<Vec<String>>>,
    alive: bool,
}

#[async_trait]
impl Session for FakeSession {
    async fn exec(
        &mut self,
        code: &str,
        timeout: Duration,
        _events: Events,
    ) -> Result<Outcome, BackendError> {
        if !self.alive {
            return Err(crate::backend::collect::session::ended());
        }
        let ds = directives(code);
        if !ds.is_empty() {
            let limits = Limits {
                timeout,
                ..self.limits.clone()
            };
            let o = act(&ds, &limits, &mut self.kept).await;
            self.alive = !o.timed_out && !o.oom_killed;
            return Ok(o);
        }
        if code.trim() == "exit()" {
            self.alive = false;
            return Ok(Outcome {
                exit_code: Some(0),
                ..Outcome::default()
            });
        }
        self.cells += 1;
        Ok(Outcome {
            exit_code: Some(0),
            stdout: format!("cell {} files {}\n", self.cells, self.files.join(",")).into_bytes(),
            ..Outcome::default()
        })
    }

    async fn put_files(
        &mut self,
        files: &[InputFile],
        _timeout: Duration,
    ) -> Result<(), BackendError> {
        for f in files {
            self.put.lock().unwrap().push(f.path.clone());
            if !self.files.contains(&f.path) {
                self.files.push(f.path.clone());
            }
        }
        Ok(())
    }

    fn alive(&self) -> bool {
        self.alive
    }
}
