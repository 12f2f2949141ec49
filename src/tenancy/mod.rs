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
mod tests {
    use super::*;

    const HASH_A: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    const HASH_B: &str = "486ea46224d1bb4fb680f34f7c9ad96a8f24ec88be73ea8e5a6c65260e9cb8a7";

    #[test]
    fn a_tenant_may_name_its_preload_list() {
        let entry = |list: &str| {
            format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\npreload = {list}\n")
        };
        let t = parse(&entry(r#"["numpy", "matplotlib.pyplot"]"#)).unwrap();
        assert_eq!(
            t[0].limits.preload,
            Some(vec!["numpy".to_string(), "matplotlib.pyplot".to_string()])
        );
        assert_eq!(parse(&entry("[]")).unwrap()[0].limits.preload, Some(vec![]));
        let e = parse(&entry(r#"["os; rm"]"#)).unwrap_err();
        assert!(e.contains("preload"), "{e}");
    }

    #[test]
    fn a_tenant_may_declare_its_own_code_mode_servers() {
        let text = format!(
            r#"
            [[tenants]]
            id = "a"
            token_sha256 = "{HASH_A}"
            [[tenants.servers]]
            name = "crm"
            url = "http://127.0.0.1:9/mcp"
            headers = {{ Authorization = "Bearer a-secret" }}
            allow = ["find"]
            [[tenants.servers]]
            name = "notes"
            command = "node"
            args = ["notes.js"]
            call_timeout_s = 5

            [[tenants]]
            id = "b"
            token_sha256 = "{HASH_B}"
            "#
        );
        let t = parse(&text).unwrap();
        let a = &t[0].limits.servers;
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].name, "crm");
        assert_eq!(a[0].url.as_deref(), Some("http://127.0.0.1:9/mcp"));
        assert!(a[0].allows("find") && !a[0].allows("delete"));
        assert_eq!(a[1].args, ["notes.js"]);
        assert_eq!(a[1].call_timeout_s, Some(5.0));
        assert!(t[1].limits.servers.is_empty());
        // The entry is the tools file's: unknown fields refused, the same checks.
        let entry = |body: &str| {
            format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n[[tenants.servers]]\n{body}\n")
        };
        for (body, want) in [
            ("name = \"x\"\ncommand = \"c\"\ntypo = 1", "unknown field `typo`"),
            ("name = \"x\"\ncommand = \"c\"\ntenants = [\"b\"]", "`tenants` is for the tools file"),
            ("name = \"x\"", "exactly one of `command`"),
            ("name = \"x\"\ncommand = \"c\"\nheaders = { A = \"b\" }", "`headers` are for a `url` server"),
            ("name = \"\"\ncommand = \"c\"", "empty name"),
            (
                "name = \"x-y\"\ncommand = \"c\"\n[[tenants.servers]]\nname = \"x_y\"\ncommand = \"d\"",
                "same Python name",
            ),
        ] {
            let e = parse(&entry(body)).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
            assert!(e.contains("unknown field") || e.contains("tenant `a`"), "{body}: {e}");
        }
    }

    #[test]
    fn parses_a_full_file() {
        let text = format!(
            r#"
            [[tenants]]
            id = "alice"
            token_sha256 = "{HASH_A}"
            max_concurrent_runs = 2
            runs_per_minute = 60
            max_timeout = "60s"
            max_memory = "256m"
            max_cpus = 0.5
            output_limit = 65536
            storage_limit = "10m"
            memory_budget = "2g"
            max_sessions = 1
            install_network = false
            env_paths = ["/opt/envs"]

            [[tenants]]
            id = "bob"
            token_sha256 = "{}"
            "#,
            HASH_B.to_uppercase()
        );
        let t = parse(&text).unwrap();
        assert_eq!(t.len(), 2);
        let a = &t[0].limits;
        assert_eq!(t[0].id, "alice");
        assert_eq!(a.max_concurrent_runs, Some(2));
        assert_eq!(a.max_timeout, Some(Duration::from_secs(60)));
        assert_eq!(a.max_memory, Some(256 << 20));
        assert_eq!(a.output_limit, Some(65536));
        assert_eq!(a.storage_limit, Some(10 << 20));
        assert_eq!(a.memory_budget, Some(2 << 30));
        assert!(!a.install_network);
        assert_eq!(a.env_paths, vec![PathBuf::from("/opt/envs")]);
        let b = &t[1].limits;
        assert_eq!(b.max_memory, None);
        assert!(b.install_network, "installs may use the network by default");
        assert_eq!(
            t[1].token_sha256,
            token::parse_hex(HASH_B),
            "hex is case-insensitive"
        );
    }

    #[test]
    fn refuses_bad_files_with_the_reason() {
        let cases = [
            ("", "no [[tenants]]"),
            (
                &format!("[[tenants]]\nid = \"Alice\"\ntoken_sha256 = \"{HASH_A}\""),
                "the id must be",
            ),
            (
                &format!("[[tenants]]\nid = \"pool\"\ntoken_sha256 = \"{HASH_A}\""),
                "not `pool`",
            ),
            (
                "[[tenants]]\nid = \"a\"\ntoken_sha256 = \"secret\"",
                "64 hex digits",
            ),
            (
                &format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_B}\""),
                "appears twice",
            ),
            (
                &format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n[[tenants]]\nid = \"b\"\ntoken_sha256 = \"{HASH_A}\""),
                "another tenant's",
            ),
            (
                &format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\nruns_per_minute = 0"),
                "runs_per_minute must be above 0",
            ),
            (
                &format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\nmax_memory = \"lots\""),
                "max_memory",
            ),
            (
                &format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\ntoken = \"x\""),
                "unknown field",
            ),
            (
                &format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\nenv_paths = [\"envs\"]"),
                "not an absolute path",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_example_file_parses() {
        let text = include_str!("../../deploy/tenants.example.toml");
        let t = parse(text).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].token_sha256, Some(token::hash("demo-alice-CHANGE-ME")));
        assert_eq!(t[0].limits.max_memory, Some(512 << 20));
        assert!(!t[1].limits.install_network);
        // Its code-mode server is commented out (docker-compose serves this file); with
        // the entry uncommented (`#name` -> `name`; prose is `# ...`) it is bob's.
        assert!(t.iter().all(|t| t.limits.servers.is_empty()));
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix('#') {
                Some(rest) if rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '[') => {
                    rest
                }
                _ => l,
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let t = parse(&uncommented).unwrap();
        assert!(t[0].limits.servers.is_empty());
        let notes = &t[1].limits.servers;
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].name, "notes");
        assert_eq!(notes[0].command.as_deref(), Some("npx"));
        assert!(notes[0].allows("read_graph") && !notes[0].allows("delete_entities"));
    }

    #[test]
    fn the_oauth_example_file_parses_and_names_its_serve_command() {
        let text = include_str!("../../deploy/tenants.oauth.example.toml");
        let first = text.lines().next().unwrap();
        assert!(first.starts_with("# mcp-code-executor serve "), "{first}");
        for want in [
            "--tenants deploy/tenants.oauth.example.toml",
            "--public-url PUBLIC_URL",
            "--oauth-issuer ISSUER",
        ] {
            assert!(first.contains(want), "{first} lacks {want}");
        }
        let (t, rules) = parse_all(text).unwrap();
        assert_eq!(
            t.iter().find(|t| t.id == "acme").unwrap().token_sha256,
            None
        );
        assert_eq!(
            rules[0],
            Rule {
                issuer: "ISSUER".into(),
                tenant: "acme".into(),
                matches: Match::Claim {
                    name: "org".into(),
                    value: "acme".into()
                },
            }
        );
    }

    #[test]
    fn oauth_rules_are_checked() {
        let base = format!(
            "[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n[[tenants]]\nid = \"b\"\n"
        );
        let with = |rule: &str| {
            format!("{base}[[oauth_rules]]\nissuer = \"https://as\"\ntenant = \"b\"\n{rule}\n")
        };
        let (_, r) = parse_all(&with("client_id = \"ci\"")).unwrap();
        assert_eq!(r[0].matches, Match::ClientId("ci".into()));
        let (_, r) = parse_all(&with("sub = \"u1\"")).unwrap();
        assert_eq!(r[0].matches, Match::Subject("u1".into()));
        for (bad, want) in [
            (base.clone(), "nobody could reach it"),
            (with("claim = \"org\""), "exactly one"),
            (
                with("claim = \"org\"\nvalue = \"x\"\nsub = \"y\""),
                "exactly one",
            ),
            (with("sub = \"\""), "empty"),
            (
                with("").replace("tenant = \"b\"", "tenant = \"zz\""),
                "not a [[tenants]] id",
            ),
        ] {
            let e = parse_all(&bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn ids() {
        for ok in ["a", "acme", "team-1", "x_y", "0abc"] {
            assert!(valid_id(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a_",
            "A",
            "a.b",
            "a/b",
            "../x",
            "pool",
            &"a".repeat(64),
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }
}
