//! Tenants of a hosted server: who may call ([`token`]), with which limits (this module,
//! read from a TOML file), how fast ([`rate`]) and in which order ([`scheduler`]).
//!
//! Without a tenants file a server has one tenant, `local`, with the server's own limits and
//! no authentication (the single-user setups of the tools we replace). With one, every HTTP
//! call carries `Authorization: Bearer <token>`: a static token, whose SHA-256 names the
//! tenant, or an OAuth access token ([`oauth`]), which the file's `[[oauth_rules]]`
//! ([`Rule`]) map to a tenant by issuer and claim, `client_id` or `sub`. Everything the call
//! touches (code storage, workspace, sessions, environment, containers) is that tenant's
//! alone, and within it, for OAuth, its user's.

pub mod memory;
pub mod oauth;
pub mod rate;
pub mod scheduler;
pub mod token;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config;

/// The tenant of a server without a tenants file.
pub const LOCAL: &str = crate::job::LOCAL_TENANT;

/// One tenant: its id, the hash of its token, and its limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub id: String,
    /// SHA-256 of the static bearer token (the token itself is never stored); `None`: a
    /// tenant reached only by OAuth sign-in ([`Rule`]).
    pub token_sha256: Option<[u8; 32]>,
    pub limits: TenantLimits,
}

/// A tenant's limits; `None` leaves the server's own.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantLimits {
    /// Runs of this tenant at once (its further calls queue).
    pub max_concurrent_runs: Option<usize>,
    /// Runs (execute_code, execute_code_file, execute_python cells, package checks) started
    /// per minute.
    pub runs_per_minute: Option<u32>,
    /// The longest timeout a call may ask for.
    pub max_timeout: Option<Duration>,
    /// Memory of each run (swap included).
    pub max_memory: Option<u64>,
    /// CPU quota of each run, cores.
    pub max_cpus: Option<f64>,
    /// Bytes kept of stdout and of stderr, each.
    pub output_limit: Option<u64>,
    /// Bytes of stored code and workspace files, together.
    pub storage_limit: Option<u64>,
    /// Memory all its sandboxes may hold at once: its runs and its open execute_python
    /// sessions, paused or not (see [`memory`]).
    pub memory_budget: Option<u64>,
    /// execute_python sessions alive at once.
    pub max_sessions: Option<usize>,
    /// May `install_dependencies` reach the network (PyPI)? Without it installs are refused.
    pub install_network: bool,
    /// Server paths of environments this tenant may switch to with configure_environment
    /// (an environment must lie under one of them). Empty: only its own managed environment.
    pub env_paths: Vec<PathBuf>,
    /// Modules this tenant's waiting sandboxes preload instead of the server's list
    /// (`None`: the server's; see docs/mcp.md "Preloading").
    pub preload: Option<Vec<String>>,
    /// Code mode: upstream MCP servers only this tenant's code sees, beside the tools
    /// file's (`[[tenants.servers]]`; docs/code-mode.md).
    pub servers: Vec<crate::codemode::config::Server>,
    /// Egress: hosts only this tenant's code may reach, beside the policy file's rules
    /// (`[[tenants.egress]]`; docs/egress.md), each serving this tenant alone.
    pub egress: Vec<crate::egress::policy::Rule>,
}

impl TenantLimits {
    /// The limits of the single local tenant: the server's own, every environment allowed.
    pub fn local() -> Self {
        TenantLimits {
            install_network: true,
            ..Default::default()
        }
    }
}

/// Why the tenants file cannot be used. Each names the file and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum TenantsError {
    #[error("cannot read the tenants file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tenants file {path} is not valid: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

/// The file as written: `[[tenants]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tenants: Vec<Entry>,
    #[serde(default)]
    oauth_rules: Vec<RuleEntry>,
}

/// A rule of the tenants file mapping a validated OAuth access token to a tenant
/// (`[[oauth_rules]]`): tokens of `issuer` whose claim, `client_id` or `sub` matches. Rules
/// are tried in order; the first match wins; a token no rule matches is refused (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub issuer: String,
    pub tenant: String,
    pub matches: Match,
}

