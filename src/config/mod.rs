//! Configuration shared by the commands: every environment variable is declared here once,
//! with the parsing of human sizes and durations and the checks that give clear errors.

use std::time::Duration;

use crate::job::Limits;

/// Environment variables. Each has a CLI flag of the same meaning; the flag wins.
pub mod vars {
    /// Wall-clock limit of a run, seconds.
    pub const TIMEOUT: &str = "MCP_EXECUTOR_TIMEOUT";
    /// Memory limit of a run (`512m`, `1g`, bytes).
    pub const MEMORY: &str = "MCP_EXECUTOR_MEMORY";
    /// CPU quota of a run, in cores.
    pub const CPUS: &str = "MCP_EXECUTOR_CPUS";
    /// Process/thread limit of a run.
    pub const PIDS: &str = "MCP_EXECUTOR_PIDS";
    /// Bytes kept of stdout and of stderr, each.
    pub const OUTPUT_LIMIT: &str = "MCP_EXECUTOR_OUTPUT_LIMIT";
    /// Size of the `/workspace` tmpfs.
    pub const WORKSPACE_SIZE: &str = "MCP_EXECUTOR_WORKSPACE_SIZE";
    /// The sandbox image (default: the tag that matches this binary).
    pub const IMAGE: &str = "MCP_EXECUTOR_IMAGE";
    /// OCI runtime for sandboxes (`runc` by default; `crun` where the daemon has it).
    pub const RUNTIME: &str = "MCP_EXECUTOR_RUNTIME";
    /// The Docker daemon (read by the Docker client itself).
    pub const DOCKER_HOST: &str = "DOCKER_HOST";
    /// Where managed environments live.
    pub const DATA_DIR: &str = "MCP_EXECUTOR_DATA_DIR";
    /// CA bundle (PEM) that installer containers trust.
    pub const CA_BUNDLE: &str = "MCP_EXECUTOR_CA_BUNDLE";
    /// Sandboxes `serve` keeps started and waiting (0: no warm pool).
    pub const POOL_SIZE: &str = "MCP_EXECUTOR_POOL_SIZE";
}

/// The data directory: `MCP_EXECUTOR_DATA_DIR`, else `$XDG_DATA_HOME/mcp-code-executor`,
/// else `~/.local/share/mcp-code-executor`.
pub fn data_dir(get: impl Fn(&str) -> Option<String>) -> std::path::PathBuf {
    use std::path::PathBuf;
    let get = |k: &str| get(k).filter(|v| !v.is_empty());
    if let Some(d) = get(vars::DATA_DIR) {
        return PathBuf::from(d);
    }
    if let Some(x) = get("XDG_DATA_HOME") {
        return PathBuf::from(x).join("mcp-code-executor");
    }
    let home = get("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".local/share/mcp-code-executor")
}

/// The CA bundle installers trust: `MCP_EXECUTOR_CA_BUNDLE`, else the host's system bundle.
pub fn ca_bundle(get: impl Fn(&str) -> Option<String>) -> Option<std::path::PathBuf> {
    match get(vars::CA_BUNDLE).filter(|v| !v.is_empty()) {
        Some(p) => Some(p.into()),
        None => crate::env::manager::EnvManager::default_ca_bundle(),
    }
}

/// A value that could not be understood, with the input named.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("`{value}` is not a size: use bytes or a number with k, m or g (e.g. 512m)")]
    BadSize { value: String },
    #[error("`{value}` is not a duration in seconds (e.g. 30 or 2.5)")]
    BadDuration { value: String },
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
}
