//! How request bodies are read: up to the limit, within the body timeout, and refused as a
//! JSON-RPC parse error when they are not JSON.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::super::bounds::Conn;

/// How request bodies are read.
#[derive(Clone, Copy)]
pub(super) struct BodyRules {
    pub(super) limit: usize,
    pub(super) timeout: std::time::Duration,
}

/// JSON nested deeper than this is refused as a parse error (serde_json's own limit).
const MAX_JSON_DEPTH: usize = 128;

/// Read a request body whole, as every route does: up to the limit (beyond it: 413)
/// within the body timeout (beyond it: 408, the connection closed, counted in `/metrics`).
pub(super) async fn read(
    body: axum::body::Body,
    rules: BodyRules,
    conn: Option<&Conn>,
) -> Result<axum::body::Bytes, Response> {
    let limit = rules.limit;
    match tokio::time::timeout(rules.timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {limit} bytes"),
        )
            .into_response()),
        Err(_) => {
            if let Some(c) = conn {
                c.tracker.body_timed_out();
            }
            tracing::info!("refused: request body not received within the body timeout");
            Err((
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, "close")],
                format!(
                    "request body not received within {} s (--body-timeout, MCP_EXECUTOR_BODY_TIMEOUT)",
                    rules.timeout.as_secs()
                ),
            )
                .into_response())
        }
    }
}

/// rmcp answers a POST body that is not JSON (or nested too deep for its parser) with a
/// plain-text 415; JSON-RPC clients expect a parse error (-32700). Bodies are read up to the
/// limit (beyond it: 413) within the body timeout (beyond it: 408) and handed on.
pub(super) async fn answer_parse_errors(
    State(rules): State<BodyRules>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let conn = request.extensions().get::<Arc<Conn>>().cloned();
    let (parts, body) = request.into_parts();
    let bytes = match read(body, rules, conn.as_deref()).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let parsed = if super::super::bounds::json_too_deep(&bytes, MAX_JSON_DEPTH) {
        Err(format!("JSON nested deeper than {MAX_JSON_DEPTH} levels"))
    } else {
        serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).map_err(|e| e.to_string())
    };
    if let Err(e) = parsed {
        let error = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": -32700, "message": format!("parse error: {e}")},
        });
        return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    // A client that hung up before its request was read (a forwarder that gave up on a
    // replica that was stopped, a client's timeout while the server was busy) gets nothing
    // started: the connection's next turn reads its end and drops this future, before the
    // MCP layer spawns the call (a cell cancelled once started would end its session).
    hung_up_turns().await;
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Give the connection's loop its turns to read past the request (where a hung-up client's
/// end is waiting) before the request is handed on.
async fn hung_up_turns() {
    for _ in 0..HUNG_UP_TURNS {
        tokio::task::yield_now().await;
    }
}

/// How many turns (a yield lets the runtime poll its I/O driver first): one sufficed in the
/// test (`replicas::hostile::a_forwarded_call_whose_forwarder_hung_up_is_not_run`, 12 of
/// 12 rounds; without any, the cell started and was cancelled in 4 runs of 4); two for margin.
const HUNG_UP_TURNS: usize = 2;
