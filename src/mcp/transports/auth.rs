//! Who is calling, over HTTP: a static tenant token or an OAuth access token in the
//! `Authorization` header (never in the URL), checked before a request reaches a tenant's
//! routes. With OAuth configured ([`crate::tenancy::oauth`]) the server is a resource server
//! as the MCP authorization specification asks: its Protected Resource Metadata (RFC 9728)
//! at [`WELL_KNOWN`] and the path-suffixed forms for `/mcp` and `/sse`, served without a
//! token and with CORS; a 401 names it (`WWW-Authenticate: Bearer resource_metadata=…,
//! scope=…`, with `error="invalid_token"` for a bad or expired token); a token without the
//! scope gets 403 `insufficient_scope`; a token no tenant rule matches gets 403. Refusals are
//! counted by reason for `/metrics` and logged, rate-limited and cut, with every client-sent
//! value quoted, never the token ([`crate::tenancy::oauth::refusal_log`]).
//!
//! The [`Principal`] of an admitted request rides in the request's extensions, where the
//! tools find it ([`principal_of`]).

use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::tenancy::oauth::refusal_log::{self, RefusalLog};
use crate::tenancy::oauth::{Principal, Refusal, Settings};
use crate::tenancy::token::Authenticator;

/// The Protected Resource Metadata of the server root; `/mcp` and `/sse` are appended for
/// theirs.
pub const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// Headers a browser client may read from our responses.
const EXPOSED: &str = "WWW-Authenticate, Mcp-Session-Id, Mcp-Protocol-Version";

/// Refusals by reason ([`Refusal::reason`]), and the rate limit of their log lines.
#[derive(Debug, Default)]
pub struct Refusals {
    counts: [AtomicU64; 6],
    log: RefusalLog,
}

