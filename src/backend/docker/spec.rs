//! What a sandbox container is made of: its labels, its command and environment, how the
//! environment's [`Source`]s are mounted, and the hardening of its `HostConfig`, all in one
//! place so that one unit test (`hardening_is_all_there`) sees every piece of it, and so
//! that the `docker run` flags the benchmark compares against are read off the same code.
//! Pure: nothing here talks to the daemon.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, MountVolumeOptions,
    ResourcesUlimits,
};

use super::DockerConfig;
use crate::backend::{protocol, BackendError};
use crate::job::{Limits, RunEnv, Source};

pub use crate::backend::labels::{LABEL_JOB, LABEL_MANAGED, LABEL_OWNER, LABEL_TENANT};

/// The OCI runtime name of gVisor, registered by `scripts/setup-docker.sh --gvisor`.
pub const GVISOR_RUNTIME: &str = "runsc";

/// Whether `runtime` is gVisor's (`runsc`, or a registration named `runsc-...`): its
/// sandboxes see gVisor's kernel, not the host's, and need [`host_config`]'s adjustments.
pub fn is_gvisor(runtime: Option<&str>) -> bool {
    runtime.is_some_and(|r| r == GVISOR_RUNTIME || r.starts_with("runsc-"))
}

/// The host pids limit of a gVisor sandbox whose code may have `pids` processes and
/// threads. Under gVisor the container's pids cgroup holds gVisor itself (the Sentry's
/// and the gofer's threads, and, with the ptrace platform, a stub process per address
/// space): measured here, a sandbox needs about 5 host pids per process of the code plus
/// about 50; at `pids` itself a small limit (32) stops gVisor from starting at all
/// (`urpc method "containerManager.StartRoot" failed: EOF`) and a fork bomb crashes it
/// (exit status 2). The code's own count is capped inside gVisor by `RLIMIT_NPROC`, which
/// gVisor's kernel counts per sandbox (under runc it would count every process of the uid
/// on the host, so it is set only here).
pub fn gvisor_host_pids(pids: i64) -> i64 {
    pids.saturating_mul(8).saturating_add(128)
}

