//! Why a connection was refused or failed, and how the sandboxed code is told: an HTTP
//! status, a reason phrase that clients show (a refused `CONNECT` surfaces in `requests`
//! and `urllib` as "Tunnel connection failed: 403 …", the body unread) and a body that
//! names the host, the port, the reason and what the operator would write to allow it.

use std::fmt::Write as _;
use std::net::IpAddr;

use super::address::Class;

/// Why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// No rule of the tenant's policy allows this host and port (`detail`: what was near,
    /// e.g. the rule that names the host with other ports).
    NotInPolicy { detail: Option<String> },
    /// The name resolved only to addresses of a refused class, and no rule names them.
    PrivateAddress { addr: IpAddr, class: Class },
    /// A limit of the run or the tenant: `what` in words, `key` the policy file's key.
    Limit { what: String, key: &'static str },
    /// The request is not one a proxy serves (origin-form, `https://` in absolute-form,
    /// a bad authority, a tunnel that does not start with TLS).
    BadRequest { detail: String },
    /// The name did not resolve, or no address answered (`timeout`: within the connect
    /// timeout).
    Upstream { detail: String, timeout: bool },
}

/// A refused (or failed) connection to `host`:`port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The host as shown: escaped and capped (see [`super::record::shown`]).
    pub host: String,
    pub port: u16,
    pub reason: Reason,
}

impl Refusal {
    pub fn new(host: &str, port: u16, reason: Reason) -> Refusal {
        Refusal {
            host: super::record::shown(host),
            port,
            reason,
        }
    }

    /// The HTTP status: 403 for the policy, 429 for a limit, 400 for a bad request, 502 or
    /// 504 when upstream failed.
    pub fn status(&self) -> u16 {
        match &self.reason {
            Reason::NotInPolicy { .. } | Reason::PrivateAddress { .. } => 403,
            Reason::Limit { .. } => 429,
            Reason::BadRequest { .. } => 400,
            Reason::Upstream { timeout: false, .. } => 502,
            Reason::Upstream { timeout: true, .. } => 504,
        }
    }

    /// The outcome label of the log record and the metrics.
    pub fn label(&self) -> &'static str {
        match &self.reason {
            Reason::NotInPolicy { .. } => "not_in_policy",
            Reason::PrivateAddress { .. } => "private_address",
            Reason::Limit { .. } => "limit",
            Reason::BadRequest { .. } => "bad_request",
            Reason::Upstream { timeout: false, .. } => "upstream_failed",
            Reason::Upstream { timeout: true, .. } => "connect_timeout",
        }
    }

    /// The reason in a few words ("not in the policy").
    pub fn short(&self) -> String {
        match &self.reason {
            Reason::NotInPolicy { .. } => "not in the policy".into(),
            Reason::PrivateAddress { addr, class } => {
                format!("{} ({addr})", class.describe().trim_start_matches("a "))
            }
            Reason::Limit { what, .. } => format!("limit: {what}"),
            Reason::BadRequest { detail } => format!("bad request: {detail}"),
            Reason::Upstream { timeout: true, .. } => "connect timeout".into(),
            Reason::Upstream { detail, .. } => detail.clone(),
        }
    }

    /// The status line's reason phrase: `Forbidden (egress: HOST:PORT not in the policy)`;
    /// visible ASCII only (the host is already escaped), as HTTP/1.1 allows.
    pub fn phrase(&self) -> String {
        let base = match self.status() {
            403 => "Forbidden",
            429 => "Too Many Requests",
            400 => "Bad Request",
            504 => "Gateway Timeout",
            _ => "Bad Gateway",
        };
        let p = format!("{base} (egress: {} {})", self.target(), self.short());
        p.chars()
            .map(|c| {
                if c.is_ascii_graphic() || c == ' ' {
                    c
                } else {
                    '?'
                }
            })
            .collect()
    }

    /// `host:port`, or what there is of it (a request that named no host).
    fn target(&self) -> String {
        match (self.host.is_empty(), self.port) {
            (true, _) => "a request that names no host".into(),
            (false, 0) => self.host.clone(),
            (false, p) => format!("{}:{p}", self.host),
        }
    }

    /// The body: what was refused, why, and how the operator allows it.
    pub fn body(&self) -> String {
        let (h, p) = (&self.host, self.port);
        let mut b = format!(
            "mcp-code-executor egress refused {}: {}.\n",
            self.target(),
            self.short()
        );
        match &self.reason {
            Reason::NotInPolicy { detail } => {
                if let Some(d) = detail {
                    let _ = writeln!(b, "{d}.");
                }
                let _ = write!(
                    b,
                    "The sandbox reaches only the hosts and ports of the operator's egress policy \
                     (default deny). The operator allows this one with a rule in the policy file \
                     (serve --egress FILE):\n\n[[rules]]\nhost = \"{h}\"\nports = [{p}]\n"
                );
            }
            Reason::PrivateAddress { addr, .. } => {
                let _ = write!(
                    b,
                    "Loopback, private, link-local, CGNAT, multicast and unspecified addresses are \
                     refused whatever a name resolves to. The operator allows this address with a \
                     rule that names it (or its range) in the policy file (serve --egress FILE):\n\n\
                     [[rules]]\nhost = \"{addr}\"\nports = [{p}]\n"
                );
            }
            Reason::Limit { key, .. } => {
                let _ = writeln!(
                    b,
                    "The operator sets this limit with `{key}` in the [limits] of the egress policy file."
                );
            }
            Reason::BadRequest { .. } => {
                let _ = writeln!(
                    b,
                    "This is an HTTP proxy: HTTPS goes through CONNECT (tunnels must carry TLS), \
                     plain HTTP in absolute form (GET http://host/path). Clients do this when \
                     HTTPS_PROXY / HTTP_PROXY name the proxy."
                );
            }
            Reason::Upstream { detail, .. } => {
                let _ = writeln!(
                    b,
                    "The policy allows it; the host did not answer ({detail})."
                );
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_host_port_reason_and_the_rule_that_allows_it() {
        let r = Refusal::new(
            "data.example.test",
            443,
            Reason::NotInPolicy { detail: None },
        );
        assert_eq!(r.status(), 403);
        assert_eq!(
            r.phrase(),
            "Forbidden (egress: data.example.test:443 not in the policy)"
        );
        assert!(r
            .body()
            .contains("[[rules]]\nhost = \"data.example.test\"\nports = [443]"));
        let r = Refusal::new(
            "meta.example.test",
            80,
            Reason::PrivateAddress {
                addr: "169.254.169.254".parse().unwrap(),
                class: Class::LinkLocal,
            },
        );
        assert_eq!(r.label(), "private_address");
        assert!(r.phrase().contains("link-local address"), "{}", r.phrase());
        assert!(r.body().contains("host = \"169.254.169.254\""));
        let r = Refusal::new(
            "evil\r\nX-Injected: 1",
            443,
            Reason::Limit {
                what: "16 connections in flight per run".into(),
                key: "connections_in_flight",
            },
        );
        assert_eq!(r.status(), 429);
        assert!(!r.phrase().contains('\r') && !r.phrase().contains('\n'));
        assert!(r.body().contains("`connections_in_flight`"));
        let r = Refusal::new(
            "",
            0,
            Reason::BadRequest {
                detail: "origin form".into(),
            },
        );
        assert!(r
            .body()
            .starts_with("mcp-code-executor egress refused a request that names no host: bad request: origin form."));
    }
}
