//! Which issuer URLs may be fetched from: `https` anywhere, plain `http` only on this
//! machine's loopback. The rule holds for a `--oauth-issuer` (checked at start-up), the
//! metadata URLs made from it, and the `jwks_uri` its metadata names (checked before the
//! first fetch): keys fetched over plain HTTP from another host could be replaced on the
//! way. The URL is parsed: "loopback" is the host exactly `localhost`, an IPv4 address of
//! 127.0.0.0/8 or `[::1]`, never a name that merely starts like one
//! (`http://localhost.attacker.example`, `http://127.0.0.1.nip.io`), and no user part
//! (`http://localhost@attacker.example` names the host `attacker.example`).

use std::net::{Ipv4Addr, Ipv6Addr};

use axum::http::Uri;

/// Is `host` (as a URL gives it, IPv6 in brackets) this machine's loopback?
pub fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6.parse::<Ipv6Addr>().is_ok_and(|a| a.is_loopback());
    }
    host.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback())
}

/// `Ok` when `url` is an absolute `https` URL, or an `http` one whose host is loopback;
/// otherwise why not. No user part, query or fragment (an issuer identifier has none, and a
/// key set's URL needs none).
pub fn check_fetch_url(url: &str) -> Result<(), String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{url:?} is not an absolute URL"))?;
    if authority.as_str().contains('@') {
        return Err(format!("{url:?} has a user part: give the host alone"));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(format!("{url:?} has a query or a fragment"));
    }
    let host = authority.host();
    // The authority must be the host and at most a port (the parser takes
    // `[::1].attacker.example` for the host `[::1]`).
    let rest = &authority.as_str()[host.len().min(authority.as_str().len())..];
    let port_ok = rest
        .strip_prefix(':')
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !authority.as_str().starts_with(host) || !(rest.is_empty() || port_ok) {
        return Err(format!("{url:?} has a malformed host"));
    }
    match uri.scheme_str() {
        Some("https") if !host.is_empty() => Ok(()),
        Some("http") if is_loopback_host(host) => Ok(()),
        Some("http") => Err(format!(
            "{url:?} is plain http on host {host:?}, which is not this machine's loopback \
             (localhost, 127.0.0.0/8, [::1]): use https"
        )),
        _ => Err(format!("{url:?} must be an https URL")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 42, finding 8: `http://localhost.attacker.example` passed a prefix test.
    #[test]
    fn plain_http_only_on_a_parsed_loopback_host() {
        for ok in [
            "https://as.example",
            "https://as.example/tenant/a",
            "https://as.example:8443/",
            "http://localhost",
            "http://LOCALHOST:8080/realms/x",
            "http://127.0.0.1:9000",
            "http://127.8.9.10",
            "http://[::1]:4444/",
        ] {
            assert_eq!(check_fetch_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "http://localhost.attacker.example",
            "http://localhost.attacker.example/jwks",
            "http://127.0.0.1.nip.io",
            "http://127.0.0.1.attacker.example:80",
            "http://[::1].attacker.example",
            "http://localhost@attacker.example",
            "http://127.0.0.1@attacker.example",
            "http://attacker.example/?x=http://localhost",
            "http://128.0.0.1",
            "http://0.0.0.0",
            "http://[::2]",
            "http://[::ffff:127.0.0.1]",
            "http://localhostx",
            "http://as.example",
            "ftp://localhost",
            "localhost",
            "/jwks",
            "https://as.example/#frag",
            "https://as.example/?q=1",
            "",
        ] {
            assert!(check_fetch_url(bad).is_err(), "{bad} must be refused");
        }
    }
}
