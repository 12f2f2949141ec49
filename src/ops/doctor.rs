//! `doctor`: is the backend there, is the sandbox image there, and is isolation really
//! enforced? Each check runs real code in a real sandbox of whatever [`Backend`] it is given
//! (what the backend is, and its particulars, show as data in the details); the server
//! refuses to serve when one fails.
//!
//! Under gVisor (`--runtime runsc`) the code sees gVisor's kernel: a check proves it, and
//! the checks whose evidence gVisor presents differently read it where gVisor shows it
//! ([`Isolation::Gvisor`]): no cgroup files inside, `NoNewPrivs` only through `prctl`, the
//! memory limit as the kernel's `MemTotal`, `EHOSTUNREACH` for a network without routes.

use std::time::Duration;

use serde::Serialize;

use crate::backend::{Backend, BackendInfo};
use crate::job::{JobSpec, Limits};

/// One line of the table.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// All checks, in order.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }

    /// A plain-text table for a terminal.
    pub fn table(&self) -> String {
        let w = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut s = String::new();
        for c in &self.checks {
            let mark = if c.ok { "ok  " } else { "FAIL" };
            s.push_str(&format!("{mark}  {:w$}  {}\n", c.name, c.detail));
        }
        s
    }
}

const PIDS_FOR_TEST: i64 = 32;

/// What `uname` says inside gVisor (its kernel is not the host's; these have not changed
/// across gVisor releases).
const GVISOR_UNAME: (&str, &str) = ("4.4.0", "#1 SMP Sun Jan 10 15:06:54 PST 2016");

/// Which kernel the sandboxes are meant to see, from the backend's details (the Docker
/// backend says `isolation gvisor` and the host's kernel when its runtime is runsc).
#[derive(Debug, Clone, PartialEq)]
pub enum Isolation {
    /// Namespaces, seccomp and cgroups of the host kernel (runc, crun).
    HostKernel,
    /// gVisor's kernel between the code and the host's (`host_kernel`: the daemon's).
    Gvisor { host_kernel: String },
}

impl Isolation {
    pub fn of(info: &BackendInfo) -> Self {
        let detail = |k: &str| {
            info.details
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        match detail("isolation").as_deref() {
            Some("gvisor") => Isolation::Gvisor {
                host_kernel: detail("host kernel").unwrap_or_default(),
            },
            _ => Isolation::HostKernel,
        }
    }

    fn gvisor(&self) -> bool {
        matches!(self, Isolation::Gvisor { .. })
    }
}

/// The limits the probe runs with. The CPU quota and `nofile` are values no host uses by
/// default, so a limit the backend forgot to apply cannot pass by coincidence; the memory is
/// the bombs' 128 MiB, so that the swap limit can be compared with it.
fn probe_limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(20),
        memory_bytes: 128 << 20,
        cpus: 0.5,
        pids: PIDS_FOR_TEST,
        nofile: 200,
        ..Limits::default()
    }
}

/// The fork bomb's limits: the bombs' pids limit, with room in memory for that many
/// processes under gVisor too (each costs gVisor a few MiB of the sandbox's memory: 31
/// sleeping forks of Python do not fit in 128 MiB there, and the bomb would end OOM-killed
/// before the pids limit showed).
fn fork_limits(small: &Limits) -> Limits {
    Limits {
        memory_bytes: 256 << 20,
        ..small.clone()
    }
}

/// What the probe reports: facts only, judged in [`evaluate`].
const PROBE: &str = r#"
import ctypes, errno, json, os, resource, socket, stat, time

def read(p):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError:
        return None

def status():
    s = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        s[k] = v.strip()
    return {k: s.get(k) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")}

def prctl(option):
    # PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP: what the kernel applies, also where
    # /proc/self/status does not show it (gVisor has no NoNewPrivs line).
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, 0, 0, 0, 0)
    except Exception:
        return None

def mem_total():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None

