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

mod evaluate;

use evaluate::evaluate;

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
const PROBE: &str = include_str!("probe.py");

/// How many times the memory bomb may run under gVisor before its check fails (see
/// [`diagnose`]).
const OOM_TRIES: u32 = 3;

/// Where gVisor hides the CPU quota, what busy loops achieve under it (`burn.py`).
const BURN: &str = include_str!("burn.py");

/// How many times the burn may run before a CPU share over the quota counts: each one
/// takes about three seconds under gVisor, and only a measurement over the quota is
/// followed by another.
const BURN_TRIES: usize = 4;

/// The burn's limits: the probe's CPU quota, with room in memory for its processes.
fn burn_limits(cpus: f64) -> Limits {
    Limits {
        cpus,
        memory_bytes: 512 << 20,
        ..probe_limits()
    }
}

/// The burn under `applied` cores, run again while it measures over `judged` cores (and
/// the slack), up to [`BURN_TRIES`] in all: the lowest report. One measurement on a busy
/// host can overstate the share (0.75-1.10 cores of 0.5 seen while the test suite ran,
/// 0.50-0.64 measured again; twice 0.86 in a row once, at load 8 and more); a quota not
/// enforced measures over it every time.
async fn lowest_burn(backend: &dyn Backend, applied: f64, judged: f64) -> serde_json::Value {
    let over = |c: Option<f64>| c.is_some_and(|c| c > judged * evaluate::GVISOR_CPU_SLACK);
    let mut report = burn(backend, applied).await;
    let mut best = evaluate::burn_cores(&report);
    for _ in 1..BURN_TRIES {
        if !over(best) {
            break;
        }
        let again = burn(backend, applied).await;
        let cores = evaluate::burn_cores(&again);
        if cores.is_some_and(|c| best.is_none_or(|b| c < b)) {
            best = cores;
            report = again;
        }
    }
    report
}

/// Run the burn under `cpus` cores: its report, or what went wrong in its place.
async fn burn(backend: &dyn Backend, cpus: f64) -> serde_json::Value {
    match backend
        .run(JobSpec::python(BURN, burn_limits(cpus)), None)
        .await
    {
        Ok(o) if o.success() => serde_json::from_slice(&o.stdout).unwrap_or_default(),
        other => serde_json::json!({ "error": describe(other) }),
    }
}

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
    let (probe, mut oom, fork) = tokio::join!(
        backend.run(JobSpec::python(PROBE, limits.clone()), None),
        backend.run(JobSpec::python(MEMORY_BOMB, small.clone()), None),
        backend.run(JobSpec::python(FORK_BOMB, fork_limits(&small)), None),
    );

    match probe {
        Ok(o) if o.success() => {
            let mut v: serde_json::Value =
                serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
            if evaluate::cpu_hidden(&isolation) {
                // Alone, after the others: their load would only lower what it measures.
                v["burn"] = lowest_burn(backend, limits.cpus, limits.cpus).await;
            }
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
    // Under gVisor the host's OOM killer ends the whole sandbox, and Docker now and then
    // does not flag it (about 1 run in 35 here): the bomb then ends by SIGKILL without a
    // report, which a missing limit never gives. Ask again rather than refuse to serve by
    // chance; a sandbox without the limit prints the string's length every time.
    let mut tries = 1;
    while isolation != Isolation::HostKernel
        && tries < OOM_TRIES
        && !matches!(&oom, Ok(o) if o.oom_killed || o.success())
    {
        tries += 1;
        oom = backend
            .run(JobSpec::python(MEMORY_BOMB, small.clone()), None)
            .await;
    }
    let tried = if tries > 1 {
        format!(" (flagged on try {tries} of {OOM_TRIES})")
    } else {
        String::new()
    };
    checks.push(match oom {
        Ok(o) => Check {
            name: "memory bomb OOM-killed",
            ok: o.oom_killed,
            detail: format!(
                "1 GiB string under a 128 MiB limit: {}{tried}",
                o.status_line()
            ),
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

/// The CPU-quota check alone (measured as `doctor` does, again while over), with the probe
/// run under `applied` cores but judged against the probe's own quota: what `doctor` concludes when the backend applies another quota than
/// the one asked for (with all the host's cores, in effect none). It shows the check can fail.
pub async fn cpu_quota_check(backend: &dyn Backend, applied: f64) -> Check {
    let limits = probe_limits();
    let v = serde_json::json!({ "burn": lowest_burn(backend, applied, limits.cpus).await });
    let check = evaluate::gvisor_limits(&v, &limits)
        .into_iter()
        .find(|c| c.name == "cpu quota");
    check.expect("gvisor_limits makes a cpu quota check")
}

fn describe(r: Result<crate::job::Outcome, crate::backend::BackendError>) -> String {
    match r {
        Ok(o) => format!("{}: {}", o.status_line(), o.stderr_text().trim()),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests;
