//! Egress by policy (#41): the only way sandboxed code may reach a network, through this
//! server, to the hosts and ports the operator allows. Default deny; no policy (no
//! `--egress`) is the sandbox as before, with no network at all.
//!
//! One concern per file, pure decisions apart from the sockets:
//! - [`policy`]: the operator's file (`serve --egress FILE`, TOML: rules, limits, the
//!   `[resolve]` override) and the two decisions, on the host and port asked for, and on
//!   each address a name resolved to.
//! - [`address`]: the classes of addresses refused whatever a name resolves to (loopback,
//!   private, link-local, CGNAT, multicast, unspecified, and the IPv6 forms of IPv4 ones).
//! - [`resolve`]: where names live: the system's resolver behind the [`resolve::Resolve`]
//!   seam, after the policy's overrides.
//! - [`limits`]: a run's connections in flight and bytes each way, a tenant's connections
//!   per second, the idle timeout, and the metered upstream socket that enforces them.
//! - [`proxy`]: the HTTP proxy over any byte stream: `CONNECT` tunnels and plain HTTP in
//!   absolute form.
//! - [`tls`]: the first record of a tunnel: a ClientHello, whose server name (if any) is
//!   the host the tunnel was opened to.
//! - [`refusal`]: what a refused connection tells the code; [`record`]: the log line and
//!   the metrics of each connection, counted in [`metrics`] (rendered by `app::metrics`).
//!
//! - [`inject`]: the headers a rule adds (`headers`, values read by the server, never
//!   shown); [`ca`]: the interception CA, made at start, and the leaves it mints per host;
//!   [`intercept`]: a rule with headers: the code's TLS terminated with such a leaf, each
//!   request checked, its headers set, forwarded over verified TLS upstream; [`tls_ends`]:
//!   the two TLS ends it uses (the leaves' server side, the verified client upstream).
//! - [`sandbox`]: the proxy installed for the sandboxes: each run's scope, serving the
//!   streams the backend relays from the runner (`crate::backend::relay`).
//!
//! Rules come from the policy file and the tenants file (`[[tenants.egress]]`, see
//! [`policy::TenantRule`]).

pub mod address;
pub mod ca;
pub mod inject;
pub mod intercept;
pub mod limits;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod record;
pub mod refusal;
pub mod resolve;
pub mod sandbox;
pub mod tls;
pub mod tls_ends;

pub use policy::Policy;
pub use proxy::{Proxy, RunScope};

/// Every default of egress, declared once (docs/egress.md lists them).
pub mod defaults {
    use std::time::Duration;

    /// Ports of a rule that names none.
    pub const PORTS: [u16; 1] = [443];
    /// Resolving and connecting, together (`limits.connect_timeout_s`).
    pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
    /// No byte either way for this long ends a connection (`limits.idle_timeout_s`).
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    /// Connections one run may have open at once (`limits.connections_in_flight`).
    pub const CONNECTIONS_IN_FLIGHT: u32 = 16;
    /// Bytes one run may send upstream (`limits.bytes_up`).
    pub const BYTES_UP: u64 = 256 << 20;
    /// Bytes one run may receive (`limits.bytes_down`).
    pub const BYTES_DOWN: u64 = 1 << 30;
    /// New connections per second of one tenant (`limits.connections_per_second`).
    pub const CONNECTIONS_PER_SECOND: u32 = 20;
    /// Addresses of one name tried in turn before the connection fails.
    pub const ADDRESSES_TRIED: usize = 4;
    /// Bytes of a request's head the proxy reads at most.
    pub const MAX_HEADER_BYTES: usize = 64 << 10;
    /// Characters of a host name that logs and errors show.
    pub const SHOWN_NAME_CHARS: usize = 255;
    /// Refusal log lines per second, process-wide (the rest are counted, not logged).
    pub const REFUSAL_LOGS_PER_SECOND: u32 = 20;
    /// The response header that carries a refusal's label (`not_in_policy`, ...).
    pub const REFUSAL_HEADER: &str = "x-egress-refused";
}
