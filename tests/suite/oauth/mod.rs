//! Sign-in with OAuth against a real authorization server: npm `oidc-provider` on loopback
//! (`tests/oauth/issuer.mjs`, installed under `target/oidc-provider` by `scripts/test.sh`),
//! the real binary (`serve --tenants … --public-url … --oauth-issuer …`), real clients: the
//! official Python SDK's OAuth client given only the server's URL (`tests/oauth/sdk_oauth.py`),
//! rmcp's client and raw HTTP with client-credentials tokens. Every negative case of the
//! validation matrix, users of one tenant kept apart, key rotation and the issuer down.
//! Also two items of the hardening review in this layer: the size of `initialize` is bounded,
//! and a refused `Origin` is logged quoted ([`bounds`]); and issue 42's findings on issuer
//! URLs, refusal logs and token checks ([`hardening`]).
//!
//! This file holds the issuer, the server and the request helpers; the tests are in
//! [`signin`] (the official SDK's sign-in, key rotation), [`matrix`] (the validation matrix,
//! tenants, users kept apart), [`bounds`] and [`hardening`].

mod bounds;
mod hardening;
mod matrix;
mod quickstart;
mod signin;
mod usage;

use crate::mcp_support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use mcp_code_executor::tenancy::token;
use mcp_support::common;
use mcp_support::{call, is_error, structured, text};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
// Tenant ids: each test its own (`tag`), so that its container check sees only its own.
fn acme(tag: &str) -> String {
    format!("t-oauth-{tag}-acme")
}
fn globex(tag: &str) -> String {
    format!("t-oauth-{tag}-globex")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `oidc-provider` on loopback (tests/oauth/issuer.mjs).
struct Issuer {
    child: Option<tokio::process::Child>,
    port: u16,
    keys: PathBuf,
}

impl Issuer {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn start(port: u16, keys: &Path, rotate: bool) -> Issuer {
        let modules = Path::new(ROOT).join("target/oidc-provider/node_modules/oidc-provider");
        assert!(
            modules.is_dir(),
            "npm oidc-provider is needed at {}: run scripts/test.sh, or \
             `npm install --prefix target/oidc-provider oidc-provider@9`",
            modules.display()
        );
        let mut cmd = tokio::process::Command::new("node");
        cmd.arg(Path::new(ROOT).join("tests/oauth/issuer.mjs"))
            .arg(port.to_string())
            .arg(keys);
        if rotate {
            cmd.arg("rotate");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node runs");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.unwrap() {
                if l.contains("issuer listening at") {
                    return;
                }
            }
            panic!("the issuer exited before listening");
        })
        .await
        .expect("the issuer listens in time");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Issuer {
            child: Some(child),
            port,
            keys: keys.to_path_buf(),
        }
    }

    async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
            let _ = c.wait().await;
        }
    }

    /// Restart on the same port, with a new signing key first (the old ones kept).
    async fn rotate(&mut self) {
        self.stop().await;
        *self = Issuer::start(self.port, &self.keys.clone(), true).await;
    }

    /// A client-credentials access token for `resource`.
    async fn token(&self, client: &str, scope: &str, resource: &str) -> String {
        let r = reqwest::Client::new()
            .post(format!("{}/token", self.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&client_id={client}&client_secret={client}-secret&scope={scope}&resource={resource}"
            ))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        v["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token: {v}"))
            .to_string()
    }

    /// Claims signed with the issuer's current key (header fields added), and its public JWK.
    async fn sign(&self, header: Value, payload: Value) -> (String, Value) {
        let v: Value = reqwest::Client::new()
            .post(format!("{}/test/sign", self.url()))
            .body(json!({"header": header, "payload": payload}).to_string())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            v["token"].as_str().unwrap().to_string(),
            v["public_jwk"].clone(),
        )
    }

    async fn jwks_fetches(&self) -> u64 {
        let v: Value = reqwest::get(format!("{}/test/jwks-fetches", self.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["fetches"].as_u64().unwrap()
    }
}

/// A `serve` process with OAuth (or without tenants), its directories and its log.
struct Hosted {
    child: tokio::process::Child,
    base: String,
    dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    tenants: Vec<String>,
}

impl Hosted {
    async fn start(tenants: Option<&str>, ids: &[&str], flags: &[String]) -> Hosted {
        let _image = common::sandbox().await;
        let dir =
            std::env::temp_dir().join(format!("mcp-test-oauth-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"));
        cmd.args(["serve", "--pool-size", "0"]);
        if let Some(t) = tenants {
            std::fs::write(dir.join("tenants.toml"), t).unwrap();
            cmd.arg("--tenants").arg(dir.join("tenants.toml"));
        }
        let mut child = cmd
            .args(flags)
            .env("CODE_STORAGE_DIR", dir.join("code"))
            .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
            .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.join("ws"))
            .env("RUST_LOG", "mcp_code_executor=info")
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = tokio::time::timeout(Duration::from_secs(180), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                eprintln!("[server] {line}");
                log.lock().unwrap().push(line.clone());
                if let Some(rest) = line.split("Streamable HTTP at ").nth(1) {
                    return rest.split_whitespace().next().unwrap().to_string();
                }
            }
            panic!("the server exited before listening");
        })
        .await
        .expect("the server listens in time");
        tokio::spawn({
            let log = log.clone();
            async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[server] {line}");
                    log.lock().unwrap().push(line);
                }
            }
        });
        Hosted {
            child,
            base: url.trim_end_matches("/mcp").to_string(),
            dir,
            log,
            tenants: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The OAuth server of these tests: tenants acme and globex by the `org` claim, one
    /// tenant with a static token, on `port` with the public URL http://127.0.0.1:port.
    async fn oauth(tag: &str, port: u16, issuer: &str, static_token: &str) -> Hosted {
        let (acme, globex, fixed) = (acme(tag), globex(tag), format!("t-oauth-{tag}-static"));
        let file = format!(
            "[[tenants]]\nid = \"{acme}\"\n\n[[tenants]]\nid = \"{globex}\"\n\n\
             [[tenants]]\nid = \"{fixed}\"\ntoken_sha256 = \"{}\"\n\n\
             [[oauth_rules]]\nissuer = \"{issuer}\"\nclaim = \"org\"\nvalue = \"acme\"\ntenant = \"{acme}\"\n\n\
             [[oauth_rules]]\nissuer = \"{issuer}\"\nclaim = \"org\"\nvalue = \"globex\"\ntenant = \"{globex}\"\n",
            token::to_hex(&token::hash(static_token))
        );
        let flags: Vec<String> = [
            "--port".to_string(),
            port.to_string(),
            "--public-url".into(),
            format!("http://127.0.0.1:{port}"),
            "--oauth-issuer".into(),
            issuer.to_string(),
        ]
        .into();
        Hosted::start(Some(&file), &[&acme, &globex, &fixed], &flags).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    async fn finish(mut self) {
        self.finish_checked().await;
    }

    async fn finish_checked(&mut self) {
        let pid = self.child.id().unwrap() as i32;
        // SAFETY: kill(2) on the pid of a child this test spawned and still holds.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the server exits after SIGTERM")
            .unwrap();
        assert!(status.success(), "exit status {status:?}");
        for t in &self.tenants {
            let left = common::containers_of(t);
            assert!(left.is_empty(), "containers of {t} left: {left:?}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One JSON-RPC request at 2026-07-28 (no protocol session) with `token`: the HTTP status,
/// the `WWW-Authenticate` header and the response's `result` or `error`.
async fn rpc(
    url: &str,
    token: Option<&str>,
    method: &str,
    params: Value,
    caps: Value,
) -> (u16, String, Value) {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("Authorization", b.as_str()))
        .collect();
    let resp = mcp_support::raw_2026_request(url, method, params, caps, &headers).await;
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|h| h.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    let msg = mcp_support::message_of(&text).unwrap_or_else(|| json!({ "raw": text }));
    let out = match msg.get("error") {
        Some(e) => json!({ "error": e }),
        None => msg.get("result").cloned().unwrap_or(msg),
    };
    (status, challenge, out)
}

async fn tool(url: &str, token: &str, name: &str, args: Value) -> Value {
    let (status, _, r) = rpc(
        url,
        Some(token),
        "tools/call",
        json!({"name": name, "arguments": args}),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{name}: {r}");
    r
}

fn tool_text(r: &Value) -> String {
    r["content"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|| r.to_string())
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn b64(v: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
}

fn metric(text: &str, reason: &str) -> u64 {
    let key = format!("mcp_auth_refused_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in the metrics"))
}

impl Drop for Hosted {
    /// Also on a failed test: the server is killed (kill_on_drop), its containers and
    /// directories removed.
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        for t in &self.tenants {
            common::remove_containers(&common::containers_of(t));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A directory removed when dropped (also on a failed test).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tempdir() -> TempDir {
    let d = std::env::temp_dir().join(format!(
        "mcp-test-oauth-iss-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}
