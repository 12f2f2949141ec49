//! The execution engine against the real Docker daemon: every case runs real containers and
//! checks afterwards that none of them is left.

use crate::{common, contract};

contract::contract_tests!(contract_on_docker, async {
    contract::alone(common::sandbox().await)
});
contract::contract_tests!(contract_on_the_fake, async {
    contract::alone(mcp_code_executor::backend::fake::FakeBackend::new())
});

use std::time::{Duration, Instant};

use std::process::Command;

use common::{
    assert_clean, docker_disk_free, limits, own_containers_of, owner_id, owner_of,
    remove_containers, remove_on_drop, run, sandbox,
};
use mcp_code_executor::backend::docker::{
    DockerBackend, DockerConfig, LABEL_JOB, LABEL_MANAGED, LABEL_OWNER, LABEL_TENANT,
};
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::{Backend, BackendError};
use mcp_code_executor::job::{
    new_job_id, InputFile, JobSpec, Limits, RunEnv, RunEvent, Source, StreamKind,
};

#[tokio::test]
async fn hello_world_with_usage_figures() {
    let _clean = remove_on_drop("t-hello");
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
    let _clean = remove_on_drop("t-streams");
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

/// The runner leaves the code's interpreter without tearing down every module (fast with
/// pandas loaded), yet as `python FILE` would: threads joined, atexit handlers run, files
/// left open flushed, `__del__` run, `sys.exit` codes and messages as Python gives them.
#[tokio::test]
async fn the_interpreter_leaves_as_python_does() {
    let _clean = remove_on_drop("t-leave");
    let s = sandbox().await;
    let mut job = JobSpec::python(
        "import atexit, sys, threading, time\n\
         f = open('left-open.txt', 'w')\n\
         f.write('flushed at exit')\n\
         class D:\n    def __del__(self):\n        print('del ran')\n\
         d = D()\n\
         atexit.register(lambda: print('atexit ran'))\n\
         threading.Thread(target=lambda: (time.sleep(0.3), print('thread joined'))).start()\n\
         sys.exit('bye')\n",
        limits(),
    );
    job.tenant = "t-leave".into();
    job.return_files = true;
    let o = s.run(job, None).await.unwrap();
    let out = o.stdout_text();
    assert_eq!(o.exit_code, Some(1), "sys.exit(str) exits 1: {o:?}");
    assert_eq!(o.stderr_text(), "bye\n");
    for line in ["thread joined", "atexit ran", "del ran"] {
        assert!(out.contains(line), "{line}: {out}");
    }
    assert!(
        out.find("thread joined") < out.find("atexit ran"),
        "threads are joined before atexit: {out}"
    );
    let left = o.files.iter().find(|f| f.path == "left-open.txt");
    assert_eq!(
        left.map(|f| f.data.as_slice()),
        Some(&b"flushed at exit"[..])
    );

    let o = run(&s, "t-leave", "import sys\nsys.exit(None)", limits()).await;
    assert_eq!(o.exit_code, Some(0), "{o:?}");
    let o = run(&s, "t-leave", "import sys\nsys.exit(300)", limits()).await;
    assert_eq!(o.exit_code, Some(300 & 0xFF), "{o:?}");
    assert_clean(&s, "t-leave").await;
}

#[tokio::test]
async fn sleep_and_busy_loop_stop_at_the_deadline() {
    let _clean = remove_on_drop("t-deadline");
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
    let _clean = remove_on_drop("t-oom");
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
    let _clean = remove_on_drop("t-fork");
    let s = sandbox().await;
    let l = Limits {
        pids: 32,
        timeout: Duration::from_secs(20),
        ..limits()
    };
    let code = common::FORK_BOMB;
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
    let _clean = remove_on_drop("t-flood");
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
    let _clean = remove_on_drop("t-fill");
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
    let _clean = remove_on_drop("t-net");
    let s = sandbox().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // Refused or unreachable at once: a timeout would only say that nothing answered yet.
    let code = format!(
        r#"
import errno, socket
ifaces = sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:])
print(ifaces)
print('localhost is', socket.gethostbyname('localhost'))
for host, port in [('127.0.0.1', {port}), ('169.254.169.254', 80), ('1.1.1.1', 53)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        print(host, 'connected')
    except socket.timeout:
        print(host, 'timed out')
    except OSError as e:
        print(host, errno.errorcode.get(e.errno, e.errno))
"#
    );
    let o = run(&s, "t-net", &code, limits()).await;
    let out = o.stdout_text();
    assert!(out.contains("['lo']"), "{out}");
    // No network, and no network set-up by Docker: `localhost` still resolves (the
    // sandbox's own `/etc/hosts`, see `DockerConfig::hosts_file`).
    assert!(out.contains("localhost is 127.0.0.1"), "{out}");
    assert!(out.contains("127.0.0.1 ECONNREFUSED"), "{out}");
    // gVisor's network stack says EHOSTUNREACH where Linux says ENETUNREACH (no route).
    let unreach = if common::gvisor() {
        "EHOSTUNREACH"
    } else {
        "ENETUNREACH"
    };
    assert!(out.contains(&format!("169.254.169.254 {unreach}")), "{out}");
    assert!(out.contains(&format!("1.1.1.1 {unreach}")), "{out}");
    assert!(listener.accept().is_err(), "nothing reached the host");
    assert_clean(&s, "t-net").await;
}

