//! Python environments mounted read-only into real sandboxes: a host venv, a uv venv, a
//! conda-shaped prefix, the managed default, and an install from PyPI.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use mcp_code_executor::env::manager::EnvManager;
use mcp_code_executor::env::{self, Context, EnvKind, EnvRequest, Environment};
use mcp_code_executor::job::JobSpec;
use mcp_code_executor::sandbox::docker::DockerSandbox;
use mcp_code_executor::sandbox::Sandbox;

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mcpx-envtest-{tag}-{}",
        mcp_code_executor::job::new_job_id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
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
async fn assert_env_works(s: &DockerSandbox, env: &Environment, tenant: &str) {
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
    let probe = m.probe(s, env).await.expect("probe");
    assert_eq!(Path::new(&probe.prefix), env.prefix);
    let st = m
        .check(
            s,
            env,
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
        path: Some(v),
        conda_name: None,
    };
    let e = env::resolve(&req, &Context::from_host()).unwrap();
    assert_env_works(&s, &e, "t-uv").await;
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
    let ctx = Context {
        conda_envs: env::conda_env_list(conda.as_os_str()),
        ..Context::from_host()
    };
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
    let m = EnvManager::new(data.clone(), EnvManager::default_ca_bundle());
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
        let err = m
            .install(&*s, &e, "t-managed", &[bad.to_string()], None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a plain requirement"), "{err}");
    }

    // A small real package from PyPI, then importable in the next run.
    let report = m
        .install(&*s, &e, "t-managed", &["six".to_string()], None)
        .await
        .unwrap_or_else(|err| panic!("install failed: {err}"));
    assert!(report.installed[0].installed, "{:?}", report.installed);
    let version = report.installed[0].version.clone().unwrap();
    let mut job = JobSpec::python("import six; print(six.__version__)", Default::default());
    job.tenant = "t-managed".into();
    job.env = e.run_env();
    let o = s.run(job, None).await.unwrap();
    assert_eq!(o.stdout_text().trim(), version, "{o:?}");
    let st = m.check(&*s, &e, &["SIX".into()]).await.unwrap();
    assert_eq!(st[0].version.as_deref(), Some(version.as_str()));
    common::assert_clean(&s, "t-managed").await;
    // Files made by the sandbox uid: remove as root.
    std::fs::remove_dir_all(data).ok();
}
