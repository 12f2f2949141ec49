//! The environment a server's runs use right now, and how it changes: what
//! `configure_environment` and `get_environment_config` act on. A new configuration is
//! validated (resolved, then its Python started in a sandbox) before it replaces the old
//! one; a bad one is refused and the old one stays.

use std::path::PathBuf;

use serde::Serialize;
use tokio::sync::RwLock;

use super::manager::{EnvManager, ManagerError, Probe};
use super::{resolve, Context, EnvKind, EnvRequest, Environment};
use crate::sandbox::Sandbox;

/// Environment variables of the tools we replace, read at start-up.
pub mod vars {
    /// `conda`, `venv` or `venv-uv`; unset means the managed default.
    pub const ENV_TYPE: &str = "ENV_TYPE";
    pub const CONDA_ENV_NAME: &str = "CONDA_ENV_NAME";
    pub const VENV_PATH: &str = "VENV_PATH";
    pub const UV_VENV_PATH: &str = "UV_VENV_PATH";
}

/// The request the environment variables make; `None` is the managed default. A bare
/// `CONDA_ENV_NAME` (the oldest configuration of the tools we replace) still means conda.
pub fn request_from_vars(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<EnvRequest>, super::EnvError> {
    let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    let kind = match (get(vars::ENV_TYPE), get(vars::CONDA_ENV_NAME)) {
        (Some(t), _) => EnvKind::parse(&t)?,
        (None, Some(_)) => EnvKind::Conda,
        (None, None) => return Ok(None),
    };
    let path = match kind {
        EnvKind::Venv => get(vars::VENV_PATH),
        EnvKind::UvVenv => get(vars::UV_VENV_PATH),
        _ => None,
    };
    if kind == EnvKind::Managed {
        return Ok(None);
    }
    Ok(Some(EnvRequest {
        kind,
        path: path.map(PathBuf::from),
        conda_name: get(vars::CONDA_ENV_NAME),
    }))
}

/// What `get_environment_config` reports.
#[derive(Debug, Clone, Serialize)]
pub struct EnvReport {
    #[serde(rename = "type")]
    pub kind: EnvKind,
    pub path: PathBuf,
    pub python: PathBuf,
    pub python_version: String,
    /// The base interpreter mounted beside a venv, if any.
    pub base_prefix: Option<PathBuf>,
    /// How runs see it.
    pub mount: &'static str,
    /// How `install_dependencies` installs into it.
    pub installs: &'static str,
}

/// What a server needs for environments: the manager (managed envs, installs, locks) and
/// the current environment.
pub struct Environments {
    pub manager: EnvManager,
    pub state: EnvState,
}

/// The current environment of one tenant.
pub struct EnvState {
    tenant: String,
    current: RwLock<(Environment, Probe)>,
    /// On a multi-tenant server: the roots under which this tenant may configure an
    /// environment (its managed one is always allowed); `None`: anywhere on the server.
    allowed: Option<Vec<PathBuf>>,
}

impl EnvState {
    /// Start with `request` (or the managed default), validated in a sandbox.
    pub async fn init(
        sandbox: &dyn Sandbox,
        manager: &EnvManager,
        tenant: &str,
        request: Option<EnvRequest>,
    ) -> Result<EnvState, ManagerError> {
        let both = validate(sandbox, manager, tenant, request.as_ref()).await?;
        Ok(EnvState {
            tenant: tenant.to_string(),
            allowed: None,
            current: RwLock::new(both),
        })
    }

    /// The environment runs use now.
    pub async fn current(&self) -> Environment {
        self.current.read().await.0.clone()
    }

    /// Let configure_environment choose only environments under `roots` (and the tenant's
    /// managed one); installs then go only into the managed one, the others being shared.
    pub fn restrict_to(mut self, roots: Vec<PathBuf>) -> Self {
        self.allowed = Some(roots);
        self
    }

    /// May install_dependencies write into `env`? Everywhere on a single-tenant server; on a
    /// multi-tenant one only into the tenant's own managed environment.
    pub fn installs_allowed(&self, env: &Environment) -> bool {
        self.allowed.is_none() || env.kind == EnvKind::Managed
    }

    /// Switch to `request` if it validates; otherwise keep the current one and say why.
    pub async fn configure(
        &self,
        sandbox: &dyn Sandbox,
        manager: &EnvManager,
        request: Option<EnvRequest>,
    ) -> Result<EnvReport, ManagerError> {
        if let (Some(roots), Some(r)) = (&self.allowed, &request) {
            if r.kind != EnvKind::Managed {
                let env = resolve(r, &Context::from_host())?;
                let dirs = std::iter::once(&env.prefix).chain(env.base.as_ref());
                for dir in dirs {
                    if !roots.iter().any(|root| dir.starts_with(root)) {
                        return Err(ManagerError::NotAllowed(format!(
                            "{} is outside the environments this tenant may use ({}); the operator lists them in `env_paths` of the tenants file",
                            dir.display(),
                            if roots.is_empty() {
                                "none: only `default`, the tenant's own managed environment".to_string()
                            } else {
                                roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
                            }
                        )));
                    }
                }
            }
        }
        let both = validate(sandbox, manager, &self.tenant, request.as_ref()).await?;
        let report = report_of(&both.0, &both.1);
        sandbox.prewarm(&self.tenant, &both.0.run_env()).await;
        *self.current.write().await = both;
        Ok(report)
    }

    pub async fn report(&self) -> EnvReport {
        let cur = self.current.read().await;
        report_of(&cur.0, &cur.1)
    }
}

async fn validate(
    sandbox: &dyn Sandbox,
    manager: &EnvManager,
    tenant: &str,
    request: Option<&EnvRequest>,
) -> Result<(Environment, Probe), ManagerError> {
    let env = match request {
        None => manager.ensure_managed(sandbox, tenant).await?,
        Some(r) if r.kind == EnvKind::Managed => manager.ensure_managed(sandbox, tenant).await?,
        Some(r) => resolve(r, &Context::from_host())?,
    };
    let probe = manager.probe(sandbox, &env).await?;
    Ok((env, probe))
}

fn report_of(env: &Environment, probe: &Probe) -> EnvReport {
    EnvReport {
        kind: env.kind,
        path: env.prefix.clone(),
        python: env.python.clone(),
        python_version: probe.version.clone(),
        base_prefix: env.base.clone(),
        mount: "read-only bind mount at the same path in every sandbox",
        installs: "pip in a separate installer container: the environment mounted read-write, network on for that container only",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn req(vars: &[(&str, &str)]) -> Result<Option<EnvRequest>, super::super::EnvError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        request_from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn variables_map_as_the_old_tools_read_them() {
        assert_eq!(req(&[]).unwrap(), None);
        let r = req(&[("ENV_TYPE", "venv"), ("VENV_PATH", "/srv/v")])
            .unwrap()
            .unwrap();
        assert_eq!((r.kind, r.path), (EnvKind::Venv, Some("/srv/v".into())));
        let r = req(&[
            ("ENV_TYPE", "venv-uv"),
            ("UV_VENV_PATH", "/srv/u"),
            ("VENV_PATH", "/x"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((r.kind, r.path), (EnvKind::UvVenv, Some("/srv/u".into())));
        // Only a conda name, as the earliest configurations had it.
        let r = req(&[("CONDA_ENV_NAME", "ds")]).unwrap().unwrap();
        assert_eq!(
            (r.kind, r.conda_name.as_deref()),
            (EnvKind::Conda, Some("ds"))
        );
        assert!(req(&[("ENV_TYPE", "pipenv")]).is_err());
        assert_eq!(req(&[("ENV_TYPE", "  ")]).unwrap(), None);
    }
}
