//! The HTTP front: Streamable HTTP at `/mcp` (rmcp's service) and the legacy SSE transport at
//! `/sse` + `/messages` ([`super::sse`]), behind a `Host` allowlist and an `Origin` check (the
//! guards of a local server against DNS rebinding, which the MCP specification requires) and a
//! request body limit; beside them `/healthz`, `/readyz` and Prometheus `/metrics`, open
//! without a token.
//!
//! Each tenant has its own set of MCP routes over its own [`CodeExecutor`] (own session
//! managers, storage, workspaces, environment). With tenants configured, a call's bearer
//! token picks the set ([`super::auth`]: a static token or an OAuth access token, whose
//! principal rides with the request); a session id minted for one tenant is unknown to every
//! other's, and a protocol session is its maker's alone.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::auth;
pub use super::bounds::Bounds;
use super::bounds::{Conn, Metered};
use super::sessions::{SessionBook, Sessions};
use super::sse::{self, SseState};
use crate::app::{Executor, Service, Startup};
use crate::mcp::{defaults, CodeExecutor};
use crate::tenancy::oauth::Principal;
use crate::tenancy::token::Authenticator;

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
    /// (non-browser clients) always pass. See [`origin_ok`].
    pub allowed_origins: Vec<String>,
    /// Largest request body, bytes; larger requests get 413.
    pub max_body_bytes: usize,
    /// Serve Prometheus metrics at `/metrics`.
    pub metrics: bool,
    /// Caps on connections, streams, sessions and unread results (see [`Bounds`]).
    pub bounds: Bounds,
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
    let shutdown = service.shutdown_token();
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
}

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

    /// Start-up is over: serve `routes` (from [`hosted`]) from now on.
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

/// Hand the request to its tenant's routes, after checking its token when there are
/// tenants ([`auth::authenticate`]); the caller's [`Principal`] goes with the request. With
/// OAuth, the Protected Resource Metadata is served here, without a token, and browser
/// clients of an allowed `Origin` get CORS answers.
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
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(r)).into_response()
}

