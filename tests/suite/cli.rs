//! The `run` and `doctor` commands as a CI pipeline uses them: the real binary, the real
//! daemon, exit codes and reports checked.

use crate::common;

use common::{assert_nothing_left_by, containers_left_by};

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");

fn run_cli(args: &[&str], stdin: &str) -> (Output, u32) {
    run_cli_env(args, stdin, &[])
}

fn run_cli_env(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> (Output, u32) {
    let mut child = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    // A child that fails before reading its stdin (no daemon) closes the pipe: not an error.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    (out, pid)
}

/// A child `mcp-code-executor` that, should the test fail while it runs, is killed and has
/// its containers removed.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
        let left = containers_left_by(self.0.id(), true);
        if !left.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f", "-v"])
                .args(&left)
                .output();
        }
    }
}

fn temp_file(name: &str, body: &str) -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| common::scratch_dir("cli"));
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn stdin_code_prints_and_exits_zero() {
    let (out, pid) = run_cli(&["run", "-"], "print(42)\n");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "42\n", "{out:?}");
    assert_eq!(out.status.code(), Some(0));
    assert_nothing_left_by(pid);
}

#[test]
fn the_scripts_exit_code_is_the_commands() {
    let (out, pid) = run_cli(&["run", "-"], "import sys\nprint('bye')\nsys.exit(3)\n");
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "bye\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("exit code 3"));
    assert_nothing_left_by(pid);
}

