//! Shared set-up for tests against the real Docker daemon. There is no skip: without a
//! daemon or without the image these tests fail, loudly, with the fix in the message.
#![allow(dead_code)]

use std::process::Command;
use std::sync::Arc;

use mcp_code_executor::backend::docker::{
    owner_label, DockerBackend, DockerConfig, LABEL_OWNER, LABEL_TENANT,
};
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::job::{JobSpec, Limits, Outcome};

/// The OCI runtime of the suite's sandboxes: `MCP_TEST_RUNTIME` (`.ci/run` runs the
/// isolation and hostile tests a second time with `runsc`, gVisor), the daemon's default
/// when unset or empty.
pub fn runtime() -> Option<String> {
    std::env::var("MCP_TEST_RUNTIME")
        .ok()
        .filter(|r| !r.trim().is_empty())
}

/// Whether this pass of the suite runs its sandboxes under gVisor.
pub fn gvisor() -> bool {
    mcp_code_executor::backend::docker::is_gvisor(runtime().as_deref())
}

/// The backend configuration of the suite: the expected image, [`runtime`].
pub fn config() -> DockerConfig {
    DockerConfig {
        runtime: runtime(),
        hosts_file: Some(hosts_file()),
        ..DockerConfig::new(image::default_image())
    }
}

/// The sandboxes' `/etc/hosts` as the product gives it (see `DockerConfig::hosts_file`),
/// written once per test process into its scratch directory.
pub fn hosts_file() -> std::path::PathBuf {
    static HOSTS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    HOSTS
        .get_or_init(|| {
            mcp_code_executor::backend::docker::write_hosts_file(&scratch_dir("hosts"))
                .expect("the sandboxes' hosts file")
        })
        .clone()
}

/// A sandbox on the real daemon with the image this binary expects.
pub async fn sandbox() -> Arc<DockerBackend> {
    let s = DockerBackend::connect(config()).await.unwrap_or_else(|e| {
        panic!("these tests need a running Docker daemon (run .ci/run or scripts/setup-docker.sh): {e}")
    });
    // As the product does at start-up: what a dead test process left is removed.
    s.sweep().await.expect("sweep");
    mcp_code_executor::backend::docker::image::ensure(
        &image::default_image(),
        &Default::default(),
        &mut |l| eprintln!("[image] {l}"),
    )
    .await
    .unwrap_or_else(|e| panic!("the sandbox image could not be built: {e}"));
    Arc::new(s)
}

/// Run `code` for `tenant` (a per-test label) and return the outcome.
pub async fn run(s: &DockerBackend, tenant: &str, code: &str, limits: Limits) -> Outcome {
    let mut job = JobSpec::python(code, limits);
    job.tenant = tenant.to_string();
    s.run(job, None)
        .await
        .unwrap_or_else(|e| panic!("infrastructure error running {code:?}: {e}"))
}

/// The owner label the backend puts on what this process makes (`host/pid/start-time`,
/// as in the start-up sweep). Tests of several worktrees share one daemon and the same
/// tenant labels: containers are told apart by it.
pub fn owner_id() -> String {
    owner_label(std::process::id()).expect("this process exists")
}

/// The owner label of `pid` on this host had it started at `start` (the sweep test makes
/// up dead owners this way).
pub fn owner_of(pid: u32, start: &str) -> String {
    let me = owner_id();
    let host = me.split('/').next().expect("host/pid/start");
    format!("{host}/{pid}/{start}")
}

/// The owner label of the live process `pid` (a server child): see [`containers_owned_by`].
pub fn owner_of_process(pid: u32) -> String {
    owner_label(pid).expect("the process exists")
}

/// Containers made by the process whose owner label is `owner`, running or not: its pool's
/// (labelled `pool`) and its cold ones (labelled with their tenant).
pub fn containers_owned_by(owner: &str) -> Vec<String> {
    list_containers(&[format!("label={LABEL_OWNER}={owner}")])
}

/// Containers of ours carrying this tenant label, running or not, whoever made them (a
/// server child process, say). Other test processes on this daemon may use the same label.
pub fn containers_of(tenant: &str) -> Vec<String> {
    list_containers(&[format!("label={LABEL_TENANT}={tenant}")])
}

/// Containers this very process made for this tenant label, running or not.
pub fn own_containers_of(tenant: &str) -> Vec<String> {
    list_containers(&[
        format!("label={LABEL_TENANT}={tenant}"),
        format!("label={LABEL_OWNER}={}", owner_id()),
    ])
}

