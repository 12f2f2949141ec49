//! The environment tools when the server has environments configured
//! ([`crate::env::state::Environments`]): `configure_environment`, `install_dependencies`,
//! and the environment part of `get_environment_config`. Translation only: resolution,
//! validation and installs live in [`crate::env`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ProgressNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use tokio::sync::mpsc::unbounded_channel;
use tokio::task::JoinHandle;

use super::args;
use super::report::{tool_error, with_structured};
use crate::env::manager::{InstallEvent, InstallEvents, ManagerError, Phase};
use crate::env::state::Environments;
use crate::env::{spec, EnvKind, EnvRequest};
use crate::job::RunEvent;
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

/// How an install call ended, for the metrics: `ok`, `failed` or `refused`.
pub type InstallOutcome = &'static str;

/// `install_dependencies`: specs checked first, then the two installer phases into the
/// current environment (read once: the environment checked is the one written to).
pub async fn install(
    envs: &Environments,
    sandbox: Arc<dyn Sandbox>,
    packages: Vec<String>,
    ctx: &RequestContext<RoleServer>,
) -> Result<(CallToolResult, InstallOutcome), ErrorData> {
    check_specs(&packages)?;
    let (progress, events) = start_progress(ctx);
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
        let _ = tokio::time::timeout(Duration::from_secs(2), p).await;
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

/// At most one output notification per phase per this interval.
const OUTPUT_EVERY: Duration = Duration::from_millis(500);

/// Forward the install's events as progress notifications naming the phase, if the
/// client sent a progress token.
fn start_progress(ctx: &RequestContext<RoleServer>) -> (Option<JoinHandle<()>>, InstallEvents) {
    let Some(token) = ctx.meta.get_progress_token() else {
        return (None, None);
    };
    let (tx, mut rx) = unbounded_channel::<InstallEvent>();
    let peer = ctx.peer.clone();
    let task = tokio::spawn(async move {
        let mut step = 0.0;
        let mut send = |message: String| {
            step += 1.0;
            let param = ProgressNotificationParam::new(token.clone(), step).with_message(message);
            let peer = peer.clone();
            async move {
                if let Err(e) = peer.notify_progress(param).await {
                    tracing::debug!(error = %e, "progress notification not delivered");
                }
            }
        };
        let mut bytes = 0usize;
        let mut last: Option<Instant> = None;
        while let Some(event) = rx.recv().await {
            match event {
                InstallEvent::Begin(Phase::Fetching) => {
                    send("fetching: downloading wheels (network on, no environment mounted)".into())
                        .await
                }
                InstallEvent::Begin(Phase::Installing) => {
                    bytes = 0;
                    last = None;
                    send("installing: pip installs the wheels (network off)".into()).await
                }
                InstallEvent::Run(p, RunEvent::Created { .. }) => {
                    send(format!("{}: installer container created", p.as_str())).await
                }
                InstallEvent::Run(p, RunEvent::Started) => {
                    send(format!("{}: pip started", p.as_str())).await
                }
                InstallEvent::Run(p, RunEvent::Output { data, .. }) => {
                    bytes += data.len();
                    if last.is_none_or(|t| t.elapsed() >= OUTPUT_EVERY) {
                        last = Some(Instant::now());
                        send(format!(
                            "{}: {bytes} bytes of pip output so far",
                            p.as_str()
                        ))
                        .await;
                    }
                }
            }
        }
        send("finished".into()).await;
    });
    (Some(task), Some(tx))
}
