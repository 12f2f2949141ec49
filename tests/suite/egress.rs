//! Egress by policy (#41), stage 1: the proxy of `src/egress/` between real Python clients
//! (`requests`, `urllib`, `httpx`, through `HTTPS_PROXY` as the sandbox will set it) and a
//! real HTTPS server on 127.0.0.1 (Python's `http.server` in `ssl`, with a CA this test
//! makes). Names live where the policy's `[resolve]` says: nothing leaves this machine.
//! The proxy is served here on a loopback listener, one run scope per listener (the
//! sandbox's channel will feed the same `Proxy::serve`). Limits: `egress_limits.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mcp_code_executor::egress::resolve::Resolve;
use mcp_code_executor::egress::{Policy, Proxy, RunScope};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::common::TempDirs;

/// The Python with `requests`, `httpx` and `cryptography`: `MCP_EGRESS_PYTHON`, else
/// `target/egress-py`. Missing, the test fails and says how to make it.
pub fn egress_python() -> PathBuf {
    let p = std::env::var_os("MCP_EGRESS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/egress-py/bin/python")
        });
    let ok = std::process::Command::new(&p)
        .args(["-c", "import requests, httpx, cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the egress tests need a Python with requests, httpx and cryptography at {}: run \
         scripts/test.sh, or `python3 -m venv target/egress-py && target/egress-py/bin/pip \
         install requests==2.32.3 httpx==0.28.1 cryptography==44.0.0`",
        p.display()
    );
    p
}

/// An HTTPS server on 127.0.0.1: a CA made for it (`ca`), a certificate for `names`
/// and 127.0.0.1. `GET /x.csv` is a small CSV, `GET /big?n=N` N bytes, anything else says
/// the Host header and the SNI the server saw, `GET /redirect?to=URL` redirects there.
/// Each request's path, SNI and `Authorization` header are appended to `seen.jsonl` beside
/// `ca` (never echoed to the client). Killed when dropped.
pub struct TlsUpstream {
    pub port: u16,
    pub ca: PathBuf,
    _child: tokio::process::Child,
    _dir: TempDirs,
}

const TLS_SERVER: &str = include_str!("../egress/tls_server.py");

impl TlsUpstream {
    pub async fn start(names: &[&str]) -> TlsUpstream {
        let py = egress_python();
        let (guard, dir) = TempDirs::one("egress-tls");
        let mut child = tokio::process::Command::new(py)
            .args(["-c", TLS_SERVER])
            .arg(&dir)
            .arg(names.join(","))
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the TLS server starts");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(30), out.read_line(&mut line))
            .await
            .expect("the TLS server says its port within 30 s")
            .unwrap();
        let port = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("a port, got {line:?}"));
        TlsUpstream {
            port,
            ca: dir.join("ca.pem"),
            _child: child,
            _dir: guard,
        }
    }
}

/// The proxy served on a loopback listener; every connection is one run's (`scope`).
/// Stopped when dropped.
pub struct ProxyServer {
    pub addr: SocketAddr,
    pub scope: Arc<RunScope>,
    task: tokio::task::JoinHandle<()>,
}

impl ProxyServer {
    pub async fn start(proxy: Arc<Proxy>, tenant: &str) -> ProxyServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let scope = proxy.run_scope(tenant, &format!("run-{}", uuid::Uuid::new_v4().simple()));
        let s = scope.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(proxy.clone().serve(stream, s.clone()));
            }
        });
        ProxyServer { addr, scope, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for ProxyServer {
    fn drop(&mut self) {
        self.task.abort();
        self.scope.close();
    }
}

pub fn policy(text: &str) -> Policy {
    Policy::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// Run `code` with the egress Python, the proxy in the standard variables (both cases)
/// and the test CA trusted; (success, stdout, stderr), within 120 s.
pub async fn python(code: &str, proxy: &str, ca: &Path) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(egress_python());
    cmd.args(["-c", code]).kill_on_drop(true);
    for k in ["NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"] {
        cmd.env_remove(k);
    }
    for k in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        cmd.env(k, proxy);
    }
    cmd.env("REQUESTS_CA_BUNDLE", ca).env("SSL_CERT_FILE", ca);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the Python client ends within 120 s")
        .expect("the Python client runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A raw `CONNECT target` to the proxy: the status, the head and body of its answer, and
/// the stream (a tunnel when the status is 200).
pub async fn connect(proxy: SocketAddr, target: &str) -> (u16, String, TcpStream) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, text) = read_answer(&mut s).await;
    (status, text, s)
}

