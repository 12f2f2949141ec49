//! The guards of a local server against DNS rebinding: the `Host` allowlist and the
//! `Origin` check (which the MCP specification requires), for both transports alike.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::HttpOptions;
use crate::mcp::defaults;

/// Refuse requests to `/mcp`, `/sse` and `/messages` whose `Host` is not on the allowlist
/// or whose `Origin` (when there is one) is not accepted by [`origin_ok`]: 403 with a JSON
/// body naming the flag that admits it.
pub(super) async fn check_host(
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
pub(super) fn host_refusal(request: &Request, opts: &HttpOptions) -> Option<Response> {
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
pub(super) fn origin_ok(origin: &str, opts: &HttpOptions) -> bool {
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

pub(super) fn header_str(request: &Request, name: header::HeaderName) -> String {
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
