//! The operator's egress policy (`serve --egress FILE`, TOML; every key in
//! docs/egress.md): rules naming what sandboxed code may reach (default deny), the limits,
//! and where names live for tests (`[resolve]`). Read once at start-up; an error names the
//! file and the entry. The decisions are pure functions a test calls without a socket:
//! [`Policy::allow_target`] for the host and port a client asked for,
//! [`Policy::allow_address`] for each address the proxy would connect to.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde::Deserialize;

use super::address::{classify, Cidr, Class};
use super::defaults;
use super::inject::{self, Header, Source};
use super::refusal::Reason;

/// The policy: rules, limits, name overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub limits: Limits,
    /// Where names live, in the manner of curl's `--resolve`: these answers instead of the
    /// system resolver's (tests; pinning a host).
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
    /// Certificates trusted upstream besides the system's roots, by the proxy's own TLS
    /// to intercepted hosts (`upstream_ca`, a PEM file: a private CA; the tests' CA).
    pub upstream_ca: Vec<CertificateDer<'static>>,
}

/// What one rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One host name, exactly (lower case, no trailing dot).
    Name(String),
    /// `*.example.com`: any name ending in `.example.com` (at any depth), not
    /// `example.com` itself. Holds `.example.com`.
    Suffix(String),
    /// An address or a range: the only way to reach addresses of a refused class.
    Net(Cidr),
}

/// One rule: a target, its ports, and optionally the methods and path prefixes allowed
/// (enforced where the proxy sees requests: plain HTTP now, intercepted HTTPS later; a
/// rule with them never opens a `CONNECT` tunnel, where they could not be checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// As the operator wrote it: the host label of the metrics.
    pub host: String,
    pub target: Target,
    pub ports: Vec<u16>,
    /// Upper case; `None`: any.
    pub methods: Option<Vec<String>>,
    /// `None`: any path.
    pub paths: Option<Vec<String>>,
    /// `None`: every tenant.
    pub tenants: Option<Vec<String>>,
    /// Headers added to each request for the host (`headers`, values read by the server);
    /// a rule with any is served by interception only ([`super::inject`]).
    pub headers: Vec<Header>,
}

/// The limits (defaults in [`super::defaults`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Resolving and connecting, together.
    pub connect_timeout: Duration,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Connections one run may have open at once.
    pub connections_in_flight: u32,
    /// Bytes one run may send upstream, all connections together.
    pub bytes_up: u64,
    /// Bytes one run may receive from upstream, all connections together.
    pub bytes_down: u64,
    /// New connections one tenant may open per second (all its runs; bursts of as many).
    pub connections_per_second: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connect_timeout: defaults::CONNECT_TIMEOUT,
            idle_timeout: defaults::IDLE_TIMEOUT,
            connections_in_flight: defaults::CONNECTIONS_IN_FLIGHT,
            bytes_up: defaults::BYTES_UP,
            bytes_down: defaults::BYTES_DOWN,
            connections_per_second: defaults::CONNECTIONS_PER_SECOND,
        }
    }
}

/// The host a client asked for, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A name: lower case, no trailing dot, letters, digits, `-`, `_` and dots.
    Name(String),
    Ip(IpAddr),
}

impl Host {
    /// `example.com`, `EXAMPLE.com.`, `10.0.0.1`, `[::1]`; `None` for anything else
    /// (empty, too long, characters no host name has).
    pub fn parse(s: &str) -> Option<Host> {
        if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            return inner.parse::<IpAddr>().ok().map(Host::Ip);
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Some(Host::Ip(ip));
        }
        let n = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        let ok = !n.is_empty()
            && n.len() <= 253
            && n.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        ok.then_some(Host::Name(n))
    }

    pub fn as_text(&self) -> String {
        match self {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }
}

/// What a client asked for, at the level the proxy sees it: a tunnel (`CONNECT`), or a
/// request with its method and path.
#[derive(Debug, Clone, Copy)]
pub enum Ask<'a> {
    Tunnel,
    Http {
        method: &'a str,
        path: &'a str,
    },
    /// A request inside a tunnel the proxy intercepts (a rule with headers): the rule's
    /// methods and paths hold, its headers are added.
    Intercepted {
        method: &'a str,
        path: &'a str,
    },
}