/// One HTTP/1.1 answer (head, and the body when it has a Content-Length), at most 10 s.
pub async fn read_answer(s: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while !buf.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).await.unwrap_or(0) == 0 {
                break;
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let len = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        let _ = s.read_exact(&mut body).await;
        head + &String::from_utf8_lossy(&body)
    };
    let text = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the proxy answers within 10 s");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

/// The allowing policy of these tests: `data.example.test` lives on 127.0.0.1 (the
/// `[resolve]` override) and a rule names that address for the server's port.
fn allowing(port: u16) -> String {
    format!(
        r#"
        [resolve]
        "data.example.test" = "127.0.0.1"
        "loop.example.test" = "127.0.0.1"
        "ten.example.test" = "10.0.0.1"
        "meta.example.test" = "169.254.169.254"
        "mapped.example.test" = "::ffff:127.0.0.1"

        [[rules]]
        host = "data.example.test"
        ports = [{port}]

        [[rules]]
        host = "*.example.test"
        ports = [{port}, 80]

        [[rules]]
        host = "127.0.0.1"
        ports = [{port}]
        tenants = ["alice"]
    "#
    )
}

#[tokio::test]
async fn requests_urllib_and_httpx_reach_an_allowed_https_host_through_the_proxy() {
    let up = TlsUpstream::start(&["data.example.test", "localhost"]).await;
    let proxy = ProxyServer::start(Proxy::new(policy(&allowing(up.port))), "alice").await;
    let url = format!("https://data.example.test:{}", up.port);
    let port = up.port;
    let code = format!(
        r#"
import requests, urllib.request, httpx
print("requests", requests.get("{url}/x.csv", timeout=20).text.splitlines()[1])
print("urllib", urllib.request.urlopen("{url}/x.csv", timeout=20).read().decode().splitlines()[2])
print("httpx", httpx.get("{url}/x.csv", timeout=20).text.splitlines()[0])
print("seen", requests.get("{url}/who", timeout=20).text)
# A redirect from the allowed host to one not in the policy: the next hop is refused.
try:
    requests.get("{url}/redirect?to=https://other.test:{port}/x.csv", timeout=20)
    print("redirect REACHED")
except requests.exceptions.ProxyError as e:
    print("redirect refused:", e)
"#
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("requests 1,2"), "{out}");
    assert!(out.contains("urllib 3,4"), "{out}");
    assert!(out.contains("httpx a,b"), "{out}");
    // The client's own TLS reached the server: its SNI and Host, the test CA's certificate
    // verified by the client (a tunnel, not intercepted).
    assert!(
        out.contains(&format!(
            "seen host=data.example.test:{} sni=data.example.test",
            up.port
        )),
        "{out}"
    );
    assert!(
        out.contains("redirect refused:")
            && out.contains(&format!("other.test:{port} not in the policy")),
        "{out}"
    );
    let (sent, received) = proxy.scope.spent();
    assert!(sent > 0 && received > 0, "{sent} {received}");
    let metrics = mcp_code_executor::app::metrics::Metrics::default().render(&Default::default());
    assert!(
        metrics.contains(
            "mcp_executor_egress_connections_total{tenant=\"alice\",host=\"data.example.test\",outcome=\"ok\"}"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn refusals_reach_the_code_with_host_port_reason_and_the_rule_to_add() {
    let up = TlsUpstream::start(&["data.example.test", "localhost"]).await;
    let p = up.port;
    // bob: the address rule for 127.0.0.1 is alice's alone.
    let proxy = ProxyServer::start(Proxy::new(policy(&allowing(p))), "bob").await;
    let code = format!(
        r#"
import requests
for host, port in [("data.example.test", {p}), ("other.test", {p}), ("data.example.test", {p} + 1),
                   ("loop.example.test", {p}), ("ten.example.test", {p}),
                   ("meta.example.test", {p}), ("mapped.example.test", {p}),
                   ("127.0.0.1", {p}), ("93.184.216.34", 443)]:
    try:
        requests.get("https://%s:%d/" % (host, port), timeout=20)
        print(host, port, "REACHED")
    except requests.exceptions.ProxyError as e:
        print(host, port, "refused:", e)
"#
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(!out.contains("REACHED"), "{out}");
    let line = |prefix: &str| {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line for {prefix} in {out}"))
            .to_string()
    };
    for (prefix, want) in [
        // The name rule allows it, but it lives on loopback: only alice's rule names 127.0.0.1.
        (
            format!("data.example.test {p} "),
            format!("403 Forbidden (egress: data.example.test:{p} loopback address (127.0.0.1))"),
        ),
        (
            format!("other.test {p} "),
            format!("other.test:{p} not in the policy"),
        ),
        (
            format!("data.example.test {} ", p + 1),
            format!("data.example.test:{} not in the policy", p + 1),
        ),
        (
            format!("loop.example.test {p} "),
            "loopback address (127.0.0.1)".into(),
        ),
        (
            format!("ten.example.test {p} "),
            "private address (10.0.0.1)".into(),
        ),
        (
            format!("meta.example.test {p} "),
            "link-local address".into(),
        ),
        (
            format!("mapped.example.test {p} "),
            "loopback address (::ffff:127.0.0.1)".into(),
        ),
        (
            format!("127.0.0.1 {p} "),
            format!("127.0.0.1:{p} not in the policy"),
        ),
        (
            "93.184.216.34 443 ".into(),
            "93.184.216.34:443 not in the policy".into(),
        ),
    ] {
        let l = line(&prefix);
        assert!(l.contains(&want), "want `{want}` in: {l}");
    }
    // The body says how the operator allows it (read by a raw client).
    let (status, text, _) = connect(proxy.addr, &format!("loop.example.test:{p}")).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("x-egress-refused: private_address"), "{text}");
    assert!(
        text.contains(&format!("[[rules]]\nhost = \"127.0.0.1\"\nports = [{p}]")),
        "{text}"
    );
    let (status, text, _) = connect(proxy.addr, &format!("other.test:{p}")).await;
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains(&format!("host = \"other.test\"\nports = [{p}]")),
        "{text}"
    );
    // Nothing was connected upstream for bob.
    assert_eq!(proxy.scope.spent(), (0, 0));
}

#[tokio::test]
async fn a_second_tenant_does_not_get_the_first_tenants_rules() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let p = up.port;
    let text = format!(
        "[resolve]\n\"data.example.test\" = \"127.0.0.1\"\n\
         [[rules]]\nhost = \"data.example.test\"\nports = [{p}]\ntenants = [\"alice\"]\n\
         [[rules]]\nhost = \"127.0.0.1\"\nports = [{p}]\ntenants = [\"alice\"]\n"
    );
    let proxy = Proxy::new(policy(&text));
    let alice = ProxyServer::start(proxy.clone(), "alice").await;
    let bob = ProxyServer::start(proxy, "bob").await;
    let code = format!(
        "import requests\nprint(requests.get('https://data.example.test:{p}/x.csv', timeout=20).status_code)"
    );
    let (ok, out, err) = python(&code, &alice.url(), &up.ca).await;
    assert!(ok && out.trim() == "200", "{out}{err}");
    let (ok, _, err) = python(&code, &bob.url(), &up.ca).await;
    assert!(
        !ok && err.contains(&format!("data.example.test:{p} not in the policy")),
        "{err}"
    );
}

/// Answers the first lookup with `first` and every later one with `then`, counting them.
struct Rebinding {
    first: std::net::IpAddr,
    then: std::net::IpAddr,
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl Resolve for Rebinding {
    async fn resolve(&self, _name: &str) -> std::io::Result<Vec<std::net::IpAddr>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(vec![if n == 0 { self.first } else { self.then }])
    }
}

/// A plain HTTP server that answers every request with `body`, counting connections.
pub async fn http_server(
    addr: SocketAddr,
    body: &'static str,
) -> (u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    http_server_on(l, body)
}

/// [`http_server`] on a listener already bound.
fn http_server_on(
    l: TcpListener,
    body: &'static str,
) -> (u16, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let port = l.local_addr().unwrap().port();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                    }
                }
                let _ = s
                    .write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).as_bytes())
                    .await;
            });
        }
    });
    (port, n, task)
}

