//! Python environments mounted read-only into real sandboxes: a host venv, a uv venv, a
//! conda-shaped prefix, the managed default, and an install from PyPI.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use std::sync::Arc;

use mcp_code_executor::backend::docker::DockerBackend;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::env::manager::{
    EnvManager, Install, InstallCaps, InstallReport, ManagerError,
};
use mcp_code_executor::env::{self, Context, EnvKind, EnvRequest, Environment};
use mcp_code_executor::job::JobSpec;

fn tempdir(tag: &str) -> PathBuf {
    common::scratch_dir(&format!("envtest-{tag}"))
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {out:?}");
}

/// A package with metadata, written straight into site-packages (no network needed).
fn plant_package(site: &Path) {
    std::fs::create_dir_all(site.join("mcpx_probe_pkg")).unwrap();
    std::fs::write(
        site.join("mcpx_probe_pkg/__init__.py"),
        "VALUE = 'from the environment'\n",
    )
    .unwrap();
    let info = site.join("mcpx_probe_pkg-1.2.3.dist-info");
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(
        info.join("METADATA"),
        "Metadata-Version: 2.1\nName: mcpx_probe_pkg\nVersion: 1.2.3\n",
    )
    .unwrap();
}

const PROBE: &str = r#"
import sys, mcpx_probe_pkg
from importlib import metadata
print(sys.prefix)
print(mcpx_probe_pkg.VALUE, metadata.version('mcpx-probe-pkg'))
try:
    open(mcpx_probe_pkg.__file__, 'a')
    print('WROTE INTO THE ENVIRONMENT')
except OSError as e:
    print('refused', e.errno in (13, 30))
mounts = [l.split() for l in open('/proc/self/mountinfo')]
print('mount', [m[5].split(',')[0] for m in mounts if m[4] == sys.prefix])
"#;

