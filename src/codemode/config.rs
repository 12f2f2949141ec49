//! The code-mode file (`--tools FILE`, TOML): which MCP servers the sandboxed code may
//! call, how to reach them (a command over stdio, or a Streamable HTTP URL with its
//! headers), which of their tools, for which tenants, and within which limits. Read once at
//! start-up; an error names the file and the entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Limits of one run (or one session cell), for every server unless a server sets its own.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Tool calls one run may make (all servers together); past it `BudgetExceeded`.
    pub calls_per_run: u32,
    /// Calls of one run in flight at once; further calls wait for one to end.
    pub in_flight: u32,
    /// Seconds one call may take; past it the call is cancelled upstream and the code gets
    /// `ToolTimeout`.
    pub call_timeout_s: f64,
    /// Bytes of one call's result (its JSON), at most; larger results are an error.
    pub result_bytes: u64,
    /// Bytes of one call's arguments (its JSON), at most.
    pub argument_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            calls_per_run: 100,
            in_flight: 8,
            call_timeout_s: 30.0,
            result_bytes: 512 << 10,
            argument_bytes: 1 << 20,
        }
    }
}

impl Limits {
    pub fn call_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.call_timeout_s.clamp(0.001, 86_400.0))
    }
}

/// One upstream MCP server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// Its name in the sandbox: `from tools import NAME` (made a Python identifier).
    pub name: String,
    /// One line about it, for the `execute_code` / `execute_python` descriptions (what the
    /// model reads before it writes code); absent: the upstream's own title or name, once
    /// it has started.
    #[serde(default)]
    pub description: Option<String>,
    /// A stdio server: the program to start (found on the server's `PATH`).
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// Its environment: these variables, plus `PATH` and `HOME` of this server, and
    /// nothing else of ours.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory (default: this server's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// A Streamable HTTP server: its URL.
    #[serde(default)]
    pub url: Option<String>,
    /// HTTP headers sent with every request (credentials: they stay in this server).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The tools the code may call (MCP names; `*` or absent: all of them).
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// Tools never offered, whatever `allow` says.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Tools the operator counts as destructive besides those annotated `destructiveHint`.
    #[serde(default)]
    pub destructive: Vec<String>,
    /// Destructive tools the code may call all the same (`*`: all); the others are refused
    /// with `ToolDenied`.
    #[serde(default)]
    pub allow_destructive: Vec<String>,
    /// The tenants that see this server (absent: every tenant).
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
    /// This server's own limits (absent: the file's `[limits]`).
    #[serde(default)]
    pub call_timeout_s: Option<f64>,
    #[serde(default)]
    pub result_bytes: Option<u64>,
}

impl Server {
    pub fn allows(&self, tool: &str) -> bool {
        if self.deny.iter().any(|d| d == tool) {
            return false;
        }
        match &self.allow {
            None => true,
            Some(list) => list.iter().any(|a| a == "*" || a == tool),
        }
    }

    pub fn consented(&self, tool: &str) -> bool {
        self.allow_destructive.iter().any(|a| a == "*" || a == tool)
    }

    pub fn serves(&self, tenant: &str) -> bool {
        self.tenants
            .as_ref()
            .is_none_or(|ts| ts.iter().any(|t| t == tenant || t == "*"))
    }

    pub fn call_timeout(&self, limits: &Limits) -> Duration {
        match self.call_timeout_s {
            Some(s) => Duration::from_secs_f64(s.clamp(0.001, 86_400.0)),
            None => limits.call_timeout(),
        }
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub servers: Vec<Server>,
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut names = std::collections::BTreeSet::new();
        for s in &c.servers {
            if s.name.trim().is_empty() {
                return Err("a [[servers]] entry has an empty name".into());
            }
            if !names.insert(super::names::module(&s.name)) {
                return Err(format!(
                    "server `{}`: another server has the same Python name",
                    s.name
                ));
            }
            match (&s.command, &s.url) {
                (Some(_), None) | (None, Some(_)) => {}
                _ => {
                    return Err(format!(
                        "server `{}`: give exactly one of `command` (stdio) and `url` (Streamable HTTP)",
                        s.name
                    ))
                }
            }
            if s.command.is_some() && !s.headers.is_empty() {
                return Err(format!(
                    "server `{}`: `headers` are for a `url` server",
                    s.name
                ));
            }
        }
        if c.limits.calls_per_run == 0 || c.limits.in_flight == 0 {
            return Err("[limits]: calls_per_run and in_flight must be at least 1".into());
        }
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the tools file {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| format!("the tools file {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_with_both_kinds_parses() {
        let c = Config::parse(
            r#"
            [limits]
            calls_per_run = 5
            [[servers]]
            name = "everything"
            command = "npx"
            args = ["-y", "@modelcontextprotocol/server-everything"]
            env = { TOKEN = "x" }
            allow = ["echo", "get-sum"]
            [[servers]]
            name = "remote"
            url = "http://127.0.0.1:9/mcp"
            headers = { Authorization = "Bearer s" }
            tenants = ["a"]
            allow_destructive = ["*"]
            "#,
        )
        .unwrap();
        assert_eq!(c.limits.calls_per_run, 5);
        assert_eq!(c.limits.in_flight, 8);
        let e = &c.servers[0];
        assert!(e.allows("echo") && !e.allows("get-env"));
        assert!(e.serves("anyone") && !e.consented("write"));
        let r = &c.servers[1];
        assert!(r.allows("anything") && r.consented("write"));
        assert!(r.serves("a") && !r.serves("b"));
    }

    #[test]
    fn the_deploy_example_parses_and_says_how_to_serve_it() {
        let text = include_str!("../../deploy/code-mode.example.toml");
        assert_eq!(
            text.lines().next(),
            Some("# mcp-code-executor serve --tools deploy/code-mode.example.toml")
        );
        let c = Config::parse(text).unwrap();
        assert_eq!(c.servers[0].name, "everything");
        assert_eq!(c.servers[0].command.as_deref(), Some("npx"));
    }

    #[test]
    fn bad_files_are_refused() {
        for bad in [
            "[[servers]]\nname = \"x\"\n",
            "[[servers]]\nname = \"x\"\ncommand = \"a\"\nurl = \"http://h\"\n",
            "[[servers]]\nname = \"a-b\"\ncommand = \"a\"\n[[servers]]\nname = \"a_b\"\ncommand = \"b\"\n",
            "[[servers]]\nname = \"x\"\ncommand = \"a\"\nheaders = { A = \"b\" }\n",
            "[[servers]]\nname = \"x\"\ncommand = \"a\"\ntypo = 1\n",
            "[limits]\ncalls_per_run = 0\n",
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
        let mut deny =
            Config::parse("[[servers]]\nname = \"x\"\ncommand = \"a\"\ndeny = [\"rm\"]\n")
                .unwrap()
                .servers
                .remove(0);
        assert!(!deny.allows("rm") && deny.allows("ls"));
        deny.allow = Some(vec!["*".into()]);
        assert!(!deny.allows("rm"));
    }
}
