//! Packages and environments: `install_dependencies`, `check_installed_packages`,
//! `configure_environment`, `get_environment_config`.

use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};

use super::{answer, CodeExecutor};
use crate::app::packages::{self, EnvAsked, PackagesReport};
use crate::env::manager::{InstallEvent, PackageStatus, Phase};
use crate::job::RunEvent;
use crate::mcp::args::{self, Args};
use crate::mcp::progress::{Narration, OutputThrottle, Progress};
use crate::mcp::report::{with_structured, EnvironmentReport, LimitsReport};
use crate::storage;

const INSTALL_DEPENDENCIES: &str = "Install Python packages (from PyPI, with pip) into the current execution environment, for the runs that follow. \
Give plain requirement specifiers such as `six`, `pandas>=2` or `requests[socks]==2.31.0`; URLs, paths and pip options are refused. \
The install runs in separate installer containers (wheels are downloaded with network access, then installed without; runs themselves have none) and may take a minute; \
only packages that publish wheels (binary packages) for the environment's Python install, source builds are not run. The result lists the installed versions, dependencies included. \
Check first with check_installed_packages: numpy, pandas and matplotlib are already there in the default environment.";

const CHECK_INSTALLED_PACKAGES: &str = "Check which of the given packages are installed in the execution environment, with their versions. \
Answered by running a small script in the sandbox, so it reflects exactly what your code can import.";

const CONFIGURE_ENVIRONMENT: &str = "Switch the Python environment the following runs use: type `venv` with venv_path, `venv-uv` with uv_venv_path, `conda` with conda_name (a name or a prefix path), or `default` for the server's managed environment. \
Paths are on the server. The environment is checked first (its Python is started in a sandbox); if it is not usable the previous one stays and the error says why. \
Environments are mounted read-only into runs; use install_dependencies to add packages.";

const GET_ENVIRONMENT_CONFIG: &str = "Describe the execution environment: its type, Python interpreter, sandbox image, where code is stored, and the limits of each run.";

#[tool_router(router = env_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        description = INSTALL_DEPENDENCIES,
        input_schema = args::schema::<args::Packages>()
    )]
    async fn install_dependencies(
        &self,
        Args(a): Args<args::Packages>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (progress, events) = Progress::start_with(&ctx, InstallNarration::default());
        let result = packages::install(self.executor(), &a.packages, events, &ctx.ct).await;
        if let Some(p) = progress {
            p.finish().await;
        }
        let report = match result {
            Ok(r) => r,
            Err(e) => return answer(e),
        };
        let line = |p: &PackageStatus| match &p.version {
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
        Ok(with_structured(text, &report, false))
    }

    #[tool(
        description = CHECK_INSTALLED_PACKAGES,
        input_schema = args::schema::<args::Packages>(),
        output_schema = schema_for_output::<PackagesReport>()
    )]
    async fn check_installed_packages(
        &self,
        Args(a): Args<args::Packages>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let report = match packages::check_packages(self.executor(), &a.packages, &ctx.ct).await {
            Ok(r) => r,
            Err(e) => return answer(e),
        };
        let text = report
            .packages
            .iter()
            .map(|p| match &p.version {
                Some(v) => format!("{}: installed ({v})", p.name),
                None => format!("{}: not installed", p.name),
            })
            .collect::<Vec<_>>()
            .join("\n");
        Ok(with_structured(text, &report, false))
    }

    #[tool(
        description = CONFIGURE_ENVIRONMENT,
        input_schema = args::schema::<args::ConfigureEnvironment>()
    )]
    async fn configure_environment(
        &self,
        Args(a): Args<args::ConfigureEnvironment>,
    ) -> Result<CallToolResult, ErrorData> {
        let asked = EnvAsked {
            env_type: a.env_type,
            venv_path: a.venv_path,
            uv_venv_path: a.uv_venv_path,
            conda_name: a.conda_name,
        };
        match packages::configure(self.executor(), asked).await {
            Ok(report) => {
                let text = format!(
                    "environment switched to {} at {} (Python {}), mounted read-only in every run",
                    report.kind,
                    report.path.display(),
                    report.python_version
                );
                Ok(with_structured(text, &report, false))
            }
            Err(e) => answer(e),
        }
    }

    #[tool(
        description = GET_ENVIRONMENT_CONFIG,
        output_schema = schema_for_output::<EnvironmentReport>()
    )]
    async fn get_environment_config(&self) -> Result<CallToolResult, ErrorData> {
        let ex = self.executor();
        let s = ex.settings();
        let current = packages::environment_report(ex).await;
        let report = EnvironmentReport {
            env_type: current
                .as_ref()
                .map(|c| c.kind.as_str().to_string())
                .unwrap_or_else(|| "default".into()),
            python: current
                .as_ref()
                .map(|c| c.python.display().to_string())
                .unwrap_or_else(|| s.python.clone()),
            path: current.as_ref().map(|c| c.path.display().to_string()),
            python_version: current.as_ref().map(|c| c.python_version.clone()),
            base_prefix: current
                .as_ref()
                .and_then(|c| c.base_prefix.as_ref().map(|b| b.display().to_string())),
            image: s.image.clone(),
            read_only: true,
            code_storage_dir: ex
                .storage_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            requested_env_type: s.requested_env_type.clone(),
            limits: LimitsReport {
                default_timeout_seconds: s.limits.timeout.as_secs_f64(),
                max_timeout_seconds: s.max_timeout.as_secs_f64(),
                memory_bytes: s.limits.memory_bytes,
                cpus: s.limits.cpus,
                output_bytes_per_stream: s.limits.output_bytes,
                max_code_bytes: storage::defaults::MAX_CODE_BYTES as u64,
                max_file_bytes: storage::defaults::MAX_FILE_BYTES,
                network: false,
            },
        };
        let mut text = format!(
            "environment: default (the sandbox image's Python {}, read-only)\nimage: {}\ncode storage: {}\ntimeout: {} s by default, at most {} s; memory {} MiB; no network",
            report.python,
            report.image,
            report.code_storage_dir,
            report.limits.default_timeout_seconds,
            report.limits.max_timeout_seconds,
            report.limits.memory_bytes >> 20,
        );
        match &current {
            Some(c) => text = format!(
                "environment: {} at {} (Python {}{}), mounted read-only in every run; install_dependencies installs wheels into it (downloaded in a separate container, installed with the network off)\n{}",
                c.kind,
                c.path.display(),
                c.python_version,
                c.base_prefix
                    .as_ref()
                    .map(|b| format!(", base interpreter {} mounted beside it", b.display()))
                    .unwrap_or_default(),
                text.split_once('\n').map(|(_, rest)| rest).unwrap_or("")
            ),
            None => {
                if let Some(t) = &report.requested_env_type {
                    text.push_str(&format!(
                        "\nENV_TYPE={t} is configured but not honoured by this server instance"
                    ));
                }
            }
        }
        Ok(with_structured(text, &report, false))
    }
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
