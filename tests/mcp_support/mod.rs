//! Shared set-up for the MCP tests: a real server (real Docker backend, real storage dir) on
//! 127.0.0.1 port 0, and a real rmcp client. No mocks and no skips: without Docker these fail.
//!
//! The server is started by [`mcp_code_executor::server::run`], the function the binary's
//! `serve` calls, from [`ServeConfig::local`] (serve's defaults), with a listener on port 0,
//! the test's sandbox handed in, and no isolation self-test (the binary always runs it;
//! `doctor`'s tests and the first-run tests cover it).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use mcp_code_executor::app::{self, Settings};
use mcp_code_executor::backend::docker::DockerBackend;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::config::ServeConfig;
use mcp_code_executor::mcp::transports::http::HttpOptions;
use mcp_code_executor::server::{self, EnvSource};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use mcp_code_executor::config::defaults::SHUTDOWN_LIMIT;

pub(crate) use crate::common;

/// A running HTTP server and what a test needs to check on it.
pub struct Server {
    pub addr: std::net::SocketAddr,
    pub sandbox: Arc<DockerBackend>,
    pub storage_dir: PathBuf,
    pub tenant: String,
    /// The tenant's executor (its execute_python sessions among its parts).
    pub executor: Arc<app::Executor>,
    pub shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// The server's directories, removed when the server is dropped, whether the test
    /// passed or not.
    _dirs: common::TempDirs,
}

/// Start a server whose containers carry the label `tenant`.
pub async fn server(tenant: &str) -> Server {
    server_with(tenant, Settings::default()).await
}

pub async fn server_with(tenant: &str, settings: Settings) -> Server {
    server_full(tenant, settings, None).await
}

/// A server with Python environments: the managed default under `data_dir`.
pub async fn server_with_environments(tenant: &str, data_dir: &std::path::Path) -> Server {
    use mcp_code_executor::env::manager::EnvManager;
    use mcp_code_executor::env::state::{EnvState, Environments};
    let sandbox = common::sandbox().await;
    let manager = EnvManager::new(data_dir.to_path_buf(), EnvManager::default_ca_bundle())
        .with_pip_index(&mcp_code_executor::config::PipIndex::from_vars(|k| {
            std::env::var(k).ok()
        }));
    let state = EnvState::init(&*sandbox, &manager, tenant, None)
        .await
        .expect("the managed environment");
    server_full(
        tenant,
        Settings::default(),
        Some(Arc::new(Environments { manager, state })),
    )
    .await
}

async fn server_full(
    tenant: &str,
    settings: Settings,
    envs: Option<Arc<mcp_code_executor::env::state::Environments>>,
) -> Server {
    server_custom(tenant, settings, envs, &HttpOptions::default(), |s| s).await
}

/// A server with its own HTTP options, whose executor runs on `wrap(real sandbox)`.
pub async fn server_custom(
    tenant: &str,
    settings: Settings,
    envs: Option<Arc<mcp_code_executor::env::state::Environments>>,
    opts: &HttpOptions,
    wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>,
) -> Server {
    server_serving(tenant, settings, envs, opts, wrap, |_| {}).await
}

/// A server whose `serve` configuration `edit` changes last (traces, for instance).
pub async fn server_configured(tenant: &str, edit: impl FnOnce(&mut ServeConfig)) -> Server {
    server_serving(
        tenant,
        Settings::default(),
        None,
        &HttpOptions::default(),
        |s| s,
        edit,
    )
    .await
}

