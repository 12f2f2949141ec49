//! What a sandbox container is made of: its labels, its command and environment, and the
//! hardening of its `HostConfig`, all in one place so that one unit test
//! ([`tests::hardening_is_all_there`]) sees every piece of it, and so that the `docker run`
//! flags the benchmark compares against are read off the same code. Pure: nothing here
//! talks to the daemon.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};

use super::DockerConfig;
use crate::backend::protocol;
use crate::job::{Limits, RunEnv};

/// Label on everything this project creates: the sweep and tests find containers by it.
pub const LABEL_MANAGED: &str = "io.mcp-code-executor.managed";
/// Label with the job id (for a pool container: its own id until a job is dispatched).
pub const LABEL_JOB: &str = "io.mcp-code-executor.job";
/// Label with the tenant id (`pool` for a waiting pool container).
pub const LABEL_TENANT: &str = "io.mcp-code-executor.tenant";
/// Label naming the process that made the container (`host/pid/start-time`), so that the
/// start-up sweep removes only what a dead process left behind.
pub const LABEL_OWNER: &str = "io.mcp-code-executor.owner";

/// Uid and gid the code runs as (`nobody`).
const SANDBOX_USER: &str = "65534:65534";
/// The runner, started with `-I -S`; the interpreter for the code is appended.
const RUNNER_CMD: &[&str] = &[
    "/usr/bin/python3",
    "-I",
    "-S",
    "/opt/mcp-code-executor/runner.py",
];

/// The labels of a sandbox container: ours, which job (or pool slot), which tenant, which
/// process made it.
fn labels(id: &str, tenant: &str, owner: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_JOB.to_string(), id.to_string()),
        (LABEL_TENANT.to_string(), tenant.to_string()),
        (LABEL_OWNER.to_string(), owner.to_string()),
    ])
}

/// The interpreter a job with `env` runs.
pub(super) fn python<'a>(config: &'a DockerConfig, env: &'a RunEnv) -> &'a str {
    env.python.as_deref().unwrap_or(&config.python)
}

/// The create body of a sandbox container for `tenant`'s job (or pool slot) `id`: the
/// runner as its command, stdin open for the job, the sandbox user, and [`host_config`].
pub(super) fn create_body(
    config: &DockerConfig,
    owner: &str,
    limits: &Limits,
    env: &RunEnv,
    tenant: &str,
    id: &str,
) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(config.image.clone()),
        cmd: Some(
            [RUNNER_CMD, &[python(config, env)]]
                .concat()
                .iter()
                .map(|s| s.to_string())
                .collect(),
        ),
        env: Some(
            env.vars
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .chain([format!(
                    "MCPX_WAIT_LIMIT={}",
                    protocol::WAIT_LIMIT.as_secs()
                )])
                .collect(),
        ),
        user: Some(env.user.clone().unwrap_or_else(|| SANDBOX_USER.to_string())),
        working_dir: Some(protocol::WORKDIR.to_string()),
        hostname: Some("sandbox".to_string()),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        labels: Some(labels(id, tenant, owner)),
        host_config: Some(host_config(limits, env, config.runtime.clone())),
        ..Default::default()
    }
}

/// The `docker run` flags that give a container the same hardening as [`host_config`] (and
/// the sandbox user), read off it, for baselines that compare the engine with the CLI.
pub fn docker_run_flags(limits: &Limits, runtime: Option<&str>) -> Vec<String> {
    let hc = host_config(limits, &RunEnv::default(), runtime.map(str::to_string));
    let mut f: Vec<String> = vec!["--user".into(), SANDBOX_USER.into()];
    let mut flag = |name: &str, value: String| {
        f.push(name.to_string());
        f.push(value);
    };
    if let Some(n) = hc.network_mode {
        flag("--network", n);
    }
    for c in hc.cap_drop.unwrap_or_default() {
        flag("--cap-drop", c);
    }
    for o in hc.security_opt.unwrap_or_default() {
        flag("--security-opt", o);
    }
    let mut tmpfs: Vec<_> = hc.tmpfs.unwrap_or_default().into_iter().collect();
    tmpfs.sort();
    for (path, opts) in tmpfs {
        flag("--tmpfs", format!("{path}:{opts}"));
    }
    if let Some(p) = hc.pids_limit {
        flag("--pids-limit", p.to_string());
    }
    if let Some(m) = hc.memory {
        flag("--memory", m.to_string());
    }
    if let Some(m) = hc.memory_swap {
        flag("--memory-swap", m.to_string());
    }
    if let Some(n) = hc.nano_cpus {
        flag("--cpus", (n as f64 / 1e9).to_string());
    }
    for u in hc.ulimits.unwrap_or_default() {
        let (name, soft, hard) = (
            u.name.unwrap_or_default(),
            u.soft.unwrap_or(0),
            u.hard.unwrap_or(0),
        );
        flag("--ulimit", format!("{name}={soft}:{hard}"));
    }
    if let Some(s) = hc.shm_size {
        flag("--shm-size", s.to_string());
    }
    if let Some(l) = hc.log_config.and_then(|l| l.typ) {
        flag("--log-driver", l);
    }
    if let Some(r) = hc.runtime {
        flag("--runtime", r);
    }
    if hc.readonly_rootfs == Some(true) {
        f.push("--read-only".into());
    }
    f
}

