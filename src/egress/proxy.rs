//! The egress proxy: HTTP/1.1 over any byte stream (a TCP socket in tests, the sandbox's
//! channel later), serving `CONNECT host:port` tunnels (never intercepted; they must carry
//! TLS) and plain HTTP in absolute form (`GET http://host/path`), forwarded with its body
//! streamed. Each connection goes through the same phases: parse the target, the tenant's
//! rate, the policy ([`Policy::allow_target`]), the run's budget, resolution (once), the
//! address check of every answer ([`Policy::allow_address`]), connect to a checked address
//! (never a second lookup: no DNS rebinding), relay under the byte budget and the idle
//! timeout, one record at the end.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::defaults;
use super::limits::{idle, Metered, Rate, RunBudget, Traffic};
use super::policy::{Ask, Host, Policy, Rule};
use super::record::Record;
use super::refusal::{Reason, Refusal};
use super::resolve::{Resolve, SystemResolver};
use super::tls::{self, Hello};
use super::tls_ends::Interceptor;

pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// The proxy of one server: the policy, the resolver, the tenants' rates.
pub struct Proxy {
    pub(super) policy: Arc<Policy>,
    resolver: Arc<dyn Resolve>,
    pub(super) rate: Rate,
    /// The CA and the TLS configurations of interception (rules with headers).
    pub(super) intercept: Interceptor,
}

/// One run's side of the proxy: who (tenant, run id), its budget, and a token that ends
/// every connection of the run when the run ends.
pub struct RunScope {
    pub(super) tenant: String,
    pub(super) run: String,
    pub(super) budget: Arc<RunBudget>,
    pub(super) cancel: CancellationToken,
}

impl RunScope {
    /// The run this scope is of (as the log records name it).
    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// Bytes the run sent upstream and received, all its connections together.
    pub fn spent(&self) -> (u64, u64) {
        self.budget.spent()
    }

    /// End every connection of the run (its tunnels and forwarded requests).
    pub fn close(&self) {
        self.cancel.cancel();
    }
}

impl Drop for RunScope {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Proxy {
    /// With the system resolver and the policy's `[resolve]` overrides.
    pub fn new(policy: Policy) -> Arc<Proxy> {
        let resolver = Arc::new(SystemResolver::new(policy.resolve.clone()));
        Proxy::with_resolver(policy, resolver)
    }

