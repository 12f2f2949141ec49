//! The router: a request on a handle of another replica is sent whole to its owner, and the
//! owner's answer streamed back as it comes (SSE and cancellation included).
//!
//! Two steps, in this order:
//! - [`gate`], the outermost layer, reads only the request head: the replicas' own header
//!   (a wrong secret is refused, the header never reaches the MCP layer; the peer is marked
//!   [`FromPeer`] and served here), their `/internal/` path, and the protocol-session ids
//!   this replica wraps with its id ([`crate::ids`]).
//! - [`route`], called by the HTTP front only after the `Host` and `Origin` checks,
//!   authentication and the stream caps, with the body already read under the server's body
//!   rules (its limit, 413; `--body-timeout`, 408): nothing about a request is read, held or
//!   forwarded for a client the server would refuse.
//!
//! Where the request goes is one pure function, [`plan`]; a request on a handle of this
//! replica, or on none, is served here. A forwarded request waits for its answer as long as
//! the owner is alive: every [`PROBE_EVERY`] without an answer the owner is asked its id, and
//! one that does not say it within [`crate::cluster::peers::ASK_TIMEOUT`] ends the wait (504).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

mod answers;
pub mod handle;
mod traced;

use answers::{bad_gateway, draining_refusal, elsewhere, gone, silent};
use handle::{inspect, Handle};

use crate::cluster::{Cluster, Peer, FORWARDED, REPLICA_PATH};
use crate::ids;

/// How long a forwarded request waits for its answer before the owner is asked whether it
/// is alive (and again after each check it passes).
pub const PROBE_EVERY: Duration = Duration::from_secs(5);

const SESSION_HEADER: &str = "mcp-session-id";

/// Marks a request a peer forwarded here (its secret checked): served here, never
/// forwarded again.
#[derive(Debug, Clone, Copy)]
pub struct FromPeer;

/// The outer layer (see the module doc): the replicas' header and path, and the
/// protocol-session ids. Reads no body.
pub async fn gate(State(c): State<Arc<Cluster>>, mut request: Request, next: Next) -> Response {
    if let Some(shown) = request.headers().get(FORWARDED) {
        if !c.secret_ok(shown.as_bytes()) {
            tracing::warn!("refused: a request with a wrong replica secret");
            return (StatusCode::FORBIDDEN, "wrong replica secret\n").into_response();
        }
        request.headers_mut().remove(FORWARDED);
        if request.uri().path() == REPLICA_PATH {
            return axum::Json(json!({"id": ids::replica(), "draining": c.draining()}))
                .into_response();
        }
        request.extensions_mut().insert(FromPeer);
    } else if request.uri().path().starts_with("/internal/") {
        return StatusCode::NOT_FOUND.into_response();
    }
    local(request, next).await
}

/// Must the front [`route`] this request (it has peers or drains, and no peer sent it)?
pub fn wanted(c: &Cluster, request: &Request) -> bool {
    request.extensions().get::<FromPeer>().is_none() && (c.clustered() || c.draining())
}

/// Where [`route`] sent a request.
pub enum Routed {
    /// Serve it here (the request back, its body in it).
    Here(Request),
    /// Answered: by its owner (forwarded), or here for an owner that is gone or silent.
    Answered(Response),
}

/// Where a request goes, as [`plan`] decides.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Serve here.
    Here,
    /// To the replica that owns the handle.
    Owner(String, Handle),
    /// The protocol session is here but the body names another replica's state, which it
    /// cannot reach: answered here, "gone" when that replica is, else where the state is.
    ThroughProtocolSession(String, Handle),
    /// This replica drains: new work goes to another.
    Elsewhere,
}

/// The handle in the request head: the `Mcp-Session-Id` header, or `sessionId` in the query
/// of a legacy SSE `POST /messages`.
pub fn in_head(parts: &Parts) -> Option<Handle> {
    if let Some(v) = parts
        .headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        return Some(Handle::Protocol(v.to_string()));
    }
    if parts.uri.path() != crate::mcp::transports::paths::MESSAGES_PATH {
        return None;
    }
    parts
        .uri
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("sessionId=")))
        .map(|s| Handle::Protocol(s.to_string()))
}

/// Where a request goes: `head` is the handle of its head ([`in_head`]), `body` the one its
/// body names, `me` this replica; `new_work` says whether it would start something here
/// (a sessionless call, a new protocol session, a legacy SSE stream) while `draining`.
pub fn plan(
    head: Option<&Handle>,
    body: Option<&Handle>,
    me: &str,
    draining: bool,
    new_work: bool,
) -> Plan {
    let elsewhere = |h: &Handle| h.owner().filter(|o| o != me);
    if let Some(h) = head {
        if let Some(o) = elsewhere(h) {
            return Plan::Owner(o, h.clone());
        }
        // The protocol session is here; a session or task of another replica named in the
        // body cannot be served through it.
        return match body.filter(|b| !matches!(b, Handle::File(_))) {
            Some(b) => match elsewhere(b) {
                Some(o) => Plan::ThroughProtocolSession(o, b.clone()),
                None => Plan::Here,
            },
            None => Plan::Here,
        };
    }
    if let Some(b) = body {
        if let Some(o) = elsewhere(b) {
            return Plan::Owner(o, b.clone());
        }
        return Plan::Here;
    }
    if draining && new_work {
        return Plan::Elsewhere;
    }
    Plan::Here
}

