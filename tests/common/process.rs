//! A `serve` process of the real binary on 127.0.0.1, port 0, with its own directories and
//! tenant label, for tests that need the whole server (signals, RSS, the start-up path).
//! Killed, its containers and directories removed when dropped, also when a test fails.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::common;

pub struct Server {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
    pub dir: std::path::PathBuf,
    pub tenant: String,
    pid: u32,
    /// Its owner label (see `common::owner_of_process`).
    owner: String,
}

impl Server {
    /// `serve --port 0 --pool-size 0 ARGS` (no `--pool-size 0` when ARGS name a size) with
    /// `envs` set, tenant `t-NAME-<random>`; returns once it serves. `MCE_TEST_BIN` names
    /// another build to start (an older one).
    pub async fn start(name: &str, args: &[&str], envs: &[(&str, &str)]) -> Server {
        let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
        let tenant = format!("t-{name}-{id}");
        let dir = std::env::temp_dir().join(format!("mcp-test-{name}-{id}"));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let bin = std::env::var("MCE_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mcp-code-executor").to_string());
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["serve", "--port", "0"]);
        if !args.contains(&"--pool-size") {
            cmd.args(["--pool-size", "0"]);
        }
        cmd.args(args)
            .env("CODE_STORAGE_DIR", dir.join("code"))
            .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
            .env("MCP_EXECUTOR_TENANT", &tenant)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn the server");
        let pid = child.id().expect("running");
        // Its pool's containers carry the tenant label `pool`: they are found by its owner
        // label, read while it lives.
        let owner = common::owner_of_process(pid);
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel::<String>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn({
            let stderr = stderr.clone();
            async move {
                let (mut addr_tx, mut ready_tx) = (Some(addr_tx), Some(ready_tx));
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let a: String = rest
                            .chars()
                            .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ':'))
                            .collect();
                        if let Some(tx) = addr_tx.take() {
                            let _ = tx.send(a.trim_end_matches(':').to_string());
                        }
                    }
                    if line.contains("serving Streamable HTTP") {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    let mut s = stderr.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(60), addr_rx)
            .await
            .expect("the server says where it listens")
            .unwrap()
            .parse()
            .expect("an address");
        let s = Server {
            child,
            owner,
            addr,
            stderr,
            dir,
            tenant,
            pid,
        };
        // Not ready in time, or its stderr closed first (it exited): either way it failed.
        if !matches!(
            tokio::time::timeout(Duration::from_secs(240), ready_rx).await,
            Ok(Ok(()))
        ) {
            panic!("the server did not start:\n{}", s.stderr());
        }
        s
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = self.stderr();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A Streamable HTTP client (rmcp).
    pub async fn client(&self) -> RunningService<RoleClient, ()> {
        let transport = StreamableHttpClientTransport::from_uri(self.url("/mcp"));
        ().serve(transport).await.expect("the client connects")
    }

    /// `/healthz` answers 200 within `limit`: how long it took.
    pub async fn healthy(&self, limit: Duration) -> Result<Duration, String> {
        let t0 = Instant::now();
        match tokio::time::timeout(limit, reqwest::get(self.url("/healthz"))).await {
            Ok(Ok(r)) if r.status().is_success() => Ok(t0.elapsed()),
            Ok(Ok(r)) => Err(format!("/healthz said {}", r.status())),
            Ok(Err(e)) => Err(format!("/healthz failed: {e}")),
            Err(_) => Err(format!("/healthz did not answer within {limit:?}")),
        }
    }

    /// Resident memory now, bytes (0 once it is gone).
    pub fn rss(&self) -> u64 {
        rss(self.pid)
    }

    /// SIGTERM, then wait at most `limit` for the process to end: how long it took, or
    /// `None` if it was still there.
    pub async fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
        let t0 = Instant::now();
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(_) => Some(t0.elapsed()),
            Err(_) => None,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        common::remove_containers(&common::containers_of(&self.tenant));
        common::remove_containers(&common::containers_owned_by(&self.owner));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Resident memory of `pid`, bytes (0 when it is gone).
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb << 10)
}

/// Samples the RSS of `pid` every 100 ms; the peak since the last [`Peak::reset`].
pub struct Peak {
    peak: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
    pid: u32,
}

impl Peak {
    pub fn start(pid: u32) -> Peak {
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss(pid)));
        let task = tokio::spawn({
            let peak = peak.clone();
            async move {
                loop {
                    peak.fetch_max(rss(pid), std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
        Peak { peak, task, pid }
    }

    pub fn get(&self) -> u64 {
        self.peak
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(rss(self.pid))
    }

    pub fn reset(&self) {
        self.peak
            .store(rss(self.pid), std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Peak {
    fn drop(&mut self) {
        self.task.abort();
    }
}
