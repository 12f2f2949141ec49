//! Egress (#41) item 3: credentials outside the sandbox. The interception CA of
//! `src/egress/ca.rs`: a leaf it mints, served over real TLS (tokio-rustls on 127.0.0.1),
//! is accepted by Python's strict `ssl` trusting the CA, refused without it. Then the whole
//! path (`src/egress/intercept.rs`): the real binary (`serve --egress FILE`) on real
//! Docker, `requests` and `urllib` in the sandbox with only the variables the server sets,
//! a real HTTPS upstream on 127.0.0.1 that records what it received: the rule's
//! `Authorization` arrives, the code sees the body, the secret is nowhere the code or the
//! client can look; a host without headers is still tunnelled; a method or path outside
//! the rule is a 403 that names it; a missing secret file stops the server at start.

use std::sync::Arc;
use std::time::Duration;

use mcp_code_executor::egress::ca::Ca;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use serde_json::Value;

use crate::codemode::{last_json, TempDir};
use crate::common::{self, TempDirs};
use crate::egress::{egress_python, TlsUpstream};
use crate::process::Server;

/// Presents the CA's leaf for whatever name the client asks for (minted on demand).
#[derive(Debug)]
struct Leaves(Arc<CaHandle>);

struct CaHandle(Ca);

impl std::fmt::Debug for CaHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca")
    }
}

impl ResolvesServerCert for Leaves {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0 .0.leaf(hello.server_name()?).ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_of_the_interception_ca_passes_pythons_strict_verification() {
    let ca = Arc::new(CaHandle(Ca::generate().expect("a CA")));
    let (_g, dir) = TempDirs::one("egress-ca");
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.0.cert_pem()).unwrap();

    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_cert_resolver(Arc::new(Leaves(ca.clone())));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A handshake the client refuses ends here: nothing to answer.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 1024];
                let _ = tls.read(&mut buf).await;
                let _ = tls
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 15\r\n\r\nhello-from-leaf")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });

    let code = format!(
        r#"
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[1])
ctx.verify_flags |= ssl.VERIFY_X509_STRICT
def get(name):
    with socket.create_connection(("127.0.0.1", {port}), timeout=20) as s:
        with ctx.wrap_socket(s, server_hostname=name) as t:
            t.sendall(b"GET / HTTP/1.0\r\nHost: " + name.encode() + b"\r\n\r\n")
            out = b""
            while True:
                b = t.recv(4096)
                if not b:
                    return out
                out += b
print("good:", get("data.example.test").split(b"\r\n\r\n", 1)[1].decode())
# No trust in the CA (the system's roots only): refused.
try:
    with socket.create_connection(("127.0.0.1", {port}), timeout=20) as s:
        ssl.create_default_context().wrap_socket(s, server_hostname="data.example.test")
    print("untrusted: accepted")
except ssl.SSLCertVerificationError as e:
    print("untrusted: refused", e.verify_message)
"#
    );
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(egress_python())
            .args(["-c", &code])
            .arg(&ca_file)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Python client ends within 120 s")
    .expect("the Python client runs");
    server.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("good: hello-from-leaf"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("untrusted: refused"), "{stdout}");
    // The leaf was minted once per name asked, and kept.
    assert_eq!(ca.0.cached(), 1);
}

/// The secret of these tests, in the server's environment only. The code below never
/// holds it whole: it searches for it in two halves.
pub(crate) const MARKER: &str = "egress-inject-marker-5f3a9c";

/// `api.example.test` adds `Authorization` from the server's environment, GET under
/// `/headers` only; `data.example.test` has no headers (tunnelled); both live on the
/// upstream's port at 127.0.0.1, whose test CA the proxy trusts (`upstream_ca`).
pub(crate) fn policy(port: u16, upstream_ca: &std::path::Path, header: &str) -> String {
    format!(
        r#"upstream_ca = "{ca}"

[resolve]
"api.example.test" = "127.0.0.1"
"data.example.test" = "127.0.0.1"

[[rules]]
host = "api.example.test"
ports = [{port}]
methods = ["GET"]
paths = ["/headers"]
headers = {{ Authorization = {header} }}

[[rules]]
host = "data.example.test"
ports = [{port}]

[[rules]]
host = "127.0.0.1"
ports = [{port}]
"#,
        ca = upstream_ca.display()
    )
}

