//! The upstream clients: one official rmcp client per tenant and upstream server, started
//! at the first request of that tenant's code, started again when it died, closed on
//! shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, PingRequest,
    ProgressNotificationParam, ProgressToken, ServerResult, Tool,
};
use rmcp::service::NotificationContext;
use rmcp::service::PeerRequestOptions;
use rmcp::service::{Peer, RunningService};
use rmcp::{RoleClient, ServiceExt};

use super::health::Health;
use super::{config, names, stdio, Caller, Config};

/// How long an upstream may take to start and list its tools.
const START_LIMIT: Duration = Duration::from_secs(60);
/// How long an upstream may take to answer a ping after one of its calls timed out; past
/// it, it is taken for hung and replaced.
const PING_LIMIT: Duration = Duration::from_secs(5);

/// The upstream clients of every tenant.
pub struct Manager {
    pub(super) config: Config,
    /// `PATH` and `HOME` of this server: a stdio upstream gets them and its own `env`, and
    /// no other variable of ours.
    path: Option<std::ffi::OsString>,
    home: Option<std::path::PathBuf>,
    upstreams: Mutex<HashMap<(String, String), Arc<Upstream>>>,
    closed: AtomicBool,
}

pub(super) struct Upstream {
    pub(super) server: config::Server,
    pub(super) tenant: String,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// What the upstream said of itself at its handshake (title or name, and tool count).
    about: Mutex<Option<String>>,
    /// Calls in flight whose progress our client wants, by progress token.
    listeners: Listeners,
    /// Failures in a row, and when it may start again.
    health: Mutex<Health>,
    /// A ping after a timed-out call is under way.
    checking: AtomicBool,
    /// The running stdio upstream sent a message over [`stdio::LINE_LIMIT`] (which ended
    /// its connection); cleared when it starts again.
    overlong: Arc<AtomicBool>,
}

struct Conn {
    service: RunningService<RoleClient, Handler>,
    tools: Arc<Vec<Tool>>,
}

