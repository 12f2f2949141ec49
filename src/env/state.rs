//! The environment a server's runs use right now, and how it changes: what
//! `configure_environment` and `get_environment_config` act on. A new configuration is
//! validated (resolved, then its Python started in a sandbox) before it replaces the old
//! one; a bad one is refused and the old one stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::RwLock;

use super::manager::{
    EnvManager, Install, InstallCaps, InstallEvents, InstallReport, ManagerError, Probe,
};
use super::{resolve, Context, EnvKind, EnvRequest, Environment};
use crate::backend::Backend;
use crate::config::EnvSelection;

/// The request the environment variables make (`ENV_TYPE` and its companions, declared in
/// [`crate::config::vars`]); `None` is the managed default.
pub fn request_from_vars(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<EnvRequest>, super::EnvError> {
    request_from(&EnvSelection::from_vars(get))
}

/// The request a configured selection makes; `None` is the managed default. A bare
/// `CONDA_ENV_NAME` (the oldest configuration of the tools we replace) still means conda.
pub fn request_from(sel: &EnvSelection) -> Result<Option<EnvRequest>, super::EnvError> {
    let kind = match (&sel.env_type, &sel.conda_env_name) {
        (Some(t), _) => EnvKind::parse(t)?,
        (None, Some(_)) => EnvKind::Conda,
        (None, None) => return Ok(None),
    };
    let path = match kind {
        EnvKind::Venv => sel.venv_path.clone(),
        EnvKind::UvVenv => sel.uv_venv_path.clone(),
        _ => None,
    };
    if kind == EnvKind::Managed {
        return Ok(None);
    }
    Ok(Some(EnvRequest {
        kind,
        path,
        conda_name: sel.conda_env_name.clone(),
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

impl Environments {
    /// Install `specs` into the current environment, if this tenant may write into it.
    /// The environment is read once: the one checked is the one written to, even if
    /// configure_environment switches to another meanwhile.
    pub async fn install(
        &self,
        sandbox: Arc<dyn Backend>,
        specs: &[String],
        events: InstallEvents,
    ) -> Result<InstallReport, ManagerError> {
        let (env, probe) = self.state.snapshot().await;
        if !self.state.installs_allowed(&env) {
            return Err(ManagerError::NotAllowed(format!(
                "the current environment ({}) is shared by the operator and read-only for tenants; \
                 switch to your own with configure_environment type `default`, then install",
                env.prefix.display()
            )));
        }
        let req = Install {
            env: &env,
            python_version: &probe.version,
            tenant: &self.state.tenant,
            specs,
            caps: self.state.caps,
        };
        self.manager.install(sandbox, req, events).await
    }
}

/// The current environment of one tenant.
pub struct EnvState {
    tenant: String,
    current: RwLock<(Environment, Probe)>,
    /// On a multi-tenant server: the roots under which this tenant may configure an
    /// environment (its managed one is always allowed); `None`: anywhere on the server.
    allowed: Option<Vec<PathBuf>>,
    /// On a single-tenant server: the roots under which configure_environment may pick an
    /// environment (canonical): the data directory, `MCP_EXECUTOR_ENV_ROOTS`, and the
    /// environment configured at start-up with its base interpreter's prefix.
    local_roots: Vec<PathBuf>,
    /// The tenant's limits, which its installer containers stay within.
    caps: InstallCaps,
}

impl EnvState {
    /// Start with `request` (or the managed default), validated in a sandbox.
    pub async fn init(
        sandbox: &dyn Backend,
        manager: &EnvManager,
        tenant: &str,
        request: Option<EnvRequest>,
    ) -> Result<EnvState, ManagerError> {
        let env = match &request {
            Some(r) if r.kind != EnvKind::Managed => resolve(r, &manager.context())?,
            _ => manager.ensure_managed(sandbox, tenant).await?,
        };
        let probe = manager.probe(sandbox, &env, tenant).await?;
        let mut local_roots = manager.env_roots();
        if env.kind != EnvKind::Managed {
            local_roots.push(env.prefix.clone());
            local_roots.extend(env.base.clone());
        }
        let local_roots = local_roots
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        Ok(EnvState {
            tenant: tenant.to_string(),
            allowed: None,
            local_roots,
            current: RwLock::new((env, probe)),
            caps: InstallCaps::default(),
        })
    }

    /// The environment runs use now.
    pub async fn current(&self) -> Environment {
        self.current.read().await.0.clone()
    }

    /// The environment runs use now and what its Python said about itself, read together.
    pub async fn snapshot(&self) -> (Environment, Probe) {
        self.current.read().await.clone()
    }

    /// Let configure_environment choose only environments under `roots` (and the tenant's
    /// managed one); installs then go only into the managed one, the others being shared.
    pub fn restrict_to(mut self, roots: Vec<PathBuf>) -> Self {
        self.allowed = Some(roots);
        self
    }

    /// Keep this tenant's installer containers within its own limits.
    pub fn cap_installs(&mut self, caps: InstallCaps) {
        self.caps = caps;
    }

    /// May install_dependencies write into `env`? Everywhere on a single-tenant server; on a
    /// multi-tenant one only into the tenant's own managed environment.
    pub fn installs_allowed(&self, env: &Environment) -> bool {
        self.allowed.is_none() || env.kind == EnvKind::Managed
    }

    /// Switch to `request` if it validates; otherwise keep the current one and say why.
    /// A restricted tenant's request is checked against its roots on the canonical path
    /// before anything of it is read, and refused with one message whatever the reason.
    pub async fn configure(
        &self,
        sandbox: &dyn Backend,
        manager: &EnvManager,
        request: Option<EnvRequest>,
    ) -> Result<EnvReport, ManagerError> {
        let env = match (&request, &self.allowed) {
            (None, _) => manager.ensure_managed(sandbox, &self.tenant).await?,
            (Some(r), _) if r.kind == EnvKind::Managed => {
                manager.ensure_managed(sandbox, &self.tenant).await?
            }
            (Some(r), None) => {
                let (roots, r, ctx) = (self.local_roots.clone(), r.clone(), manager.context());
                tokio::task::spawn_blocking(move || resolve_within(&r, &roots, &ctx, LOCAL_ROOTS))
                    .await
                    .map_err(|e| ManagerError::NotAllowed(e.to_string()))??
            }
            (Some(r), Some(roots)) => {
                let (roots, r, ctx) = (roots.clone(), r.clone(), manager.context());
                tokio::task::spawn_blocking(move || resolve_within(&r, &roots, &ctx, TENANT_ROOTS))
                    .await
                    .map_err(|e| ManagerError::NotAllowed(e.to_string()))??
            }
        };
        let probe = manager.probe(sandbox, &env, &self.tenant).await?;
        let report = report_of(&env, &probe);
        sandbox.prewarm(&self.tenant, &env.run_env()).await;
        *self.current.write().await = (env, probe);
        Ok(report)
    }

    pub async fn report(&self) -> EnvReport {
        let cur = self.current.read().await;
        report_of(&cur.0, &cur.1)
    }
}

/// Resolve `r` for a tenant restricted to `roots`. The path asked for is made canonical
/// and checked against the roots first; nothing outside them is read, and every refusal
/// has the same text, so a tenant cannot learn what exists on the host.
/// Who named the roots, for the refusal text: a tenant's `env_paths`.
pub(crate) const TENANT_ROOTS: (&str, &str) = ("this tenant", "`env_paths` in the tenants file");
/// The single-tenant server's allow list.
pub(crate) const LOCAL_ROOTS: (&str, &str) = (
    "this server",
    "the data directory, the environment configured at start-up and its base interpreter, and MCP_EXECUTOR_ENV_ROOTS",
);

pub(crate) fn resolve_within(
    r: &EnvRequest,
    roots: &[PathBuf],
    ctx: &Context,
    (who, named_by): (&str, &str),
) -> Result<Environment, ManagerError> {
    let inside = |p: &Path| roots.iter().any(|root| p.starts_with(root));
    let refuse = |asked: &dyn std::fmt::Display| {
        ManagerError::NotAllowed(format!(
            "`{asked}` is not an environment {who} may use: only `default` (the managed environment) and environments under {} ({named_by})",
            if roots.is_empty() {
                "no directory".to_string()
            } else {
                roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
            }
        ))
    };
    let asked: PathBuf = match (r.kind, &r.path, &r.conda_name) {
        (EnvKind::Venv | EnvKind::UvVenv | EnvKind::Conda, Some(p), _) => p.clone(),
        (EnvKind::Conda, None, Some(n)) if n.starts_with('/') => PathBuf::from(n),
        (EnvKind::Conda, None, Some(name)) => {
            let bad = name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']);
            if bad {
                return Err(refuse(name));
            }
            // By name, only among the allowed roots: `ROOT/NAME`, `ROOT/envs/NAME`, or a
            // prefix conda lists under a root.
            let listed = ctx
                .conda_envs
                .iter()
                .filter(|p| inside(p))
                .find(|p| p.file_name().is_some_and(|f| f == name.as_str()));
            let found = listed.cloned().or_else(|| {
                roots
                    .iter()
                    .flat_map(|root| [root.join(name), root.join("envs").join(name)])
                    .find(|p| p.join("conda-meta").is_dir())
            });
            match found {
                Some(p) => p,
                None => return Err(super::EnvError::CondaNameNotFound(name.clone()).into()),
            }
        }
        // Nothing named: resolution says what is missing without reading anything.
        _ => return Ok(resolve(r, ctx)?),
    };
    if !asked.is_absolute() {
        return Err(super::EnvError::NotAbsolute(asked).into());
    }
    let shown = asked.display();
    let real = match std::fs::canonicalize(&asked) {
        Ok(p) if inside(&p) => p,
        _ => return Err(refuse(&shown)),
    };
    let req = EnvRequest {
        kind: r.kind,
        path: Some(real),
        conda_name: None,
    };
    let env = resolve(&req, ctx).map_err(|e| match error_path(&e) {
        Some(p) if !inside(p) => refuse(&shown),
        _ => e.into(),
    })?;
    let dirs = std::iter::once(&env.prefix).chain(env.base.as_ref());
    for dir in dirs {
        if !inside(dir) {
            return Err(refuse(&shown));
        }
    }
    Ok(env)
}

/// The path an error names, if it names one.
fn error_path(e: &super::EnvError) -> Option<&Path> {
    use super::EnvError::*;
    match e {
        NotAbsolute(p) | NoPyvenvCfg(p) | NotConda(p) => Some(p),
        NotFound { path, .. }
        | BrokenVenv { path, .. }
        | TooBroad { path, .. }
        | VersionMismatch { path, .. } => Some(path),
        UnknownKind(_) | Missing { .. } | CondaNameNotFound(_) => None,
    }
}

fn report_of(env: &Environment, probe: &Probe) -> EnvReport {
    EnvReport {
        kind: env.kind,
        path: env.prefix.clone(),
        python: env.python.clone(),
        python_version: probe.version.clone(),
        base_prefix: env.base.clone(),
        mount: "read-only bind mount at the same path in every sandbox",
        installs: "in two installer containers: wheels fetched with network on and no environment mounted, then installed with the network off and the environment mounted read-write",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::env::testing::{tempdir, Gate, Recorder};
    use tokio::sync::oneshot;

    fn venv(dir: &Path, home: &str) {
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(
            dir.join("pyvenv.cfg"),
            format!("home = {home}\nversion = 3.11.2\n"),
        )
        .unwrap();
        std::fs::write(dir.join("bin/python"), "").unwrap();
    }

    fn venv_req(p: &Path) -> EnvRequest {
        EnvRequest {
            kind: EnvKind::Venv,
            path: Some(p.to_path_buf()),
            conda_name: None,
        }
    }

    /// A tenant switches to an operator-shared environment while its install is fetching:
    /// the install still goes into the managed environment that was checked, and nothing
    /// of the shared one is ever mounted writable.
    #[tokio::test]
    async fn an_install_goes_into_the_environment_that_was_checked() {
        let t = tempdir();
        let fake = Arc::new(Recorder::default());
        let m = EnvManager::new(t.join("data"), None);
        let state = EnvState::init(&*fake, &m, "acme", None)
            .await
            .unwrap()
            .restrict_to(vec![t.join("shared")]);
        let managed = m.managed_path("acme");
        let shared = t.join("shared/env");
        venv(&shared, "/usr/bin");
        let envs = Arc::new(Environments { manager: m, state });

        let (started, started_rx) = oneshot::channel();
        let (release_tx, release) = oneshot::channel();
        *fake.fetch_gate.lock().unwrap() = Some(Gate { started, release });
        let install = tokio::spawn({
            let (envs, fake) = (envs.clone(), fake.clone());
            async move { envs.install(fake, &["six".to_string()], None).await }
        });
        started_rx.await.unwrap();
        envs.state
            .configure(&*fake, &envs.manager, Some(venv_req(&shared)))
            .await
            .expect("the switch itself is allowed");
        assert_eq!(envs.state.current().await.prefix, shared);
        release_tx.send(()).unwrap();
        let report = install.await.unwrap().expect("install");
        assert_eq!(report.environment.path, managed);
        let writable: Vec<PathBuf> = fake
            .jobs()
            .iter()
            .flat_map(|j| j.env.sources.clone())
            .filter(|m| m.writable())
            .map(|m| m.target().to_path_buf())
            .collect();
        assert!(writable.contains(&managed), "{writable:?}");
        assert!(
            !writable.iter().any(|p| p.starts_with(&shared)),
            "{writable:?}"
        );

        // With the shared one current, an install is refused before any container.
        let before = fake.jobs().len();
        let err = envs
            .install(fake.clone(), &["six".to_string()], None)
            .await
            .unwrap_err();
        assert!(matches!(err, ManagerError::NotAllowed(_)), "{err}");
        assert_eq!(fake.jobs().len(), before);
        // Probes and creation carry the tenant's label.
        assert!(fake.jobs().iter().all(|j| j.tenant == "acme"));
        std::fs::remove_dir_all(t).ok();
    }

    #[test]
    fn a_restricted_tenant_learns_nothing_outside_its_roots() {
        let t = tempdir();
        let root = t.join("allowed");
        venv(&root.join("v"), "/usr/bin");
        venv(&t.join("outside/v"), "/usr/bin");
        std::fs::create_dir_all(t.join("outside/python/bin")).unwrap();
        venv(
            &root.join("based-outside"),
            &t.join("outside/python/bin").display().to_string(),
        );
        venv(
            &root.join("broken-base"),
            &t.join("nowhere/bin").display().to_string(),
        );
        std::os::unix::fs::symlink(t.join("outside/v"), root.join("link")).unwrap();
        let ctx = Context {
            home: None,
            image_python: "3.11".into(),
            conda_envs: vec![t.join("outside/v")],
        };
        let roots = vec![root.clone()];
        let env = resolve_within(&venv_req(&root.join("v")), &roots, &ctx, TENANT_ROOTS).unwrap();
        assert_eq!(env.prefix, root.join("v"));

        let asked = [
            t.join("outside/v"),
            t.join("no/such/dir"),
            PathBuf::from("/etc/passwd"),
            PathBuf::from("/"),
            root.join("../outside/v"),
            root.join("link"),
            root.join("based-outside"),
            root.join("broken-base"),
        ];
        let mut messages = vec![];
        for p in &asked {
            let err = resolve_within(&venv_req(p), &roots, &ctx, TENANT_ROOTS).unwrap_err();
            assert!(
                matches!(err, ManagerError::NotAllowed(_)),
                "{}: {err}",
                p.display()
            );
            messages.push(
                err.to_string()
                    .replace(&format!("`{}`", p.display()), "`ASKED`"),
            );
        }
        assert!(messages.windows(2).all(|w| w[0] == w[1]), "{messages:#?}");
        assert!(!messages[0].contains("outside"), "{}", messages[0]);

        // Conda names are looked up under the roots only.
        let conda = |name: &str| EnvRequest {
            kind: EnvKind::Conda,
            path: None,
            conda_name: Some(name.into()),
        };
        assert!(resolve_within(&conda("../outside/v"), &roots, &ctx, TENANT_ROOTS).is_err());
        assert!(matches!(
            resolve_within(&conda("v"), &roots, &ctx, TENANT_ROOTS),
            Err(ManagerError::Env(
                super::super::EnvError::CondaNameNotFound(_)
            ))
        ));
        std::fs::create_dir_all(root.join("envs/ds/conda-meta")).unwrap();
        std::fs::create_dir_all(root.join("envs/ds/bin")).unwrap();
        std::fs::write(root.join("envs/ds/bin/python"), "").unwrap();
        assert_eq!(
            resolve_within(&conda("ds"), &roots, &ctx, TENANT_ROOTS)
                .unwrap()
                .prefix,
            root.join("envs/ds")
        );
        std::fs::remove_dir_all(t).ok();
    }
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
