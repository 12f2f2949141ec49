//! The checks of one JWT access token (RFC 9068), with no I/O: which issuer it claims
//! ([`peek`]), then its signature with the issuer's key and its claims ([`verify`]):
//! an asymmetric algorithm of [`ALGORITHMS`] (never `none`, never `HS*`), the key's own
//! algorithm when the key names one, `iss` exactly the issuer, `aud` present and one of
//! this server's resource identifiers, `exp` (required) and `nbf` (when present) with at
//! most [`LEEWAY`] of clock skew and at most [`MAX_EXP_AHEAD`] ahead, `sub` a non-empty
//! string, no `crit` header, a `typ` (when given) of an access token ([`check_header`]).
//! The signature and the standard claim checks are `jsonwebtoken`'s;
//! `jku`, `x5u` and `jwk` in the header are never read: keys come only from the issuer's
//! JWKS, found from its metadata.

use base64::Engine as _;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

/// Asymmetric signature algorithms accepted; anything else (`none`, `HS256`...) is refused.
pub const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Clock skew allowed on `exp` and `nbf`, seconds.
pub const LEEWAY: u64 = 60;

/// Longest token looked at (a JWT access token is a few KiB at most).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The furthest an `exp` may lie ahead: a token said to be valid for longer is refused
/// (issue 42: `exp` up to `u64::MAX` was accepted, a token that never expires). Access
/// tokens live minutes to hours; a year leaves room for any issuer's setting.
pub const MAX_EXP_AHEAD: u64 = 366 * 24 * 3600;

/// The most characters of a value from a token that a refusal's text carries.
pub const SHOWN_CHARS: usize = 48;

/// A value from an untrusted token for a refusal's text (and so the log): quoted with
/// every control character escaped, at most [`SHOWN_CHARS`] characters of it, and its
/// full length when it was cut.
pub fn shown(value: &str) -> String {
    let n = value.chars().count();
    if n <= SHOWN_CHARS {
        return format!("{value:?}");
    }
    let head: String = value.chars().take(SHOWN_CHARS).collect();
    format!("{head:?}… ({} bytes)", value.len())
}

/// Why a token was refused. [`Refusal::reason`] is the label of the refusal counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No token at all.
    Missing,
    /// Not a JWT, a bad signature, an algorithm not allowed, an unknown issuer or key, `nbf`
    /// in the future, a claim missing or malformed. The text says which (for the log, not
    /// for the client).
    Invalid(String),
    /// `aud` missing or not this server.
    Audience,
    /// `exp` passed.
    Expired,
    /// A valid token without the scope the server needs.
    Scope,
    /// A valid token that no rule of the tenants file maps to a tenant: what the rules of
    /// its issuer looked at, quoted and cut ([`shown`]), for the log.
    NoTenant(String),
}

impl Refusal {
    /// The metric label: `missing`, `invalid`, `audience`, `expired`, `scope`, `no_tenant`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Invalid(_) => "invalid",
            Refusal::Audience => "audience",
            Refusal::Expired => "expired",
            Refusal::Scope => "scope",
            Refusal::NoTenant(_) => "no_tenant",
        }
    }

    /// Every reason, for the metric's zero values.
    pub const REASONS: [&'static str; 6] = [
        "missing",
        "invalid",
        "audience",
        "expired",
        "scope",
        "no_tenant",
    ];
}

fn invalid(why: impl Into<String>) -> Refusal {
    Refusal::Invalid(why.into())
}

/// What a token says before it is verified: its algorithm (one of [`ALGORITHMS`]), key id
/// and issuer. Only used to pick the issuer and key; nothing here is trusted.
#[derive(Debug, Clone, PartialEq)]
pub struct Peeked {
    pub alg: Algorithm,
    pub kid: Option<String>,
    pub issuer: String,
}

/// Is `token` shaped like a JWT (three base64url parts)? Static `mcpx_` tokens are not.
pub fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts[..2].iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The header's algorithm and key id and the payload's `iss`, unverified.
pub fn peek(token: &str) -> Result<Peeked, Refusal> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(invalid("token too long"));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid("not a JWT"));
    };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Map<String, Value> = b64
        .decode(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| invalid("the JWT header is not base64url JSON"))?;
    let alg_name = header.get("alg").and_then(Value::as_str).unwrap_or("");
    let alg = ALGORITHMS
        .iter()
        .copied()
        .find(|a| format!("{a:?}") == alg_name)
        .ok_or_else(|| invalid(format!("algorithm {} is not allowed", shown(alg_name))))?;
    check_header(&header)?;
    let kid = header
        .get("kid")
        .and_then(Value::as_str)
        .map(str::to_string);
    let payload: Map<String, Value> = b64
        .decode(p)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| invalid("the JWT payload is not base64url JSON"))?;
    let issuer = payload
        .get("iss")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("no iss claim"))?
        .to_string();
    Ok(Peeked { alg, kid, issuer })
}

