//! Installs over a recording fake backend: the two phases' jobs, answers and scratch.

use super::answers::few;
use super::*;
use crate::env::testing::{tempdir, Recorder};

fn env_at(prefix: &Path, kind: EnvKind, base: Option<PathBuf>) -> Environment {
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    Environment {
        kind,
        prefix: prefix.to_path_buf(),
        python: prefix.join("bin/python"),
        base,
        version: None,
    }
}

fn install<'a>(env: &'a Environment, specs: &'a [String], caps: InstallCaps) -> Install<'a> {
    Install {
        env,
        python_version: "3.11.2",
        tenant: "acme",
        specs,
        caps,
    }
}

#[tokio::test]
async fn hostile_specs_are_refused_before_any_sandbox_exists() {
    let m = EnvManager::new("/nonexistent".into(), None);
    let env = Environment {
        kind: EnvKind::Managed,
        prefix: "/nonexistent/env".into(),
        python: "/nonexistent/env/bin/python".into(),
        base: None,
        version: None,
    };
    let fake = Arc::new(Recorder::default());
    for bad in [
        "x; curl evil|sh",
        "--index-url=http://evil",
        "git+https://x/y",
        "a b",
    ] {
        let specs = [bad.to_string()];
        let err = m
            .install(
                fake.clone(),
                install(&env, &specs, InstallCaps::default()),
                None,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, ManagerError::Spec(_)), "{bad}: {err}");
    }
    let err = m
        .check(&*fake, &env, "acme", &["$(id)".into()])
        .await
        .unwrap_err();
    assert!(matches!(err, ManagerError::Spec(_)), "{err}");
    assert!(fake.jobs().is_empty(), "a sandbox was started");
}

