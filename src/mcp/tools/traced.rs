//! The trace of a `tools/call`: its server span (OpenTelemetry's MCP conventions: name
//! `tools/call {tool}`, `mcp.method.name`, `gen_ai.tool.name`, `gen_ai.operation.name`,
//! `jsonrpc.request.id`, `error.type` = `tool_error` for a result with `isError`), a child
//! of the caller's `traceparent`: the one a peer replica set on a request it forwarded,
//! else the request's `_meta` (MCP 2026-07-28), else the HTTP header.

use rmcp::model::{CallToolRequestParams, CallToolResponse};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use crate::mcp::transports::http::route::FromPeer;
use crate::telemetry::{self, Kind, Span};

/// The span of one `tools/call` of `tenant`, on `tracer`.
pub(super) fn root(
    tracer: &telemetry::Tracer,
    tenant: &str,
    request: &CallToolRequestParams,
    ctx: &RequestContext<RoleServer>,
) -> Span {
    if tracer.is_none() {
        return Span::off();
    }
    let tool = request.name.to_string();
    Span::root(
        tracer.as_ref(),
        format!("tools/call {tool}"),
        Kind::Server,
        parent(ctx),
    )
    .with("mcp.method.name", "tools/call")
    .with("gen_ai.operation.name", "execute_tool")
    .with("gen_ai.tool.name", tool)
    .with("jsonrpc.request.id", request_id(ctx))
    .with("mcp_executor.tenant", tenant)
}

/// The span of one request of `method` other than `tools/call` (`tasks/get`,
/// `resources/read`, ...): named after the method, as MCP's conventions say.
pub(super) fn request(
    tracer: &telemetry::Tracer,
    tenant: &str,
    method: &'static str,
    ctx: &RequestContext<RoleServer>,
) -> Span {
    if tracer.is_none() {
        return Span::off();
    }
    Span::root(
        tracer.as_ref(),
        method.to_string(),
        Kind::Server,
        parent(ctx),
    )
    .with("mcp.method.name", method)
    .with("jsonrpc.request.id", request_id(ctx))
    .with("mcp_executor.tenant", tenant)
}

/// The caller's trace context: the one a peer replica set on a request it forwarded, else
/// the request's `_meta`, else the HTTP header.
fn parent(ctx: &RequestContext<RoleServer>) -> Option<telemetry::TraceContext> {
    let parts = ctx.extensions.get::<axum::http::request::Parts>();
    let header = parts
        .and_then(|p| p.headers.get("traceparent"))
        .and_then(|v| v.to_str().ok());
    let from_peer = parts.is_some_and(|p| p.extensions.get::<FromPeer>().is_some());
    let meta = ctx.meta.get_traceparent();
    if from_peer {
        telemetry::parent_of([header, meta])
    } else {
        telemetry::parent_of([meta, header])
    }
}

/// Mark `span` failed when the request was answered with a protocol error.
pub(super) fn answered<T>(span: &mut Span, r: &Result<T, ErrorData>) {
    if let Err(e) = r {
        span.set("rpc.response.status_code", e.code.0.to_string());
        span.fail("jsonrpc_error");
    }
}

/// Mark `span` with how the call ended.
pub(super) fn ended(span: &mut Span, r: &Result<CallToolResponse, ErrorData>) {
    match r {
        Ok(CallToolResponse::Complete(c)) if c.is_error == Some(true) => span.fail("tool_error"),
        r => answered(span, r),
    }
}

fn request_id(ctx: &RequestContext<RoleServer>) -> String {
    match serde_json::to_value(&ctx.id) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::new(),
    }
}
