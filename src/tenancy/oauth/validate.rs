//! The checks of one JWT access token (RFC 9068), with no I/O: which issuer it claims
//! ([`peek`]), then its signature with the issuer's key and its claims ([`verify`]):
//! an asymmetric algorithm of [`ALGORITHMS`] (never `none`, never `HS*`), the key's own
//! algorithm when the key names one, `iss` exactly the issuer, `aud` present and one of
//! this server's resource identifiers, `exp` (required) and `nbf` (when present) with at
//! most [`LEEWAY`] of clock skew. The signature and claim checks are `jsonwebtoken`'s;
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
    /// A valid token that no rule of the tenants file maps to a tenant.
    NoTenant,
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
            Refusal::NoTenant => "no_tenant",
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
        .ok_or_else(|| invalid(format!("algorithm {alg_name:?} is not allowed")))?;
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

/// The verified claims of a token.
pub type Claims = Map<String, Value>;

/// Verify `token` (peeked as `p`) with `key` from the issuer's JWKS: signature, algorithm,
/// `iss` == `issuer`, `aud` one of `audiences`, `exp`, `nbf`, `sub`.
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
        Ok(d) => Ok(d.claims),
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
mod tests {
    use super::*;

    fn b64(v: &Value) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
    }

    fn jwt(header: Value, payload: Value) -> String {
        format!("{}.{}.c2ln", b64(&header), b64(&payload))
    }

    #[test]
    fn peek_refuses_none_and_hmac_and_junk() {
        let p = serde_json::json!({"iss": "https://as.example"});
        for alg in ["none", "HS256", "HS512", "", "rs256"] {
            let t = jwt(serde_json::json!({"alg": alg}), p.clone());
            assert!(
                matches!(peek(&t), Err(Refusal::Invalid(_))),
                "{alg} must be refused"
            );
        }
        for junk in ["", "abc", "a.b", "a.b.c.d", "mcpx_0123"] {
            assert!(matches!(peek(junk), Err(Refusal::Invalid(_))), "{junk}");
        }
        let no_iss = jwt(serde_json::json!({"alg": "RS256"}), serde_json::json!({}));
        assert!(matches!(peek(&no_iss), Err(Refusal::Invalid(_))));
        let ok = jwt(
            serde_json::json!({"alg": "ES256", "kid": "k1", "jku": "https://evil.example/jwks"}),
            p,
        );
        assert_eq!(
            peek(&ok).unwrap(),
            Peeked {
                alg: Algorithm::ES256,
                kid: Some("k1".into()),
                issuer: "https://as.example".into()
            }
        );
        assert!(peek(&"a".repeat(MAX_TOKEN_BYTES + 1)).is_err());
    }

    #[test]
    fn jwt_shape_tells_static_tokens_apart() {
        assert!(looks_like_jwt("eyJh.eyJi.sig"));
        assert!(looks_like_jwt("eyJh.eyJi."));
        assert!(!looks_like_jwt("mcpx_0123abcd"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a b.c.d"));
    }

    #[test]
    fn scopes_from_scope_or_scp() {
        let c: Claims = serde_json::from_value(serde_json::json!({
            "scope": "mcp  openid", "scp": ["extra", "mcp"]
        }))
        .unwrap();
        assert_eq!(scopes(&c), vec!["extra", "mcp", "openid"]);
        assert!(scopes(&Claims::new()).is_empty());
        let c: Claims = serde_json::from_value(serde_json::json!({"org": 7})).unwrap();
        assert_eq!(claim_text(&c, "org").as_deref(), Some("7"));
    }

    /// A P-256 key made for this test only (PKCS#8 DER) and its public JWK.
    const TEST_KEY_DER: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgL3tj+CylrjOFPRhBHNH+eVi5XMIrXiocQZnRazzy+nOhRANCAARoiM6qHtIVuBsnJAacO/RtKHZBHu/NaWcVvUk2Xt2/Td395qcAPUzT7vSwahpEUldDlpufBNKPvhc60IZubBUL";

    fn test_jwk() -> Jwk {
        serde_json::from_value(serde_json::json!({
            "kty": "EC", "crv": "P-256", "kid": "t1", "alg": "ES256",
            "x": "aIjOqh7SFbgbJyQGnDv0bSh2QR7vzWlnFb1JNl7dv00",
            "y": "3f3mpwA9TNPu9LBqGkRSV0OWm58E0o--FzrQhm5sFQs"
        }))
        .unwrap()
    }

    fn signed(claims: Value) -> String {
        let der = base64::engine::general_purpose::STANDARD
            .decode(TEST_KEY_DER)
            .unwrap();
        let mut h = jsonwebtoken::Header::new(Algorithm::ES256);
        h.kid = Some("t1".into());
        jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_ec_der(&der)).unwrap()
    }

    fn now() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    #[test]
    fn verify_checks_signature_issuer_audience_and_times() {
        let aud = vec!["https://mcp.example.com/mcp".to_string()];
        let base = serde_json::json!({
            "iss": "https://as.example", "sub": "u1", "aud": "https://mcp.example.com/mcp",
            "exp": now() + 600, "scope": "mcp"
        });
        let with = |k: &str, v: Value| {
            let mut c = base.clone();
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v;
            }
            c
        };
        let check = |t: &str| {
            let p = peek(t).unwrap();
            verify(t, &p, &test_jwk(), "https://as.example", &aud)
        };
        let c = check(&signed(base.clone())).unwrap();
        assert_eq!(c["sub"], "u1");
        assert_eq!(
            check(&signed(with("exp", (now() - 61).into()))),
            Err(Refusal::Expired)
        );
        // Within the 60 s leeway: still accepted.
        assert!(check(&signed(with("exp", (now() - 30).into()))).is_ok());
        assert!(matches!(
            check(&signed(with("nbf", (now() + 120).into()))),
            Err(Refusal::Invalid(_))
        ));
        assert!(check(&signed(with("nbf", (now() + 30).into()))).is_ok());
        assert_eq!(
            check(&signed(with("aud", "https://other.example".into()))),
            Err(Refusal::Audience)
        );
        assert_eq!(
            check(&signed(with("aud", Value::Null))),
            Err(Refusal::Audience)
        );
        assert!(check(&signed(with("aud", serde_json::json!(["x", aud[0]])))).is_ok());
        assert!(matches!(
            check(&signed(with("iss", "https://as.example/".into()))),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            check(&signed(with("sub", Value::Null))),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            check(&signed(with("exp", Value::Null))),
            Err(Refusal::Invalid(_))
        ));
        // A flipped signature byte.
        let t = signed(base.clone());
        let mut bad = t.clone().into_bytes();
        let last = bad.len() - 2;
        bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
        assert!(matches!(
            check(std::str::from_utf8(&bad).unwrap()),
            Err(Refusal::Invalid(_))
        ));
        // The key's own alg must match the header's.
        let mut rs_key = test_jwk();
        rs_key.common.key_algorithm = Some(jsonwebtoken::jwk::KeyAlgorithm::ES384);
        let p = peek(&t).unwrap();
        assert!(matches!(
            verify(&t, &p, &rs_key, "https://as.example", &aud),
            Err(Refusal::Invalid(_))
        ));
    }

    #[test]
    fn reasons_are_the_metric_labels() {
        let all = [
            Refusal::Missing,
            Refusal::Invalid("x".into()),
            Refusal::Audience,
            Refusal::Expired,
            Refusal::Scope,
            Refusal::NoTenant,
        ];
        let got: Vec<_> = all.iter().map(Refusal::reason).collect();
        assert_eq!(got, Refusal::REASONS);
    }
}
