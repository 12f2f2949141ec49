//! Sign-in with OAuth against a real authorization server: npm `oidc-provider` on loopback
//! (`tests/oauth/issuer.mjs`, installed under `target/oidc-provider` by `scripts/test.sh`),
//! the real binary (`serve --tenants … --public-url … --oauth-issuer …`), real clients: the
//! official Python SDK's OAuth client given only the server's URL (`tests/oauth/sdk_oauth.py`),
//! rmcp's client and raw HTTP with client-credentials tokens. Every negative case of the
//! validation matrix, users of one tenant kept apart, key rotation and the issuer down.
//! Also two items of the hardening review in this layer: the size of `initialize` is bounded,
//! and a refused `Origin` is logged quoted.

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
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw-oauth", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": caps,
    });
    let mut req = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method);
    if let Some(name) = params.get("name").and_then(Value::as_str) {
        req = req.header("Mcp-Name", name);
    } else if let Some(id) = params.get("taskId").and_then(Value::as_str) {
        req = req.header("Mcp-Name", id);
    } else if let Some(uri) = params.get("uri").and_then(Value::as_str) {
        req = req.header("Mcp-Name", uri);
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = req
        .body(body.to_string())
        .send()
        .await
        .expect("the server answers");
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|h| h.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    let msg: Value = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or_else(|| json!({"raw": text}))
    });
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

#[tokio::test]
async fn the_python_sdk_signs_in_with_only_the_server_url() {
    let python = std::env::var("MCP_PY_SDK_PYTHON")
        .unwrap_or_else(|_| format!("{ROOT}/target/py-sdk/bin/python"));
    assert!(
        std::process::Command::new(&python)
            .args(["-c", "import mcp"])
            .status()
            .is_ok_and(|s| s.success()),
        "the official MCP Python SDK is needed at {python}: run scripts/test.sh"
    );
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let port = free_port();
    let s = Hosted::oauth("sdk", port, &issuer.url(), &token::generate()).await;
    let out = tokio::process::Command::new(&python)
        .arg(format!("{ROOT}/tests/oauth/sdk_oauth.py"))
        .arg(s.url("/mcp"))
        .arg("alice@acme")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "the SDK's OAuth client failed: {stdout}\n{stderr}"
    );
    assert!(stdout.contains("ok: auto 2026-07-28"), "{stdout}");
    assert!(stdout.contains("ok: legacy"), "{stdout}");
    let want = format!(
        r#"401 Bearer resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", scope="mcp""#
    );
    assert!(
        stdout.contains(&want),
        "the challenge the SDK saw: {stdout}"
    );
    // alice@acme is in org acme: her runs are the acme tenant's, by a user digest.
    let log = s.log_text();
    assert!(
        log.lines().any(|l| l.contains("standalone session opened")
            && l.contains(&acme("sdk"))
            && l.contains("principal=user:")),
        "{log}"
    );
    s.finish().await;
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

