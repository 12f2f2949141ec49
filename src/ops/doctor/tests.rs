use super::evaluate::swap_check;
use super::*;
use serde_json::{json, Value};

/// What the probe printed in a correctly hardened sandbox on this project's CI host.
fn healthy() -> Value {
    json!({
        "kernel": {"release": "6.1.0-13-amd64", "version": "#1 SMP PREEMPT_DYNAMIC Debian"},
        "prctl": {"no_new_privs": 1, "seccomp": 2},
        "mem_total": 24u64 << 30,
        "uid": 65534, "gid": 65534,
        "rofs": {"dir": "/var/tmp", "mode": "0o1777", "result": "EROFS"},
        "rofs_root_owned": {"/": "EROFS", "/etc": "EROFS", "/usr/lib": "EROFS"},
        "status": {"CapInh": "0000000000000000", "CapPrm": "0000000000000000",
                   "CapEff": "0000000000000000", "CapBnd": "0000000000000000",
                   "CapAmb": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"},
        "nofile": [200, 200],
        "cpu": {"source": "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "quota": 50000, "period": 100000},
        "memory": {"cgroup": 1, "limit": "134217728", "swap": "134217728", "host_swap": 0},
        "ifaces": ["lo"], "routes": 0,
        "connect": {"169.254.169.254:80": "ENETUNREACH", "1.1.1.1:53": "ENETUNREACH"},
    })
}

/// What the probe printed under gVisor (runsc 2022-12-19, ptrace platform) on this
/// project's CI host.
fn gvisor_healthy() -> Value {
    json!({
        "kernel": {"release": "4.4.0", "version": "#1 SMP Sun Jan 10 15:06:54 PST 2016"},
        "prctl": {"no_new_privs": 1, "seccomp": 0},
        "mem_total": 134217728,
        "uid": 65534, "gid": 65534,
        "rofs": {"dir": "/var/tmp", "mode": "0o1777", "result": "EROFS"},
        "rofs_root_owned": {"/": "EACCES", "/etc": "EACCES", "/usr/lib": "EACCES"},
        "status": {"CapInh": "0000000000000000", "CapPrm": "0000000000000000",
                   "CapEff": "0000000000000000", "CapBnd": "0000000000000000",
                   "CapAmb": null, "NoNewPrivs": null, "Seccomp": "0"},
        "nofile": [200, 200],
        "cpu": {"source": null},
        "burn": {"ran_s": 0.47, "wall_s": 1.01, "procs": 8},
        "memory": {"cgroup": 1, "limit": null, "swap": null, "host_swap": 0},
        "ifaces": ["lo"], "routes": 0,
        "connect": {"169.254.169.254:80": "EHOSTUNREACH", "1.1.1.1:53": "EHOSTUNREACH"},
    })
}

fn gvisor() -> Isolation {
    Isolation::Gvisor {
        host_kernel: "6.18.44-fc-v769".into(),
    }
}

fn failing(v: &Value) -> Vec<&'static str> {
    failing_under(v, &Isolation::HostKernel)
}

fn failing_under(v: &Value, iso: &Isolation) -> Vec<&'static str> {
    evaluate(v, &probe_limits(), iso)
        .into_iter()
        .filter(|c| !c.ok)
        .map(|c| c.name)
        .collect()
}

#[test]
fn a_hardened_sandbox_passes_every_check() {
    assert_eq!(failing(&healthy()), Vec::<&str>::new());
}

/// What each missing piece of hardening looks like from inside, and the one check it
/// must fail.
#[test]
fn each_missing_hardening_fails_its_check() {
    let cases: &[(&str, &str, Value, &str)] = &[
        ("/uid", "", json!(0), "non-root uid"),
        ("/rofs", "result", json!("created"), "read-only root"),
        // A writable root refuses a non-root uid in root-owned directories too, but
        // with EACCES.
        (
            "/rofs_root_owned",
            "/etc",
            json!("EACCES"),
            "read-only root",
        ),
        ("/rofs", "dir", Value::Null, "read-only root"),
        // cap_drop missing, non-root uid: CapEff is 0 anyway, the bounding set is not.
        (
            "/status",
            "CapBnd",
            json!("00000000a80425fb"),
            "no capabilities",
        ),
        (
            "/status",
            "CapAmb",
            json!("0000000000000400"),
            "no capabilities",
        ),
        ("/prctl", "no_new_privs", json!(0), "no-new-privileges"),
        ("/status", "Seccomp", json!("0"), "seccomp filter"),
        ("", "ifaces", json!(["eth0", "lo"]), "network unreachable"),
        (
            "/connect",
            "1.1.1.1:53",
            json!("timed out"),
            "no outbound connections",
        ),
        (
            "/connect",
            "169.254.169.254:80",
            json!("connected"),
            "no outbound connections",
        ),
        ("", "nofile", json!([1048576, 1048576]), "nofile limit"),
        ("/cpu", "quota", Value::Null, "cpu quota"),
        ("/cpu", "quota", json!(100000), "cpu quota"),
        // memory_swap unset: Docker gives twice the memory.
        (
            "/memory",
            "swap",
            json!("268435456"),
            "no swap beyond memory",
        ),
        (
            "/memory",
            "limit",
            json!("9223372036854771712"),
            "no swap beyond memory",
        ),
    ];
    for (at, key, value, check) in cases {
        let mut v = healthy();
        let target = v.pointer_mut(at).unwrap();
        if key.is_empty() {
            *target = value.clone();
        } else {
            target[*key] = value.clone();
        }
        assert_eq!(failing(&v), vec![*check], "{at}/{key} = {value}");
    }
}