/// What a [`Rule`] compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// A claim (e.g. `org`) equal to a value.
    Claim { name: String, value: String },
    /// The token's `client_id` (or `azp`).
    ClientId(String),
    /// The token's `sub`.
    Subject(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleEntry {
    issuer: String,
    tenant: String,
    claim: Option<String>,
    value: Option<String>,
    client_id: Option<String>,
    sub: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: String,
    token_sha256: Option<String>,
    max_concurrent_runs: Option<usize>,
    runs_per_minute: Option<u32>,
    max_timeout: Option<Amount>,
    max_memory: Option<Amount>,
    max_cpus: Option<f64>,
    output_limit: Option<Amount>,
    storage_limit: Option<Amount>,
    memory_budget: Option<Amount>,
    max_sessions: Option<usize>,
    #[serde(default = "yes")]
    install_network: bool,
    #[serde(default)]
    env_paths: Vec<PathBuf>,
    preload: Option<Vec<String>>,
    #[serde(default)]
    servers: Vec<crate::codemode::config::Server>,
    #[serde(default)]
    egress: Vec<crate::egress::policy::TenantRule>,
}

fn yes() -> bool {
    true
}

/// A size or a duration: a number (bytes, seconds) or a string with a unit (`512m`, `90s`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Amount {
    Int(u64),
    Float(f64),
    Text(String),
}

impl Amount {
    fn size(&self) -> Result<u64, String> {
        match self {
            Amount::Int(n) => Ok(*n),
            Amount::Float(f) if *f >= 0.0 && f.fract() == 0.0 => Ok(*f as u64),
            Amount::Float(f) => Err(format!("{f} is not a whole number of bytes")),
            Amount::Text(s) => config::parse_size(s).map_err(|e| e.to_string()),
        }
    }

    fn duration(&self) -> Result<Duration, String> {
        match self {
            Amount::Int(n) => Ok(Duration::from_secs(*n)),
            Amount::Float(f) if f.is_finite() && *f > 0.0 => Ok(Duration::from_secs_f64(*f)),
            Amount::Float(f) => Err(format!("{f} is not a positive number of seconds")),
            Amount::Text(s) => config::parse_duration(s).map_err(|e| e.to_string()),
        }
    }
}

/// Is `id` usable as a tenant id: one path component and label value that no sanitising
/// changes (so two ids never share a directory), never `pool` (the label of waiting pool
/// containers)?
pub fn valid_id(id: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let first_ok = id.chars().next().is_some_and(alnum);
    let last_ok = id.chars().last().is_some_and(alnum);
    let mut chars = id.chars();
    first_ok
        && last_ok
        && id.len() <= 63
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        && id != "pool"
}

/// Read and check a tenants file.
pub fn load(path: &Path) -> Result<Vec<Tenant>, TenantsError> {
    load_all(path).map(|(t, _)| t)
}

/// Read and check a tenants file: its tenants and its OAuth rules.
pub fn load_all(path: &Path) -> Result<(Vec<Tenant>, Vec<Rule>), TenantsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TenantsError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_all(&text).map_err(|detail| TenantsError::Invalid {
        path: path.to_path_buf(),
        detail,
    })
}

/// Parse the text of a tenants file: ids valid and unique, hashes 64 hex digits and unique,
/// limits positive.
pub fn parse(text: &str) -> Result<Vec<Tenant>, String> {
    parse_all(text).map(|(t, _)| t)
}

/// [`parse`], with the OAuth rules: each names a tenant of the file, an issuer, and
/// exactly one of `claim` + `value`, `client_id`, `sub`; every tenant has a token or a rule.
pub fn parse_all(text: &str) -> Result<(Vec<Tenant>, Vec<Rule>), String> {
    let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
    if file.tenants.is_empty() {
        return Err("no [[tenants]] table: give at least one tenant".into());
    }
    let tenants = parse_tenants(file.tenants)?;
    let mut rules = Vec::new();
    for (i, r) in file.oauth_rules.into_iter().enumerate() {
        let at = |what: &str| format!("oauth_rules entry {}: {what}", i + 1);
        if !tenants.iter().any(|t| t.id == r.tenant) {
            return Err(at(&format!(
                "tenant `{}` is not a [[tenants]] id",
                r.tenant
            )));
        }
        if r.issuer.trim().is_empty() || r.issuer.trim() != r.issuer {
            return Err(at(
                "issuer must be the issuer's URL exactly as its tokens' iss",
            ));
        }
        let empty = |v: &Option<String>| v.as_deref().is_some_and(|v| v.trim().is_empty());
        if [&r.claim, &r.value, &r.client_id, &r.sub]
            .into_iter()
            .any(empty)
        {
            return Err(at("a match value is empty"));
        }
        let matches = match (r.claim, r.value, r.client_id, r.sub) {
            (Some(name), Some(value), None, None) => Match::Claim { name, value },
            (None, None, Some(c), None) => Match::ClientId(c),
            (None, None, None, Some(s)) => Match::Subject(s),
            _ => {
                return Err(at(
                    "give exactly one of `claim` with `value`, `client_id`, or `sub`",
                ))
            }
        };
        rules.push(Rule {
            issuer: r.issuer,
            tenant: r.tenant,
            matches,
        });
    }
    if let Some(t) = tenants
        .iter()
        .find(|t| t.token_sha256.is_none() && !rules.iter().any(|r| r.tenant == t.id))
    {
        return Err(format!(
            "tenant `{}`: no token_sha256 and no [[oauth_rules]] entry names it: nobody could reach it",
            t.id
        ));
    }
    Ok((tenants, rules))
}

