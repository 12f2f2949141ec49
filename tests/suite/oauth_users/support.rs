//! The set-up of the two-users tests: npm `oidc-provider` on loopback
//! (`tests/oauth/issuer.mjs`), the real binary with OAuth (one organisation, one tenant, and
//! that tenant's static token beside), raw JSON-RPC at 2026-07-28 and rmcp's client, and the
//! server's RSS. (The same pieces as `oauth.rs`, kept small here so that each area stays its
//! own file.)
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcp_code_executor::tenancy::token;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::common;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A directory removed when dropped (also on a failed test).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let d =
            std::env::temp_dir().join(format!("mcp-test-{what}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `oidc-provider` on loopback: clients `acme-ci` and `acme-ci-2` are two users of org acme.
pub struct Issuer {
    _child: tokio::process::Child,
    port: u16,
}

impl Issuer {
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub async fn start(keys: &Path) -> Issuer {
        let modules = Path::new(ROOT).join("target/oidc-provider/node_modules/oidc-provider");
        assert!(
            modules.is_dir(),
            "npm oidc-provider is needed at {}: run scripts/test.sh",
            modules.display()
        );
        let port = free_port();
        let mut child = tokio::process::Command::new("node")
            .arg(Path::new(ROOT).join("tests/oauth/issuer.mjs"))
            .arg(port.to_string())
            .arg(keys)
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
            _child: child,
            port,
        }
    }

    /// A client-credentials access token of `client` for `resource`.
    pub async fn token(&self, client: &str, resource: &str) -> String {
        let v: Value = reqwest::Client::new()
            .post(format!("{}/token", self.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&client_id={client}&client_secret={client}-secret&scope=mcp&resource={resource}"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token: {v}"))
            .to_string()
    }
}

/// The real binary with OAuth: org acme is tenant `tenant`, whose static token is
/// `static_token` too; `limits` are more lines of its `[[tenants]]` table.
pub struct Hosted {
    child: tokio::process::Child,
    pub base: String,
    pub port: u16,
    pub dir: TempDir,
    log: Arc<Mutex<Vec<String>>>,
    pub tenant: String,
}

impl Hosted {
    pub async fn start(
        tenant: &str,
        issuer: &Issuer,
        static_token: &str,
        limits: &str,
        flags: &[&str],
    ) -> Hosted {
        let _image = common::sandbox().await;
        let dir = TempDir::new("oauth-users");
        let port = free_port();
        let file = format!(
            "[[tenants]]\nid = \"{tenant}\"\ntoken_sha256 = \"{}\"\n{limits}\n\n\
             [[oauth_rules]]\nissuer = \"{}\"\nclaim = \"org\"\nvalue = \"acme\"\ntenant = \"{tenant}\"\n",
            token::to_hex(&token::hash(static_token)),
            issuer.url()
        );
        std::fs::write(dir.0.join("tenants.toml"), file).unwrap();
        // `MCPX_SERVE_BIN`: another build of the binary (to see a test fail on older code).
        let bin = std::env::var("MCPX_SERVE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mcp-code-executor").to_string());
        let mut child = tokio::process::Command::new(bin)
            .args(["serve", "--pool-size", "0", "--tenants"])
            .arg(dir.0.join("tenants.toml"))
            .args(["--port", &port.to_string()])
            .args(["--public-url", &format!("http://127.0.0.1:{port}")])
            .args(["--oauth-issuer", &issuer.url()])
            .args(flags)
            .env("CODE_STORAGE_DIR", dir.0.join("code"))
            .env("MCP_EXECUTOR_DATA_DIR", dir.0.join("data"))
            .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.0.join("ws"))
            .env("RUST_LOG", "mcp_code_executor=info")
            .current_dir(&dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = tokio::time::timeout(Duration::from_secs(180), async {
            while let Some(line) = lines.next_line().await.unwrap() {
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
                    log.lock().unwrap().push(line);
                }
            }
        });
        let s = Hosted {
            child,
            base: url.trim_end_matches("/mcp").to_string(),
            port,
            dir,
            log,
            tenant: tenant.to_string(),
        };
        s.wait_ready().await;
        s
    }

    async fn wait_ready(&self) {
        let t0 = std::time::Instant::now();
        loop {
            let ok = reqwest::get(format!("{}/readyz", self.base))
                .await
                .is_ok_and(|r| r.status() == 200);
            if ok {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(180), "not ready");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn mcp(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// The resource tokens are made for.
    pub fn resource(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The server's resident memory, MiB.
    pub fn rss_mib(&self) -> f64 {
        let pid = self.child.id().expect("running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb / 1024.0
    }

    /// rmcp's client (Streamable HTTP, a protocol session) signed in with `token`.
    pub async fn client(&self, token: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
        ().serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(self.mcp())
                .auth_header(token.to_string()),
        ))
        .await
        .expect("rmcp's client connects with the token")
    }

    /// SIGTERM, a clean exit, and none of the tenant's containers left.
    pub async fn finish(mut self) {
        let pid = self.child.id().unwrap() as i32;
        // SAFETY: kill(2) on the pid of a child this test spawned and still holds.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the server exits after SIGTERM")
            .unwrap();
        assert!(status.success(), "exit status {status:?}");
        let left = common::containers_of(&self.tenant);
        assert!(
            left.is_empty(),
            "containers of {} left: {left:?}",
            self.tenant
        );
    }
}

impl Drop for Hosted {
    /// Also on a failed test: the server is killed, its containers removed.
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        common::remove_containers(&common::containers_of(&self.tenant));
    }
}

/// The tasks extension, as a client declares it.
pub fn with_tasks() -> Value {
    json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } })
}

/// One JSON-RPC request at 2026-07-28 (no protocol session) with `token` and the client
/// capabilities `caps`: the response's `result`, or `{"error": …}`.
pub async fn rpc(url: &str, token: &str, method: &str, params: Value, caps: Value) -> Value {
    let bearer = format!("Bearer {token}");
    let (status, text) =
        crate::mcp_support::raw_2026_text(url, method, params, caps, &[("Authorization", &bearer)])
            .await;
    assert_eq!(status, 200, "{method}: {text}");
    crate::mcp_support::response_of(method, &text)
}

/// A tool call without tasks.
pub async fn tool(url: &str, token: &str, name: &str, args: Value) -> Value {
    rpc(
        url,
        token,
        "tools/call",
        json!({"name": name, "arguments": args}),
        json!({}),
    )
    .await
}

/// The text blocks of a tool result, joined.
pub fn text_of(r: &Value) -> String {
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