/// Where the probe could not call prctl, /proc's NoNewPrivs line decides.
#[test]
fn no_new_privileges_from_proc_without_prctl() {
    let mut v = healthy();
    v["prctl"] = json!({"no_new_privs": null, "seccomp": null});
    assert_eq!(failing(&v), Vec::<&str>::new());
    v["status"]["NoNewPrivs"] = json!("0");
    assert_eq!(failing(&v), ["no-new-privileges"]);
}

/// Under gVisor: the healthy sandbox passes every check, including the kernel check
/// only gVisor has; each missing piece fails its check; and what is fine only under
/// gVisor (EACCES in root-owned dirs, no CapAmb line, EHOSTUNREACH, Seccomp 0) still
/// fails under runc.
#[test]
fn under_gvisor_each_check_reads_what_gvisor_shows() {
    let names: Vec<_> = evaluate(&gvisor_healthy(), &probe_limits(), &gvisor())
        .into_iter()
        .map(|c| (c.name, c.ok))
        .collect();
    assert!(names.iter().all(|(_, ok)| *ok), "{names:?}");
    assert_eq!(names[0], ("gVisor kernel", true));
    assert!(names.contains(&("memory limit", true)), "{names:?}");

    let cases: &[(&str, &str, Value, &[&str])] = &[
        // runc where gVisor was asked for: the host's kernel, Docker's seccomp.
        (
            "/kernel",
            "release",
            json!("6.18.44-fc-v769"),
            &["gVisor kernel", "seccomp filter"],
        ),
        (
            "/kernel",
            "version",
            json!("#1 SMP PREEMPT_DYNAMIC"),
            &["gVisor kernel", "seccomp filter"],
        ),
        ("/rofs", "result", json!("created"), &["read-only root"]),
        (
            "/rofs_root_owned",
            "/etc",
            json!("created"),
            &["read-only root"],
        ),
        (
            "/status",
            "CapBnd",
            json!("00000000a80425fb"),
            &["no capabilities"],
        ),
        ("/prctl", "no_new_privs", json!(0), &["no-new-privileges"]),
        (
            "",
            "ifaces",
            json!(["eth0", "lo"]),
            &["network unreachable"],
        ),
        (
            "/connect",
            "1.1.1.1:53",
            json!("connected"),
            &["no outbound connections"],
        ),
        ("", "nofile", json!([1048576, 1048576]), &["nofile limit"]),
        // No memory limit: gVisor sizes its kernel from the host's memory.
        ("", "mem_total", json!(24u64 << 30), &["memory limit"]),
        // No CPU quota: the two busy processes got a core each.
        ("/burn", "ran_s", json!(1.19), &["cpu quota"]),
        ("", "burn", Value::Null, &["cpu quota"]),
    ];
    for (at, key, value, checks) in cases {
        let mut v = gvisor_healthy();
        let target = v.pointer_mut(at).unwrap();
        if key.is_empty() {
            *target = value.clone();
        } else {
            target[*key] = value.clone();
        }
        assert_eq!(
            &failing_under(&v, &gvisor()),
            checks,
            "{at}/{key} = {value}"
        );
    }

    // A newer gVisor (runsc 2024-07-29, systrap or ptrace) shows cgroup files of its own
    // kernel, without the host's limits: the quota and memory are still judged by the
    // burn and MemTotal, as this sandbox's probe printed them under a 0.5-core quota and
    // 128 MiB.
    let mut newer = gvisor_healthy();
    newer["cpu"] =
        json!({"source": "/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "quota": null, "period": 100000});
    newer["memory"] =
        json!({"cgroup": 1, "limit": "9223372036854775807", "swap": null, "host_swap": 0});
    assert_eq!(failing_under(&newer, &gvisor()), Vec::<&str>::new());
    newer["burn"]["ran_s"] = json!(1.19);
    assert_eq!(failing_under(&newer, &gvisor()), ["cpu quota"]);

    // gVisor's kernel reported by a host that runs the same release is not gVisor.
    let same = Isolation::Gvisor {
        host_kernel: "4.4.0".into(),
    };
    assert!(failing_under(&gvisor_healthy(), &same).contains(&"gVisor kernel"));

    // What passes only under gVisor fails under runc.
    let f = failing(&gvisor_healthy());
    for check in [
        "read-only root",
        "no capabilities",
        "seccomp filter",
        "no outbound connections",
        "cpu quota",
        "no swap beyond memory",
    ] {
        assert!(f.contains(&check), "{check}: {f:?}");
    }
}

#[test]
fn the_isolation_comes_from_the_backend_details() {
    let mut i = info(true);
    assert_eq!(Isolation::of(&i), Isolation::HostKernel);
    i.details.push(("isolation".into(), "gvisor".into()));
    i.details.push(("host kernel".into(), "6.18.44".into()));
    assert_eq!(
        Isolation::of(&i),
        Isolation::Gvisor {
            host_kernel: "6.18.44".into()
        }
    );
}

#[test]
fn swap_on_cgroup_v2_and_where_unreadable() {
    let mem = 128 << 20;
    let v2 =
        |swap: &str| json!({"cgroup": 2, "limit": "134217728", "swap": swap, "host_swap": 1 << 30});
    assert!(swap_check(&v2("0"), mem).ok);
    assert!(!swap_check(&v2("max"), mem).ok);
    let unreadable = |host_swap: u64| json!({"cgroup": 1, "limit": "134217728", "swap": null, "host_swap": host_swap});
    assert!(swap_check(&unreadable(0), mem).ok);
    let c = swap_check(&unreadable(1 << 30), mem);
    assert!(
        !c.ok && c.detail.contains("swap accounting"),
        "{}",
        c.detail
    );
}

/// A backend whose `info` answers what it is told to and whose runs never happen: the
/// checks before the first run stop the diagnosis by themselves.
struct Answers(Result<BackendInfo, String>);

#[async_trait::async_trait]
impl crate::backend::Wrap for Answers {
    fn inner(&self) -> &dyn Backend {
        &crate::backend::Inert
    }

    async fn run(
        &self,
        _job: JobSpec,
        _events: crate::backend::Events,
    ) -> Result<crate::job::Outcome, crate::backend::BackendError> {
        panic!("doctor ran a job although an earlier check failed")
    }
    async fn info(&self) -> Result<BackendInfo, crate::backend::BackendError> {
        self.0.clone().map_err(crate::backend::BackendError::Runner)
    }
    async fn drain(&self) {}
}

fn info(image_present: bool) -> BackendInfo {
    BackendInfo {
        kind: "docker",
        version: "Docker 20.10.24 (API 1.41)".into(),
        image: "mcp-code-executor/sandbox:abc".into(),
        image_present,
        details: vec![("runtime".into(), "crun".into())],
    }
}

#[tokio::test]
async fn an_unreachable_backend_or_a_missing_image_fails_and_stops() {
    let r = diagnose(&Answers(Err("no daemon here".into()))).await;
    assert!(!r.ok());
    assert_eq!(r.checks.len(), 1);
    assert_eq!(r.checks[0].name, REACHABLE);
    assert!(r.checks[0].detail.contains("no daemon here"));

    let r = diagnose(&Answers(Ok(info(false)))).await;
    assert!(!r.ok());
    let names: Vec<_> = r.checks.iter().map(|c| (c.name, c.ok)).collect();
    assert_eq!(names, [(REACHABLE, true), ("sandbox image", false)]);
    assert_eq!(
        r.checks[0].detail, "docker: Docker 20.10.24 (API 1.41), runtime crun",
        "the backend's particulars are data"
    );
    assert!(
        r.checks[1].detail.contains("image build"),
        "{:?}",
        r.checks[1]
    );
}

#[test]
fn the_probe_limits_are_not_common_defaults() {
    let l = probe_limits();
    assert!(![1024, 4096, 65536, 524288, 1048576].contains(&l.nofile));
    assert!(l.cpus < 1.0, "a quota below one core exists on every host");
}
