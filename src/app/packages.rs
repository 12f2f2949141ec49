//! Packages and environments of a tenant: which packages its runs can import (answered by a
//! probe run in the sandbox, so it is exactly what code sees), installs into its current
//! environment, and switching environments. Resolution, validation and the installer
//! containers live in [`crate::env`]; here they get admission, metrics and cancellation
//! like every other run.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::error::AppError;
use super::executor::Executor;
use crate::env::manager::{InstallEvents, InstallReport, ManagerError};
use crate::env::state::EnvReport;
use crate::env::{spec, EnvKind, EnvRequest};
use crate::job::JobSpec;

/// One package asked about in check_installed_packages.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PackageStatus {
    /// The name as asked for.
    pub name: String,
    /// True when the environment has it.
    pub installed: bool,
    /// The installed version, when installed.
    pub version: Option<String>,
}

/// The answer of a package check.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PackagesReport {
    /// The type of the environment that was inspected (`default`: the managed
    /// environment, or the sandbox image's Python when environments are off; `venv`,
    /// `venv-uv`, `conda`).
    pub environment: String,
    /// Its directory, when environments are on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Each package asked about, in order.
    pub packages: Vec<PackageStatus>,
}

/// An environment as a client names it (configure_environment's arguments).
#[derive(Debug, Clone, Default)]
pub struct EnvAsked {
    /// `conda`, `venv`, `venv-uv` or `default`.
    pub env_type: String,
    pub venv_path: Option<String>,
    pub uv_venv_path: Option<String>,
    pub conda_name: Option<String>,
}

/// Distribution names we pass to the probe script: PyPI's allowed characters only, so the
/// JSON list is also a safe Python literal.
pub fn check_package_names(packages: &[String]) -> Result<(), AppError> {
    if packages.is_empty() || packages.len() > 200 {
        return Err(AppError::Invalid(
            "invalid argument `packages`: give between 1 and 200 package names".into(),
        ));
    }
    for (i, p) in packages.iter().enumerate() {
        let ok = !p.is_empty()
            && p.len() <= 100
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
            && p.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        if !ok {
            return Err(AppError::Invalid(format!(
                "invalid argument `packages[{i}]`: `{p}` is not a package name (letters, digits, `.`, `_`, `-`; no version specifiers)"
            )));
        }
    }
    Ok(())
}

/// An install's requirement specifiers, checked before anything runs: the bad
/// `packages[i]` named.
pub fn check_specs(packages: &[String]) -> Result<(), AppError> {
    for (i, p) in packages.iter().enumerate() {
        if let Err(e) = spec::validate(std::slice::from_ref(p)) {
            return Err(AppError::Invalid(format!(
                "invalid argument `packages[{i}]`: {e}"
            )));
        }
    }
    spec::validate(packages)
        .map_err(|e| AppError::Invalid(format!("invalid argument `packages`: {e}")))
}

const PACKAGE_PROBE: &str = r#"
import json, re, importlib.metadata as md
out = []
for name in NAMES:
    version = None
    for candidate in (name, re.sub(r"[-_.]+", "-", name).lower(), re.sub(r"[-_.]+", "_", name).lower()):
        try:
            version = md.version(candidate)
            break
        except md.PackageNotFoundError:
            pass
    out.append({"name": name, "installed": version is not None, "version": version})
print(json.dumps(out))
"#;

/// Which of `names` the current environment has, by a probe run in the sandbox (it
/// counts as a run). The environment is read once: the one checked is the one reported.
pub async fn check_packages(
    ex: &Executor,
    names: &[String],
    events: crate::backend::Events,
    cancel: &CancellationToken,
) -> Result<PackagesReport, AppError> {
    check_package_names(names)?;
    let names_json = serde_json::to_string(names).unwrap_or_default();
    let code = PACKAGE_PROBE.replace("NAMES", &names_json);
    let mut limits = ex.settings.limits.clone();
    limits.timeout = std::time::Duration::from_secs(30).min(ex.settings.max_timeout);
    let mut job = JobSpec::python(code, limits);
    job.tenant = ex.tenant().to_string();
    let env = ex.current_env().await;
    let (environment, path) = match &env {
        Some(e) => (
            e.kind.as_str().to_string(),
            Some(e.prefix.display().to_string()),
        ),
        None => ("default".to_string(), None),
    };
    let outcome = match ex.run(job, env, events, cancel).await {
        Ok(o) if o.success() => o,
        Ok(o) => {
            return Err(AppError::Failed(format!(
                "the package check failed in the sandbox: {}\n{}",
                o.status_line(),
                o.stderr_text()
            )))
        }
        Err(e) => {
            return Err(AppError::Failed(format!(
                "the package check could not run: {e}"
            )))
        }
    };
    let packages: Vec<PackageStatus> = serde_json::from_slice(&outcome.stdout).map_err(|e| {
        AppError::Failed(format!("the package check gave an unreadable answer: {e}"))
    })?;
    Ok(PackagesReport {
        environment,
        path,
        packages,
    })
}

/// [`install`], with what pip said it did read from its output ([`super::pip`]): the one
/// call of `install_dependencies`.
pub async fn install_dependencies(
    ex: &Executor,
    principal: Option<&str>,
    packages: &[String],
    events: InstallEvents,
    cancel: &CancellationToken,
) -> Result<(InstallReport, super::pip::PipSaid), AppError> {
    let report = install(ex, principal, packages, events, cancel).await?;
    let said = super::pip::what_pip_did(&report);
    Ok((report, said))
}

