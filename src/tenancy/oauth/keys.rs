//! One trusted issuer's signing keys: its metadata (RFC 8414 `oauth-authorization-server`,
//! else OpenID `openid-configuration`) names its `jwks_uri`; the key set is cached as long
//! as its `Cache-Control: max-age` says (within [`MIN_AGE`]..[`MAX_AGE`], [`DEFAULT_AGE`]
//! without one), fetched again for a key id it does not hold at most once per cooldown, and
//! kept when a fetch fails (the issuer down does not lock its users out while their keys
//! are known). Only the `jwks_uri` of the issuer's own metadata is ever fetched: a token's
//! `jku` or `x5u` is never followed; and it, like every URL fetched here, must be `https`
//! or plain `http` on a loopback host ([`super::urls`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::Algorithm;

/// Key sets are kept at least this long whatever the issuer says...
pub const MIN_AGE: Duration = Duration::from_secs(60);
/// ...at most this long...
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// ...and this long when it says nothing.
pub const DEFAULT_AGE: Duration = Duration::from_secs(300);
/// Largest metadata document or key set read.
const MAX_DOC_BYTES: usize = 256 * 1024;
/// Time allowed for one fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// How often an issuer that never gave a key set is tried again (one fetch at a time).
pub const KEYLESS_COOLDOWN: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    jwks_uri: Option<String>,
    keys: Option<JwkSet>,
    /// When `keys` was fetched and how long it may be kept.
    fresh_until: Option<Instant>,
    /// The last fetch attempt (success or not), for the cooldown.
    attempted: Option<Instant>,
    last_error: Option<String>,
    fetches: u64,
}

/// A trusted issuer and its cached keys.
pub struct Issuer {
    pub url: String,
    cooldown: Duration,
    client: Client,
    state: Mutex<State>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").field("url", &self.url).finish()
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<bytes::Bytes>,
>;

/// The HTTP client for issuers: HTTPS (rustls on ring, the system's roots) or HTTP, no
/// redirects followed.
fn client() -> Client {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let https = match builder
        .with_provider_and_native_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
    {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(error = %e, "no system root certificates: HTTPS issuers cannot be reached");
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
        }
    }
    .https_or_http()
    .enable_http1()
    .build();
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https)
}

/// The metadata URLs of `issuer`, in the order tried: RFC 8414's (the well-known path
/// inserted before the issuer's path), then OpenID Connect's (appended).
pub fn metadata_urls(issuer: &str) -> Vec<String> {
    let trimmed = issuer.trim_end_matches('/');
    let (origin, path) = match trimmed.find("://").map(|i| i + 3) {
        Some(start) => match trimmed[start..].find('/') {
            Some(p) => trimmed.split_at(start + p),
            None => (trimmed, ""),
        },
        None => (trimmed, ""),
    };
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!("{trimmed}/.well-known/openid-configuration"),
    ]
}

/// `max-age` of a `Cache-Control` value, clamped; `no-store`/`no-cache` count as 0 (then
/// [`MIN_AGE`]).
pub fn cache_age(header: Option<&str>) -> Duration {
    let Some(h) = header else { return DEFAULT_AGE };
    let mut age = None;
    for d in h.split(',').map(|d| d.trim().to_ascii_lowercase()) {
        if d == "no-store" || d == "no-cache" {
            age = Some(0);
        } else if let Some(v) = d.strip_prefix("max-age=") {
            age = v.trim_matches('"').parse::<u64>().ok().or(age);
        }
    }
    age.map_or(DEFAULT_AGE, |s| {
        Duration::from_secs(s).clamp(MIN_AGE, MAX_AGE)
    })
}

