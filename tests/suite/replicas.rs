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

use crate::common;

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
    _dirs: common::TempDirs,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.balancer.start_kill();
        for r in &mut self.replicas {
            let _ = r.child.start_kill();
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
        let ports = [free_port(), free_port()];
        let peers = ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut replicas = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            replicas.push(spawn_replica(*port, &peers, &tenant, &dir, i, extra));
        }
        let lb_port = free_port();
        let balancer = spawn_nginx(&dir, lb_port, &ports);
        let mut cluster = Cluster {
            replicas,
            balancer,
            lb_port,
            tenant,
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

#[tokio::test]
async fn sdk_flows_twenty_times_through_a_balancer_without_affinity() {
    let c = Cluster::start("flows", &["--max-sessions", "48"]).await;
    let t0 = Instant::now();
    let out = script(vec!["flows".into(), c.lb("/mcp"), "20".into()]).await;
    eprintln!("{out}flows took {:.1} s", t0.elapsed().as_secs_f64());
    assert!(out.contains("ok: auto 2026-07-28 x20"), "{out}");
    assert!(out.contains("ok: legacy 2025-11-25 x20"), "{out}");
    assert!(out.contains("ok: tasks x20"), "{out}");
    // Round robin spread the calls: each replica sent some to the other.
    for r in &c.replicas {
        let n = metric(r, "mcp_executor_forwarded_total").await;
        assert!(n > 0.0, "replica {} forwarded nothing:\n{}", r.id, r.log());
    }
    // The replicas' own endpoint and header are not for clients: a wrong secret is refused,
    // and without one the internal path does not exist.
    let http = reqwest::Client::new();
    let r = http
        .post(c.lb("/mcp"))
        .header("X-Mcp-Executor-Forwarded", "guessed")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = http.get(c.lb("/internal/replica")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // The forwarding overhead: the same call on its owner and through the other replica.
    let out = script(vec![
        "overhead".into(),
        c.replicas[0].url("/mcp"),
        c.replicas[1].url("/mcp"),
        "200".into(),
    ])
    .await;
    let p50: Value = serde_json::from_str(out.trim()).expect("p50s as JSON");
    let (owner, fwd) = (
        p50["owner"].as_f64().unwrap(),
        p50["forwarded"].as_f64().unwrap(),
    );
    eprintln!(
        "forwarding overhead, read_file on a session, p50 of 100 each: on the owner {owner:.2} ms, \
         forwarded {fwd:.2} ms, overhead {:.2} ms",
        fwd - owner
    );
    assert!(fwd - owner < 25.0, "forwarding costs {} ms", fwd - owner);
}

#[tokio::test]
async fn a_killed_replica_costs_only_its_own_handles_and_the_survivor_sweeps_it() {
    let mut c = Cluster::start("kill", &["--sweep-every", "2"]).await;
    let (dead_id, dead_pid) = (c.replicas[0].id.clone(), c.replicas[0].pid);
    let out = script(vec!["session".into(), c.lb("/mcp"), dead_id.clone()]).await;
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    let (sid, path, tid) = (&lines[0], &lines[1], &lines[2]);
    assert!(sid.starts_with(&format!("s_{dead_id}_")), "{sid}");
    let lb = c.lb("/mcp");
    let call = || {
        script(vec![
            "call".into(),
            lb.clone(),
            sid.clone(),
            path.clone(),
            tid.clone(),
        ])
    };
    // Two servers, one daemon: the other replica sweeps every 2 s; after a few sweeps the
    // live replica's sandboxes (its session, its running task, its pool) are all there.
    let before = common::containers_left_by(dead_pid, true);
    assert!(
        before.len() >= 2,
        "the replica's session and task containers: {before:?}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = common::containers_left_by(dead_pid, true);
    for id in &before {
        assert!(
            after.contains(id),
            "a live replica's container {id} was removed by the other's sweep"
        );
    }
    let alive: Value = serde_json::from_str(call().await.trim()).unwrap();
    assert_eq!(alive["session"]["is_error"], false, "{alive}");
    assert!(
        alive["session"]["text"].as_str().unwrap().contains("42"),
        "{alive}"
    );
    assert_eq!(alive["task"]["status"], "working", "{alive}");

    c.replicas[0].signal(libc::SIGKILL);
    let _ = c.replicas[0].child.wait().await;
    let gone: Value = serde_json::from_str(call().await.trim()).unwrap();
    let text = gone["session"]["text"].as_str().unwrap();
    assert_eq!(gone["session"]["is_error"], true, "{gone}");
    for words in [
        "is gone",
        &dead_id,
        "variables",
        "Kept",
        "without session_id",
    ] {
        assert!(text.contains(words), "{words:?} not in {text}");
    }
    assert_eq!(gone["stored"]["is_error"], false, "{gone}");
    assert!(
        gone["stored"]["text"]
            .as_str()
            .unwrap()
            .contains("stored survives"),
        "{gone}"
    );
    assert_eq!(gone["new"]["is_error"], false, "{gone}");
    assert!(
        gone["new"]["text"].as_str().unwrap().contains('2'),
        "{gone}"
    );
    let task_error = gone["task"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        task_error.contains("is gone") && task_error.contains(&dead_id),
        "{gone}"
    );
    // The survivor's next sweeps remove everything the dead replica left.
    let t0 = Instant::now();
    loop {
        let left = common::containers_left_by(dead_pid, true);
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the killed replica's containers are still there: {left:?}\n{}",
            c.replicas[1].log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let n = metric(&c.replicas[1], "mcp_executor_owner_gone_total").await;
    assert!(n >= 2.0, "calls on the dead replica's handles counted: {n}");
}

/// One `execute_code` at 2026-07-28 over raw HTTP: the status and the JSON-RPC message.
async fn raw_call(url: String, code: &str, timeout: u64) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": "execute_code", "arguments": {"code": code, "timeout": timeout},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "replicas", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let resp = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "tools/call")
        .header("Mcp-Name", "execute_code")
        .body(body.to_string())
        .send()
        .await
        .expect("an answer, not a dropped connection");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("the whole answer");
    let msg = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC answer: {text}"))
    });
    (status, msg)
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

#[tokio::test]
async fn sigterm_drops_readiness_first_and_answers_every_run() {
    let mut c = Cluster::start("term", &["--drain-grace", "8"]).await;
    let short = tokio::spawn(raw_call(
        c.replicas[0].url("/mcp"),
        "import time\ntime.sleep(4)\nprint('finished in the grace')",
        60,
    ));
    let long = tokio::spawn(raw_call(
        c.replicas[0].url("/mcp"),
        "import time\ntime.sleep(60)\nprint('never')",
        90,
    ));
    // Both runs started (their containers are the replica's, beside its pool sandbox).
    let t0 = Instant::now();
    while common::containers_left_by(c.replicas[0].pid, false).len() < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the runs did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.replicas[0].signal(libc::SIGTERM);
    let t_term = Instant::now();
    // Readiness drops at once, while the runs go on.
    loop {
        let r = reqwest::get(c.replicas[0].url("/readyz")).await.unwrap();
        if r.status().as_u16() == 503 {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["draining"], true, "{body}");
            break;
        }
        assert!(
            t_term.elapsed() < Duration::from_secs(1),
            "/readyz still 200 after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new call through the balancer still works (on the draining replica it is sent on).
    for _ in 0..2 {
        let (status, msg) = raw_call(c.lb("/mcp"), "print(6 * 7)", 30).await;
        assert_eq!(status, 200, "{msg}");
        assert!(text_of(&msg).contains("42"), "{msg}");
    }
    let (status, msg) = short.await.unwrap();
    assert_eq!(
        (status, msg["result"]["isError"].clone()),
        (200, json!(false)),
        "{msg}"
    );
    assert!(text_of(&msg).contains("finished in the grace"), "{msg}");
    let (status, msg) = long.await.unwrap();
    assert_eq!(status, 200, "{msg}");
    assert_eq!(msg["result"]["isError"], true, "{msg}");
    assert!(text_of(&msg).contains("shutting down"), "{msg}");
    let waited = t_term.elapsed();
    assert!(
        waited >= Duration::from_secs(7),
        "the long run was stopped before the grace: {waited:?}"
    );
    let exit = tokio::time::timeout(Duration::from_secs(30), c.replicas[0].child.wait()).await;
    assert!(
        exit.is_ok(),
        "the replica did not exit:\n{}",
        c.replicas[0].log()
    );
    common::assert_nothing_left_by(c.replicas[0].pid);
}

/// The same flows with both replicas on the Kubernetes backend, pointed at the API stand-in
/// (`tests/kube_standin`, whose pods are containers of the local daemon): handles,
/// forwarding and the balancer do not depend on the backend. Twenty rounds in each mode
/// and of tasks, as on Docker.
#[tokio::test(flavor = "multi_thread")]
async fn sdk_flows_through_a_balancer_with_two_replicas_on_the_kubernetes_standin() {
    common::sandbox().await;
    let k = tokio::task::spawn_blocking(crate::kube_standin::StandIn::start)
        .await
        .unwrap();
    let kubeconfig = k.kubeconfig_path.to_str().unwrap().to_string();
    // `--allow-unsafe`: a PodSpec has no pids limit (on a cluster it is the kubelet's), and
    // the stand-in runs containers without one, so the self-test's fork bomb fails there.
    let c = Cluster::start(
        "flows-kube",
        &[
            "--max-sessions",
            "48",
            "--allow-unsafe",
            "--backend",
            "kubernetes",
            "--kubeconfig",
            &kubeconfig,
        ],
    )
    .await;
    let out = script(vec!["flows".into(), c.lb("/mcp"), "20".into()]).await;
    assert!(out.contains("ok: auto 2026-07-28 x20"), "{out}");
    assert!(out.contains("ok: legacy 2025-11-25 x20"), "{out}");
    assert!(out.contains("ok: tasks x20"), "{out}");
    for r in &c.replicas {
        let n = metric(r, "mcp_executor_forwarded_total").await;
        assert!(n > 0.0, "replica {} forwarded nothing:\n{}", r.id, r.log());
    }
    // The sandboxes were the stand-in's pods (each replica keeps a warm one).
    assert!(!k.pods().is_empty(), "no pod in the stand-in");
    drop(c);
}