#[tokio::test]
async fn a_name_that_resolves_differently_after_the_check_reaches_only_the_checked_address() {
    // The allowed server on 127.0.0.2, a "secret" one on 127.0.0.1, same port: a port
    // free on both (another test's connection may hold the one first picked).
    let mut both = None;
    for _ in 0..50 {
        let one = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = one.local_addr().unwrap().port();
        if let Ok(two) = TcpListener::bind(SocketAddr::from(([127, 0, 0, 2], port))).await {
            both = Some((one, two));
            break;
        }
    }
    let (one, two) = both.expect("a port free on 127.0.0.1 and 127.0.0.2");
    let (port, secret_conns, secret) = http_server_on(one, "secret");
    let (_, good_conns, good) = http_server_on(two, "good");
    let text = format!(
        "[[rules]]\nhost = \"rebind.example.test\"\nports = [{port}]\n\
         [[rules]]\nhost = \"127.0.0.2\"\nports = [{port}]\n"
    );
    let resolver = Arc::new(Rebinding {
        first: "127.0.0.2".parse().unwrap(),
        then: "127.0.0.1".parse().unwrap(),
        calls: AtomicUsize::new(0),
    });
    let proxy =
        ProxyServer::start(Proxy::with_resolver(policy(&text), resolver.clone()), "t").await;
    let get = |proxy: SocketAddr| async move {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        s.write_all(
            format!("GET http://rebind.example.test:{port}/ HTTP/1.1\r\nHost: rebind.example.test:{port}\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        read_answer(&mut s).await
    };
    let (status, text) = get(proxy.addr).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.ends_with("good"), "{text}");
    // One lookup for that connection: the address checked is the address connected to.
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 1);
    // The next connection's lookup says 127.0.0.1: refused, never connected.
    let (status, text) = get(proxy.addr).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("loopback address (127.0.0.1)"), "{text}");
    assert_eq!(resolver.calls.load(Ordering::SeqCst), 2);
    assert_eq!(secret_conns.load(Ordering::SeqCst), 0);
    assert_eq!(good_conns.load(Ordering::SeqCst), 1);
    secret.abort();
    good.abort();
}

