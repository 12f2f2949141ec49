//! Interception (#41 item 3): a `CONNECT` to a host whose rule adds headers is not
//! tunnelled. The proxy answers 200, terminates the code's TLS with a leaf of its own CA
//! ([`super::ca`], trusted only by the sandboxes), reads each HTTP/1.1 request on the
//! decrypted stream (keep-alive), checks it against the rule's methods and paths, sets the
//! rule's headers (replacing any of the same name the code sent) and forwards it over a
//! new, fully verified TLS connection to the host (the system's roots and the policy's
//! `upstream_ca`; the host's own name as SNI), reached through the same phases as a
//! tunnel (rate, policy, budget, resolution, address checks, metered socket, timeouts).
//! The response streams back; bodies are never held whole. One upstream connection per
//! request, each with its own log record (kind `https`).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::ServerName;

use super::defaults;
use super::limits::{Metered, Traffic};
use super::policy::{Ask, Host};
use super::proxy::{
    empty, refusal, strip_hop_by_hop, supervise, to_origin_form, Body, Proxy, RunScope,
};
use super::record::Record;
use super::refusal::{Reason, Refusal};

impl Proxy {
    /// `CONNECT host:port` of a rule with headers: answer 200, then serve the requests
    /// inside the code's TLS (in a task of its own, ended with the run).
    pub(super) fn intercepted(
        self: Arc<Self>,
        req: Request<Incoming>,
        scope: Arc<RunScope>,
        host: String,
        port: u16,
    ) -> Response<Body> {
        let name = Host::parse(&host).map(|h| h.as_text()).unwrap_or_default();
        // The code's connection counts against its tenant's rate before a leaf is minted
        // for it (a wildcard rule names any number of hosts, each a new key pair).
        if let Err(reason) = self.rate.take(&scope.tenant) {
            let r = Refusal::new(&host, port, reason);
            Record::new(&scope.tenant, &scope.run, &host, port, "https").finish(r.label(), 0, 0);
            return refusal(&r);
        }
        let on_upgrade = hyper::upgrade::on(req);
        let idle_limit = self.policy.limits.idle_timeout;
        let cancel = scope.cancel.clone();
        tokio::spawn(async move {
            let serve = async {
                // Minted (key pair, signature) on a blocking thread, off the proxy's.
                let p = self.clone();
                let leaf_name = name.clone();
                let acceptor =
                    tokio::task::spawn_blocking(move || p.intercept.acceptor(&leaf_name)).await;
                let acceptor = match acceptor {
                    Ok(Ok(a)) => a,
                    Ok(Err(e)) => {
                        let r = Refusal::new(&host, port, Reason::BadRequest { detail: e });
                        Record::new(&scope.tenant, &scope.run, &host, port, "https").finish(
                            r.label(),
                            0,
                            0,
                        );
                        return;
                    }
                    Err(_) => return,
                };
                let Ok(client) = on_upgrade.await else { return };
                let tls = tokio::time::timeout(idle_limit, acceptor.accept(TokioIo::new(client)));
                let Ok(Ok(tls)) = tls.await else { return };
                let proxy = self.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (p, s, h) = (proxy.clone(), scope.clone(), name.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(p.forward_tls(req, s, h, port).await)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(idle_limit)
                    .max_buf_size(defaults::MAX_HEADER_BYTES)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            };
            tokio::select! {
                _ = serve => {}
                _ = cancel.cancelled() => {}
            }
        });
        Response::new(empty())
    }

    /// One request of an intercepted connection: checked, its headers set, forwarded over
    /// verified TLS, the response streamed back.
    async fn forward_tls(
        self: Arc<Self>,
        req: Request<Incoming>,
        scope: Arc<RunScope>,
        host: String,
        port: u16,
    ) -> Response<Body> {
        let mut record = Record::new(&scope.tenant, &scope.run, &host, port, "https");
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let ask = Ask::Intercepted {
            method: &method,
            path: &path,
        };
        let (tcp, permit, rule) = match self.open(&scope, &host, port, ask, &mut record).await {
            Ok(x) => x,
            Err(r) => {
                record.finish(r.label(), 0, 0);
                return refusal(&r);
            }
        };
        let added = rule.headers.clone();
        let upstream_failed = |detail: String, timeout| {
            refusal(&Refusal::new(
                &host,
                port,
                Reason::Upstream { detail, timeout },
            ))
        };
        let traffic = Traffic::new();
        let metered = Metered::new(tcp, scope.budget.clone(), traffic.clone());
        let server_name = match ServerName::try_from(host.clone()) {
            Ok(n) => n,
            Err(e) => return upstream_failed(format!("not a TLS server name: {e}"), false),
        };
        let limits = &self.policy.limits;
        let handshake = self.intercept.connector().connect(server_name, metered);
        let tls = match tokio::time::timeout(limits.connect_timeout, handshake).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                let (up, down) = traffic.bytes();
                record.finish("tls_failed", up, down);
                return upstream_failed(format!("TLS with the upstream: {e}"), false);
            }
            Err(_) => {
                let (up, down) = traffic.bytes();
                record.finish("connect_timeout", up, down);
                return upstream_failed(
                    format!("no TLS handshake within {:?}", limits.connect_timeout),
                    true,
                );
            }
        };
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake(TokioIo::new(tls)).await {
                Ok(x) => x,
                Err(e) => {
                    let (up, down) = traffic.bytes();
                    record.finish("error", up, down);
                    return upstream_failed(format!("HTTP handshake: {e}"), false);
                }
            };
        supervise(
            conn,
            traffic.clone(),
            limits.idle_timeout,
            scope.cancel.clone(),
            permit,
            record,
        );
        let (mut parts, body) = req.into_parts();
        to_origin_form(&mut parts);
        let authority = if port == 443 {
            host.clone()
        } else {
            format!("{host}:{port}")
        };
        if let Ok(h) = HeaderValue::from_str(&authority) {
            parts.headers.insert(header::HOST, h);
        }
        for h in &added {
            // Checked when the policy was read: a token name, a visible-ASCII value.
            let (Ok(name), Ok(mut value)) = (
                HeaderName::from_bytes(h.name.as_bytes()),
                HeaderValue::from_str(h.value.expose()),
            ) else {
                continue;
            };
            value.set_sensitive(true);
            parts.headers.insert(name, value);
        }
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, http_body_util::BodyExt::boxed(body))
            }
            Err(e) => upstream_failed(format!("the upstream's answer: {e}"), false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Policy;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The head of the proxy's answer to a `CONNECT` for `host` on a stream of its own.
    async fn connect(proxy: &Arc<Proxy>, scope: &Arc<RunScope>, host: &str) -> String {
        let (mut code, io) = tokio::io::duplex(1 << 16);
        tokio::spawn(proxy.clone().serve(io, scope.clone()));
        let head = format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n");
        code.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), code.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        // Kept open a moment so that an accepted CONNECT reaches its upgrade.
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            drop(code);
        });
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn a_connect_to_an_intercepted_host_takes_the_rate_before_a_leaf_is_minted() {
        let dir = std::env::temp_dir().join(format!("egress-rate-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "Bearer unit").unwrap();
        let text = format!(
            "[limits]\nconnections_per_second = 1\n[[rules]]\nhost = \"*.example.test\"\n\
             headers = {{ Authorization = {{ file = \"{}\" }} }}\n",
            token.display()
        );
        let policy = Policy::parse(&text);
        std::fs::remove_dir_all(&dir).unwrap();
        let proxy = Proxy::new(policy.unwrap());
        let scope = proxy.run_scope("t", "run");
        let first = connect(&proxy, &scope, "a.example.test").await;
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        let second = connect(&proxy, &scope, "b.example.test").await;
        assert!(second.contains("connections_per_second"), "{second}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        // One leaf: the accepted host's, minted off the proxy's thread; none for the refused.
        assert_eq!(proxy.intercept.leaves(), 1);
    }
}
