use super::*;
use mcp_code_executor::config::ServeConfig;
use mcp_code_executor::mcp;

/// `serve ARGS` as clap parses it, with none of the variables clap reads behind the
/// flags set (this process's environment is the test's, not the server's; the tests
/// here only ever remove them).
fn serve(args: &[&str]) -> ServeCmd {
    for v in vars::ALL {
        if v.name.starts_with("MCP_EXECUTOR_")
            || ["PORT", "CODE_STORAGE_DIR", "ENV_TYPE"].contains(&v.name)
        {
            std::env::remove_var(v.name);
        }
    }
    let mut argv = vec!["mcp-code-executor", "serve"];
    argv.extend(args);
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Serve(cmd) => *cmd,
        _ => unreachable!(),
    }
}

fn table(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn defaults_come_from_named_constants() {
    let c = serve(&[]).config(table(&[("HOME", "/h")])).unwrap();
    assert_eq!(c.http.port, mcp::defaults::PORT);
    assert_eq!(c.http.host, mcp::defaults::HOST);
    assert_eq!(c.http.allowed_hosts, mcp::defaults::ALLOWED_HOSTS);
    assert_eq!(c.max_concurrent, mcp::defaults::MAX_CONCURRENT);
    assert_eq!(c.max_queue, mcp::defaults::MAX_QUEUE);
    assert_eq!(c.max_timeout, mcp::defaults::MAX_TIMEOUT);
    assert_eq!(c.backend.pool_size, config::defaults::POOL_SIZE);
    assert_eq!(c.tenant, config::defaults::TENANT);
    assert_eq!(c.limits.cpus, defaults::CPUS);
    let data = std::path::Path::new("/h/.local/share/mcp-code-executor");
    assert_eq!(c.data_dir, data);
    assert_eq!(c.code_storage_dir, data.join("code"));
    assert_eq!(c.workspace_dir, data.join("workspaces"));
    assert!(c.backend.build_missing && c.http.metrics && !c.stdio);
    assert_eq!(c.env, config::EnvSelection::default());
}

/// `serve` with no flag and no variable is the library's [`ServeConfig::local`]: the
/// defaults clap shows are the ones the server and the MCP tests are built with.
#[test]
fn no_flag_is_the_local_configuration() {
    let c = serve(&[]).config(table(&[("HOME", "/h")])).unwrap();
    let data = std::path::PathBuf::from("/h/.local/share/mcp-code-executor");
    let local = ServeConfig {
        ca_bundle: c.ca_bundle.clone(),
        host: c.host.clone(),
        ..ServeConfig::local(data)
    };
    assert_eq!(c, local);
}

#[test]
fn flags_and_variables_without_flags_are_resolved() {
    let c = serve(&[
        "--data-dir",
        "/d",
        "--env-type",
        "venv",
        "--allowed-hosts",
        "*",
        "--no-build",
        "--ca-bundle",
        "/ca.pem",
    ])
    .config(table(&[
        ("VENV_PATH", "/srv/v"),
        ("PIP_EXTRA_INDEX_URL", "https://x/simple"),
        ("DOCKER_HOST", "unix:///run/d.sock"),
        ("MCP_EXECUTOR_DATA_DIR", "/ignored"),
    ]))
    .unwrap();
    assert_eq!(c.data_dir, std::path::Path::new("/d"));
    assert_eq!(c.code_storage_dir, std::path::Path::new("/d/code"));
    assert_eq!(c.env.env_type.as_deref(), Some("venv"));
    assert_eq!(c.env.venv_path, Some("/srv/v".into()));
    assert!(c.http.allowed_hosts.is_empty());
    assert!(!c.backend.build_missing);
    assert_eq!(c.ca_bundle, Some("/ca.pem".into()));
    assert_eq!(
        c.pip_index.extra_index_url.as_deref(),
        Some("https://x/simple")
    );
    assert_eq!(c.backend.docker_host.as_deref(), Some("unix:///run/d.sock"));
}

#[test]
fn relative_directories_are_made_absolute() {
    // Docker refuses a relative bind-mount source: what lies under the data directory is
    // mounted into sandboxes.
    let here = std::env::current_dir().unwrap();
    let c = serve(&["--data-dir", "rel/d", "--workspace-dir", "ws"])
        .config(table(&[]))
        .unwrap();
    assert_eq!(c.data_dir, here.join("rel/d"));
    assert_eq!(c.code_storage_dir, here.join("rel/d/code"));
    assert_eq!(c.workspace_dir, here.join("ws"));
    let c = serve(&[])
        .config(table(&[("MCP_EXECUTOR_DATA_DIR", "v/d")]))
        .unwrap();
    assert_eq!(c.data_dir, here.join("v/d"));
}

#[test]
fn inconsistent_flags_are_refused() {
    let e = serve(&["--timeout", "60", "--max-timeout", "30"])
        .config(table(&[]))
        .unwrap_err();
    assert!(e.to_string().contains("--max-timeout"), "{e}");
    assert!(serve(&["--stdio", "--tenants", "t.toml"])
        .config(table(&[]))
        .is_err());
}

/// The row of `docs/mcp.md`'s reference table whose first column names `var`, as its
/// columns.
fn docs_row(var: &str) -> Option<Vec<String>> {
    let doc = include_str!("../../../../docs/mcp.md");
    let section = &doc[doc.find("## Environment variables and flags")?..];
    section
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .collect::<Vec<_>>()
        })
        .find(|cols| cols.len() > 4 && cols[1].contains(&format!("`{var}`")))
}

/// Every flag backed by a variable: the variable is declared in config::vars, and its
/// docs row names the flag and clap's default.
#[test]
fn the_docs_table_matches_the_flags() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, problems: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
                continue;
            };
            let var = var.to_string_lossy();
            if !vars::ALL.iter().any(|v| v.name == var) {
                problems.push(format!("{var} (--{long}) is not declared in config::vars"));
            }
            let Some(row) = docs_row(&var) else {
                problems.push(format!("{var} has no row in docs/mcp.md"));
                continue;
            };
            if !row[2].contains(&format!("`--{long}`")) {
                problems.push(format!("the docs row of {var} does not name --{long}"));
            }
            // Several default values (a list flag) are shown as the flag takes them.
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|d| d.to_string_lossy().into_owned())
                .collect();
            let d = defaults.join(",");
            if !defaults.is_empty() && !row[3].contains(&format!("`{d}`")) {
                problems.push(format!(
                    "the docs row of {var} does not give the default `{d}`"
                ));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, problems);
        }
    }
    let mut problems = Vec::new();
    walk(&Cli::command(), &mut problems);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
