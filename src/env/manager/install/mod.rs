//! Installs in two phases; the network never meets the environment.
//!
//! 1. **fetching** (network on): a container of the sandbox image that mounts no
//!    environment at all runs only the image's own pip (`/usr/bin/python3 -I -m pip
//!    download --only-binary=:all:`), for the environment's Python version and the
//!    manylinux platforms the image's glibc runs, into a fresh per-install directory under
//!    the data directory, as the sandbox uid. Wheels only: nothing of the packages runs, so
//!    no package code is ever online. A package without a wheel fails with a message saying
//!    so (source builds would run the package's build code).
//! 2. **installing** (network none): the environment mounted read-write, the wheels
//!    read-only, `/usr/bin/python3 -I -m pip --python ENV_PYTHON install --no-index
//!    --find-links WHEELS`. `--python` makes pip-less environments (uv venvs, venvs made
//!    `--without-pip`, conda prefixes without pip) installable. It runs as the environment's
//!    owner; when that is root, setuid/setgid bits are stripped under the prefix afterwards.
//!
//! Installs into one environment are serialized; runs keep going during the fetch and wait
//! only for the install phase (they see the environment before or after it, never halfway).
//! Each phase is one container with [`installer_limits`], lowered to the tenant's own
//! limits ([`InstallCaps`]).

mod answers;
mod scratch;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::{
    blocking, failed, io_err, json_file, owner_of, EnvManager, ManagerError, PackageStatus,
    CHECK_CORE, SANDBOX_UID,
};
use crate::backend::{Backend, BackendError};
use crate::env::spec;
use crate::env::{EnvKind, Environment};
use crate::job::{InputFile, JobSpec, Limits, Outcome, RunEnv, RunEvent, Source};
use answers::{
    last_json_line, major_minor_of, manylinux_platforms, needs_own_pip,
    parse_successfully_installed, FetchAnswer, InstallAnswer,
};
use scratch::{copy_if_changed, strip_setid_bits, InstallDir};

impl EnvManager {
    /// Install `req.specs` into `req.env` in two phases (see the module doc): wheels
    /// fetched with the network and no environment, then installed without network.
    ///
    /// Once the install phase has begun it runs to its end even if this future is dropped
    /// (it is offline and bounded by its timeout): the environment is never left halfway,
    /// and a root-owned environment is always swept of setuid bits afterwards.
    pub async fn install(
        &self,
        sandbox: Arc<dyn Backend>,
        req: Install<'_>,
        events: InstallEvents,
    ) -> Result<InstallReport, ManagerError> {
        spec::validate(req.specs)?;
        let env = req.env;
        let mm = major_minor_of(req.python_version).ok_or_else(|| ManagerError::Failed {
            what: "preparing the install",
            status: "unknown Python version".into(),
            stderr: format!(
                "the environment reported Python `{}`; wheels are chosen by its version",
                req.python_version
            ),
        })?;
        let locks = self.locks_of(&env.prefix).await;
        let serial = locks.install.clone().lock_owned().await;
        let (uid, gid) = owner_of(&env.prefix)?;
        let ca = self.ca_copy().await?;
        let data_dir = self.data_dir.clone();
        let dir = blocking(move || InstallDir::create(&data_dir)).await?;

        // Phase 1: fetch wheels. Network on, no environment mounted, the image's pip.
        let started = std::time::Instant::now();
        let fetch = self.fetch_job(&req, &dir, ca.as_deref(), &mm);
        let o = run_phase(&*sandbox, fetch, &events, Phase::Fetching).await?;
        let fetch_ms = started.elapsed().as_millis() as u64;
        if !o.success() {
            return Err(failed("fetching wheels", &o));
        }
        let answer: FetchAnswer = last_json_line(&o, "fetching wheels")?;
        if !answer.ok {
            return Err(answer.error(&mm, &o));
        }

        // Phase 2: install them. Network off, the environment read-write, as its owner.
        let pip_wheel = if needs_own_pip(&mm) {
            let found = dir.pip_wheel();
            if found.is_none() {
                return Err(ManagerError::Failed {
                    what: "fetching wheels",
                    status: "no pip wheel".into(),
                    stderr: format!(
                        "Python {mm} needs a pip of its own (the image's pip runs on 3.7 to 3.11), and none was downloaded"
                    ),
                });
            }
            found
        } else {
            None
        };
        let job = install_job(&req, &dir, (uid, gid), pip_wheel);
        let excl = locks.rw.clone().write_owned().await;
        let prefix = env.prefix.clone();
        let task = tokio::spawn(async move {
            let (_serial, _excl, _dir) = (serial, excl, dir);
            let started = std::time::Instant::now();
            let r = run_phase(&*sandbox, job, &events, Phase::Installing).await;
            let ms = started.elapsed().as_millis() as u64;
            let stripped = if uid == 0 {
                let p = prefix.clone();
                Some(blocking(move || strip_setid_bits(&p).map_err(io_err(&p))).await)
            } else {
                None
            };
            (r, ms, stripped)
        });
        let (r, install_ms, stripped) = task.await.map_err(|e| ManagerError::Failed {
            what: "pip install",
            status: "the installer task ended abnormally".into(),
            stderr: e.to_string(),
        })?;
        if let Some(s) = stripped {
            let n = s?;
            if n > 0 {
                tracing::warn!(prefix = %env.prefix.display(), files = n, "setuid/setgid bits stripped after an install as root");
            }
        }
        let o = r?;
        if !o.success() {
            return Err(failed("pip install", &o));
        }
        let answer: InstallAnswer = last_json_line(&o, "pip install")?;
        let requested: Vec<String> = answer
            .installed
            .iter()
            .map(|p| spec::normalize(&p.name))
            .collect();
        let dependencies = answer
            .summary
            .as_deref()
            .map(parse_successfully_installed)
            .unwrap_or_default()
            .into_iter()
            .filter(|(name, _)| !requested.contains(&spec::normalize(name)))
            .map(|(name, version)| PackageStatus {
                name,
                installed: true,
                version: Some(version),
            })
            .collect();
        Ok(InstallReport {
            environment: InstalledInto {
                kind: env.kind,
                path: env.prefix.clone(),
            },
            installed: answer.installed,
            dependencies,
            fetch_ms,
            install_ms,
            outcome: o,
        })
    }

