//! The HTTP layer that sends a request to the replica owning its handle.
//!
//! Where the handle is: the `Mcp-Session-Id` header (a protocol session of the 2025
//! revisions), `sessionId` in the query of a legacy SSE `POST /messages`, or, for a
//! request without a protocol session (MCP 2026-07-28), the JSON-RPC body: `session_id` in
//! a `tools/call`'s arguments, `taskId` of `tasks/*`, the session in a `resources/read`
//! URI. The body is parsed once into a few borrowed fields (serde skips the rest). A
//! request on a handle of this replica, or on none, is served here; otherwise it is sent
//! whole to its owner and the owner's answer streamed back as it comes.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::peers::Peer;
use super::{ids, Cluster, FORWARDED, REPLICA_PATH};

/// The layer's state: the cluster and the largest body it reads.
#[derive(Clone)]
pub struct RouteState {
    pub cluster: Arc<Cluster>,
    pub max_body_bytes: usize,
}

const SESSION_HEADER: &str = "mcp-session-id";

/// What a request names, for the answer when its owner is gone.
#[derive(Debug, Clone, PartialEq)]
pub enum Handle {
    /// A protocol session (Streamable HTTP or legacy SSE).
    Protocol(String),
    /// An `execute_python` session named in a tool call.
    Session(String),
    /// An MCP task.
    Task(String),
    /// A resource URI (of a session's workspace).
    Resource(String),
    /// A stored code file's `file_path`: served by the replica that stored it while it
    /// lives (its storage may be its own), else here (a shared storage has it too).
    File(String),
}

/// The few fields of a JSON-RPC request that may name a handle.
#[derive(serde::Deserialize, Default)]
struct Message<'a> {
    #[serde(default, borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    params: Option<Params<'a>>,
}

#[derive(serde::Deserialize, Default)]
struct Params<'a> {
    #[serde(default, borrow)]
    arguments: Option<Arguments<'a>>,
    #[serde(default, rename = "taskId", borrow)]
    task_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    uri: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize, Default)]
struct Arguments<'a> {
    #[serde(default, borrow)]
    session_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    file_path: Option<std::borrow::Cow<'a, str>>,
}

/// What the body of a request without a protocol session names: the handle, the JSON-RPC
/// id and method (for an answer made here).
pub fn inspect(body: &[u8]) -> (Option<Handle>, Value, String) {
    let m: Message = serde_json::from_slice(body).unwrap_or_default();
    let id = m.id.unwrap_or(Value::Null);
    let method = m.method.as_deref().unwrap_or_default().to_string();
    let p = m.params.unwrap_or_default();
    let handle = match method.as_str() {
        "tools/call" => p.arguments.and_then(|a| match (a.session_id, a.file_path) {
            (Some(s), _) => Some(Handle::Session(s.into_owned())),
            (None, Some(f)) => Some(Handle::File(f.into_owned())),
            (None, None) => None,
        }),
        m if m.starts_with("tasks/") => p.task_id.map(|t| Handle::Task(t.into_owned())),
        "resources/read" => p.uri.map(|u| Handle::Resource(u.into_owned())),
        _ => None,
    };
    (handle, id, method)
}

impl Handle {
    /// The replica that owns it, when it names one.
    pub fn owner(&self) -> Option<String> {
        match self {
            Handle::Protocol(h) | Handle::Session(h) | Handle::Task(h) => {
                ids::owner(h).map(str::to_string)
            }
            Handle::Resource(u) => crate::mcp::resources::parse(u)
                .and_then(|p| ids::owner(&p.handle).map(str::to_string)),
            Handle::File(f) => ids::file_owner(f).map(str::to_string),
        }
    }
}

