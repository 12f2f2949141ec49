//! The environment tools when the server has environments configured
//! ([`crate::env::state::Environments`]): `configure_environment`, `install_dependencies`,
//! and the environment part of `get_environment_config`. Translation only: resolution,
//! validation and installs live in [`crate::env`].

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};

use super::args;
use super::progress::{Narration, OutputThrottle, Progress};
use super::report::{tool_error, with_structured};
use crate::backend::Backend;
use crate::env::manager::{InstallEvent, ManagerError, Phase};
use crate::env::state::Environments;
use crate::env::{spec, EnvKind, EnvRequest};
use crate::job::RunEvent;

/// `configure_environment`: validate the new environment in a sandbox, then switch; a bad
/// one is refused and the previous configuration stays.
pub async fn configure(
    envs: &Environments,
    sandbox: &dyn Backend,
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

/// How an install call ended, for the metrics: `ok`, `failed` or `refused`.
pub type InstallOutcome = &'static str;

/// `install_dependencies`, once the caller checked the specs ([`check_specs`]): the two
/// installer phases into the current environment (read once: the environment checked is
/// the one written to).
pub async fn install(
    envs: &Environments,
    sandbox: Arc<dyn Backend>,
    packages: Vec<String>,
    ctx: &RequestContext<RoleServer>,
) -> Result<(CallToolResult, InstallOutcome), ErrorData> {
    let (progress, events) = Progress::start_with(ctx, InstallNarration::default());
    let result = tokio::select! {
        r = envs.install(sandbox, &packages, events) => r,
        _ = ctx.ct.cancelled() => {
            Err(ManagerError::Failed {
                what: "the install",
                status: "cancelled by the client".into(),
                stderr: "the installer container was stopped (an install phase already begun runs to its end)".into(),
            })
        }
    };
    if let Some(p) = progress {
        p.finish().await;
    }
    Ok(match result {
        Ok(report) => {
            let line = |p: &crate::env::manager::PackageStatus| match &p.version {
                Some(v) => format!("{}: {v}", p.name),
                None => format!("{}: not found after the install", p.name),
            };
            let mut text = format!(
                "installed into {} ({}):\n{}",
                report.environment.path.display(),
                report.environment.kind,
                report
                    .installed
                    .iter()
                    .map(line)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            if !report.dependencies.is_empty() {
                text.push_str(&format!(
                    "\ndependencies installed with them:\n{}",
                    report
                        .dependencies
                        .iter()
                        .map(line)
                        .collect::<Vec<_>>()
                        .join("\n")
                ));
            }
            (with_structured(text, &report, false), "ok")
        }
        Err(ManagerError::NotAllowed(why)) => (
            tool_error(format!(
                "nothing was installed ({}): {why}",
                packages.join(", ")
            )),
            "refused",
        ),
        Err(e @ ManagerError::NotAvailable { .. }) => {
            (tool_error(format!("the install failed: {e}")), "failed")
        }
        Err(e) => (
            tool_error(format!(
                "the install failed and the environment is unchanged where pip left it usable: {e}"
            )),
            "failed",
        ),
    })
}

/// The install's arguments, checked before anything runs: a protocol error naming the
/// bad `packages[i]`.
pub fn check_specs(packages: &[String]) -> Result<(), ErrorData> {
    for (i, p) in packages.iter().enumerate() {
        if let Err(e) = spec::validate(std::slice::from_ref(p)) {
            return Err(ErrorData::invalid_params(
                format!("invalid argument `packages[{i}]`: {e}"),
                None,
            ));
        }
    }
    if let Err(e) = spec::validate(packages) {
        return Err(ErrorData::invalid_params(
            format!("invalid argument `packages`: {e}"),
            None,
        ));
    }
    Ok(())
}

/// An install's phases, as progress messages.
#[derive(Default)]
struct InstallNarration {
    output: OutputThrottle,
}

impl Narration<InstallEvent> for InstallNarration {
    fn describe(&mut self, event: InstallEvent) -> Option<String> {
        match event {
            InstallEvent::Begin(Phase::Fetching) => {
                Some("fetching: downloading wheels (network on, no environment mounted)".into())
            }
            InstallEvent::Begin(Phase::Installing) => {
                self.output = OutputThrottle::default();
                Some("installing: pip installs the wheels (network off)".into())
            }
            InstallEvent::Run(p, RunEvent::Created { .. }) => {
                Some(format!("{}: installer container created", p.as_str()))
            }
            InstallEvent::Run(p, RunEvent::Started) => Some(format!("{}: pip started", p.as_str())),
            InstallEvent::Run(p, RunEvent::Output { data, .. }) => {
                self.output.add(data.len()).then(|| {
                    format!(
                        "{}: {} bytes of pip output so far",
                        p.as_str(),
                        self.output.bytes
                    )
                })
            }
        }
    }

    fn last(&self) -> String {
        "finished".into()
    }
}
