//! Prometheus metrics, in the text exposition format: runs by tenant and outcome, run
//! latency, refusals, installs, and gauges of the queue, the pool and live containers.
//! A handful of counters under one lock: not worth a metrics crate.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use crate::codemode::metrics::{tool_calls, ToolCalls, TOOL_LATENCY_BUCKETS};
use crate::egress::metrics::{egress, Egress};
use crate::job::Outcome;

/// Upper bounds (seconds) of the run-latency histogram.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// How a run ended, as a label value.
pub fn outcome_label(o: &Outcome) -> &'static str {
    if o.timed_out {
        "timeout"
    } else if o.oom_killed {
        "oom"
    } else if o.exit_code == Some(0) {
        "ok"
    } else if o.signal.is_some() {
        "killed"
    } else {
        "error"
    }
}

#[derive(Debug, Default, Clone)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (b, le) in self.buckets.iter_mut().zip(LATENCY_BUCKETS) {
            if secs <= le {
                *b += 1;
            }
        }
        self.count += 1;
        self.sum += secs;
    }
}

#[derive(Debug, Default)]
struct Counters {
    runs: BTreeMap<(String, &'static str), u64>,
    latency: BTreeMap<String, Histogram>,
    queue_wait: BTreeMap<String, Histogram>,
    rejected: BTreeMap<(String, &'static str), u64>,
    installs: BTreeMap<(String, &'static str), u64>,
}

/// Gauges read when the metrics are scraped.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    pub runs_going: usize,
    pub queue_waiting: usize,
    pub run_slots: usize,
    pub pool_ready: usize,
    pub pool_target: usize,
    pub live_containers: usize,
    /// Open execute_python sessions, by tenant.
    pub sessions: Vec<(String, usize)>,
}

/// The server's counters.
#[derive(Debug, Default)]
pub struct Metrics {
    c: Mutex<Counters>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.c.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A run of `tenant` ended with `outcome` (`ok`, `error`, `timeout`, `oom`, `killed`, or
    /// `failed`/`cancelled` when there was no outcome) after `secs`.
    pub fn run(&self, tenant: &str, outcome: &'static str, secs: f64) {
        let mut c = self.lock();
        *c.runs.entry((tenant.to_string(), outcome)).or_default() += 1;
        c.latency
            .entry(tenant.to_string())
            .or_default()
            .observe(secs);
    }

    /// A call of `tenant` waited `secs` for its run slot (its environment and memory too).
    pub fn queue_wait(&self, tenant: &str, secs: f64) {
        self.lock()
            .queue_wait
            .entry(tenant.to_string())
            .or_default()
            .observe(secs);
    }

    /// A call of `tenant` was refused before any container existed, for `reason`
    /// (`rate`, `queue_full`, `storage`, `memory`, `tasks`).
    pub fn rejected(&self, tenant: &str, reason: &'static str) {
        *self
            .lock()
            .rejected
            .entry((tenant.to_string(), reason))
            .or_default() += 1;
    }

    /// An install of `tenant` ended (`ok`, `failed`, `refused`).
    pub fn install(&self, tenant: &str, result: &'static str) {
        *self
            .lock()
            .installs
            .entry((tenant.to_string(), result))
            .or_default() += 1;
    }

    /// Everything, in the Prometheus text format (version 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let c = self.lock();
        let mut out = String::new();
        counter(
            &mut out,
            "mcp_executor_runs_total",
            "Runs by tenant and outcome (ok, error, timeout, oom, killed, failed, cancelled).",
            "outcome",
            &c.runs,
        );
        family(
            &mut out,
            "mcp_executor_run_duration_seconds",
            "histogram",
            "Wall time of runs from the call to the result, queueing included.",
        );
        histograms(&mut out, "mcp_executor_run_duration_seconds", &c.latency);
        family(
            &mut out,
            "mcp_executor_queue_wait_seconds",
            "histogram",
            "Time runs and cells waited for a run slot (their environment and memory too), by tenant.",
        );
        histograms(&mut out, "mcp_executor_queue_wait_seconds", &c.queue_wait);
        counter(
            &mut out,
            "mcp_executor_rejected_total",
            "Calls refused before a container existed, by tenant and reason (rate, queue_full, storage, memory, tasks).",
            "reason",
            &c.rejected,
        );
        counter(
            &mut out,
            "mcp_executor_installs_total",
            "install_dependencies calls by tenant and result (ok, failed, refused).",
            "result",
            &c.installs,
        );
        drop(c);
        for (name, help, v) in [
            (
                "mcp_executor_runs_in_progress",
                "Runs holding a run slot.",
                g.runs_going,
            ),
            (
                "mcp_executor_queue_depth",
                "Calls waiting to run (for a run slot, the memory budget or an environment).",
                g.queue_waiting,
            ),
            ("mcp_executor_run_slots", "Run slots in all.", g.run_slots),
            (
                "mcp_executor_pool_ready",
                "Warm sandboxes waiting for a run.",
                g.pool_ready,
            ),
            (
                "mcp_executor_pool_target",
                "Warm sandboxes the pool aims at.",
                g.pool_target,
            ),
            (
                "mcp_executor_live_containers",
                "Sandbox containers of this server not removed yet.",
                g.live_containers,
            ),
        ] {
            family(&mut out, name, "gauge", help);
            let _ = writeln!(out, "{name} {v}");
        }
        family(
            &mut out,
            "mcp_executor_sessions",
            "gauge",
            "Open execute_python sessions by tenant.",
        );
        for (tenant, n) in &g.sessions {
            let _ = writeln!(
                out,
                "mcp_executor_sessions{{tenant=\"{}\"}} {n}",
                escape(tenant)
            );
        }
        tool_calls().render(&mut out);
        render_egress(egress(), &mut out);
        super::health_metrics::render(&mut out);
        out
    }
}

/// The lines of one histogram per tenant.
fn histograms(out: &mut String, name: &str, by_tenant: &BTreeMap<String, Histogram>) {
    for (tenant, h) in by_tenant {
        let t = escape(tenant);
        for (le, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
            let _ = writeln!(out, "{name}_bucket{{tenant=\"{t}\",le=\"{le}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{tenant=\"{t}\",le=\"+Inf\"}} {}",
            h.count
        );
        let _ = writeln!(out, "{name}_sum{{tenant=\"{t}\"}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{tenant=\"{t}\"}} {}", h.count);
    }
}

impl ToolCalls {
    /// Code mode's counters ([`crate::codemode::metrics`]) in the text format.
    fn render(&self, out: &mut String) {
        let c = self.counters();
        let name = "mcp_executor_tool_calls_total";
        family(
            out,
            name,
            "counter",
            "Code mode: calls from sandboxed code to upstream MCP servers, by tenant, upstream, tool and outcome (ok, ToolError, ToolDenied, ToolTimeout, BudgetExceeded, cancelled).",
        );
        for ((tenant, upstream, tool, outcome), n) in &c.calls {
            let _ = writeln!(
                out,
                "{name}{{tenant=\"{}\",upstream=\"{}\",tool=\"{}\",outcome=\"{outcome}\"}} {n}",
                escape(tenant),
                escape(upstream),
                escape(tool)
            );
        }
        let name = "mcp_executor_tool_call_duration_seconds";
        family(
            out,
            name,
            "histogram",
            "Code mode: wall time of calls to upstream MCP servers as this server saw them (policy checks, the upstream's answer), by tenant and upstream.",
        );
        for ((tenant, upstream), (buckets, count, sum)) in &c.latency {
            let l = format!(
                "tenant=\"{}\",upstream=\"{}\"",
                escape(tenant),
                escape(upstream)
            );
            for (le, n) in TOOL_LATENCY_BUCKETS.iter().zip(buckets) {
                let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_sum{{{l}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{l}}} {count}");
        }
    }
}

/// The egress proxy's counters ([`crate::egress::metrics`]) in the text format.
fn render_egress(e: &Egress, out: &mut String) {
    let c = e.counters();
    let name = "mcp_executor_egress_connections_total";
    family(
        out,
        name,
        "counter",
        "Egress: connections from sandboxed code through the proxy, by tenant, the rule that allowed them (- for none) and outcome.",
    );
    for ((tenant, host, outcome), n) in &c.connections {
        let _ = writeln!(
            out,
            "{name}{{tenant=\"{}\",host=\"{}\",outcome=\"{outcome}\"}} {n}",
            escape(tenant),
            escape(host)
        );
    }
    counter(
        out,
        "mcp_executor_egress_bytes_total",
        "Egress: bytes through the proxy by tenant and direction (up: sent upstream, down: received).",
        "direction",
        &c.bytes,
    );
    counter(
        out,
        "mcp_executor_egress_streams_total",
        "Egress: connections of sandboxed code handed to the proxy, by tenant and the channel they came by (socket: the sandbox's own Unix socket; relay: the runner's stdin/stdout).",
        "channel",
        &c.streams,
    );
}

/// A counter family labelled by tenant and one more label.
fn counter(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    values: &BTreeMap<(String, &'static str), u64>,
) {
    family(out, name, "counter", help);
    for ((tenant, value), n) in values {
        let _ = writeln!(
            out,
            "{name}{{tenant=\"{}\",{label}=\"{value}\"}} {n}",
            escape(tenant)
        );
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let m = Metrics::default();
        m.run("alice", "ok", 0.2);
        m.run("alice", "ok", 3.0);
        m.run("bob", "timeout", 31.0);
        m.rejected("bob", "rate");
        m.install("alice", "ok");
        let text = m.render(&Gauges {
            runs_going: 1,
            queue_waiting: 3,
            run_slots: 4,
            pool_ready: 2,
            pool_target: 2,
            live_containers: 3,
            sessions: vec![("alice".into(), 1)],
        });
        for line in [
            "mcp_executor_runs_total{tenant=\"alice\",outcome=\"ok\"} 2",
            "mcp_executor_runs_total{tenant=\"bob\",outcome=\"timeout\"} 1",
            "mcp_executor_run_duration_seconds_bucket{tenant=\"alice\",le=\"0.25\"} 1",
            "mcp_executor_run_duration_seconds_bucket{tenant=\"alice\",le=\"5\"} 2",
            "mcp_executor_run_duration_seconds_bucket{tenant=\"bob\",le=\"30\"} 0",
            "mcp_executor_run_duration_seconds_bucket{tenant=\"bob\",le=\"+Inf\"} 1",
            "mcp_executor_run_duration_seconds_count{tenant=\"alice\"} 2",
            "mcp_executor_rejected_total{tenant=\"bob\",reason=\"rate\"} 1",
            "mcp_executor_installs_total{tenant=\"alice\",result=\"ok\"} 1",
            "mcp_executor_queue_depth 3",
            "mcp_executor_live_containers 3",
            "mcp_executor_sessions{tenant=\"alice\"} 1",
            "# TYPE mcp_executor_run_duration_seconds histogram",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn renders_egress() {
        let e = Egress::default();
        e.connection("alice", "data.example.test", "ok", 10, 2000);
        e.connection("alice", "data.example.test", "ok", 5, 1);
        e.connection("alice", "-", "not_in_policy", 0, 0);
        e.stream("alice", "socket");
        let mut text = String::new();
        render_egress(&e, &mut text);
        for line in [
            "# TYPE mcp_executor_egress_connections_total counter",
            "mcp_executor_egress_connections_total{tenant=\"alice\",host=\"data.example.test\",outcome=\"ok\"} 2",
            "mcp_executor_egress_connections_total{tenant=\"alice\",host=\"-\",outcome=\"not_in_policy\"} 1",
            "mcp_executor_egress_bytes_total{tenant=\"alice\",direction=\"up\"} 15",
            "mcp_executor_egress_bytes_total{tenant=\"alice\",direction=\"down\"} 2001",
            "mcp_executor_egress_streams_total{tenant=\"alice\",channel=\"socket\"} 1",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
    }

    #[test]
    fn renders_code_mode_tool_calls() {
        let t = ToolCalls::default();
        t.call("alice", "everything", "get-sum", "ok", 0.003);
        t.call("alice", "everything", "get-sum", "ok", 0.02);
        t.call("alice", "everything", "echo", "ToolDenied", 0.0001);
        let mut text = String::new();
        t.render(&mut text);
        for line in [
            "# TYPE mcp_executor_tool_calls_total counter",
            "mcp_executor_tool_calls_total{tenant=\"alice\",upstream=\"everything\",tool=\"get-sum\",outcome=\"ok\"} 2",
            "mcp_executor_tool_calls_total{tenant=\"alice\",upstream=\"everything\",tool=\"echo\",outcome=\"ToolDenied\"} 1",
            "# TYPE mcp_executor_tool_call_duration_seconds histogram",
            "mcp_executor_tool_call_duration_seconds_bucket{tenant=\"alice\",upstream=\"everything\",le=\"0.001\"} 1",
            "mcp_executor_tool_call_duration_seconds_bucket{tenant=\"alice\",upstream=\"everything\",le=\"0.005\"} 2",
            "mcp_executor_tool_call_duration_seconds_bucket{tenant=\"alice\",upstream=\"everything\",le=\"+Inf\"} 3",
            "mcp_executor_tool_call_duration_seconds_count{tenant=\"alice\",upstream=\"everything\"} 3",
        ] {
            assert!(text.contains(line), "missing `{line}` in:\n{text}");
        }
    }
}