    /// The fetch phase's job: the image's Python and pip, no environment, network on, the
    /// sandbox uid, the per-install directory the only writable mount.
    fn fetch_job(
        &self,
        req: &Install<'_>,
        dir: &InstallDir,
        ca: Option<&Path>,
        mm: &str,
    ) -> JobSpec {
        let mut job = JobSpec::python(FETCH_SCRIPT, req.caps.apply(installer_limits()));
        job.tenant = req.tenant.to_string();
        let mut env = RunEnv {
            python: None,
            sources: vec![Source::host_writable(&dir.root)],
            vars: pip_vars(),
            network: true,
            user: Some(format!("{SANDBOX_UID}:{SANDBOX_UID}")),
        };
        // pip's temporary downloads go to disk, not to the memory-backed /tmp.
        env.vars
            .push(("TMPDIR".into(), dir.tmp().display().to_string()));
        if let Some(ca) = ca {
            env.sources.push(Source::host(ca));
            for var in ["SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"] {
                env.vars.push((var.into(), ca.display().to_string()));
            }
        }
        env.vars.extend(self.index_vars.iter().cloned());
        job.env = env;
        let config = serde_json::json!({
            "specs": req.specs,
            "python_version": mm,
            "platforms": manylinux_platforms(std::env::consts::ARCH),
            "dest": dir.wheels(),
            "own_pip": needs_own_pip(mm),
            "tools": dir.tools(),
        });
        job.files.push(InputFile {
            path: "fetch.json".into(),
            contents: config.to_string().into_bytes(),
        });
        job
    }

    /// The configured CA bundle, copied into the data directory (when it changed), so the
    /// path mounted is valid for the daemon too. `None` when no bundle is configured.
    async fn ca_copy(&self) -> Result<Option<PathBuf>, ManagerError> {
        let Some(src) = self.ca_bundle.clone() else {
            return Ok(None);
        };
        let dest = self.ca_copy_path();
        blocking(move || copy_if_changed(&src, &dest))
            .await
            .map(Some)
    }
}

/// The environment an install went into.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InstalledInto {
    #[serde(rename = "type")]
    pub kind: EnvKind,
    pub path: PathBuf,
}

/// The result of an install: the requested packages with the versions now present, what
/// pip installed beyond them, and the outcome of the install phase.
#[derive(Debug, Clone, Serialize)]
pub struct InstallReport {
    pub environment: InstalledInto,
    /// The requested packages, as the environment reports them after the install.
    pub installed: Vec<PackageStatus>,
    /// Dependencies pip installed (or upgraded) beyond the requested packages.
    pub dependencies: Vec<PackageStatus>,
    /// Wall time of each phase.
    pub fetch_ms: u64,
    pub install_ms: u64,
    #[serde(skip)]
    pub outcome: Outcome,
}

/// The two phases of an install, as progress names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Downloading wheels, network on, no environment mounted.
    Fetching,
    /// pip installs the wheels into the environment, network off.
    Installing,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Fetching => "fetching",
            Phase::Installing => "installing",
        }
    }
}

/// What an install reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum InstallEvent {
    /// A phase begins.
    Begin(Phase),
    /// An event of the phase's container.
    Run(Phase, RunEvent),
}

/// Where an install's events go; `None` when nobody listens.
pub type InstallEvents = Option<UnboundedSender<InstallEvent>>;

/// A tenant's own limits, which its installer containers never exceed (`None`: the
/// installer's default). Each phase is one container and gets these limits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InstallCaps {
    pub cpus: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub timeout: Option<Duration>,
}

