//! The two TLS ends of interception (#41 item 3, [`super::intercept`]): the CA whose
//! leaves the code meets (one per host, [`super::ca`]) and the verified client the proxy
//! opens upstream with. Owned by the proxy; no HTTP here.

use std::sync::{Arc, OnceLock};

use rustls::pki_types::CertificateDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::ca::Ca;

/// The CA of one proxy and its upstream TLS client configuration (built when first
/// needed: it reads the system's roots).
pub struct Interceptor {
    ca: Ca,
    extra_roots: Vec<CertificateDer<'static>>,
    client: OnceLock<Arc<ClientConfig>>,
}

impl Interceptor {
    /// A fresh CA; `extra_roots` trusted upstream besides the system's (`upstream_ca`).
    pub fn new(extra_roots: Vec<CertificateDer<'static>>) -> Interceptor {
        // Generating a P-256 key and self-signing fails only if the system's random source
        // does, and then nothing else in this process would work either.
        let ca = Ca::generate().expect("the egress interception CA");
        Interceptor {
            ca,
            extra_roots,
            client: OnceLock::new(),
        }
    }

    /// The CA's certificate (PEM): public, for the sandboxes' bundle.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// Leaves minted and kept (tests).
    #[cfg(test)]
    pub(super) fn leaves(&self) -> usize {
        self.ca.cached()
    }

    /// The TLS server the code meets for `host`: the host's leaf, HTTP/1.1 only.
    pub(super) fn acceptor(&self, host: &str) -> Result<TlsAcceptor, String> {
        let leaf = self.ca.leaf(host)?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Fixed(leaf)));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    /// The TLS client the proxy opens upstream with: full verification against the
    /// system's roots and the policy's `upstream_ca`.
    pub(super) fn connector(&self) -> TlsConnector {
        let config = self.client.get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let native = rustls_native_certs::load_native_certs();
            if !native.errors.is_empty() {
                tracing::warn!(errors = ?native.errors, "egress: some system CA certificates could not be read");
            }
            roots.add_parsable_certificates(native.certs);
            roots.add_parsable_certificates(self.extra_roots.iter().cloned());
            let mut config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Arc::new(config)
        });
        TlsConnector::from(config.clone())
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Presents one leaf whatever the ClientHello asks (a client that asks for another name
/// fails its own verification).
#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}
