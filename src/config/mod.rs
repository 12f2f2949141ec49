//! Configuration shared by the commands: every environment variable is declared here once
//! ([`vars`]), `serve`'s configuration is one typed value built once ([`ServeConfig`]), with
//! the parsing of human sizes and durations and the checks that give clear errors.
//!
//! This module sits next to the leaf of the module graph (it depends on [`crate::job`]
//! only), so every layer may use it. Nothing here reads the process environment behind a
//! caller's back: functions take a `get` (a variable's value by name), which the binary's
//! edge gives as `std::env::var`; [`HostEnv::from_process`] is the one exception, and says
//! so.

use std::path::PathBuf;
use std::time::Duration;

use crate::job::Limits;

pub mod preload;
pub mod serve;
pub mod traces;
pub mod vars;

pub use serve::{BackendConfig, HttpBounds, HttpConfig, KubeSettings, ServeConfig, SessionLimits};

/// Named defaults that have no better home (the MCP layer keeps its own in
/// `mcp::defaults`, the run limits theirs in [`crate::job::defaults`]).
pub mod defaults {
    use std::time::Duration;

    /// Sandboxes `serve` keeps started and waiting.
    pub const POOL_SIZE: usize = 2;
    /// The tenant of a server without a tenants file: the label on its containers.
    pub const TENANT: &str = crate::job::LOCAL_TENANT;
    /// The host's system CA bundle (Debian's path), trusted by installs when no other is
    /// configured: it carries a TLS-intercepting proxy's CA where the host trusts one.
    pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
    /// Bytes of stored code and workspace files of every tenant together.
    pub const STORAGE_LIMIT_TOTAL: u64 = 10 << 30;
    /// The scope an OAuth access token must carry.
    pub const OAUTH_SCOPE: &str = "mcp";
    /// How long `serve`'s whole shutdown may take, from SIGTERM to the end of the process
    /// (under Kubernetes' default grace period of 30 s); past it what is left is abandoned.
    pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(25);
    /// Of [`SHUTDOWN_LIMIT`], how long execute_python calls get to stop and sessions to
    /// close before the backend is shut down anyway.
    pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(10);
    /// Of [`SHUTDOWN_LIMIT`], what is left for the backend to remove its sandboxes after
    /// [`SHUTDOWN_DEADLINE`]; what is still there then goes to the next start-up sweep.
    pub const DRAIN_DEADLINE: Duration = SHUTDOWN_LIMIT.saturating_sub(SHUTDOWN_DEADLINE);
    /// The healthcheck's URL: the default address's `/healthz`.
    pub const HEALTHCHECK_URL: &str = "http://127.0.0.1:4000/healthz";
}

/// `get(name)`, with an empty (or blank) value taken as unset. A `get` reads one variable,
/// as `std::env::var(k).ok()` does: every function here takes one, so that tests give a
/// table and only the binary's edge hands in the process environment.
fn non_empty(get: &impl Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name).filter(|v| !v.trim().is_empty())
}

/// The data directory: `MCP_EXECUTOR_DATA_DIR`, else `$XDG_DATA_HOME/mcp-code-executor`,
/// else `~/.local/share/mcp-code-executor` (`/tmp/...` without a `HOME`).
pub fn data_dir(get: impl Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(d) = non_empty(&get, vars::MCP_EXECUTOR_DATA_DIR) {
        return PathBuf::from(d);
    }
    if let Some(x) = non_empty(&get, vars::XDG_DATA_HOME) {
        return PathBuf::from(x).join("mcp-code-executor");
    }
    let home = non_empty(&get, vars::HOME).unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".local/share/mcp-code-executor")
}

/// [`data_dir`] from this process's environment (for a command given no data directory).
pub fn process_data_dir() -> PathBuf {
    data_dir(|k| std::env::var(k).ok())
}

/// A variable the operator names in a file rather than one of ours (an egress rule's
/// header, `{ env = "VAR" }`): its value, `None` when unset or not UTF-8. The only read of
/// a variable not declared in `vars.rs`, as its name is the operator's.
pub fn operator_variable(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The CA bundle installers trust: `MCP_EXECUTOR_CA_BUNDLE`, else
/// [`default_ca_bundle`].
pub fn ca_bundle(get: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    match non_empty(&get, vars::MCP_EXECUTOR_CA_BUNDLE) {
        Some(p) => Some(p.into()),
        None => default_ca_bundle(),
    }
}

/// The host's system bundle ([`defaults::SYSTEM_CA_BUNDLE`]) when it exists.
pub fn default_ca_bundle() -> Option<PathBuf> {
    let p = PathBuf::from(defaults::SYSTEM_CA_BUNDLE);
    p.exists().then_some(p)
}

/// The Python environment asked for by `ENV_TYPE` and its companions, as given (the `env`
/// module decides what it means: [`crate::env::state::request_from`]). Blank values are
/// unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvSelection {
    /// `ENV_TYPE` (or `--env-type`): `conda`, `venv`, `venv-uv`, `default`.
    pub env_type: Option<String>,
    pub conda_env_name: Option<String>,
    pub venv_path: Option<PathBuf>,
    pub uv_venv_path: Option<PathBuf>,
}

