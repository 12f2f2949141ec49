//! The HTTP front: Streamable HTTP at `/mcp` (rmcp's service) and the legacy SSE transport at
//! `/sse` + `/messages` ([`super::sse`]), behind a `Host` allowlist and an `Origin` check (the
//! guards of a local server against DNS rebinding, which the MCP specification requires) and a
//! request body limit; beside them `/healthz`, `/readyz` and Prometheus `/metrics`, open
//! without a token.
//!
//! Each tenant has its own set of MCP routes over its own [`crate::mcp::CodeExecutor`] (own session
//! managers, storage, workspaces, environment). With tenants configured, a call's bearer
//! token picks the set ([`super::auth`]: a static token or an OAuth access token, whose
//! principal rides with the request); a session id minted for one tenant is unknown to every
//! other's, and a protocol session is its maker's alone.
//!
//! The parts: `starting` (the routes while the server starts up), `routes` (one tenant's
//! MCP routes and the protocol-session caps), `body` (how request bodies are read and
//! refused), `guard` (the `Host` and `Origin` checks) and [`route`], the router that forwards a
//! request on another replica's handle to its owner: it lives here because this is the one
//! layer that reads `Mcp-Session-Id`, `/messages` and the JSON-RPC body it routes by.

mod body;
mod guard;
pub mod route;
mod routes;
mod starting;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::auth;
pub use super::bounds::Bounds;
use super::bounds::{Conn, Metered};
use super::sessions::SessionBook;
use crate::app::Service;
use crate::tenancy::oauth::Principal;
use crate::tenancy::token::Authenticator;
use body::BodyRules;
use guard::{check_host, header_str, host_refusal, origin_ok};
pub use guard::{host_allowed, origin_allowed};
use route::Routed;
use routes::tenant_routes;
pub(super) use routes::too_large_initialize;
pub use routes::MAX_INITIALIZE_BYTES;
pub use starting::Starting;

/// Options of the HTTP transports.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `Host` header values accepted (a name matches any port; `name:port` only that port).
    /// Empty: any host (for deployments behind a proxy that checks it).
    pub allowed_hosts: Vec<String>,
    /// Browser `Origin` values accepted beyond the default ones (`http://localhost:*`
    /// matches any port; `*` accepts any origin, i.e. turns the check off). By default a
    /// request with an `Origin` passes only from `http(s)://` localhost, 127.0.0.1 or
    /// `[::1]` (any port) or a host of `allowed_hosts`; requests without `Origin`
    /// (non-browser clients) always pass. See `guard::origin_ok`.
    pub allowed_origins: Vec<String>,
    /// Largest request body, bytes; larger requests get 413.
    pub max_body_bytes: usize,
    /// Serve Prometheus metrics at `/metrics`.
    pub metrics: bool,
    /// Caps on connections, streams, sessions and unread results (see [`Bounds`]).
    pub bounds: Bounds,
    /// This replica among its peers: forwarding to handles' owners, draining.
    pub cluster: Arc<crate::cluster::Cluster>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            allowed_hosts: crate::mcp::defaults::ALLOWED_HOSTS
                .iter()
                .map(|h| h.to_string())
                .collect(),
            allowed_origins: Vec::new(),
            max_body_bytes: crate::mcp::defaults::MAX_BODY_BYTES,
            metrics: true,
            bounds: Bounds::default(),
            cluster: Arc::default(),
        }
    }
}

/// The routes of a single-user server: `service` has one tenant, and no token is asked for.
/// The service's shutdown ends every session and stream.
pub fn router(service: Arc<Service>, opts: &HttpOptions) -> Router {
    hosted(service, None, opts)
}