impl InstallCaps {
    /// `limits`, lowered to the caps where they are lower.
    pub fn apply(&self, mut limits: Limits) -> Limits {
        if let Some(c) = self.cpus {
            limits.cpus = limits.cpus.min(c);
        }
        if let Some(m) = self.memory_bytes {
            limits.memory_bytes = limits.memory_bytes.min(m);
        }
        if let Some(t) = self.timeout {
            limits.timeout = limits.timeout.min(t);
        }
        limits
    }
}

/// What to install, into what: the environment given is the one written to, whatever the
/// current environment has become meanwhile.
#[derive(Debug, Clone)]
pub struct Install<'a> {
    pub env: &'a Environment,
    /// The environment's Python version as its probe reported it (`3.11.2`): wheels are
    /// fetched for its `major.minor`.
    pub python_version: &'a str,
    pub tenant: &'a str,
    pub specs: &'a [String],
    pub caps: InstallCaps,
}

/// Limits of each installer container: more room than runs, for pip. The tenant's own
/// limits lower them ([`InstallCaps`]).
pub fn installer_limits() -> Limits {
    Limits {
        timeout: Duration::from_secs(300),
        memory_bytes: 2 << 30,
        cpus: 2.0,
        pids: 512,
        output_bytes: 1 << 20,
        workspace_bytes: 16 << 20,
        tmp_bytes: 256 << 20,
        nofile: 4096,
    }
}

/// The install phase's job: the environment's Python, the environment read-write (its
/// base interpreter read-only), the wheels read-only, no network, the owner's uid.
///
/// `pip_wheel`: the pip wheel to run instead of the image's pip, for a Python the image's
/// pip cannot run ([`needs_own_pip`]).
fn install_job(
    req: &Install<'_>,
    dir: &InstallDir,
    (uid, gid): (u32, u32),
    pip_wheel: Option<PathBuf>,
) -> JobSpec {
    let env = req.env;
    let names: Vec<String> = req
        .specs
        .iter()
        .map(|s| spec::name_of(s).to_string())
        .collect();
    let mut run_env = env.run_env();
    // The environment itself (the first source), read-write: pip writes into it.
    run_env.sources[0] = Source::host_writable(&env.prefix);
    run_env.sources.push(Source::host(dir.wheels()));
    if pip_wheel.is_some() {
        run_env.sources.push(Source::host(dir.tools()));
    }
    run_env.network = false;
    run_env.user = Some(format!("{uid}:{gid}"));
    run_env.vars = pip_vars();
    run_env.vars.push(("PIP_NO_INDEX".into(), "1".into()));
    let code = format!(
        "{INSTALL_PIP}{CHECK_CORE}print(json.dumps({{'summary': summary, 'installed': out}}))\n"
    );
    let mut job = JobSpec::python(code, req.caps.apply(installer_limits()));
    job.tenant = req.tenant.to_string();
    job.env = run_env;
    let config = serde_json::json!({
        "python": env.python,
        "wheels": dir.wheels(),
        "specs": req.specs,
        "pip_wheel": pip_wheel,
    });
    job.files.push(InputFile {
        path: "install.json".into(),
        contents: config.to_string().into_bytes(),
    });
    job.files.push(json_file("names.json", &names));
    job
}

/// Variables both installer phases set: no pip configuration file can redirect them, no
/// cache, a writable home.
fn pip_vars() -> Vec<(String, String)> {
    [
        ("HOME", "/tmp"),
        ("PIP_CONFIG_FILE", "/dev/null"),
        ("PIP_NO_CACHE_DIR", "1"),
        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Run one phase's job, its events tagged with the phase.
async fn run_phase(
    sandbox: &dyn Backend,
    job: JobSpec,
    events: &InstallEvents,
    phase: Phase,
) -> Result<Outcome, BackendError> {
    let Some(outer) = events else {
        return sandbox.run(job, None).await;
    };
    let _ = outer.send(InstallEvent::Begin(phase));
    let (tx, mut rx) = unbounded_channel();
    let outer = outer.clone();
    let forward = tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            let _ = outer.send(InstallEvent::Run(phase, e));
        }
    });
    let r = sandbox.run(job, Some(tx)).await;
    // The sandbox dropped its sender: the last events are forwarded before the next phase.
    let _ = tokio::time::timeout(Duration::from_secs(1), forward).await;
    r
}

/// Phase 1, run by the image's Python: `pip download` of wheels only, for the
/// environment's Python and the image's platforms. On failure, asks the index which
/// versions exist of each requirement pip found no wheel for. Last line: JSON.
const FETCH_SCRIPT: &str = include_str!("fetch.py");

/// Phase 2, run by the environment's Python: the image's pip installs into it with
/// `--python` (or, for a Python the image's pip cannot run, the fetched pip wheel run by
/// the environment's Python), from the wheels only; pip's output goes to stderr, its
/// summary line is kept.
const INSTALL_PIP: &str = include_str!("install_pip.py");
