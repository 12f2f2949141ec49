//! The sandbox outlives nothing: when the server is gone (kill -9, a crash, a recreated
//! service) its containers stop by themselves, and hostile code cannot hold a run past its
//! end. Real daemon, real containers, the real binary.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mcp_code_executor::backend::docker::{LABEL_MANAGED, LABEL_OWNER, LABEL_TENANT};
use mcp_code_executor::backend::{image, Backend, BackendError};
use mcp_code_executor::job::{JobSpec, Limits, RunEvent, StreamKind};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");

/// Containers of ours made by process `pid` of this host (from the owner label).
fn containers_owned_by(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-a", "--filter"])
        .arg(format!("label={LABEL_MANAGED}=true"))
        .args(["--format"])
        .arg(format!("{{{{.ID}}}} {{{{.Label \"{LABEL_OWNER}\"}}}}"))
        .output()
        .expect("docker ps runs");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let prefix = format!("{}/{pid}/", host.trim());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, owner)| owner.starts_with(&prefix))
        .map(|(id, _)| id.to_string())
        .collect()
}

fn running(id: &str) -> bool {
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.State.Running}}", id])
        .output()
        .expect("docker inspect runs");
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// Removes the containers of a process when dropped, also when the test failed.
struct RemoveOwnedBy(u32);

impl Drop for RemoveOwnedBy {
    fn drop(&mut self) {
        for id in containers_owned_by(self.0) {
            let _ = Command::new("docker").args(["rm", "-f", &id]).output();
        }
    }
}

/// `run` a script whose first line is `started`, and wait until that line is printed.
fn spawn_run(script: &str, extra: &[&str]) -> (Child, tempdir::Dir) {
    let dir = tempdir::Dir::new("watchdog");
    let file = dir.path.join("spin.py");
    std::fs::write(&file, script).unwrap();
    let mut child = Command::new(BIN)
        .arg("run")
        .args(extra)
        .arg(&file)
        .env("RUST_LOG", "mcp_code_executor=warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).expect("reads the first line");
    assert_eq!(line.trim(), "started", "the script did not start");
    // Keep reading in the background so that the pipe never fills.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (child, dir)
}

const SPIN: &str = "print('started', flush=True)\nwhile True:\n    pass\n";

#[tokio::test]
async fn the_code_is_stopped_even_when_the_server_died() {
    let sandbox = common::sandbox().await; // the image, and the sweep used below
    let (mut child, _dir) = spawn_run(SPIN, &["--timeout", "2"]);
    let pid = child.id();
    let _cleanup = RemoveOwnedBy(pid);
    let ids = containers_owned_by(pid);
    assert_eq!(ids.len(), 1, "one sandbox for the run: {ids:?}");
    // The server (here: `run`) dies without a chance to kill its sandbox.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        running(&ids[0]),
        "the sandbox still runs right after its server died"
    );
    // The runner's backstop (timeout + grace) kills the code; the container ends.
    let t = Instant::now();
    while running(&ids[0]) && t.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !running(&ids[0]),
        "the sandbox of a dead server still ran {:?} after the kill",
        t.elapsed()
    );
    // The start-up sweep of the next process removes it: its owner is dead.
    sandbox.sweep().await.expect("sweep");
    assert!(containers_owned_by(pid).is_empty(), "swept");
}

#[tokio::test]
async fn a_runner_left_without_a_job_exits_by_itself() {
    common::sandbox().await;
    let tenant = "t-watchdog-wait";
    let name = format!("mcpx-test-wait-{}", std::process::id());
    let _cleanup = scopeguard(name.clone());
    // As the engine starts a pool container, but told to wait one second for its job, and
    // with stdin held open by nobody who ever writes.
    let mut child = Command::new("docker")
        .args(["run", "-i", "--rm", "--network", "none", "--name", &name])
        .args(["--label", &format!("{LABEL_MANAGED}=true")])
        .args(["--label", &format!("{LABEL_TENANT}={tenant}")])
        .args(["-e", "MCPX_WAIT_LIMIT=1", &image::default_image()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("docker run starts");
    let stdin = child.stdin.take(); // open, silent
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t.elapsed() > Duration::from_secs(30) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(stdin);
    assert!(
        status.is_some(),
        "the waiting runner did not exit by itself"
    );
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(&out[..5], b"R\0\0\0\0", "it was ready first: {out:?}");
    assert_eq!(out.len(), 5, "and said nothing else: {out:?}");
}

/// `docker rm -f NAME` when dropped.
fn scopeguard(name: String) -> impl Drop {
    struct G(String);
    impl Drop for G {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rm", "-f", &self.0]).output();
        }
    }
    G(name)
}

#[tokio::test]
async fn a_sandbox_killed_from_outside_is_an_infrastructure_error() {
    let sandbox = common::sandbox().await;
    let tenant = "t-watchdog-killed";
    let mut job = JobSpec::python(
        "import time\nprint('up', flush=True)\ntime.sleep(60)\n",
        Limits::default(),
    );
    job.tenant = tenant.into();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let run = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move { sandbox.run(job, Some(tx)).await })
    };
    let mut container = None;
    while let Some(ev) = rx.recv().await {
        match ev {
            RunEvent::Created { container: c } => container = Some(c),
            RunEvent::Output {
                stream: StreamKind::Stdout,
                ..
            } => break,
            _ => {}
        }
    }
    let container = container.expect("a container was made");
    let killed = Command::new("docker")
        .args(["kill", &container])
        .output()
        .unwrap();
    assert!(killed.status.success(), "{killed:?}");
    let result = run.await.unwrap();
    match result {
        Err(BackendError::Runner(msg)) => {
            assert!(msg.contains("stopped from outside"), "{msg}");
            assert!(
                msg.contains("run it again"),
                "the message says what to do: {msg}"
            );
        }
        other => panic!("a user outcome instead of an infrastructure error: {other:?}"),
    }
    common::assert_clean(&sandbox, tenant).await;
}