/// Methods never sent with a rule's headers, whatever its `methods`: TRACE (and TRACK)
/// answer with the request as received, added headers included, and CONNECT inside an
/// intercepted connection is no request for its host.
fn echoes(method: &str) -> bool {
    ["TRACE", "TRACK", "CONNECT"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method))
}

impl Rule {
    fn serves(&self, tenant: &str) -> bool {
        self.tenants
            .as_ref()
            .is_none_or(|t| t.iter().any(|x| x == tenant))
    }

    /// Whether the rule adds headers: then neither a tunnel nor plain HTTP serves it.
    pub fn injects(&self) -> bool {
        !self.headers.is_empty()
    }

    fn names(&self, host: &Host) -> bool {
        match (&self.target, host) {
            (Target::Name(n), Host::Name(h)) => n == h,
            (Target::Suffix(s), Host::Name(h)) => h.ends_with(s.as_str()),
            (Target::Net(c), Host::Ip(ip)) => c.contains(*ip),
            _ => false,
        }
    }

    fn lets(&self, ask: Ask<'_>) -> bool {
        match ask {
            Ask::Tunnel => self.methods.is_none() && self.paths.is_none() && !self.injects(),
            Ask::Http { method, path } => !self.injects() && self.lets_request(method, path),
            Ask::Intercepted { method, path } => {
                self.injects() && !echoes(method) && self.lets_request(method, path)
            }
        }
    }

    fn lets_request(&self, method: &str, path: &str) -> bool {
        self.methods
            .as_ref()
            .is_none_or(|m| m.iter().any(|x| x.eq_ignore_ascii_case(method)))
            && self
                .paths
                .as_ref()
                .is_none_or(|p| plain_path(path) && p.iter().any(|x| path.starts_with(x.as_str())))
    }

    /// The rule's methods and paths in words, for a refusal.
    fn allows(&self) -> String {
        let list = |v: &Option<Vec<String>>| match v {
            None => "any".to_string(),
            Some(v) => v.join(", "),
        };
        format!(
            "methods {}; paths starting with {}",
            list(&self.methods),
            list(&self.paths)
        )
    }
}

