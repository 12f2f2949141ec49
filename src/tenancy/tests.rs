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
        format!(
            "[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n[[tenants.servers]]\n{body}\n"
        )
    };
    for (body, want) in [
        (
            "name = \"x\"\ncommand = \"c\"\ntypo = 1",
            "unknown field `typo`",
        ),
        (
            "name = \"x\"\ncommand = \"c\"\ntenants = [\"b\"]",
            "`tenants` is for the tools file",
        ),
        ("name = \"x\"", "exactly one of `command`"),
        (
            "name = \"x\"\ncommand = \"c\"\nheaders = { A = \"b\" }",
            "`headers` are for a `url` server",
        ),
        ("name = \"\"\ncommand = \"c\"", "empty name"),
        (
            "name = \"x-y\"\ncommand = \"c\"\n[[tenants.servers]]\nname = \"x_y\"\ncommand = \"d\"",
            "same Python name",
        ),
    ] {
        let e = parse(&entry(body)).unwrap_err();
        assert!(e.contains(want), "{body}: {e}");
        assert!(
            e.contains("unknown field") || e.contains("tenant `a`"),
            "{body}: {e}"
        );
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
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_alphabetic() || c == '[') => rest,
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
    let base =
        format!("[[tenants]]\nid = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n[[tenants]]\nid = \"b\"\n");
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