/// Uid and gid the code runs as (`nobody`).
const SANDBOX_USER: &str = "65534:65534";
/// The runner, started with `-I -S`; the interpreter for the code is appended.
const RUNNER_CMD: &[&str] = &[
    crate::backend::image::PYTHON,
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
/// runner as its command, stdin open for the job, the sandbox user, and [`host_config`]
/// (whose refusal of a source it passes on).
pub(super) fn create_body(
    config: &DockerConfig,
    owner: &str,
    limits: &Limits,
    env: &RunEnv,
    tenant: &str,
    id: &str,
) -> Result<ContainerCreateBody, BackendError> {
    let mut host = host_config(limits, env, config.runtime.clone())?;
    // Without a network, no network set-up by Docker either (see `DockerConfig::hosts_file`).
    let hosts = config.hosts_file.as_ref().filter(|_| !env.network);
    if let Some(h) = hosts {
        host.mounts.get_or_insert_with(Vec::new).push(Mount {
            typ: Some(MountType::BIND),
            source: Some(h.display().to_string()),
            target: Some("/etc/hosts".to_string()),
            read_only: Some(true),
            ..Default::default()
        });
    }
    Ok(ContainerCreateBody {
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
                .chain(protocol::runner_env(limits).map(|(k, v)| format!("{k}={v}")))
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
        network_disabled: hosts.map(|_| true),
        host_config: Some(host),
        ..Default::default()
    })
}

/// The bind mount of a sandbox's own directory on the host (`dir`, see
/// [`crate::backend::sandbox_dir`]) at [`protocol::SANDBOX_DIR`], read-only: the code may
/// connect to the socket the server puts there, not write or remove anything.
pub(super) fn sandbox_dir_mount(dir: &std::path::Path) -> Mount {
    Mount {
        typ: Some(MountType::BIND),
        source: Some(dir.display().to_string()),
        target: Some(protocol::SANDBOX_DIR.to_string()),
        read_only: Some(true),
        ..Default::default()
    }
}

/// The `docker run` flags that give a container the same hardening as [`host_config`] (and
/// the sandbox user), read off it, for baselines that compare the engine with the CLI.
pub fn docker_run_flags(limits: &Limits, runtime: Option<&str>) -> Vec<String> {
    let hc = host_config(limits, &RunEnv::default(), runtime.map(str::to_string))
        .expect("no sources: nothing to refuse");
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

/// How environment sources reach a Docker container: bind mounts (`binds`) for host paths,
/// volume mounts (`mounts`) for volumes, nothing for what the image holds. A source Docker
/// cannot provide faithfully is refused before anything is created.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Mounts {
    pub binds: Vec<String>,
    pub mounts: Vec<Mount>,
}

/// Map `sources` to [`Mounts`], or say why one cannot be given.
pub(super) fn mounts_of(sources: &[Source]) -> Result<Mounts, BackendError> {
    let mut m = Mounts::default();
    for s in sources {
        match s {
            Source::HostPath { path, writable } => {
                // The bind syntax is `src:dst:mode`: a relative path would name a volume,
                // a colon would split the path.
                let p = path
                    .to_str()
                    .filter(|p| path.is_absolute() && !p.contains(':'));
                let Some(p) = p else {
                    return Err(BackendError::Rejected(format!(
                        "the host path `{}` cannot be bind-mounted: it must be absolute,                          UTF-8 and without `:`",
                        path.display()
                    )));
                };
                m.binds
                    .push(format!("{p}:{p}:{}", if *writable { "rw" } else { "ro" }));
            }
            // Volume subpaths came with API 1.45 (Docker 26); older daemons (1.41 here)
            // ignore the field silently and would mount the whole volume.
            Source::Volume {
                name,
                subpath: Some(sub),
                ..
            } => {
                return Err(BackendError::Rejected(format!(
                        "the Docker backend mounts whole volumes only, not `{}` inside                          volume `{name}`: give the environment a volume of its own",
                        sub.display()
                )));
            }
            Source::Volume {
                name,
                target,
                writable,
                ..
            } => {
                crate::backend::sources::check_volume("volume", name, target)?;
                m.mounts.push(Mount {
                    typ: Some(MountType::VOLUME),
                    source: Some(name.clone()),
                    target: Some(target.display().to_string()),
                    read_only: Some(!writable),
                    // An empty volume must stay empty: no copy of the image's files at the
                    // target into it.
                    volume_options: Some(MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
            // In the image already: its read-only root holds it.
            Source::Image { .. } => {}
        }
    }
    Ok(m)
}

/// The hardening every sandbox gets. Each line is checked by `doctor` or the tests. Fails
/// only when the environment asks for a source Docker cannot provide ([`mounts_of`]).
pub(super) fn host_config(
    l: &Limits,
    env: &RunEnv,
    runtime: Option<String>,
) -> Result<HostConfig, BackendError> {
    let tmpfs = |size: u64| format!("rw,nosuid,nodev,noexec,size={size},mode=1777");
    let Mounts { binds, mounts } = mounts_of(&env.sources)?;
    let mut ulimits = vec![ResourcesUlimits {
        name: Some("nofile".to_string()),
        soft: Some(l.nofile as i64),
        hard: Some(l.nofile as i64),
    }];
    let gvisor = is_gvisor(runtime.as_deref());
    // gVisor registered with `--network=none` cannot start a container with a network:
    // the one kind that has one (an installer's fetch phase, which runs only the image's
    // pip on wheels, no code of the packages nor of the user) runs under the daemon's
    // default runtime. Everything without a network runs under gVisor.
    let runtime = if gvisor && env.network { None } else { runtime };
    let pids = if gvisor && runtime.is_some() {
        ulimits.push(ResourcesUlimits {
            name: Some("nproc".to_string()),
            soft: Some(l.pids),
            hard: Some(l.pids),
        });
        gvisor_host_pids(l.pids)
    } else {
        l.pids
    };
    Ok(HostConfig {
        network_mode: Some(if env.network { "bridge" } else { "none" }.to_string()),
        binds: (!binds.is_empty()).then_some(binds),
        mounts: (!mounts.is_empty()).then_some(mounts),
        readonly_rootfs: Some(true),
        tmpfs: Some(HashMap::from([
            (protocol::WORKDIR.to_string(), tmpfs(l.workspace_bytes)),
            ("/tmp".to_string(), tmpfs(l.tmp_bytes)),
        ])),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec!["no-new-privileges".to_string()]),
        pids_limit: Some(pids),
        memory: Some(l.memory_bytes as i64),
        memory_swap: Some(l.memory_bytes as i64),
        nano_cpus: Some((l.cpus * 1e9) as i64),
        shm_size: Some(16 << 20),
        ulimits: Some(ulimits),
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        init: Some(false),
        auto_remove: Some(false),
        runtime,
        ..Default::default()
    })
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
        let hc = host_config(&l, &RunEnv::default(), None).unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, None);
        assert_eq!(hc.privileged, None);
        assert_eq!(hc.devices, None);
        assert_eq!(hc.binds, None, "no mounts unless the environment asks");
        assert_eq!(hc.mounts, None, "no volumes either");
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

        // An installer's environment: network, and its host paths bind-mounted read-only
        // unless writable.
        let env = RunEnv {
            network: true,
            sources: vec![
                Source::host("/opt/venv"),
                Source::host_writable("/opt/cache"),
            ],
            ..RunEnv::default()
        };
        let hc = host_config(&l, &env, Some("crun".into())).unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
        assert_eq!(
            hc.binds,
            Some(vec![
                "/opt/venv:/opt/venv:ro".to_string(),
                "/opt/cache:/opt/cache:rw".to_string()
            ])
        );
        assert_eq!(hc.mounts, None);
        assert_eq!(hc.runtime.as_deref(), Some("crun"));
        assert_eq!(hc.readonly_rootfs, Some(true), "installers too");
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));

        // A source Docker cannot provide: no container at all, not one without it.
        let env = RunEnv {
            sources: vec![Source::host("relative/venv")],
            ..RunEnv::default()
        };
        assert!(matches!(
            host_config(&l, &env, None),
            Err(BackendError::Rejected(_))
        ));
    }

    /// With a hosts file, a sandbox without a network is made with Docker's networking
    /// disabled (no `libnetwork-setkey` hook) and that file read-only at `/etc/hosts`; one
    /// with a network (an installer's fetch phase) and any sandbox without the file keep
    /// Docker's network set-up.
    #[test]
    fn networking_is_disabled_where_there_is_no_network_and_a_hosts_file() {
        let hosts = std::path::PathBuf::from("/data/sandbox-hosts");
        let with = DockerConfig {
            hosts_file: Some(hosts.clone()),
            ..DockerConfig::new("img")
        };
        let l = Limits::default();
        let body = create_body(&with, "o", &l, &RunEnv::default(), "t", "id").unwrap();
        assert_eq!(body.network_disabled, Some(true));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        let m = hc.mounts.unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].typ, Some(MountType::BIND));
        assert_eq!(m[0].source.as_deref(), Some("/data/sandbox-hosts"));
        assert_eq!(m[0].target.as_deref(), Some("/etc/hosts"));
        assert_eq!(m[0].read_only, Some(true));

        let fetch = RunEnv {
            network: true,
            ..RunEnv::default()
        };
        let body = create_body(&with, "o", &l, &fetch, "t", "id").unwrap();
        assert_eq!(body.network_disabled, None);
        assert_eq!(body.host_config.unwrap().mounts, None);
        let without = DockerConfig::new("img");
        let body = create_body(&without, "o", &l, &RunEnv::default(), "t", "id").unwrap();
        assert_eq!(body.network_disabled, None);
        assert_eq!(body.host_config.unwrap().mounts, None);
    }

    /// The hosts file is written once, names `localhost`, and is left as it is when right.
    #[test]
    fn the_hosts_file_is_written_once() {
        let dir =
            crate::scratch::scratch_root().join(format!("hosts-{}", uuid::Uuid::new_v4().simple()));
        let path = super::super::write_hosts_file(&dir).expect("written");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("127.0.0.1\tlocalhost\n"), "{text:?}");
        let before = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(super::super::write_hosts_file(&dir), Some(path.clone()));
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            before
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Under gVisor: the code's process count is RLIMIT_NPROC (counted per sandbox by
    /// gVisor's kernel), the host pids limit leaves room for gVisor itself, and a container
    /// with a network (the fetch phase) runs under the daemon's default runtime; under any
    /// other runtime nothing of that happens.
    #[test]
    fn gvisor_gets_nproc_host_pids_room_and_no_network() {
        let l = Limits {
            pids: 32,
            nofile: 99,
            ..Limits::default()
        };
        assert!(is_gvisor(Some("runsc")) && is_gvisor(Some("runsc-kvm")));
        assert!(!is_gvisor(None) && !is_gvisor(Some("runc")) && !is_gvisor(Some("crun")));

        let hc = host_config(&l, &RunEnv::default(), Some("runsc".into())).unwrap();
        assert_eq!(hc.runtime.as_deref(), Some("runsc"));
        assert_eq!(hc.pids_limit, Some(gvisor_host_pids(32)));
        assert!(
            gvisor_host_pids(32) >= 32 * 5 + 64,
            "room measured for gVisor"
        );
        let ulimits: Vec<_> = hc
            .ulimits
            .unwrap()
            .into_iter()
            .map(|u| (u.name.unwrap(), u.soft.unwrap(), u.hard.unwrap()))
            .collect();
        assert_eq!(
            ulimits,
            [
                ("nofile".to_string(), 99, 99),
                ("nproc".to_string(), 32, 32)
            ]
        );
        assert_eq!(hc.network_mode.as_deref(), Some("none"));

        let fetch = RunEnv {
            network: true,
            ..RunEnv::default()
        };
        let hc = host_config(&l, &fetch, Some("runsc".into())).unwrap();
        assert_eq!(
            hc.runtime, None,
            "the fetch phase: the daemon's default runtime"
        );
        assert_eq!(hc.pids_limit, Some(32));
        assert_eq!(
            hc.ulimits.unwrap().len(),
            1,
            "no nproc under runc: it is per uid"
        );

        for runtime in [None, Some("runc".to_string()), Some("crun".to_string())] {
            let hc = host_config(&l, &RunEnv::default(), runtime.clone()).unwrap();
            assert_eq!(hc.pids_limit, Some(32), "{runtime:?}");
            assert_eq!(hc.ulimits.unwrap().len(), 1, "{runtime:?}");
        }
        let flags = docker_run_flags(&l, Some("runsc")).join(" ");
        assert!(flags.contains("--runtime runsc"), "{flags}");
        assert!(flags.contains("--ulimit nproc=32:32"), "{flags}");
        assert!(
            flags.contains(&format!("--pids-limit {}", gvisor_host_pids(32))),
            "{flags}"
        );
    }

    /// Each kind of source, and what Docker makes of it: host paths are binds at the same
    /// path, volumes are volume mounts (read-only unless writable, never filled from the
    /// image), the image's own environment is nothing at all; what Docker cannot do
    /// faithfully is refused with a message naming the source.
    #[test]
    fn sources_map_to_binds_volumes_or_nothing() {
        let volume =
            |name: &str, subpath: Option<&str>, target: &str, writable: bool| Source::Volume {
                name: name.into(),
                subpath: subpath.map(Into::into),
                target: target.into(),
                writable,
            };
        let m = mounts_of(&[
            Source::host("/srv/envs/a"),
            volume("envs", None, "/opt/envs", false),
            Source::Image {
                path: "/opt/conda".into(),
            },
            Source::host_writable("/srv/installs/1"),
            volume("cache", None, "/var/cache/pip", true),
        ])
        .unwrap();
        assert_eq!(
            m.binds,
            [
                "/srv/envs/a:/srv/envs/a:ro",
                "/srv/installs/1:/srv/installs/1:rw"
            ]
        );
        assert_eq!(m.mounts.len(), 2, "the image's own source mounts nothing");
        let (env, cache) = (&m.mounts[0], &m.mounts[1]);
        assert_eq!(env.typ, Some(MountType::VOLUME));
        assert_eq!(env.source.as_deref(), Some("envs"));
        assert_eq!(env.target.as_deref(), Some("/opt/envs"));
        assert_eq!(env.read_only, Some(true));
        assert_eq!(
            env.volume_options.as_ref().and_then(|o| o.no_copy),
            Some(true)
        );
        assert_eq!(cache.read_only, Some(false));
        assert_eq!(
            mounts_of(&[Source::Image {
                path: "/opt/conda".into()
            }])
            .unwrap(),
            Mounts::default()
        );

        for (bad, says) in [
            (Source::host("venv"), "`venv`"),
            (Source::host("/srv/a:b"), "`/srv/a:b`"),
            (
                volume("envs", Some("tenant-a"), "/opt/envs", false),
                "`tenant-a`",
            ),
            (volume("envs", None, "opt/envs", false), "absolute target"),
            (volume("", None, "/opt/envs", false), "needs a name"),
        ] {
            match mounts_of(&[Source::host("/ok"), bad.clone()]) {
                Err(BackendError::Rejected(m)) => assert!(m.contains(says), "{bad:?}: {m}"),
                other => panic!("{bad:?} was not refused: {other:?}"),
            }
        }
    }
}