#[tokio::test]
async fn the_root_is_read_only_even_where_anyone_may_write() {
    let _clean = remove_on_drop("t-rofs");
    let s = sandbox().await;
    // /var/tmp is mode 1777 on the image's root filesystem (no tmpfs over it): only a
    // read-only root refuses a write there. Everywhere the refusal must be EROFS: a
    // writable root gives a non-root uid EACCES in root-owned directories too.
    let code = r#"
import errno, os
st = os.stat('/var/tmp')
print('var-tmp', oct(st.st_mode & 0o7777), 'root-fs' if st.st_dev == os.stat('/').st_dev else 'other-fs')
for p in ['/var/tmp/x', '/etc/x', '/usr/lib/x', '/opt/mcp-code-executor/x', '/root/x', '/x']:
    try:
        open(p, 'w'); print('WROTE', p)
    except OSError as e:
        print('refused', p, errno.errorcode.get(e.errno, e.errno))
for p in ['/workspace/ok', '/tmp/ok']:
    open(p, 'w').write('fine'); print('wrote', p)
print('uid', os.getuid(), 'gid', os.getgid())
"#;
    let o = run(&s, "t-rofs", code, limits()).await;
    let out = o.stdout_text();
    assert!(out.contains("var-tmp 0o1777 root-fs"), "{out}");
    assert!(!out.contains("WROTE"), "{out}");
    if common::gvisor() {
        // gVisor checks permissions before the read-only mount: EACCES in the root-owned
        // directories; the world-writable one is refused with EROFS all the same.
        assert!(out.contains("refused /var/tmp/x EROFS\n"), "{out}");
        assert_eq!(
            out.matches(" EROFS\n").count() + out.matches(" EACCES\n").count(),
            6,
            "{out}"
        );
    } else {
        assert_eq!(out.matches(" EROFS\n").count(), 6, "{out}");
    }
    assert!(out.contains("wrote /workspace/ok") && out.contains("wrote /tmp/ok"));
    assert!(out.contains("uid 65534 gid 65534"), "{out}");
    assert_clean(&s, "t-rofs").await;
}