    /// With another resolver (a test's).
    pub fn with_resolver(policy: Policy, resolver: Arc<dyn Resolve>) -> Arc<Proxy> {
        Arc::new(Proxy {
            rate: Rate::new(policy.limits.connections_per_second),
            intercept: Interceptor::new(policy.upstream_ca.clone()),
            policy: Arc::new(policy),
            resolver,
        })
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The interception CA's certificate (PEM), which the sandboxes add to their trust
    /// bundle; its key stays in this process.
    pub fn ca_pem(&self) -> String {
        self.intercept.ca_pem()
    }

    /// The scope of run `run` of `tenant`: its budget, shared by every stream of the run.
    pub fn run_scope(&self, tenant: &str, run: &str) -> Arc<RunScope> {
        Arc::new(RunScope {
            tenant: tenant.to_string(),
            run: run.to_string(),
            budget: RunBudget::new(&self.policy.limits),
            cancel: CancellationToken::new(),
        })
    }

    /// Serve one client stream until it closes, its scope is closed, or it idles past the
    /// idle timeout between requests.
    pub async fn serve<S>(self: Arc<Self>, io: S, scope: Arc<RunScope>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let cancel = scope.cancel.clone();
        let proxy = self.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (p, s) = (proxy.clone(), scope.clone());
            async move { Ok::<_, Infallible>(p.handle(req, s).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.policy.limits.idle_timeout)
            .max_buf_size(defaults::MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::select! {
            _ = conn => {}
            _ = cancel.cancelled() => {}
        }
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        scope: Arc<RunScope>,
    ) -> Response<Body> {
        if req.method() == Method::CONNECT {
            self.tunnel(req, scope).await
        } else {
            self.forward(req, scope).await
        }
    }

    /// `CONNECT host:port`: connect, answer 200, then relay the bytes both ways.
    async fn tunnel(
        self: Arc<Self>,
        req: Request<Incoming>,
        scope: Arc<RunScope>,
    ) -> Response<Body> {
        let Some((host, port)) = req
            .uri()
            .authority()
            .and_then(|a| Some((a.host().to_string(), a.port_u16()?)))
        else {
            let asked = req.uri().to_string();
            let r = Refusal::new(
                &asked,
                0,
                Reason::BadRequest {
                    detail: "CONNECT needs host:port".into(),
                },
            );
            Record::new(&scope.tenant, &scope.run, &asked, 0, "connect").finish(r.label(), 0, 0);
            return refusal(&r);
        };
        if Host::parse(&host).is_some_and(|h| self.policy.intercepts(&scope.tenant, &h, port)) {
            return self.intercepted(req, scope, host, port);
        }
        let mut record = Record::new(&scope.tenant, &scope.run, &host, port, "connect");
        let (upstream, permit, _) = match self
            .open(&scope, &host, port, Ask::Tunnel, &mut record)
            .await
        {
            Ok(x) => x,
            Err(r) => {
                record.finish(r.label(), 0, 0);
                return refusal(&r);
            }
        };
        let traffic = Traffic::new();
        let upstream = Metered::new(upstream, scope.budget.clone(), traffic.clone());
        let on_upgrade = hyper::upgrade::on(req);
        let idle_limit = self.policy.limits.idle_timeout;
        let cancel = scope.cancel.clone();
        let name = match Host::parse(&host) {
            Some(Host::Name(n)) => Some(n),
            _ => None,
        };
        tokio::spawn(async move {
            let outcome = tokio::select! {
                o = relay(on_upgrade, upstream, &traffic, name) => o,
                _ = idle(&traffic, idle_limit) => "idle_timeout",
                _ = cancel.cancelled() => "cancelled",
            };
            drop(permit);
            let (up, down) = traffic.bytes();
            record.finish(outcome, up, down);
        });
        Response::new(empty())
    }

    /// Plain HTTP in absolute form: one upstream connection per request, the request and
    /// the response streamed.
    async fn forward(
        self: Arc<Self>,
        req: Request<Incoming>,
        scope: Arc<RunScope>,
    ) -> Response<Body> {
        let uri = req.uri().clone();
        let target = match (uri.scheme_str(), uri.authority()) {
            (Some("http"), Some(a)) => Ok((a.host().to_string(), a.port_u16().unwrap_or(80))),
            (Some("https"), Some(a)) => Err((
                a.host().to_string(),
                a.port_u16().unwrap_or(443),
                "https:// URLs go through CONNECT, not absolute-form",
            )),
            (Some(_), Some(a)) => Err((a.host().to_string(), 0, "only http:// is forwarded")),
            _ => Err((
                String::new(),
                0,
                "a request in origin form: this is a proxy, ask it for absolute URLs",
            )),
        };
        let (host, port) = match target {
            Ok(t) => t,
            Err((host, port, detail)) => {
                let r = Refusal::new(
                    &host,
                    port,
                    Reason::BadRequest {
                        detail: detail.into(),
                    },
                );
                Record::new(&scope.tenant, &scope.run, &host, port, "http").finish(r.label(), 0, 0);
                return refusal(&r);
            }
        };
        let mut record = Record::new(&scope.tenant, &scope.run, &host, port, "http");
        let ask = Ask::Http {
            method: req.method().as_str(),
            path: uri.path(),
        };
        let (upstream, permit, _) = match self.open(&scope, &host, port, ask, &mut record).await {
            Ok(x) => x,
            Err(r) => {
                record.finish(r.label(), 0, 0);
                return refusal(&r);
            }
        };
        let traffic = Traffic::new();
        let upstream = Metered::new(upstream, scope.budget.clone(), traffic.clone());
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
                Ok(x) => x,
                Err(e) => {
                    let (up, down) = traffic.bytes();
                    record.finish("error", up, down);
                    return refusal(&Refusal::new(
                        &host,
                        port,
                        Reason::Upstream {
                            detail: format!("HTTP handshake: {e}"),
                            timeout: false,
                        },
                    ));
                }
            };
        supervise(
            conn,
            traffic.clone(),
            self.policy.limits.idle_timeout,
            scope.cancel.clone(),
            permit,
            record,
        );
        let (mut parts, body) = req.into_parts();
        let authority = uri
            .authority()
            .map(|a| a.as_str().rsplit('@').next().unwrap_or("").to_string());
        to_origin_form(&mut parts);
        if let Some(h) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
            parts.headers.insert(header::HOST, h);
        }
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.boxed())
            }
            Err(e) => refusal(&Refusal::new(
                &host,
                port,
                Reason::Upstream {
                    detail: format!("the upstream's answer: {e}"),
                    timeout: false,
                },
            )),
        }
    }

    /// The phases before any byte is relayed: target, rate, policy, budget, resolution,
    /// address checks, connect. The stream is connected to an address that was checked.
    pub(super) async fn open(
        &self,
        scope: &RunScope,
        host_text: &str,
        port: u16,
        ask: Ask<'_>,
        record: &mut Record,
    ) -> Result<(TcpStream, OwnedSemaphorePermit, &Rule), Refusal> {
        let refuse = |reason| Refusal::new(host_text, port, reason);
        let host = Host::parse(host_text).ok_or_else(|| {
            refuse(Reason::BadRequest {
                detail: "not a host name or an IP address".into(),
            })
        })?;
        if port == 0 {
            return Err(refuse(Reason::BadRequest {
                detail: "port 0".into(),
            }));
        }
        self.rate.take(&scope.tenant).map_err(refuse)?;
        let rule = self
            .policy
            .allow_target(&scope.tenant, &host, port, ask)
            .map_err(refuse)?;
        record.allowed_by(&rule.host);
        let permit = scope.budget.admit().map_err(refuse)?;
        let limits = &self.policy.limits;
        let connect = async {
            let answers = match &host {
                Host::Ip(ip) => vec![*ip],
                Host::Name(n) => self.resolver.resolve(n).await.map_err(|e| {
                    refuse(Reason::Upstream {
                        detail: format!("could not resolve: {e}"),
                        timeout: false,
                    })
                })?,
            };
            let mut refused = None;
            let mut checked: Vec<IpAddr> = Vec::new();
            for a in answers {
                match self.policy.allow_address(&scope.tenant, a, port) {
                    Ok(()) => checked.push(a),
                    Err(r) => {
                        refused.get_or_insert(r);
                    }
                }
            }
            if checked.is_empty() {
                return Err(refuse(refused.unwrap_or(Reason::Upstream {
                    detail: "no address".into(),
                    timeout: false,
                })));
            }
            let mut last = None;
            for a in checked.into_iter().take(defaults::ADDRESSES_TRIED) {
                match TcpStream::connect(SocketAddr::new(a, port)).await {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(s);
                    }
                    Err(e) => last = Some(format!("{a}: {e}")),
                }
            }
            Err(refuse(Reason::Upstream {
                detail: format!("connect failed: {}", last.unwrap_or_default()),
                timeout: false,
            }))
        };
        let stream = match tokio::time::timeout(limits.connect_timeout, connect).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(refuse(Reason::Upstream {
                    detail: format!("no answer within {:?}", limits.connect_timeout),
                    timeout: true,
                }))
            }
        };
        record.connected();
        Ok((stream, permit, rule))
    }
}