/// Install `packages` into the current environment (two installer phases; the
/// environment is read once, so the one checked is the one written to). Counts as a run
/// of the tenant's quota; refused without environments or without `install_network`.
/// One that ran (whatever its end) is a usage record of kind `install` of `principal`
/// (the caller's [`crate::tenancy::oauth::Principal::owner`]).
pub async fn install(
    ex: &Executor,
    principal: Option<&str>,
    packages: &[String],
    events: InstallEvents,
    cancel: &CancellationToken,
) -> Result<InstallReport, AppError> {
    let tenant = ex.tenant();
    let Some(envs) = ex.environments() else {
        check_package_names(packages)?;
        return Err(AppError::Failed(format!(
            "install_dependencies is not available on this server instance (it runs without environments): the sandbox runs the image's default Python, mounted read-only, \
             and installing into environments is a later feature of this server. Nothing was installed ({}). \
             What works today: check_installed_packages tells you which packages the default environment already has \
             (numpy and the standard library among them); write code that uses those.",
            packages.join(", ")
        )));
    };
    let refused = |why: String| {
        ex.metrics().install(tenant, "refused");
        AppError::Failed(format!(
            "nothing was installed ({}): {why}",
            packages.join(", ")
        ))
    };
    if !ex.settings.quota.install_network {
        return Err(refused(format!(
            "tenant `{tenant}` may not install packages (install_network = false in the tenants file; installs need the network). \
             Use what the environment has: check_installed_packages lists it"
        )));
    }
    // An install starts containers: it counts as a run of the tenant's quota (a
    // malformed request is refused before it costs one).
    check_specs(packages)?;
    if let Err(e) = ex.admit() {
        return Err(refused(e.to_string()));
    }
    let _span = crate::telemetry::span("install").with("mcp_executor.packages", packages.len());
    let started = std::time::Instant::now();
    let result = tokio::select! {
        r = envs.install(ex.backend_in_slots(), packages, events) => r,
        _ = cancel.cancelled() => {
            Err(ManagerError::Failed {
                what: "the install",
                status: "cancelled by the client".into(),
                stderr: "the installer container was stopped (an install phase already begun runs to its end)".into(),
            })
        }
    };
    let (result, label) = match result {
        Ok(report) => (Ok(report), "ok"),
        Err(ManagerError::NotAllowed(why)) => (
            Err(AppError::Failed(format!(
                "nothing was installed ({}): {why}",
                packages.join(", ")
            ))),
            "refused",
        ),
        Err(e @ ManagerError::NotAvailable { .. }) => (
            Err(AppError::Failed(format!("the install failed: {e}"))),
            "failed",
        ),
        Err(e) => (
            Err(AppError::Failed(format!(
                "the install failed and the environment is unchanged where pip left it usable: {e}"
            ))),
            "failed",
        ),
    };
    if label != "refused" {
        super::usage::record_install(tenant, principal, label, started.elapsed().as_secs_f64());
    }
    ex.metrics().install(tenant, label);
    result
}

/// Switch the environment runs use to the one `asked` names (validated in a sandbox
/// first: it counts as a run); a bad one is refused and the previous one stays.
pub async fn configure(ex: &Executor, asked: EnvAsked) -> Result<EnvReport, AppError> {
    let Some(envs) = ex.environments() else {
        if !matches!(asked.env_type.as_str(), "conda" | "venv" | "venv-uv") {
            return Err(AppError::Invalid(format!(
                "invalid argument `type`: `{}`; use `conda`, `venv` or `venv-uv`",
                asked.env_type
            )));
        }
        return Err(AppError::Failed(format!(
            "configure_environment is not available on this server instance (it runs without environments): switching to a `{}` environment is not possible here, \
             and the configuration was not changed. What works today: code runs in the sandbox image's default Python \
             (see get_environment_config; check_installed_packages lists what it has).",
            asked.env_type
        )));
    };
    let kind = EnvKind::parse(&asked.env_type)
        .map_err(|e| AppError::Invalid(format!("invalid argument `type`: {e}")))?;
    let path = match kind {
        EnvKind::Venv => asked.venv_path,
        EnvKind::UvVenv => asked.uv_venv_path,
        _ => None,
    };
    let request = EnvRequest {
        kind,
        path: path.map(std::path::PathBuf::from),
        conda_name: asked.conda_name,
    };
    if let Err(e) = ex.admit() {
        return Err(AppError::Failed(format!(
            "the environment was not changed: {e}"
        )));
    }
    let before = envs.state.report().await;
    envs.state
        .configure(&*ex.backend_in_slots(), &envs.manager, Some(request))
        .await
        .map_err(|e| {
            AppError::Failed(format!(
                "the environment was not changed: {e}\nstill using: {} at {}",
                before.kind,
                before.path.display()
            ))
        })
}

/// The current environment, when the server has environments.
pub async fn environment_report(ex: &Executor) -> Option<EnvReport> {
    match ex.environments() {
        Some(envs) => Some(envs.state.report().await),
        None => None,
    }
}