#[tokio::test]
async fn fetch_is_online_without_the_environment_install_offline_into_it() {
    let t = tempdir();
    let ca = t.join("server-ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let data = t.join("data");
    let m = EnvManager::new(data.clone(), Some(ca));
    let base = t.join("pythons/3.11");
    std::fs::create_dir_all(&base).unwrap();
    let env = env_at(&t.join("uvenv"), EnvKind::UvVenv, Some(base.clone()));
    let fake = Arc::new(Recorder::default());
    let caps = InstallCaps {
        cpus: Some(0.5),
        memory_bytes: Some(256 << 20),
        timeout: Some(Duration::from_secs(60)),
    };
    let (tx, mut rx) = unbounded_channel();
    let specs = ["six".to_string(), "requests>=2".to_string()];
    let report = m
        .install(fake.clone(), install(&env, &specs, caps), Some(tx))
        .await
        .expect("install");
    let jobs = fake.jobs();
    assert_eq!(jobs.len(), 2, "two phases, two containers");
    let installs = std::fs::canonicalize(data.join("installs")).unwrap();

    // Phase 1: network on, the image's Python, uid 65534, no environment mounted.
    let f = &jobs[0];
    assert!(f.env.network);
    assert_eq!(f.env.python, None, "the image's own Python and pip");
    assert_eq!(f.env.user.as_deref(), Some("65534:65534"));
    for source in &f.env.sources {
        assert!(
            matches!(source, Source::HostPath { .. })
                && !source.target().starts_with(&env.prefix)
                && !source.target().starts_with(&base),
            "the environment is mounted in the fetch phase: {source:?}"
        );
    }
    let writable: Vec<_> = f.env.sources.iter().filter(|m| m.writable()).collect();
    assert_eq!(writable.len(), 1, "{:?}", f.env.sources);
    assert!(writable[0].target().starts_with(&installs), "{writable:?}");
    let ca_copy = std::fs::canonicalize(data.join("ca-bundle.pem")).unwrap();
    assert!(f.env.sources.contains(&Source::host(&ca_copy)));
    let var = |j: &JobSpec, k: &str| {
        j.env
            .vars
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(var(f, "PIP_CONFIG_FILE").as_deref(), Some("/dev/null"));
    assert_eq!(var(f, "SSL_CERT_FILE"), Some(ca_copy.display().to_string()));
    assert_eq!(var(f, "PIP_CERT"), Some(ca_copy.display().to_string()));
    let cfg: serde_json::Value = serde_json::from_slice(
        &f.files
            .iter()
            .find(|x| x.path == "fetch.json")
            .unwrap()
            .contents,
    )
    .unwrap();
    assert_eq!(cfg["python_version"], "3.11");
    assert_eq!(cfg["specs"], serde_json::json!(specs));
    let platforms = cfg["platforms"].to_string();
    let arch = std::env::consts::ARCH;
    for tag in ["manylinux_2_36_", "manylinux_2_17_", "manylinux2014_"] {
        assert!(platforms.contains(&format!("{tag}{arch}")), "{platforms}");
    }
    assert!(FETCH_SCRIPT.contains("'--only-binary=:all:'"));
    assert!(FETCH_SCRIPT.contains("'/usr/bin/python3', '-I', '-m', 'pip'"));
    assert_eq!(f.tenant, "acme");
    assert_eq!(f.limits.cpus, 0.5);
    assert_eq!(f.limits.memory_bytes, 256 << 20);
    assert_eq!(f.limits.timeout, Duration::from_secs(60));

    // Phase 2: network off, the environment read-write, the wheels read-only.
    let i = &jobs[1];
    assert!(!i.env.network);
    assert_eq!(i.env.sources[0], Source::host_writable(&env.prefix));
    assert!(i.env.sources.contains(&Source::host(&base)));
    let wheels: Vec<_> = i
        .env
        .sources
        .iter()
        .filter(|m| m.target().starts_with(&installs))
        .collect();
    assert_eq!(wheels.len(), 1);
    assert!(!wheels[0].writable());
    assert!(wheels[0].target().ends_with("wheels"));
    assert_eq!(i.env.python.as_deref(), Some(env.python.to_str().unwrap()));
    let (uid, gid) = owner_of(&env.prefix).unwrap();
    assert_eq!(i.env.user, Some(format!("{uid}:{gid}")));
    assert!(INSTALL_PIP.contains("'-m', 'pip', '--python', cfg['python']"));
    assert!(INSTALL_PIP.contains("['install', '--no-index', '--find-links', cfg['wheels']"));
    assert_eq!(i.limits.cpus, 0.5);

    // What was installed: the requested packages and the dependencies pip added.
    assert_eq!(report.installed[0].version.as_deref(), Some("1.17.0"));
    let deps: Vec<_> = report
        .dependencies
        .iter()
        .map(|p| (p.name.as_str(), p.version.as_deref().unwrap()))
        .collect();
    assert_eq!(deps, vec![("idna", "3.20"), ("urllib3", "2.2.1")]);
    assert_eq!(report.environment.path, env.prefix);

    // Progress names the phases, in order; the scratch directory is gone.
    let mut phases = vec![];
    while let Ok(e) = rx.try_recv() {
        if let InstallEvent::Begin(p) = e {
            phases.push(p);
        }
    }
    assert_eq!(phases, vec![Phase::Fetching, Phase::Installing]);
    // Removed on the blocking pool, a moment after the install returned.
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(&installs).unwrap().count() > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "scratch directory left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::fs::remove_dir_all(t).ok();
}

#[tokio::test]
async fn a_missing_wheel_is_explained_and_nothing_is_installed() {
    let t = tempdir();
    let m = EnvManager::new(t.join("data"), None);
    let env = env_at(&t.join("env"), EnvKind::Venv, None);
    let fake = Arc::new(Recorder::default());
    *fake.fetch_answer.lock().unwrap() = Some(
        r#"{"ok": false, "missing": [{"requirement": "PyYAML==5.3.1", "wheel_versions": "5.4, 6.0", "versions": "6.0, 5.4, 5.3.1"}, {"requirement": "nope-xyz", "wheel_versions": "none", "versions": null}]}"#.into(),
    );
    let specs = ["PyYAML==5.3.1".to_string(), "nope-xyz".to_string()];
    let err = m
        .install(
            fake.clone(),
            install(&env, &specs, InstallCaps::default()),
            None,
        )
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(fake.jobs().len(), 1, "no install phase");
    for part in [
        "`PyYAML==5.3.1`: no version with a wheel matches",
        "all versions: 6.0, 5.4, 5.3.1",
        "`nope-xyz`: no such package",
        "Python 3.11",
        "source builds (sdists) are not run",
        "build code with network access",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
}

#[test]
fn setid_bits_are_stripped_below_the_prefix_only() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempdir();
    let root = t.join("env");
    std::fs::create_dir_all(root.join("bin/sub")).unwrap();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    let set =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let suid = root.join("bin/suid");
    let sgid = root.join("bin/sub/sgid");
    let plain = root.join("bin/plain");
    let outside = t.join("outside-suid");
    for p in [&suid, &sgid, &plain, &outside] {
        std::fs::write(p, "#!/bin/sh\n").unwrap();
    }
    set(&suid, 0o4755);
    set(&sgid, 0o2711);
    set(&plain, 0o755);
    set(&outside, 0o4755);
    set(&root.join("bin/sub"), 0o2775);
    std::os::unix::fs::symlink(&outside, root.join("bin/link")).unwrap();
    assert_eq!(strip_setid_bits(&root).unwrap(), 3);
    assert_eq!(mode(&suid), 0o755);
    assert_eq!(mode(&sgid), 0o711);
    assert_eq!(mode(&plain), 0o755);
    assert_eq!(mode(&root.join("bin/sub")), 0o775);
    assert_eq!(
        mode(&outside),
        0o4755,
        "a symlink's target outside is not touched"
    );
    assert_eq!(strip_setid_bits(&root).unwrap(), 0);
    std::fs::remove_dir_all(t).ok();
}

#[tokio::test]
async fn a_python_the_image_pip_cannot_run_gets_a_fetched_pip() {
    let t = tempdir();
    let m = EnvManager::new(t.join("data"), None);
    let env = env_at(&t.join("v312"), EnvKind::UvVenv, None);
    let fake = Arc::new(Recorder::default());
    let specs = ["six".to_string()];
    let mut req = install(&env, &specs, InstallCaps::default());
    req.python_version = "3.12.1";
    m.install(fake.clone(), req, None).await.expect("install");
    let jobs = fake.jobs();
    let config = |j: &JobSpec, name: &str| -> serde_json::Value {
        let f = j.files.iter().find(|f| f.path == name).unwrap();
        serde_json::from_slice(&f.contents).unwrap()
    };
    assert_eq!(config(&jobs[0], "fetch.json")["own_pip"], true);
    let wheel = config(&jobs[1], "install.json")["pip_wheel"].clone();
    let wheel = PathBuf::from(wheel.as_str().expect("a pip wheel"));
    let tools = wheel.parent().unwrap();
    assert!(jobs[1].env.sources.contains(&Source::host(tools)));
    assert!(INSTALL_PIP.contains("pip = [cfg['python'], cfg['pip_wheel'] + '/pip']"));

    // 3.11: the image's pip, nothing else mounted.
    let m = EnvManager::new(t.join("data2"), None);
    let fake = Arc::new(Recorder::default());
    m.install(
        fake.clone(),
        install(&env, &specs, InstallCaps::default()),
        None,
    )
    .await
    .unwrap();
    let jobs = fake.jobs();
    assert_eq!(config(&jobs[0], "fetch.json")["own_pip"], false);
    assert!(config(&jobs[1], "install.json")["pip_wheel"].is_null());
    assert_eq!(jobs[1].env.sources.len(), 2, "{:?}", jobs[1].env.sources);
    std::fs::remove_dir_all(t).ok();
}

#[test]
fn answers_and_tags_parse() {
    assert_eq!(
        parse_successfully_installed(
            "Successfully installed certifi-2026.10.18 charset_normalizer-3.5.2 zope.interface-6.0"
        ),
        vec![
            ("certifi".into(), "2026.10.18".into()),
            ("charset_normalizer".into(), "3.5.2".into()),
            ("zope.interface".into(), "6.0".into())
        ]
    );
    assert!(parse_successfully_installed("Requirement already satisfied: six").is_empty());
    let x86 = manylinux_platforms("x86_64");
    assert_eq!(x86.first().unwrap(), "manylinux_2_36_x86_64");
    assert_eq!(x86.len(), 20 + 3);
    assert!(x86.contains(&"manylinux1_x86_64".to_string()));
    let arm = manylinux_platforms("aarch64");
    assert!(arm.contains(&"manylinux2014_aarch64".to_string()));
    assert!(!arm.iter().any(|t| t.starts_with("manylinux1")));
    assert_eq!(major_minor_of("3.11.7").as_deref(), Some("3.11"));
    assert_eq!(major_minor_of("3.13.0rc1").as_deref(), Some("3.13"));
    assert_eq!(major_minor_of("x"), None);
    for (mm, own) in [
        ("3.6", true),
        ("3.7", false),
        ("3.11", false),
        ("3.12", true),
        ("3.13", true),
    ] {
        assert_eq!(needs_own_pip(mm), own, "{mm}");
    }
    assert_eq!(few("1, 2, 3", true), "3, 2, 1");
    let caps = InstallCaps {
        cpus: Some(4.0),
        memory_bytes: Some(1 << 20),
        timeout: None,
    };
    let l = caps.apply(installer_limits());
    assert_eq!((l.cpus, l.memory_bytes), (2.0, 1 << 20));
    assert_eq!(l.timeout, installer_limits().timeout);
}