impl Refusals {
    fn count(&self, r: &Refusal) {
        let i = Refusal::REASONS
            .iter()
            .position(|x| *x == r.reason())
            .unwrap_or(0);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Count a refusal and log it, within the rate limit ([`RefusalLog`]): a refused token
    /// at `warn` (seen at the default level: the operator needs the reason), a request with
    /// no token at all at `info` (every OAuth client's first request is one).
    fn refused(&self, path: &str, r: &Refusal, detail: &str) {
        self.count(r);
        let Some(not_logged) = self.log.admit(std::time::Instant::now()) else {
            return;
        };
        let path = refusal_log::detail(path);
        let detail = refusal_log::detail(detail);
        let reason = r.reason();
        if matches!(r, Refusal::Missing) {
            tracing::info!(path = ?path, reason, detail = ?detail, not_logged, "refused: authentication");
        } else {
            tracing::warn!(path = ?path, reason, detail = ?detail, not_logged, "refused: authentication");
        }
    }

    /// Prometheus lines.
    pub fn metrics_text(&self) -> String {
        let mut out = String::from(
            "# HELP mcp_auth_refused_total Requests refused by authentication, by reason.\n\
             # TYPE mcp_auth_refused_total counter\n",
        );
        for (i, r) in Refusal::REASONS.iter().enumerate() {
            out.push_str(&format!(
                "mcp_auth_refused_total{{reason=\"{r}\"}} {}\n",
                self.counts[i].load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// The resource a request path belongs to: `/mcp`, `/sse` (also `/messages`), or the root.
pub fn resource_suffix(path: &str) -> &'static str {
    if path == "/mcp" || path.starts_with("/mcp/") {
        "/mcp"
    } else if path == "/sse" || path == super::paths::MESSAGES_PATH {
        "/sse"
    } else {
        ""
    }
}

/// The Protected Resource Metadata answer for a request to a well-known path, if it is one
/// (and OAuth is configured): `GET` gives the JSON, `OPTIONS` the CORS preflight.
pub fn metadata(settings: &Settings, request: &Request) -> Option<Response> {
    let suffix = request.uri().path().strip_prefix(WELL_KNOWN)?;
    if !matches!(suffix, "" | "/" | "/mcp" | "/sse") {
        return None;
    }
    let suffix = suffix.trim_end_matches('/');
    let cors = [
        (header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"),
        (header::ACCESS_CONTROL_ALLOW_METHODS, "GET, OPTIONS"),
        (
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            "mcp-protocol-version, content-type",
        ),
        (header::ACCESS_CONTROL_MAX_AGE, "3600"),
    ];
    match *request.method() {
        Method::OPTIONS => Some((StatusCode::NO_CONTENT, cors).into_response()),
        Method::GET | Method::HEAD => {
            let body = serde_json::json!({
                "resource": format!("{}{suffix}", settings.base()),
                "authorization_servers": settings.issuers,
                "scopes_supported": [settings.scope],
                "bearer_methods_supported": ["header"],
                "resource_name": "mcp-code-executor",
            });
            Some(
                (
                    cors,
                    [(header::CACHE_CONTROL, "public, max-age=300")],
                    axum::Json(body),
                )
                    .into_response(),
            )
        }
        _ => Some(StatusCode::METHOD_NOT_ALLOWED.into_response()),
    }
}

/// The `WWW-Authenticate` value for a refusal at `path`.
pub fn challenge_header(settings: &Settings, path: &str, r: &Refusal) -> String {
    let meta = format!("{}{WELL_KNOWN}{}", settings.base(), resource_suffix(path));
    let mut v = format!(
        r#"Bearer resource_metadata="{meta}", scope="{}""#,
        settings.scope
    );
    let error = match r {
        Refusal::Missing | Refusal::NoTenant(_) => None,
        Refusal::Scope => Some((
            "insufficient_scope",
            "the access token lacks the scope this server needs",
        )),
        Refusal::Expired => Some(("invalid_token", "the access token expired")),
        Refusal::Audience => Some((
            "invalid_token",
            "the access token is not for this server (aud)",
        )),
        Refusal::Invalid(_) => Some(("invalid_token", "the access token is not valid")),
    };
    if let Some((e, d)) = error {
        v.push_str(&format!(r#", error="{e}", error_description="{d}""#));
    }
    v
}

/// The answer to a refused request: 401 with the challenge, 403 for a missing scope (with
/// the challenge) or no tenant.
fn refuse(settings: &Settings, path: &str, r: &Refusal) -> Response {
    let (status, error, message) = match r {
        Refusal::Scope => (
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            format!("this server needs the scope `{}`", settings.scope),
        ),
        Refusal::NoTenant(_) => (
            StatusCode::FORBIDDEN,
            "forbidden",
            "signed in, but no tenant of this server admits you: ask its operator to map your organisation, client or user to a tenant".to_string(),
        ),
        Refusal::Missing => (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this server needs `Authorization: Bearer <token>`: sign in with OAuth (see the resource_metadata of WWW-Authenticate) or use a tenant token".to_string(),
        ),
        _ => (
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "the bearer token is not valid here".to_string(),
        ),
    };
    let body = serde_json::json!({"error": error, "message": message});
    let mut resp = (status, axum::Json(body)).into_response();
    if !matches!(r, Refusal::NoTenant(_)) {
        if let Ok(v) = HeaderValue::from_str(&challenge_header(settings, path, r)) {
            resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
    }
    resp.headers_mut().insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    );
    close_after(resp)
}

/// A refusal ends its connection (`Connection: close`): the request's body was not read,
/// and a client that sent the same request again on that connection (an OAuth client after
/// signing in) could find it closed under it ("Server disconnected without sending a
/// response": seen once in a CI run of the quick-start test, on a loaded machine). The
/// client opens a new connection for its next request instead.
fn close_after(mut resp: Response) -> Response {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// 401 of a server with static tokens only, as before OAuth: the challenge RFC 6750 asks for.
fn unauthorized_static(token_given: bool) -> Response {
    let (challenge, message) = if token_given {
        (
            r#"Bearer realm="mcp-code-executor", error="invalid_token""#,
            "the bearer token is not valid for any tenant",
        )
    } else {
        (
            r#"Bearer realm="mcp-code-executor""#,
            "this server needs `Authorization: Bearer <token>`; ask its operator for a tenant token",
        )
    };
    let body = serde_json::json!({"error": "unauthorized", "message": message});
    close_after(
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, challenge)],
            axum::Json(body),
        )
            .into_response(),
    )
}

/// Does the query string carry a token (`access_token=`, RFC 6750 §2.3)? Refused: tokens
/// in URLs end up in logs and histories.
pub fn token_in_query(request: &Request) -> bool {
    request.uri().query().is_some_and(|q| {
        q.split('&').any(|kv| {
            let k = kv.split('=').next().unwrap_or("");
            k.eq_ignore_ascii_case("access_token") || k.eq_ignore_ascii_case("token")
        })
    })
}

/// The principal of `request` (a tenant token or an OAuth token), or the answer refusing it.
pub fn authenticate<'a>(
    auth: &'a Authenticator,
    refusals: &'a Refusals,
    request: &Request,
) -> impl std::future::Future<Output = Result<Principal, Response>> + Send + 'a {
    let path = request.uri().path().to_string();
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let in_query = token_in_query(request);
    async move { check(auth, refusals, &path, &header, in_query).await }
}

async fn check(
    auth: &Authenticator,
    refusals: &Refusals,
    path: &str,
    header: &str,
    in_query: bool,
) -> Result<Principal, Response> {
    let token = Authenticator::bearer(header);
    let refused = |r: Refusal, detail: &str| refusals.refused(path, &r, detail);
    if in_query {
        refused(
            Refusal::Invalid("token in the query string".into()),
            "token in the query string",
        );
        let body = serde_json::json!({
            "error": "invalid_request",
            "message": "tokens in the URL are refused: send `Authorization: Bearer <token>`",
        });
        let mut resp = (StatusCode::BAD_REQUEST, axum::Json(body)).into_response();
        if let Some(o) = &auth.oauth {
            let v = format!(
                r#"{}, error="invalid_request", error_description="tokens in the URL are refused""#,
                challenge_header(&o.settings, path, &Refusal::Missing)
            );
            if let Ok(v) = HeaderValue::from_str(&v) {
                resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
            }
        }
        return Err(resp);
    }
    if let Some(t) = token.and_then(|t| auth.tenant_of(t)) {
        return Ok(Principal::tenant(t));
    }
    let Some(oauth) = &auth.oauth else {
        let r = if header.is_empty() {
            Refusal::Missing
        } else {
            Refusal::Invalid("no tenant has this token".into())
        };
        refused(r, "static token");
        return Err(unauthorized_static(!header.is_empty()));
    };
    let result = match token {
        None if header.is_empty() => Err(Refusal::Missing),
        None => Err(Refusal::Invalid("not a bearer token".into())),
        Some(t) if !crate::tenancy::oauth::validate::looks_like_jwt(t) => {
            Err(Refusal::Invalid("neither a tenant token nor a JWT".into()))
        }
        Some(t) => oauth.authenticate(t).await,
    };
    match result {
        Ok(p) => Ok(p),
        Err(r) => {
            let detail = match &r {
                Refusal::Invalid(why) => why.clone(),
                Refusal::NoTenant(seen) => format!("no [[oauth_rules]] entry matches: {seen}"),
                other => other.reason().to_string(),
            };
            refused(r.clone(), &detail);
            Err(refuse(&oauth.settings, path, &r))
        }
    }
}

/// CORS for browser clients of a server with OAuth: the preflight of an allowed `origin`,
/// answered here.
pub fn preflight(origin: &str) -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    if let Ok(o) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
    }
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, accept, mcp-session-id, mcp-protocol-version, last-event-id",
        ),
    );
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    h.insert(header::VARY, HeaderValue::from_static("Origin"));
    r
}