async fn server_serving(
    tenant: &str,
    mut settings: Settings,
    envs: Option<Arc<mcp_code_executor::env::state::Environments>>,
    opts: &HttpOptions,
    wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>,
    edit: impl FnOnce(&mut ServeConfig),
) -> Server {
    let sandbox = common::sandbox().await;
    let storage_dir = std::env::temp_dir().join(format!(
        "mcp-test-{tenant}-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let workspaces = storage_dir.with_extension("ws");
    let dirs = common::TempDirs(vec![
        storage_dir.clone(),
        workspaces.clone(),
        storage_dir.with_extension("data"),
    ]);
    let mut serve = ServeConfig::local(storage_dir.with_extension("data"));
    serve.tenant = tenant.to_string();
    serve.code_storage_dir = storage_dir.clone();
    serve.workspace_dir = workspaces.clone();
    // The test's sandbox keeps no warm pool (`/readyz` does not wait for one).
    serve.backend.pool_size = 0;
    edit(&mut serve);
    settings.tenant = tenant.to_string();
    settings.sessions.workspace_root = workspaces;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut config = server::Config::from(serve);
    config.settings = settings;
    config.http = opts.clone();
    config.listener = Some(listener);
    config.backend = Some(wrap(sandbox.clone() as Arc<dyn Backend>));
    config.self_test = false;
    config.environments = envs.map_or(EnvSource::None, EnvSource::Given);
    let mut serving = config.serving.subscribe();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::run(config, shutdown.clone()));
    let service = tokio::time::timeout(Duration::from_secs(60), serving.wait_for(Option::is_some))
        .await
        .expect("the server serves within 60 s")
        .expect("the server is running")
        .clone()
        .expect("serving");
    let executor = service.tenants()[0].clone();
    Server {
        addr,
        sandbox,
        storage_dir,
        tenant: tenant.to_string(),
        executor,
        shutdown,
        task,
        _dirs: dirs,
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A Streamable HTTP client session.
    pub async fn client(&self) -> RunningService<RoleClient, ()> {
        let transport = StreamableHttpClientTransport::from_uri(self.url("/mcp"));
        ().serve(transport)
            .await
            .expect("client connects over Streamable HTTP")
    }

    /// Stop the server as `serve` does (sessions closed before the sandbox is drained), and
    /// check none of our containers is left.
    pub async fn finish(self) {
        self.shutdown.cancel();
        let ended = tokio::time::timeout(SHUTDOWN_LIMIT, self.task).await;
        match ended {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("the server failed: {e:#}"),
            Ok(Err(e)) => panic!("the server task: {e}"),
            Err(_) => panic!("the server did not stop within {SHUTDOWN_LIMIT:?}"),
        }
        assert!(
            self.executor
                .wait_sessions_closed(app::settings::SHUTDOWN_DEADLINE)
                .await,
            "sessions still open after the shutdown deadline"
        );
        common::assert_clean(&self.sandbox, &self.tenant).await;
    }
}

/// Call `tool` with JSON `args`; panics on protocol errors.
pub async fn call(client: &rmcp::Peer<RoleClient>, tool: &str, args: Value) -> CallToolResult {
    try_call(client, tool, args)
        .await
        .unwrap_or_else(|e| panic!("{tool} failed at the protocol level: {e}"))
}

pub async fn try_call(
    client: &rmcp::Peer<RoleClient>,
    tool: &str,
    args: Value,
) -> Result<CallToolResult, rmcp::ServiceError> {
    let mut params = CallToolRequestParams::new(tool.to_string());
    if let Value::Object(map) = args {
        params = params.with_arguments(map);
    }
    client.call_tool(params).await
}

/// The text of the first content block.
pub fn text(r: &CallToolResult) -> String {
    r.content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

pub fn structured(r: &CallToolResult) -> Value {
    r.structured_content.clone().expect("structuredContent")
}

pub fn is_error(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
}

impl Server {
    /// Wait until no container of this server's tenant exists (removal runs in the background).
    pub async fn sandbox_drained_within(&self, limit: Duration) {
        let t0 = std::time::Instant::now();
        loop {
            let left = common::containers_of(&self.tenant);
            if left.is_empty() {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "containers still there after {limit:?}: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A client handler that records progress notifications.
#[derive(Clone, Default)]
pub struct ProgressRecorder {
    pub seen: Arc<std::sync::Mutex<Vec<rmcp::model::ProgressNotificationParam>>>,
}

impl rmcp::ClientHandler for ProgressRecorder {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.seen.lock().unwrap().push(params);
    }
}

impl ProgressRecorder {
    pub fn messages(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter_map(|p| p.message.clone())
            .collect()
    }

    /// Wait until a notification whose message starts with `prefix` arrived.
    pub async fn wait_for(&self, prefix: &str, limit: Duration) {
        let t0 = std::time::Instant::now();
        while !self.messages().iter().any(|m| m.starts_with(prefix)) {
            assert!(
                t0.elapsed() < limit,
                "no `{prefix}` notification within {limit:?}: {:?}",
                self.messages()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One JSON-RPC request of `method` at protocol 2026-07-28 over raw HTTP (no protocol
/// session; the official SDKs have no client side for some of what the tests send), from a
/// client of `capabilities`, with `headers` added (a bearer token, a `traceparent`): the
/// response as it came (its status, headers and body are the caller's). `Mcp-Name` is the
/// params' `name`, `taskId` or `uri`, whichever it has.
pub async fn raw_2026_request(
    url: &str,
    method: &str,
    mut params: Value,
    capabilities: Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    params["_meta"] = serde_json::json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    });
    let mut req = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", method);
    if let Some(name) = ["name", "taskId", "uri"]
        .iter()
        .find_map(|k| params.get(*k).and_then(Value::as_str))
    {
        req = req.header("Mcp-Name", name);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    req.body(body.to_string())
        .send()
        .await
        .expect("the server answers")
}

/// [`raw_2026_request`]'s status and text (JSON, or SSE whose data lines carry it).
pub async fn raw_2026_text(
    url: &str,
    method: &str,
    params: Value,
    capabilities: Value,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let resp = raw_2026_request(url, method, params, capabilities, headers).await;
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

/// [`raw_2026_text`]'s response: its `result`, or `{"error": …}`.
pub async fn raw_2026(
    url: &str,
    method: &str,
    params: Value,
    capabilities: Value,
    headers: &[(&str, &str)],
) -> Value {
    let (_, text) = raw_2026_text(url, method, params, capabilities, headers).await;
    response_of(method, &text)
}

/// The JSON-RPC message in a response body: the JSON body, or the first `data:` line of an
/// SSE stream that has an id; None when there is neither.
pub fn message_of(text: &str) -> Option<Value> {
    serde_json::from_str(text).ok().or_else(|| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
    })
}

/// The response to a request in `text` (JSON, or SSE): its `result`, or `{"error": …}`.
pub fn response_of(method: &str, text: &str) -> Value {
    let msg = message_of(text).unwrap_or_else(|| panic!("no response to {method}: {text}"));
    match msg.get("error") {
        Some(e) => serde_json::json!({ "error": e }),
        None => msg["result"].clone(),
    }
}