impl EnvSelection {
    /// From the four variables.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        EnvSelection {
            env_type: non_empty(&get, vars::ENV_TYPE),
            conda_env_name: non_empty(&get, vars::CONDA_ENV_NAME),
            venv_path: non_empty(&get, vars::VENV_PATH).map(PathBuf::from),
            uv_venv_path: non_empty(&get, vars::UV_VENV_PATH).map(PathBuf::from),
        }
    }
}

/// The package indexes the fetch phase of installs uses (PyPI when both are unset). They
/// reach the installer container as the same pip variables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipIndex {
    pub index_url: Option<String>,
    pub extra_index_url: Option<String>,
}

impl PipIndex {
    /// From `PIP_INDEX_URL` and `PIP_EXTRA_INDEX_URL`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        PipIndex {
            index_url: non_empty(&get, vars::PIP_INDEX_URL),
            extra_index_url: non_empty(&get, vars::PIP_EXTRA_INDEX_URL),
        }
    }

    /// The variables to set in the installer container.
    pub fn container_vars(&self) -> Vec<(String, String)> {
        [
            (vars::PIP_INDEX_URL, &self.index_url),
            (vars::PIP_EXTRA_INDEX_URL, &self.extra_index_url),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v.clone()?)))
        .collect()
    }
}

/// Facts about the host that environment resolution uses (`env::Context`): read from the
/// process environment here, and only here, in the library.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    pub home: Option<PathBuf>,
    /// `CONDA_EXE`, set by conda's shell hook.
    pub conda_exe: Option<PathBuf>,
    /// `PATH`, searched for `conda` when `CONDA_EXE` is unset.
    pub path: Option<std::ffi::OsString>,
    /// `MCP_EXECUTOR_ENV_ROOTS`: directories (`:`-separated, absolute) under which a
    /// single-tenant server's configure_environment may pick an environment, besides the
    /// data directory and the configured environment.
    pub env_roots: Vec<PathBuf>,
}

/// `:`-separated absolute paths (others are ignored).
fn path_list(v: Option<std::ffi::OsString>) -> Vec<PathBuf> {
    v.map(|v| {
        std::env::split_paths(&v)
            .filter(|p| p.is_absolute())
            .collect()
    })
    .unwrap_or_default()
}

impl HostEnv {
    /// The process's `HOME`, `CONDA_EXE` and `PATH`.
    pub fn from_process() -> Self {
        HostEnv {
            home: std::env::var_os(vars::HOME).map(PathBuf::from),
            conda_exe: std::env::var_os(vars::CONDA_EXE).map(PathBuf::from),
            path: std::env::var_os(vars::PATH),
            env_roots: path_list(std::env::var_os(vars::MCP_EXECUTOR_ENV_ROOTS)),
        }
    }

    /// The same from `get` (the configuration's view of the environment).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        HostEnv {
            home: get(vars::HOME).map(PathBuf::from),
            conda_exe: get(vars::CONDA_EXE).map(PathBuf::from),
            path: get(vars::PATH).map(std::ffi::OsString::from),
            env_roots: path_list(get(vars::MCP_EXECUTOR_ENV_ROOTS).map(Into::into)),
        }
    }
}

/// A value that could not be understood, with the input named.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("`{value}` is not a size: use bytes or a number with k, m or g (e.g. 512m)")]
    BadSize { value: String },
    #[error("`{value}` is not a duration in seconds (e.g. 30 or 2.5)")]
    BadDuration { value: String },
    #[error("--max-timeout ({max:?}) is below --timeout ({timeout:?})")]
    TimeoutAboveMax { timeout: Duration, max: Duration },
    #[error("--memory-budget ({budget} bytes) is below --memory ({memory} bytes): no run would fit in it")]
    MemoryBudgetBelowRun { budget: u64, memory: u64 },
    #[error(
        "--tenants is for the HTTP transports; over stdio the server has one client and no tokens"
    )]
    TenantsOverStdio,
    #[error("{what} must be {rule}, got {value}")]
    OutOfRange {
        what: &'static str,
        rule: &'static str,
        value: String,
    },
}