/// What the sandbox does: requests and urllib to the intercepted host with the proxy and
/// CA variables as the runner set them, a refused method and path, the tunnelled host
/// trusting only the upstream's own CA, then a search of everything it can read for the
/// secret (in halves, so that the code itself does not hold it).
const SANDBOX: &str = r#"
import glob, json, os, ssl, urllib.request, requests
res = {'vars': {k: os.environ.get(k) for k in ('SSL_CERT_FILE', 'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'HTTPS_PROXY')}}
api = 'https://api.example.test:%d' % PORT
r = requests.get(api + '/headers?via=requests', headers={'Authorization': 'Bearer from-the-code'}, timeout=30)
res['requests'] = [r.status_code, r.text]
with urllib.request.urlopen(api + '/headers?via=urllib', timeout=30) as f:
    res['urllib'] = [f.status, f.read().decode()]
r = requests.post(api + '/headers', data=b'x', timeout=30)
res['post'] = [r.status_code, r.text]
r = requests.get(api + '/admin', timeout=30)
res['path'] = [r.status_code, r.text]
open('/tmp/upstream-ca.pem', 'w').write(UPSTREAM_CA)
r = requests.get('https://data.example.test:%d/tunnel' % PORT, verify='/tmp/upstream-ca.pem', timeout=30)
res['tunnel'] = [r.status_code, r.text]
try:
    requests.get(api + '/headers?via=upstream-ca-only', verify='/tmp/upstream-ca.pem', timeout=30)
    res['intercepted_with_upstream_ca'] = 'accepted'
except requests.exceptions.SSLError as e:
    res['intercepted_with_upstream_ca'] = 'refused'
with open(os.environ['SSL_CERT_FILE']) as f:
    res['bundle_certs'] = f.read().count('BEGIN CERTIFICATE')
needle = (HALF_A + HALF_B).encode()
found, looked = [], 0
for k, v in os.environ.items():
    if needle in (k + '=' + v).encode():
        found.append('env ' + k)
for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):
    try:
        if needle in open(p, 'rb').read():
            found.append(p)
        looked += 1
    except OSError:
        pass
for top in ('/tmp', os.getcwd(), '/workspace', os.path.dirname(os.environ['SSL_CERT_FILE'])):
    for d, _, files in os.walk(top):
        for n in files:
            p = os.path.join(d, n)
            try:
                if needle in open(p, 'rb').read(64 << 20):
                    found.append(p)
                looked += 1
            except OSError:
                pass
res['found'] = found
res['looked'] = looked
print(json.dumps(res))
"#;

/// `serve --egress FILE` under the suite's runtime, with `var` = `secret` in its
/// environment alone.
async fn start(name: &str, file: &std::path::Path, var: &str, secret: &str) -> Server {
    let runtime = common::runtime();
    let mut args = vec!["--egress", file.to_str().unwrap()];
    if let Some(r) = &runtime {
        args.extend(["--runtime", r.as_str()]);
    }
    Server::start(
        name,
        &args,
        &[
            (
                "RUST_LOG",
                "mcp_code_executor=warn,mcp_code_executor::egress=info",
            ),
            (var, secret),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_injected_header_reaches_the_upstream_and_never_the_sandbox() {
    let up = TlsUpstream::start(&["api.example.test", "data.example.test"]).await;
    let port = up.port;
    let upstream_ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-inject");
    let file = dir.0.join("egress.toml");
    let var = "MCP_TEST_EGRESS_TOKEN";
    std::fs::write(
        &file,
        policy(port, &up.ca, &format!("{{ env = \"{var}\" }}")),
    )
    .unwrap();
    let secret = format!("Bearer {MARKER}");
    let s = start("egress-inject", &file, var, &secret).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    let (a, b) = MARKER.split_at(MARKER.len() / 2);
    let code = format!(
        "PORT = {port}\nUPSTREAM_CA = {upstream_ca:?}\nHALF_A = {a:?}\nHALF_B = {b:?}\n{SANDBOX}"
    );
    assert!(!code.contains(MARKER));
    let r = crate::codemode::call(
        &peer,
        "execute_code",
        serde_json::json!({"code": code, "timeout": 120}),
    )
    .await;
    let whole = serde_json::to_string(&r).unwrap();
    let rep = r.structured_content.clone().expect("a structured report");
    let (out, err) = (
        rep["stdout"].as_str().unwrap_or_default(),
        rep["stderr"].as_str().unwrap_or_default(),
    );
    let v: Value = last_json(out, err);
    let seen = std::fs::read_to_string(up.ca.with_file_name("seen.jsonl")).unwrap_or_default();
    let ctx = format!("{v}\nupstream saw:\n{seen}\nserver:\n{}", s.log_tail(40));

    // The code's clients used the bundle the runner wrote: the system's CAs and ours.
    let bundle = v["vars"]["SSL_CERT_FILE"].as_str().unwrap_or_default();
    assert!(bundle.ends_with(".pem"), "{ctx}");
    assert_eq!(v["vars"]["REQUESTS_CA_BUNDLE"], bundle, "{ctx}");
    assert_eq!(v["vars"]["CURL_CA_BUNDLE"], bundle, "{ctx}");
    assert!(v["bundle_certs"].as_u64().unwrap_or(0) > 1, "{ctx}");
    // The code saw the bodies.
    let body = format!("host=api.example.test:{port} sni=api.example.test");
    assert_eq!(v["requests"], serde_json::json!([200, body]), "{ctx}");
    assert_eq!(v["urllib"], serde_json::json!([200, body]), "{ctx}");
    // The upstream received the rule's header, the code's own replaced, over the proxy's
    // own TLS (its SNI).
    let lines: Vec<Value> = seen
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for via in ["requests", "urllib"] {
        let l = lines
            .iter()
            .find(|l| l["path"] == format!("/headers?via={via}"))
            .unwrap_or_else(|| panic!("the upstream saw no request of {via}: {ctx}"));
        assert_eq!(l["auth"], serde_json::json!([secret]), "{ctx}");
        assert_eq!(l["sni"], "api.example.test", "{ctx}");
    }
    // A method and a path outside the rule: 403, naming them and the rule, never upstream.
    assert_eq!(v["post"][0], 403, "{ctx}");
    let post = v["post"][1].as_str().unwrap_or_default();
    assert!(
        post.contains("POST /headers") && post.contains("`api.example.test`"),
        "{ctx}"
    );
    assert_eq!(v["path"][0], 403, "{ctx}");
    assert!(
        v["path"][1]
            .as_str()
            .unwrap_or_default()
            .contains("GET /admin"),
        "{ctx}"
    );
    assert!(!seen.contains("/admin"), "{ctx}");
    // A host without headers is tunnelled: the code's own TLS, verified against the
    // upstream's CA alone, and no header added.
    assert_eq!(
        v["tunnel"],
        serde_json::json!([
            200,
            format!("host=data.example.test:{port} sni=data.example.test")
        ]),
        "{ctx}"
    );
    let tunnel = lines
        .iter()
        .find(|l| l["path"] == "/tunnel")
        .expect("tunnel seen");
    assert_eq!(tunnel["auth"], Value::Null, "{ctx}");
    // The intercepted host presents our CA's leaf, which the upstream's CA does not sign.
    assert_eq!(v["intercepted_with_upstream_ca"], "refused", "{ctx}");
    assert!(
        !seen.contains("upstream-ca-only"),
        "the request went on after a refused handshake: {ctx}"
    );
    // The secret is nowhere the code looked, nor anywhere in what the client received.
    assert_eq!(v["found"], serde_json::json!([]), "{ctx}");
    assert!(v["looked"].as_u64().unwrap_or(0) > 3, "{ctx}");
    assert!(!whole.contains(MARKER), "the MCP result holds the secret");
    assert!(
        !s.stderr().contains(MARKER),
        "the server's log holds the secret"
    );
}

/// The same through the official Python SDK (`tests/sdk/egress_inject.py`), in its default
/// mode (2026-07-28) and its legacy mode: execute_code and an execute_python session's
/// cells reach the intercepted host with nothing in the code about the proxy or its CA;
/// the upstream received the rule's header on every request; no result the SDK returned
/// (printed whole by the script) holds the secret, nor does the server's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_gets_an_injected_header_in_both_modes() {
    let up = TlsUpstream::start(&["api.example.test", "data.example.test"]).await;
    let dir = TempDir::new("egress-inject-sdk");
    let file = dir.0.join("egress.toml");
    let var = "MCP_TEST_EGRESS_TOKEN";
    std::fs::write(
        &file,
        policy(up.port, &up.ca, &format!("{{ env = \"{var}\" }}")),
    )
    .unwrap();
    let secret = format!("Bearer {MARKER}");
    let s = start("egress-inject-sdk", &file, var, &secret).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let port = up.port.to_string();
    let out = crate::codemode::sdk_script(&s, "egress_inject.py", &[port.as_ref()]).await;
    let seen = std::fs::read_to_string(up.ca.with_file_name("seen.jsonl")).unwrap_or_default();
    let ctx = format!("{out}\nupstream saw:\n{seen}");
    assert!(out.contains("ok: auto 2026-07-28"), "{ctx}");
    assert!(out.contains("ok: legacy 2025-11-25"), "{ctx}");
    assert!(
        out.lines().filter(|l| l.starts_with("result: ")).count() >= 10,
        "{ctx}"
    );
    let lines: Vec<Value> = seen
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for mode in ["auto", "legacy"] {
        for via in ["", "-cell2", "-cell3"] {
            let path = format!("/headers?via=sdk-{mode}{via}");
            let l = lines
                .iter()
                .find(|l| l["path"] == path)
                .unwrap_or_else(|| panic!("the upstream saw no {path}: {ctx}"));
            assert_eq!(l["auth"], serde_json::json!([secret]), "{ctx}");
            assert_eq!(l["sni"], "api.example.test", "{ctx}");
        }
    }
    assert!(
        !out.contains(MARKER),
        "an SDK result holds the secret: {ctx}"
    );
    assert!(
        !s.stderr().contains(MARKER),
        "the server's log holds the secret"
    );
}

#[tokio::test]
async fn a_missing_secret_file_stops_the_server_at_start() {
    let dir = TempDir::new("egress-inject-missing");
    let missing = dir.0.join("no-such-token");
    let file = dir.0.join("egress.toml");
    let ca = dir.0.join("ca.pem");
    std::fs::write(&ca, Ca::generate().unwrap().cert_pem()).unwrap();
    std::fs::write(
        &file,
        policy(443, &ca, &format!("{{ file = \"{}\" }}", missing.display())),
    )
    .unwrap();
    let bin = std::env::var("MCE_TEST_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_mcp-code-executor").to_string());
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(bin)
            .args(["serve", "--port", "0", "--egress", file.to_str().unwrap()])
            .env("MCP_EXECUTOR_DATA_DIR", dir.0.join("data"))
            .env("CODE_STORAGE_DIR", dir.0.join("code"))
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the server gives up within 120 s")
    .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("api.example.test") && stderr.contains(&*missing.to_string_lossy()),
        "{stderr}"
    );
}
