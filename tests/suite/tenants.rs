//! The hosted server with a tenants file, as an operator runs it: the real binary
//! (`serve --tenants`), real containers, real MCP clients with bearer tokens. Every
//! cross-tenant attempt fails, quotas refuse with the documented errors, and a flooding
//! tenant does not starve a quiet one.

use crate::mcp_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_code_executor::tenancy::token;
use mcp_support::common;
use mcp_support::{call, is_error, structured, text};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

/// A `serve --tenants` process, its directories and its log.
struct Hosted {
    child: tokio::process::Child,
    base: String,
    dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    tenants: Vec<String>,
}

impl Hosted {
    /// Start the binary with `tenants` (TOML) and extra flags; wait until it listens.
    async fn start(tenants: &str, ids: &[&str], flags: &[&str]) -> Hosted {
        let _image = common::sandbox().await;
        let dir = std::env::temp_dir().join(format!(
            "mcp-test-tenants-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tenants.toml");
        std::fs::write(&file, tenants).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
            .args(["serve", "--port", "0", "--tenants"])
            .arg(&file)
            .args(flags)
            .env("CODE_STORAGE_DIR", dir.join("code"))
            .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
            .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.join("ws"))
            .env("RUST_LOG", "mcp_code_executor=info")
            .current_dir(&dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
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

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// An rmcp Streamable HTTP client presenting `token`.
    async fn client(&self, token: &str) -> RunningService<RoleClient, ()> {
        let config =
            StreamableHttpClientTransportConfig::with_uri(self.url("/mcp")).auth_header(token);
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("an authenticated client connects")
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// SIGTERM, wait for the exit, check no container of any tenant is left.
    async fn finish(mut self) {
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

fn entry(id: &str, token: &str, extra: &str) -> String {
    format!(
        "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\n{extra}\n",
        token::to_hex(&token::hash(token))
    )
}

/// POST a JSON-RPC message to /mcp with optional token and session id.
async fn post(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    session: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut req = http
        .post(url)
        .header("Accept", "application/json, text/event-stream")
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(s) = session {
        req = req.header("Mcp-Session-Id", s);
    }
    req.send().await.unwrap()
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}})
}

const ALICE: &str = "t-ten-alice";
const BOB: &str = "t-ten-bob";
const CAROL: &str = "t-ten-carol";

#[tokio::test]
async fn tenants_are_authenticated_isolated_and_held_to_their_quotas() {
    let (ta, tb, tc) = (token::generate(), token::generate(), token::generate());
    let file = [
        entry(ALICE, &ta, "storage_limit = \"64k\""),
        entry(BOB, &tb, ""),
        entry(
            CAROL,
            &tc,
            "runs_per_minute = 2\nmax_timeout = \"5s\"\nmax_memory = \"128m\"\ninstall_network = false",
        ),
    ]
    .concat();
    let s = Hosted::start(
        &file,
        &[ALICE, BOB, CAROL],
        &["--pool-size", "1", "--max-concurrent", "2"],
    )
    .await;
    let http = reqwest::Client::new();

    // -- Authentication: no token, a wrong token -> 401 with a challenge; health and metrics open.
    let r = post(&http, &s.url("/mcp"), None, None, initialize()).await;
    assert_eq!(r.status(), 401);
    let challenge = r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(challenge.starts_with("Bearer realm="), "{challenge}");
    let r = post(
        &http,
        &s.url("/mcp"),
        Some("not-a-token"),
        None,
        initialize(),
    )
    .await;
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("invalid_token"));
    let r = http.get(s.url("/sse")).send().await.unwrap();
    assert_eq!(
        r.status(),
        401,
        "the legacy SSE transport needs the token too"
    );
    let r = http.get(s.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // -- Alice works; her containers carry her label; her code never reaches the log.
    let alice = s.client(&ta).await;
    let slow = {
        let alice = alice.clone();
        tokio::spawn(async move {
            call(
                &alice,
                "execute_code",
                json!({"code": "import time\ntime.sleep(3)\nprint('alice-secret-marker'[:5])"}),
            )
            .await
        })
    };
    let t0 = Instant::now();
    while common::containers_of(ALICE).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no container labelled with the tenant"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = slow.await.unwrap();
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "alice\n");
    let alice_file = structured(&r)["file_path"].as_str().unwrap().to_string();
    assert!(
        alice_file.contains(&format!("/code/{ALICE}/")),
        "code storage is per tenant: {alice_file}"
    );
    let r = call(
        &alice,
        "write_file",
        json!({"path": "notes.txt", "content": "alice's notes"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));

    // -- Bob reaches none of it: not her file_path (full or bare name), not her workspace.
    let bob = s.client(&tb).await;
    let name = Path::new(&alice_file)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap();
    for tool in ["read_code_file", "execute_code_file"] {
        for path in [alice_file.as_str(), name] {
            let r = call(&bob, tool, json!({"file_path": path})).await;
            assert!(is_error(&r), "bob's {tool}({path}) succeeded: {}", text(&r));
            assert!(!text(&r).contains("alice-secret-marker"), "{}", text(&r));
        }
    }
    let r = call(
        &bob,
        "append_to_code_file",
        json!({"file_path": alice_file, "content": "print('bob was here')"}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    let r = call(&bob, "read_file", json!({"path": "notes.txt"})).await;
    assert!(is_error(&r), "bob read alice's workspace: {}", text(&r));
    let r = call(&bob, "list_files", json!({})).await;
    assert!(!text(&r).contains("notes.txt"), "{}", text(&r));
    // Alice still has both.
    let r = call(&alice, "read_code_file", json!({"file_path": alice_file})).await;
    assert!(text(&r).contains("alice-secret-marker"), "{}", text(&r));

    // -- Bob cannot switch to Alice's environment (nor anything outside his allowed roots).
    let alice_env = s.dir.join("data/tenants").join(ALICE).join("envs/default");
    assert!(alice_env.join("bin/python").exists(), "alice's managed env");
    let r = call(
        &bob,
        "configure_environment",
        json!({"type": "venv", "venv_path": alice_env}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(
        text(&r).contains("is not an environment this tenant may use"),
        "{}",
        text(&r)
    );

    // -- A session id of Alice's is unknown to Bob (Streamable HTTP and legacy SSE).
    let r = post(&http, &s.url("/mcp"), Some(&ta), None, initialize()).await;
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = post(
        &http,
        &s.url("/mcp"),
        Some(&tb),
        Some(&sid),
        initialized.clone(),
    )
    .await;
    assert_eq!(r.status(), 404, "bob used alice's session");
    let r = post(&http, &s.url("/mcp"), Some(&ta), Some(&sid), initialized).await;
    assert_eq!(r.status(), 202, "alice's own session works");
    let sse = http
        .get(s.url("/sse"))
        .bearer_auth(&ta)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let mut stream = sse.bytes_stream();
    let mut first = String::new();
    while !first.contains("sessionId=") || !first.contains("\n\n") {
        use futures::StreamExt as _;
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("endpoint event")
            .unwrap()
            .unwrap();
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    let sse_id = first
        .split("sessionId=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let ping = json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}).to_string();
    let messages = s.url(&format!("/messages?sessionId={sse_id}"));
    let r = http
        .post(&messages)
        .bearer_auth(&tb)
        .header("Content-Type", "application/json")
        .body(ping.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "bob used alice's SSE session");
    let r = http
        .post(&messages)
        .bearer_auth(&ta)
        .header("Content-Type", "application/json")
        .body(ping)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    drop(stream);

    // -- Quotas: storage (Alice, 64 KiB), rate (Carol, 2/min), limits and installs (Carol).
    let r = call(
        &alice,
        "write_file",
        json!({"path": "big.txt", "content": "x".repeat(40_000)}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &alice,
        "initialize_code_file",
        json!({"filename": "more", "content": format!("# {}", "y".repeat(30_000))}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(
        text(&r).contains("storage_limit of 65536 bytes"),
        "{}",
        text(&r)
    );
    let carol = s.client(&tc).await;
    let r = call(&carol, "get_environment_config", json!({})).await;
    let limits = &structured(&r)["limits"];
    assert_eq!(limits["max_timeout_seconds"], 5.0, "{limits}");
    assert_eq!(limits["memory_bytes"], 128 << 20, "{limits}");
    for _ in 0..2 {
        let r = call(
            &carol,
            "execute_code",
            json!({"code": "print(1)", "timeout": 100}),
        )
        .await;
        assert!(!is_error(&r), "{}", text(&r));
        assert!(
            text(&r).contains("capped at the server maximum of 5 s"),
            "{}",
            text(&r)
        );
    }
    let r = call(&carol, "execute_code", json!({"code": "print(1)"})).await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(
        text(&r).contains("runs_per_minute") && text(&r).contains("Retry in"),
        "{}",
        text(&r)
    );
    let r = call(&carol, "execute_python", json!({"code": "1+1"})).await;
    assert!(
        is_error(&r) && text(&r).contains("runs_per_minute"),
        "{}",
        text(&r)
    );
    let r = call(&carol, "install_dependencies", json!({"packages": ["six"]})).await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("install_network = false"), "{}", text(&r));

    // -- Metrics, without a token: runs by tenant, refusals, installs.
    let m = http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        format!("mcp_executor_runs_total{{tenant=\"{ALICE}\",outcome=\"ok\"}}"),
        format!("mcp_executor_runs_total{{tenant=\"{CAROL}\",outcome=\"ok\"}} 2"),
        format!("mcp_executor_rejected_total{{tenant=\"{CAROL}\",reason=\"rate\"}} 2"),
        format!("mcp_executor_rejected_total{{tenant=\"{ALICE}\",reason=\"storage\"}} 1"),
        format!("mcp_executor_installs_total{{tenant=\"{CAROL}\",result=\"refused\"}} 1"),
        "mcp_executor_queue_depth 0".to_string(),
    ] {
        assert!(m.contains(&line), "missing `{line}` in\n{m}");
    }
    let ready = http.get(s.url("/readyz")).send().await.unwrap();
    let status = ready.status();
    let body: Value = ready.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["image_present"], true);

    // -- The log names tenants and code digests, never the code.
    let log = s.log_text();
    assert!(log.contains(&format!("tenant={ALICE}")), "{log}");
    assert!(log.contains("code_sha256="), "{log}");
    assert!(
        !log.contains("alice-secret-marker"),
        "code leaked into the log"
    );

    for c in [alice, bob, carol] {
        c.cancel().await.unwrap();
    }
    s.finish().await;
}

#[tokio::test]
async fn a_flooding_tenant_does_not_starve_a_quiet_one() {
    const NOISY: &str = "t-ten-noisy";
    const QUIET: &str = "t-ten-quiet";
    const FLOOD: usize = 10;
    let (tn, tq) = (token::generate(), token::generate());
    let file = [entry(NOISY, &tn, ""), entry(QUIET, &tq, "")].concat();
    let s = Hosted::start(
        &file,
        &[NOISY, QUIET],
        &["--pool-size", "0", "--max-concurrent", "2"],
    )
    .await;
    let noisy = s.client(&tn).await;
    let quiet = s.client(&tq).await;
    // Baseline: the quiet tenant alone.
    let t0 = Instant::now();
    let r = call(&quiet, "execute_code", json!({"code": "print('q')"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let alone = t0.elapsed();
    // The flood: FLOOD runs of 1.5 s on 2 slots, ~7.5 s of work queued ahead.
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        let (noisy, done) = (noisy.clone(), done.clone());
        flood.push(tokio::spawn(async move {
            let r = call(
                &noisy,
                "execute_code",
                json!({"code": "import time\ntime.sleep(1.5)"}),
            )
            .await;
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            r
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = Instant::now();
    let r = call(&quiet, "execute_code", json!({"code": "print('q')"})).await;
    let flooded = t0.elapsed();
    let noisy_done_then = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(!is_error(&r), "{}", text(&r));
    for f in flood {
        let r = f.await.unwrap();
        assert!(!is_error(&r), "{}", text(&r));
    }
    eprintln!(
        "fairness: quiet tenant alone {} ms, during a flood of {FLOOD} x 1.5 s runs on 2 slots {} ms; noisy runs finished by then: {noisy_done_then}",
        alone.as_millis(),
        flooded.as_millis()
    );
    // FIFO would have put the quiet call behind the whole flood (all 10 done first). With
    // turns it takes the next free slot: most of the flood is still to run.
    assert!(
        noisy_done_then <= FLOOD - 4,
        "the quiet call waited behind {noisy_done_then} of {FLOOD} flood runs"
    );
    noisy.cancel().await.unwrap();
    quiet.cancel().await.unwrap();
    s.finish().await;
}

/// The server-wide storage quota (`--storage-limit-total`) holds every tenant together:
/// one tenant's files leave less room for another's, the refusal names the flag, and
/// freeing space lets the other write.
#[tokio::test]
async fn the_server_wide_storage_quota_holds_every_tenant_together() {
    const DORA: &str = "t-ten-dora";
    const ERIN: &str = "t-ten-erin";
    let (td, te) = (token::generate(), token::generate());
    let file = [entry(DORA, &td, ""), entry(ERIN, &te, "")].concat();
    let s = Hosted::start(
        &file,
        &[DORA, ERIN],
        &["--pool-size", "0", "--storage-limit-total", "64k"],
    )
    .await;
    let dora = s.client(&td).await;
    let erin = s.client(&te).await;
    let big = |path: &str| json!({"path": path, "content": "x".repeat(40_000)});

    let r = call(&dora, "write_file", big("d.txt")).await;
    assert!(!is_error(&r), "within every limit: {}", text(&r));
    // Erin's own quota (1 GiB) has room; the server's does not.
    let r = call(&erin, "write_file", big("e.txt")).await;
    assert!(is_error(&r), "past the server-wide quota: {}", text(&r));
    assert!(
        text(&r).contains("--storage-limit-total of 65536 bytes"),
        "{}",
        text(&r)
    );
    // Dora frees her space; Erin's write now fits.
    let r = call(&dora, "write_file", json!({"path": "d.txt", "content": ""})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&erin, "write_file", big("e.txt")).await;
    assert!(!is_error(&r), "room again: {}", text(&r));

    drop((dora, erin));
    s.finish().await;
}