fn list_containers(filters: &[String]) -> Vec<String> {
    let mut cmd = Command::new("docker");
    cmd.args(["ps", "-aq"]);
    for f in filters {
        cmd.arg("--filter").arg(f);
    }
    let out = cmd.output().expect("the docker CLI runs");
    assert!(out.status.success(), "docker ps failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Force-remove containers by id (a test's own, on its way out).
pub fn remove_containers(ids: &[String]) {
    if ids.is_empty() {
        return;
    }
    let _ = Command::new("docker")
        .args(["rm", "-f", "-v"])
        .args(ids)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Removes what this process made for `tenant` when dropped, also when the test panics
/// (a panicking test's runtime is gone before the backend's background removals ran).
/// Hold one for the whole test: `let _clean = common::remove_on_drop("t-x");`.
pub struct RemoveOnDrop(pub String);

pub fn remove_on_drop(tenant: &str) -> RemoveOnDrop {
    RemoveOnDrop(tenant.to_string())
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        remove_containers(&own_containers_of(&self.0));
    }
}

/// Wait for background removals, then check that nothing `s` made for `tenant` is left
/// (`s` is this process's: containers of other test processes with the same label do not
/// count).
pub async fn assert_clean(s: &DockerBackend, tenant: &str) {
    s.drain().await;
    let left = own_containers_of(tenant);
    assert!(
        left.is_empty(),
        "containers left behind for {tenant}: {left:?}"
    );
}

/// Free bytes on the filesystem that holds Docker's data.
/// The Python with the official MCP SDK (and `httpx2`, which it brings): `MCP_PY_SDK_PYTHON`,
/// else the venv `scripts/test.sh` makes in `target/py-sdk`. Missing, the test fails and
/// says how to get it.
pub fn sdk_python() -> std::path::PathBuf {
    let p = std::env::var_os("MCP_PY_SDK_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py-sdk/bin/python")
        });
    let ok = Command::new(&p)
        .args(["-c", "import mcp, httpx2"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the official MCP Python SDK is needed at {}: run scripts/test.sh, or \
         `python3 -m venv target/py-sdk && target/py-sdk/bin/pip install mcp==2.3.0`",
        p.display()
    );
    p
}

pub fn docker_disk_free() -> u64 {
    let out = Command::new("stat")
        .args(["-f", "-c", "%a %S", "/var/lib/docker"])
        .output()
        .expect("stat runs");
    let s = String::from_utf8_lossy(&out.stdout);
    let mut it = s.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

pub fn limits() -> Limits {
    Limits::default()
}

/// Forks until the pids limit refuses, then prints how many forks succeeded and the errno.
pub const FORK_BOMB: &str = r#"
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

/// Containers of ours made by the process `pid` on this host (`all`: stopped ones too).
pub fn containers_left_by(pid: u32, all: bool) -> Vec<String> {
    let mut ps = Command::new("docker");
    ps.arg("ps");
    if all {
        ps.arg("-a");
    }
    let out = ps
        .args([
            "--filter",
            "label=io.mcp-code-executor.managed=true",
            "--format",
            "{{.ID}} {{.Label \"io.mcp-code-executor.owner\"}}",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker ps: {out:?}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mine = format!("{}/{pid}/", host.trim());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, owner)| owner.starts_with(&mine))
        .map(|(id, _)| id.to_string())
        .collect()
}

/// Nothing made by the process `pid` may be left once it has exited.
pub fn assert_nothing_left_by(pid: u32) {
    let left = containers_left_by(pid, true);
    assert!(left.is_empty(), "process {pid} left containers: {left:?}");
}

/// The Streamable HTTP URL a `serve` child announces on its stderr (`… Streamable HTTP at
/// URL …`), read from `lines` within `within`; with `echo` each line read is printed as
/// `[server] …`. Panics when the server exits first or takes longer.
pub async fn announced_url(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    within: std::time::Duration,
    echo: bool,
) -> String {
    tokio::time::timeout(within, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if echo {
                eprintln!("[server] {line}");
            }
            if let Some(rest) = line.split("Streamable HTTP at ").nth(1) {
                return rest.split_whitespace().next().unwrap().to_string();
            }
        }
        panic!("the server exited before listening");
    })
    .await
    .expect("the server listens in time")
}

static SCRATCH: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// A fresh directory `{name}-{random}` under this test process's scratch root
/// (`mcp-test-scratch-{pid}`), which is removed when the process exits, whether the tests
/// passed or failed (libtest ends with `exit`, which runs `atexit` handlers). For
/// directories a test cannot easily hold a [`TempDirs`] guard for.
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    extern "C" fn remove() {
        if let Some(root) = SCRATCH.get() {
            let _ = std::fs::remove_dir_all(root);
        }
    }
    let root = SCRATCH.get_or_init(|| {
        // SAFETY: registers a plain function that takes no locks held elsewhere.
        unsafe { libc::atexit(remove) };
        std::env::temp_dir().join(format!("mcp-test-scratch-{}", std::process::id()))
    });
    let dir = root.join(format!("{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Directories removed when this is dropped: at the end of a test, whether it passed or
/// panicked (a panic unwinds through the test's locals).
pub struct TempDirs(pub Vec<std::path::PathBuf>);

impl TempDirs {
    /// A fresh, empty directory `mcp-test-{name}-{random}` under the system's temporary
    /// directory, removed with the guard.
    pub fn one(name: &str) -> (TempDirs, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("mcp-test-{name}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        (TempDirs(vec![dir.clone()]), dir)
    }
}

impl Drop for TempDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// The CPU weight of container `id` as the host's cgroup files say (`cpu.shares` of cgroup
/// v1, `cpu.weight` of v2), and the default there.
pub fn host_weight(id: &str) -> (String, &'static str) {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.Id}}", id])
        .output()
        .expect("docker inspect runs");
    let full = String::from_utf8_lossy(&out.stdout).trim().to_string();
    for (file, normal) in [
        (
            format!("/sys/fs/cgroup/cpu/docker/{full}/cpu.shares"),
            "1024",
        ),
        (
            format!("/sys/fs/cgroup/cpu,cpuacct/docker/{full}/cpu.shares"),
            "1024",
        ),
        (
            format!("/sys/fs/cgroup/cpu/system.slice/docker-{full}.scope/cpu.shares"),
            "1024",
        ),
        (format!("/sys/fs/cgroup/docker/{full}/cpu.weight"), "100"),
        (
            format!("/sys/fs/cgroup/system.slice/docker-{full}.scope/cpu.weight"),
            "100",
        ),
    ] {
        if let Ok(v) = std::fs::read_to_string(&file) {
            return (v.trim().to_string(), normal);
        }
    }
    panic!("no cgroup file of container {full} on this host");
}