/// Prometheus text format.
async fn metrics(State(front): State<Arc<Front>>, request: Request) -> Response {
    let mut text = front.service.metrics_text();
    text.push_str(&front.book.metrics_text());
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

/// One tenant's MCP routes.
fn tenant_routes(
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
    let legacy = Router::new()
        .route("/sse", get(sse::open))
        .route(sse::MESSAGES_PATH, post(sse::post))
        .with_state(SseState::new(executor, shutdown));
    let streamable = Router::new()
        .nest_service("/mcp", streamable)
        .layer(middleware::from_fn_with_state(sessions, cap_sessions))
        .layer(middleware::from_fn(end_session_with_204));
    streamable
        .merge(legacy)
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
pub(super) fn too_large_initialize(id: Option<serde_json::Value>) -> Response {
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

/// How request bodies are read.
#[derive(Clone, Copy)]
struct BodyRules {
    limit: usize,
    timeout: std::time::Duration,
}

/// JSON nested deeper than this is refused as a parse error (serde_json's own limit).
const MAX_JSON_DEPTH: usize = 128;

/// rmcp answers a POST body that is not JSON (or nested too deep for its parser) with a
/// plain-text 415; JSON-RPC clients expect a parse error (-32700). Bodies are read up to the
/// limit (beyond it: 413) within the body timeout (beyond it: 408) and handed on.
async fn answer_parse_errors(
    State(rules): State<BodyRules>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let limit = rules.limit;
    let conn = request.extensions().get::<Arc<Conn>>().cloned();
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(rules.timeout, axum::body::to_bytes(body, limit)).await;
    let bytes = match read {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {limit} bytes"),
            )
                .into_response()
        }
        Err(_) => {
            if let Some(c) = conn {
                c.tracker.body_timed_out();
            }
            tracing::info!("refused: request body not received within the body timeout");
            return (
                StatusCode::REQUEST_TIMEOUT,
                [(header::CONNECTION, "close")],
                format!(
                    "request body not received within {} s (--body-timeout, MCP_EXECUTOR_BODY_TIMEOUT)",
                    rules.timeout.as_secs()
                ),
            )
                .into_response();
        }
    };
    let parsed = if super::bounds::json_too_deep(&bytes, MAX_JSON_DEPTH) {
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
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// Refuse requests to `/mcp`, `/sse` and `/messages` whose `Host` is not on the allowlist
/// or whose `Origin` (when there is one) is not accepted by [`origin_ok`]: 403 with a JSON
/// body naming the flag that admits it.
async fn check_host(
    State(opts): State<Arc<HttpOptions>>,
    request: Request,
    next: Next,
) -> Response {
    match host_refusal(&request, &opts) {
        Some(refused) => refused,
        None => next.run(request).await,
    }
}

/// The 403 for a request whose `Host` or `Origin` is not accepted, if it is not.
fn host_refusal(request: &Request, opts: &HttpOptions) -> Option<Response> {
    let host = header_str(request, header::HOST);
    if !opts.allowed_hosts.is_empty() && !host_allowed(&host, &opts.allowed_hosts) {
        tracing::info!(host = ?host, "refused: Host not allowed");
        return Some(forbidden(format!(
            "Host `{host}` is not allowed (a guard against DNS rebinding); add it with --allowed-hosts (MCP_EXECUTOR_ALLOWED_HOSTS)"
        )));
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !origin_ok(origin, opts) {
            tracing::info!(origin = ?origin, "refused: Origin not allowed");
            return Some(forbidden(format!(
                "Origin `{origin}` is not allowed: browser pages may call this server only from http(s)://localhost, 127.0.0.1 or [::1] (any port) or a host of --allowed-hosts (a guard against DNS rebinding). \
                 Add the page's origin with --allowed-origins (MCP_EXECUTOR_ALLOWED_ORIGINS), e.g. --allowed-origins {}",
                if origin.is_empty() { "https://app.example.com" } else { origin }
            )));
        }
    }
    None
}

fn forbidden(message: String) -> Response {
    let body = serde_json::json!({"error": "forbidden", "message": message});
    (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
}

/// May a browser page from `origin` call the MCP routes? Yes from `http(s)://` localhost,
/// 127.0.0.1 or `[::1]` on any port, from a host of `allowed_hosts` (a bare name there
/// admits any port, `name:port` only that port), and from an entry of `allowed_origins`
/// (`*` admits every origin). With `allowed_hosts` empty (any `Host`), only the loopback
/// origins and `allowed_origins` pass: an open Host check does not open the Origin check.
fn origin_ok(origin: &str, opts: &HttpOptions) -> bool {
    if opts.allowed_origins.iter().any(|o| o.trim() == "*")
        || origin_allowed(origin, &opts.allowed_origins)
    {
        return true;
    }
    let o = origin.trim().to_ascii_lowercase();
    let Some((scheme, authority)) = o.split_once("://") else {
        return false;
    };
    if !matches!(scheme, "http" | "https") || authority.is_empty() || authority.contains('/') {
        return false;
    }
    let (name, port) = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once(']') {
            Some((n, tail)) => (n, tail.strip_prefix(':')),
            None => return false,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (authority, None),
        }
    };
    if port.is_some_and(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
        return false;
    }
    if defaults::ALLOWED_HOSTS.contains(&name) {
        return true;
    }
    // As a `Host` header would carry it: the explicit port, else the scheme's.
    let port = port.unwrap_or(if scheme == "https" { "443" } else { "80" });
    let host = if name.contains(':') {
        format!("[{name}]:{port}")
    } else {
        format!("{name}:{port}")
    };
    !opts.allowed_hosts.is_empty() && host_allowed(&host, &opts.allowed_hosts)
}

fn header_str(request: &Request, name: header::HeaderName) -> String {
    request
        .headers()
        .get(name)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Does `origin` (`scheme://host[:port]`) match an entry (`scheme://host:*` for any port)?
pub fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    let origin = origin.trim().to_ascii_lowercase();
    allowed.iter().any(|a| {
        let a = a.trim().to_ascii_lowercase();
        match a.strip_suffix(":*") {
            Some(prefix) => {
                origin == prefix
                    || origin
                        .strip_prefix(prefix)
                        .and_then(|rest| rest.strip_prefix(':'))
                        .is_some_and(|port| {
                            !port.is_empty() && port.chars().all(|c| c.is_ascii_digit())
                        })
            }
            None => origin == a,
        }
    })
}

/// Does `host` (a `Host` header: `name`, `name:port`, `[v6]:port`) match an allowlist entry?
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("").to_string()
    } else {
        host.rsplit_once(':')
            .map(|(n, _)| n.to_string())
            .unwrap_or_else(|| host.clone())
    };
    allowed.iter().any(|a| {
        let a = a.trim().to_ascii_lowercase();
        let a_bare = a.trim_start_matches('[').trim_end_matches(']');
        a == host || a_bare == name
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let allowed: Vec<String> = ["http://localhost:*", "https://app.example.com"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for ok in [
            "http://localhost",
            "http://localhost:6274",
            "https://app.example.com",
        ] {
            assert!(origin_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "http://evil.com",
            "http://localhost.evil.com",
            "http://localhost:80x",
            "https://app.example.com:444",
            "null",
        ] {
            assert!(!origin_allowed(bad, &allowed), "{bad}");
        }
    }

    #[test]
    fn origins_by_default_and_with_flags() {
        let mut opts = HttpOptions::default();
        for ok in [
            "http://localhost",
            "http://localhost:6274",
            "https://localhost:8443",
            "http://127.0.0.1:4000",
            "http://[::1]:4000",
            "HTTP://LOCALHOST:1",
        ] {
            assert!(origin_ok(ok, &opts), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:4000",
            "http://evil.example/localhost",
            "file://localhost",
            "null",
            "",
            "http://localhost:x",
            "http://[::1",
        ] {
            assert!(!origin_ok(bad, &opts), "{bad}");
        }
        // A host of --allowed-hosts is an allowed origin too (a bare name: any port).
        opts.allowed_hosts.push("mcp.example.com".into());
        opts.allowed_hosts.push("ide.example.com:8443".into());
        for ok in [
            "https://mcp.example.com",
            "http://mcp.example.com:4000",
            "https://ide.example.com:8443",
        ] {
            assert!(origin_ok(ok, &opts), "{ok}");
        }
        assert!(!origin_ok("https://ide.example.com", &opts));
        assert!(!origin_ok("https://other.example.com", &opts));
        // --allowed-origins adds to them; `*` turns the check off.
        opts.allowed_origins = vec!["https://app.example.com".into()];
        assert!(origin_ok("https://app.example.com", &opts));
        assert!(origin_ok("http://localhost:6274", &opts));
        assert!(!origin_ok("https://other.example.com", &opts));
        opts.allowed_origins = vec!["*".into()];
        assert!(origin_ok("https://other.example.com", &opts));
        // Any Host (`--allowed-hosts '*'`) does not mean any Origin.
        let any_host = HttpOptions {
            allowed_hosts: Vec::new(),
            ..Default::default()
        };
        assert!(!origin_ok("https://other.example.com", &any_host));
        assert!(origin_ok("http://localhost:6274", &any_host));
    }

    #[test]
    fn hosts() {
        let allowed: Vec<String> = ["localhost", "127.0.0.1", "::1", "example.com:8443"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for ok in [
            "localhost",
            "localhost:4000",
            "127.0.0.1:1234",
            "[::1]:4000",
            "example.com:8443",
        ] {
            assert!(host_allowed(ok, &allowed), "{ok}");
        }
        for bad in [
            "evil.com",
            "evil.com:4000",
            "",
            "example.com:80",
            "127.0.0.1.evil.com",
        ] {
            assert!(!host_allowed(bad, &allowed), "{bad}");
        }
    }
}
