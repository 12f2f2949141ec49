//! Python environments: which interpreter and packages a run gets, and what must be
//! mounted (read-only) for it to start inside the sandbox.
//!
//! Resolution is pure apart from reading the environment's own files, so it is
//! table-tested. The kinds are those the tools we replace configure: `venv` (`VENV_PATH`),
//! `venv-uv` (`UV_VENV_PATH`), `conda` (`CONDA_ENV_NAME`, a name or a prefix), and
//! `default`, the managed environment this executor owns (see [`manager`]).

pub mod manager;
pub mod spec;
pub mod state;
#[cfg(test)]
pub(crate) mod testing;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::HostEnv;
use crate::job::{RunEnv, Source};

/// The kind of environment, named as `ENV_TYPE` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum EnvKind {
    /// The managed environment under the data directory (built from the image's Python).
    #[serde(rename = "default")]
    Managed,
    #[serde(rename = "venv")]
    Venv,
    #[serde(rename = "venv-uv")]
    UvVenv,
    #[serde(rename = "conda")]
    Conda,
}

impl EnvKind {
    pub fn parse(s: &str) -> Result<EnvKind, EnvError> {
        match s.trim() {
            "default" | "managed" | "" => Ok(EnvKind::Managed),
            "venv" => Ok(EnvKind::Venv),
            "venv-uv" | "uv" => Ok(EnvKind::UvVenv),
            "conda" => Ok(EnvKind::Conda),
            other => Err(EnvError::UnknownKind(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EnvKind::Managed => "default",
            EnvKind::Venv => "venv",
            EnvKind::UvVenv => "venv-uv",
            EnvKind::Conda => "conda",
        }
    }
}

impl fmt::Display for EnvKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRequest {
    pub kind: EnvKind,
    /// `VENV_PATH` / `UV_VENV_PATH`, or a conda prefix.
    pub path: Option<PathBuf>,
    /// `CONDA_ENV_NAME`.
    pub conda_name: Option<String>,
}

/// A resolved environment: where it is and what the sandbox must mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Environment {
    pub kind: EnvKind,
    /// The environment's directory: `sys.prefix` inside the sandbox.
    pub prefix: PathBuf,
    /// The interpreter, at the same path inside the sandbox as on the host.
    pub python: PathBuf,
    /// The base interpreter's prefix a venv needs, mounted read-only beside it; `None` when
    /// the image's own `/usr` provides it (or for conda, which is self-contained).
    pub base: Option<PathBuf>,
    /// The Python version recorded by the environment, when it records one.
    pub version: Option<String>,
}

impl Environment {
    /// How runs see it: everything read-only, no network. The environment is a directory
    /// of the server's host ([`Source::HostPath`]), its prefix first; how it reaches the
    /// sandbox is the backend's business.
    pub fn run_env(&self) -> RunEnv {
        let mut sources = vec![Source::host(&self.prefix)];
        if let Some(b) = &self.base {
            sources.push(Source::host(b));
        }
        RunEnv {
            python: Some(self.python.display().to_string()),
            sources,
            ..RunEnv::default()
        }
    }
}

/// Why an environment cannot be used; each message says what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("unknown environment type `{0}`: use venv, venv-uv, conda or default")]
    UnknownKind(String),
    #[error("{kind} needs {what}")]
    Missing { kind: EnvKind, what: &'static str },
    #[error("`{0}` must be an absolute path")]
    NotAbsolute(PathBuf),
    #[error("`{path}` does not exist (or cannot be read): {detail}")]
    NotFound { path: PathBuf, detail: String },
    #[error("broken virtual environment `{0}`: `pyvenv.cfg` is missing; create it with `python3 -m venv {0}` or `uv venv {0}`")]
    NoPyvenvCfg(PathBuf),
    #[error("broken virtual environment `{path}`: {why}")]
    BrokenVenv { path: PathBuf, why: String },
    #[error("`{0}` is not a conda environment (no `conda-meta/` or `bin/python`)")]
    NotConda(PathBuf),
    #[error("no conda environment named `{0}` was found (asked `conda env list --json`, then looked in the usual envs/ folders); give its prefix path instead")]
    CondaNameNotFound(String),
    #[error("refusing to mount `{path}` into sandboxes: it would expose more than the environment ({why}). Use an environment in its own directory (e.g. `python3 -m venv /srv/envs/analysis`, a pyenv or `uv python install` interpreter)")]
    TooBroad { path: PathBuf, why: &'static str },
    #[error("the venv `{path}` was made by Python {venv} from /usr, but the sandbox image has Python {image}: make the venv with a Python in its own prefix (pyenv, uv) or with the image's version")]
    VersionMismatch {
        path: PathBuf,
        venv: String,
        image: String,
    },
}

/// Facts resolution needs about the host.
#[derive(Debug, Clone)]
pub struct Context {
    pub home: Option<PathBuf>,
    /// `major.minor` of the image's `/usr/bin/python3`.
    pub image_python: String,
    /// Conda prefixes as `conda env list --json` lists them, if conda is there.
    pub conda_envs: Vec<PathBuf>,
}

/// The Python version of the default sandbox image (Debian bookworm).
pub const IMAGE_PYTHON: &str = "3.11";

impl Context {
    /// The real host: `$HOME`, and conda's list when there is a conda (`$CONDA_EXE`, which
    /// conda's shell hook sets, else `conda` on `PATH`), as [`HostEnv::from_process`] reads
    /// them.
    pub fn from_host() -> Context {
        Context::of(&HostEnv::from_process())
    }

    /// [`from_host`](Self::from_host) for the given host facts.
    pub fn of(host: &HostEnv) -> Context {
        let conda = host.conda_exe.clone().filter(|p| is_executable(p));
        Context::with_home(
            host.home.clone(),
            conda.or_else(|| find_on_path("conda", host.path.as_deref())),
        )
    }

    /// The host's `$HOME`, and the list of the given `conda` program, if any.
    pub fn with_conda(conda: Option<PathBuf>) -> Context {
        Context::with_home(HostEnv::from_process().home, conda)
    }

    /// `home`, and the list of the given `conda` program, if any.
    pub fn with_home(home: Option<PathBuf>, conda: Option<PathBuf>) -> Context {
        Context {
            home,
            image_python: IMAGE_PYTHON.to_string(),
            conda_envs: conda
                .map(|c| conda_env_list(c.as_os_str()))
                .unwrap_or_default(),
        }
    }
}

/// The first executable `name` in the directories of a `PATH` value.
pub fn find_on_path(name: &str, path: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `conda env list --json` of the given `conda` program, or nothing when it is absent or
/// says nothing useful.
pub fn conda_env_list(conda: &std::ffi::OsStr) -> Vec<PathBuf> {
    let Ok(out) = std::process::Command::new(conda)
        .args(["env", "list", "--json"])
        .output()
    else {
        return Vec::new();
    };
    #[derive(serde::Deserialize)]
    struct Envs {
        envs: Vec<PathBuf>,
    }
    serde_json::from_slice::<Envs>(&out.stdout)
        .map(|e| e.envs)
        .unwrap_or_default()
}

/// Resolve a request for a venv, uv venv or conda environment. The managed default is
/// resolved by [`manager::EnvManager`], which creates it.
pub fn resolve(req: &EnvRequest, ctx: &Context) -> Result<Environment, EnvError> {
    match req.kind {
        EnvKind::Venv | EnvKind::UvVenv => {
            let path = req.path.as_ref().ok_or(EnvError::Missing {
                kind: req.kind,
                what: if req.kind == EnvKind::Venv {
                    "venv_path (VENV_PATH)"
                } else {
                    "uv_venv_path (UV_VENV_PATH)"
                },
            })?;
            resolve_venv(req.kind, path, ctx)
        }
        EnvKind::Conda => {
            let prefix = match (&req.path, &req.conda_name) {
                (Some(p), _) => p.clone(),
                (None, Some(name)) if name.starts_with('/') => PathBuf::from(name),
                (None, Some(name)) => find_conda(name, ctx)?,
                (None, None) => {
                    return Err(EnvError::Missing {
                        kind: EnvKind::Conda,
                        what: "conda_name (CONDA_ENV_NAME) or a prefix path",
                    })
                }
            };
            resolve_conda(&prefix, ctx)
        }
        EnvKind::Managed => Err(EnvError::Missing {
            kind: EnvKind::Managed,
            what: "the environment manager (it is created on first use)",
        }),
    }
}

/// Resolve a venv (either kind): read `pyvenv.cfg`, find the base interpreter.
pub fn resolve_venv(kind: EnvKind, path: &Path, ctx: &Context) -> Result<Environment, EnvError> {
    let prefix = checked_dir(path, ctx)?;
    let cfg_path = prefix.join("pyvenv.cfg");
    let cfg =
        std::fs::read_to_string(&cfg_path).map_err(|_| EnvError::NoPyvenvCfg(prefix.clone()))?;
    let field = |key: &str| {
        cfg.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let home = field("home").ok_or_else(|| EnvError::BrokenVenv {
        path: prefix.clone(),
        why: "`pyvenv.cfg` has no `home` line".into(),
    })?;
    let version = field("version").or_else(|| field("version_info"));
    let python = prefix.join("bin/python");
    if std::fs::symlink_metadata(&python).is_err() {
        return Err(EnvError::BrokenVenv {
            path: prefix,
            why: "`bin/python` is missing".into(),
        });
    }
    let home = PathBuf::from(home);
    let base_prefix = match home.file_name() {
        Some(n) if n == "bin" => home.parent().map(Path::to_path_buf).unwrap_or(home.clone()),
        _ => home.clone(),
    };
    let base = if base_prefix == Path::new("/usr") {
        // The image's own /usr provides the interpreter: the versions must agree.
        let mm = version.as_deref().map(major_minor).unwrap_or_default();
        if !mm.is_empty() && mm != ctx.image_python {
            return Err(EnvError::VersionMismatch {
                path: prefix,
                venv: mm,
                image: ctx.image_python.clone(),
            });
        }
        None
    } else {
        Some(checked_dir(&base_prefix, ctx)?)
    };
    Ok(Environment {
        kind,
        python,
        prefix,
        base,
        version,
    })
}

fn resolve_conda(prefix: &Path, ctx: &Context) -> Result<Environment, EnvError> {
    let prefix = checked_dir(prefix, ctx)?;
    if !prefix.join("conda-meta").is_dir() || !prefix.join("bin/python").exists() {
        return Err(EnvError::NotConda(prefix));
    }
    Ok(Environment {
        kind: EnvKind::Conda,
        python: prefix.join("bin/python"),
        prefix,
        base: None,
        version: None,
    })
}

fn find_conda(name: &str, ctx: &Context) -> Result<PathBuf, EnvError> {
    if let Some(p) = ctx
        .conda_envs
        .iter()
        .find(|p| p.file_name().is_some_and(|n| n == name))
    {
        return Ok(p.clone());
    }
    if name == "base" {
        if let Some(first) = ctx.conda_envs.first() {
            return Ok(first.clone());
        }
    }
    let mut candidates = vec![PathBuf::from("/opt/conda/envs").join(name)];
    if let Some(h) = &ctx.home {
        for root in [
            "miniconda3",
            "anaconda3",
            "miniforge3",
            "mambaforge",
            ".conda",
        ] {
            candidates.push(h.join(root).join("envs").join(name));
        }
    }
    candidates
        .into_iter()
        .find(|p| p.join("conda-meta").is_dir())
        .ok_or_else(|| EnvError::CondaNameNotFound(name.to_string()))
}

/// Paths that hold far more than an environment: mounting one would show the sandbox the
/// host's system or users' files.
const TOO_BROAD: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib64",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/tmp",
    "/usr",
    "/usr/local",
    "/var",
    "/var/lib",
    "/var/run",
];
/// Trees that are never an environment.
const NEVER_UNDER: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/var/run"];

/// An absolute, existing directory, symlinks resolved, and not too broad to mount.
fn checked_dir(path: &Path, ctx: &Context) -> Result<PathBuf, EnvError> {
    if !path.is_absolute() {
        return Err(EnvError::NotAbsolute(path.to_path_buf()));
    }
    let real = std::fs::canonicalize(path).map_err(|e| EnvError::NotFound {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    if !real.is_dir() {
        return Err(EnvError::NotFound {
            path: path.to_path_buf(),
            detail: "not a directory".into(),
        });
    }
    if TOO_BROAD.iter().any(|b| real == Path::new(b)) {
        return Err(EnvError::TooBroad {
            path: real,
            why: "a system directory",
        });
    }
    if NEVER_UNDER.iter().any(|b| real.starts_with(b)) {
        return Err(EnvError::TooBroad {
            path: real,
            why: "inside a system directory",
        });
    }
    if let Some(home) = &ctx.home {
        if home.starts_with(&real) {
            return Err(EnvError::TooBroad {
                path: real,
                why: "the home directory or one of its parents",
            });
        }
    }
    Ok(real)
}

/// `3.11.7` → `3.11`.
fn major_minor(v: &str) -> String {
    v.split('.').take(2).collect::<Vec<_>>().join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(home: &Path) -> Context {
        Context {
            home: Some(home.to_path_buf()),
            image_python: "3.11".into(),
            conda_envs: vec![],
        }
    }

    fn venv(dir: &Path, cfg: &str) {
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("pyvenv.cfg"), cfg).unwrap();
        std::fs::write(dir.join("bin/python"), "").unwrap();
    }

    #[test]
    fn venvs_resolve_with_their_base() {
        let t = tempdir();
        let base = t.join("pythons/3.12.1");
        std::fs::create_dir_all(base.join("bin")).unwrap();
        venv(
            &t.join("v1"),
            &format!("home = {}\nversion = 3.12.1\n", base.join("bin").display()),
        );
        let e = resolve_venv(
            EnvKind::Venv,
            &t.join("v1"),
            &ctx(Path::new("/nonexistent-home")),
        )
        .unwrap();
        assert_eq!(e.base.as_deref(), Some(base.as_path()));
        assert_eq!(e.python, t.join("v1/bin/python"));
        assert_eq!(e.version.as_deref(), Some("3.12.1"));
        let r = e.run_env();
        assert_eq!(r.sources, [Source::host(&e.prefix), Source::host(&base)]);

        // A venv of the system Python relies on the image's /usr, if the version agrees.
        venv(&t.join("v2"), "home = /usr/bin\nversion_info = 3.11.2\n");
        let e = resolve_venv(EnvKind::UvVenv, &t.join("v2"), &ctx(Path::new("/x"))).unwrap();
        assert_eq!(e.base, None);
        venv(&t.join("v3"), "home = /usr/bin\nversion = 3.9.2\n");
        assert!(matches!(
            resolve_venv(EnvKind::Venv, &t.join("v3"), &ctx(Path::new("/x"))),
            Err(EnvError::VersionMismatch { .. })
        ));
    }

    #[test]
    fn broken_and_broad_paths_are_refused_with_reasons() {
        let t = tempdir();
        std::fs::create_dir_all(t.join("empty")).unwrap();
        let c = ctx(&t.join("home/me"));
        let err = resolve_venv(EnvKind::Venv, &t.join("empty"), &c).unwrap_err();
        assert!(err.to_string().contains("pyvenv.cfg"), "{err}");
        for p in ["/", "/usr", "/etc/ssl", "/home"] {
            let err = resolve_venv(EnvKind::Venv, Path::new(p), &c).unwrap_err();
            assert!(matches!(err, EnvError::TooBroad { .. }), "{p}: {err}");
        }
        std::fs::create_dir_all(t.join("home/me")).unwrap();
        let err = resolve_venv(EnvKind::Venv, &t.join("home"), &c).unwrap_err();
        assert!(matches!(err, EnvError::TooBroad { .. }), "{err}");
        assert!(matches!(
            resolve_venv(EnvKind::Venv, Path::new("relative/v"), &c),
            Err(EnvError::NotAbsolute(_))
        ));
        assert!(matches!(
            resolve_venv(EnvKind::Venv, &t.join("missing"), &c),
            Err(EnvError::NotFound { .. })
        ));
        venv(&t.join("rootbase"), "home = /bin\n");
        assert!(matches!(
            resolve_venv(EnvKind::Venv, &t.join("rootbase"), &c),
            Err(EnvError::TooBroad { .. })
        ));
    }

    #[test]
    fn conda_by_name_and_by_prefix() {
        let t = tempdir();
        let prefix = t.join("miniconda3/envs/analysis");
        std::fs::create_dir_all(prefix.join("conda-meta")).unwrap();
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        std::fs::write(prefix.join("bin/python"), "").unwrap();
        let mut c = ctx(&t);
        let by_name = EnvRequest {
            kind: EnvKind::Conda,
            path: None,
            conda_name: Some("analysis".into()),
        };
        // Found in the usual folders under $HOME...
        assert_eq!(resolve(&by_name, &c).unwrap().prefix, prefix);
        // ...and through `conda env list --json` when conda answers.
        c.home = None;
        assert!(matches!(
            resolve(&by_name, &c),
            Err(EnvError::CondaNameNotFound(_))
        ));
        c.conda_envs = vec![prefix.clone()];
        let e = resolve(&by_name, &c).unwrap();
        assert_eq!(e.python, prefix.join("bin/python"));
        assert_eq!(e.base, None);
        let not_conda = EnvRequest {
            kind: EnvKind::Conda,
            path: Some(t.clone()),
            conda_name: None,
        };
        assert!(matches!(
            resolve(&not_conda, &c),
            Err(EnvError::NotConda(_))
        ));
    }

    #[test]
    fn kinds_parse_as_env_type_names_them() {
        assert_eq!(EnvKind::parse("venv-uv").unwrap(), EnvKind::UvVenv);
        assert_eq!(EnvKind::parse("conda").unwrap(), EnvKind::Conda);
        assert_eq!(EnvKind::parse("").unwrap(), EnvKind::Managed);
        assert!(EnvKind::parse("pipenv").is_err());
    }

    use crate::scratch::tempdir;
}
