//! The code-mode file (`--tools FILE`, TOML): which MCP servers the sandboxed code may
//! call, how to reach them (a command over stdio, or a Streamable HTTP URL with its
//! headers), which of their tools, for which tenants, and within which limits. Read once at
//! start-up; an error names the file and the entry.
//!
//! A tenant of the tenants file may declare servers of its own (`[[tenants.servers]]`, the
//! same [`Server`] entry less `tenants`): [`Config::add_tenant`] puts them beside the tools
//! file's, seen by that tenant alone.

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
    /// Bytes of one call's request (its JSON, arguments included), at most; larger
    /// requests are refused before their arguments are parsed.
    pub argument_bytes: u64,
    /// Bytes all calls of one run may hold at once, waiting or in flight: each call's
    /// request weighed with the memory its arguments take once parsed (10 to 50 times
    /// their JSON for lists of small values). A call that would go over is refused at
    /// once (`ToolError`), so one run holds at most this much of the server's memory.
    pub pending_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            calls_per_run: 100,
            in_flight: 8,
            call_timeout_s: 30.0,
            result_bytes: 512 << 10,
            argument_bytes: 1 << 20,
            pending_bytes: 64 << 20,
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

    /// What every entry must be, in the tools file or the tenants file: a name, exactly one
    /// of `command` and `url`, headers only for a `url`.
    pub fn check(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("a server entry has an empty name".into());
        }
        match (&self.command, &self.url) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => {
                return Err(format!(
                "server `{}`: give exactly one of `command` (stdio) and `url` (Streamable HTTP)",
                self.name
            ))
            }
        }
        if self.command.is_some() && !self.headers.is_empty() {
            return Err(format!(
                "server `{}`: `headers` are for a `url` server",
                self.name
            ));
        }
        Ok(())
    }
}

/// Check the servers a tenant of the tenants file declares (`[[tenants.servers]]`): each a
/// valid entry, none with `tenants` (it is that tenant's), no two with the same Python name.
pub fn check_tenant_servers(servers: &[Server]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for s in servers {
        s.check()?;
        if s.tenants.is_some() {
            return Err(format!(
                "server `{}`: `tenants` is for the tools file; a server in the tenants file is its tenant's alone",
                s.name
            ));
        }
        if !seen.insert(super::names::module(&s.name)) {
            return Err(format!(
                "server `{}`: another server of this tenant has the same Python name",
                s.name
            ));
        }
    }
    Ok(())
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub servers: Vec<Server>,
    /// The tenants file's servers (`[[tenants.servers]]`), by tenant: each seen by its
    /// tenant alone, beside the `servers` that serve it ([`Config::add_tenant`]).
    #[serde(skip)]
    pub tenant_servers: BTreeMap<String, Vec<Server>>,
}

impl Config {
    pub fn parse(text: &str) -> Result<Config, String> {
        let c: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut names = std::collections::BTreeSet::new();
        for s in &c.servers {
            s.check()?;
            if !names.insert(super::names::module(&s.name)) {
                return Err(format!(
                    "server `{}`: another server has the same Python name",
                    s.name
                ));
            }
        }
        if c.limits.calls_per_run == 0 || c.limits.in_flight == 0 {
            return Err("[limits]: calls_per_run and in_flight must be at least 1".into());
        }
        if c.limits.pending_bytes < c.limits.argument_bytes {
            return Err("[limits]: pending_bytes must be at least argument_bytes".into());
        }
        Ok(c)
    }

    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("the tools file {}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| format!("the tools file {}: {e}", path.display()))
    }

