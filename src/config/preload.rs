//! What waiting sandboxes preload (`--preload`, the tenants file's `preload`): plain
//! configuration and its parsing. What the runner reports and what the server learns
//! from runs are the backend's ([`crate::backend::preload`]).

use std::collections::BTreeMap;

/// The modules preloaded by default, each only where the environment has it.
pub const DEFAULT_MODULES: &[&str] = &["numpy", "pandas", "matplotlib.pyplot"];
/// Learned modules added to a pool's list, at most (default).
pub const DEFAULT_LEARN_MAX: usize = 4;
/// Percent of a sandbox's memory limit its preloaded interpreter may hold (default).
pub const DEFAULT_MEMORY_PERCENT: u8 = 50;
/// The longest module name taken.
const MAX_NAME_LEN: usize = 200;

/// What waiting sandboxes preload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreloadConfig {
    /// The server's list (dotted names allowed: `matplotlib.pyplot`).
    pub modules: Vec<String>,
    /// Tenants whose tenants-file entry names its own list, instead of `modules`.
    pub per_tenant: BTreeMap<String, Vec<String>>,
    /// Learn from the modules runs import.
    pub learn: bool,
    /// Learned modules added to a pool's list, at most.
    pub learn_max: usize,
    /// Percent of the sandbox's memory limit the preloaded interpreter may hold; past it
    /// the module that crossed it and the rest are dropped for that pool.
    pub memory_percent: u8,
}

impl PreloadConfig {
    /// Nothing preloaded, nothing learned (the library default and `run`).
    pub fn off() -> Self {
        PreloadConfig {
            modules: Vec::new(),
            per_tenant: BTreeMap::new(),
            learn: false,
            learn_max: DEFAULT_LEARN_MAX,
            memory_percent: DEFAULT_MEMORY_PERCENT,
        }
    }

    /// `serve`'s default: [`DEFAULT_MODULES`], learning on.
    pub fn server_default() -> Self {
        PreloadConfig {
            modules: DEFAULT_MODULES.iter().map(|s| s.to_string()).collect(),
            learn: true,
            ..Self::off()
        }
    }

    /// The configured list of the pool `key` (a tenant id, or the shared pool's key).
    pub fn modules_for(&self, key: &str) -> &[String] {
        self.per_tenant.get(key).unwrap_or(&self.modules)
    }

    /// Anything to do at all?
    pub fn enabled(&self) -> bool {
        self.learn || !self.modules.is_empty() || self.per_tenant.values().any(|l| !l.is_empty())
    }
}

impl Default for PreloadConfig {
    fn default() -> Self {
        Self::off()
    }
}

/// `--preload`: comma-separated module names; empty or `none`: nothing.
pub fn parse_modules(s: &str) -> Result<Vec<String>, String> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut out: Vec<String> = Vec::new();
    for n in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !valid_name(n) {
            return Err(format!(
                "`{n}` is not a module name (like numpy or matplotlib.pyplot)"
            ));
        }
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

/// A dotted Python module name of ASCII identifiers.
pub fn valid_name(n: &str) -> bool {
    n.len() <= MAX_NAME_LEN
        && n.split('.').all(|p| {
            let mut c = p.chars();
            matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
                && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}