/// Bytes a tunnel's copy moves per read, each way (tokio's default is 8 KiB: a 200 MB
/// download took 25,000 reads and writes each way for it).
const TUNNEL_BUF: usize = 64 << 10;

/// A tunnel's bytes, both ways, once the client has the 200. Its first record must be a
/// TLS ClientHello ([`tls::client_hello`]): a tunnel is for HTTPS (and other TLS), not any
/// protocol on an allowed port; and when the tunnel was opened to a name, the server name
/// the ClientHello asks for (if any) must be that name (no domain fronting).
async fn relay(
    on_upgrade: hyper::upgrade::OnUpgrade,
    mut upstream: Metered<TcpStream>,
    traffic: &Traffic,
    name: Option<String>,
) -> &'static str {
    let Ok(client) = on_upgrade.await else {
        return "error";
    };
    let mut client = TokioIo::new(client);
    let mut first = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        match tls::client_hello(&first) {
            Hello::NotTls => return "not_tls",
            Hello::ServerName(sni) => match (sni, &name) {
                (Some(sni), Some(name)) if &sni != name => return "sni_mismatch",
                _ => break,
            },
            Hello::Need(n) => {
                let want = n.saturating_sub(first.len()).clamp(1, chunk.len());
                match client.read(&mut chunk[..want]).await {
                    Ok(0) if first.is_empty() => return "ok",
                    Ok(0) | Err(_) => return "error",
                    Ok(k) => first.extend_from_slice(&chunk[..k]),
                }
            }
        }
    }
    if upstream.write_all(&first).await.is_err() {
        return if traffic.cut() { "limit" } else { "error" };
    }
    match tokio::io::copy_bidirectional_with_sizes(
        &mut client,
        &mut upstream,
        TUNNEL_BUF,
        TUNNEL_BUF,
    )
    .await
    {
        Ok(_) => "ok",
        Err(_) if traffic.cut() => "limit",
        Err(_) => "error",
    }
}