/// The layer: serve here, or forward to the owner, or say the owner is gone.
pub async fn route(State(st): State<RouteState>, mut request: Request, next: Next) -> Response {
    let c = &st.cluster;
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
        return local(request, next).await;
    }
    if request.uri().path().starts_with("/internal/") {
        return StatusCode::NOT_FOUND.into_response();
    }
    if !c.clustered() && !c.draining() {
        return local(request, next).await;
    }
    // The handle: in the header or query, else in the body of a sessionless POST /mcp.
    let mut handle = request
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| Handle::Protocol(v.to_string()));
    if handle.is_none() && request.uri().path() == crate::mcp::transports::sse::MESSAGES_PATH {
        handle = request
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("sessionId=")))
            .map(|s| Handle::Protocol(s.to_string()));
    }
    let mcp_post = request.method() == axum::http::Method::POST && request.uri().path() == "/mcp";
    let mut rpc = (Value::Null, String::new());
    let (parts, body) = request.into_parts();
    let body = match tokio::time::timeout(
        std::time::Duration::from_secs(30),
        axum::body::to_bytes(body, st.max_body_bytes),
    )
    .await
    {
        Ok(Ok(b)) => b,
        _ => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "request body larger than {} bytes, or too slow\n",
                    st.max_body_bytes
                ),
            )
                .into_response()
        }
    };
    if handle.is_none() && mcp_post {
        let (h, id, method) = inspect(&body);
        handle = h;
        rpc = (id, method);
    }
    let owner = handle.as_ref().and_then(Handle::owner);
    match owner {
        Some(o) if o != ids::replica() => {
            let handle = handle.unwrap_or(Handle::Protocol(String::new()));
            match to_owner(c, &o, &handle, rpc, parts, body).await {
                Ok(answer) => answer,
                // A stored file outlives its replica where the storage is shared.
                Err((parts, body)) => {
                    local(Request::from_parts(parts, Body::from(body)), next).await
                }
            }
        }
        Some(_) => local(Request::from_parts(parts, Body::from(body)), next).await,
        None if c.draining() && takes_new_work(&parts) => match c.peers().another().await {
            Some(peer) => match forward(c, &peer, &parts, body).await {
                Ok(r) => r,
                Err(e) => bad_gateway(&rpc.0, &e),
            },
            None => draining_refusal(&rpc.0),
        },
        None => local(Request::from_parts(parts, Body::from(body)), next).await,
    }
}

/// A request that would start something new here: a sessionless MCP request, a new
/// protocol session, a legacy SSE stream.
fn takes_new_work(parts: &axum::http::request::Parts) -> bool {
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

/// Forward to replica `owner`, or answer that it is gone; for a stored file whose replica
/// is gone, the request back, to be served here.
async fn to_owner(
    c: &Cluster,
    owner: &str,
    handle: &Handle,
    rpc: (Value, String),
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Result<Response, (axum::http::request::Parts, Bytes)> {
    let mut peer = c.peers().find(owner).await;
    for attempt in 0..2 {
        let Some(p) = peer else { break };
        match forward(c, &p, &parts, body.clone()).await {
            Ok(r) => return Ok(r),
            Err(Failure::Connect(e)) if attempt == 0 => {
                tracing::info!(replica = owner, error = %e, "a replica stopped answering");
                peer = c.peers().lost(owner).await;
            }
            Err(e) => return Ok(bad_gateway(&rpc.0, &e)),
        }
    }
    if let Handle::File(_) = handle {
        return Err((parts, body));
    }
    c.gone.fetch_add(1, Ordering::Relaxed);
    tracing::info!(replica = owner, handle = ?handle, "call on a handle of a replica that is gone");
    Ok(gone(owner, handle, &rpc.0, &rpc.1))
}

/// Why a forward failed.
#[derive(Debug)]
enum Failure {
    /// The peer did not take the connection (it is gone, or its address is reused).
    Connect(String),
    /// The peer took the request but no answer came.
    Answer(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) | Failure::Answer(e) => f.write_str(e),
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

/// Send the request to `peer` with the secret; its answer, streamed.
async fn forward(
    c: &Cluster,
    peer: &Peer,
    parts: &axum::http::request::Parts,
    body: Bytes,
) -> Result<Response, Failure> {
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = axum::http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{}{pq}", peer.base));
    for (name, value) in &parts.headers {
        if !hop_by_hop(name) && name != header::CONTENT_LENGTH {
            request = request.header(name, value);
        }
    }
    let request = request
        .header(FORWARDED, c.peers().secret())
        .header(header::CONTENT_LENGTH, body.len())
        .body(Body::from(body))
        .map_err(|e| Failure::Answer(e.to_string()))?;
    let answer = c.peers().client().request(request).await.map_err(|e| {
        if e.is_connect() {
            Failure::Connect(e.to_string())
        } else {
            Failure::Answer(e.to_string())
        }
    })?;
    c.forwarded.fetch_add(1, Ordering::Relaxed);
    let (mut parts, incoming) = answer.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(*name);
    }
    Ok(Response::from_parts(parts, Body::new(incoming)))
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// 502: the owner took the request and gave no answer (it died while answering).
fn bad_gateway(id: &Value, e: &Failure) -> Response {
    let message = format!(
        "the server replica that owns this call stopped while answering ({e}); what it held is lost. Start again (a new session)."
    );
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(rpc_error(id, -32000, &message)),
    )
        .into_response()
}

/// 503: this replica is shutting down and no peer takes the call.
fn draining_refusal(id: &Value) -> Response {
    let message =
        "this server replica is shutting down and takes no new calls: retry in a few seconds";
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "2")],
        axum::Json(rpc_error(id, -32000, message)),
    )
        .into_response()
}

