//! Environment operations that run code: creating the managed default environment,
//! probing an environment inside a sandbox, checking and installing packages
//! ([`install`](mod@install): two phases, the network never meets the environment).
//! Nothing here runs on the host: every step is a job in a sandbox.

mod install;

pub use install::{
    Install, InstallCaps, InstallEvent, InstallEvents, InstallReport, InstalledInto, Phase,
};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, OwnedRwLockReadGuard, RwLock};

use super::spec::{self, SpecError};
use super::{EnvError, EnvKind, Environment};
use crate::backend::{Backend, BackendError};
use crate::job::{InputFile, JobSpec, Limits, Outcome, RunEnv, Source};

/// Uid:gid of sandboxes; the managed environment belongs to it so installers need no root.
const SANDBOX_UID: u32 = 65534;
/// Written into the managed environment once it is completely built: a directory without
/// it is a creation that failed midway, and is rebuilt.
const COMPLETE_MARKER: &str = ".mcpx-complete";

/// Why an environment operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Backend(#[from] BackendError),
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
    /// Some requirement has no wheel for the environment (or does not exist).
    #[error("nothing was installed: {}{}", .missing.join("; "), if *.no_wheel { format!(". Wheels are looked for Python {} on {}; source builds (sdists) are not run, because building from source would execute the package's own build code with network access. Pick a version that publishes wheels for this Python, or use an environment whose Python has them", .python, .platform) } else { String::new() })]
    NotAvailable {
        missing: Vec<String>,
        /// True when some of them exist on the index but have no usable wheel.
        no_wheel: bool,
        python: String,
        platform: String,
    },
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

/// The locks of one environment.
#[derive(Default)]
struct EnvLocks {
    /// Runs share it, the install phase takes it alone.
    rw: Arc<RwLock<()>>,
    /// Held over both phases: one install at a time.
    install: Arc<Mutex<()>>,
}

/// Owns the managed environments and serializes installs.
pub struct EnvManager {
    /// Absolute: everything under it is bind-mounted at the same path.
    data_dir: PathBuf,
    /// CA bundle (PEM) the fetch phase trusts, as configured (absolute, in the server's
    /// filesystem); a copy under the data directory is what is mounted.
    ca_bundle: Option<PathBuf>,
    /// `PIP_INDEX_URL` / `PIP_EXTRA_INDEX_URL` for the fetch phase, as configured
    /// ([`EnvManager::with_pip_index`]); none: PyPI.
    index_vars: Vec<(String, String)>,
    /// The host facts environments are resolved with (`HOME`, conda), read once by the
    /// configuration ([`EnvManager::with_host`]); none by default.
    host: crate::config::HostEnv,
    locks: Mutex<HashMap<PathBuf, Arc<EnvLocks>>>,
}

/// `path` made absolute against the working directory (not resolved: it may not exist yet).
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

impl EnvManager {
    /// `data_dir` holds the managed environments and the installs' scratch directories;
    /// `ca_bundle` is trusted by the fetch phase. Both are made absolute (a relative path
    /// means nothing to the Docker daemon). The fetch phase uses PyPI unless
    /// [`with_pip_index`](Self::with_pip_index) says otherwise: nothing here reads the
    /// server's environment.
    pub fn new(data_dir: PathBuf, ca_bundle: Option<PathBuf>) -> Self {
        EnvManager {
            data_dir: absolute(data_dir),
            ca_bundle: ca_bundle.map(absolute),
            index_vars: Vec::new(),
            host: crate::config::HostEnv::default(),
            locks: Mutex::default(),
        }
    }

    /// Resolve environments with these host facts (`HOME`, `CONDA_EXE`, `PATH`), as the
    /// configuration read them at start-up.
    pub fn with_host(mut self, host: crate::config::HostEnv) -> Self {
        self.host = host;
        self
    }

    /// Where a single-tenant server may pick environments: the data directory and the
    /// operator's `MCP_EXECUTOR_ENV_ROOTS` (the configured environment is added by
    /// [`super::state::EnvState`]).
    pub fn env_roots(&self) -> Vec<PathBuf> {
        std::iter::once(self.data_dir.clone())
            .chain(self.host.env_roots.iter().cloned())
            .collect()
    }

    /// What requested environments are resolved against: the host facts, and conda's list
    /// of environments as it is now (a conda environment made since start-up is found).
    pub fn context(&self) -> super::Context {
        super::Context::of(&self.host)
    }

