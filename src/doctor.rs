//! `doctor`: is the backend there, is the image there, and is isolation really enforced on
//! this host? Each check runs real code in a real sandbox; the server refuses to serve when
//! one fails.

use std::time::Duration;

use serde::Serialize;

use crate::job::{JobSpec, Limits};
use crate::sandbox::Sandbox;

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

const PROBE: &str = r#"
import json, os, errno
def rofs():
    try:
        open("/usr/lib/mcp-doctor-probe", "w")
        return "wrote to the root filesystem"
    except OSError as e:
        return "ok" if e.errno in (errno.EROFS, errno.EACCES) else str(e)
ifaces = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
routes = open("/proc/net/route").read().strip().splitlines()[1:]
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
print(json.dumps({"uid": os.getuid(), "rofs": rofs(), "ifaces": ifaces, "routes": len(routes), "caps": caps}))
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

/// Run every check against `sandbox`.
pub async fn diagnose(sandbox: &dyn Sandbox) -> Report {
    let mut checks = Vec::new();
    match sandbox.info().await {
        Ok(info) => {
            checks.push(Check {
                name: "docker reachable",
                ok: true,
                detail: info.version,
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
                name: "docker reachable",
                ok: false,
                detail: e.to_string(),
            });
            return Report { checks };
        }
    }

    let small = Limits {
        timeout: Duration::from_secs(20),
        memory_bytes: 128 << 20,
        pids: PIDS_FOR_TEST,
        ..Limits::default()
    };
    let (probe, oom, fork) = tokio::join!(
        sandbox.run(JobSpec::python(PROBE, small.clone()), None),
        sandbox.run(JobSpec::python(MEMORY_BOMB, small.clone()), None),
        sandbox.run(JobSpec::python(FORK_BOMB, small.clone()), None),
    );

    match probe {
        Ok(o) if o.success() => {
            let v: serde_json::Value =
                serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
            let uid = v["uid"].as_i64().unwrap_or(0);
            checks.push(Check {
                name: "python runs",
                ok: true,
                detail: format!("in {} ms", o.duration_ms),
            });
            checks.push(Check {
                name: "non-root uid",
                ok: uid != 0,
                detail: format!("uid {uid}"),
            });
            checks.push(Check {
                name: "read-only root",
                ok: v["rofs"] == "ok",
                detail: v["rofs"]
                    .as_str()
                    .unwrap_or("?")
                    .replace("ok", "writes refused"),
            });
            let only_lo = v["ifaces"] == serde_json::json!(["lo"]) && v["routes"] == 0;
            checks.push(Check {
                name: "network unreachable",
                ok: only_lo,
                detail: format!("interfaces {}, routes {}", v["ifaces"], v["routes"]),
            });
            let caps = v["caps"].as_str().unwrap_or("?");
            checks.push(Check {
                name: "no capabilities",
                ok: caps.trim_start_matches('0').is_empty(),
                detail: format!("CapEff {caps}"),
            });
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

fn describe(r: Result<crate::job::Outcome, crate::sandbox::SandboxError>) -> String {
    match r {
        Ok(o) => format!("{}: {}", o.status_line(), o.stderr_text().trim()),
        Err(e) => e.to_string(),
    }
}
