//! The execution engine against the real Docker daemon: every case runs real containers and
//! checks afterwards that none of them is left.

mod common;

use std::time::{Duration, Instant};

use common::{assert_clean, containers_of, docker_disk_free, limits, run, sandbox};
use mcp_code_executor::job::{InputFile, JobSpec, Limits, RunEvent, StreamKind};
use mcp_code_executor::sandbox::docker::{DockerConfig, DockerSandbox};
use mcp_code_executor::sandbox::{Sandbox, SandboxError};

#[tokio::test]
async fn hello_world_with_usage_figures() {
    let s = sandbox().await;
    let o = run(&s, "t-hello", "print('hello')", limits()).await;
    assert_eq!(o.stdout_text(), "hello\n");
    assert_eq!(o.exit_code, Some(0));
    assert!(o.success(), "{o:?}");
    assert!(o.cpu_ms.is_some(), "cpu_ms measured");
    assert!(o.peak_memory_bytes.unwrap_or(0) > 1 << 20, "{o:?}");
    assert_clean(&s, "t-hello").await;
}

#[tokio::test]
async fn stdout_and_stderr_are_kept_apart_and_exit_codes_pass_through() {
    let s = sandbox().await;
    let code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)\n";
    let o = run(&s, "t-streams", code, limits()).await;
    assert_eq!(o.stdout_text(), "out\n");
    assert_eq!(o.stderr_text(), "err\n");
    assert_eq!(o.exit_code, Some(3));
    assert!(!o.success());

    let o = run(&s, "t-streams", "raise ValueError('boom')", limits()).await;
    assert_eq!(o.exit_code, Some(1));
    assert!(o.stderr_text().contains("Traceback"), "{}", o.stderr_text());
    assert!(o.stderr_text().contains("ValueError: boom"));
    assert_clean(&s, "t-streams").await;
}

#[tokio::test]
async fn sleep_and_busy_loop_stop_at_the_deadline() {
    let s = sandbox().await;
    let short = Limits {
        timeout: Duration::from_secs(2),
        ..limits()
    };
    for code in [
        "import time\nprint('start', flush=True)\ntime.sleep(1000)",
        "while True: pass",
    ] {
        let t = Instant::now();
        let o = run(&s, "t-deadline", code, short.clone()).await;
        assert!(o.timed_out, "{code}: {o:?}");
        assert_eq!(o.signal, Some(9));
        assert!(!o.success());
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "took {:?}",
            t.elapsed()
        );
    }
    assert_clean(&s, "t-deadline").await;
}

#[tokio::test]
async fn memory_bomb_is_reported_as_oom_killed() {
    let s = sandbox().await;
    let l = Limits {
        memory_bytes: 64 << 20,
        ..limits()
    };
    let code = "chunks = []\nwhile True:\n    chunks.append('x' * (8 << 20))\n";
    let o = run(&s, "t-oom", code, l).await;
    assert!(o.oom_killed, "{o:?}");
    assert!(!o.success());
    assert!(o.status_line().contains("out of memory"));
    assert_clean(&s, "t-oom").await;
}

#[tokio::test]
async fn fork_bomb_is_contained_by_the_pids_limit() {
    let s = sandbox().await;
    let l = Limits {
        pids: 32,
        timeout: Duration::from_secs(20),
        ..limits()
    };
    let code = r#"
import os, time
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
"#;
    let o = run(&s, "t-fork", code, l).await;
    let text = o.stdout_text();
    let n: i64 = text
        .split_whitespace()
        .next()
        .unwrap_or("-1")
        .parse()
        .unwrap();
    assert!((1..32).contains(&n), "forked {n}: {o:?}");
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    assert_clean(&s, "t-fork").await;
}

