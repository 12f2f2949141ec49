//! Sign-in with OAuth: this server as an OAuth 2.1 resource server (the MCP authorization
//! specification). A client presents a JWT access token (RFC 9068) from one of the trusted
//! issuers; [`OAuth::authenticate`] checks it ([`validate`]) with the issuer's keys
//! ([`keys`]), asks for the server's scope, and maps it to a tenant by the rules of the
//! tenants file ([`crate::tenancy::Rule`]: first match wins, no match is refused). What
//! comes out is the [`Principal`] the application core knows every call by. Static `mcpx_`
//! tokens ([`super::token`]) work beside it unchanged.
//!
//! Which issuer URLs may be fetched at all is [`urls`] (https, or plain http on a parsed
//! loopback host); how much a refusal may write to the log is [`refusal_log`].
//!
//! The HTTP side (metadata, challenges, refusal counters) is
//! `crate::mcp::transports::auth`.

pub mod keys;
pub mod refusal_log;
pub mod urls;
pub mod validate;

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{Match, Rule};
pub use validate::Refusal;

/// A key id an issuer's cached set lacks is fetched for at most once per this long.
pub const REFETCH_COOLDOWN: Duration = Duration::from_secs(10);

/// Who makes a call: the tenant, and for a signed-in user the token's issuer, subject,
/// client and scopes. Static-token and local calls have no user: every holder of a tenant's
/// static token is the same principal, as before OAuth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    /// `iss`, `sub`, `client_id` (or `azp`) and scopes of a signed-in user.
    pub user: Option<User>,
}

/// The signed-in user of a [`Principal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub issuer: String,
    pub subject: String,
    pub client_id: Option<String>,
    pub scopes: Vec<String>,
}

impl Principal {
    /// A caller with the tenant's static token, or of a server without tenants.
    pub fn tenant(tenant: &str) -> Principal {
        Principal {
            tenant: tenant.to_string(),
            user: None,
        }
    }

    /// What a session, task or protocol session made by this principal is bound to: a
    /// digest of (issuer, subject) for a user, `None` for the tenant's static token.
    pub fn owner(&self) -> Option<String> {
        self.user.as_ref().map(|u| digest(&u.issuer, &u.subject))
    }

    /// For logs: the tenant's static token, or the user's digest (never a token, never the
    /// subject itself).
    pub fn describe(&self) -> String {
        match self.owner() {
            Some(d) => format!("user:{d}"),
            None => "static-token".to_string(),
        }
    }
}

/// 16 hex digits of SHA-256 over issuer and subject.
pub fn digest(issuer: &str, subject: &str) -> String {
    let mut h = Sha256::new();
    h.update(issuer.as_bytes());
    h.update([0u8]);
    h.update(subject.as_bytes());
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The resource server's settings: flags of `serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The server's public URL (`https://mcp.example.com`, an origin): the resource
    /// identifiers are it and its `/mcp` and `/sse`.
    pub public_url: String,
    /// Trusted issuers, exactly as their tokens' `iss`.
    pub issuers: Vec<String>,
    /// The scope every call needs.
    pub scope: String,
}

impl Settings {
    /// Check the public URL (an `http(s)` origin without path, query or fragment) and the
    /// issuers (`https`, or `http` on a loopback host: [`urls::check_fetch_url`]).
    pub fn check(&self) -> Result<(), String> {
        let u = self.public_url.trim_end_matches('/');
        let origin_ok = |u: &str| {
            let rest = u
                .strip_prefix("https://")
                .or_else(|| u.strip_prefix("http://"));
            rest.is_some_and(|r| !r.is_empty() && !r.contains(['/', '?', '#', ' ', '@']))
        };
        if !origin_ok(u) {
            return Err(format!(
                "--public-url {:?} must be the server's public origin, e.g. https://mcp.example.com (no path)",
                self.public_url
            ));
        }
        if self.issuers.is_empty() {
            return Err("--oauth-issuer: give at least one issuer URL".into());
        }
        for i in &self.issuers {
            urls::check_fetch_url(i).map_err(|why| {
                format!(
                    "--oauth-issuer {i:?} must be an https URL (plain http only on loopback, for tests): {why}"
                )
            })?;
        }
        if self.scope.trim().is_empty() || self.scope.contains(char::is_whitespace) {
            return Err(format!(
                "--oauth-scope {:?} must be one scope name",
                self.scope
            ));
        }
        Ok(())
    }

    /// The public URL without a trailing slash.
    pub fn base(&self) -> &str {
        self.public_url.trim_end_matches('/')
    }