impl Manager {
    pub fn new(
        config: Config,
        path: Option<std::ffi::OsString>,
        home: Option<std::path::PathBuf>,
    ) -> Arc<Manager> {
        Arc::new(Manager {
            config,
            path,
            home,
            upstreams: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// One line per server, for the start-up log; a tenants-file server names its tenant.
    pub fn summary(&self) -> Vec<String> {
        self.config
            .all_servers()
            .map(|(tenant, s)| {
                let how = if s.command.is_some() { "stdio" } else { "http" };
                match tenant {
                    None => format!("{} ({how})", names::module(&s.name)),
                    Some(t) => format!("{} ({how}, tenant {t})", names::module(&s.name)),
                }
            })
            .collect()
    }

    /// One line per server `tenant` sees: `module: what it is`, from the operator's
    /// `description`, else what the upstream said of itself if it has started (its title,
    /// its name), else the kind of server.
    pub(super) fn lines_for(&self, tenant: &str) -> Vec<String> {
        let map = self.upstreams.lock().unwrap();
        self.config
            .servers_for(tenant)
            .map(|s| {
                let about = s.description.clone().or_else(|| {
                    let u = map.get(&(tenant.to_string(), s.name.clone()))?;
                    u.about.lock().unwrap().clone()
                });
                let about = about.unwrap_or_else(|| {
                    if s.command.is_some() {
                        "an MCP server (stdio)"
                    } else {
                        "an MCP server (Streamable HTTP)"
                    }
                    .to_string()
                });
                let about: String = about.split_whitespace().collect::<Vec<_>>().join(" ");
                let about: String = about.chars().take(200).collect();
                format!("{}: {about}", names::module(&s.name))
            })
            .collect()
    }

    pub(super) fn upstream(&self, tenant: &str, server: &str) -> Option<Arc<Upstream>> {
        let conf = self.config.server_of(tenant, server)?;
        let mut map = self.upstreams.lock().unwrap();
        Some(
            map.entry((tenant.to_string(), server.to_string()))
                .or_insert_with(|| {
                    Arc::new(Upstream {
                        server: conf.clone(),
                        tenant: tenant.to_string(),
                        conn: tokio::sync::Mutex::new(None),
                        about: Mutex::new(None),
                        listeners: Listeners::default(),
                        health: Mutex::new(Health::default()),
                        checking: AtomicBool::new(false),
                        overlong: Arc::default(),
                    })
                })
                .clone(),
        )
    }

    pub(super) async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let all: Vec<Arc<Upstream>> = self.upstreams.lock().unwrap().values().cloned().collect();
        for u in all {
            if let Some(c) = u.conn.lock().await.take() {
                let _ = tokio::time::timeout(Duration::from_secs(5), c.service.cancel()).await;
            }
        }
    }

    pub(super) async fn connect(
        &self,
        u: &Upstream,
    ) -> Result<(Peer<RoleClient>, Arc<Vec<Tool>>), String> {
        if self.closed.load(Ordering::SeqCst) {
            return Err("the server is shutting down".into());
        }
        let mut conn = u.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            if !c.service.is_closed() && !c.service.is_transport_closed() {
                return Ok((c.service.peer().clone(), c.tools.clone()));
            }
            tracing::warn!(tenant = %u.tenant, server = %u.server.name, "code mode: the upstream server has gone; starting it again");
            u.health.lock().unwrap().failed("it exited", Instant::now());
            *conn = None;
        }
        if let Some(why) = u.health.lock().unwrap().refusal(Instant::now()) {
            return Err(why);
        }
        let started = Instant::now();
        let c = match self.open(u).await {
            Ok(c) => c,
            Err(e) => {
                let n = u.health.lock().unwrap().failed(&e, Instant::now());
                tracing::warn!(tenant = %u.tenant, server = %u.server.name, error = %e, failures = n, "code mode: the upstream server did not start");
                return Err(e);
            }
        };
        tracing::info!(tenant = %u.tenant, server = %u.server.name, tools = c.tools.len(), ms = started.elapsed().as_millis() as u64, "code mode: upstream server started");
        let out = (c.service.peer().clone(), c.tools.clone());
        *conn = Some(c);
        Ok(out)
    }

    /// Start `u`'s upstream and list its tools.
    async fn open(&self, u: &Upstream) -> Result<Conn, String> {
        let service = tokio::time::timeout(
            START_LIMIT,
            self.start(
                &u.server,
                Handler {
                    listeners: u.listeners.clone(),
                },
                u.overlong.clone(),
            ),
        )
        .await
        .map_err(|_| format!("it did not start within {}s", START_LIMIT.as_secs()))??;
        let tools = tokio::time::timeout(START_LIMIT, service.list_all_tools())
            .await
            .map_err(|_| "it did not list its tools in time".to_string())?
            .map_err(|e| format!("listing its tools failed: {e}"))?;
        let info = service.peer_info();
        if let Some(i) = info.as_ref().and_then(|x| x.server_info.as_ref()) {
            let name = i.title.clone().unwrap_or_else(|| i.name.clone());
            *u.about.lock().unwrap() = Some(format!("{name} ({} tools)", tools.len()));
        }
        Ok(Conn {
            service,
            tools: Arc::new(tools),
        })
    }

    async fn start(
        &self,
        s: &config::Server,
        handler: Handler,
        overlong: Arc<AtomicBool>,
    ) -> Result<RunningService<RoleClient, Handler>, String> {
        if let Some(program) = &s.command {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(&s.args).env_clear();
            if let Some(p) = &self.path {
                cmd.env("PATH", p);
            }
            if let Some(h) = &self.home {
                cmd.env("HOME", h);
            }
            cmd.envs(&s.env);
            if let Some(d) = &s.cwd {
                cmd.current_dir(d);
            }
            overlong.store(false, Ordering::SeqCst);
            let transport = stdio::spawn(cmd, overlong)
                .map_err(|e| format!("could not start `{program}`: {e}"))?;
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("its MCP handshake failed: {e}"))
        } else {
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let url = s.url.clone().unwrap_or_default();
            let mut headers = HashMap::new();
            for (k, v) in &s.headers {
                let name = axum::http::HeaderName::try_from(k.as_str())
                    .map_err(|e| format!("header `{k}`: {e}"))?;
                let value = axum::http::HeaderValue::try_from(v.as_str())
                    .map_err(|e| format!("header `{k}`: {e}"))?;
                headers.insert(name, value);
            }
            let transport = rmcp::transport::StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers),
            );
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("its MCP handshake failed: {e}"))
        }
    }
}

/// Progress listeners of one upstream client: progress token → (the call, our client).
type Listeners = Arc<Mutex<HashMap<String, (String, Arc<dyn Caller>)>>>;

/// The client span of a call to upstream `server` (OpenTelemetry's MCP conventions), and
/// the request carrying its `traceparent` in `_meta`: the upstream's own spans continue the
/// trace.
fn traced(
    mut params: CallToolRequestParams,
    server: &str,
) -> (CallToolRequestParams, crate::telemetry::Span) {
    use rmcp::model::RequestParamsMeta as _;
    let span = crate::telemetry::client_span(format!("tools/call {}", params.name))
        .with("mcp.method.name", "tools/call")
        .with("gen_ai.operation.name", "execute_tool")
        .with("gen_ai.tool.name", params.name.to_string())
        .with("mcp_executor.upstream", server);
    if let Some(tp) = span.traceparent() {
        params.set_traceparent(&tp);
    }
    (params, span)
}

fn token_key(t: &ProgressToken) -> String {
    serde_json::to_string(t).unwrap_or_default()
}