/// Parse `512m`, `1g`, `64KiB`, `1048576` into bytes (binary units).
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let bad = || ConfigError::BadSize {
        value: s.to_string(),
    };
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some(c) if c.is_ascii_digit() => (t, 1),
        _ => return Err(bad()),
    };
    let n: f64 = num.trim().parse().map_err(|_| bad())?;
    if !n.is_finite() || n < 0.0 {
        return Err(bad());
    }
    Ok((n * mult as f64) as u64)
}

/// Parse seconds (`30`, `2.5`, `10s`).
pub fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    let t = s.trim().trim_end_matches('s');
    match t.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(Duration::from_secs_f64(n)),
        _ => Err(ConfigError::BadDuration {
            value: s.to_string(),
        }),
    }
}

/// A size as the flags take and show it (`512m`): clap reads a default of this type from its
/// named constant (`default_value_t`), so the flag, its help and the docs test show the one
/// value declared in a `defaults` module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl std::fmt::Display for Bytes {
    /// The largest binary unit that divides it exactly: `512m`, `1g`, `1536`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        for (unit, shift) in [("g", 30), ("m", 20), ("k", 10)] {
            if n != 0 && n.is_multiple_of(1u64 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n}")
    }
}

impl std::str::FromStr for Bytes {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Bytes, ConfigError> {
        parse_size(s).map(Bytes)
    }
}

/// A duration as the flags take and show it (seconds: `30`, `2.5`); see [`Bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secs(pub Duration);

impl std::fmt::Display for Secs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.subsec_nanos() == 0 {
            write!(f, "{}", self.0.as_secs())
        } else {
            write!(f, "{}", self.0.as_secs_f64())
        }
    }
}

impl std::str::FromStr for Secs {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Secs, ConfigError> {
        parse_duration(s).map(Secs)
    }
}

