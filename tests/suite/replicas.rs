//! More than one replica, no affinity (issue #27): nginx from Debian's packages, round
//! robin, in front of two `serve` processes on 127.0.0.1 (Docker backend, one daemon, one
//! shared code storage directory), peers of each other (`--peers`, `--cluster-secret`).
//! Clients: the official Python SDK in its default (2026-07-28) and legacy modes, and raw
//! HTTP for tasks (`tests/sdk/replicas.py`).
//!
//! - the flows of the issue 20 times in a row in both modes (sessions, workspace files,
//!   the incremental file flow, resource links; tasks read and cancelled through either
//!   replica), each replica having forwarded calls to the other; the forwarding overhead
//!   (p50 of the same call on its owner and through the other replica) printed;
//! - `kill -9` of one replica: calls on its handles say what was lost and what survives,
//!   stored code still runs, new sessions work, and the survivor's sweep removes what the
//!   dead one left, while before the kill the survivor's sweeps (every 2 s) left the live
//!   replica's sandboxes alone (two servers, one daemon: the owner label);
//! - the same flows with both replicas on the Kubernetes backend (the API stand-in);
//! - SIGTERM during runs: `/readyz` says 503 at once, a run that fits the drain grace
//!   finishes, one that does not ends with an error saying so, a new call through the
//!   balancer still works.
//!
//! `scripts/test.sh` installs nginx; without it these tests fail and say so.

mod consent;
mod flows;
mod gone;
mod hostile;
mod traces;

use crate::common;
use crate::mcp_support;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/replicas.py");
const NGINX: &str = "/usr/sbin/nginx";

/// Run `replicas.py ARGS` (blocking, in a thread); its stdout, or a panic with its output.
async fn script(args: Vec<String>) -> String {
    let python = common::sdk_python();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(&python)
            .arg(SCRIPT)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("python starts");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "replicas.py {args:?} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    })
    .await
    .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `serve` process, killed when dropped.
struct Replica {
    child: tokio::process::Child,
    port: u16,
    pid: u32,
    /// Its owner label, taken while it lives: what it made (its pool's sandboxes too,
    /// labelled `pool`, not with the tenant) is removed by it when the cluster goes.
    owner: String,
    id: String,
    log: Arc<Mutex<String>>,
}

impl Replica {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid as i32, sig);
        }
    }
}

/// Two replicas behind nginx; everything removed when dropped, also when a test fails.
struct Cluster {
    replicas: Vec<Replica>,
    balancer: tokio::process::Child,
    lb_port: u16,
    tenant: String,
    /// The tenant's bearer token, when the replicas have a tenants file.
    token: Option<String>,
    _dirs: common::TempDirs,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.balancer.start_kill();
        for r in &mut self.replicas {
            let _ = r.child.start_kill();
        }
        // Killed, the replicas remove nothing: their pools' sandboxes (a stop of 2026-11-28
        // left three behind, exited) go here with the tenant's, once each process is gone
        // and can make no more.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
        for r in &mut self.replicas {
            while matches!(r.child.try_wait(), Ok(None)) && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            common::remove_containers(&common::containers_owned_by(&r.owner));
        }
        common::remove_containers(&common::containers_of(&self.tenant));
    }
}

