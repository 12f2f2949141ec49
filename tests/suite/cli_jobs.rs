//! `run` with several files as a CI pipeline uses it: `--jobs`, `--fail-fast`, directories
//! and globs, `--format github`, signals. The real binary and the real daemon; outcomes,
//! exit codes, output order and containers left behind are checked, never timings.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{assert_nothing_left_by, containers_left_by};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");

/// A child `mcp-code-executor` that, should the test fail while it runs, is killed and has
/// its containers removed.
struct Running {
    child: Option<Child>,
    pid: u32,
}

impl Running {
    fn spawn(cmd: &mut Command) -> Running {
        let child = cmd.spawn().expect("the binary starts");
        Running {
            pid: child.id(),
            child: Some(child),
        }
    }

    fn pid(&self) -> u32 {
        self.pid
    }

    fn wait(mut self) -> Output {
        let child = self.child.take().expect("not waited for yet");
        child.wait_with_output().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            let left = containers_left_by(self.pid, true);
            if !left.is_empty() {
                let _ = Command::new("docker")
                    .args(["rm", "-f", "-v"])
                    .args(&left)
                    .output();
            }
        }
    }
}

/// Run the binary in `dir` to its end; stdout and stderr apart (or joined, `2>&1`).
fn run_in(dir: &Path, args: &[&str], joined: bool) -> (Output, u32) {
    let mut cmd = if joined {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("exec \"$0\" \"$@\" 2>&1")
            .arg(BIN)
            .args(args);
        c
    } else {
        let mut c = Command::new(BIN);
        c.args(args);
        c
    };
    cmd.current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Running::spawn(&mut cmd);
    let pid = child.pid();
    (child.wait(), pid)
}

/// A fresh directory with these files (relative paths) in it, removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(files: &[(&str, &str)]) -> Tree {
        let root = std::env::temp_dir().join(format!(
            "mcpx-jobs-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        for (p, body) in files {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        Tree(root)
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

const PASS: &str = "n = NN\nprint('file', n, sum(range(n * 1000)))\n";
const EXIT_3: &str = "print('about to fail')\nraise SystemExit(3)\n";
const RAISES: &str = "def f():\n    return 1 / 0\n\nf()\n";
const EXIT_2: &str = "import sys\nsys.exit(2)\n";
const SLEEPS: &str = "import time\nprint('sleeping', flush=True)\ntime.sleep(120)\n";
const BOMB: &str = "chunks = []\nwhile True:\n    chunks.append('x' * (8 << 20))\n";

#[test]
fn twenty_mixed_files_give_the_same_outcomes_and_exit_code_with_jobs_4_as_with_jobs_1() {
    let special: BTreeMap<usize, &str> = [
        (3, EXIT_3),
        (5, SLEEPS),
        (8, BOMB),
        (11, RAISES),
        (14, SLEEPS),
        (17, BOMB),
        (19, EXIT_2),
    ]
    .into();
    let bodies: Vec<(String, String)> = (1..=20)
        .map(|i| {
            let body = special
                .get(&i)
                .map(|s| s.to_string())
                .unwrap_or_else(|| PASS.replace("NN", &i.to_string()));
            (format!("suite/f{i:02}.py"), body)
        })
        .collect();
    let refs: Vec<(&str, &str)> = bodies
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_str()))
        .collect();
    let tree = Tree::new(&refs);
    let report = tree.0.join("report.xml");
    let common = ["run", "--json", "--timeout", "4", "--memory", "64m"];

    let mut outcomes = Vec::new();
    for jobs in ["1", "4"] {
        let mut args = common.to_vec();
        args.extend(["--jobs", jobs, "--junit", "report.xml", "suite"]);
        let (out, pid) = run_in(&tree.0, &args, false);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_nothing_left_by(pid);
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 20, "{stderr}");
        // The exit code is the first failure's in file order, whatever finished first.
        assert_eq!(out.status.code(), Some(3), "--jobs {jobs}: {stderr}");
        assert!(
            stderr.contains(
                "summary: 20 files, 13 passed, 3 failed, 2 timed out, 2 OOM-killed, 0 skipped, 0 errors in "
            ) && stderr.contains(&format!("(--jobs {jobs})")),
            "{stderr}"
        );
        let xml = std::fs::read_to_string(&report).unwrap();
        assert!(
            xml.contains("tests=\"20\" failures=\"7\" errors=\"0\" skipped=\"0\""),
            "{xml}"
        );
        let kept: Vec<serde_json::Value> = lines
            .iter()
            .map(|v| {
                serde_json::json!({
                    "file": v["file"], "exit_code": v["exit_code"], "signal": v["signal"],
                    "timed_out": v["timed_out"], "oom_killed": v["oom_killed"],
                    "stdout": v["stdout"], "stderr": v["stderr"],
                })
            })
            .collect();
        outcomes.push(kept);
    }
    assert_eq!(outcomes[0], outcomes[1], "--jobs 1 and --jobs 4 differ");
    let by_file = &outcomes[1];
    assert_eq!(by_file[0]["file"], "suite/f01.py");
    assert_eq!(by_file[0]["stdout"], "file 1 499500\n");
    assert_eq!(by_file[2]["exit_code"], 3);
    assert_eq!(by_file[4]["timed_out"], true, "{}", by_file[4]);
    assert_eq!(by_file[4]["stdout"], "sleeping\n");
    assert_eq!(by_file[7]["oom_killed"], true, "{}", by_file[7]);
    assert!(by_file[10]["stderr"]
        .as_str()
        .unwrap()
        .ends_with("ZeroDivisionError: division by zero\n"));
    assert_eq!(by_file[18]["exit_code"], 2);
}