    /// This server's resource identifiers: the public URL, and it with `/mcp` and `/sse`
    /// (what the Protected Resource Metadata at each path names). A token's `aud` must be
    /// one of them.
    pub fn resources(&self) -> Vec<String> {
        let b = self.base();
        vec![b.to_string(), format!("{b}/mcp"), format!("{b}/sse")]
    }
}

/// The resource server: settings, issuers with their keys, the tenant rules.
#[derive(Debug)]
pub struct OAuth {
    pub settings: Settings,
    issuers: Vec<Arc<keys::Issuer>>,
    rules: Vec<Rule>,
}

impl OAuth {
    /// Every rule must name a trusted issuer (and tenants the file defines: checked when
    /// the file is read).
    pub fn new(settings: Settings, rules: Vec<Rule>) -> Result<OAuth, String> {
        Self::with_cooldown(settings, rules, REFETCH_COOLDOWN)
    }

    pub fn with_cooldown(
        settings: Settings,
        rules: Vec<Rule>,
        cooldown: Duration,
    ) -> Result<OAuth, String> {
        settings.check()?;
        if let Some(r) = rules.iter().find(|r| !settings.issuers.contains(&r.issuer)) {
            return Err(format!(
                "the tenants file maps tokens of issuer {:?} (to tenant `{}`), which is not one of --oauth-issuer {:?}",
                r.issuer, r.tenant, settings.issuers
            ));
        }
        if rules.is_empty() {
            return Err("--oauth-issuer is given but the tenants file has no [[oauth_rules]]: no token could name a tenant".into());
        }
        let issuers = settings
            .issuers
            .iter()
            .map(|u| Arc::new(keys::Issuer::new(u, cooldown)))
            .collect();
        Ok(OAuth {
            settings,
            issuers,
            rules,
        })
    }

    /// Fetch every issuer's metadata and keys now: for each, the number of keys or why
    /// they cannot be had (said at start-up; tokens are still checked later, when the
    /// issuer answers).
    pub async fn check_issuers(&self) -> Vec<(String, Result<usize, String>)> {
        let mut out = Vec::new();
        for i in &self.issuers {
            out.push((i.url.clone(), i.refresh().await));
        }
        out
    }

    /// Fetches of each issuer's keys so far.
    pub fn fetches(&self) -> Vec<(String, u64)> {
        self.issuers
            .iter()
            .map(|i| (i.url.clone(), i.fetches()))
            .collect()
    }

    /// The principal of a valid token with the server's scope that a rule maps to a
    /// tenant, or why not.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, Refusal> {
        let p = validate::peek(token)?;
        let issuer = self
            .issuers
            .iter()
            .find(|i| i.url == p.issuer)
            .ok_or_else(|| {
                Refusal::Invalid(format!(
                    "issuer {} is not trusted",
                    validate::shown(&p.issuer)
                ))
            })?;
        let key = issuer
            .key(p.kid.as_deref(), p.alg)
            .await
            .map_err(Refusal::Invalid)?;
        let claims = validate::verify(token, &p, &key, &issuer.url, &self.settings.resources())?;
        let scopes = validate::scopes(&claims);
        if !scopes.iter().any(|s| s == &self.settings.scope) {
            return Err(Refusal::Scope);
        }
        let subject = validate::claim_text(&claims, "sub")
            .ok_or_else(|| Refusal::Invalid("no sub claim".into()))?;
        let client_id = validate::claim_text(&claims, "client_id")
            .or_else(|| validate::claim_text(&claims, "azp"));
        let tenant = tenant_of(&self.rules, &issuer.url, &claims)
            .ok_or_else(|| Refusal::NoTenant(looked_at(&self.rules, &issuer.url, &claims)))?;
        Ok(Principal {
            tenant,
            user: Some(User {
                issuer: issuer.url.clone(),
                subject,
                client_id,
                scopes,
            }),
        })
    }
}

/// The tenant of the first rule that matches a token of `issuer` with `claims`.
pub fn tenant_of(rules: &[Rule], issuer: &str, claims: &validate::Claims) -> Option<String> {
    rules
        .iter()
        .filter(|r| r.issuer == issuer)
        .find(|r| match &r.matches {
            Match::Claim { name, value } => {
                validate::claim_text(claims, name).as_deref() == Some(value.as_str())
            }
            Match::ClientId(c) => {
                validate::claim_text(claims, "client_id")
                    .or_else(|| validate::claim_text(claims, "azp"))
                    .as_deref()
                    == Some(c.as_str())
            }
            Match::Subject(s) => validate::claim_text(claims, "sub").as_deref() == Some(s.as_str()),
        })
        .map(|r| r.tenant.clone())
}