impl Cluster {
    fn lb(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.lb_port)
    }

    /// Two replicas (`extra` flags for both) and the balancer, once both are ready.
    async fn start(name: &str, extra: &[&str]) -> Cluster {
        Cluster::start_with(name, extra, false).await
    }

    /// [`Cluster::start`], with `tokens`: a tenants file of one tenant (its token in
    /// [`Cluster::token`]), so that every MCP request needs `Authorization: Bearer`.
    async fn start_with(name: &str, extra: &[&str], tokens: bool) -> Cluster {
        assert!(
            std::path::Path::new(NGINX).exists(),
            "nginx is needed at {NGINX} (Debian package `nginx`): run scripts/test.sh, or \
             `apt-get update && apt-get install -y nginx`"
        );
        common::sdk_python();
        common::sandbox().await;
        let (dirs, dir) = common::TempDirs::one(&format!("replicas-{name}"));
        let tenant = format!(
            "t-repl-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let token = tokens.then(|| {
            use mcp_code_executor::tenancy::token;
            let t = token::generate();
            let file = dir.join("tenants.toml");
            std::fs::write(
                &file,
                format!(
                    "[[tenants]]\nid = \"{tenant}\"\ntoken_sha256 = \"{}\"\n",
                    token::to_hex(&token::hash(&t))
                ),
            )
            .unwrap();
            extra.extend(["--tenants".to_string(), file.display().to_string()]);
            t
        });
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let ports = [free_port(), free_port()];
        let peers = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut replicas = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            replicas.push(spawn_replica(*port, &peers, &tenant, &dir, i, &extra));
        }
        let lb_port = free_port();
        let balancer = spawn_nginx(&dir, lb_port, &ports);
        let mut cluster = Cluster {
            replicas,
            balancer,
            lb_port,
            tenant,
            token,
            _dirs: dirs,
        };
        let http = reqwest::Client::new();
        for r in &mut cluster.replicas {
            let t0 = Instant::now();
            loop {
                if let Ok(resp) = http.get(r.url("/readyz")).send().await {
                    let ok = resp.status().is_success();
                    let body: Value = resp.json().await.unwrap_or_default();
                    if ok {
                        r.id = body["replica"]
                            .as_str()
                            .expect("readyz names the replica")
                            .into();
                        break;
                    }
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(240),
                    "replica on port {} not ready:\n{}",
                    r.port,
                    r.log()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        assert_ne!(cluster.replicas[0].id, cluster.replicas[1].id);
        cluster
    }
}

fn spawn_replica(
    port: u16,
    peers: &str,
    tenant: &str,
    dir: &std::path::Path,
    i: usize,
    extra: &[&str],
) -> Replica {
    let mut child = tokio::process::Command::new(BIN)
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--pool-size",
            "1",
        ])
        .args(["--peers", peers, "--cluster-secret", "test-secret-123"])
        .args(extra)
        .env("CODE_STORAGE_DIR", dir.join("code"))
        .env("MCP_EXECUTOR_DATA_DIR", dir.join(format!("data{i}")))
        .env("MCP_EXECUTOR_TENANT", tenant)
        .env("RUST_LOG", "mcp_code_executor=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let pid = child.id().unwrap();
    let owner = common::owner_of_process(pid);
    let log = Arc::new(Mutex::new(String::new()));
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let mut s = sink.lock().unwrap();
            s.push_str(&l);
            s.push('\n');
        }
    });
    Replica {
        child,
        port,
        pid,
        owner,
        id: String::new(),
        log,
    }
}

/// nginx in the foreground, one process, round robin over `ports`, no affinity, responses
/// streamed (`proxy_buffering off`); a connection refused goes to the next replica.
fn spawn_nginx(dir: &std::path::Path, port: u16, ports: &[u16]) -> tokio::process::Child {
    let d = dir.join("nginx");
    std::fs::create_dir_all(&d).unwrap();
    let d = d.display();
    let servers: String = ports
        .iter()
        .map(|p| format!("server 127.0.0.1:{p} max_fails=0;\n"))
        .collect();
    let conf = format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 512; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  client_max_body_size 16m;
  upstream replicas {{
    {servers}
    keepalive 16;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
      proxy_next_upstream error timeout;
    }}
  }}
}}
"#
    );
    let path = format!("{d}/nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let test = Command::new(NGINX)
        .args(["-t", "-c", &path])
        .output()
        .unwrap();
    assert!(test.status.success(), "nginx -t: {test:?}");
    tokio::process::Command::new(NGINX)
        .args(["-c", &path])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nginx starts")
}

/// The replica's `/metrics` value of `name` (0 when absent).
async fn metric(r: &Replica, name: &str) -> f64 {
    let text = reqwest::get(r.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// One `execute_code` at 2026-07-28 over raw HTTP: the status and the JSON-RPC message.
async fn raw_call(url: String, code: &str, timeout: u64) -> (u16, Value) {
    raw_tool(
        &url,
        "execute_code",
        json!({"code": code, "timeout": timeout}),
        &[],
    )
    .await
}

/// One tool call at 2026-07-28 over raw HTTP, with `headers` added: the status and the
/// JSON-RPC message (from a JSON body or an SSE stream).
async fn raw_tool(url: &str, name: &str, args: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let params = json!({"name": name, "arguments": args});
    let resp = mcp_support::raw_2026_request(url, "tools/call", params, json!({}), headers).await;
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("the whole answer");
    (status, rpc_message(&text))
}

/// The JSON-RPC answer in a response body (see [`mcp_support::message_of`]), or the text
/// itself under `not_json_rpc`.
fn rpc_message(text: &str) -> Value {
    mcp_support::message_of(text).unwrap_or_else(|| json!({ "not_json_rpc": text }))
}

/// A new `execute_python` session on `r` running `code`: its handle.
async fn session_on(r: &Replica, code: &str, headers: &[(&str, &str)]) -> String {
    let (status, msg) = raw_tool(
        &r.url("/mcp"),
        "execute_python",
        json!({"code": code}),
        headers,
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    let sid = msg["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a session_id: {msg}"))
        .to_string();
    assert!(sid.starts_with(&format!("s_{}_", r.id)), "{sid}");
    sid
}

/// The replica's resident memory, MiB (`VmRSS`).
fn rss_mib(r: &Replica) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", r.pid)).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn text_of(msg: &Value) -> String {
    msg["result"]["content"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|| msg.to_string())
}
