//! The environment tools when the server has environments configured
//! ([`crate::env::state::Environments`]): `configure_environment`, `install_dependencies`,
//! and the environment part of `get_environment_config`. Translation only: resolution,
//! validation and installs live in [`crate::env`].

use std::path::PathBuf;

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use super::args;
use super::progress::Progress;
use super::report::{tool_error, with_structured};
use crate::env::manager::ManagerError;
use crate::env::state::Environments;
use crate::env::{spec, EnvKind, EnvRequest};
use crate::sandbox::Sandbox;

/// `configure_environment`: validate the new environment in a sandbox, then switch; a bad
/// one is refused and the previous configuration stays.
pub async fn configure(
    envs: &Environments,
    sandbox: &dyn Sandbox,
    a: args::ConfigureEnvironment,
) -> Result<CallToolResult, ErrorData> {
    let kind = EnvKind::parse(&a.env_type)
        .map_err(|e| ErrorData::invalid_params(format!("invalid argument `type`: {e}"), None))?;
    let path = match kind {
        EnvKind::Venv => a.venv_path.clone(),
        EnvKind::UvVenv => a.uv_venv_path.clone(),
        _ => None,
    };
    let request = EnvRequest {
        kind,
        path: path.map(PathBuf::from),
        conda_name: a.conda_name.clone(),
    };
    let before = envs.state.report().await;
    match envs
        .state
        .configure(sandbox, &envs.manager, Some(request))
        .await
    {
        Ok(report) => {
            let text = format!(
                "environment switched to {} at {} (Python {}), mounted read-only in every run",
                report.kind,
                report.path.display(),
                report.python_version
            );
            Ok(with_structured(text, &report, false))
        }
        Err(e) => Ok(tool_error(format!(
            "the environment was not changed: {e}\nstill using: {} at {}",
            before.kind,
            before.path.display()
        ))),
    }
}

/// `install_dependencies`: specs checked first, then pip in an installer container.
pub async fn install(
    envs: &Environments,
    sandbox: &dyn Sandbox,
    tenant: &str,
    packages: Vec<String>,
    ctx: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    for (i, p) in packages.iter().enumerate() {
        if let Err(e) = spec::validate(std::slice::from_ref(p)) {
            return Err(ErrorData::invalid_params(
                format!("invalid argument `packages[{i}]`: {e}"),
                None,
            ));
        }
    }
    if let Err(e) = spec::validate(&packages) {
        return Err(ErrorData::invalid_params(
            format!("invalid argument `packages`: {e}"),
            None,
        ));
    }
    let env = envs.state.current().await;
    let (progress, events) = Progress::start(ctx);
    let result = tokio::select! {
        r = envs.manager.install(sandbox, &env, tenant, &packages, events) => r,
        _ = ctx.ct.cancelled() => {
            Err(ManagerError::Failed {
                what: "pip install",
                status: "cancelled by the client".into(),
                stderr: "the installer container was stopped".into(),
            })
        }
    };
    if let Some(p) = progress {
        p.finish().await;
    }
    Ok(match result {
        Ok(report) => {
            let lines: Vec<String> = report
                .installed
                .iter()
                .map(|p| match &p.version {
                    Some(v) => format!("{}: {v}", p.name),
                    None => format!("{}: not found after the install", p.name),
                })
                .collect();
            let text = format!(
                "installed into {} ({}):\n{}",
                env.prefix.display(),
                env.kind,
                lines.join("\n")
            );
            with_structured(text, &report, false)
        }
        Err(e) => tool_error(format!(
            "the install failed and the environment is unchanged where pip left it usable: {e}"
        )),
    })
}
