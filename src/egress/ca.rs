//! The interception CA (#41 item 3): made at start, in memory, trusted only by the
//! sandboxes (its certificate goes into their CA bundle), and the leaf certificates it
//! mints for the hosts the proxy intercepts, kept in a bounded cache. Its key never
//! leaves this process. Pure certificate work; the TLS sessions are elsewhere.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

/// The common name of the CA the sandboxes see in an intercepted host's chain.
pub const CA_NAME: &str = "mcp-code-executor egress interception CA";
/// Leaf certificates kept at once; past this, the oldest is dropped (minted again if asked).
pub const LEAF_CACHE: usize = 256;

/// The CA and its cache of leaves.
pub struct Ca {
    cert: Certificate,
    key: KeyPair,
    leaves: Mutex<Leaves>,
}

#[derive(Default)]
struct Leaves {
    by_host: HashMap<String, Arc<CertifiedKey>>,
    order: VecDeque<String>,
}

impl Ca {
    /// A fresh CA (ECDSA P-256), its key in memory only.
    pub fn generate() -> Result<Ca, String> {
        let key = KeyPair::generate().map_err(|e| format!("interception CA key: {e}"))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        params.distinguished_name.push(DnType::CommonName, CA_NAME);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("interception CA certificate: {e}"))?;
        Ok(Ca {
            cert,
            key,
            leaves: Mutex::new(Leaves::default()),
        })
    }

    /// The CA's certificate, PEM: what the sandbox's bundle adds to the system's roots.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// The certificate and key to present for `host` (a name, lower case, or an IP
    /// address): from the cache, or minted now.
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>, String> {
        if let Some(k) = self.lock().by_host.get(host) {
            return Ok(k.clone());
        }
        let minted = Arc::new(self.mint(host)?);
        let mut leaves = self.lock();
        if let Some(k) = leaves.by_host.get(host) {
            return Ok(k.clone());
        }
        while leaves.order.len() >= LEAF_CACHE {
            if let Some(old) = leaves.order.pop_front() {
                leaves.by_host.remove(&old);
            }
        }
        leaves.order.push_back(host.to_string());
        leaves.by_host.insert(host.to_string(), minted.clone());
        Ok(minted)
    }

    /// Leaves in the cache now.
    pub fn cached(&self) -> usize {
        self.lock().by_host.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leaves> {
        self.leaves.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mint(&self, host: &str) -> Result<CertifiedKey, String> {
        let err = |e: rcgen::Error| format!("leaf certificate for `{host}`: {e}");
        let key = KeyPair::generate().map_err(err)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.subject_alt_names = vec![match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.try_into().map_err(err)?),
        }];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.cert, &self.key).map_err(err)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| format!("leaf key for `{host}`: {e}"))?;
        Ok(CertifiedKey::new(
            vec![cert.der().clone(), self.cert_der()],
            signing,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::{ServerName, UnixTime};
    use rustls::RootCertStore;

    fn verifier(ca: &Ca) -> Arc<WebPkiServerVerifier> {
        let mut roots = RootCertStore::empty();
        roots.add(ca.cert_der()).unwrap();
        WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap()
    }

    fn verify(v: &WebPkiServerVerifier, leaf: &CertifiedKey, name: &str) -> bool {
        v.verify_server_cert(
            &leaf.cert[0],
            &leaf.cert[1..],
            &ServerName::try_from(name.to_string()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .is_ok()
    }

    #[test]
    fn leaves_verify_for_their_host_only_and_under_this_ca_only() {
        let ca = Ca::generate().unwrap();
        let other = Ca::generate().unwrap();
        let v = verifier(&ca);
        let leaf = ca.leaf("data.example.test").unwrap();
        assert!(verify(&v, &leaf, "data.example.test"));
        assert!(!verify(&v, &leaf, "other.example.test"));
        assert!(!verify(&verifier(&other), &leaf, "data.example.test"));
        let ip = ca.leaf("127.0.0.1").unwrap();
        assert!(verify(&v, &ip, "127.0.0.1"));
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    }

    #[test]
    fn the_cache_returns_the_same_leaf_and_stays_bounded() {
        let ca = Ca::generate().unwrap();
        let a = ca.leaf("a.test").unwrap();
        assert!(Arc::ptr_eq(&a, &ca.leaf("a.test").unwrap()));
        for i in 0..LEAF_CACHE + 10 {
            ca.leaf(&format!("h{i}.test")).unwrap();
        }
        assert_eq!(ca.cached(), LEAF_CACHE);
        // The oldest went first: a.test is minted again, a new key.
        assert!(!Arc::ptr_eq(&a, &ca.leaf("a.test").unwrap()));
    }
}