/// Whether a path says plainly where it goes, so that a prefix check means what it says:
/// no `.` or `..` segment, no encoded dot, slash or backslash, no backslash
/// (`/v1/../admin` and `/v1/%2e%2e/admin` start with `/v1/` and are not under it).
fn plain_path(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    !path.contains('\\')
        && !["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e))
        && !path.split('/').any(|seg| seg == "." || seg == "..")
}

impl Policy {
    /// The rule of `tenant` that allows `host`:`port` for `ask`, or why none does.
    pub fn allow_target(
        &self,
        tenant: &str,
        host: &Host,
        port: u16,
        ask: Ask<'_>,
    ) -> Result<&Rule, Reason> {
        let named: Vec<&Rule> = self
            .rules
            .iter()
            .filter(|r| r.serves(tenant) && r.names(host))
            .collect();
        let on_port: Vec<&Rule> = named
            .iter()
            .copied()
            .filter(|r| r.ports.contains(&port))
            .collect();
        if let Some(r) = on_port.iter().find(|r| r.lets(ask)) {
            return Ok(r);
        }
        let detail = if let Some(r) = on_port.first() {
            Some(match ask {
                Ask::Intercepted { method, .. } if echoes(method) => format!(
                    "{method} is never sent with the headers the rule `{}` adds: the answer would echo them back",
                    r.host
                ),
                Ask::Intercepted { method, path } => format!(
                    "the rule `{}` allows {}, not {method} {path}",
                    r.host,
                    r.allows()
                ),
                _ if r.injects() => format!(
                    "the rule `{}` adds headers, which the proxy sends only over HTTPS it intercepts",
                    r.host
                ),
                Ask::Tunnel => format!(
                    "the rule `{}` limits methods or paths, which a CONNECT tunnel cannot check",
                    r.host
                ),
                Ask::Http { method, path } => format!(
                    "the rule `{}` allows {}, not {method} {path}",
                    r.host,
                    r.allows()
                ),
            })
        } else {
            named.first().map(|r| {
                format!(
                    "the rule `{}` allows port{} {}, not {port}",
                    r.host,
                    if r.ports.len() == 1 { "" } else { "s" },
                    r.ports
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        };
        Err(Reason::NotInPolicy { detail })
    }

    /// Whether the proxy intercepts `CONNECT host:port` of `tenant`: a rule of the tenant
    /// for it adds headers (then each request inside is checked with
    /// [`Ask::Intercepted`]).
    pub fn intercepts(&self, tenant: &str, host: &Host, port: u16) -> bool {
        self.rules
            .iter()
            .any(|r| r.serves(tenant) && r.names(host) && r.ports.contains(&port) && r.injects())
    }

    /// Whether the proxy may connect to `addr`:`port` for `tenant`: a public address, or
    /// one a rule of the tenant names (with that port), whatever name led there.
    pub fn allow_address(&self, tenant: &str, addr: IpAddr, port: u16) -> Result<(), Reason> {
        let class = classify(addr);
        if class == Class::Public {
            return Ok(());
        }
        let named = self.rules.iter().any(|r| {
            r.serves(tenant)
                && r.ports.contains(&port)
                && matches!(&r.target, Target::Net(c) if c.contains(addr))
        });
        if named {
            Ok(())
        } else {
            Err(Reason::PrivateAddress { addr, class })
        }
    }

    /// Read and check the policy file.
    pub fn load(path: &Path) -> Result<Policy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("egress policy {}: {e}", path.display()))?;
        Policy::parse(&text).map_err(|e| format!("egress policy {}: {e}", path.display()))
    }

    /// Parse and check a policy's text.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        file.into_policy()
    }

    /// The tenants file's rules (`[[tenants.egress]]`, each serving its tenant alone) after
    /// this policy's server-wide ones.
    pub fn with_tenant_rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Policy {
        self.rules.extend(rules);
        self
    }

    /// One line for the start-up log: how many rules, the hosts.
    pub fn summary(&self) -> String {
        let hosts: Vec<&str> = self.rules.iter().map(|r| r.host.as_str()).collect();
        format!(
            "{} rules ({}){}",
            self.rules.len(),
            if hosts.is_empty() {
                "nothing allowed".to_string()
            } else {
                hosts.join(", ")
            },
            if self.resolve.is_empty() {
                String::new()
            } else {
                format!(", {} names resolved by the file", self.resolve.len())
            }
        )
    }
}

// ---- the file ----

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    resolve: BTreeMap<String, OneOrMany>,
    #[serde(default)]
    rules: Vec<RuleFile>,
    #[serde(default)]
    upstream_ca: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    connect_timeout_s: Option<f64>,
    idle_timeout_s: Option<f64>,
    connections_in_flight: Option<u32>,
    bytes_up: Option<Size>,
    bytes_down: Option<Size>,
    connections_per_second: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    host: String,
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    methods: Option<Vec<String>>,
    #[serde(default)]
    paths: Option<Vec<String>>,
    #[serde(default)]
    tenants: Option<Vec<String>>,
    #[serde(default)]
    headers: BTreeMap<String, Source>,
}

/// A tenant's own rule (`[[tenants.egress]]` in the tenants file): a `[[rules]]` entry of
/// the policy file less `tenants`; it serves that tenant alone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRule {
    host: String,
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    methods: Option<Vec<String>>,
    #[serde(default)]
    paths: Option<Vec<String>>,
    #[serde(default)]
    headers: BTreeMap<String, Source>,
}

impl TenantRule {
    /// Checked as a policy file's rule is, for `tenant` alone.
    pub fn into_rule(self, tenant: &str) -> Result<Rule, String> {
        RuleFile {
            host: self.host,
            ports: self.ports,
            methods: self.methods,
            paths: self.paths,
            tenants: Some(vec![tenant.to_string()]),
            headers: self.headers,
        }
        .into_rule()
    }
}

fn seconds(key: &str, v: Option<f64>, default: Duration) -> Result<Duration, String> {
    match v {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        Some(s) => Err(format!(
            "limits.{key}: {s} is not a number of seconds between 0 and 86400"
        )),
    }
}