/// Headers that belong to one hop, not to the request or response forwarded: the
/// standard ones, the proxy's own, and those the `Connection` header names.
pub(super) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    ] {
        h.remove(n);
    }
}

/// Drive one upstream HTTP connection in the background until it ends, stays quiet past
/// `idle_limit` or its run is cancelled; then give its place back and log it with its
/// bytes each way (plain HTTP here, intercepted HTTPS in [`super::intercept`]).
pub(super) fn supervise<C, E>(
    conn: C,
    traffic: Arc<Traffic>,
    idle_limit: std::time::Duration,
    cancel: CancellationToken,
    permit: OwnedSemaphorePermit,
    record: Record,
) where
    C: std::future::Future<Output = Result<(), E>> + Send + 'static,
{
    tokio::spawn(async move {
        let outcome = tokio::select! {
            r = conn => if traffic.cut() { "limit" } else if r.is_ok() { "ok" } else { "error" },
            _ = idle(&traffic, idle_limit) => "idle_timeout",
            _ = cancel.cancelled() => "cancelled",
        };
        drop(permit);
        let (up, down) = traffic.bytes();
        record.finish(outcome, up, down);
    });
}

/// Headers that tell an upstream where a request came from or which host it was for: the
/// code sends none of them through the proxy (an upstream that trusts them would take the
/// code's word for the client's address or the original host).
const ROUTING: [&str; 2] = ["forwarded", "x-real-ip"];

/// Remove the routing headers the code sent: [`ROUTING`] and every `X-Forwarded-*`.
pub(super) fn strip_routing(h: &mut HeaderMap) {
    let forwarded: Vec<HeaderName> = h
        .keys()
        .filter(|n| ROUTING.contains(&n.as_str()) || n.as_str().starts_with("x-forwarded-"))
        .cloned()
        .collect();
    for n in forwarded {
        h.remove(n);
    }
}

/// A request as it goes upstream: in origin form (its path and query alone), HTTP/1.1,
/// without hop-by-hop or routing headers (plain HTTP here, intercepted HTTPS in
/// [`super::intercept`]).
pub(super) fn to_origin_form(parts: &mut hyper::http::request::Parts) {
    parts.uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .parse()
        .unwrap_or_else(|_| hyper::Uri::from_static("/"));
    parts.version = hyper::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    strip_routing(&mut parts.headers);
}

pub(super) fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|n| match n {}).boxed()
}

/// The answer to a refused or failed connection: status, reason phrase, body.
pub(super) fn refusal(r: &Refusal) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(r.body()))
            .map_err(|n| match n {})
            .boxed(),
    );
    *resp.status_mut() = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::FORBIDDEN);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        HeaderName::from_static(defaults::REFUSAL_HEADER),
        HeaderValue::from_static(r.label()),
    );
    if let Ok(p) = hyper::ext::ReasonPhrase::try_from(r.phrase().into_bytes()) {
        resp.extensions_mut().insert(p);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_goes_upstream_without_hop_by_hop_or_routing_headers() {
        let req = Request::builder()
            .method("GET")
            .uri("http://data.example.test:8080/a/b?c=d")
            .header("Forwarded", "for=10.0.0.1;host=internal")
            .header("X-Forwarded-For", "10.0.0.1")
            .header("x-forwarded-host", "internal.example")
            .header("X-Forwarded-Proto", "http")
            .header("X-Real-IP", "10.0.0.1")
            .header("Connection", "keep-alive, x-custom-hop")
            .header("x-custom-hop", "1")
            .header("Proxy-Authorization", "Basic eA==")
            .header("Accept", "text/csv")
            .header("X-Forwarded", "kept: not a routing header by this name")
            .body(())
            .unwrap();
        let (mut parts, ()) = req.into_parts();
        to_origin_form(&mut parts);
        assert_eq!(parts.uri, "/a/b?c=d");
        assert_eq!(parts.version, hyper::Version::HTTP_11);
        let mut left: Vec<&str> = parts.headers.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["accept", "x-forwarded"]);
    }
}