#[tokio::test]
async fn output_flood_is_cut_at_the_cap_without_touching_host_disk() {
    let s = sandbox().await;
    let l = Limits {
        output_bytes: 1 << 20,
        timeout: Duration::from_secs(60),
        ..limits()
    };
    let before = docker_disk_free();
    // 2 GiB on stdout, and some on stderr.
    let code = "import sys\nb = b'x' * (1 << 20)\nfor _ in range(2048):\n    sys.stdout.buffer.write(b)\nsys.stderr.write('e' * 3000000)\n";
    let mut job = JobSpec::python(code, l);
    job.tenant = "t-flood".into();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = tokio::spawn(async move {
        let mut forwarded = 0usize;
        let mut log_config = String::new();
        while let Some(ev) = rx.recv().await {
            match ev {
                RunEvent::Created { container } => {
                    let out = std::process::Command::new("docker")
                        .args([
                            "inspect",
                            "-f",
                            "{{.HostConfig.LogConfig.Type}}|{{.LogPath}}",
                            &container,
                        ])
                        .output()
                        .unwrap();
                    log_config = String::from_utf8_lossy(&out.stdout).trim().to_string();
                }
                RunEvent::Output {
                    stream: StreamKind::Stdout,
                    data,
                } => forwarded += data.len(),
                _ => {}
            }
        }
        (forwarded, log_config)
    });
    let o = s.run(job, Some(tx)).await.expect("runs");
    let (forwarded, log_config) = watcher.await.unwrap();
    let after = docker_disk_free();
    assert_eq!(o.exit_code, Some(0), "{}", o.status_line());
    assert!(o.stdout_truncated && o.stderr_truncated, "{o:?}");
    assert_eq!(o.stdout.len(), 1 << 20);
    assert_eq!(o.stderr.len(), 1 << 20);
    assert!(forwarded <= 1 << 20, "only the capped part is forwarded");
    assert_eq!(log_config, "none|", "no log file on the host");
    let shrunk = before.saturating_sub(after);
    assert!(shrunk < 200 << 20, "host disk shrank by {shrunk} bytes");
    assert_clean(&s, "t-flood").await;
}

#[tokio::test]
async fn filling_the_workspace_stops_at_its_size() {
    let s = sandbox().await;
    let l = Limits {
        workspace_bytes: 8 << 20,
        ..limits()
    };
    let before = docker_disk_free();
    let code = "f = open('/workspace/fill', 'wb')\nwhile True:\n    f.write(b'x' * 65536)\n    f.flush()\n";
    let o = run(&s, "t-fill", code, l).await;
    assert_eq!(o.exit_code, Some(1), "{o:?}");
    assert!(
        o.stderr_text().contains("No space left on device"),
        "{}",
        o.stderr_text()
    );
    assert!(before.saturating_sub(docker_disk_free()) < 100 << 20);
    assert_clean(&s, "t-fill").await;
}

#[tokio::test]
async fn network_is_unreachable_even_to_the_hosts_loopback() {
    let s = sandbox().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        r#"
import socket
ifaces = sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])
print(ifaces)
try:
    socket.create_connection(('127.0.0.1', {port}), timeout=3)
    print('connected')
except OSError as e:
    print('refused', type(e).__name__)
"#
    );
    let o = run(&s, "t-net", &code, limits()).await;
    let out = o.stdout_text();
    assert!(out.contains("['lo']"), "{out}");
    assert!(out.contains("refused ConnectionRefusedError"), "{out}");
    assert!(listener.accept().is_err(), "nothing reached the host");
    assert_clean(&s, "t-net").await;
}

#[tokio::test]
async fn only_the_workspace_and_tmp_are_writable_and_the_user_is_unprivileged() {
    let s = sandbox().await;
    let code = r#"
import os
for p in ['/etc/x', '/usr/lib/x', '/opt/mcp-code-executor/x', '/root/x', '/x']:
    try:
        open(p, 'w'); print('WROTE', p)
    except OSError as e:
        print('refused', p, e.errno)
for p in ['/workspace/ok', '/tmp/ok']:
    open(p, 'w').write('fine'); print('wrote', p)
print('uid', os.getuid())
print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])
"#;
    let o = run(&s, "t-rofs", code, limits()).await;
    let out = o.stdout_text();
    assert!(!out.contains("WROTE"), "{out}");
    assert_eq!(out.matches("refused").count(), 5, "{out}");
    assert!(out.contains("wrote /workspace/ok") && out.contains("wrote /tmp/ok"));
    assert!(out.contains("uid 65534"), "{out}");
    assert!(out.contains("0000000000000000"), "no capabilities: {out}");
    assert_clean(&s, "t-rofs").await;
}