/// What a call on a handle of replica `owner`, which is gone, gets: what was lost, what
/// survives, what to do.
pub fn gone(owner: &str, handle: &Handle, id: &Value, method: &str) -> Response {
    const KEPT: &str =
        "Kept: code stored with initialize_code_file, append_to_code_file or execute_code \
        (its file_path still works with execute_code_file and read_code_file).";
    match handle {
        Handle::Session(h) if method == "tools/call" => {
            let text = format!(
                "session `{h}` is gone: the server replica that held it (`{owner}`) stopped or restarted. \
                 Lost: the session's variables and imports, and the files of its workspace. {KEPT} \
                 Call again without session_id to start a new session."
            );
            // `resultType`: what 2026-07-28 asks of every result (only sessionless requests,
            // i.e. that revision's, name their session in the body).
            axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": {
                "resultType": "complete",
                "content": [{"type": "text", "text": text}], "isError": true}}))
            .into_response()
        }
        Handle::Task(t) => {
            let message = format!(
                "task `{t}` is gone: the server replica that ran it (`{owner}`) stopped or restarted, \
                 and its run and result went with it. Start the call again."
            );
            axum::Json(rpc_error(id, -32602, &message)).into_response()
        }
        Handle::Resource(u) => {
            let message = format!(
                "resource `{u}` is gone: the server replica that held its session (`{owner}`) stopped or restarted, \
                 and the session's workspace files went with it. {KEPT}"
            );
            axum::Json(rpc_error(id, -32002, &message)).into_response()
        }
        Handle::Session(_) | Handle::Protocol(_) | Handle::File(_) => {
            let message = format!(
                "session not found: the server replica that held this MCP session (`{owner}`) stopped or restarted. \
                 Lost: its execute_python variables and workspace files. {KEPT} Start a new session (initialize)."
            );
            (
                StatusCode::NOT_FOUND,
                axum::Json(rpc_error(id, -32001, &message)),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_names_its_handle() {
        let b = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"execute_python","arguments":{"code":"x = 41","session_id":"s_0123abcd_ff"}}}"#;
        let (h, id, m) = inspect(b);
        assert_eq!(h, Some(Handle::Session("s_0123abcd_ff".into())));
        assert_eq!((id, m.as_str()), (json!(7), "tools/call"));
        assert_eq!(h.unwrap().owner().as_deref(), Some("0123abcd"));
        let b = br#"{"jsonrpc":"2.0","id":"a","method":"tasks/cancel","params":{"taskId":"t_0123abcd_9"}}"#;
        assert_eq!(inspect(b).0, Some(Handle::Task("t_0123abcd_9".into())));
        let u = crate::mcp::resources::uri("s_0123abcd_ff", "out.txt", None);
        let b = json!({"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri": u}})
            .to_string();
        let (h, _, _) = inspect(b.as_bytes());
        assert_eq!(h.unwrap().owner().as_deref(), Some("0123abcd"));
        for b in [
            &b"not json"[..],
            br#"{"method":"tools/call","params":{"arguments":{"code":"1"}}}"#,
            br#"[1,2]"#,
        ] {
            assert_eq!(inspect(b).0, None);
        }
    }
}
