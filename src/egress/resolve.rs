//! Where names live. The proxy is the only resolver sandboxed code has: it resolves a
//! name once, checks every address, and connects to a checked one (no second lookup that
//! a DNS rebinding could answer differently). [`Resolve`] is the seam; [`SystemResolver`]
//! asks the system's resolver, except for the names the policy's `[resolve]` table pins
//! (in the manner of curl's `--resolve`: how tests keep every connection on this machine).

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

/// A resolver: the addresses of a name (lower case, no trailing dot).
#[async_trait::async_trait]
pub trait Resolve: Send + Sync + 'static {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>>;
}

/// The system's resolver, with the policy's overrides first.
#[derive(Debug, Clone, Default)]
pub struct SystemResolver {
    overrides: BTreeMap<String, Vec<IpAddr>>,
}

impl SystemResolver {
    /// With `overrides` (a policy's `resolve` table): those names never reach the system
    /// resolver.
    pub fn new(overrides: BTreeMap<String, Vec<IpAddr>>) -> Self {
        SystemResolver { overrides }
    }
}

#[async_trait::async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        if let Some(a) = self.overrides.get(name) {
            return Ok(a.clone());
        }
        let mut out: Vec<IpAddr> = Vec::new();
        for sa in tokio::net::lookup_host((name, 0)).await? {
            if !out.contains(&sa.ip()) {
                out.push(sa.ip());
            }
        }
        if out.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no address for {name}"),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn overrides_answer_before_the_system() {
        let r = SystemResolver::new(BTreeMap::from([(
            "localhost".to_string(),
            vec!["10.9.8.7".parse().unwrap()],
        )]));
        assert_eq!(
            r.resolve("localhost").await.unwrap(),
            vec!["10.9.8.7".parse::<IpAddr>().unwrap()]
        );
        let plain = SystemResolver::default();
        let a = plain.resolve("localhost").await.unwrap();
        assert!(a.iter().all(|a| a.is_loopback()), "{a:?}");
    }
}