#[tokio::test]
async fn a_one_mebibyte_source_and_several_input_files() {
    let s = sandbox().await;
    let mut code = String::from("x = 0\n");
    while code.len() < (1 << 20) {
        code.push_str("x += 1  # padding padding padding padding padding padding\n");
    }
    code.push_str("print(x)\n");
    let lines = code.lines().count() - 2;
    let o = run(&s, "t-big", &code, limits()).await;
    assert_eq!(o.stdout_text().trim(), lines.to_string(), "{o:?}");

    let mut job = JobSpec::python(
        "from pkg.helper import twice\nprint(twice(21), open('data.txt').read())",
        limits(),
    );
    job.tenant = "t-big".into();
    job.files.push(InputFile {
        path: "pkg/helper.py".into(),
        contents: b"def twice(x):\n    return 2 * x\n".to_vec(),
    });
    job.files.push(InputFile {
        path: "data.txt".into(),
        contents: b"from a file".to_vec(),
    });
    let o = s.run(job, None).await.unwrap();
    assert_eq!(o.stdout_text(), "42 from a file\n", "{o:?}");
    assert_clean(&s, "t-big").await;
}

#[tokio::test]
async fn unicode_and_invalid_utf8_come_back_byte_for_byte() {
    let s = sandbox().await;
    let code = "import sys\nprint('héllo ✓ 日本')\nsys.stdout.flush()\nsys.stdout.buffer.write(b'\\xff\\xfe\\n')\n";
    let o = run(&s, "t-utf8", code, limits()).await;
    let mut expected = "héllo ✓ 日本\n".as_bytes().to_vec();
    expected.extend_from_slice(b"\xff\xfe\n");
    assert_eq!(o.stdout, expected);
    assert_eq!(o.stdout_text(), "héllo ✓ 日本\n\u{fffd}\u{fffd}\n");
    assert_clean(&s, "t-utf8").await;
}

#[tokio::test]
async fn eight_runs_at_once() {
    let s = sandbox().await;
    let runs = (0..8).map(|i| {
        let s = s.clone();
        async move { run(&s, "t-eight", &format!("print({i} * {i})"), limits()).await }
    });
    let outcomes = futures::future::join_all(runs).await;
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(o.stdout_text().trim(), (i * i).to_string(), "{o:?}");
    }
    assert_clean(&s, "t-eight").await;
}

#[tokio::test]
async fn a_cancelled_run_leaves_no_container() {
    let s = sandbox().await;
    let mut job = JobSpec::python(
        "import time\nprint('up', flush=True)\ntime.sleep(600)",
        limits(),
    );
    job.tenant = "t-cancel".into();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let s2 = s.clone();
    let handle = tokio::spawn(async move { s2.run(job, Some(tx)).await });
    // Wait until the code is really running, then drop the run.
    while let Some(ev) = rx.recv().await {
        if matches!(ev, RunEvent::Output { .. }) {
            break;
        }
    }
    assert_eq!(containers_of("t-cancel").len(), 1);
    handle.abort();
    let _ = handle.await;
    assert_clean(&s, "t-cancel").await;
}