/// For the log of a token no rule maps: the values of what the rules of `issuer` look at
/// (`org="globex"`, `client_id="..."`), quoted and cut; a subject is never shown.
fn looked_at(rules: &[Rule], issuer: &str, claims: &validate::Claims) -> String {
    let mut names: Vec<&str> = Vec::new();
    for r in rules.iter().filter(|r| r.issuer == issuer) {
        let n = match &r.matches {
            Match::Claim { name, .. } => name.as_str(),
            Match::ClientId(_) => "client_id",
            Match::Subject(_) => "sub",
        };
        if !names.contains(&n) {
            names.push(n);
        }
    }
    if names.is_empty() {
        return "no rule names this issuer".into();
    }
    names
        .iter()
        .map(|n| match (*n, validate::claim_text(claims, n)) {
            ("sub", _) => "sub (not shown)".to_string(),
            (n, Some(v)) => format!("{n}={}", validate::shown(&v)),
            (n, None) => format!("{n} absent"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(tenant: &str, issuer: &str, m: Match) -> Rule {
        Rule {
            issuer: issuer.into(),
            tenant: tenant.into(),
            matches: m,
        }
    }

    #[test]
    fn first_matching_rule_wins_and_issuer_must_match() {
        let rules = vec![
            rule("ci", "https://a", Match::ClientId("robot".into())),
            rule(
                "acme",
                "https://a",
                Match::Claim {
                    name: "org".into(),
                    value: "acme".into(),
                },
            ),
            rule("alice", "https://a", Match::Subject("u-1".into())),
        ];
        let c = |v: serde_json::Value| -> validate::Claims { serde_json::from_value(v).unwrap() };
        assert_eq!(
            tenant_of(
                &rules,
                "https://a",
                &c(serde_json::json!({"org": "acme", "client_id": "robot"}))
            ),
            Some("ci".into())
        );
        assert_eq!(
            tenant_of(
                &rules,
                "https://a",
                &c(serde_json::json!({"org": "acme", "sub": "u-1"}))
            ),
            Some("acme".into())
        );
        assert_eq!(
            tenant_of(&rules, "https://a", &c(serde_json::json!({"sub": "u-1"}))),
            Some("alice".into())
        );
        assert_eq!(
            tenant_of(&rules, "https://b", &c(serde_json::json!({"org": "acme"}))),
            None,
            "another issuer's org claim means nothing"
        );
        assert_eq!(
            tenant_of(&rules, "https://a", &c(serde_json::json!({"org": "acme2"}))),
            None
        );
    }

    #[test]
    fn settings_are_checked() {
        let ok = Settings {
            public_url: "https://mcp.example.com/".into(),
            issuers: vec!["https://as.example".into()],
            scope: "mcp".into(),
        };
        assert_eq!(ok.check(), Ok(()));
        assert_eq!(
            ok.resources(),
            vec![
                "https://mcp.example.com",
                "https://mcp.example.com/mcp",
                "https://mcp.example.com/sse"
            ]
        );
        for bad in [
            Settings {
                public_url: "mcp.example.com".into(),
                ..ok.clone()
            },
            Settings {
                public_url: "https://mcp.example.com/mcp".into(),
                ..ok.clone()
            },
            Settings {
                issuers: vec![],
                ..ok.clone()
            },
            Settings {
                issuers: vec!["http://as.example".into()],
                ..ok.clone()
            },
            // Issue 42, finding 8: a prefix test took this for loopback.
            Settings {
                issuers: vec!["http://localhost.attacker.example".into()],
                ..ok.clone()
            },
            Settings {
                issuers: vec!["http://127.0.0.1.nip.io".into()],
                ..ok.clone()
            },
            Settings {
                scope: "a b".into(),
                ..ok.clone()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn principals_are_bound_by_a_digest_of_issuer_and_subject() {
        let user = |sub: &str| Principal {
            tenant: "acme".into(),
            user: Some(User {
                issuer: "https://a".into(),
                subject: sub.into(),
                client_id: None,
                scopes: vec![],
            }),
        };
        assert_eq!(Principal::tenant("acme").owner(), None);
        assert_ne!(user("1").owner(), user("2").owner());
        assert_eq!(user("1").owner(), user("1").owner());
        assert!(!user("1").describe().contains('1') || user("1").describe().starts_with("user:"));
        assert_ne!(digest("a", "bc"), digest("ab", "c"));
    }
}
