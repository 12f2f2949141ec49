//! The routes of a server still starting up: `/healthz` at once, 503 with the phase for
//! everything else, until the real routes are handed over.

use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tower::ServiceExt as _;

use super::guard::host_refusal;
use super::{healthz, HttpOptions};
use crate::app::Startup;

/// The routes of a server still starting up (the listener comes first, before the image is
/// built): `/healthz` answers at once, `/readyz` answers 503 with the start-up phase, and
/// every other request gets 503 with `Retry-After` and a JSON-RPC error saying the server
/// is starting up. [`Starting::ready`] hands over the real routes; from then on every
/// request goes to them.
pub struct Starting {
    startup: Arc<Startup>,
    routes: OnceLock<Router>,
    pool_target: usize,
    opts: HttpOptions,
}

/// Seconds a client is asked to wait before retrying while the server starts up.
const STARTING_RETRY_AFTER: &str = "5";

impl Starting {
    /// `pool_target`: the warm pool the server will keep (for `/readyz`).
    pub fn new(startup: Arc<Startup>, pool_target: usize) -> Arc<Starting> {
        Self::with_options(startup, pool_target, HttpOptions::default())
    }

    /// [`Starting::new`] with the server's options (its `/readyz` checks `Host` and `Origin`).
    pub fn with_options(
        startup: Arc<Startup>,
        pool_target: usize,
        opts: HttpOptions,
    ) -> Arc<Starting> {
        Arc::new(Starting {
            startup,
            routes: OnceLock::new(),
            pool_target,
            opts,
        })
    }

    /// The router to serve from the start.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/healthz", get(healthz))
            .fallback(starting_dispatch)
            .with_state(self.clone())
    }

    /// Start-up is over: serve `routes` (from [`super::hosted`]) from now on.
    pub fn ready(&self, routes: Router) {
        let _ = self.routes.set(routes);
    }
}

async fn starting_dispatch(State(s): State<Arc<Starting>>, request: Request) -> Response {
    if let Some(routes) = s.routes.get() {
        return match routes.clone().oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
    }
    if request.uri().path() == "/readyz" {
        if let Some(refused) = host_refusal(&request, &s.opts) {
            return refused;
        }
        let r = s.startup.readiness(s.pool_target);
        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(r)).into_response();
    }
    // The id of a JSON-RPC request, so that the client matches the error to its call.
    let id = match axum::body::to_bytes(request.into_body(), crate::mcp::defaults::MAX_BODY_BYTES)
        .await
    {
        Ok(b) => serde_json::from_slice::<serde_json::Value>(&b)
            .ok()
            .and_then(|v| v.get("id").cloned())
            .unwrap_or(serde_json::Value::Null),
        Err(_) => serde_json::Value::Null,
    };
    let phase = s.startup.phase();
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": -32000,
            "message": format!("mcp-code-executor is starting up ({}); retry in a moment", phase.describe()),
            "data": {"phase": phase.name()},
        },
    });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, STARTING_RETRY_AFTER)],
        axum::Json(body),
    )
        .into_response()
}