#[tokio::test]
async fn a_missing_image_is_an_infrastructure_error_with_a_hint() {
    let s = DockerSandbox::connect(DockerConfig::new(
        "mcp-code-executor/sandbox:does-not-exist",
    ))
    .await
    .expect("docker is running");
    let err = s
        .run(JobSpec::python("print(1)", limits()), None)
        .await
        .unwrap_err();
    assert!(matches!(err, SandboxError::ImageMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("image build"), "{err}");
}

#[tokio::test]
async fn bad_paths_are_refused_before_any_container_exists() {
    let s = sandbox().await;
    let mut job = JobSpec::python("print(1)", limits());
    job.tenant = "t-paths".into();
    job.files.push(InputFile {
        path: "../escape.py".into(),
        contents: vec![],
    });
    let err = s.run(job, None).await.unwrap_err();
    assert!(matches!(err, SandboxError::Rejected(_)), "{err:?}");
    assert!(containers_of("t-paths").is_empty());
}

#[tokio::test]
async fn input_larger_than_the_workspace_is_refused_with_a_reason() {
    let s = sandbox().await;
    let l = Limits {
        workspace_bytes: 1 << 20,
        ..limits()
    };
    let mut job = JobSpec::python("print(1)", l);
    job.tenant = "t-toobig".into();
    job.files.push(InputFile {
        path: "big.bin".into(),
        contents: vec![0u8; 2 << 20],
    });
    let err = s.run(job, None).await.unwrap_err();
    assert!(err.to_string().contains("workspace"), "{err}");
    assert_clean(&s, "t-toobig").await;
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(data: &[u8]) -> (u32, u32) {
    assert_eq!(&data[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let w = u32::from_be_bytes(data[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(data[20..24].try_into().unwrap());
    (w, h)
}

#[tokio::test]
async fn matplotlib_figures_come_back_as_pngs() {
    let s = sandbox().await;
    let code = r#"
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
plt.show()
fig = plt.figure(figsize=(3, 2), dpi=100)
plt.bar(['a', 'b'], [1, 2])
print('left one open')
"#;
    let o = run(&s, "t-figs", code, limits()).await;
    assert!(o.success(), "{}", o.stderr_text());
    let names: Vec<&str> = o.artifacts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names.len(), 2, "{names:?} {}", o.stderr_text());
    assert_eq!(o.artifacts[0].name, "figure-001.png");
    assert_eq!(o.artifacts[0].mime(), "image/png");
    assert_eq!(png_size(&o.artifacts[0].data), (640, 480));
    assert_eq!(png_size(&o.artifacts[1].data), (300, 200));
    // A huge figure is scaled down, and says so in its name.
    let o = run(
        &s,
        "t-figs",
        "import matplotlib.pyplot as plt\nplt.figure(figsize=(40, 40), dpi=100)\nplt.plot([1])\nplt.show()",
        limits(),
    )
    .await;
    assert_eq!(o.artifacts.len(), 1, "{}", o.stderr_text());
    assert!(o.artifacts[0].name.ends_with("-downscaled.png"));
    let (w, h) = png_size(&o.artifacts[0].data);
    assert!(w * h <= 4_100_000, "{w}x{h}");
    assert_clean(&s, "t-figs").await;
}

#[tokio::test]
async fn files_the_code_writes_in_the_workspace_come_back_when_asked() {
    let s = sandbox().await;
    let mut job = JobSpec::python(
        "import os\nopen('out.csv', 'w').write('a,b\\n1,2\\n')\nos.makedirs('sub', exist_ok=True)\nopen('sub/x.bin', 'wb').write(bytes(range(256)))\nopen('/tmp/not-returned', 'w').write('tmp')\nos.symlink('/etc/passwd', 'link')\nprint(open('given.txt').read())\n",
        limits(),
    );
    job.tenant = "t-files".into();
    job.return_files = true;
    job.files.push(InputFile {
        path: "given.txt".into(),
        contents: b"unchanged input".to_vec(),
    });
    let o = s.run(job, None).await.unwrap();
    assert!(o.success(), "{}", o.stderr_text());
    let paths: Vec<&str> = o.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        ["out.csv", "sub/x.bin"],
        "only new or changed regular files"
    );
    assert_eq!(o.files[0].data, b"a,b\n1,2\n");
    assert_eq!(o.files[1].data, (0..=255u8).collect::<Vec<u8>>());

    // Without asking, nothing comes back.
    let o = run(&s, "t-files", "open('out.csv', 'w').write('x')", limits()).await;
    assert!(o.files.is_empty());
    assert_clean(&s, "t-files").await;
}

#[tokio::test]
async fn the_code_cannot_signal_or_read_the_runner() {
    let s = sandbox().await;
    let code = r#"
import os, signal
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL, signal.SIGPIPE):
    try:
        os.kill(1, sig)
    except OSError as e:
        print('kill refused', e.errno)
for p in ('/proc/1/fd/1', '/proc/1/mem', '/proc/1/environ'):
    try:
        open(p, 'rb').read(1)
        print('READ', p)
    except OSError as e:
        print('refused', p)
print('still here')
"#;
    let o = run(&s, "t-pid1", code, limits()).await;
    let out = o.stdout_text();
    assert!(o.success(), "the runner survived and reported: {o:?}");
    assert!(out.contains("still here"), "{out}");
    assert!(!out.contains("READ"), "{out}");
    assert_eq!(out.matches("refused /proc/1").count(), 3, "{out}");
    assert_clean(&s, "t-pid1").await;
}