fn size(key: &str, v: Option<Size>, default: u64) -> Result<u64, String> {
    match v {
        None => Ok(default),
        Some(Size::Bytes(n)) => Ok(n),
        Some(Size::Text(t)) => {
            crate::config::parse_size(&t).map_err(|e| format!("limits.{key}: {e}"))
        }
    }
}

fn positive(key: &str, v: Option<u32>, default: u32) -> Result<u32, String> {
    match v {
        None => Ok(default),
        Some(0) => Err(format!("limits.{key} must be at least 1")),
        Some(n) => Ok(n),
    }
}

impl File {
    fn into_policy(self) -> Result<Policy, String> {
        let l = self.limits;
        let limits = Limits {
            connect_timeout: seconds(
                "connect_timeout_s",
                l.connect_timeout_s,
                defaults::CONNECT_TIMEOUT,
            )?,
            idle_timeout: seconds("idle_timeout_s", l.idle_timeout_s, defaults::IDLE_TIMEOUT)?,
            connections_in_flight: positive(
                "connections_in_flight",
                l.connections_in_flight,
                defaults::CONNECTIONS_IN_FLIGHT,
            )?,
            bytes_up: size("bytes_up", l.bytes_up, defaults::BYTES_UP)?,
            bytes_down: size("bytes_down", l.bytes_down, defaults::BYTES_DOWN)?,
            connections_per_second: positive(
                "connections_per_second",
                l.connections_per_second,
                defaults::CONNECTIONS_PER_SECOND,
            )?,
        };
        let mut resolve = BTreeMap::new();
        for (name, to) in self.resolve {
            let key = match Host::parse(&name) {
                Some(Host::Name(n)) => n,
                _ => return Err(format!("resolve: `{name}` is not a host name")),
            };
            let list = match to {
                OneOrMany::One(a) => vec![a],
                OneOrMany::Many(v) => v,
            };
            if list.is_empty() {
                return Err(format!("resolve.\"{name}\": no address"));
            }
            let addrs = list
                .iter()
                .map(|a| {
                    a.trim_start_matches('[')
                        .trim_end_matches(']')
                        .parse::<IpAddr>()
                        .map_err(|_| format!("resolve.\"{name}\": `{a}` is not an IP address"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            resolve.insert(key, addrs);
        }
        let rules = self
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, r)| r.into_rule().map_err(|e| format!("rules[{i}]: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let upstream_ca = match &self.upstream_ca {
            None => Vec::new(),
            Some(path) => upstream_ca(path)?,
        };
        Ok(Policy {
            rules,
            limits,
            resolve,
            upstream_ca,
        })
    }
}

/// The certificates of the `upstream_ca` PEM file (at least one).
fn upstream_ca(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("upstream_ca `{path}`: {e}"))?;
    if certs.is_empty() {
        return Err(format!("upstream_ca `{path}`: no certificate in the file"));
    }
    Ok(certs)
}

impl RuleFile {
    fn into_rule(self) -> Result<Rule, String> {
        let h = self.host.trim();
        let target = if h.contains('/') || h.starts_with('[') || h.parse::<IpAddr>().is_ok() {
            Target::Net(Cidr::parse(h)?)
        } else if let Some(rest) = h.strip_prefix("*.") {
            match Host::parse(rest) {
                Some(Host::Name(n)) if n.contains('.') => Target::Suffix(format!(".{n}")),
                _ => {
                    return Err(format!(
                        "host `{h}`: a wildcard is `*.` and a domain of two labels or more (e.g. `*.example.com`)"
                    ))
                }
            }
        } else {
            match Host::parse(h) {
                Some(Host::Name(n)) => Target::Name(n),
                _ => {
                    return Err(format!(
                        "host `{h}` is not a host name, `*.domain`, an IP address or a CIDR range"
                    ))
                }
            }
        };
        let ports = self.ports.unwrap_or_else(|| defaults::PORTS.to_vec());
        if ports.is_empty() || ports.contains(&0) {
            return Err(format!(
                "host `{h}`: ports must list ports from 1 to 65535 (absent: {:?})",
                defaults::PORTS
            ));
        }
        let methods = match self.methods {
            Some(m) if m.is_empty() => return Err(format!("host `{h}`: methods is empty")),
            Some(m) => {
                if let Some(bad) = m
                    .iter()
                    .find(|x| x.is_empty() || !x.bytes().all(|b| b.is_ascii_alphabetic()))
                {
                    return Err(format!("host `{h}`: `{bad}` is not an HTTP method"));
                }
                Some(m.iter().map(|x| x.to_ascii_uppercase()).collect())
            }
            None => None,
        };
        if let Some(p) = &self.paths {
            if p.is_empty() {
                return Err(format!("host `{h}`: paths is empty"));
            }
            if let Some(bad) = p.iter().find(|x| !x.starts_with('/')) {
                return Err(format!(
                    "host `{h}`: the path prefix `{bad}` must start with `/`"
                ));
            }
        }
        let headers = inject::load(h, self.headers)?;
        Ok(Rule {
            host: h.to_string(),
            target,
            ports,
            methods,
            paths: self.paths,
            tenants: self.tenants,
            headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
        [limits]
        connect_timeout_s = 2.5
        bytes_down = "10m"
        bytes_up = 1024

        [resolve]
        "Data.Example.Test" = "127.0.0.1"
        "two.example.test" = ["127.0.0.2", "::1"]

        [[rules]]
        host = "data.example.test"
        ports = [443, 8443]

        [[rules]]
        host = "*.github.example"

        [[rules]]
        host = "api.example.test"
        ports = [80]
        methods = ["get"]
        paths = ["/v1/"]

        [[rules]]
        host = "127.0.0.1"
        ports = [8443]

        [[rules]]
        host = "10.0.0.0/8"
        tenants = ["alice"]
    "#;

    fn p() -> Policy {
        Policy::parse(FILE).unwrap()
    }

    fn name(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn parses_limits_overrides_and_rules() {
        let p = p();
        assert_eq!(p.limits.connect_timeout, Duration::from_millis(2500));
        assert_eq!(p.limits.bytes_down, 10 << 20);
        assert_eq!(p.limits.bytes_up, 1024);
        assert_eq!(p.limits.idle_timeout, defaults::IDLE_TIMEOUT);
        assert_eq!(
            p.resolve["data.example.test"],
            vec!["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(p.resolve["two.example.test"].len(), 2);
        assert_eq!(p.rules[1].ports, vec![443]);
        assert_eq!(p.rules[1].target, Target::Suffix(".github.example".into()));
        assert_eq!(p.rules[2].methods, Some(vec!["GET".to_string()]));
        assert!(p
            .summary()
            .starts_with("5 rules (data.example.test, *.github.example"));
        let empty = Policy::parse("").unwrap();
        assert!(empty.rules.is_empty());
        assert_eq!(empty.limits, Limits::default());
    }

    #[test]
    fn names_ports_wildcards_and_tenants() {
        let p = p();
        let t = Ask::Tunnel;
        assert!(p
            .allow_target("bob", &name("data.example.test"), 443, t)
            .is_ok());
        assert!(p
            .allow_target("bob", &name("DATA.example.test."), 8443, t)
            .is_ok());
        match p.allow_target("bob", &name("data.example.test"), 22, t) {
            Err(Reason::NotInPolicy { detail: Some(d) }) => {
                assert!(d.contains("allows ports 443, 8443, not 22"), "{d}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            p.allow_target("bob", &name("other.example.test"), 443, t),
            Err(Reason::NotInPolicy { detail: None })
        );
        assert!(p
            .allow_target("bob", &name("a.github.example"), 443, t)
            .is_ok());
        assert!(p
            .allow_target("bob", &name("a.b.github.example"), 443, t)
            .is_ok());
        assert!(p
            .allow_target("bob", &name("github.example"), 443, t)
            .is_err());
        assert!(p
            .allow_target("bob", &name("evilgithub.example"), 443, t)
            .is_err());
        // An IP literal needs a rule naming it; a name rule never covers one.
        let ip = |s: &str| Host::Ip(s.parse().unwrap());
        assert!(p.allow_target("bob", &ip("127.0.0.1"), 8443, t).is_ok());
        assert!(p.allow_target("bob", &ip("93.184.216.34"), 443, t).is_err());
        assert!(p.allow_target("alice", &ip("10.1.2.3"), 443, t).is_ok());
        assert!(p.allow_target("bob", &ip("10.1.2.3"), 443, t).is_err());
    }

    #[test]
    fn a_rule_with_headers_is_never_tunnelled_nor_sent_in_clear() {
        let var = "EGRESS_POLICY_TEST_TOKEN";
        std::env::set_var(var, "Bearer policy-marker");
        let text = format!(
            "[[rules]]\nhost = \"api.example.test\"\nports = [443, 80]\nheaders = {{ Authorization = {{ env = \"{var}\" }} }}"
        );
        let p = Policy::parse(&text);
        let tenant = TenantRule::deserialize(toml::Value::Table(
            toml::from_str::<toml::Table>(&text.replace("[[rules]]\n", "")).unwrap(),
        ))
        .unwrap()
        .into_rule("alice");
        std::env::remove_var(var);
        let p = p.unwrap();
        let r = &p.rules[0];
        assert!(r.injects());
        assert_eq!(r.headers[0].name, "authorization");
        assert_eq!(r.headers[0].value.expose(), "Bearer policy-marker");
        assert!(!format!("{p:?}").contains("policy-marker"));
        assert!(!p.summary().contains("policy-marker"));
        let h = name("api.example.test");
        for (port, ask) in [
            (443, Ask::Tunnel),
            (
                80,
                Ask::Http {
                    method: "GET",
                    path: "/",
                },
            ),
        ] {
            match p.allow_target("t", &h, port, ask) {
                Err(Reason::NotInPolicy { detail: Some(d) }) => {
                    assert!(d.contains("adds headers"), "{d}")
                }
                other => panic!("{other:?}"),
            }
        }
        // Inside the intercepted connection: a GET gets the headers, a TRACE (which would
        // echo them back) never, whatever the rule's methods.
        assert!(p
            .allow_target(
                "t",
                &h,
                443,
                Ask::Intercepted {
                    method: "GET",
                    path: "/"
                }
            )
            .is_ok());
        for method in ["TRACE", "track", "CONNECT"] {
            let ask = Ask::Intercepted { method, path: "/" };
            match p.allow_target("t", &h, 443, ask) {
                Err(Reason::NotInPolicy { detail: Some(d) }) => {
                    assert!(d.contains("echo them back") && d.contains(method), "{d}")
                }
                other => panic!("{method}: {other:?}"),
            }
        }
        let tenant = tenant.unwrap();
        assert_eq!(tenant.tenants, Some(vec!["alice".to_string()]));
        assert!(tenant.injects());
        // An unset variable is an error at load naming the rule and the variable.
        let e = Policy::parse(&text).unwrap_err();
        assert!(e.contains("rules[0]") && e.contains(var), "{e}");
    }

    #[test]
    fn methods_and_paths_hold_for_requests_and_keep_tunnels_shut() {
        let p = p();
        let h = name("api.example.test");
        let get = |path| Ask::Http {
            method: "GET",
            path,
        };
        assert!(p.allow_target("t", &h, 80, get("/v1/items")).is_ok());
        assert!(p.allow_target("t", &h, 80, get("/v2/items")).is_err());
        for sneaky in [
            "/v1/../admin",
            "/v1/./../admin",
            "/v1/..",
            "/v1/%2e%2e/admin",
            "/v1/%2E%2E/admin",
            "/v1/..%2Fadmin",
            "/v1/..\\admin",
            "/v1/%5c..%5cadmin",
        ] {
            assert!(
                p.allow_target("t", &h, 80, get(sneaky)).is_err(),
                "{sneaky}"
            );
        }
        assert!(p.allow_target("t", &h, 80, get("/v1/a.b/c..d")).is_ok());
        assert!(p
            .allow_target(
                "t",
                &h,
                80,
                Ask::Http {
                    method: "POST",
                    path: "/v1/x"
                }
            )
            .is_err());
        match p.allow_target("t", &h, 80, Ask::Tunnel) {
            Err(Reason::NotInPolicy { detail: Some(d) }) => assert!(d.contains("CONNECT"), "{d}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refused_classes_need_a_rule_naming_the_address() {
        let p = p();
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(p.allow_address("bob", a("93.184.216.34"), 443).is_ok());
        assert!(p.allow_address("bob", a("127.0.0.1"), 8443).is_ok());
        assert!(p.allow_address("bob", a("::ffff:127.0.0.1"), 8443).is_ok());
        for (addr, port, class) in [
            ("127.0.0.1", 443, Class::Loopback),
            ("127.0.0.2", 8443, Class::Loopback),
            ("::ffff:127.0.0.2", 8443, Class::Loopback),
            ("10.1.2.3", 443, Class::Private),
            ("169.254.169.254", 80, Class::LinkLocal),
            ("::1", 8443, Class::Loopback),
        ] {
            assert_eq!(
                p.allow_address("bob", a(addr), port),
                Err(Reason::PrivateAddress {
                    addr: a(addr),
                    class
                }),
                "{addr}:{port}"
            );
        }
        assert!(p.allow_address("alice", a("10.1.2.3"), 443).is_ok());
    }

    #[test]
    fn errors_name_the_entry() {
        for (text, want) in [
            (
                "[[rules]]\nhost = \"*.com\"",
                "rules[0]: host `*.com`: a wildcard",
            ),
            (
                "[[rules]]\nhost = \"a b\"",
                "rules[0]: host `a b` is not a host name",
            ),
            ("[[rules]]\nhost = \"10.0.0.1/8\"", "bits set past"),
            (
                "[[rules]]\nhost = \"x.test\"\nports = []",
                "ports must list",
            ),
            (
                "[[rules]]\nhost = \"x.test\"\nports = [0]",
                "ports must list",
            ),
            (
                "[[rules]]\nhost = \"x.test\"\npaths = [\"v1\"]",
                "must start with `/`",
            ),
            (
                "[[rules]]\nhost = \"x.test\"\nmethods = [\"G T\"]",
                "not an HTTP method",
            ),
            (
                "[[rules]]\nhost = \"x.test\"\nport = 443",
                "unknown field `port`",
            ),
            ("[limits]\nbytes_down = \"lots\"", "limits.bytes_down"),
            (
                "[limits]\nconnect_timeout_s = 0",
                "limits.connect_timeout_s",
            ),
            ("[limits]\nconnections_in_flight = 0", "at least 1"),
            ("[resolve]\n\"x.test\" = \"nowhere\"", "not an IP address"),
            ("colour = 1", "unknown field `colour`"),
        ] {
            let e = Policy::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_tenants_rule_serves_that_tenant_alone() {
        let rule: TenantRule = toml::from_str("host = \"data.example.test\"").unwrap();
        let p = Policy::parse("")
            .unwrap()
            .with_tenant_rules([rule.into_rule("alice").unwrap()]);
        let host = name("data.example.test");
        assert!(p.allow_target("alice", &host, 443, Ask::Tunnel).is_ok());
        assert!(p.allow_target("bob", &host, 443, Ask::Tunnel).is_err());
        // A tenant's rule cannot name other tenants.
        assert!(toml::from_str::<TenantRule>("host = \"a.test\"\ntenants = [\"bob\"]").is_err());
        let bad: TenantRule = toml::from_str("host = \"*.test\"").unwrap();
        assert!(bad.into_rule("alice").is_err());
    }

    #[test]
    fn host_parsing() {
        assert_eq!(Host::parse("Ex.COM."), Some(Host::Name("ex.com".into())));
        assert_eq!(Host::parse("[::1]"), Some(Host::Ip("::1".parse().unwrap())));
        assert_eq!(
            Host::parse("::ffff:127.0.0.1"),
            Some(Host::Ip("::ffff:127.0.0.1".parse().unwrap()))
        );
        for bad in ["", "a..b", "a b", "ex\u{e9}.com", "a/b", &"a".repeat(254)] {
            assert_eq!(Host::parse(bad), None, "{bad}");
        }
    }
}