/// Serve here, forward to the owner, or say the owner is gone. `body` was read by the
/// front under its body rules.
pub async fn route(
    c: &Cluster,
    tracer: &crate::telemetry::Tracer,
    parts: Parts,
    body: Bytes,
) -> Routed {
    let head = in_head(&parts);
    let mcp_post = parts.method == axum::http::Method::POST && parts.uri.path() == "/mcp";
    let (named, id, method) = if mcp_post {
        inspect(&body)
    } else {
        (None, Value::Null, String::new())
    };
    let p = plan(
        head.as_ref(),
        named.as_ref(),
        ids::replica(),
        c.draining(),
        takes_new_work(&parts),
    );
    let here = |parts, body| Routed::Here(Request::from_parts(parts, Body::from(body)));
    match p {
        Plan::Here => here(parts, body),
        Plan::Owner(owner, handle) => {
            match to_owner(
                c,
                tracer,
                &owner,
                &handle,
                (&id, &method),
                &parts,
                body.clone(),
            )
            .await
            {
                Some(answer) => Routed::Answered(answer),
                // A stored file outlives its replica where the storage is shared.
                None => here(parts, body),
            }
        }
        Plan::ThroughProtocolSession(owner, handle) => {
            Routed::Answered(match c.peers().find(&owner).await {
                Some(_) => elsewhere(&owner, &handle, &id, &method),
                None => owner_gone(c, &owner, &handle, &id, &method),
            })
        }
        Plan::Elsewhere => match c.peers().another().await {
            Some(peer) => Routed::Answered(match forward(c, tracer, &peer, &parts, body).await {
                Ok(r) => r,
                Err(Failure::Silent(waited)) => silent(&peer.id, &id, waited),
                Err(e) => bad_gateway(&peer.id, &id, &e.to_string()),
            }),
            None => Routed::Answered(draining_refusal(&id)),
        },
    }
}

/// A request that would start something new here: a sessionless MCP request, a new
/// protocol session, a legacy SSE stream.
fn takes_new_work(parts: &Parts) -> bool {
    let p = parts.uri.path();
    p == "/mcp" || p == "/sse"
}

/// Serve here: a protocol-session id this replica wrapped is unwrapped on the way in, and a
/// new one (as rmcp mints it) wrapped with this replica's id on the way out.
async fn local(mut request: Request, next: Next) -> Response {
    if let Some(v) = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        let inner = ids::unwrap_mine(v).to_string();
        if let Ok(v) = HeaderValue::from_str(&inner) {
            request.headers_mut().insert(SESSION_HEADER, v);
        }
    }
    let mut response = next.run(request).await;
    let made = response
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| ids::owner(v).is_none())
        .map(|v| ids::mint('m', v));
    if let Some(Ok(v)) = made.map(|m| HeaderValue::from_str(&m)) {
        response.headers_mut().insert(SESSION_HEADER, v);
    }
    response
}

/// Forward to replica `owner` and its answer; or the answer for an owner that is gone or
/// silent; `None` for a stored file whose replica is gone (served here).
async fn to_owner(
    c: &Cluster,
    tracer: &crate::telemetry::Tracer,
    owner: &str,
    handle: &Handle,
    (id, method): (&Value, &str),
    parts: &Parts,
    body: Bytes,
) -> Option<Response> {
    let mut peer = c.peers().find(owner).await;
    for attempt in 0..2 {
        let Some(p) = peer else { break };
        match forward(c, tracer, &p, parts, body.clone()).await {
            Ok(r) => return Some(r),
            // Nothing was sent: ask the peers again (the address may have a new replica).
            Err(Failure::Connect(e)) if attempt == 0 => {
                tracing::info!(replica = owner, error = %e, "a replica stopped answering");
                peer = c.peers().lost(owner).await;
            }
            Err(Failure::Silent(waited)) => return Some(silent(owner, id, waited)),
            // The answer broke off (or the connection did, before it came): whether the owner
            // lives says which it was. Gone: the same answer as any call on its handles.
            Err(e) => {
                tracing::info!(replica = owner, error = %e, "a forwarded request got no whole answer");
                peer = c.peers().lost(owner).await;
                if peer.is_some() {
                    return Some(bad_gateway(owner, id, &e.to_string()));
                }
            }
        }
    }
    if let Handle::File(_) = handle {
        return None;
    }
    Some(owner_gone(c, owner, handle, id, method))
}

