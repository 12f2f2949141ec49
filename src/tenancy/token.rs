//! Bearer tokens: made at random, stored only as SHA-256, checked in constant time.
//!
//! Tokens are 256 random bits, so a plain SHA-256 is enough to keep them out of the tenants
//! file (there is nothing to brute-force); a slow password hash would only slow every call.

use sha2::{Digest, Sha256};

use super::Tenant;

/// The SHA-256 of a token.
pub fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Lowercase hex of a hash.
pub fn to_hex(h: &[u8; 32]) -> String {
    h.iter().map(|b| format!("{b:02x}")).collect()
}

/// 64 hex digits (either case) as a hash.
pub fn parse_hex(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A new token: `mcpx_` and 256 random bits in hex (from the OS's generator, through v4
/// UUIDs).
pub fn generate() -> String {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("mcpx_{a}{b}")
}

/// Equal, in time that does not depend on where they differ.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the compiler from turning the fold into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// Maps a presented token to its tenant.
#[derive(Debug, Clone)]
pub struct Authenticator {
    tenants: Vec<(String, [u8; 32])>,
    /// OAuth sign-in beside the static tokens (`serve --oauth-issuer`).
    pub oauth: Option<std::sync::Arc<super::oauth::OAuth>>,
}

impl Authenticator {
    pub fn new(tenants: &[Tenant]) -> Self {
        Authenticator {
            tenants: tenants
                .iter()
                .filter_map(|t| Some((t.id.clone(), t.token_sha256?)))
                .collect(),
            oauth: None,
        }
    }

    /// The tenant whose token this is. Every tenant's hash is compared, whichever matches,
    /// so the time taken tells nothing about which tenants exist.
    pub fn tenant_of(&self, token: &str) -> Option<&str> {
        let h = hash(token);
        let mut found = None;
        for (id, want) in &self.tenants {
            if ct_eq(&h, want) {
                found = Some(id.as_str());
            }
        }
        found
    }

    /// The token of an `Authorization` header value (`Bearer <token>`, scheme in any case).
    pub fn bearer(header: &str) -> Option<&str> {
        let (scheme, token) = header.trim().split_once(' ')?;
        let token = token.trim();
        (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::TenantLimits;

    fn tenant(id: &str, token: &str) -> Tenant {
        Tenant {
            id: id.into(),
            token_sha256: Some(hash(token)),
            limits: TenantLimits::default(),
        }
    }

    #[test]
    fn tokens_map_to_their_tenant_only() {
        let auth = Authenticator::new(&[tenant("a", "tok-a"), tenant("b", "tok-b")]);
        assert_eq!(auth.tenant_of("tok-a"), Some("a"));
        assert_eq!(auth.tenant_of("tok-b"), Some("b"));
        assert_eq!(auth.tenant_of("tok-c"), None);
        assert_eq!(auth.tenant_of(""), None);
        assert_eq!(auth.tenant_of("tok-a "), None);
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(Authenticator::bearer("Bearer abc"), Some("abc"));
        assert_eq!(Authenticator::bearer("bearer  abc "), Some("abc"));
        assert_eq!(Authenticator::bearer("Basic abc"), None);
        assert_eq!(Authenticator::bearer("Bearer"), None);
        assert_eq!(Authenticator::bearer("Bearer "), None);
    }

    #[test]
    fn hex_round_trip_and_generated_tokens() {
        let h = hash("hello");
        assert_eq!(
            to_hex(&h),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(parse_hex(&to_hex(&h)), Some(h));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(&"g".repeat(64)), None);
        let (t1, t2) = (generate(), generate());
        assert_ne!(t1, t2);
        assert_eq!(t1.len(), 5 + 64);
        assert!(ct_eq(&hash(&t1), &hash(&t1)));
        assert!(!ct_eq(&hash(&t1), &hash(&t2)));
    }
}