/// The package imports, `sys.prefix` is the environment, writes into it fail, and
/// `check_installed_packages` agrees (with a differently spelled name).
async fn assert_env_works(s: &DockerBackend, env: &Environment, tenant: &str) {
    let mut job = JobSpec::python(PROBE, Default::default());
    job.tenant = tenant.into();
    job.env = env.run_env();
    let o = s.run(job, None).await.expect("runs");
    let out = o.stdout_text();
    assert!(o.success(), "{o:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(Path::new(lines[0]), env.prefix, "{out}");
    assert_eq!(lines[1], "from the environment 1.2.3");
    assert_eq!(lines[2], "refused True", "{out}");
    assert_eq!(lines[3], "mount ['ro']", "mounted read-only: {out}");

    let m = EnvManager::new(tempdir("unused"), None);
    let probe = m.probe(s, env, tenant).await.expect("probe");
    assert_eq!(Path::new(&probe.prefix), env.prefix);
    let st = m
        .check(
            s,
            env,
            tenant,
            &["MCPX_Probe.Pkg".into(), "surely-not-installed-xyz".into()],
        )
        .await
        .expect("check");
    assert!(
        st[0].installed && st[0].version.as_deref() == Some("1.2.3"),
        "{st:?}"
    );
    assert!(!st[1].installed, "{st:?}");
    common::assert_clean(s, tenant).await;
}

/// Install `specs` into `env` the way the server does: the version its probe reports.
async fn install(
    m: &EnvManager,
    s: &Arc<DockerBackend>,
    env: &Environment,
    tenant: &str,
    specs: &[&str],
) -> Result<InstallReport, ManagerError> {
    let probe = m.probe(&**s, env, tenant).await.expect("probe");
    let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
    let req = Install {
        env,
        python_version: &probe.version,
        tenant,
        specs: &specs,
        caps: InstallCaps::default(),
    };
    m.install(s.clone(), req, None).await
}

/// Run `code` in `env` and return stdout.
async fn run_in(s: &DockerBackend, env: &Environment, tenant: &str, code: &str) -> String {
    let mut job = JobSpec::python(code, Default::default());
    job.tenant = tenant.into();
    job.env = env.run_env();
    let o = s.run(job, None).await.unwrap();
    assert!(o.success(), "{o:?}");
    o.stdout_text()
}

#[tokio::test]
async fn host_venvs_of_the_system_and_of_a_separate_python() {
    let s = common::sandbox().await;
    let ctx = Context::from_host();
    // The system Python: the image's /usr provides the base interpreter.
    let dir = tempdir("venv-sys");
    let v = dir.join("venv");
    sh(Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&v));
    plant_package(&v.join("lib/python3.11/site-packages"));
    let req = EnvRequest {
        kind: EnvKind::Venv,
        path: Some(v.clone()),
        conda_name: None,
    };
    let e = env::resolve(&req, &ctx).unwrap();
    assert_eq!(e.base, None);
    assert_env_works(&s, &e, "t-venv-sys").await;

    // The `python3` on PATH (pyenv's here): its own prefix is mounted beside the venv.
    let base = Command::new("python3")
        .args(["-c", "import sys; print(sys.base_prefix)"])
        .output()
        .expect("python3 on PATH");
    let base = String::from_utf8_lossy(&base.stdout).trim().to_string();
    let v2 = dir.join("venv2");
    sh(Command::new(format!("{base}/bin/python3"))
        .args(["-m", "venv", "--without-pip"])
        .arg(&v2));
    let ver = Command::new(format!("{base}/bin/python3"))
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .unwrap();
    let ver = String::from_utf8_lossy(&ver.stdout).trim().to_string();
    plant_package(&v2.join(format!("lib/python{ver}/site-packages")));
    let req = EnvRequest {
        kind: EnvKind::Venv,
        path: Some(v2),
        conda_name: None,
    };
    let e = env::resolve(&req, &ctx).unwrap();
    if base != "/usr" {
        assert_eq!(e.base.as_deref(), Some(Path::new(&base)));
    }
    assert_env_works(&s, &e, "t-venv-pyenv").await;
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_uv_venv() {
    let s = common::sandbox().await;
    let dir = tempdir("uv");
    let v = dir.join("uvenv");
    let uv = Command::new("python3")
        .args([
            "-m",
            "uv",
            "venv",
            "--quiet",
            "--python",
            "/usr/bin/python3",
        ])
        .arg(&v)
        .output()
        .expect("uv is installed (scripts/test.sh installs it from PyPI)");
    assert!(uv.status.success(), "{uv:?}");
    plant_package(&v.join("lib/python3.11/site-packages"));
    let cfg = std::fs::read_to_string(v.join("pyvenv.cfg")).unwrap();
    assert!(cfg.contains("uv"), "made by uv: {cfg}");
    let req = EnvRequest {
        kind: EnvKind::UvVenv,
        path: Some(v.clone()),
        conda_name: None,
    };
    let e = env::resolve(&req, &Context::from_host()).unwrap();
    assert_env_works(&s, &e, "t-uv").await;

    // uv venvs have no pip: the image's pip installs into them with `--python`. The venv
    // is root's here, so the install phase runs as root (then setuid bits are swept).
    assert!(!v.join("lib/python3.11/site-packages/pip").exists());
    let data = tempdir("uv-data");
    let m = EnvManager::new(data.clone(), EnvManager::default_ca_bundle())
        .with_pip_index(&mcp_code_executor::config::PipIndex::from_vars(|k| {
            std::env::var(k).ok()
        }))
        .with_host(mcp_code_executor::config::HostEnv::from_process());
    let report = install(&m, &s, &e, "t-uv", &["six"])
        .await
        .unwrap_or_else(|err| panic!("install into a uv venv failed: {err}"));
    let version = report.installed[0].version.clone().expect("six installed");
    let out = run_in(
        &s,
        &e,
        "t-uv",
        "import six, sys\nprint(six.__version__, six.__file__.startswith(sys.prefix))",
    )
    .await;
    assert_eq!(out.trim(), format!("{version} True"));
    assert_eq!(
        std::fs::read_dir(data.join("installs")).unwrap().count(),
        0,
        "the wheel directory is removed"
    );
    common::assert_clean(&s, "t-uv").await;
    std::fs::remove_dir_all(data).ok();
    std::fs::remove_dir_all(dir).ok();
}

/// A Python 3.12 or newer on this machine (pyenv's, else one uv finds).
fn newer_python() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_default();
    let pyenv = std::fs::read_dir(format!("{home}/.pyenv/versions"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            let minor = n.strip_prefix("3.").and_then(|r| r.split('.').next());
            minor
                .and_then(|m| m.parse::<u32>().ok())
                .is_some_and(|m| m >= 12)
        })
        .map(|p| p.join("bin/python3"))
        .find(|p| p.exists());
    pyenv.or_else(|| {
        let out = Command::new("python3")
            .args(["-m", "uv", "python", "find", ">=3.12"])
            .output()
            .ok()?;
        let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !p.is_empty()).then(|| PathBuf::from(p))
    })
    .expect("this test needs a Python >= 3.12 (e.g. `pyenv install 3.12` or `uv python install 3.12`)")
}