#[tokio::test]
async fn tokens_are_validated_tenants_come_from_claims_and_users_are_kept_apart() {
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let port = free_port();
    let static_token = token::generate();
    let s = Hosted::oauth("matrix", port, &issuer.url(), &static_token).await;
    let mcp = s.url("/mcp");
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let meta = format!(
        r#"resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", scope="mcp""#
    );
    let http = reqwest::Client::new();

    // -- Protected Resource Metadata: no token, the configured URL whatever the Host, CORS.
    for (suffix, want) in [
        ("", format!("http://127.0.0.1:{port}")),
        ("/mcp", resource.clone()),
        ("/sse", format!("http://127.0.0.1:{port}/sse")),
    ] {
        let r = http
            .get(s.url(&format!("/.well-known/oauth-protected-resource{suffix}")))
            .header("Host", "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{suffix}");
        assert_eq!(r.headers()["access-control-allow-origin"], "*");
        let m: Value = r.json().await.unwrap();
        assert_eq!(m["resource"], want.as_str(), "{m}");
        assert_eq!(m["authorization_servers"], json!([issuer.url()]), "{m}");
        assert_eq!(m["scopes_supported"], json!(["mcp"]), "{m}");
        assert_eq!(m["bearer_methods_supported"], json!(["header"]), "{m}");
    }
    let pre = http
        .request(
            reqwest::Method::OPTIONS,
            s.url("/.well-known/oauth-protected-resource/mcp"),
        )
        .header("Origin", "https://chat.example")
        .header("Access-Control-Request-Method", "GET")
        .send()
        .await
        .unwrap();
    assert_eq!(pre.status(), 204);
    assert_eq!(pre.headers()["access-control-allow-origin"], "*");

    // -- The negative matrix: each refusal with its status, challenge and counted reason.
    let t_acme = issuer.token("acme-ci", "mcp", &resource).await;
    let claims = |extra: Value| {
        let mut c = json!({
            "iss": issuer.url(), "sub": "forged", "aud": resource, "scope": "mcp", "org": "acme",
            "client_id": "acme-ci", "iat": now(), "exp": now() + 600,
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    // A token the issuer's key signs, as the test asks: valid first (the control).
    let (signed_ok, public_jwk) = issuer.sign(json!({}), claims(json!({}))).await;
    let (expired, _) = issuer
        .sign(
            json!({}),
            claims(json!({"exp": now() - 120, "iat": now() - 900})),
        )
        .await;
    let (not_yet, _) = issuer
        .sign(json!({}), claims(json!({"nbf": now() + 600})))
        .await;
    let (wrong_iss, _) = issuer
        .sign(
            json!({}),
            claims(json!({"iss": format!("{}/other", issuer.url())})),
        )
        .await;
    let (no_aud, _) = issuer.sign(json!({}), claims(json!({"aud": null}))).await;
    let (unknown_kid, _) = issuer
        .sign(json!({"kid": "no-such-key"}), claims(json!({})))
        .await;
    let (with_jku, _) = issuer
        .sign(json!({"kid": "attacker", "jku": "http://127.0.0.1:9/jwks.json", "x5u": "http://127.0.0.1:9/x.pem"}), claims(json!({})))
        .await;
    let wrong_aud = issuer
        .token("acme-ci", "mcp", "http://other.example/mcp")
        .await;
    let no_scope = issuer.token("acme-ci", "other", &resource).await;
    let no_tenant = issuer.token("initech-ci", "mcp", &resource).await;
    let body = b64(&serde_json::to_vec(&claims(json!({}))).unwrap());
    let alg_none = format!("{}.{body}.", b64(br#"{"alg":"none","typ":"at+jwt"}"#));
    // HS256 with the issuer's public key as the HMAC secret (the key-confusion attack):
    // the JWK as JSON, and its modulus.
    let hs_with = |secret: &[u8]| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        h.kid = public_jwk["kid"].as_str().map(str::to_string);
        jsonwebtoken::encode(
            &h,
            &claims(json!({})),
            &jsonwebtoken::EncodingKey::from_secret(secret),
        )
        .unwrap()
    };
    let hs_json = hs_with(public_jwk.to_string().as_bytes());
    let hs_n = hs_with(public_jwk["n"].as_str().unwrap().as_bytes());

    let list = |t: Option<&str>| {
        let mcp = mcp.clone();
        let t = t.map(str::to_string);
        async move { rpc(&mcp, t.as_deref(), "tools/list", json!({}), json!({})).await }
    };
    let (st, ch, r) = list(Some(&signed_ok)).await;
    assert_eq!(
        st, 200,
        "a token signed by the issuer's key is accepted: {ch} {r}"
    );
    let (st, ch, _) = list(Some(&t_acme)).await;
    assert_eq!(st, 200, "a client-credentials token: {ch}");
    let (st, ch, _) = list(None).await;
    assert_eq!(
        (st, ch.as_str()),
        (401, format!("Bearer {meta}").as_str()),
        "no token"
    );
    let mut matrix = vec![];
    for (what, t, status, error) in [
        ("malformed", "abc.def.ghi".to_string(), 401, "invalid_token"),
        ("not a JWT", "hello".to_string(), 401, "invalid_token"),
        ("expired", expired, 401, "invalid_token"),
        ("nbf in the future", not_yet, 401, "invalid_token"),
        ("wrong iss", wrong_iss, 401, "invalid_token"),
        ("wrong aud", wrong_aud, 401, "invalid_token"),
        ("missing aud", no_aud, 401, "invalid_token"),
        ("alg none", alg_none, 401, "invalid_token"),
        ("HS256 with the public JWK", hs_json, 401, "invalid_token"),
        ("HS256 with the public modulus", hs_n, 401, "invalid_token"),
        ("unknown kid", unknown_kid, 401, "invalid_token"),
        ("jku/x5u not followed", with_jku, 401, "invalid_token"),
        ("missing scope", no_scope, 403, "insufficient_scope"),
    ] {
        let (st, ch, r) = list(Some(&t)).await;
        assert_eq!(st, status, "{what}: {ch} {r}");
        assert!(ch.starts_with(&format!("Bearer {meta}")), "{what}: {ch}");
        assert!(ch.contains(&format!(r#"error="{error}""#)), "{what}: {ch}");
        matrix.push(format!("{what}: {st} {ch}"));
    }
    let (st, ch, r) = list(Some(&no_tenant)).await;
    assert_eq!(st, 403, "no tenant: {r}");
    assert!(
        ch.is_empty(),
        "no challenge for a valid token no tenant admits: {ch}"
    );
    assert_eq!(r["error"], "forbidden", "{r}");
    matrix.push(format!("no matching tenant: {st} {r}"));
    // A token in the query string: refused, even a valid one.
    let r = http
        .post(format!("{mcp}?access_token={t_acme}"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a token in the query string");
    matrix.push(format!("token in the query string: {}", r.status()));
    // The legacy SSE endpoint challenges with its own metadata.
    let r = http.get(s.url("/sse")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("oauth-protected-resource/sse"));
    // A browser client of an allowed origin can read the challenge.
    let r = http
        .post(&mcp)
        .header("Origin", "http://localhost:6274")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:6274"
    );
    assert!(r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .contains("WWW-Authenticate"));
    for m in &matrix {
        eprintln!("matrix: {m}");
    }

    // -- Refusals counted by reason; no token in the log.
    let m = http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&m, "missing") >= 3, "{m}");
    assert!(metric(&m, "invalid") >= 10, "{m}");
    assert!(metric(&m, "audience") >= 2, "{m}");
    assert_eq!(metric(&m, "expired"), 1, "{m}");
    assert_eq!(metric(&m, "scope"), 1, "{m}");
    assert_eq!(metric(&m, "no_tenant"), 1, "{m}");

    // -- Tenants from claims, users apart. A and B: two clients of org acme (one tenant, two
    // users); G: org globex; S: the static token, which works as before.
    let (ta, tb) = (t_acme, issuer.token("acme-ci-2", "mcp", &resource).await);
    let tg = issuer.token("globex-ci", "mcp", &resource).await;
    // rmcp's client with a client-credentials token.
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(mcp.clone()).auth_header(ta.clone()),
        ))
        .await
        .expect("rmcp's client connects with the token");
    let r = call(&client, "execute_python", json!({"code": "x = 41"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let sa = structured(&r)["session_id"].as_str().unwrap().to_string();
    let r = call(
        &client,
        "execute_python",
        json!({"code": "x + 1", "session_id": sa}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "42\n", "{}", text(&r));
    let r = call(
        &client,
        "write_file",
        json!({"path": "a.txt", "content": "secret of A", "session_id": sa}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let uri = format!("workspace://sessions/{sa}/a.txt");
    let (_, _, r) = rpc(
        &mcp,
        Some(&ta),
        "resources/read",
        json!({"uri": uri}),
        json!({}),
    )
    .await;
    assert_eq!(
        r["contents"][0]["text"], "secret of A",
        "A reads its own resource: {r}"
    );
    // B (same tenant, another user): A's session, files and resources are not found.
    for (name, args) in [
        ("execute_python", json!({"code": "x", "session_id": sa})),
        ("read_file", json!({"path": "a.txt", "session_id": sa})),
        ("list_files", json!({"session_id": sa})),
        (
            "write_file",
            json!({"path": "b.txt", "content": "x", "session_id": sa}),
        ),
        (
            "execute_code",
            json!({"code": "print(open('/workspace/a.txt').read())", "session_id": sa}),
        ),
    ] {
        let r = tool(&mcp, &tb, name, args).await;
        let t = tool_text(&r);
        assert!(
            r["isError"] == true && t.contains("not found") && !t.contains("secret of A"),
            "B {name}: {r}"
        );
    }
    let (_, _, r) = rpc(
        &mcp,
        Some(&tb),
        "resources/read",
        json!({"uri": uri}),
        json!({}),
    )
    .await;
    assert!(
        r["error"].is_object() && !r.to_string().contains("secret of A"),
        "B reads A's resource: {r}"
    );
    // The static token of another tenant, and G of another org: not found either.
    for t in [&static_token, &tg] {
        let r = tool(
            &mcp,
            t,
            "read_file",
            json!({"path": "a.txt", "session_id": sa}),
        )
        .await;
        assert!(tool_text(&r).contains("not found"), "{r}");
    }
    // G lands in its own tenant.
    let r = tool(&mcp, &tg, "execute_python", json!({"code": "y = 1"})).await;
    assert!(r["isError"] != true, "{r}");
    assert!(
        s.log_text()
            .lines()
            .any(|l| l.contains("standalone session opened") && l.contains(&globex("matrix"))),
        "globex's session is in its tenant"
    );
    // The static token still works, beside OAuth.
    let r = tool(
        &mcp,
        &static_token,
        "execute_code",
        json!({"code": "print(6 * 7)"}),
    )
    .await;
    assert!(tool_text(&r).contains("42"), "{r}");

    // Tasks: A's task id is unknown to B.
    let tasks = json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let (_, _, created) = rpc(
        &mcp,
        Some(&ta),
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": "print('task of A')"}}),
        tasks.clone(),
    )
    .await;
    let task = created["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_string();
    let (_, _, mine) = rpc(
        &mcp,
        Some(&ta),
        "tasks/get",
        json!({"taskId": task}),
        tasks.clone(),
    )
    .await;
    assert!(mine.get("error").is_none(), "A polls its task: {mine}");
    for (m, p) in [
        ("tasks/get", json!({"taskId": task})),
        ("tasks/cancel", json!({"taskId": task})),
    ] {
        let (_, _, r) = rpc(&mcp, Some(&tb), m, p, tasks.clone()).await;
        assert!(r["error"].is_object(), "B {m} on A's task: {r}");
    }

    // Mcp-Session-Id: A's protocol session refuses B's token.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let r = http
        .post(&mcp)
        .bearer_auth(&ta)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let list_in = |t: String| {
        let (http, mcp, sid) = (http.clone(), mcp.clone(), sid.clone());
        async move {
            http.post(&mcp)
                .bearer_auth(t)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("Mcp-Session-Id", sid)
                .header("MCP-Protocol-Version", "2025-06-18")
                .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(list_in(tb.clone()).await, 404, "B on A's Mcp-Session-Id");
    assert_eq!(
        list_in(ta.clone()).await,
        200,
        "A on its own Mcp-Session-Id"
    );

    // Legacy SSE: A's stream refuses B's messages (another principal's session is unknown).
    let mut sse = http
        .get(s.url("/sse"))
        .bearer_auth(&ta)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let mut first = String::new();
    while !first.contains("sessionId=") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), sse.chunk())
            .await
            .expect("the endpoint event comes")
            .unwrap()
            .expect("the stream stays open");
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    let endpoint = first
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .unwrap()
        .trim()
        .to_string();
    let init_text = init.to_string();
    let post_as = |t: String| {
        let (http, url, body) = (http.clone(), s.url(&endpoint), init_text.clone());
        async move {
            http.post(url)
                .bearer_auth(t)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(post_as(tb.clone()).await, 404, "B on A's SSE session");
    assert_eq!(post_as(ta.clone()).await, 202, "A on its own SSE session");
    drop(sse);

    // No token in the log; the log names tenants and principal digests.
    let log = s.log_text();
    for t in [&ta, &tb, &tg, &static_token, &signed_ok] {
        let sig = t.rsplit('.').next().unwrap();
        assert!(!log.contains(sig), "a token in the log");
    }
    assert!(log.contains("principal=user:"), "{log}");
    drop(client);
    s.finish().await;
}

#[tokio::test]
async fn keys_rotate_after_one_refetch_and_the_last_good_keys_outlive_the_issuer() {
    let dir = tempdir();
    let issuer_port = free_port();
    let keys = dir.join("keys.json");
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    // The server starts while the issuer is down: it says so, and starts anyway.
    let s = Hosted::oauth(
        "keys",
        port,
        &format!("http://127.0.0.1:{issuer_port}"),
        &token::generate(),
    )
    .await;
    let log = s.log_text();
    assert!(
        log.contains(&format!("OAuth issuer http://127.0.0.1:{issuer_port}"))
            && log.contains("cannot be fetched"),
        "start-up names the unreachable issuer: {log}"
    );
    let started = Instant::now();
    let mut issuer = Issuer::start(issuer_port, &keys, false).await;
    let mcp = s.url("/mcp");
    let ok = |t: String| {
        let mcp = mcp.clone();
        async move {
            rpc(&mcp, Some(&t), "tools/list", json!({}), json!({}))
                .await
                .0
        }
    };
    let t1 = issuer.token("acme-ci", "mcp", &resource).await;
    // Within the cooldown of the failed start-up fetch, keys are not fetched again.
    if started.elapsed() < Duration::from_secs(8) {
        assert_eq!(ok(t1.clone()).await, 401, "no refetch within the cooldown");
        assert_eq!(issuer.jwks_fetches().await, 0);
    }
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(started.elapsed())).await;
    assert_eq!(
        ok(t1.clone()).await,
        200,
        "the issuer answers: its keys are fetched"
    );
    assert_eq!(issuer.jwks_fetches().await, 1);
    let fetched_at = Instant::now();

    // Rotation: a new signing key. Its tokens carry a kid the cache lacks.
    issuer.rotate().await;
    let t2 = issuer.token("acme-ci-2", "mcp", &resource).await;
    let kid = |t: &str| -> String {
        let h = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(t.split('.').next().unwrap())
            .unwrap();
        serde_json::from_slice::<Value>(&h).unwrap()["kid"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_ne!(
        kid(&t1),
        kid(&t2),
        "the rotated issuer signs with a new key"
    );
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(fetched_at.elapsed())).await;
    assert_eq!(
        ok(t2.clone()).await,
        200,
        "the new key is fetched once and accepted"
    );
    assert_eq!(issuer.jwks_fetches().await, 1, "one refetch");
    assert_eq!(ok(t1.clone()).await, 200, "the old key is still published");
    let (bogus, _) = issuer
        .sign(json!({"kid": "bogus"}), json!({"iss": issuer.url(), "sub": "x", "aud": resource, "scope": "mcp", "org": "acme", "exp": now() + 600}))
        .await;
    assert_eq!(ok(bogus.clone()).await, 401);
    assert_eq!(ok(bogus.clone()).await, 401);
    assert_eq!(
        issuer.jwks_fetches().await,
        1,
        "an unknown kid is fetched for at most once per cooldown"
    );
    let refetched_at = Instant::now();

    // The issuer goes down: a fetch fails (an unknown kid after the cooldown), and the
    // last good keys stay in use.
    issuer.stop().await;
    tokio::time::sleep(Duration::from_secs(11).saturating_sub(refetched_at.elapsed())).await;
    assert_eq!(
        ok(bogus).await,
        401,
        "the unknown kid: a fetch, which fails"
    );
    assert_eq!(
        ok(t2).await,
        200,
        "the last good keys, with the issuer down"
    );
    assert_eq!(ok(t1).await, 200);
    assert!(
        s.log_text().contains("the last good ones stay in use"),
        "the failed fetch is logged"
    );
    s.finish().await;
}

/// Issue 24 item 4: an `initialize` whose capabilities carry megabytes is refused, so that
/// protocol sessions cannot pin memory by the megabyte (30 of 7.5 MB added ~300 MB before).
#[tokio::test]
async fn initialize_requests_are_bounded_in_size() {
    let port = free_port();
    let s = Hosted::start(
        None,
        &["t-oauth-init"],
        &[
            "--port".into(),
            port.to_string(),
            "--tenant".into(),
            "t-oauth-init".into(),
        ],
    )
    .await;
    let pid = s.child.id().unwrap();
    let rss = || -> u64 {
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        st.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    let http = reqwest::Client::new();
    let before = rss();
    let blob = "x".repeat(7_500_000);
    let mut statuses = Vec::new();
    for i in 0..30 {
        let init = json!({"jsonrpc": "2.0", "id": i, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {"experimental": {"blob": {"b": blob}}},
            "clientInfo": {"name": "big", "version": "0"}}});
        let r = http
            .post(s.url("/mcp"))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(init.to_string())
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        let _ = r.text().await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss();
    eprintln!("RSS before {before} KiB, after 30 initialize of 7.5 MB: {after} KiB");
    assert!(statuses.iter().all(|s| *s == 400), "refused: {statuses:?}");
    assert!(
        after < before + 100_000,
        "RSS grew from {before} KiB to {after} KiB"
    );
    // A normal initialize still works.
    let r = http
        .post(s.url("/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "small", "version": "0"}}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    s.finish().await;
}

/// Issue 24 item 9: client-sent values in the log are quoted and escaped: a refused
/// `Origin` carrying a quote and `level=ERROR` shows as one quoted value, not extra fields.
#[tokio::test]
async fn a_refused_origin_is_logged_quoted() {
    let port = free_port();
    let s = Hosted::start(
        None,
        &["t-oauth-origin"],
        &[
            "--port".into(),
            port.to_string(),
            "--tenant".into(),
            "t-oauth-origin".into(),
        ],
    )
    .await;
    let r = reqwest::Client::new()
        .post(s.url("/mcp"))
        .header("Origin", "http://evil.example\" fake=1 level=ERROR")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = s.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("refused: Origin not allowed"))
        .unwrap_or_else(|| panic!("no refusal logged: {log}"));
    assert!(
        line.contains(r#"origin="http://evil.example\" fake=1 level=ERROR""#),
        "the origin is one quoted, escaped value: {line}"
    );
    s.finish().await;
}