/// The routes of a server with one executor per tenant. With `auth`, every MCP request
/// needs a bearer token, which picks the tenant; without, the service holds one tenant.
pub fn hosted(service: Arc<Service>, auth: Option<Authenticator>, opts: &HttpOptions) -> Router {
    let tenants = service.tenants();
    assert!(!tenants.is_empty(), "a server has at least one tenant");
    assert!(
        auth.is_some() || tenants.len() == 1,
        "several tenants need authentication to tell them apart"
    );
    let shutdown = answered_then_closed(&service);
    let book = SessionBook::new(
        opts.bounds.max_sessions,
        opts.bounds.max_sessions_per_tenant,
        opts.bounds.session_idle,
    );
    let front = Arc::new(Front {
        routers: tenants
            .iter()
            .map(|e| {
                (
                    e.tenant().to_string(),
                    tenant_routes(e.clone(), opts, shutdown.clone(), book.clone()),
                )
            })
            .collect(),
        service: service.clone(),
        auth,
        book,
        refusals: auth::Refusals::default(),
        opts: opts.clone(),
    });
    // /readyz and /metrics say things a page reached by DNS rebinding must not read: the
    // same Host and Origin check as the MCP routes. /healthz says only "ok".
    let mut guarded = Router::new().route("/readyz", get(readyz));
    if opts.metrics {
        guarded = guarded.route("/metrics", get(metrics));
    }
    let guarded = guarded.layer(middleware::from_fn_with_state(
        Arc::new(opts.clone()),
        check_host,
    ));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(guarded)
        .fallback(dispatch)
        .with_state(front)
        .layer(middleware::from_fn_with_state(
            opts.cluster.clone(),
            route::gate,
        ))
}

/// The token that ends the MCP transports: cancelled once the service's shutdown is asked
/// for and the runs it stopped have had their answers sent (at most [`ANSWER_GRACE`]), so
/// that a run stopped by the shutdown ends with its error as an answer, not a dropped
/// response.
fn answered_then_closed(service: &Arc<Service>) -> CancellationToken {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return service.shutdown_token();
    };
    let closed = CancellationToken::new();
    let token = closed.clone();
    let service = service.clone();
    runtime.spawn(async move {
        service.shutdown_token().cancelled().await;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < ANSWER_GRACE {
            let (running, waiting, _) = service.in_flight();
            if running + waiting == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // The answers of the last runs are being written.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        token.cancel();
    });
    closed
}

/// How long runs stopped by the shutdown get to be answered before the transports close.
pub const ANSWER_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// What the top-level routes share.
struct Front {
    service: Arc<Service>,
    routers: HashMap<String, Router>,
    auth: Option<Authenticator>,
    /// The Streamable HTTP sessions of every tenant.
    book: Arc<SessionBook>,
    /// Authentication refusals, by reason.
    refusals: auth::Refusals,
    opts: HttpOptions,
}

impl Front {
    /// How request bodies are read, here as in every route.
    fn body_rules(&self) -> BodyRules {
        BodyRules {
            limit: self.opts.max_body_bytes,
            timeout: self.opts.bounds.body_timeout,
        }
    }
}