/// Refuse limits that cannot work, naming the one at fault.
pub fn validate_limits(l: &Limits) -> Result<(), ConfigError> {
    let range = |what, rule, ok: bool, value: String| {
        if ok {
            Ok(())
        } else {
            Err(ConfigError::OutOfRange { what, rule, value })
        }
    };
    range(
        "the memory limit",
        "at least 16 MiB",
        l.memory_bytes >= 16 << 20,
        l.memory_bytes.to_string(),
    )?;
    range(
        "the CPU quota",
        "between 0.01 and 64 cores",
        (0.01..=64.0).contains(&l.cpus),
        l.cpus.to_string(),
    )?;
    range(
        "the pids limit",
        "between 8 and 65536",
        (8..=65536).contains(&l.pids),
        l.pids.to_string(),
    )?;
    range(
        "the timeout",
        "at most 24 hours",
        l.timeout <= Duration::from_secs(86400),
        format!("{:?}", l.timeout),
    )?;
    range(
        "the workspace size",
        "at least 1 MiB",
        l.workspace_bytes >= 1 << 20,
        l.workspace_bytes.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A default shown by clap parses back to itself: what `--help` and the docs show is
    /// the value used.
    #[test]
    fn sizes_and_durations_show_as_they_parse() {
        for n in [0u64, 1536, 1 << 20, 512 << 20, 1 << 30, 10 << 30, 3 << 10] {
            let shown = Bytes(n).to_string();
            assert_eq!(shown.parse::<Bytes>().unwrap(), Bytes(n), "{shown}");
        }
        assert_eq!(Bytes(512 << 20).to_string(), "512m");
        assert_eq!(Bytes(10 << 30).to_string(), "10g");
        for d in [Duration::from_secs(30), Duration::from_millis(2500)] {
            let shown = Secs(d).to_string();
            assert_eq!(shown.parse::<Secs>().unwrap(), Secs(d), "{shown}");
        }
        assert_eq!(Secs(Duration::from_secs(2592000)).to_string(), "2592000");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("1MB").unwrap(), 1 << 20);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        for bad in ["", "m", "lots", "-1m", "1t"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("2.5s").unwrap(), Duration::from_millis(2500));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn data_dir_follows_the_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            data_dir(vars(&[("MCP_EXECUTOR_DATA_DIR", "/srv/d"), ("HOME", "/h")])),
            std::path::Path::new("/srv/d")
        );
        assert_eq!(
            data_dir(vars(&[("XDG_DATA_HOME", "/x"), ("HOME", "/h")])),
            std::path::Path::new("/x/mcp-code-executor")
        );
        assert_eq!(
            data_dir(vars(&[("HOME", "/h")])),
            std::path::Path::new("/h/.local/share/mcp-code-executor")
        );
    }

    #[test]
    fn limits_are_checked() {
        assert!(validate_limits(&Limits::default()).is_ok());
        let l = Limits {
            memory_bytes: 1,
            ..Limits::default()
        };
        let e = validate_limits(&l).unwrap_err().to_string();
        assert!(e.contains("memory"), "{e}");
        let l = Limits {
            pids: 1,
            ..Limits::default()
        };
        assert!(validate_limits(&l)
            .unwrap_err()
            .to_string()
            .contains("pids"));
    }

    #[test]
    fn pip_index_reaches_the_installer_as_the_same_variables() {
        let get = |k: &str| (k == vars::PIP_INDEX_URL).then(|| "https://m/simple".to_string());
        let p = PipIndex::from_vars(get);
        assert_eq!(
            p.container_vars(),
            [("PIP_INDEX_URL".to_string(), "https://m/simple".to_string())]
        );
        assert!(PipIndex::from_vars(|_| Some(" ".into()))
            .container_vars()
            .is_empty());
    }

    #[test]
    fn env_selection_takes_blank_as_unset() {
        let s = EnvSelection::from_vars(|k| match k {
            "ENV_TYPE" => Some("venv".into()),
            "VENV_PATH" => Some("/srv/v".into()),
            _ => Some("".into()),
        });
        assert_eq!(s.env_type.as_deref(), Some("venv"));
        assert_eq!(s.venv_path, Some("/srv/v".into()));
        assert_eq!(s.conda_env_name, None);
        assert_eq!(s.uv_venv_path, None);
    }

    /// The rows of the reference table in `docs/mcp.md`: the names in backticks of each
    /// row's first column.
    fn documented_variables() -> Vec<String> {
        let doc = include_str!("../../docs/mcp.md");
        let start = doc
            .find("## Environment variables and flags")
            .expect("docs/mcp.md has an \"Environment variables and flags\" section");
        let section = &doc[start..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
        let mut names = Vec::new();
        for row in section.lines().filter(|l| l.starts_with('|')) {
            let first = row.split('|').nth(1).unwrap_or("");
            names.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
        }
        names
    }

    #[test]
    fn every_variable_is_in_the_docs_table() {
        let documented = documented_variables();
        let missing: Vec<_> = vars::ALL
            .iter()
            .map(|v| v.name)
            .filter(|n| !documented.iter().any(|d| d == n))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/mcp.md (\"Environment variables and flags\") has no row for {missing:?}"
        );
        // And the table names nothing that is not declared.
        let unknown: Vec<_> = documented
            .iter()
            .filter(|d| {
                !vars::ALL.iter().any(|v| v.name == *d) && !vars::COMPOSE_ONLY.contains(&d.as_str())
            })
            .collect();
        assert!(
            unknown.is_empty(),
            "docs/mcp.md documents {unknown:?}, which src/config/vars.rs does not declare"
        );
    }

    /// Files under src/ that may read the process environment: this module, and the
    /// binary's edge (clap's `env = ...`, `.env`, the log filter).
    const MAY_READ_ENV: &[&str] = &[
        "src/config/",
        "src/bin/mcp-code-executor/args",
        "src/bin/mcp-code-executor/main.rs",
    ];

    fn rust_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn only_config_and_the_binary_edge_read_the_environment() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        rust_files(&root.join("src"), &mut files);
        let reads = ["env::var(", "env::var_os(", "env::vars(", "env::vars_os("];
        let mut offenders = Vec::new();
        for f in files {
            let rel = f.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if MAY_READ_ENV.iter().any(|p| rel.starts_with(p)) {
                continue;
            }
            let text = std::fs::read_to_string(&f).unwrap();
            let reading: Vec<_> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim_start().starts_with("//"))
                .filter(|(_, l)| reads.iter().any(|r| l.contains(r)))
                .map(|(i, l)| format!("{rel}:{}: {}", i + 1, l.trim()))
                .collect();
            offenders.extend(reading);
        }
        assert!(
            offenders.is_empty(),
            "read the process environment outside src/config (declare the variable in \
             src/config/vars.rs and take its value from the configuration):\n{}",
            offenders.join("\n")
        );
    }
}
