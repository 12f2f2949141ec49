//! One tenant's MCP routes (Streamable HTTP at `/mcp`, legacy SSE at `/sse` + `/messages`)
//! and the caps on `initialize`: its size and the protocol-session caps.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::super::sessions::{SessionBook, Sessions};
use super::super::sse::{self, SseState};
use super::body::{answer_parse_errors, BodyRules};
use super::guard::check_host;
use super::HttpOptions;
use crate::app::Executor;
use crate::mcp::CodeExecutor;
use crate::tenancy::oauth::Principal;

/// One tenant's MCP routes.
pub(super) fn tenant_routes(
    executor: Arc<Executor>,
    opts: &HttpOptions,
    shutdown: CancellationToken,
    book: Arc<SessionBook>,
) -> Router {
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(shutdown.child_token())
        .with_max_request_body_bytes(opts.max_body_bytes);
    config = if opts.allowed_hosts.is_empty() {
        config.disable_allowed_hosts()
    } else {
        config.with_allowed_hosts(opts.allowed_hosts.clone())
    };
    // Origin is checked by `check_host`, for both transports alike.
    config = config.disable_allowed_origins();
    // A new connection (its own session and workspace) for every MCP session.
    let streamable_executor = executor.clone();
    let sessions = Arc::new(Sessions::new(
        executor.tenant(),
        book,
        opts.bounds.session_idle,
    ));
    let streamable = StreamableHttpService::new(
        move || Ok(CodeExecutor::connect(&streamable_executor)),
        sessions.clone(),
        config,
    );
    let usage = Router::new()
        .route("/usage", get(usage_of_tenant))
        .with_state(executor.tenant().to_string());
    let legacy = Router::new()
        .route("/sse", get(sse::open))
        .route(
            crate::mcp::transports::paths::MESSAGES_PATH,
            post(sse::post),
        )
        .with_state(SseState::new(executor, shutdown));
    let streamable = Router::new()
        .nest_service("/mcp", streamable)
        .layer(middleware::from_fn_with_state(sessions, cap_sessions))
        .layer(middleware::from_fn(end_session_with_204));
    streamable
        .merge(legacy)
        .merge(usage)
        .layer(middleware::from_fn_with_state(
            BodyRules {
                limit: opts.max_body_bytes,
                timeout: opts.bounds.body_timeout,
            },
            answer_parse_errors,
        ))
        .layer(DefaultBodyLimit::max(opts.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            Arc::new(opts.clone()),
            check_host,
        ))
}

/// rmcp answers the DELETE that ends a session with 202 Accepted, but the session is ended
/// by then; clients (the official Python SDK among them) take only 200 or 204 for done.
async fn end_session_with_204(request: Request, next: Next) -> Response {
    let delete = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

/// Past the protocol-session caps, `initialize` gets 503 and a JSON-RPC error saying so
/// (after the session idle longest, if any may go, was closed to make room).
async fn cap_sessions(
    State(sessions): State<Arc<Sessions>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != axum::http::Method::POST
        || request.headers().contains_key("mcp-session-id")
    {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    #[derive(serde::Deserialize)]
    struct Method {
        method: Option<String>,
        id: Option<serde_json::Value>,
    }
    if let Ok(Method {
        method: Some(m),
        id,
    }) = serde_json::from_slice::<Method>(&bytes)
    {
        if m == "initialize" && bytes.len() > MAX_INITIALIZE_BYTES {
            tracing::info!(
                bytes = bytes.len(),
                "refused: initialize request larger than the bound"
            );
            return too_large_initialize(id);
        }
        if m == "initialize" {
            if let Err(message) = sessions.make_room().await {
                tracing::warn!(reason = %message, "refused: initialize past the protocol-session cap");
                let error = serde_json::json!({
                    "jsonrpc": "2.0",
                    "id": id.unwrap_or(serde_json::Value::Null),
                    "error": {"code": -32000, "message": message},
                });
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(header::RETRY_AFTER, "30")],
                    axum::Json(error),
                )
                    .into_response();
            }
        }
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// The largest `initialize` request taken (a protocol session keeps what the client said in
/// it, its capabilities, for its whole life; real clients send a few KiB): larger ones are
/// refused, so that sessions cannot pin memory by the megabyte.
pub const MAX_INITIALIZE_BYTES: usize = 64 * 1024;

/// 400 with a JSON-RPC error: the `initialize` request is larger than [`MAX_INITIALIZE_BYTES`].
pub(in crate::mcp::transports) fn too_large_initialize(id: Option<serde_json::Value>) -> Response {
    let error = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id.unwrap_or(serde_json::Value::Null),
        "error": {
            "code": -32600,
            "message": format!("initialize request larger than {MAX_INITIALIZE_BYTES} bytes: send only the capabilities and client information"),
        },
    });
    (StatusCode::BAD_REQUEST, axum::Json(error)).into_response()
}

/// `GET /usage[?from=YYYY-MM-DD&to=YYYY-MM-DD]`: the calling tenant's own usage by day
/// and principal (the request reached this tenant's routes with its token), JSON: a
/// signed-in user sees their own records only, the tenant's static token (its operator)
/// every principal's. Read off the async runtime.
async fn usage_of_tenant(
    State(tenant): State<String>,
    principal: Option<axum::Extension<Principal>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let Some(dir) = crate::app::usage::recording_dir() else {
        return (
            StatusCode::NOT_FOUND,
            "usage is not recorded by this server",
        )
            .into_response();
    };
    // A user: only their own; the static token (or no sign-in at all): the whole tenant.
    let user = principal
        .and_then(|p| p.owner())
        .map(|d| format!("user:{d}"));
    let read = tokio::task::spawn_blocking(move || {
        let day = |k: &str| q.get(k).map(String::as_str);
        crate::app::usage::read(
            dir,
            crate::app::usage::Filter {
                tenant: Some(&tenant),
                principal: user.as_deref(),
                from: day("from"),
                to: day("to"),
            },
        )
    })
    .await;
    match read {
        Ok(Ok(r)) => axum::Json(r).into_response(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "usage records unreadable");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "usage records unreadable (the server log says why)",
            )
                .into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "usage read failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}