/// The image's pip (23.0.1) cannot run on Python 3.12+: installs into such an environment
/// (here a venv without pip) run a pip wheel fetched for it, still offline.
#[tokio::test]
async fn a_pip_less_venv_of_a_newer_python_installs() {
    let s = common::sandbox().await;
    let dir = tempdir("py312");
    let v = dir.join("venv");
    sh(Command::new(newer_python())
        .args(["-m", "venv", "--without-pip"])
        .arg(&v));
    let req = EnvRequest {
        kind: EnvKind::Venv,
        path: Some(v.clone()),
        conda_name: None,
    };
    let e = env::resolve(&req, &Context::from_host()).unwrap();
    assert!(e.base.is_some(), "its own prefix is mounted beside it");
    let m = EnvManager::new(dir.join("data"), EnvManager::default_ca_bundle())
        .with_pip_index(&mcp_code_executor::config::PipIndex::from_vars(|k| {
            std::env::var(k).ok()
        }))
        .with_host(mcp_code_executor::config::HostEnv::from_process());
    let report = install(&m, &s, &e, "t-py312", &["six"])
        .await
        .unwrap_or_else(|err| panic!("install into a Python 3.12+ venv failed: {err}"));
    let version = report.installed[0].version.clone().expect("six installed");
    let out = run_in(
        &s,
        &e,
        "t-py312",
        "import six, sys\nprint(six.__version__, sys.version_info >= (3, 12), six.__file__.startswith(sys.prefix))",
    )
    .await;
    assert_eq!(out.trim(), format!("{version} True True"));
    common::assert_clean(&s, "t-py312").await;
    std::fs::remove_dir_all(dir).ok();
}