    /// The package indexes the fetch phase uses (the server's `PIP_INDEX_URL` and
    /// `PIP_EXTRA_INDEX_URL`), passed to it as the same variables.
    pub fn with_pip_index(mut self, index: &crate::config::PipIndex) -> Self {
        self.index_vars = index.container_vars();
        self
    }

    /// The host's system CA bundle, when present (see [`crate::config::default_ca_bundle`]).
    pub fn default_ca_bundle() -> Option<PathBuf> {
        crate::config::default_ca_bundle()
    }

    /// Where the copy of the CA bundle that installers mount lives: in the data directory,
    /// which is at the same path for the server and the Docker daemon (under
    /// docker-compose the server's `/etc/ssl/certs` is not the host's).
    pub(crate) fn ca_copy_path(&self) -> PathBuf {
        self.data_dir.join("ca-bundle.pem")
    }

    /// Where the managed environment of `tenant` lives.
    pub fn managed_path(&self, tenant: &str) -> PathBuf {
        if tenant == crate::job::LOCAL_TENANT {
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
    /// sandbox uid. It counts as created once [`COMPLETE_MARKER`] is in it; a directory
    /// without it (a creation that failed midway) is moved aside and built again.
    pub async fn ensure_managed(
        &self,
        sandbox: &dyn Backend,
        tenant: &str,
    ) -> Result<Environment, ManagerError> {
        let path = self.managed_path(tenant);
        let locks = self.locks_of(&path).await;
        let _excl = locks.rw.write().await;
        let p = path.clone();
        if !blocking(move || Ok(is_complete(&p))).await? {
            let p = path.clone();
            blocking(move || start_afresh(&p)).await?;
            // No pip inside: installs use the image's pip with `--python`.
            let code = format!(
                "import json, venv\nvenv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(json.loads({}))\n",
                py_str(&path.display().to_string())
            );
            let mut job = JobSpec::python(code, setup_limits());
            job.tenant = tenant.to_string();
            job.env = RunEnv {
                sources: vec![Source::host_writable(&path)],
                ..RunEnv::default()
            };
            let o = sandbox.run(job, None).await?;
            if !o.success() {
                return Err(failed("creating the managed environment", &o));
            }
            let marker = path.join(COMPLETE_MARKER);
            blocking(move || std::fs::write(&marker, b"").map_err(io_err(&marker))).await?;
        }
        Ok(Environment {
            kind: EnvKind::Managed,
            python: path.join("bin/python"),
            prefix: path,
            base: None,
            version: None,
        })
    }

    /// Hold this while a run uses `env`: the install phase waits for runs and runs for it.
    pub async fn read_lock(&self, env: &Environment) -> OwnedRwLockReadGuard<()> {
        self.locks_of(&env.prefix)
            .await
            .rw
            .clone()
            .read_owned()
            .await
    }

    /// Start the environment's Python inside a sandbox (labelled `tenant`) and check
    /// `sys.prefix` is it.
    pub async fn probe(
        &self,
        sandbox: &dyn Backend,
        env: &Environment,
        tenant: &str,
    ) -> Result<Probe, ManagerError> {
        let code = "import json, sys, platform\nprint(json.dumps({'prefix': sys.prefix, 'version': platform.python_version(), 'executable': sys.executable}))\n";
        let o = self.run_in(sandbox, env, tenant, code, vec![]).await?;
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
        sandbox: &dyn Backend,
        env: &Environment,
        tenant: &str,
        names: &[String],
    ) -> Result<Vec<PackageStatus>, ManagerError> {
        if names.is_empty() {
            return Err(SpecError::Empty.into());
        }
        for n in names {
            spec::validate(std::slice::from_ref(&spec::name_of(n).to_string()))?;
        }
        let code = format!("{CHECK_CORE}print(json.dumps(out))\n");
        let o = self
            .run_in(
                sandbox,
                env,
                tenant,
                &code,
                vec![json_file("names.json", names)],
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

    async fn run_in(
        &self,
        sandbox: &dyn Backend,
        env: &Environment,
        tenant: &str,
        code: &str,
        files: Vec<InputFile>,
    ) -> Result<Outcome, ManagerError> {
        let _shared = self.read_lock(env).await;
        let mut job = JobSpec::python(code, setup_limits());
        job.tenant = tenant.to_string();
        job.files.extend(files);
        job.env = env.run_env();
        Ok(sandbox.run(job, None).await?)
    }

    async fn locks_of(&self, path: &Path) -> Arc<EnvLocks> {
        self.locks
            .lock()
            .await
            .entry(path.to_path_buf())
            .or_default()
            .clone()
    }
}

/// Run blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ManagerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ManagerError::Io {
            path: PathBuf::new(),
            detail: e.to_string(),
        })?
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> ManagerError + '_ {
    move |e| ManagerError::Io {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// Is the managed environment at `path` completely built? One made before the marker
/// existed (a `pyvenv.cfg` and pip, which venv installs last) is adopted.
fn is_complete(path: &Path) -> bool {
    if path.join(COMPLETE_MARKER).exists() {
        return true;
    }
    let legacy = path.join("pyvenv.cfg").is_file()
        && std::fs::read_dir(path.join("lib"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| d.path().join("site-packages/pip/__init__.py").is_file());
    legacy && std::fs::write(path.join(COMPLETE_MARKER), b"").is_ok()
}

/// Make `path` an empty directory owned by the sandbox uid; a half-built one is moved
/// aside (and removed where the server may).
fn start_afresh(path: &Path) -> Result<(), ManagerError> {
    if std::fs::symlink_metadata(path).is_ok() {
        let aside = path.with_extension(format!("broken-{}", crate::job::new_job_id()));
        std::fs::rename(path, &aside).map_err(io_err(path))?;
        if let Err(e) = std::fs::remove_dir_all(&aside) {
            tracing::warn!(dir = %aside.display(), error = %e, "half-built environment moved aside, not removed");
        }
    }
    create_owned_dir(path)
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
    std::fs::create_dir_all(path).map_err(io_err(path))?;
    match std::os::unix::fs::chown(path, Some(SANDBOX_UID), Some(SANDBOX_UID)) {
        Ok(()) => Ok(()),
        // Not root: make it writable for everyone instead (a single-user machine).
        Err(_) => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777))
                .map_err(io_err(path))
        }
    }
}

/// Uid and gid owning the environment: the install phase writes as its owner.
fn owner_of(path: &Path) -> Result<(u32, u32), ManagerError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(io_err(path))?;
    Ok((m.uid(), m.gid()))
}