/// The header fields RFC 9068 and RFC 7515 leave to the resource server:
/// - `crit`: this server understands no JWS extension, so a token that names any as
///   critical is refused (RFC 7515 §4.1.11; `crit: ["exp"]` was accepted before).
/// - `typ`: `at+jwt` (RFC 9068, what oidc-provider issues; vendor forms ending in `-at+jwt`
///   such as Okta's `application/okta-internal-at+jwt`), and also `JWT` or none, since
///   Keycloak, Entra ID and Auth0 sign their access tokens so; an ID token, which is a
///   `JWT` too, is kept out by the audience (its `aud` is the client, never this server).
///   A type that names another kind of JWT (`dpop+jwt`, `logout+jwt`, `secevent+jwt`…) is
///   refused.
pub fn check_header(header: &Map<String, Value>) -> Result<(), Refusal> {
    if let Some(crit) = header.get("crit") {
        return Err(invalid(format!(
            "the header names critical extensions this server does not understand (crit {})",
            shown(&crit.to_string())
        )));
    }
    match header.get("typ") {
        None => Ok(()),
        Some(Value::String(t)) => {
            let t = t.to_ascii_lowercase();
            let t = t.strip_prefix("application/").unwrap_or(&t);
            if t == "at+jwt" || t.ends_with("-at+jwt") || t == "jwt" {
                Ok(())
            } else {
                Err(invalid(format!(
                    "typ {} is not an access token (at+jwt)",
                    shown(t)
                )))
            }
        }
        Some(other) => Err(invalid(format!(
            "typ {} is not a string",
            shown(&other.to_string())
        ))),
    }
}

/// The claim checks `jsonwebtoken` leaves to us, on verified claims at time `now` (Unix
/// seconds): `exp` at most [`MAX_EXP_AHEAD`] ahead, and `sub` a non-empty string (an
/// empty one would make every such token the same user).
pub fn check_claims(claims: &Claims, now: u64) -> Result<(), Refusal> {
    let exp = claims
        .get("exp")
        .and_then(Value::as_f64)
        .unwrap_or(f64::MAX);
    if exp > (now + MAX_EXP_AHEAD) as f64 {
        return Err(invalid(format!(
            "exp {} is more than {} days ahead",
            shown(&claims.get("exp").map(Value::to_string).unwrap_or_default()),
            MAX_EXP_AHEAD / 86400
        )));
    }
    match claims.get("sub") {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(()),
        Some(Value::String(_)) => Err(invalid("an empty sub")),
        _ => Err(invalid("sub is not a string")),
    }
}

/// The verified claims of a token.
pub type Claims = Map<String, Value>;

/// Verify `token` (peeked as `p`) with `key` from the issuer's JWKS: signature, algorithm,
/// `iss` == `issuer`, `aud` one of `audiences`, `exp`, `nbf`, `sub` ([`check_claims`]).
pub fn verify(
    token: &str,
    p: &Peeked,
    key: &Jwk,
    issuer: &str,
    audiences: &[String],
) -> Result<Claims, Refusal> {
    if let Some(ka) = key.common.key_algorithm {
        if format!("{ka:?}") != format!("{:?}", p.alg) {
            return Err(invalid(format!(
                "the key is for {ka:?}, the token says {:?}",
                p.alg
            )));
        }
    }
    let dk = DecodingKey::from_jwk(key).map_err(|e| invalid(format!("unusable key: {e}")))?;
    let mut v = Validation::new(p.alg);
    v.algorithms = vec![p.alg];
    v.leeway = LEEWAY;
    v.validate_exp = true;
    v.validate_nbf = true;
    v.validate_aud = true;
    v.set_issuer(&[issuer]);
    v.set_audience(audiences);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    use jsonwebtoken::errors::ErrorKind as K;
    match jsonwebtoken::decode::<Claims>(token, &dk, &v) {
        Ok(d) => {
            check_claims(&d.claims, jsonwebtoken::get_current_timestamp())?;
            Ok(d.claims)
        }
        Err(e) => Err(match e.kind() {
            K::ExpiredSignature => Refusal::Expired,
            K::InvalidAudience => Refusal::Audience,
            K::MissingRequiredClaim(c) if c == "aud" => Refusal::Audience,
            K::ImmatureSignature => invalid("not yet valid (nbf)"),
            K::InvalidIssuer => invalid("iss is not the issuer"),
            K::InvalidSignature => invalid("bad signature"),
            K::InvalidAlgorithm => invalid("algorithm does not match the key"),
            other => invalid(format!("{other:?}")),
        }),
    }
}

/// The scopes a token grants: `scope` (space-separated, RFC 9068) or `scp` (a list or a
/// string, as some issuers write it).
pub fn scopes(claims: &Claims) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in ["scope", "scp"] {
        match claims.get(name) {
            Some(Value::String(s)) => out.extend(s.split_whitespace().map(str::to_string)),
            Some(Value::Array(a)) => {
                out.extend(a.iter().filter_map(Value::as_str).map(str::to_string))
            }
            _ => {}
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A claim as text (a string, or a number), for the tenant rules.
pub fn claim_text(claims: &Claims, name: &str) -> Option<String> {
    match claims.get(name)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
