//! The tracker's lines of `/metrics`: connections, streams, unread result bytes and the
//! clients dropped for not reading them.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Tracker;

impl Tracker {
    /// Prometheus lines of the front.
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let (buffered, by_tenant) = self.buffered();
        let _ = writeln!(
            out,
            "# HELP mcp_http_connections Open HTTP connections (kind: mcp, health_only)."
        );
        let _ = writeln!(out, "# TYPE mcp_http_connections gauge");
        let _ = writeln!(
            out,
            "mcp_http_connections{{kind=\"mcp\"}} {}",
            self.mcp_conns.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "mcp_http_connections{{kind=\"health_only\"}} {}",
            self.health_conns.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP mcp_http_connections_refused_total Connections closed at once: both the MCP connections and the health reserve were full.");
        let _ = writeln!(out, "# TYPE mcp_http_connections_refused_total counter");
        let _ = writeln!(
            out,
            "mcp_http_connections_refused_total {}",
            g(&c.connections_refused)
        );
        let _ = writeln!(out, "# HELP mcp_http_connections_health_only_total Connections taken into the health reserve (MCP connections full).");
        let _ = writeln!(out, "# TYPE mcp_http_connections_health_only_total counter");
        let _ = writeln!(
            out,
            "mcp_http_connections_health_only_total {}",
            g(&c.connections_health_only)
        );
        let _ = writeln!(out, "# HELP mcp_http_streams Open MCP responses (requests in flight, SSE streams), by tenant.");
        let _ = writeln!(out, "# TYPE mcp_http_streams gauge");
        {
            let streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            let mut v: Vec<_> = streams.iter().collect();
            v.sort();
            for (t, n) in v {
                let _ = writeln!(out, "mcp_http_streams{{tenant=\"{t}\"}} {n}");
            }
        }
        let _ = writeln!(out, "# HELP mcp_http_streams_refused_total MCP requests refused with 429: too many open responses.");
        let _ = writeln!(out, "# TYPE mcp_http_streams_refused_total counter");
        let _ = writeln!(
            out,
            "mcp_http_streams_refused_total {}",
            g(&c.streams_refused)
        );
        let _ = writeln!(
            out,
            "# HELP mcp_http_body_timeouts_total Requests whose body did not arrive in time (408)."
        );
        let _ = writeln!(out, "# TYPE mcp_http_body_timeouts_total counter");
        let _ = writeln!(out, "mcp_http_body_timeouts_total {}", g(&c.body_timeouts));
        let _ = writeln!(
            out,
            "# HELP mcp_results_buffered_bytes Result bytes waiting for clients to read them."
        );
        let _ = writeln!(out, "# TYPE mcp_results_buffered_bytes gauge");
        let _ = writeln!(out, "mcp_results_buffered_bytes {buffered}");
        let mut v: Vec<_> = by_tenant.into_iter().collect();
        v.sort();
        for (t, n) in v {
            let _ = writeln!(out, "mcp_results_buffered_bytes{{tenant=\"{t}\"}} {n}");
        }
        let _ = writeln!(out, "# HELP mcp_clients_dropped_total Clients disconnected because they did not read their results.");
        let _ = writeln!(out, "# TYPE mcp_clients_dropped_total counter");
        let _ = writeln!(
            out,
            "mcp_clients_dropped_total{{reason=\"stalled\"}} {}",
            g(&c.clients_dropped_stalled)
        );
        let _ = writeln!(
            out,
            "mcp_clients_dropped_total{{reason=\"over_bound\"}} {}",
            g(&c.clients_dropped_over_bound)
        );
        let _ = writeln!(out, "# HELP mcp_results_dropped_bytes_total Unread result bytes discarded with those clients.");
        let _ = writeln!(out, "# TYPE mcp_results_dropped_bytes_total counter");
        let _ = writeln!(
            out,
            "mcp_results_dropped_bytes_total {}",
            g(&c.bytes_dropped)
        );
        out
    }
}