#[tokio::test]
async fn no_capabilities_no_new_privileges_and_seccomp() {
    let _clean = remove_on_drop("t-caps");
    let s = sandbox().await;
    let code = r#"
import ctypes, os
for line in open('/proc/self/status'):
    k, _, v = line.partition(':')
    if k.startswith('Cap') or k in ('NoNewPrivs', 'Seccomp'):
        print(k, v.strip())
libc = ctypes.CDLL(None, use_errno=True)
print('prctl-nnp', libc.prctl(39, 0, 0, 0, 0))
print('uname', os.uname().release)
"#;
    let o = run(&s, "t-caps", code, limits()).await;
    let out = o.stdout_text();
    // CapEff is 0 for any non-root uid; the bounding set is empty only with cap_drop ALL.
    // gVisor shows no CapAmb line.
    for cap in ["CapBnd", "CapEff", "CapPrm", "CapAmb", "CapInh"] {
        if cap == "CapAmb" && common::gvisor() {
            assert!(!out.contains("CapAmb "), "{out}");
            continue;
        }
        assert!(
            out.contains(&format!("{cap} 0000000000000000\n")),
            "{cap}: {out}"
        );
    }
    assert!(out.contains("prctl-nnp 1\n"), "{out}");
    if common::gvisor() {
        // No NoNewPrivs line in gVisor (prctl says it), and Docker's seccomp profile is not
        // loaded inside: the code's system calls go to gVisor's kernel instead.
        assert!(out.contains("uname 4.4.0\n"), "{out}");
        assert!(out.contains("Seccomp 0\n"), "{out}");
    } else {
        assert!(out.contains("NoNewPrivs 1\n"), "{out}");
        assert!(out.contains("Seccomp 2\n"), "{out}");
    }
    assert_clean(&s, "t-caps").await;
}