impl Issuer {
    /// `url` exactly as tokens name it in `iss`; a key id not held is fetched for at most
    /// once per `cooldown`.
    pub fn new(url: &str, cooldown: Duration) -> Issuer {
        Issuer {
            url: url.to_string(),
            cooldown,
            client: client(),
            state: Mutex::default(),
            fetching: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fetches of the key set so far (successful or not).
    pub fn fetches(&self) -> u64 {
        self.state().fetches
    }

    /// The key for a token signed with `alg` and key id `kid`: from the cache, fetched
    /// when the cache is stale or lacks it (within the cooldown); `Err` says why there is
    /// none.
    pub async fn key(&self, kid: Option<&str>, alg: Algorithm) -> Result<Jwk, String> {
        let (stale, found) = {
            let s = self.state();
            let stale = s.fresh_until.is_none_or(|t| Instant::now() >= t);
            (stale, s.keys.as_ref().and_then(|k| pick(k, kid, alg)))
        };
        if let (false, Some(k)) = (stale, &found) {
            return Ok(k.clone());
        }
        // Stale, or the key is not known: fetch, unless one was tried within the cooldown.
        if self.may_fetch() {
            let _one = self.fetching.lock().await;
            if self.may_fetch() {
                if let Err(e) = self.refresh().await {
                    tracing::warn!(issuer = ?self.url, error = %e, "the issuer's keys could not be fetched; the last good ones stay in use");
                }
            }
        }
        let s = self.state();
        match s.keys.as_ref().and_then(|k| pick(k, kid, alg)) {
            Some(k) => Ok(k.clone()),
            None => Err(match (&s.keys, &s.last_error) {
                (None, Some(e)) => format!("no keys of the issuer: {e}"),
                _ => format!(
                    "no key {} for {alg:?} in the issuer's key set",
                    kid.map_or_else(|| "(none named)".to_string(), super::validate::shown)
                ),
            }),
        }
    }

    /// The cooldown, or [`KEYLESS_COOLDOWN`] while no key set was ever had (an issuer
    /// started after the server: its first tokens work within a second of it answering).
    fn may_fetch(&self) -> bool {
        let s = self.state();
        let cooldown = match s.keys {
            Some(_) => self.cooldown,
            None => self.cooldown.min(KEYLESS_COOLDOWN),
        };
        s.attempted.is_none_or(|t| t.elapsed() >= cooldown)
    }

    /// Fetch the metadata (once) and the key set now. The cache is replaced only by a
    /// good key set.
    pub async fn refresh(&self) -> Result<usize, String> {
        {
            let mut s = self.state();
            s.attempted = Some(Instant::now());
            s.fetches += 1;
        }
        let r = self.fetch().await;
        let mut s = self.state();
        match r {
            Ok((set, age)) => {
                let n = set.keys.len();
                s.keys = Some(set);
                s.fresh_until = Some(Instant::now() + age);
                s.last_error = None;
                Ok(n)
            }
            Err(e) => {
                s.last_error = Some(e.clone());
                Err(e)
            }
        }
    }

    async fn fetch(&self) -> Result<(JwkSet, Duration), String> {
        let known = self.state().jwks_uri.clone();
        let jwks_uri = match known {
            Some(u) => u,
            None => {
                let u = self.discover().await?;
                self.state().jwks_uri = Some(u.clone());
                u
            }
        };
        let (body, cache) = self.get(&jwks_uri).await?;
        let set: JwkSet = serde_json::from_slice(&body)
            .map_err(|e| format!("the key set at {jwks_uri} is not a JWK set: {e}"))?;
        Ok((set, cache_age(cache.as_deref())))
    }

    /// The `jwks_uri` of the issuer's metadata, whose `issuer` must be exactly ours.
    async fn discover(&self) -> Result<String, String> {
        let mut errors = Vec::new();
        for url in metadata_urls(&self.url) {
            match self.get(&url).await {
                Ok((body, _)) => {
                    let m: serde_json::Value = serde_json::from_slice(&body)
                        .map_err(|e| format!("the metadata at {url} is not JSON: {e}"))?;
                    if m["issuer"].as_str() != Some(self.url.as_str()) {
                        return Err(format!(
                            "the metadata at {url} names issuer {:?}, not {:?}",
                            m["issuer"], self.url
                        ));
                    }
                    let jwks_uri = m["jwks_uri"]
                        .as_str()
                        .ok_or_else(|| format!("the metadata at {url} has no jwks_uri"))?;
                    // The same rule as for the issuer: keys over plain HTTP only on loopback.
                    super::urls::check_fetch_url(jwks_uri).map_err(|why| {
                        format!("the metadata at {url} names a jwks_uri that is not fetched: {why}")
                    })?;
                    return Ok(jwks_uri.to_string());
                }
                Err(e) => errors.push(e),
            }
        }
        Err(errors.join("; "))
    }

    async fn get(&self, url: &str) -> Result<(Vec<u8>, Option<String>), String> {
        use http_body_util::BodyExt as _;
        super::urls::check_fetch_url(url)?;
        let req = axum::http::Request::get(url)
            .header("accept", "application/json")
            .header(
                "user-agent",
                concat!("mcp-code-executor/", env!("CARGO_PKG_VERSION")),
            )
            .body(http_body_util::Empty::new())
            .map_err(|e| format!("GET {url}: {e}"))?;
        let fetch = async {
            let r = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("GET {url}: {e}"))?;
            if !r.status().is_success() {
                return Err(format!("GET {url}: HTTP {}", r.status().as_u16()));
            }
            let cache = r
                .headers()
                .get("cache-control")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = http_body_util::Limited::new(r.into_body(), MAX_DOC_BYTES)
                .collect()
                .await
                .map_err(|e| format!("GET {url}: {e} (at most {MAX_DOC_BYTES} bytes)"))?
                .to_bytes();
            Ok((body.to_vec(), cache))
        };
        tokio::time::timeout(FETCH_TIMEOUT, fetch)
            .await
            .map_err(|_| format!("GET {url}: no answer within {} s", FETCH_TIMEOUT.as_secs()))?
    }
}

/// The key of `set` for `kid` (or, without a kid, the only signing key fit for `alg`).
fn pick(set: &JwkSet, kid: Option<&str>, alg: Algorithm) -> Option<Jwk> {
    let fits = |k: &&Jwk| {
        k.common
            .key_algorithm
            .is_none_or(|a| format!("{a:?}") == format!("{alg:?}"))
            && !matches!(
                k.common.public_key_use,
                Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
            )
    };
    match kid {
        Some(kid) => set.find(kid).filter(|k| fits(k)).cloned(),
        None => {
            let mut it = set.keys.iter().filter(fits);
            match (it.next(), it.next()) {
                (Some(k), None) => Some(k.clone()),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_urls_follow_rfc8414_then_oidc() {
        assert_eq!(
            metadata_urls("https://as.example"),
            vec![
                "https://as.example/.well-known/oauth-authorization-server",
                "https://as.example/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://as.example/tenant/a/"),
            vec![
                "https://as.example/.well-known/oauth-authorization-server/tenant/a",
                "https://as.example/tenant/a/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn cache_control_is_honoured_within_bounds() {
        assert_eq!(cache_age(None), DEFAULT_AGE);
        assert_eq!(
            cache_age(Some("public, max-age=600")),
            Duration::from_secs(600)
        );
        assert_eq!(cache_age(Some("max-age=1")), MIN_AGE);
        assert_eq!(cache_age(Some("no-store")), MIN_AGE);
        assert_eq!(cache_age(Some("max-age=99999999")), MAX_AGE);
        assert_eq!(cache_age(Some("private")), DEFAULT_AGE);
    }

    #[test]
    fn keys_are_picked_by_kid_and_algorithm() {
        let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "a", "alg": "ES256", "use": "sig",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "EC", "crv": "P-256", "kid": "b", "use": "enc",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}
        ]}))
        .unwrap();
        assert!(pick(&set, Some("a"), Algorithm::ES256).is_some());
        assert!(
            pick(&set, Some("a"), Algorithm::RS256).is_none(),
            "alg of the key"
        );
        assert!(
            pick(&set, Some("b"), Algorithm::ES256).is_none(),
            "an encryption key"
        );
        assert!(pick(&set, Some("c"), Algorithm::ES256).is_none());
        assert!(
            pick(&set, None, Algorithm::ES256).is_some(),
            "the only signing key"
        );
    }

    /// Issue 42, finding 8: the `jwks_uri` of an issuer's metadata was fetched whatever its
    /// scheme and host. An issuer on loopback whose metadata names plain-http keys on
    /// another host: refused before any request goes there, and said why.
    #[tokio::test]
    async fn a_plain_http_jwks_uri_off_loopback_is_never_fetched() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let meta = serde_json::json!({
            "issuer": issuer,
            "jwks_uri": "http://localhost.attacker.example/jwks",
        })
        .to_string();
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut c, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = c.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                seen.lock()
                    .unwrap()
                    .push(head.lines().next().unwrap_or("").to_string());
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{meta}",
                    meta.len()
                );
                let _ = c.write_all(resp.as_bytes()).await;
            }
        });
        let i = Issuer::new(&issuer, Duration::from_secs(3600));
        let e = i.refresh().await.unwrap_err();
        assert!(
            e.contains("jwks_uri")
                && e.contains("localhost.attacker.example")
                && e.contains("loopback"),
            "{e}"
        );
        let got = requests.lock().unwrap().clone();
        assert_eq!(
            got,
            vec!["GET /.well-known/oauth-authorization-server HTTP/1.1".to_string()],
            "only the issuer's own metadata was asked for"
        );
        // And never a URL of that kind directly.
        let e = i
            .get("http://localhost.attacker.example/jwks")
            .await
            .unwrap_err();
        assert!(e.contains("loopback"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_issuer_is_tried_once_per_cooldown() {
        // Nothing listens on port 9 of loopback here.
        // Never had keys: tried again after KEYLESS_COOLDOWN, not the long cooldown.
        let i = Issuer::new("http://127.0.0.1:9", Duration::from_secs(3600));
        let e = i.key(Some("k"), Algorithm::RS256).await.unwrap_err();
        assert!(e.contains("no keys of the issuer"), "{e}");
        let _ = i.key(Some("k"), Algorithm::RS256).await;
        let _ = i.key(Some("other"), Algorithm::RS256).await;
        assert_eq!(i.fetches(), 1, "one fetch per cooldown, whatever the kid");
        tokio::time::sleep(KEYLESS_COOLDOWN + Duration::from_millis(100)).await;
        let _ = i.key(Some("k"), Algorithm::RS256).await;
        let _ = i.key(Some("k"), Algorithm::RS256).await;
        assert_eq!(
            i.fetches(),
            2,
            "a keyless issuer is tried again a second later, once"
        );
    }
}