fn parse_tenants(entries: Vec<Entry>) -> Result<Vec<Tenant>, String> {
    let mut out: Vec<Tenant> = Vec::new();
    for e in entries {
        let id = e.id.clone();
        let at = |what: &str| format!("tenant `{id}`: {what}");
        if !valid_id(&e.id) {
            return Err(at(
                "the id must be 1 to 63 of a-z, 0-9, `_`, `-`, starting and ending with a letter or digit (and not `pool`)",
            ));
        }
        let token_sha256 = match &e.token_sha256 {
            None => None,
            Some(h) => Some(token::parse_hex(h).ok_or_else(|| {
                at("token_sha256 must be 64 hex digits (make one with `mcp-code-executor tenant token`)")
            })?),
        };
        if out.iter().any(|t| t.id == e.id) {
            return Err(at("the id appears twice"));
        }
        if token_sha256.is_some() && out.iter().any(|t| t.token_sha256 == token_sha256) {
            return Err(at("its token_sha256 is another tenant's too"));
        }
        let positive = |name: &str, v: Option<u64>| -> Result<(), String> {
            if v == Some(0) {
                Err(at(&format!("{name} must be above 0")))
            } else {
                Ok(())
            }
        };
        positive(
            "max_concurrent_runs",
            e.max_concurrent_runs.map(|v| v as u64),
        )?;
        positive("runs_per_minute", e.runs_per_minute.map(u64::from))?;
        positive("max_sessions", e.max_sessions.map(|v| v as u64))?;
        if let Some(c) = e.max_cpus {
            if !(c.is_finite() && c > 0.0) {
                return Err(at("max_cpus must be a positive number of cores"));
            }
        }
        let size = |name: &str, a: &Option<Amount>| -> Result<Option<u64>, String> {
            let v = a
                .as_ref()
                .map(|a| a.size())
                .transpose()
                .map_err(|d| at(&format!("{name}: {d}")))?;
            positive(name, v)?;
            Ok(v)
        };
        let limits = TenantLimits {
            max_concurrent_runs: e.max_concurrent_runs,
            runs_per_minute: e.runs_per_minute,
            max_timeout: e
                .max_timeout
                .as_ref()
                .map(|a| a.duration())
                .transpose()
                .map_err(|d| at(&format!("max_timeout: {d}")))?,
            max_memory: size("max_memory", &e.max_memory)?,
            max_cpus: e.max_cpus,
            output_limit: size("output_limit", &e.output_limit)?,
            storage_limit: size("storage_limit", &e.storage_limit)?,
            memory_budget: size("memory_budget", &e.memory_budget)?,
            max_sessions: e.max_sessions,
            install_network: e.install_network,
            env_paths: e.env_paths,
            preload: e.preload,
            servers: e.servers,
            egress: e
                .egress
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    r.into_rule(&id)
                        .map_err(|d| at(&format!("egress entry {}: {d}", i + 1)))
                })
                .collect::<Result<_, _>>()?,
        };
        crate::codemode::config::check_tenant_servers(&limits.servers).map_err(|d| at(&d))?;
        if let Some(bad) = limits
            .preload
            .iter()
            .flatten()
            .find(|n| !crate::config::preload::valid_name(n))
        {
            return Err(at(&format!("preload: `{bad}` is not a module name")));
        }
        if let Some(p) = limits.env_paths.iter().find(|p| !p.is_absolute()) {
            return Err(at(&format!(
                "env_paths entry `{}` is not an absolute path",
                p.display()
            )));
        }
        out.push(Tenant {
            id: e.id,
            token_sha256,
            limits,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
