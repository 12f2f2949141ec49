//! Egress (#41) item 3, the part that is built: the interception CA of `src/egress/ca.rs`.
//! A leaf it mints, served over real TLS (tokio-rustls on 127.0.0.1), is accepted by the
//! client the sandbox runs (Python's `ssl`, with `VERIFY_X509_STRICT` as Python 3.13 sets
//! by default) trusting the CA's certificate, and is refused without it (that a leaf verifies for its
//! own host only is a unit test of `ca.rs`). The
//! interception itself (requests forwarded with the rule's headers) is not built yet
//! (docs/egress.md, `headers`).

use std::sync::Arc;
use std::time::Duration;

use mcp_code_executor::egress::ca::Ca;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::common::TempDirs;
use crate::egress::egress_python;

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