/// conda itself cannot be installed here: the prefix is conda-shaped (a relocatable
/// interpreter with its stdlib, `conda-meta/`), and a stand-in `conda` answers
/// `env list --json` for the name lookup.
#[tokio::test]
async fn a_conda_shaped_prefix_found_by_name() {
    let s = common::sandbox().await;
    let dir = tempdir("conda");
    let prefix = dir.join("envs/analysis");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
    std::fs::copy("/usr/bin/python3.11", prefix.join("bin/python3.11")).unwrap();
    std::os::unix::fs::symlink("python3.11", prefix.join("bin/python")).unwrap();
    sh(Command::new("cp")
        .args(["-a", "/usr/lib/python3.11"])
        .arg(prefix.join("lib/python3.11")));
    // Debian's interpreter (the one copied here) looks in dist-packages.
    plant_package(&prefix.join("lib/python3/dist-packages"));
    let conda = dir.join("conda");
    std::fs::write(
        &conda,
        format!(
            "#!/bin/sh\necho '{{\"envs\": [\"{}\", \"{}\"]}}'\n",
            dir.display(),
            prefix.display()
        ),
    )
    .unwrap();
    sh(Command::new("chmod").arg("+x").arg(&conda));
    // Found on PATH, as the server finds it.
    let path = std::env::join_paths([Path::new("/nonexistent-bin"), &dir]).unwrap();
    assert_eq!(env::find_on_path("conda", Some(&path)), Some(conda.clone()));
    assert_eq!(
        env::find_on_path("conda", Some("/nonexistent-bin".as_ref())),
        None
    );
    let ctx = Context::with_conda(env::find_on_path("conda", Some(&path)));
    assert_eq!(ctx.conda_envs.len(), 2);
    let req = EnvRequest {
        kind: EnvKind::Conda,
        path: None,
        conda_name: Some("analysis".into()),
    };
    let e = env::resolve(&req, &ctx).unwrap();
    assert_eq!(e.prefix, prefix);
    assert_env_works(&s, &e, "t-conda").await;
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn the_managed_default_installs_from_pypi() {
    let s = common::sandbox().await;
    let data = tempdir("managed");
    let m = EnvManager::new(data.clone(), EnvManager::default_ca_bundle())
        .with_pip_index(&mcp_code_executor::config::PipIndex::from_vars(|k| {
            std::env::var(k).ok()
        }))
        .with_host(mcp_code_executor::config::HostEnv::from_process());
    let e = m
        .ensure_managed(&*s, "t-managed")
        .await
        .expect("managed env");
    assert!(e.prefix.starts_with(&data));
    // The image's scientific stack is visible, the environment is read-only to runs.
    let mut job = JobSpec::python(
        "import sys, numpy, pandas, matplotlib\nprint(sys.prefix)\ntry:\n    open(sys.prefix + '/x', 'w')\nexcept OSError as e:\n    print('read-only', e.errno)\n",
        Default::default(),
    );
    job.tenant = "t-managed".into();
    job.env = e.run_env();
    let o = s.run(job, None).await.unwrap();
    assert!(o.success(), "{o:?}");
    assert_eq!(
        o.stdout_text(),
        format!("{}\nread-only 30\n", e.prefix.display())
    );

    // Hostile specs are refused before anything runs.
    for bad in [
        "six; rm -rf /",
        "--index-url=http://127.0.0.1:1/",
        "https://x/y.whl",
    ] {
        let err = install(&m, &s, &e, "t-managed", &[bad]).await.unwrap_err();
        assert!(err.to_string().contains("not a plain requirement"), "{err}");
    }

    // A small real package from PyPI, then importable in the next run.
    let t0 = std::time::Instant::now();
    let report = install(&m, &s, &e, "t-managed", &["six"])
        .await
        .unwrap_or_else(|err| panic!("install failed: {err}"));
    eprintln!(
        "install_dependencies([six]): {} ms (fetching {} ms, installing {} ms)",
        t0.elapsed().as_millis(),
        report.fetch_ms,
        report.install_ms
    );
    assert!(report.installed[0].installed, "{:?}", report.installed);
    let version = report.installed[0].version.clone().unwrap();
    let out = run_in(&s, &e, "t-managed", "import six; print(six.__version__)").await;
    assert_eq!(out.trim(), version);
    let st = m
        .check(&*s, &e, "t-managed", &["SIX".into()])
        .await
        .unwrap();
    assert_eq!(st[0].version.as_deref(), Some(version.as_str()));

    // A package with dependencies: they are listed with their versions. (Not `requests`:
    // the image has Debian's, for egress, so it and its dependencies are already there.)
    let report = install(&m, &s, &e, "t-managed", &["httpx"])
        .await
        .unwrap_or_else(|err| panic!("install failed: {err}"));
    let deps: Vec<String> = report
        .dependencies
        .iter()
        .map(|p| format!("{}=={}", p.name, p.version.as_deref().unwrap_or("?")))
        .collect();
    for dep in ["anyio==", "httpcore==", "h11=="] {
        assert!(
            deps.iter().any(|d| d.starts_with(dep)),
            "{dep} not in {deps:?}"
        );
    }
    let out = run_in(
        &s,
        &e,
        "t-managed",
        "import httpx, anyio; print(httpx.__version__)",
    )
    .await;
    assert_eq!(Some(out.trim()), report.installed[0].version.as_deref());

    // No wheel for this Python: refused with the reason, and nothing is built.
    let err = install(&m, &s, &e, "t-managed", &["PyYAML==5.3.1"])
        .await
        .unwrap_err()
        .to_string();
    for part in [
        "PyYAML==5.3.1",
        "Python 3.11",
        "source builds",
        "network access",
    ] {
        assert!(err.contains(part), "{part:?} not in {err}");
    }
    let err = install(
        &m,
        &s,
        &e,
        "t-managed",
        &["surely-no-such-package-mcpx-0xdead"],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("no such package"), "{err}");
    common::assert_clean(&s, "t-managed").await;
    // Files made by the sandbox uid: remove as root.
    std::fs::remove_dir_all(data).ok();
}