/// Files that print a line, wait until the test lets them go on, then print 30 more lines
/// to each stream; the test lets them go only once `n` of them run at once.
fn release_when_running_together(child: &Running, n: usize, total: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut released = std::collections::HashSet::new();
    while released.len() < total {
        assert!(
            Instant::now() < deadline,
            "only {} released",
            released.len()
        );
        // A container runs a file once the file is in its /workspace (pool containers
        // wait with an empty one).
        let busy: Vec<String> = containers_left_by(child.pid(), false)
            .into_iter()
            .filter(|id| !released.contains(id))
            .filter(|id| {
                Command::new("docker")
                    .args(["exec", id, "sh", "-c", "ls /workspace/*.py"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .collect();
        if busy.len() >= n.min(total - released.len()) {
            for id in busy {
                let go = Command::new("docker")
                    .args(["exec", &id, "touch", "/tmp/go"])
                    .output()
                    .unwrap();
                assert!(go.status.success(), "docker exec: {go:?}");
                released.insert(id);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

const CHATTY: &str = "import os, sys, time\nprint('NAME start', flush=True)\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.05)\nfor k in range(30):\n    print('NAME out', k, flush=True)\n    print('NAME err', k, file=sys.stderr, flush=True)\n    time.sleep(0.002)\nprint('NAME', end='')\n";

#[test]
fn output_blocks_of_files_run_at_once_never_interleave() {
    let names: Vec<String> = (1..=8).map(|i| format!("c{i}")).collect();
    let bodies: Vec<(String, String)> = names
        .iter()
        .map(|n| (format!("{n}.py"), CHATTY.replace("NAME", n)))
        .collect();
    let refs: Vec<(&str, &str)> = bodies
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_str()))
        .collect();
    let tree = Tree::new(&refs);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" run --jobs 4 --timeout 120 'c*.py' 2>&1")
        .arg(BIN)
        .current_dir(&tree.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Running::spawn(&mut cmd);
    // `sh` execs the binary: same pid.
    release_when_running_together(&child, 4, 8);
    let pid = child.pid();
    let out = child.wait();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_nothing_left_by(pid);

    // Every file's block, whole, in the order given (the glob's, sorted), one after another.
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    for n in &names {
        assert_eq!(
            lines.next(),
            Some(format!("==> {n}.py <==").as_str()),
            "{text}"
        );
        assert_eq!(lines.next(), Some(format!("{n} start").as_str()), "{text}");
        for k in 0..30 {
            assert_eq!(
                lines.next(),
                Some(format!("{n} out {k}").as_str()),
                "{text}"
            );
        }
        // The last line, without its newline, is ended before what follows.
        assert_eq!(lines.next(), Some(n.as_str()), "{text}");
        for k in 0..30 {
            assert_eq!(
                lines.next(),
                Some(format!("{n} err {k}").as_str()),
                "{text}"
            );
        }
        let status = lines.next().unwrap_or_default();
        assert!(
            status.starts_with(&format!("mcp-code-executor: {n}.py: exit code 0, ")),
            "{status}\n{text}"
        );
    }
    let summary = lines.next().unwrap_or_default();
    assert!(
        summary.starts_with("summary: 8 files, 8 passed, 0 failed, 0 timed out, 0 OOM-killed, 0 skipped, 0 errors in "),
        "{summary}"
    );
    assert_eq!(lines.next(), None, "{text}");
}

#[test]
fn fail_fast_lets_running_files_finish_and_skips_the_rest() {
    let tree = Tree::new(&[
        ("ff/a.py", "raise SystemExit(2)\n"),
        ("ff/b.py", "import time\ntime.sleep(1)\nprint('finished')\n"),
        ("ff/c.py", "print('c')\n"),
        ("ff/d.py", "print('d')\n"),
        ("ff/e/f.py", "print('f')\n"),
    ]);
    let (out, pid) = run_in(
        &tree.0,
        &[
            "run",
            "--json",
            "--jobs",
            "2",
            "--fail-fast",
            "--junit",
            "ff.xml",
            "ff/",
        ],
        false,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_nothing_left_by(pid);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines = json_lines(&out);
    let files: Vec<&str> = lines.iter().map(|v| v["file"].as_str().unwrap()).collect();
    assert_eq!(
        files,
        ["ff/a.py", "ff/b.py", "ff/c.py", "ff/d.py", "ff/e/f.py"]
    );
    assert_eq!(lines[0]["exit_code"], 2);
    // b started with a: it finishes, and counts.
    assert_eq!(lines[1]["stdout"], "finished\n", "{}", lines[1]);
    for v in &lines[2..] {
        assert_eq!(v["skipped"], true, "{v}");
        assert!(v.get("exit_code").is_none(), "{v}");
    }
    assert!(
        stderr.contains(
            "summary: 5 files, 1 passed, 1 failed, 0 timed out, 0 OOM-killed, 3 skipped, 0 errors"
        ),
        "{stderr}"
    );
    let xml = std::fs::read_to_string(tree.0.join("ff.xml")).unwrap();
    assert!(
        xml.contains("tests=\"5\" failures=\"1\" errors=\"0\" skipped=\"3\""),
        "{xml}"
    );
    assert!(
        xml.contains("name=\"ff/d.py\" time=\"0.000\">\n    <skipped message="),
        "{xml}"
    );
}

#[test]
fn github_format_annotates_the_failing_line_and_fences_the_codes_output() {
    let tree = Tree::new(&[
        ("ci/ok.py", "print('fine')\n"),
        (
            "ci/pkg/bad_call.py",
            "import json\n\ndef parse(text):\n    return json.loads(text)\n\nparse('{oops')\n",
        ),
        ("ci/pkg/syntax.py", "x = 1\ny = (\n"),
        (
            "ci/forge.py",
            "print('::error file=ci/ok.py,line=1::forged')\nprint('::stop-commands::abc')\nprint('::abc::')\nprint('::warning::still forged', end='')\n",
        ),
    ]);
    let (out, pid) = run_in(
        &tree.0,
        &["run", "--format", "github", "--jobs", "2", "ci"],
        false,
    );
    assert_nothing_left_by(pid);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{out:?}");
    let errors: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("::error "))
        .collect();
    assert_eq!(errors.len(), 3, "two real ones and a forged one: {stdout}");
    assert_eq!(
        errors[1],
        "::error file=ci/pkg/bad_call.py,line=4,title=ci/pkg/bad_call.py failed%3A exit code 1::json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    );
    assert!(
        errors[2].starts_with("::error file=ci/pkg/syntax.py,line=2,title=ci/pkg/syntax.py failed%3A exit code 1::SyntaxError: "),
        "{}",
        errors[2]
    );
    // The forged line is inside the fence the runner set up: between `::stop-commands::T`
    // and `::T::`, where GitHub runs no command.
    let lines: Vec<&str> = stdout.lines().collect();
    let forged = lines
        .iter()
        .position(|l| l.contains("forged"))
        .expect("the code's output is there");
    let open = lines[..forged]
        .iter()
        .rposition(|l| l.starts_with("::stop-commands::") && *l != "::stop-commands::abc")
        .expect("a fence before it");
    let token = lines[open].trim_start_matches("::stop-commands::");
    assert!(token.len() >= 32, "an unguessable token: {token}");
    let close = lines
        .iter()
        .position(|l| *l == format!("::{token}::"))
        .expect("the fence closes");
    assert!(close > forged + 3, "{stdout}");
    assert_eq!(lines[close - 1], "::warning::still forged", "line ended");
    assert_eq!(lines[close + 1], "::endgroup::");
    // Groups in file order (the directory's, sorted).
    let groups: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("::group::"))
        .collect();
    assert_eq!(
        groups,
        [
            "ci/forge.py",
            "ci/ok.py",
            "ci/pkg/bad_call.py",
            "ci/pkg/syntax.py"
        ]
    );
}

#[test]
fn sigterm_and_sigint_remove_every_sandbox_of_a_parallel_run() {
    let tree = Tree::new(&[
        ("s/a.py", SLEEPS),
        ("s/b.py", SLEEPS),
        ("s/c.py", SLEEPS),
        ("s/d.py", SLEEPS),
        ("s/e.py", SLEEPS),
    ]);
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--jobs", "3", "--timeout", "300", "s"])
            .current_dir(&tree.0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = Running::spawn(&mut cmd);
        let pid = child.pid();
        let deadline = Instant::now() + Duration::from_secs(120);
        // Three files running, and the pool refilling behind them.
        loop {
            let busy = containers_left_by(pid, false)
                .into_iter()
                .filter(|id| {
                    Command::new("docker")
                        .args(["exec", id, "sh", "-c", "ls /workspace/*.py"])
                        .output()
                        .is_ok_and(|o| o.status.success())
                })
                .count();
            if busy == 3 {
                break;
            }
            assert!(Instant::now() < deadline, "three files never ran at once");
            std::thread::sleep(Duration::from_millis(200));
        }
        let kill = Command::new("kill")
            .args(["-s", signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let out = child.wait();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "SIG{signal}: {stderr}");
        assert!(stderr.contains("removing the sandboxes"), "{stderr}");
        assert_nothing_left_by(pid);
    }
}

/// Containers created by process `pid` between the unix times `since` and `until`, as the
/// daemon's event log tells (they are removed by then: `docker ps` no longer shows them).
fn containers_created_by(pid: u32, since: f64, until: f64) -> usize {
    let out = Command::new("docker")
        .args([
            "events",
            "--filter",
            "type=container",
            "--filter",
            "event=create",
        ])
        .arg("--since")
        .arg(format!("{since:.3}"))
        .arg("--until")
        .arg(format!("{until:.3}"))
        .args([
            "--format",
            "{{index .Actor.Attributes \"io.mcp-code-executor.owner\"}}",
        ])
        .output()
        .expect("the docker CLI runs");
    assert!(out.status.success(), "docker events: {out:?}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mine = format!("{}/{pid}/", host.trim());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|owner| owner.starts_with(&mine))
        .count()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Issue 29: `run --jobs 4` makes one sandbox per file and no more (a pool that refilled
/// past the last file made sandboxes only to remove them), every file takes a sandbox made
/// ahead for it (none starts cold beside the pool's), and none is left.
#[test]
fn a_parallel_run_makes_one_sandbox_per_file_all_made_ahead_and_leaves_none() {
    let files: Vec<(String, String)> = (1..=12)
        .map(|i| (format!("p/f{i:02}.py"), format!("print({i})\n")))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, b)| (p.as_str(), b.as_str()))
        .collect();
    let tree = Tree::new(&refs);
    let since = unix_now() - 1.0;
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--jobs", "4", "--format", "json", "p"])
        .env("RUST_LOG", "mcp_code_executor::backend::engine=debug")
        .current_dir(&tree.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = Running::spawn(&mut cmd);
    let pid = child.pid();
    let out = child.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 12, "{lines:?}");
    assert_nothing_left_by(pid);
    let created = containers_created_by(pid, since, unix_now() + 1.0);
    assert_eq!(created, 12, "one sandbox per file, none made for nothing");
    let warm = stderr.matches("pooled=true").count();
    let cold = stderr.matches("pooled=false").count();
    assert_eq!(
        (warm, cold),
        (12, 0),
        "every file took a sandbox made ahead: {stderr}"
    );
}

#[test]
fn usage_errors_for_what_names_no_python_file() {
    let tree = Tree::new(&[("empty/notes.txt", "x"), ("one.py", "print(1)\n")]);
    let (out, _) = run_in(&tree.0, &["run", "empty"], false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no *.py file under empty"));
    let (out, _) = run_in(&tree.0, &["run", "one.py", "tests/*.py"], false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no file matches `tests/*.py`"));
    let (out, _) = run_in(&tree.0, &["run", "--jobs", "0", "one.py"], false);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
