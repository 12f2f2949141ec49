//! The `run` and `doctor` commands as a CI pipeline uses them: the real binary, the real
//! daemon, exit codes and reports checked.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");

fn run_cli(args: &[&str], stdin: &str) -> (Output, u32) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let pid = child.id();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out, pid)
}

/// Nothing made by the process `pid` may be left once it has exited.
fn assert_nothing_left_by(pid: u32) {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=io.mcp-code-executor.managed=true",
            "--format",
            "{{.Label \"io.mcp-code-executor.owner\"}}",
        ])
        .output()
        .unwrap();
    let owners = String::from_utf8_lossy(&out.stdout);
    let mine = format!("/{pid}/");
    assert!(
        !owners.lines().any(|o| o.contains(&mine)),
        "process {pid} left containers: {owners}"
    );
}

fn temp_file(name: &str, body: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("mcpx-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
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
}

#[test]
fn doctor_passes_every_isolation_check() {
    let (out, pid) = run_cli(&["doctor"], "");
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{table}\n{out:?}");
    for check in [
        "docker reachable",
        "sandbox image",
        "non-root uid",
        "read-only root",
        "network unreachable",
        "no capabilities",
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