#[tokio::test]
async fn plain_http_is_forwarded_with_methods_and_paths_checked() {
    let (port, conns, server) = http_server("127.0.0.1:0".parse().unwrap(), "plain").await;
    let text = format!(
        "[resolve]\n\"api.example.test\" = \"127.0.0.1\"\n\
         [[rules]]\nhost = \"api.example.test\"\nports = [{port}]\nmethods = [\"GET\"]\npaths = [\"/v1/\"]\n\
         [[rules]]\nhost = \"127.0.0.1\"\nports = [{port}]\n"
    );
    let proxy = ProxyServer::start(Proxy::new(policy(&text)), "t").await;
    let up = TlsUpstream::start(&["unused.test"]).await;
    let code = format!(
        r#"
import requests, urllib.request, urllib.error
print("get", requests.get("http://api.example.test:{port}/v1/items", timeout=20).text)
r = requests.post("http://api.example.test:{port}/v1/items", data=b"x", timeout=20)
print("post", r.status_code, r.headers.get("x-egress-refused"))
try:
    urllib.request.urlopen("http://api.example.test:{port}/v2/", timeout=20)
except urllib.error.HTTPError as e:
    print("v2", e.code, e.read().decode().splitlines()[0])
"#
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("get plain"), "{out}");
    assert!(out.contains("post 403 not_in_policy"), "{out}");
    assert!(
        out.contains(&format!(
            "v2 403 mcp-code-executor egress refused api.example.test:{port}: not in the policy."
        )),
        "{out}"
    );
    // A path that starts with the prefix but does not stay under it.
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    s.write_all(
        format!("GET http://api.example.test:{port}/v1/../admin HTTP/1.1\r\nHost: x\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (status, text) = read_answer(&mut s).await;
    assert_eq!(status, 403, "{text}");
    // A tunnel to a host whose rule limits methods or paths is refused: it could not be checked.
    let (status, text, _) = connect(proxy.addr, &format!("api.example.test:{port}")).await;
    assert_eq!(status, 403, "{text}");
    assert!(
        text.contains("which a CONNECT tunnel cannot check"),
        "{text}"
    );
    assert_eq!(conns.load(Ordering::SeqCst), 1);
    server.abort();
}

#[tokio::test]
async fn a_tunnel_must_carry_tls() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let g = g.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 256];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    g.lock().await.extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    let text = format!("[[rules]]\nhost = \"127.0.0.1\"\nports = [{port}]\n");
    let proxy = ProxyServer::start(Proxy::new(policy(&text)), "t").await;
    let (status, head, mut s) = connect(proxy.addr, &format!("127.0.0.1:{port}")).await;
    assert_eq!(status, 200, "{head}");
    s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
        .await
        .expect("the proxy closes a tunnel that is not TLS")
        .unwrap_or(0);
    assert_eq!(n, 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(got.lock().await.is_empty(), "the upstream got bytes");
    server.abort();
}

#[tokio::test]
async fn serve_refuses_to_start_with_a_bad_policy_and_the_example_parses() {
    let (_g, dir) = TempDirs::one("egress-bad");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[rules]]\nhost = \"*.com\"\n").unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
            .args(["serve", "--stdio", "--egress"])
            .arg(&bad)
            .env("MCP_EXECUTOR_DATA_DIR", &dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("serve stops within 60 s")
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bad.toml") && err.contains("rules[0]: host `*.com`"),
        "{err}"
    );
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/egress.example.toml");
    let p = Policy::load(&example).unwrap();
    assert!(!p.rules.is_empty());
    let first = std::fs::read_to_string(&example).unwrap();
    assert!(first.starts_with("# mcp-code-executor serve --egress deploy/egress.example.toml"));
}