/// The answer for a call on a handle of replica `owner`, which is gone; counted and logged.
fn owner_gone(c: &Cluster, owner: &str, handle: &Handle, id: &Value, method: &str) -> Response {
    c.gone.fetch_add(1, Ordering::Relaxed);
    tracing::info!(replica = owner, handle = ?handle, "call on a handle of a replica that is gone");
    gone(owner, handle, id, method)
}

/// Why a forward failed.
#[derive(Debug)]
enum Failure {
    /// The peer did not take the connection (it is gone, or its address is reused).
    Connect(String),
    /// The peer took the request but no whole answer came.
    Answer(String),
    /// The peer gave no answer for this long and did not answer a liveness check.
    Silent(Duration),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) | Failure::Answer(e) => f.write_str(e),
            Failure::Silent(d) => write!(f, "no answer for {:.1} s", d.as_secs_f64()),
        }
    }
}

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Send the request to `peer` with the secret; its answer, streamed. While no answer has
/// come, the peer is asked every [`PROBE_EVERY`] whether it lives.
async fn forward(
    c: &Cluster,
    tracer: &crate::telemetry::Tracer,
    peer: &Peer,
    parts: &Parts,
    body: Bytes,
) -> Result<Response, Failure> {
    let mut span = traced::forward(tracer, parts, &body, peer);
    let traceparent = span.traceparent();
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{pq}", peer.base));
    for (name, value) in &parts.headers {
        let ours = traceparent.is_some() && name.as_str() == "traceparent";
        if !hop_by_hop(name) && name != header::CONTENT_LENGTH && !ours {
            request = request.header(name, value);
        }
    }
    if let Some(tp) = &traceparent {
        request = request.header("traceparent", tp);
    }
    let request = request
        .header(FORWARDED, c.peers().secret())
        .header(header::CONTENT_LENGTH, body.len())
        .body(Body::from(body))
        .map_err(|e| Failure::Answer(e.to_string()))?;
    let t0 = Instant::now();
    let sent = c.peers().client().request(request);
    tokio::pin!(sent);
    let answer = loop {
        tokio::select! {
            answer = &mut sent => break answer,
            _ = tokio::time::sleep(PROBE_EVERY) => {
                if !c.peers().answers(peer).await {
                    tracing::warn!(
                        replica = %peer.id,
                        waited_s = t0.elapsed().as_secs_f64(),
                        "a replica took a forwarded request and does not answer, nor a liveness check"
                    );
                    return Err(Failure::Silent(t0.elapsed()));
                }
            }
        }
    };
    let answer = answer.map_err(|e| {
        span.fail("forward_failed");
        if e.is_connect() {
            Failure::Connect(e.to_string())
        } else {
            Failure::Answer(e.to_string())
        }
    })?;
    c.forwarded.fetch_add(1, Ordering::Relaxed);
    span.set(
        "http.response.status_code",
        i64::from(answer.status().as_u16()),
    );
    let (mut parts, incoming) = answer.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    Ok(Response::from_parts(parts, Body::new(incoming)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "0000000a";

    fn s(rid: &str) -> Handle {
        Handle::Session(format!("s_{rid}_ff"))
    }

    fn m(rid: &str) -> Handle {
        Handle::Protocol(format!("m_{rid}_ff"))
    }

    #[test]
    fn the_plan_follows_the_handles() {
        // Nothing named: here, or elsewhere while draining (new work only).
        assert_eq!(plan(None, None, ME, false, true), Plan::Here);
        assert_eq!(plan(None, None, ME, true, true), Plan::Elsewhere);
        assert_eq!(plan(None, None, ME, true, false), Plan::Here);
        // A handle of another replica, in the head or the body: to its owner.
        assert_eq!(
            plan(Some(&m("0000000b")), None, ME, false, true),
            Plan::Owner("0000000b".into(), m("0000000b"))
        );
        assert_eq!(
            plan(None, Some(&s("0000000b")), ME, true, true),
            Plan::Owner("0000000b".into(), s("0000000b"))
        );
        // Own handles are served here, also while draining; unwrapped protocol ids too.
        assert_eq!(plan(None, Some(&s(ME)), ME, true, true), Plan::Here);
        let raw = Handle::Protocol("0b9e-uuid".into());
        assert_eq!(plan(Some(&raw), None, ME, true, true), Plan::Here);
        // The head wins; a body naming another replica's state through a protocol session
        // of this one is answered here ("gone", or where it is).
        assert_eq!(
            plan(Some(&raw), Some(&s("0000000b")), ME, false, true),
            Plan::ThroughProtocolSession("0000000b".into(), s("0000000b"))
        );
        assert_eq!(
            plan(Some(&m("0000000b")), Some(&s(ME)), ME, false, true),
            Plan::Owner("0000000b".into(), m("0000000b"))
        );
        let file = Handle::File("/d/flow_0000000b_89abcdef.py".into());
        assert_eq!(plan(Some(&raw), Some(&file), ME, false, true), Plan::Here);
    }
}