def try_create(d):
    try:
        fd = os.open(os.path.join(d, "mcp-doctor-probe"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    os.close(fd)
    os.unlink(os.path.join(d, "mcp-doctor-probe"))
    return "created"

def rofs():
    # A world-writable directory on the root filesystem itself (not a tmpfs): only a
    # read-only root refuses a write there, and then with EROFS, not EACCES.
    root = os.stat("/").st_dev
    for d in ("/var/tmp", "/run/lock", "/var/lock"):
        try:
            st = os.stat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_dev == root and st.st_mode & 0o1777 == 0o1777:
            return {"dir": d, "mode": oct(st.st_mode & 0o7777), "result": try_create(d)}
    return {"dir": None}

def cpu():
    v2 = read("/sys/fs/cgroup/cpu.max")
    if v2 is not None:
        q, p = v2.split()
        return {"source": "/sys/fs/cgroup/cpu.max", "quota": None if q == "max" else int(q), "period": int(p)}
    for d in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        q, p = read(d + "/cpu.cfs_quota_us"), read(d + "/cpu.cfs_period_us")
        if q is not None and p is not None:
            return {"source": d + "/cpu.cfs_quota_us", "quota": None if int(q) < 0 else int(q), "period": int(p)}
    return {"source": None}

def memory():
    swap_total = None
    for line in open("/proc/meminfo"):
        if line.startswith("SwapTotal:"):
            swap_total = int(line.split()[1]) * 1024
    v2 = read("/sys/fs/cgroup/memory.max")
    if v2 is not None:
        return {"cgroup": 2, "limit": v2, "swap": read("/sys/fs/cgroup/memory.swap.max"), "host_swap": swap_total}
    d = "/sys/fs/cgroup/memory/"
    return {"cgroup": 1, "limit": read(d + "memory.limit_in_bytes"), "swap": read(d + "memory.memsw.limit_in_bytes"), "host_swap": swap_total}

def connect(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        return "connected"
    except socket.timeout:
        return "timed out"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()

def burn():
    # Where no cgroup file shows the CPU quota (gVisor), measure it: two processes busy
    # for one second of wall time, and the CPU time they were given.
    start = time.time()
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            while time.time() < start + 1.0:
                pass
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    wall = time.time() - start
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": wall}

CPU = cpu()

print(json.dumps({
    "kernel": {"release": os.uname().release, "version": os.uname().version},
    "prctl": {"no_new_privs": prctl(39), "seccomp": prctl(21)},
    "mem_total": mem_total(),
    "uid": os.getuid(),
    "gid": os.getgid(),
    "rofs": rofs(),
    "rofs_root_owned": {d: try_create(d) for d in ("/", "/etc", "/usr/lib")},
    "status": status(),
    "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    "cpu": CPU,
    "burn": burn() if CPU["source"] is None else None,
    "memory": memory(),
    "ifaces": sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]),
    "routes": len(open("/proc/net/route").read().strip().splitlines()[1:]),
    "connect": {"169.254.169.254:80": connect("169.254.169.254", 80), "1.1.1.1:53": connect("1.1.1.1", 53)},
}))
"#;

const MEMORY_BOMB: &str = "s = 'x' * (1 << 30)\nprint(len(s))\n";

const FORK_BOMB: &str = r#"
import os, time
n = 0
try:
    while n < 10000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"#;

/// The name of the first check, for a caller that cannot even make a backend to report the
/// same failure in the same words.
pub const REACHABLE: &str = "backend reachable";

/// The first check's detail: which backend, its version, and what else it tells.
fn describe_backend(info: &BackendInfo) -> String {
    let mut s = format!("{}: {}", info.kind, info.version);
    for (name, value) in &info.details {
        s.push_str(&format!(", {name} {value}"));
    }
    s
}

/// Run every check against `backend`.
pub async fn diagnose(backend: &dyn Backend) -> Report {
    let mut checks = Vec::new();
    let isolation;
    match backend.info().await {
        Ok(info) => {
            isolation = Isolation::of(&info);
            checks.push(Check {
                name: REACHABLE,
                ok: true,
                detail: describe_backend(&info),
            });
            checks.push(Check {
                name: "sandbox image",
                ok: info.image_present,
                detail: if info.image_present {
                    info.image
                } else {
                    format!(
                        "{} is missing: run `mcp-code-executor image build`",
                        info.image
                    )
                },
            });
            if !info.image_present {
                return Report { checks };
            }
        }
        Err(e) => {
            checks.push(Check {
                name: REACHABLE,
                ok: false,
                detail: e.to_string(),
            });
            return Report { checks };
        }
    }

    let limits = probe_limits();
    // The bombs get the probe's memory and pids limits, and a full core to finish sooner.
    let small = Limits {
        cpus: crate::job::defaults::CPUS,
        ..limits.clone()
    };
    let (probe, oom, fork) = tokio::join!(
        backend.run(JobSpec::python(PROBE, limits.clone()), None),
        backend.run(JobSpec::python(MEMORY_BOMB, small.clone()), None),
        backend.run(JobSpec::python(FORK_BOMB, fork_limits(&small)), None),
    );

    match probe {
        Ok(o) if o.success() => {
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
            checks.push(Check {
                name: "python runs",
                ok: true,
                detail: format!("in {} ms", o.duration_ms),
            });
            checks.extend(evaluate(&v, &limits, &isolation));
        }
        other => checks.push(Check {
            name: "python runs",
            ok: false,
            detail: describe(other),
        }),
    }
    checks.push(match oom {
        Ok(o) => Check {
            name: "memory bomb OOM-killed",
            ok: o.oom_killed,
            detail: format!("1 GiB string under a 128 MiB limit: {}", o.status_line()),
        },
        Err(e) => Check {
            name: "memory bomb OOM-killed",
            ok: false,
            detail: e.to_string(),
        },
    });
    checks.push(match fork {
        Ok(o) => {
            let n: i64 = o.stdout_text().trim().parse().unwrap_or(-1);
            Check {
                name: "fork bomb contained",
                ok: (0..PIDS_FOR_TEST).contains(&n),
                detail: format!("{n} processes forked under a pids limit of {PIDS_FOR_TEST}"),
            }
        }
        Err(e) => Check {
            name: "fork bomb contained",
            ok: false,
            detail: e.to_string(),
        },
    });
    Report { checks }
}

/// Judge the probe's report against the limits it ran with. Each check is one a sandbox
/// without the matching piece of hardening fails.
fn evaluate(v: &serde_json::Value, l: &Limits, iso: &Isolation) -> Vec<Check> {
    use serde_json::Value;
    let mut checks = Vec::new();
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".to_string(),
        v => v.to_string(),
    };
    let gvisor = iso.gvisor();
    let (release, version) = (text(&v["kernel"]["release"]), text(&v["kernel"]["version"]));
    // The kernel the code talks to is gVisor's: its uname, and not the host's release.
    let gvisor_kernel = (release.as_str(), version.as_str()) == GVISOR_UNAME
        && !matches!(iso, Isolation::Gvisor { host_kernel } if *host_kernel == release);
    if let Isolation::Gvisor { host_kernel } = iso {
        checks.push(Check {
            name: "gVisor kernel",
            ok: gvisor_kernel,
            detail: format!(
                "the code sees kernel {release} ({version}); the host runs {}",
                if host_kernel.is_empty() {
                    "?"
                } else {
                    host_kernel
                }
            ),
        });
    }

    let (uid, gid) = (v["uid"].as_i64(), v["gid"].as_i64());
    checks.push(Check {
        name: "non-root uid",
        ok: uid.is_some_and(|u| u != 0) && gid.is_some_and(|g| g != 0),
        detail: format!("uid {}, gid {}", text(&v["uid"]), text(&v["gid"])),
    });

    // EROFS, not just any error: a non-root uid gets EACCES in root-owned directories of a
    // writable root too, and in a world-writable directory the write would succeed.
    let r = &v["rofs"];
    let root_owned = v["rofs_root_owned"].as_object();
    // gVisor checks permissions before the mount's read-only flag: EACCES there for a
    // non-root uid, and only the world-writable directory tells (EROFS, or created).
    let all_erofs = root_owned.is_some_and(|m| {
        !m.is_empty()
            && m.values()
                .all(|e| e == "EROFS" || (gvisor && e == "EACCES"))
    });
    checks.push(Check {
        name: "read-only root",
        ok: r["dir"].is_string() && r["result"] == "EROFS" && all_erofs,
        detail: match r["dir"].as_str() {
            None => "no world-writable directory on the root filesystem to test with \
                     (the image needs one, e.g. /var/tmp mode 1777)"
                .to_string(),
            Some(d) => format!(
                "creating a file in {d} (mode {}, root filesystem): {}; in {}",
                text(&r["mode"]),
                text(&r["result"]),
                root_owned
                    .map(|m| m
                        .iter()
                        .map(|(k, e)| format!("{k}: {}", text(e)))
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_else(|| "?".into())
            ),
        },
    });

    let status = &v["status"];
    let zero = |k: &str| {
        status[k]
            .as_str()
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            == Some(0)
    };
    // CapBnd is the telling one: CapEff is 0 for any non-root uid whatever was dropped,
    // the bounding set is empty only when `cap_drop ALL` applied. gVisor has no CapAmb line.
    checks.push(Check {
        name: "no capabilities",
        ok: ["CapBnd", "CapEff", "CapPrm", "CapAmb", "CapInh"]
            .iter()
            .all(|k| zero(k) || (gvisor && *k == "CapAmb" && status[*k].is_null())),
        detail: format!(
            "CapBnd {} CapEff {} CapPrm {} CapAmb {}",
            text(&status["CapBnd"]),
            text(&status["CapEff"]),
            text(&status["CapPrm"]),
            text(&status["CapAmb"])
        ),
    });
    // prctl(PR_GET_NO_NEW_PRIVS) where the probe could call it, else /proc's line.
    let nnp = &v["prctl"]["no_new_privs"];
    checks.push(Check {
        name: "no-new-privileges",
        ok: if nnp.is_null() {
            status["NoNewPrivs"] == "1"
        } else {
            nnp == 1
        },
        detail: format!(
            "NoNewPrivs {}, prctl(PR_GET_NO_NEW_PRIVS) {}",
            text(&status["NoNewPrivs"]),
            text(nnp)
        ),
    });
    checks.push(if gvisor {
        // Docker's seccomp profile is not loaded inside gVisor (runsc --oci-seccomp would,
        // but with Docker 20.10's profile no thread can start): the code's system calls are
        // served by gVisor's kernel, and runsc confines its own calls to the host with a
        // seccomp filter of its own. The evidence is the kernel the code sees.
        Check {
            name: "seccomp filter",
            ok: gvisor_kernel,
            detail: format!(
                "Seccomp {} inside; system calls served by {} (runsc filters its own host calls)",
                text(&status["Seccomp"]),
                if gvisor_kernel {
                    "gVisor's kernel"
                } else {
                    "NOT gVisor's kernel"
                }
            ),
        }
    } else {
        Check {
            name: "seccomp filter",
            ok: status["Seccomp"] == "2",
            detail: format!("Seccomp {} (2: filtering)", text(&status["Seccomp"])),
        }
    });

    let only_lo = v["ifaces"] == serde_json::json!(["lo"]) && v["routes"] == 0;
    checks.push(Check {
        name: "network unreachable",
        ok: only_lo,
        detail: format!("interfaces {}, routes {}", v["ifaces"], v["routes"]),
    });
    // ENETUNREACH, not a timeout: a timeout only says nothing answered in time. gVisor's
    // network stack says EHOSTUNREACH for the same (no route).
    let connects = v["connect"].as_object();
    checks.push(Check {
        name: "no outbound connections",
        ok: connects.is_some_and(|m| {
            !m.is_empty()
                && m.values()
                    .all(|e| e == "ENETUNREACH" || (gvisor && e == "EHOSTUNREACH"))
        }),
        detail: connects
            .map(|m| {
                m.iter()
                    .map(|(k, e)| format!("{k}: {}", text(e)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "?".into()),
    });

    let nofile = [v["nofile"][0].as_u64(), v["nofile"][1].as_u64()];
    checks.push(Check {
        name: "nofile limit",
        ok: nofile == [Some(l.nofile), Some(l.nofile)],
        detail: format!(
            "RLIMIT_NOFILE {}/{} (configured {})",
            text(&v["nofile"][0]),
            text(&v["nofile"][1]),
            l.nofile
        ),
    });

    let cpu = &v["cpu"];
    if gvisor && cpu["source"].is_null() {
        checks.extend(gvisor_limits(v, l));
        return checks;
    }
    let cores = match (cpu["quota"].as_f64(), cpu["period"].as_f64()) {
        (Some(q), Some(p)) if p > 0.0 => Some(q / p),
        _ => None,
    };
    checks.push(Check {
        name: "cpu quota",
        ok: cores.is_some_and(|c| (c - l.cpus).abs() < 0.01),
        detail: match (cpu["source"].as_str(), cores) {
            (None, _) => "no CPU controller readable in the sandbox".to_string(),
            (Some(src), None) => format!("{src}: no quota (configured {} cores)", l.cpus),
            (Some(src), Some(c)) => format!(
                "{src}: {} / {} = {c} cores (configured {})",
                text(&cpu["quota"]),
                text(&cpu["period"]),
                l.cpus
            ),
        },
    });
    checks.push(swap_check(&v["memory"], l.memory_bytes));
    checks
}

/// The memory and CPU checks under gVisor, which shows no cgroup files inside: the host's
/// cgroup holds the whole sandbox (gVisor's kernel and the code). runsc sizes the kernel's
/// memory from that cgroup's limit, so `MemTotal` is the limit when it applied and the
/// host's memory when not; the memory bomb check shows it enforced. The CPU quota has no
/// trace inside gVisor, so it is measured: two busy processes must get no more than the
/// quota (with room for gVisor's own accounting), where without one they get a core each.
fn gvisor_limits(v: &serde_json::Value, l: &Limits) -> Vec<Check> {
    let total = v["mem_total"].as_u64();
    let burn = &v["burn"];
    let cores = match (burn["cpu_s"].as_f64(), burn["wall_s"].as_f64()) {
        (Some(c), Some(w)) if w > 0.0 => Some(c / w),
        _ => None,
    };
    vec![
        Check {
            name: "memory limit",
            ok: total == Some(l.memory_bytes),
            detail: format!(
                "gVisor's MemTotal {} bytes (configured {}); swap is not visible inside gVisor",
                total.map(|t| t.to_string()).unwrap_or_else(|| "?".into()),
                l.memory_bytes
            ),
        },
        Check {
            name: "cpu quota",
            ok: cores.is_some_and(|c| c <= l.cpus * GVISOR_CPU_SLACK),
            detail: match cores {
                Some(c) => format!(
                    "measured (gVisor shows no cgroup files): two busy processes got {c:.2} \
                     cores (configured {}, at most {:.2} passes)",
                    l.cpus,
                    l.cpus * GVISOR_CPU_SLACK
                ),
                None => "no CPU measurement came back from the sandbox".to_string(),
            },
        },
    ]
}

/// How far above the quota a measured share may go under gVisor (its accounting and the
/// quota's period granularity: 0.62 cores were seen under a quota of 0.5).
const GVISOR_CPU_SLACK: f64 = 1.6;

/// Memory with no swap on top: memory.memsw.limit_in_bytes equal to the memory limit (cgroup
/// v1) or memory.swap.max 0 (v2). Where neither is readable (swap accounting off), only a
/// host without swap passes, and the memory bomb check is all that covers memory.
fn swap_check(m: &serde_json::Value, memory: u64) -> Check {
    let name = "no swap beyond memory";
    let limit = m["limit"].as_str().and_then(|s| s.parse::<u64>().ok());
    let swap = m["swap"].as_str();
    let host_swap = m["host_swap"].as_u64();
    match (m["cgroup"].as_u64(), swap) {
        (Some(1), Some(s)) => Check {
            name,
            ok: limit == Some(memory) && s.parse::<u64>().ok() == Some(memory),
            detail: format!(
                "cgroup v1: memory.limit_in_bytes {}, memory.memsw.limit_in_bytes {s} (configured {memory})",
                limit.map(|l| l.to_string()).unwrap_or_else(|| "?".into())
            ),
        },
        (Some(2), Some(s)) => Check {
            name,
            ok: limit == Some(memory) && s == "0",
            detail: format!(
                "cgroup v2: memory.max {}, memory.swap.max {s} (configured {memory}, swap 0)",
                limit.map(|l| l.to_string()).unwrap_or_else(|| "?".into())
            ),
        },
        _ => Check {
            name,
            ok: host_swap == Some(0) && limit == Some(memory),
            detail: format!(
                "the swap limit is not readable in the sandbox (swap accounting off?); host swap {} bytes: {}",
                host_swap.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
                if host_swap == Some(0) {
                    "none to use; only the memory bomb check covers memory"
                } else {
                    "the sandbox may swap beyond its memory limit (enable swap accounting: swapaccount=1 or cgroup v2)"
                }
            ),
        },
    }
}

fn describe(r: Result<crate::job::Outcome, crate::backend::BackendError>) -> String {
    match r {
        Ok(o) => format!("{}: {}", o.status_line(), o.stderr_text().trim()),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
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
            "burn": {"cpu_s": 0.62, "wall_s": 1.0},
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
            ("/burn", "cpu_s", json!(1.9), &["cpu quota"]),
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
        let v2 = |swap: &str| json!({"cgroup": 2, "limit": "134217728", "swap": swap, "host_swap": 1 << 30});
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
}
