//! Judging the probe's report: each check is one a sandbox without the matching piece of
//! hardening fails.

use super::{Check, Isolation, Limits, GVISOR_UNAME};

/// Judge the probe's report against the limits it ran with. Each check is one a sandbox
/// without the matching piece of hardening fails.
pub(super) fn evaluate(v: &serde_json::Value, l: &Limits, iso: &Isolation) -> Vec<Check> {
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
    if cpu_hidden(iso) {
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

/// Whether the CPU quota must be measured by the burn: always under gVisor, whose kernel
/// either shows no cgroup files (Debian's runsc of 2022-12-19) or shows cgroup files of its
/// own that do not carry the host's limits (runsc of 2024-07-29, from bookworm-backports:
/// `cpu.cfs_quota_us` -1 and a memory limit of 2^63-1 in a sandbox that has both limits).
pub(super) fn cpu_hidden(iso: &Isolation) -> bool {
    iso.gvisor()
}

/// The cores a CPU burn measured (`ran_s / wall_s`), if its report came back.
pub(super) fn burn_cores(burn: &serde_json::Value) -> Option<f64> {
    match (burn["ran_s"].as_f64(), burn["wall_s"].as_f64()) {
        (Some(c), Some(w)) if w > 0.0 => Some(c / w),
        _ => None,
    }
}

/// The memory and CPU checks under gVisor, whose cgroup files (where it has any) do not show
/// the host's limits: the host's cgroup holds the whole sandbox (gVisor's kernel and the
/// code). runsc sizes the kernel's memory from that cgroup's limit, so `MemTotal` is the limit when it applied and the
/// host's memory when not; the memory bomb check shows it enforced. The CPU quota has no
/// trace inside gVisor, so it is measured by what busy loops achieve (see `burn` in
/// `burn.py`: the CPU time gVisor reports counts throttled time as run): busy processes
/// must together progress no faster than the quota allows. A quota that is enforced never
/// fails this, however loaded the host; a missing one fails it unless the host is so busy
/// that the sandbox gets no more than the quota anyway.
pub(super) fn gvisor_limits(v: &serde_json::Value, l: &Limits) -> Vec<Check> {
    let total = v["mem_total"].as_u64();
    let burn = &v["burn"];
    let cores = burn_cores(burn);
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
                    "measured (no cgroup file inside gVisor shows the host's quota): {} busy \
                     processes ran for {c:.2} cores (configured {}, at most {:.2} passes)",
                    burn["procs"],
                    l.cpus,
                    l.cpus * GVISOR_CPU_SLACK
                ),
                None => format!(
                    "no CPU measurement came back from the sandbox: {}",
                    burn["error"].as_str().unwrap_or("no report")
                ),
            },
        },
    ]
}

/// How far above the quota the measured progress may go under gVisor: steps shorter than the
/// probe's 1 ms count as run though part of one may have been waited, and the quota of the
/// period the window starts in is whole (the loops slept before it). Under a 0.5-core quota
/// 0.41 to 0.62 cores were measured over a 1 s window on a two-core host, idle to load 15
/// (hence the 2 s window now); with no quota, 1.19 to 1.97 at load 5 and less (as little
/// as 0.5 at load 10 and more).
pub(super) const GVISOR_CPU_SLACK: f64 = 1.4;

/// Memory with no swap on top: memory.memsw.limit_in_bytes equal to the memory limit (cgroup
/// v1) or memory.swap.max 0 (v2). Where neither is readable (swap accounting off), only a
/// host without swap passes, and the memory bomb check is all that covers memory.
pub(super) fn swap_check(m: &serde_json::Value, memory: u64) -> Check {
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