/// The hardening every sandbox gets. Each line is checked by `doctor` or the tests.
pub(super) fn host_config(l: &Limits, env: &RunEnv, runtime: Option<String>) -> HostConfig {
    let tmpfs = |size: u64| format!("rw,nosuid,nodev,noexec,size={size},mode=1777");
    let binds: Vec<String> = env
        .mounts
        .iter()
        .map(|m| {
            let p = m.path.display();
            format!("{p}:{p}:{}", if m.writable { "rw" } else { "ro" })
        })
        .collect();
    HostConfig {
        network_mode: Some(if env.network { "bridge" } else { "none" }.to_string()),
        binds: (!binds.is_empty()).then_some(binds),
        readonly_rootfs: Some(true),
        tmpfs: Some(HashMap::from([
            (protocol::WORKDIR.to_string(), tmpfs(l.workspace_bytes)),
            ("/tmp".to_string(), tmpfs(l.tmp_bytes)),
        ])),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec!["no-new-privileges".to_string()]),
        pids_limit: Some(l.pids),
        memory: Some(l.memory_bytes as i64),
        memory_swap: Some(l.memory_bytes as i64),
        nano_cpus: Some((l.cpus * 1e9) as i64),
        shm_size: Some(16 << 20),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".to_string()),
            soft: Some(l.nofile as i64),
            hard: Some(l.nofile as i64),
        }]),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        init: Some(false),
        auto_remove: Some(false),
        runtime,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every piece of hardening `host_config` gives, with limits unlike the defaults so that
    /// each one is seen to come from the job. `doctor` and tests/engine.rs check the same
    /// from inside a running sandbox.
    #[test]
    fn hardening_is_all_there() {
        let l = Limits {
            memory_bytes: 300 << 20,
            cpus: 0.25,
            pids: 17,
            nofile: 99,
            workspace_bytes: 5 << 20,
            tmp_bytes: 3 << 20,
            ..Limits::default()
        };
        let hc = host_config(&l, &RunEnv::default(), None);
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, None);
        assert_eq!(hc.privileged, None);
        assert_eq!(hc.devices, None);
        assert_eq!(hc.binds, None, "no mounts unless the environment asks");
        assert_eq!(
            hc.security_opt,
            Some(vec!["no-new-privileges".to_string()]),
            "no-new-privileges, and nothing that turns seccomp off"
        );
        assert_eq!(hc.pids_limit, Some(17));
        assert_eq!(hc.memory, Some(300 << 20));
        assert_eq!(hc.memory_swap, hc.memory, "no swap on top of the memory");
        assert_eq!(hc.nano_cpus, Some(250_000_000));
        let ulimits = hc.ulimits.unwrap();
        assert_eq!(ulimits.len(), 1);
        assert_eq!(ulimits[0].name.as_deref(), Some("nofile"));
        assert_eq!((ulimits[0].soft, ulimits[0].hard), (Some(99), Some(99)));
        let log = hc.log_config.unwrap();
        assert_eq!(log.typ.as_deref(), Some("none"), "no log file on the host");
        // The runner is PID 1 and reaps; Docker's init would make it killable by the code.
        assert_eq!(hc.init, Some(false));
        // Removed explicitly on every path: auto_remove races `wait`.
        assert_eq!(hc.auto_remove, Some(false));
        assert_eq!(hc.runtime, None);
        assert_eq!(hc.shm_size, Some(16 << 20));

        let tmpfs = hc.tmpfs.unwrap();
        assert_eq!(tmpfs.len(), 2, "{tmpfs:?}");
        for (path, size) in [(protocol::WORKDIR, 5u64 << 20), ("/tmp", 3 << 20)] {
            let mut opts: Vec<&str> = tmpfs[path].split(',').collect();
            opts.sort();
            let size = format!("size={size}");
            let mut want = vec!["rw", "nosuid", "nodev", "noexec", &size, "mode=1777"];
            want.sort();
            assert_eq!(opts, want, "{path}");
        }

        // The user is set on the container, not in host_config: nobody, unless the
        // environment (an installer) says otherwise.
        assert_eq!(SANDBOX_USER, "65534:65534");
        assert_eq!(RunEnv::default().user, None);

        // An installer's environment: network, and its mounts read-only unless writable.
        let env = RunEnv {
            network: true,
            mounts: vec![
                crate::job::Mount {
                    path: "/opt/venv".into(),
                    writable: false,
                },
                crate::job::Mount {
                    path: "/opt/cache".into(),
                    writable: true,
                },
            ],
            ..RunEnv::default()
        };
        let hc = host_config(&l, &env, Some("crun".into()));
        assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
        assert_eq!(
            hc.binds,
            Some(vec![
                "/opt/venv:/opt/venv:ro".to_string(),
                "/opt/cache:/opt/cache:rw".to_string()
            ])
        );
        assert_eq!(hc.runtime.as_deref(), Some("crun"));
        assert_eq!(hc.readonly_rootfs, Some(true), "installers too");
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    }
}