    /// The servers `tenant` sees: the tools file's that serve it, then its own from the
    /// tenants file.
    pub fn servers_for<'a, 't>(
        &'a self,
        tenant: &'t str,
    ) -> impl Iterator<Item = &'a Server> + use<'a, 't> {
        self.servers
            .iter()
            .filter(move |s| s.serves(tenant))
            .chain(self.tenant_servers.get(tenant).into_iter().flatten())
    }

    /// Every server with the tenant it is reserved to (`None`: the tools file's).
    pub fn all_servers(&self) -> impl Iterator<Item = (Option<&str>, &Server)> {
        self.servers.iter().map(|s| (None, s)).chain(
            self.tenant_servers
                .iter()
                .flat_map(|(t, v)| v.iter().map(move |s| (Some(t.as_str()), s))),
        )
    }

    /// The server of `tenant` named `name` (its MCP config name, as a call names it).
    pub fn server_of(&self, tenant: &str, name: &str) -> Option<&Server> {
        self.servers_for(tenant).find(|s| s.name == name)
    }

    /// Add `tenant`'s own servers (from the tenants file, checked by
    /// [`check_tenant_servers`]). A server with the Python name of one the tenant already
    /// sees (a tools-file server that serves it, or another of its own) is an error: the
    /// code could not tell them apart.
    pub fn add_tenant(&mut self, tenant: &str, servers: &[Server]) -> Result<(), String> {
        check_tenant_servers(servers).map_err(|e| format!("tenant `{tenant}`: {e}"))?;
        for s in servers {
            let module = super::names::module(&s.name);
            if let Some(o) = self
                .servers_for(tenant)
                .find(|o| super::names::module(&o.name) == module)
            {
                return Err(format!(
                    "tenant `{tenant}`: its server `{}` (tenants file) has the Python name `{module}` of the tools file's server `{}`, which this tenant sees too: rename one of them (or leave the tenant out of the tools file server's `tenants`)",
                    s.name, o.name
                ));
            }
        }
        if !servers.is_empty() {
            self.tenant_servers
                .entry(tenant.to_string())
                .or_default()
                .extend_from_slice(servers);
        }
        Ok(())
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

    fn server(name: &str) -> Server {
        Config::parse(&format!(
            "[[servers]]\nname = \"{name}\"\ncommand = \"x\"\n"
        ))
        .unwrap()
        .servers
        .remove(0)
    }

    #[test]
    fn a_tenants_servers_are_its_own_beside_the_tools_files() {
        let mut c = Config::parse(
            "[[servers]]\nname = \"shared\"\ncommand = \"a\"\n\
             [[servers]]\nname = \"crm\"\ncommand = \"b\"\ntenants = [\"b\"]\n",
        )
        .unwrap();
        // `a` may call its own server `crm`: the tools file's `crm` is `b`'s, not `a`'s.
        c.add_tenant("a", &[server("crm"), server("notes")])
            .unwrap();
        c.add_tenant("c", &[server("notes")]).unwrap();
        fn names<'a>(c: &'a Config, t: &str) -> Vec<&'a str> {
            c.servers_for(t).map(|s| s.name.as_str()).collect()
        }
        assert_eq!(names(&c, "a"), ["shared", "crm", "notes"]);
        assert_eq!(names(&c, "b"), ["shared", "crm"]);
        assert_eq!(names(&c, "c"), ["shared", "notes"]);
        assert_eq!(names(&c, "d"), ["shared"]);
        assert_eq!(
            c.server_of("a", "crm").unwrap().command.as_deref(),
            Some("x")
        );
        assert_eq!(
            c.server_of("b", "crm").unwrap().command.as_deref(),
            Some("b")
        );
        assert!(c.server_of("b", "notes").is_none() && c.server_of("d", "crm").is_none());
        let tagged: Vec<(Option<&str>, &str)> =
            c.all_servers().map(|(t, s)| (t, s.name.as_str())).collect();
        assert_eq!(
            tagged,
            [
                (None, "shared"),
                (None, "crm"),
                (Some("a"), "crm"),
                (Some("a"), "notes"),
                (Some("c"), "notes")
            ]
        );
    }

    #[test]
    fn a_tenants_server_named_as_a_tools_file_server_it_sees_is_refused() {
        let mut c = Config::parse(
            "[[servers]]\nname = \"shared-one\"\ncommand = \"a\"\n\
             [[servers]]\nname = \"crm\"\ncommand = \"b\"\ntenants = [\"b\"]\n",
        )
        .unwrap();
        // The same name, and a name that is the same in Python.
        for clash in ["shared-one", "shared_one"] {
            let e = c.add_tenant("a", &[server(clash)]).unwrap_err();
            assert!(
                e.contains("tenant `a`") && e.contains("`shared-one`") && e.contains("rename"),
                "{e}"
            );
        }
        let e = c.add_tenant("b", &[server("crm")]).unwrap_err();
        assert!(e.contains("tenant `b`") && e.contains("`crm`"), "{e}");
        // Nothing was added by the refused calls.
        assert!(c.tenant_servers.is_empty());
        // Within one tenant, two with one Python name; and `tenants` has no place there.
        let e = c
            .add_tenant("a", &[server("x-y"), server("x_y")])
            .unwrap_err();
        assert!(e.contains("same Python name"), "{e}");
        let mut scoped = server("z");
        scoped.tenants = Some(vec!["a".into()]);
        let e = c.add_tenant("a", &[scoped]).unwrap_err();
        assert!(e.contains("`tenants` is for the tools file"), "{e}");
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