#[test]
fn json_reports_a_memory_bomb_as_oom_killed() {
    let bomb = temp_file(
        "bomb.py",
        "chunks = []\nwhile True:\n    chunks.append('x' * (8 << 20))\n",
    );
    let (out, pid) = run_cli(
        &["run", "--json", "--memory", "64m", bomb.to_str().unwrap()],
        "",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(v["oom_killed"], true, "{v}");
    assert_eq!(v["file"], bomb.to_str().unwrap());
    assert_eq!(out.status.code(), Some(137));
    assert_nothing_left_by(pid);
}

#[test]
fn timeout_returns_within_seconds_with_its_own_exit_code() {
    let spin = temp_file("spin.py", "while True: pass\n");
    let t = Instant::now();
    let (out, pid) = run_cli(
        &["run", "--json", "--timeout", "2", spin.to_str().unwrap()],
        "",
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["timed_out"], true, "{v}");
    assert_eq!(out.status.code(), Some(124));
    assert_nothing_left_by(pid);
}

#[test]
fn several_files_and_a_junit_report() {
    let good = temp_file("good.py", "print('fine')\n");
    let bad = temp_file("bad.py", "raise SystemExit(4)\n");
    let report = std::env::temp_dir().join(format!("mcpx-{}.junit.xml", std::process::id()));
    let (out, pid) = run_cli(
        &[
            "run",
            "--junit",
            report.to_str().unwrap(),
            good.to_str().unwrap(),
            bad.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let xml = std::fs::read_to_string(&report).unwrap();
    assert!(
        xml.contains("tests=\"2\" failures=\"1\" errors=\"0\""),
        "{xml}"
    );
    assert!(xml.contains("<system-out>fine\n</system-out>"), "{xml}");
    assert!(
        xml.contains("<failure type=\"exit\" message=\"exit code 4"),
        "{xml}"
    );
    std::fs::remove_file(report).ok();
    assert_nothing_left_by(pid);
}

#[test]
fn bad_flags_are_usage_errors_naming_the_flag() {
    let (out, _) = run_cli(&["run", "--memory", "lots", "-"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a size"));
    let (out, _) = run_cli(&["run", "--memory", "1m", "-"], "print(1)");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory limit"));
    let (out, _) = run_cli(&["run", "/nonexistent/x.py"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    // A memory budget that holds no run is refused before anything starts.
    let (out, _) = run_cli(
        &["serve", "--memory", "512m", "--memory-budget", "256m"],
        "",
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--memory-budget") && err.contains("no run would fit"),
        "{err}"
    );
}

#[test]
fn doctor_passes_every_isolation_check() {
    let (out, pid) = run_cli(&["doctor"], "");
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}\n{out:?}");
    for check in [
        "backend reachable",
        "sandbox image",
        "python runs",
        "non-root uid",
        "read-only root",
        "no capabilities",
        "no-new-privileges",
        "seccomp filter",
        "network unreachable",
        "no outbound connections",
        "nofile limit",
        "cpu quota",
        "no swap beyond memory",
        "memory bomb OOM-killed",
        "fork bomb contained",
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("ok") && l.contains(check)),
            "{check} not ok:\n{table}"
        );
    }
    assert_nothing_left_by(pid);
}

/// A socket path where no daemon listens.
const NO_DAEMON: &str = "unix:///nonexistent/mcpx-test/docker.sock";

#[test]
fn an_unreachable_daemon_is_exit_125_and_says_what_to_do() {
    let (out, _) = run_cli_env(&["run", "-"], "print(1)\n", &[("DOCKER_HOST", NO_DAEMON)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        stderr.contains("cannot reach the Docker daemon"),
        "{stderr}"
    );
    assert!(
        stderr.contains("Start it") && stderr.contains("DOCKER_HOST"),
        "says what to do: {stderr}"
    );

    let (out, _) = run_cli_env(&["doctor"], "", &[("DOCKER_HOST", NO_DAEMON)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("FAIL  backend reachable"), "{stderr}");
    assert!(stderr.contains("DOCKER_HOST"), "{stderr}");
}

#[test]
fn run_prints_output_as_it_arrives() {
    // The code prints a line, then waits until the test, having read that line, tells it to
    // go on (a file it makes in the sandbox's /tmp through `docker exec`). Output printed
    // only at the end could never arrive before the go: no timing is compared.
    let code = "import os, time\nprint('first', flush=True)\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.1)\nprint('second', flush=True)\n";
    let child = Command::new(BIN)
        .args(["run", "--timeout", "600", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary starts");
    let mut child = Running(child);
    let pid = child.0.id();
    let mut stdin = child.0.stdin.take().unwrap();
    stdin.write_all(code.as_bytes()).unwrap();
    drop(stdin);
    let (tx, rx) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the first line arrives while the code still runs");
    assert_eq!(first, "first");
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "run is still running"
    );
    let running = containers_left_by(pid, false);
    assert_eq!(running.len(), 1, "one sandbox running: {running:?}");
    let go = Command::new("docker")
        .args(["exec", &running[0], "touch", "/tmp/go"])
        .output()
        .unwrap();
    assert!(go.status.success(), "docker exec: {go:?}");
    let second = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a second line");
    assert_eq!(second, "second");
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_nothing_left_by(pid);
}

#[test]
fn output_limit_truncates_and_flags() {
    let code = "import sys\nprint('x' * 5000)\nprint('e' * 5000, file=sys.stderr)\n";
    let (out, pid) = run_cli(&["run", "--output-limit", "1k", "-"], code);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, vec![b'x'; 1024], "1 KiB of stdout printed");
    assert_nothing_left_by(pid);

    let (out, pid) = run_cli(&["run", "--json", "--output-limit", "1k", "-"], code);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(v["stdout_truncated"], true, "{v}");
    assert_eq!(v["stderr_truncated"], true, "{v}");
    assert_eq!(v["stdout"].as_str().unwrap().len(), 1024, "{v}");
    assert_eq!(v["stderr"].as_str().unwrap().len(), 1024, "{v}");
    assert_eq!(out.status.code(), Some(0));
    assert_nothing_left_by(pid);
}

#[test]
fn a_small_pids_limit_stops_a_fork_bomb() {
    let code = common::FORK_BOMB;
    let (out, pid) = run_cli(&["run", "--pids", "16", "--timeout", "30", "-"], code);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout} {out:?}");
    let mut it = stdout.split_whitespace();
    let n: i64 = it.next().unwrap_or("-1").parse().unwrap();
    assert!((1..16).contains(&n), "forked {n} under --pids 16: {stdout}");
    assert_eq!(it.next(), Some("11"), "EAGAIN: {stdout}");
    assert_nothing_left_by(pid);
}