/// Which of `names.json` are installed, with versions, as `out` (the scripts print it).
const CHECK_CORE: &str = r#"
import json
from importlib import metadata
names = json.load(open('names.json'))
out = []
for n in names:
    try:
        out.append({'name': n, 'installed': True, 'version': metadata.version(n)})
    except metadata.PackageNotFoundError:
        out.append({'name': n, 'installed': False, 'version': None})
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::testing::{tempdir, Recorder};

    #[tokio::test]
    async fn a_half_built_managed_environment_is_rebuilt() {
        let t = tempdir();
        let m = EnvManager::new(t.join("data"), None);
        let path = m.managed_path("acme");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(path.join("junk"), "").unwrap();
        let fake = Recorder::default();
        let env = m.ensure_managed(&fake, "acme").await.unwrap();
        assert_eq!(env.prefix, path);
        assert_eq!(fake.jobs().len(), 1, "created again");
        assert_eq!(fake.jobs()[0].tenant, "acme");
        assert!(
            !path.join("junk").exists(),
            "the broken one was moved aside"
        );
        assert!(path.join(COMPLETE_MARKER).exists());
        // Complete now: no second creation.
        m.ensure_managed(&fake, "acme").await.unwrap();
        assert_eq!(fake.jobs().len(), 1);
        // One made before the marker (pip inside) is adopted, not rebuilt.
        let legacy = m.managed_path("old");
        std::fs::create_dir_all(legacy.join("lib/python3.11/site-packages/pip")).unwrap();
        std::fs::write(
            legacy.join("lib/python3.11/site-packages/pip/__init__.py"),
            "",
        )
        .unwrap();
        std::fs::write(legacy.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        m.ensure_managed(&fake, "old").await.unwrap();
        assert_eq!(fake.jobs().len(), 1);
        std::fs::remove_dir_all(t).ok();
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

    #[test]
    fn relative_paths_are_made_absolute() {
        let m = EnvManager::new("rel-data".into(), Some("certs/ca.pem".into()));
        assert!(m.data_dir.is_absolute());
        assert!(m.ca_bundle.as_deref().unwrap().is_absolute());
        assert!(m.ca_copy_path().starts_with(&m.data_dir));
    }
}