impl Upstream {
    /// `tools/call` on `peer` (this upstream's client). With `progress` (`server.tool` and
    /// our client), the upstream's progress of this call goes to our client while it
    /// runs (rmcp gives every request its own progress token: the one we listen for).
    /// Dropping the future (the run ended) sends `notifications/cancelled` upstream.
    pub(super) async fn call_tool(
        &self,
        peer: &Peer<RoleClient>,
        params: CallToolRequestParams,
        progress: Option<(String, Arc<dyn Caller>)>,
    ) -> Result<CallToolResult, String> {
        let (params, mut span) = traced(params, &self.server.name);
        let result = self.call_tool_inner(peer, params, progress).await;
        match &result {
            Ok(r) if r.is_error == Some(true) => span.fail("tool_error"),
            Ok(_) => {}
            Err(_) => span.fail("upstream_error"),
        }
        result
            .map_err(|e| {
                if self.overlong.load(Ordering::SeqCst) {
                    tracing::warn!(tenant = %self.tenant, server = %self.server.name, limit = stdio::LINE_LIMIT, "code mode: the upstream server sent a message over the limit; its connection was closed and it starts again at the next call");
                    format!(
                        "the server sent a message over {} MiB, the most one message may be; it was stopped and starts again at the next call",
                        stdio::LINE_LIMIT >> 20
                    )
                } else {
                    e.to_string()
                }
            })
    }

    async fn call_tool_inner(
        &self,
        peer: &Peer<RoleClient>,
        params: CallToolRequestParams,
        progress: Option<(String, Arc<dyn Caller>)>,
    ) -> Result<CallToolResult, rmcp::ServiceError> {
        let handle = peer
            .send_request_with_option(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await?;
        let _listening = progress.map(|(what, caller)| {
            let key = token_key(&handle.progress_token);
            self.listeners
                .lock()
                .unwrap()
                .insert(key.clone(), (what, caller));
            Listening {
                listeners: self.listeners.clone(),
                key,
            }
        });
        let mut abandoned = Abandoned {
            peer: peer.clone(),
            id: Some(handle.id.clone()),
        };
        let result = handle.await_response().await;
        abandoned.id = None;
        match result? {
            ServerResult::CallToolResult(r) => {
                self.health.lock().unwrap().answered();
                Ok(r)
            }
            _ => Err(rmcp::ServiceError::UnexpectedResponse),
        }
    }

    /// After one of its calls timed out: an upstream that does not answer a ping within
    /// [`PING_LIMIT`] is hung (a tool blocking its loop, say): it is closed (its process
    /// killed), its other calls fail at once, and the next call starts a new one (a
    /// failure in a row for the backoff). One check at a time; never delays the caller.
    pub(super) fn check_after_timeout(self: Arc<Self>) {
        if self.checking.swap(true, Ordering::SeqCst) {
            return;
        }
        tokio::spawn(async move {
            let current = {
                let c = self.conn.lock().await;
                c.as_ref()
                    .map(|c| (c.service.peer().clone(), c.tools.clone()))
            };
            if let Some((peer, tools)) = current {
                let ping = peer.send_request(ClientRequest::PingRequest(PingRequest {
                    method: Default::default(),
                    extensions: Default::default(),
                }));
                if !matches!(tokio::time::timeout(PING_LIMIT, ping).await, Ok(Ok(_))) {
                    let mut c = self.conn.lock().await;
                    // Only the connection pinged: a new one may have replaced it meanwhile.
                    if c.as_ref().is_some_and(|c| Arc::ptr_eq(&c.tools, &tools)) {
                        let old = c.take();
                        drop(c);
                        let n = self
                            .health
                            .lock()
                            .unwrap()
                            .failed("it stopped answering", Instant::now());
                        tracing::warn!(tenant = %self.tenant, server = %self.server.name, failures = n, "code mode: the upstream server did not answer a ping after a call timed out; it is closed and started again at the next call");
                        if let Some(old) = old {
                            let _ =
                                tokio::time::timeout(Duration::from_secs(5), old.service.cancel())
                                    .await;
                        }
                    }
                }
            }
            self.checking.store(false, Ordering::SeqCst);
        });
    }
}

/// Sends `notifications/cancelled` for a request whose caller went away before its answer.
struct Abandoned {
    peer: Peer<RoleClient>,
    id: Option<rmcp::model::RequestId>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let Ok(param) = serde_json::from_value(serde_json::json!({
            "requestId": id,
            "reason": "the sandboxed run that made this call ended",
        })) else {
            return;
        };
        let peer = self.peer.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { peer.notify_cancelled(param).await });
        }
    }
}

/// Stops forwarding a call's progress when dropped (the call ended or was dropped).
pub(super) struct Listening {
    listeners: Listeners,
    key: String,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.listeners.lock().unwrap().remove(&self.key);
    }
}

/// The client side of one upstream connection: progress of a call goes to the client
/// of the run that made it.
#[derive(Clone)]
pub(super) struct Handler {
    listeners: Listeners,
}

impl rmcp::ClientHandler for Handler {
    async fn on_progress(
        &self,
        p: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Some((what, caller)) = self
            .listeners
            .lock()
            .unwrap()
            .get(&token_key(&p.progress_token))
            .cloned()
        else {
            return;
        };
        let amount = match p.total {
            Some(t) => format!("{}/{t}", p.progress),
            None => format!("{}", p.progress),
        };
        let message = match p.message {
            Some(m) => format!("{what}: {m} ({amount})"),
            None => format!("{what}: {amount}"),
        };
        // Not on the upstream client's own loop: our client may be slow to take it.
        tokio::spawn(async move { caller.progress(message).await });
    }
}
