//! The span of a request forwarded to another replica: an HTTP client span (OpenTelemetry's
//! HTTP conventions: name `POST`, `http.request.method`, `server.address`, `server.port`,
//! `http.response.status_code`) in the caller's trace (the request's `_meta.traceparent`,
//! else its header), whose `traceparent` the forwarded request carries in its header: the
//! owner's spans are its children.

use axum::http::request::Parts;
use serde::Deserialize;

use crate::cluster::Peer;
use crate::telemetry::{self, Kind, Span};

#[derive(Deserialize, Default)]
struct Message {
    #[serde(default)]
    params: Params,
}

#[derive(Deserialize, Default)]
struct Params {
    #[serde(rename = "_meta", default)]
    meta: Meta,
}

#[derive(Deserialize, Default)]
struct Meta {
    traceparent: Option<String>,
}

/// The span of forwarding `parts` + `body` to `peer` (off when traces are).
pub(super) fn forward(tracer: &telemetry::Tracer, parts: &Parts, body: &[u8], peer: &Peer) -> Span {
    if tracer.is_none() {
        return Span::off();
    }
    let m: Message = serde_json::from_slice(body).unwrap_or_default();
    let header = parts
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok());
    let parent = telemetry::parent_of([m.params.meta.traceparent.as_deref(), header]);
    let (host, port) = host_port(&peer.base);
    Span::root(
        tracer.as_ref(),
        parts.method.to_string(),
        Kind::Client,
        parent,
    )
    .with("http.request.method", parts.method.to_string())
    .with("server.address", host)
    .with("server.port", port)
    .with("mcp_executor.replica", peer.id.clone())
}

/// Host and port of `http://HOST:PORT`.
fn host_port(base: &str) -> (String, i64) {
    let rest = base.split_once("://").map_or(base, |(_, r)| r);
    let rest = rest.split('/').next().unwrap_or(rest);
    match rest.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.parse().unwrap_or(80)),
        None => (rest.to_string(), 80),
    }
}
