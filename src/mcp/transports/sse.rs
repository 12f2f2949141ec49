//! The legacy HTTP+SSE transport (protocol 2024-11-05), which rmcp no longer ships: `GET /sse`
//! opens an event stream whose first event, `endpoint`, names `/messages?sessionId=…`; each
//! `POST` there carries one client message, and the server's messages come back on the stream
//! as `message` events. Each session is an rmcp service fed by a pair of channels.
//!
//! The server's messages wait for the client serialized, counted against its connection
//! ([`Conn::queue`]): the bounds on unread result bytes (per session, per tenant, in all)
//! and the stall timeout apply to them, and a client that does not read its stream is
//! disconnected, which ends its session.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::channel::mpsc::{unbounded, SendError, UnboundedSender};
use futures::{SinkExt as _, Stream, StreamExt};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::{RoleServer, ServiceExt};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::bounds::Conn;
use super::paths::MESSAGES_PATH;
use crate::app::Executor;
use crate::mcp::CodeExecutor;
use crate::tenancy::oauth::Principal;

/// A session's way in, and the [`Principal::owner`] of the principal that opened it.
type ToServer = (
    UnboundedSender<RxJsonRpcMessage<RoleServer>>,
    Option<String>,
);

/// Open sessions, by id.
pub struct SseState {
    executor: Arc<Executor>,
    sessions: Mutex<HashMap<String, ToServer>>,
    shutdown: CancellationToken,
}

impl SseState {
    pub fn new(executor: Arc<Executor>, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(SseState {
            executor,
            sessions: Mutex::default(),
            shutdown,
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, ToServer>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends a session when its event stream is dropped (the client went away, or shutdown).
struct SessionGuard {
    id: String,
    state: Arc<SseState>,
    ct: CancellationToken,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.state.sessions().remove(&self.id);
        self.ct.cancel();
        super::sessions::trim_soon();
        tracing::debug!(session = %self.id, "legacy SSE session closed");
    }
}

/// `GET /sse`: open a session and stream its messages.
pub async fn open(
    State(state): State<Arc<SseState>>,
    request: axum::extract::Request,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Named with this replica's id: a POST /messages that lands elsewhere is forwarded here.
    let id = crate::ids::mint('m', &uuid::Uuid::new_v4().simple().to_string());
    let conn = request.extensions().get::<Arc<Conn>>().cloned();
    let principal = request.extensions().get::<Principal>().cloned();
    let owner = principal.as_ref().and_then(Principal::owner);
    if let Some(c) = &conn {
        c.set_session(&id);
    }
    let (to_server, from_client) = unbounded::<RxJsonRpcMessage<RoleServer>>();
    let (to_client, from_server) = unbounded::<String>();
    // Serialized as they are queued, so that what waits is counted in bytes.
    let queued_on = conn.clone();
    let to_client = to_client.with(move |m: TxJsonRpcMessage<RoleServer>| {
        let data = serde_json::to_string(&m).unwrap_or_default();
        if let Some(c) = &queued_on {
            c.queue(data.len() as u64);
        }
        futures::future::ready(Ok::<_, SendError>(data))
    });
    state.sessions().insert(id.clone(), (to_server, owner));
    let ct = state.shutdown.child_token();
    // A new connection (its own session and workspace) for every SSE session.
    let executor = CodeExecutor::new(crate::app::Connection::bound(
        state.executor.clone(),
        principal,
    ));
    let service_ct = ct.clone();
    let session = id.clone();
    tokio::spawn(async move {
        match executor
            .serve_with_ct((to_client, from_client), service_ct)
            .await
        {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            Err(e) => {
                tracing::debug!(session = %session, error = ?e.to_string(), "legacy SSE session ended before initialisation")
            }
        }
    });
    tracing::debug!(session = %id, "legacy SSE session opened");
    let endpoint = Event::default()
        .event("endpoint")
        .data(format!("{MESSAGES_PATH}?sessionId={id}"));
    let guard = SessionGuard {
        id,
        state: state.clone(),
        ct: ct.clone(),
    };
    let messages = from_server.map(move |data| {
        let _session_lives_as_long_as_the_stream = &guard;
        if let Some(c) = &conn {
            c.unqueue(data.len() as u64);
        }
        Ok(Event::default().event("message").data(data))
    });
    let stream = futures::stream::once(async { Ok(endpoint) })
        .chain(messages)
        .take_until(ct.cancelled_owned());
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[derive(Deserialize)]
pub struct SessionQuery {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
}

/// `POST /messages?sessionId=…`: hand one client message to its session.
pub async fn post(
    State(state): State<Arc<SseState>>,
    Query(q): Query<SessionQuery>,
    principal: Option<axum::Extension<Principal>>,
    body: Bytes,
) -> Response {
    let owner = principal.and_then(|p| p.0.owner());
    let Some(id) = q.session_id else {
        return (StatusCode::BAD_REQUEST, "missing sessionId query parameter").into_response();
    };
    let message: RxJsonRpcMessage<RoleServer> = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(e) => {
            let code = if serde_json::from_slice::<serde_json::Value>(&body).is_ok() {
                -32600 // valid JSON, not a JSON-RPC message
            } else {
                -32700 // not JSON at all
            };
            let error = serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {"code": code, "message": format!("invalid JSON-RPC message: {e}")},
            });
            return (StatusCode::BAD_REQUEST, Json(error)).into_response();
        }
    };
    if body.len() > super::http::MAX_INITIALIZE_BYTES {
        if let RxJsonRpcMessage::<RoleServer>::Request(r) = &message {
            if matches!(r.request, rmcp::model::ClientRequest::InitializeRequest(_)) {
                tracing::info!(
                    bytes = body.len(),
                    "refused: initialize request larger than the bound"
                );
                let id = serde_json::to_value(&r.id).ok();
                return super::http::too_large_initialize(id);
            }
        }
    }
    // Another principal's session is as unknown as one that never was.
    let sender = state
        .sessions()
        .get(&id)
        .filter(|(_, o)| *o == owner)
        .map(|(tx, _)| tx.clone());
    let id: String = id.chars().take(40).collect();
    match sender {
        Some(tx) if tx.unbounded_send(message).is_ok() => {
            (StatusCode::ACCEPTED, "Accepted").into_response()
        }
        _ => (
            StatusCode::NOT_FOUND,
            format!("no open SSE session {id:?}: open one with GET /sse"),
        )
            .into_response(),
    }
}