/// Add the CORS answer headers for an allowed `origin` to a response.
pub fn allow_origin(resp: &mut Response, origin: &str) {
    if let Ok(o) = HeaderValue::from_str(origin) {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED),
        );
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// The principal of a tool call over HTTP (put in the request's extensions by the HTTP
/// front); `None` over stdio and legacy SSE (whose connection carries it instead).
pub fn principal_of(ctx: &RequestContext<RoleServer>) -> Option<Principal> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Principal>())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            public_url: "https://mcp.example.com".into(),
            issuers: vec!["https://as.example".into()],
            scope: "mcp".into(),
        }
    }

    #[test]
    fn challenges_name_the_metadata_of_the_path_and_the_scope() {
        let s = settings();
        assert_eq!(
            challenge_header(&s, "/mcp", &Refusal::Missing),
            r#"Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", scope="mcp""#
        );
        assert!(challenge_header(&s, "/messages", &Refusal::Expired)
            .contains(r#"oauth-protected-resource/sse", scope="mcp", error="invalid_token""#));
        assert!(
            challenge_header(&s, "/mcp", &Refusal::Scope).contains(r#"error="insufficient_scope""#)
        );
        assert_eq!(resource_suffix("/mcpx"), "");
    }

    #[test]
    fn tokens_in_the_query_are_seen() {
        let r = |q: &str| {
            Request::builder()
                .uri(q)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        assert!(token_in_query(&r("/mcp?access_token=x")));
        assert!(token_in_query(&r("/messages?sessionId=1&Access_Token=x")));
        assert!(!token_in_query(&r("/messages?sessionId=1")));
        assert!(!token_in_query(&r("/mcp")));
    }

    #[tokio::test]
    async fn metadata_names_the_resource_of_its_path_from_the_configured_url() {
        let s = settings();
        for (path, want) in [
            (WELL_KNOWN.to_string(), "https://mcp.example.com"),
            (format!("{WELL_KNOWN}/mcp"), "https://mcp.example.com/mcp"),
            (format!("{WELL_KNOWN}/sse"), "https://mcp.example.com/sse"),
        ] {
            let req = Request::builder()
                .uri(&path)
                .header("host", "evil.example")
                .body(axum::body::Body::empty())
                .unwrap();
            let resp = metadata(&s, &req).expect("served");
            assert_eq!(resp.status(), StatusCode::OK);
            assert_eq!(resp.headers()["access-control-allow-origin"], "*");
            let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap();
            let m: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(m["resource"], want, "{m}");
            assert_eq!(m["authorization_servers"][0], "https://as.example");
            assert_eq!(m["scopes_supported"][0], "mcp");
            assert_eq!(m["bearer_methods_supported"][0], "header");
        }
        let other = Request::builder()
            .uri(format!("{WELL_KNOWN}/other"))
            .body(axum::body::Body::empty())
            .unwrap();
        assert!(metadata(&s, &other).is_none());
    }
}