/// Hand the request to its tenant's routes, in this order: the `Host` and `Origin` checks,
/// its token when there are tenants ([`auth::authenticate`]; the caller's [`Principal`]
/// goes with the request), the protocol session's owner, the stream caps, and with peers
/// the replica that owns its handle ([`route`], the body read under the
/// body rules): nothing of a request is read or forwarded before it passed the checks
/// every request passes. With OAuth, the Protected Resource Metadata is served first,
/// without a token, and browser clients of an allowed `Origin` get CORS answers.
async fn dispatch(State(front): State<Arc<Front>>, mut request: Request) -> Response {
    let oauth = front.auth.as_ref().and_then(|a| a.oauth.clone());
    let origin = (oauth.is_some())
        .then(|| header_str(&request, header::ORIGIN))
        .filter(|o| !o.is_empty() && origin_ok(o, &front.opts));
    if let Some(o) = &oauth {
        if let Some(r) = auth::metadata(&o.settings, &request) {
            return r;
        }
        if let (Some(origin), &axum::http::Method::OPTIONS) = (&origin, request.method()) {
            return auth::preflight(origin);
        }
    }
    if let Some(refused) = host_refusal(&request, &front.opts) {
        return refused;
    }
    let principal = match &front.auth {
        None => Principal::tenant(front.service.tenants()[0].tenant()),
        Some(a) => match auth::authenticate(a, &front.refusals, &request).await {
            Ok(p) => p,
            Err(mut refused) => {
                if let Some(o) = &origin {
                    auth::allow_origin(&mut refused, o);
                }
                return refused;
            }
        },
    };
    let tenant = principal.tenant.clone();
    let owner = principal.owner();
    // A protocol session (Streamable HTTP or legacy SSE) is its maker's: another principal
    // naming it is told it does not exist.
    if let Some(id) = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
    {
        if !front.book.may_use(id, owner.as_deref()) {
            tracing::info!(tenant = %tenant, principal = %principal.describe(), session = ?id, "refused: another principal's protocol session");
            return (
                StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({
                    "jsonrpc": "2.0", "id": null,
                    "error": {"code": -32001, "message": "session not found"},
                })),
            )
                .into_response();
        }
    }
    tracing::debug!(tenant = %tenant, principal = %principal.describe(), path = ?request.uri().path(), "request admitted");
    request.extensions_mut().insert(principal);
    let initializing = !request.headers().contains_key("mcp-session-id");
    let router = front.routers[&tenant].clone();
    // Count the response against the tenant's open streams (when served by our accept
    // loop, which puts the connection in the extensions).
    let conn = request.extensions().get::<Arc<Conn>>().cloned();
    let slot = match &conn {
        Some(c) => {
            c.set_tenant(&tenant);
            if let Some(s) = request
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
            {
                c.set_session(s);
            } else if let Some(s) = request
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("sessionId=")))
            {
                c.set_session(s);
            }
            match c.tracker.open_stream(&tenant) {
                Some(slot) => Some(slot),
                None => return too_many_streams(&c.tracker.bounds().clone()),
            }
        }
        None => None,
    };
    let cluster = &front.opts.cluster;
    let request = if route::wanted(cluster, &request) {
        let (parts, body) = request.into_parts();
        let body = match body::read(body, front.body_rules(), conn.as_deref()).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        match route::route(cluster, front.service.tracer(), parts, body).await {
            Routed::Here(request) => request,
            Routed::Answered(mut answer) => {
                // A forwarded answer has its owner's CORS headers already.
                let has_cors = answer
                    .headers()
                    .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN);
                if let Some(o) = origin.as_ref().filter(|_| !has_cors) {
                    auth::allow_origin(&mut answer, o);
                }
                return answer.map(|b| Metered::wrap(b, None, slot));
            }
        }
    } else {
        request
    };
    let response = match router.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let made = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(s) = &made {
        if initializing {
            front.book.bind(s, owner);
        }
        if let Some(c) = &conn {
            c.set_session(s);
        }
    }
    let mut response = response;
    if let Some(o) = &origin {
        auth::allow_origin(&mut response, o);
    }
    response.map(|b| Metered::wrap(b, None, slot))
}

/// 429: the tenant (or the server) has as many open MCP responses as it may.
fn too_many_streams(b: &Bounds) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {
            "code": -32000,
            "message": format!(
                "too many open requests and streams (at most {} per tenant, {} in all; \
                 --max-streams-per-tenant, --max-streams): finish or close some, then retry",
                b.max_streams_per_tenant, b.max_streams
            ),
        },
    });
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, "5")],
        axum::Json(body),
    )
        .into_response()
}

/// Alive: the process answers.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: the backend answers, the sandbox image is there, the warm pool has a sandbox
/// waiting (when there is a pool). 503 with the same JSON otherwise.
async fn readyz(State(front): State<Arc<Front>>) -> Response {
    let r = front.service.readiness().await;
    let mut ready = r.ready;
    let mut body = serde_json::to_value(&r).unwrap_or_default();
    if front.opts.cluster.draining() {
        // SIGTERM came: the balancer must stop sending new calls here first.
        ready = false;
        body["ready"] = false.into();
        body["draining"] = true.into();
        body["problem"] =
            "shutting down: runs in progress finish, new calls go to other replicas".into();
    }
    body["replica"] = crate::ids::replica().into();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(body)).into_response()
}

/// Prometheus text format.
async fn metrics(State(front): State<Arc<Front>>, request: Request) -> Response {
    let mut text = front.service.metrics_text();
    text.push_str(&front.book.metrics_text());
    text.push_str(&front.opts.cluster.metrics_text());
    if front.auth.is_some() {
        text.push_str(&front.refusals.metrics_text());
    }
    if let Some(c) = request.extensions().get::<Arc<Conn>>() {
        text.push_str(&c.tracker.metrics_text());
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// How long in-flight requests get to finish after shutdown is asked for; then their
/// connections are dropped, which cancels their runs.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serve `router` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_bounded(listener, router, shutdown, Bounds::default()).await
}

/// [`serve`] within `bounds` (connections, header and body timeouts, unread results).
pub async fn serve_bounded(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
    bounds: Bounds,
) -> std::io::Result<()> {
    super::bounds::serve_with(listener, router, shutdown, bounds, SHUTDOWN_GRACE).await
}