#[tokio::test]
async fn fifos_among_figures_and_workspace_files_do_not_hang_the_runner() {
    let sandbox = common::sandbox().await;
    let tenant = "t-watchdog-fifo";
    let limits = Limits {
        timeout: Duration::from_secs(20),
        ..Limits::default()
    };
    let code = "import os\n\
        os.makedirs('/tmp/.mcp-figures', exist_ok=True)\n\
        os.mkfifo('/tmp/.mcp-figures/figure-999.png')\n\
        os.mkfifo('/workspace/pipe')\n\
        open('/workspace/real.txt', 'w').write('kept')\n\
        print('ok')\n";
    let mut job = JobSpec::python(code, limits);
    job.tenant = tenant.into();
    job.return_files = true;
    let o = sandbox.run(job, None).await.expect("runs");
    assert!(!o.timed_out, "the runner blocked on a FIFO: {o:?}");
    assert!(o.success(), "{}", o.stderr_text());
    assert_eq!(o.stdout_text(), "ok\n");
    assert!(o.artifacts.is_empty(), "a FIFO is no figure");
    let paths: Vec<_> = o.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["real.txt"], "regular files only");
    common::assert_clean(&sandbox, tenant).await;
}

#[tokio::test]
async fn orphans_writing_on_do_not_hold_back_the_report() {
    let sandbox = common::sandbox().await;
    let tenant = "t-watchdog-orphan";
    let limits = Limits {
        timeout: Duration::from_secs(20),
        ..Limits::default()
    };
    // The code exits at once, leaving a child that writes to the shared stdout forever.
    let code = "import subprocess, sys\n\
        subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True:\\n    print(1, flush=True)\\n    time.sleep(0.01)'])\n\
        print('parent done', flush=True)\n";
    let o = common::run(&sandbox, tenant, code, limits).await;
    assert!(
        !o.timed_out,
        "the report waited for the orphan until the deadline: {}",
        o.status_line()
    );
    assert_eq!(o.exit_code, Some(0), "{}", o.stderr_text());
    assert!(o.stdout_text().starts_with("parent done\n"));
    common::assert_clean(&sandbox, tenant).await;
}

#[tokio::test]
async fn run_removes_its_sandbox_when_terminated() {
    common::sandbox().await;
    let (mut child, _dir) = spawn_run(SPIN, &["--timeout", "60"]);
    let pid = child.id();
    let _cleanup = RemoveOwnedBy(pid);
    assert_eq!(containers_owned_by(pid).len(), 1);
    let term = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143), "exit code after SIGTERM");
    assert!(
        containers_owned_by(pid).is_empty(),
        "`run` exited and left its sandbox"
    );
}

mod tempdir {
    /// A scratch directory removed when dropped.
    pub struct Dir {
        pub path: std::path::PathBuf,
    }

    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let path = std::env::temp_dir().join(format!(
                "mcpx-{tag}-{}-{}",
                std::process::id(),
                uuid_like()
            ));
            std::fs::create_dir_all(&path).unwrap();
            Dir { path }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }

    fn uuid_like() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    }
}

/// A `serve --stdio` child, spoken to with raw JSON-RPC lines.
struct StdioServer {
    child: Child,
    stdin: std::process::ChildStdin,
    /// The server's stdout, line by line.
    lines: std::sync::mpsc::Receiver<String>,
    _dir: tempdir::Dir,
}

impl StdioServer {
    fn start(tenant: &str) -> StdioServer {
        let dir = tempdir::Dir::new("watchdog-serve");
        let mut child = Command::new(BIN)
            .args(["serve", "--stdio", "--pool-size", "0", "--tenant", tenant])
            .env("MCP_EXECUTOR_DATA_DIR", dir.path.join("data"))
            .env("CODE_STORAGE_DIR", dir.path.join("code"))
            .env("RUST_LOG", "mcp_code_executor=warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve starts");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        StdioServer {
            child,
            stdin,
            lines,
            _dir: dir,
        }
    }

    fn send(&mut self, v: serde_json::Value) {
        use std::io::Write;
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Wait for the answer to request `id`.
    fn answer(&self, id: u64) -> serde_json::Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .expect("the server answers");
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON-RPC on stdout");
            if v["id"] == id {
                return v;
            }
        }
    }
}

#[tokio::test]
async fn a_session_cell_is_stopped_when_its_server_died() {
    common::sandbox().await;
    let mut server = StdioServer::start("t-watchdog-session");
    let pid = server.child.id();
    let _cleanup = RemoveOwnedBy(pid);
    server.send(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
    // Start-up (the self-test, the environment's probe) is over once initialize is answered.
    assert!(server.answer(1)["result"].is_object());
    server.send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    server.send(serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"code": "while True:\n    pass\n", "timeout": 300}}}));
    // The session's container: the one of this server still running a moment later.
    let t = Instant::now();
    let session = loop {
        let ids: Vec<String> = containers_owned_by(pid)
            .into_iter()
            .filter(|id| running(id))
            .collect();
        if ids.len() == 1 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if running(&ids[0]) {
                break ids[0].clone();
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no session container: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // Its attach connection closed the runner's stdin: the cell and the container stop,
    // long before the cell's own 300 s timeout.
    let t = Instant::now();
    while running(&session) && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !running(&session),
        "the session of a dead server still spins"
    );
}
