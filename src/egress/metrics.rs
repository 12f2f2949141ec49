//! The egress proxy's counters: connections by tenant, rule and outcome, bytes by tenant
//! and direction. Kept here, where connections end; the metrics endpoint
//! (`app::metrics`) renders them.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Egress (#41): connections through the egress proxy by tenant, host and outcome, and
/// their bytes by tenant and direction. The host label is the policy rule that allowed
/// the connection, as the operator wrote it (`-` when none did): bounded by the policy,
/// whatever names sandboxed code asks for. Process-wide, rendered with every
/// `app::metrics::Metrics::render` (which knows the text format).
#[derive(Debug, Default)]
pub struct Egress {
    c: Mutex<EgressCounters>,
}

#[derive(Debug, Default, Clone)]
pub struct EgressCounters {
    pub connections: BTreeMap<(String, String, &'static str), u64>,
    pub bytes: BTreeMap<(String, &'static str), u64>,
    /// Connections handed to the proxy by tenant and channel (`socket`, `relay`).
    pub streams: BTreeMap<(String, &'static str), u64>,
}

/// The process's [`Egress`] counters.
pub fn egress() -> &'static Egress {
    static EGRESS: std::sync::OnceLock<Egress> = std::sync::OnceLock::new();
    EGRESS.get_or_init(Egress::default)
}

impl Egress {
    /// A connection of `tenant`'s code, allowed by the rule `host` (`-`: refused before a
    /// rule allowed it), ended with `outcome` (`ok`, `error`, `limit`, `idle_timeout`,
    /// `not_tls`, `sni_mismatch`, `cancelled`, `not_in_policy`, `private_address`, `bad_request`,
    /// `upstream_failed`, `connect_timeout`) after `up` bytes sent and `down` received.
    pub fn connection(&self, tenant: &str, host: &str, outcome: &'static str, up: u64, down: u64) {
        let mut c = self.c.lock().unwrap_or_else(|e| e.into_inner());
        *c.connections
            .entry((tenant.into(), host.into(), outcome))
            .or_default() += 1;
        *c.bytes.entry((tenant.into(), "up")).or_default() += up;
        *c.bytes.entry((tenant.into(), "down")).or_default() += down;
    }

    /// A connection of `tenant`'s code reached the proxy by `channel` (`socket`: the
    /// sandbox's own Unix socket; `relay`: the runner's stdin/stdout).
    pub fn stream(&self, tenant: &str, channel: &'static str) {
        let mut c = self.c.lock().unwrap_or_else(|e| e.into_inner());
        *c.streams.entry((tenant.into(), channel)).or_default() += 1;
    }

    /// A copy of the counters, for rendering.
    pub fn counters(&self) -> EgressCounters {
        self.c.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