#[tokio::test]
async fn a_tunnel_whose_client_hello_names_another_server_is_cut() {
    let up = TlsUpstream::start(&["data.example.test", "fronted.example.test"]).await;
    let p = up.port;
    let proxy = ProxyServer::start(Proxy::new(policy(&allowing(p))), "alice").await;
    let addr = proxy.addr;
    // A real TLS client over a CONNECT to data.example.test, asking for each server name.
    let code = format!(
        r#"
import socket, ssl
for sni in ["data.example.test", "fronted.example.test"]:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=20)
    s.sendall(b"CONNECT data.example.test:{p} HTTP/1.1\r\nHost: data.example.test:{p}\r\n\r\n")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += s.recv(1)
    ctx = ssl.create_default_context(cafile="{ca}")
    try:
        t = ctx.wrap_socket(s, server_hostname=sni)
        t.sendall(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while not data.endswith(b"sni=" + sni.encode()):
            chunk = t.recv(4096)
            if not chunk:
                break
            data += chunk
        print(sni, head.split()[1].decode(), "answered", data.split(b"\r\n\r\n")[-1].decode())
    except (ssl.SSLError, OSError) as e:
        print(sni, head.split()[1].decode(), "cut", type(e).__name__)
"#,
        port = addr.port(),
        ca = up.ca.display()
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("data.example.test 200 answered host=x sni=data.example.test"),
        "{out}"
    );
    assert!(out.contains("fronted.example.test 200 cut"), "{out}");
}

/// A log sink for one test's thread.
#[derive(Clone, Default)]
struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn each_connection_is_one_log_record_without_payloads_or_header_values() {
    // The proxy's tasks run on this test's one thread (current-thread runtime): a default
    // subscriber for the thread sees their records. A second dispatcher, kept alive and
    // never used, makes tracing ask every registered one when a callsite is first seen:
    // with one scoped dispatcher alone, a callsite first hit on another test's thread
    // would be cached as disabled for all threads.
    let _second = tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::sink)
            .finish(),
    );
    let sink = Sink::default();
    let s = sink.clone();
    let _guard = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(move || s.clone())
            .finish(),
    );
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let p = up.port;
    let proxy = ProxyServer::start(Proxy::new(policy(&allowing(p))), "alice").await;
    let code = format!(
        r#"
import requests
h = {{"X-Api-Key": "MARKER-HEADER-VALUE"}}
print(requests.get("https://data.example.test:{p}/x.csv?q=MARKER-QUERY", headers=h, timeout=20).status_code)
try:
    requests.get("https://nowhere.test:{p}/MARKER-PATH", headers=h, timeout=20)
except requests.exceptions.ProxyError:
    print("refused")
"#
    );
    let (ok, out, err) = python(&code, &proxy.url(), &up.ca).await;
    assert!(
        ok && out.contains("200") && out.contains("refused"),
        "{out}\n{err}"
    );
    // The tunnel's record is written when the tunnel closes, just after the client's end.
    let mut log = String::new();
    for _ in 0..100 {
        log = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
        if log.contains("egress connection") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = proxy.scope.run_id().to_string();
    let ok_line = log
        .lines()
        .find(|l| l.contains("egress connection"))
        .unwrap_or_else(|| panic!("no connection record in:\n{log}"));
    for field in [
        "tenant=alice".to_string(),
        format!("run={run}"),
        "host=data.example.test".into(),
        format!("port={p}"),
        "kind=\"connect\"".into(),
        "outcome=\"ok\"".into(),
        "bytes_up=".into(),
        "bytes_down=".into(),
        "duration_ms=".into(),
    ] {
        assert!(ok_line.contains(&field), "`{field}` not in {ok_line}");
    }
    // Refusal lines are rate-limited process-wide (other tests refuse too): ask again, a
    // second apart, until this run's appears.
    let refusal = |log: &str| {
        log.lines()
            .find(|l| l.contains("egress refused") && l.contains(&run))
            .map(str::to_string)
    };
    for _ in 0..5 {
        if refusal(&String::from_utf8_lossy(&sink.0.lock().unwrap())).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        connect(proxy.addr, &format!("nowhere.test:{p}")).await;
    }
    let log = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    let refused = refusal(&log).unwrap_or_else(|| panic!("no refusal record in:\n{log}"));
    assert!(
        refused.contains("host=nowhere.test") && refused.contains("outcome=\"not_in_policy\""),
        "{refused}"
    );
    assert!(!log.contains("MARKER"), "{log}");
}
