//! Code mode's counters: the calls from sandboxed code to upstream MCP servers, counted
//! where they are made. The core's metrics (`app::metrics`) render them with the rest;
//! code mode does not reach up into the core.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Upper bounds (seconds) of code mode's tool-call latency histogram.
pub const TOOL_LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// Code mode's calls from sandboxed code to upstream MCP servers (#26): by tenant,
/// upstream, tool and outcome, and their latency by tenant and upstream. Process-wide
/// (code mode's upstream clients are the process's: `crate::codemode`), rendered with
/// every `app::Metrics::render`.
#[derive(Debug, Default)]
pub struct ToolCalls {
    c: Mutex<ToolCounters>,
}

/// What [`ToolCalls`] has counted.
#[derive(Clone, Debug, Default)]
pub struct ToolCounters {
    /// Calls by tenant, upstream, tool and outcome.
    pub calls: BTreeMap<(String, String, String, &'static str), u64>,
    /// Latency histograms by tenant and upstream: the buckets, the count, the sum.
    pub latency: BTreeMap<(String, String), ([u64; TOOL_LATENCY_BUCKETS.len()], u64, f64)>,
}

/// The process's [`ToolCalls`].
pub fn tool_calls() -> &'static ToolCalls {
    static CALLS: std::sync::OnceLock<ToolCalls> = std::sync::OnceLock::new();
    CALLS.get_or_init(ToolCalls::default)
}

impl ToolCalls {
    /// A call of `tenant`'s code to `tool` of `upstream` ended with `outcome` (`ok`,
    /// `ToolError`, `ToolDenied`, `ToolTimeout`, `BudgetExceeded`, `cancelled`) after `secs`.
    pub fn call(&self, tenant: &str, upstream: &str, tool: &str, outcome: &'static str, secs: f64) {
        let mut c = self.c.lock().unwrap_or_else(|e| e.into_inner());
        *c.calls
            .entry((tenant.into(), upstream.into(), tool.into(), outcome))
            .or_default() += 1;
        let h = c
            .latency
            .entry((tenant.into(), upstream.into()))
            .or_insert(([0; TOOL_LATENCY_BUCKETS.len()], 0, 0.0));
        for (b, le) in h.0.iter_mut().zip(TOOL_LATENCY_BUCKETS) {
            if secs <= le {
                *b += 1;
            }
        }
        h.1 += 1;
        h.2 += secs;
    }

    /// A copy of what was counted, for rendering.
    pub fn counters(&self) -> ToolCounters {
        self.c.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
