//! Traces (OpenTelemetry, OTLP/HTTP with JSON bodies), off unless an endpoint is configured
//! ([`crate::config::traces`]). One trace per MCP `tools/call`, continuing the client's
//! (`traceparent` in the request's `_meta`, or the HTTP header), with spans for the queue,
//! taking a sandbox, the run, shaping the result, each code-mode upstream call, a forward to
//! another replica and an install. docs/hosting.md "Traces" lists them and their attributes.
//!
//! A leaf: it knows no MCP, backend or tenant. Hooks elsewhere are one line each, a guard
//! ([`span`]) that is a child of the request's span in scope ([`Span::scope`]).
//!
//! - `context`: W3C trace context (ids, `traceparent`).
//! - `record`: a finished span as plain data.
//! - `otlp`: its OTLP/JSON encoding.
//! - [`export`]: the bounded queue and the background sender (drops counted, sends timed
//!   out), never in a call's way.
//! - `span`: the guard and the task-local scope.

mod context;
pub mod export;
mod otlp;
mod record;
mod span;

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use context::TraceContext;
pub use export::Exporter;
pub use record::{Kind, Value};
pub use span::{carry, client_span, current_traceparent, span, Span};

/// The exporter of a server; `None`: traces are off.
pub type Tracer = Option<Arc<Exporter>>;

/// The exporter's counters in the Prometheus text format (nothing when traces are off).
pub fn render_metrics(tracer: &Tracer, out: &mut String) {
    let Some(e) = tracer else { return };
    let c = e.counts();
    for (name, help, v) in [
        (
            "mcp_executor_trace_spans_exported_total",
            "Trace spans the OTLP collector accepted.",
            c.exported.load(Ordering::Relaxed),
        ),
        (
            "mcp_executor_trace_spans_dropped_total",
            "Trace spans dropped: the export queue was full, or their batch could not be sent (collector slow, down or refusing).",
            c.dropped.load(Ordering::Relaxed),
        ),
        (
            "mcp_executor_trace_export_failures_total",
            "Batches of spans the OTLP collector did not take (an error status, a timeout, no connection).",
            c.failed_sends.load(Ordering::Relaxed),
        ),
    ] {
        let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n");
    }
}

/// The caller's trace context: the first valid `traceparent` of `candidates` (in order of
/// preference).
pub fn parent_of<'a>(
    candidates: impl IntoIterator<Item = Option<&'a str>>,
) -> Option<TraceContext> {
    candidates
        .into_iter()
        .flatten()
        .find_map(TraceContext::parse)
}