/// A file of the host's cgroup (v1, cgroupfs driver) of the running container `id`.
fn host_cgroup(controller: &str, id: &str, file: &str) -> String {
    let out = Command::new("docker")
        .args(["inspect", "-f", "{{.Id}}", id])
        .output()
        .unwrap();
    let full = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let path = format!("/sys/fs/cgroup/{controller}/docker/{full}/{file}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// Under gVisor the sandbox has no cgroup files inside: the host cgroup around the whole
/// sandbox (gVisor's kernel and the code) carries the limits, read here from the host
/// while the code runs; the code sees the memory limit as gVisor's MemTotal and its
/// process limit as RLIMIT_NPROC.
async fn limits_under_gvisor(s: &DockerBackend, l: Limits) {
    let code = r#"
import resource, time
print('nofile', *resource.getrlimit(resource.RLIMIT_NOFILE))
print('nproc', *resource.getrlimit(resource.RLIMIT_NPROC))
print('memtotal', [int(l.split()[1]) * 1024 for l in open('/proc/meminfo') if l.startswith('MemTotal')][0])
time.sleep(4)
"#;
    let mut job = JobSpec::python(code, l.clone());
    job.tenant = "t-limits".into();
    let running = s.run(job, None);
    let read = async {
        let id = loop {
            if let Some(id) = own_containers_of("t-limits").pop() {
                break id;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::time::sleep(Duration::from_millis(1500)).await;
        [
            host_cgroup("cpu", &id, "cpu.cfs_quota_us"),
            host_cgroup("cpu", &id, "cpu.cfs_period_us"),
            host_cgroup("memory", &id, "memory.limit_in_bytes"),
            host_cgroup("memory", &id, "memory.memsw.limit_in_bytes"),
        ]
    };
    let (o, [quota, period, memory, memsw]) = tokio::join!(running, read);
    let o = o.expect("run");
    let out = o.stdout_text();
    assert!(out.contains("nofile 200 200\n"), "{out}");
    assert!(out.contains(&format!("nproc {0} {0}\n", l.pids)), "{out}");
    let limit = l.memory_bytes.to_string();
    assert!(out.contains(&format!("memtotal {limit}\n")), "{out}");
    let cores = quota.parse::<f64>().unwrap() / period.parse::<f64>().unwrap();
    assert!((cores - l.cpus).abs() < 0.01, "{quota}/{period}");
    assert_eq!(memory, limit);
    assert_eq!(memsw, limit, "no swap on top of the memory");
}

/// The thread pools of numerical libraries are sized to the CPU limit, not to the host's
/// cores (OpenBLAS starts one thread per core when numpy is imported): under `cpus` 1 the
/// interpreter stays one thread; the runner's own variable is gone before the code runs.
#[tokio::test]
async fn numerical_thread_pools_are_sized_to_the_cpu_limit() {
    let _clean = remove_on_drop("t-threads");
    let s = sandbox().await;
    let code = "import os, numpy\n\
print(os.environ.get('OPENBLAS_NUM_THREADS'), os.environ.get('OMP_NUM_THREADS'), \
os.environ.get('MKL_NUM_THREADS'), 'MCPX_CPUS' in os.environ, len(os.listdir('/proc/self/task')))\n";
    for (cpus, want) in [(1.0, "1 1 1 False 1"), (1.5, "2 2 2 False ")] {
        let l = Limits { cpus, ..limits() };
        let o = run(&s, "t-threads", code, l).await;
        let out = o.stdout_text();
        assert!(o.success() && out.starts_with(want), "cpus {cpus}: {o:?}");
    }
    assert_clean(&s, "t-threads").await;
}

#[tokio::test]
async fn nofile_cpu_and_swap_limits_are_the_configured_ones() {
    let _clean = remove_on_drop("t-limits");
    let s = sandbox().await;
    // Values no host has by default, so that a limit not applied cannot pass.
    let l = Limits {
        nofile: 200,
        cpus: 0.5,
        memory_bytes: 96 << 20,
        ..limits()
    };
    if common::gvisor() {
        limits_under_gvisor(&s, l).await;
        assert_clean(&s, "t-limits").await;
        return;
    }
    let code = r#"
import resource
def read(p):
    try:
        return open(p).read().strip()
    except OSError:
        return None
print('nofile', *resource.getrlimit(resource.RLIMIT_NOFILE))
v2 = read('/sys/fs/cgroup/cpu.max')
if v2 is not None:
    q, p = v2.split()
    print('cpu', q, p)
    print('memory', read('/sys/fs/cgroup/memory.max'))
    print('swap-v2', read('/sys/fs/cgroup/memory.swap.max'))
else:
    for d in ('/sys/fs/cgroup/cpu', '/sys/fs/cgroup/cpu,cpuacct'):
        q = read(d + '/cpu.cfs_quota_us')
        if q is not None:
            print('cpu', q, read(d + '/cpu.cfs_period_us'))
            break
    print('memory', read('/sys/fs/cgroup/memory/memory.limit_in_bytes'))
    print('swap-v1', read('/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes'))
print('host-swap', [l.split()[1] for l in open('/proc/meminfo') if l.startswith('SwapTotal')][0])
"#;
    let o = run(&s, "t-limits", code, l).await;
    let out = o.stdout_text();
    let field = |k: &str| -> Vec<String> {
        out.lines()
            .find_map(|line| line.strip_prefix(&format!("{k} ")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(field("nofile"), ["200", "200"], "{out}");
    let cpu = field("cpu");
    let (quota, period): (f64, f64) = (cpu[0].parse().unwrap_or(-1.0), cpu[1].parse().unwrap());
    assert!((quota / period - 0.5).abs() < 0.01, "cpu quota: {out}");
    let memory = (96u64 << 20).to_string();
    assert_eq!(field("memory"), [memory.as_str()], "{out}");
    // No swap on top of the memory: memsw equal to it (v1), swap.max 0 (v2). Where the
    // kernel has no swap accounting neither is readable; then only a host without swap
    // passes (the OOM test covers the memory itself).
    match (
        out.lines().find_map(|l| l.strip_prefix("swap-v1 ")),
        out.lines().find_map(|l| l.strip_prefix("swap-v2 ")),
    ) {
        (Some(v1), _) if v1 != "None" => assert_eq!(v1, memory, "memsw: {out}"),
        (_, Some(v2)) if v2 != "None" => assert_eq!(v2, "0", "swap.max: {out}"),
        _ => assert_eq!(field("host-swap"), ["0"], "swap not limited: {out}"),
    }
    assert_clean(&s, "t-limits").await;
}

#[tokio::test]
async fn a_one_mebibyte_source_and_several_input_files() {
    let _clean = remove_on_drop("t-big");
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
    let _clean = remove_on_drop("t-utf8");
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
    let _clean = remove_on_drop("t-eight");
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
    let _clean = remove_on_drop("t-cancel");
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
    assert_eq!(own_containers_of("t-cancel").len(), 1);
    handle.abort();
    let _ = handle.await;
    assert_clean(&s, "t-cancel").await;
}

#[tokio::test]
async fn a_missing_image_is_an_infrastructure_error_with_a_hint() {
    let s = DockerBackend::connect(DockerConfig::new(
        "mcp-code-executor/sandbox:does-not-exist",
    ))
    .await
    .expect("docker is running");
    let err = s
        .run(JobSpec::python("print(1)", limits()), None)
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::ImageMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("image build"), "{err}");
}

#[tokio::test]
async fn bad_paths_are_refused_before_any_container_exists() {
    let _clean = remove_on_drop("t-paths");
    let s = sandbox().await;
    let mut job = JobSpec::python("print(1)", limits());
    job.tenant = "t-paths".into();
    job.files.push(InputFile {
        path: "../escape.py".into(),
        contents: vec![],
    });
    let err = s.run(job, None).await.unwrap_err();
    assert!(matches!(err, BackendError::Rejected(_)), "{err:?}");
    assert!(own_containers_of("t-paths").is_empty());
}

#[tokio::test]
async fn input_larger_than_the_workspace_is_refused_with_a_reason() {
    let _clean = remove_on_drop("t-toobig");
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
    let _clean = remove_on_drop("t-figs");
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

/// A figure is written from the canvas's own pixels when `savefig` would only draw them
/// again (issue 43: `savefig` drew every figure twice and encoded it slowly); the pixels
/// are `savefig`'s own, drawn or not before, and other savefig settings still go through
/// `savefig`.
#[tokio::test]
async fn figures_from_the_canvas_have_savefigs_pixels() {
    let _clean = remove_on_drop("t-figs-fast");
    let s = sandbox().await;
    let code = r#"
import io, os, random, sys
import matplotlib, matplotlib.pyplot as plt
import mcp_backend
from PIL import Image
def pixels(data):
    return Image.open(io.BytesIO(data)).convert('RGBA').tobytes()
data = [random.gauss(0, 1) for _ in range(500)]
for drawn in (True, False):
    fig = plt.figure(figsize=(4, 3))
    plt.hist(data, bins=20)
    if drawn:
        fig.canvas.draw()
    fast = mcp_backend.fast_png(fig, fig.dpi)
    ref = io.BytesIO()
    fig.savefig(ref, format='png')
    print(drawn, fast is not None and pixels(fast) == pixels(ref.getvalue()))
    plt.close(fig)
# Rows filtered (numpy there) or not (numpy hidden): the same pixels.
fig = plt.figure(figsize=(3, 2))
plt.plot([1, 3])
fig.canvas.draw()
w, h = fig.canvas.get_width_height(physical=True)
raw = bytes(fig.canvas.buffer_rgba())
filtered = mcp_backend.png_of_rgba(raw, w, h)
numpy = sys.modules['numpy']
sys.modules['numpy'] = None
plain = mcp_backend.png_of_rgba(raw, w, h)
sys.modules['numpy'] = numpy
print('rows', pixels(filtered) == raw == pixels(plain), filtered != plain)
plt.close(fig)
matplotlib.rcParams['savefig.transparent'] = True
fig = plt.figure(figsize=(2, 2))
plt.plot([1, 2])
print('transparent', mcp_backend.fast_png(fig, fig.dpi))
plt.show()
"#;
    let o = run(&s, "t-figs-fast", code, limits()).await;
    assert_eq!(
        o.stdout_text(),
        "True True\nFalse True\nrows True True\ntransparent None\n",
        "{}",
        o.stderr_text()
    );
    assert_eq!(o.artifacts.len(), 1, "{}", o.stderr_text());
    assert_eq!(png_size(&o.artifacts[0].data), (200, 200));
    assert_clean(&s, "t-figs-fast").await;
}

#[tokio::test]
async fn files_the_code_writes_in_the_workspace_come_back_when_asked() {
    let _clean = remove_on_drop("t-files");
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

/// gVisor (2022-12-19) does not shield a PID namespace's init from SIGKILL and SIGTERM
/// sent from inside it, as Linux does: code of the runner's uid can kill the runner. The
/// sandbox is lost (its own; nothing else is reachable), and that is reported as the
/// runner failing, never as the code's outcome; the runner's memory and descriptors stay
/// unreadable. (`/proc/1/environ` is readable there: gVisor ignores the runner's
/// non-dumpable flag for it; it holds the container's environment, the variables the job's
/// environment declares.)
async fn gvisor_code_can_kill_its_own_runner(s: &DockerBackend, code: &str) {
    let mut job = JobSpec::python(code, limits());
    job.tenant = "t-pid1".into();
    match s.run(job, None).await {
        Err(BackendError::Runner(m)) => {
            assert!(m.contains("stopped before its runner reported"), "{m}")
        }
        other => panic!("the runner survived SIGKILL under gVisor: {other:?}"),
    }
    let reads = r#"
for p in ('/proc/1/fd/1', '/proc/1/mem', '/proc/1/environ'):
    try:
        open(p, 'rb').read(1)
        print('READ', p)
    except OSError as e:
        print('refused', p)
"#;
    let o = run(s, "t-pid1", reads, limits()).await;
    let out = o.stdout_text();
    assert!(out.contains("refused /proc/1/fd/1\n"), "{out}");
    assert!(out.contains("refused /proc/1/mem\n"), "{out}");
    assert_clean(s, "t-pid1").await;
}

#[tokio::test]
async fn the_code_cannot_signal_or_read_the_runner() {
    let _clean = remove_on_drop("t-pid1");
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
    if common::gvisor() {
        gvisor_code_can_kill_its_own_runner(&s, code).await;
        return;
    }
    let o = run(&s, "t-pid1", code, limits()).await;
    let out = o.stdout_text();
    assert!(o.success(), "the runner survived and reported: {o:?}");
    assert!(out.contains("still here"), "{out}");
    assert!(!out.contains("READ"), "{out}");
    assert_eq!(out.matches("refused /proc/1").count(), 3, "{out}");
    assert_clean(&s, "t-pid1").await;
}

#[tokio::test]
async fn an_unreachable_daemon_is_an_infrastructure_error_that_says_what_to_do() {
    let config = DockerConfig {
        docker_host: Some("unix:///nonexistent/mcpx-test/docker.sock".into()),
        ..DockerConfig::new(image::default_image())
    };
    let err = match DockerBackend::connect(config).await {
        Err(e) => e,
        Ok(_) => panic!("connected to a daemon that does not exist"),
    };
    assert!(matches!(err, BackendError::Unreachable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("cannot reach the Docker daemon"), "{msg}");
    assert!(
        msg.contains("Start it") && msg.contains("DOCKER_HOST"),
        "says what to do: {msg}"
    );
}

/// Removes the listed containers when dropped (also when the test fails).
struct RemoveIds(Vec<String>);

impl Drop for RemoveIds {
    fn drop(&mut self) {
        remove_containers(&self.0);
    }
}

/// Make a stopped container from the sandbox image carrying the project's labels.
fn create_labelled(owner: &str, job: &str) -> String {
    let out = Command::new("docker")
        .args(["create", "--network", "none", "--read-only"])
        .arg("--label")
        .arg(format!("{LABEL_MANAGED}=true"))
        .arg("--label")
        .arg(format!("{LABEL_TENANT}=t-sweep"))
        .arg("--label")
        .arg(format!("{LABEL_JOB}={job}"))
        .arg("--label")
        .arg(format!("{LABEL_OWNER}={owner}"))
        .arg(image::default_image())
        .output()
        .expect("the docker CLI runs");
    assert!(out.status.success(), "docker create: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn exists(id: &str) -> bool {
    Command::new("docker")
        .args(["inspect", "--format", "{{.Id}}", id])
        .output()
        .unwrap()
        .status
        .success()
}

#[tokio::test]
async fn the_start_up_sweep_removes_only_what_dead_processes_left() {
    let s = sandbox().await;
    let pid = std::process::id();
    let mut made = RemoveIds(Vec::new());
    // This host, this pid, but another start time: a process that is gone (its pid reused).
    let dead = create_labelled(&owner_of(pid, "1"), "sweep-dead");
    made.0.push(dead.clone());
    // This very process: alive.
    let live = create_labelled(&owner_id(), "sweep-live");
    made.0.push(live.clone());
    // Another host: not ours to judge.
    let elsewhere = create_labelled(&format!("some-other-host/{pid}/1"), "sweep-elsewhere");
    made.0.push(elsewhere.clone());
    // (The dead owner's container is not checked here: any sweep running at the same time,
    // the start-up sweep of another test's backend among them, may remove it at once.)
    assert!(exists(&live) && exists(&elsewhere));

    s.sweep().await.expect("sweep");
    // Whichever sweep removed the dead one, it is gone, and the others are not.
    assert!(!exists(&dead), "the dead owner's container is still there");
    assert!(exists(&live), "the live owner's container was removed");
    assert!(exists(&elsewhere), "another host's container was removed");
    drop(made);
    assert!(!exists(&live) && !exists(&elsewhere));
}

/// A volume removed when the test ends, whatever happens.
struct Volume(String);

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f", &self.0])
            .output();
    }
}

/// An environment kept on a named volume (what a sandbox that does not share the server's
/// filesystem needs) reaches the sandbox at its target, read-only; a volume that does not
/// exist is refused by name, before any container, and is not created empty.
#[tokio::test]
async fn a_volume_source_is_mounted_read_only_and_a_missing_one_is_refused() {
    let _clean = remove_on_drop("t-volume");
    let s = sandbox().await;
    let vol = Volume(format!("mcpx-test-{}", new_job_id()));
    let ok = |c: &mut Command| c.output().expect("docker CLI").status.success();
    assert!(ok(Command::new("docker").args(["volume", "create", &vol.0])));
    // Fill it as root in a throwaway container of the sandbox image (no registry here).
    assert!(ok(Command::new("docker").args([
        "run",
        "--rm",
        "--network",
        "none",
        "--user",
        "0",
        "--label",
        &format!("{LABEL_MANAGED}=true"),
        "--label",
        &format!("{LABEL_OWNER}={}", owner_id()),
        "-v",
        &format!("{}:/data", vol.0),
        &image::default_image(),
        "/usr/bin/python3",
        "-c",
        // World-writable: only the read-only mount can refuse a write there (gVisor checks
        // permissions first, and would say EACCES in a root-owned directory).
        "import os; open('/data/env.txt', 'w').write('from the volume'); os.chmod('/data', 0o1777)",
    ])));

    let volume = |name: &str| Source::Volume {
        name: name.to_string(),
        subpath: None,
        target: "/opt/env".into(),
        writable: false,
    };
    let code = "import errno\nprint(open('/opt/env/env.txt').read())\ntry:\n    open('/opt/env/x', 'w')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n";
    let mut job = JobSpec::python(code, limits());
    job.tenant = "t-volume".into();
    job.env = RunEnv {
        sources: vec![volume(&vol.0)],
        ..RunEnv::default()
    };
    let o = s.run(job.clone(), None).await.expect("run");
    assert_eq!(o.stdout_text(), "from the volume\nEROFS\n", "{o:?}");

    let missing = format!("mcpx-test-missing-{}", new_job_id());
    job.env.sources = vec![volume(&missing)];
    match s.run(job, None).await {
        Err(BackendError::Rejected(m)) => assert!(m.contains(&missing), "{m}"),
        other => panic!("a missing volume was not refused: {other:?}"),
    }
    let inspected = Command::new("docker")
        .args(["volume", "inspect", &missing])
        .output()
        .expect("docker CLI");
    assert!(!inspected.status.success(), "{missing} was created");
    assert_clean(&s, "t-volume").await;
}
