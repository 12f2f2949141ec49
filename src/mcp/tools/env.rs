//! Packages and environments: `install_dependencies`, `check_installed_packages`,
//! `configure_environment`, `get_environment_config`.

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};

use super::{answer, CodeExecutor};
use crate::app::packages::{self, EnvAsked, PackagesReport};
use crate::app::pip::{PackageDone, PipSaid};
use crate::env::manager::{InstallEvent, Phase};
use crate::job::RunEvent;
use crate::mcp::args::{self, Args};
use crate::mcp::progress::{Narration, OutputThrottle, Progress};
use crate::mcp::report::{with_structured, EnvironmentReport, LimitsReport};
use crate::mcp::transports::auth::principal_of;
use crate::storage;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The argument of `install_package`, the single-package form of `install_dependencies`
/// (the tool name and argument of the REPL server this project replaces).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Package {
    /// One distribution name as on PyPI, with an optional version specifier, e.g. `pandas` or `requests==2.31.0`.
    pub package: String,
}

/// One requested package after an install.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InstalledPackage {
    /// The name as requested.
    pub name: String,
    /// The version the environment has now; null when it cannot be found after the install.
    pub version: Option<String>,
    /// `installed` (pip installed or upgraded it now), `already_satisfied` (it was there
    /// already: nothing was installed for it) or `missing`.
    pub status: String,
    /// Where pip found it when it was already satisfied (e.g. the image's own copy); null otherwise.
    pub satisfied_by: Option<String>,
}

/// A dependency pip installed with the requested packages.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Dependency {
    /// Its distribution name.
    pub name: String,
    /// The version installed.
    pub version: String,
}

/// The answer of install_dependencies.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InstallResult {
    /// The environment's type: `default` (managed), `venv`, `venv-uv` or `conda`.
    pub environment: String,
    /// The environment's directory on the server.
    pub path: String,
    /// True when pip installed anything at all.
    pub changed: bool,
    /// The requested packages.
    pub packages: Vec<InstalledPackage>,
    /// Dependencies pip installed (or upgraded) beyond them.
    pub dependencies: Vec<Dependency>,
    /// Wall time of the download phase (network on), in ms.
    pub fetch_ms: u64,
    /// Wall time of the install phase (network off), in ms.
    pub install_ms: u64,
}

/// The answer of configure_environment.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnvironmentSwitched {
    /// The environment's type: `default`, `venv`, `venv-uv` or `conda`.
    #[serde(rename = "type")]
    pub env_type: String,
    /// Its directory (`sys.prefix` in runs).
    pub path: String,
    /// Its Python interpreter.
    pub python: String,
    /// Its Python version.
    pub python_version: String,
    /// The base interpreter mounted (read-only) beside a venv; null otherwise.
    pub base_prefix: Option<String>,
    /// How runs see it (mounted read-only).
    pub mount: String,
    /// How install_dependencies installs into it.
    pub installs: String,
}

/// The answer of an install, honest about what pip did.
fn install_result(
    report: &crate::env::manager::InstallReport,
    said: PipSaid,
    asked: &[String],
) -> InstallResult {
    let packages = report
        .installed
        .iter()
        .zip(said.packages)
        .enumerate()
        .map(|(i, (p, done))| {
            let status = done.as_str().into();
            let satisfied_by = match done {
                PackageDone::AlreadySatisfied { by } => by,
                _ => None,
            };
            InstalledPackage {
                name: asked.get(i).cloned().unwrap_or_else(|| p.name.clone()),
                version: p.version.clone(),
                status,
                satisfied_by,
            }
        })
        .collect();
    InstallResult {
        environment: report.environment.kind.to_string(),
        path: report.environment.path.display().to_string(),
        changed: said.changed,
        packages,
        dependencies: report
            .dependencies
            .iter()
            .map(|d| Dependency {
                name: d.name.clone(),
                version: d.version.clone().unwrap_or_default(),
            })
            .collect(),
        fetch_ms: report.fetch_ms,
        install_ms: report.install_ms,
    }
}

const INSTALL_DEPENDENCIES: &str = "Install Python packages (from PyPI, with pip) into the current execution environment, for the runs that follow. \
Give plain requirement specifiers such as `six`, `pandas>=2` or `requests[socks]==2.31.0`; URLs, paths and pip options are refused. \
The install runs in separate installer containers (wheels are downloaded with network access, then installed without; runs themselves have none) and may take a minute; \
only packages that publish wheels (binary packages) for the environment's Python install, source builds are not run. The result lists the installed versions, dependencies included, \
and says `already satisfied` for a package that was already there (nothing was installed for it). Installed packages persist: every later execute_code run and every new execute_python session can import them \
(an open execute_python session keeps the environment it started with; reset_session picks up the new one). Check first with check_installed_packages: numpy, pandas and matplotlib are already there in the default environment.";

const INSTALL_PACKAGE: &str = "Install one Python package (e.g. pandas, numpy) from PyPI into the current execution environment: \
the single-package form of install_dependencies, with the same checks, sandboxed installer, result and errors. \
Give a plain requirement specifier such as `six` or `requests==2.31.0`; URLs, paths and pip options are refused. \
Installed packages persist for every later run (an open execute_python session picks them up after reset_session).";

const CHECK_INSTALLED_PACKAGES: &str = "Check which of the given packages are installed in the execution environment, with their versions. \
Answered by running a small script in the sandbox, so it reflects exactly what your code can import.";

const CONFIGURE_ENVIRONMENT: &str = "Switch the Python environment the following runs use: type `venv` with venv_path, `venv-uv` with uv_venv_path, `conda` with conda_name (a name or a prefix path), or `default` for the server's managed environment. \
Paths are on the server. The environment is checked first (its Python is started in a sandbox); if it is not usable the previous one stays and the error says why. \
Environments are mounted read-only into runs; use install_dependencies to add packages.";

const GET_ENVIRONMENT_CONFIG: &str = "Describe the execution environment: its type, Python interpreter, sandbox image, where code is stored, and the limits of each run.";

#[tool_router(router = env_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        title = "Install Python packages",
        description = INSTALL_DEPENDENCIES,
        input_schema = args::schema::<args::Packages>(),
        output_schema = args::output_schema::<InstallResult>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn install_dependencies(
        &self,
        Args(a): Args<args::Packages>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.install(&a.packages, &ctx).await
    }

    #[tool(
        title = "Install a Python package",
        description = INSTALL_PACKAGE,
        input_schema = args::schema::<Package>(),
        output_schema = args::output_schema::<InstallResult>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = true
        )
    )]
    async fn install_package(
        &self,
        Args(a): Args<Package>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.install(std::slice::from_ref(&a.package), &ctx).await
    }

    #[tool(
        title = "Check installed packages",
        description = CHECK_INSTALLED_PACKAGES,
        input_schema = args::schema::<args::Packages>(),
        output_schema = args::output_schema::<PackagesReport>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn check_installed_packages(
        &self,
        Args(a): Args<args::Packages>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (progress, events) = Progress::start(&ctx);
        let result = packages::check_packages(self.executor(), &a.packages, events, &ctx.ct).await;
        if let Some(p) = progress {
            p.finish().await;
        }
        let report = match result {
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
        title = "Switch the Python environment",
        description = CONFIGURE_ENVIRONMENT,
        input_schema = args::schema::<args::ConfigureEnvironment>(),
        output_schema = args::output_schema::<EnvironmentSwitched>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
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
                let r = EnvironmentSwitched {
                    env_type: report.kind.to_string(),
                    path: report.path.display().to_string(),
                    python: report.python.display().to_string(),
                    python_version: report.python_version.clone(),
                    base_prefix: report.base_prefix.as_ref().map(|b| b.display().to_string()),
                    mount: report.mount.to_string(),
                    installs: report.installs.to_string(),
                };
                Ok(with_structured(text, &r, false))
            }
            Err(e) => answer(e),
        }
    }

    #[tool(
        title = "Describe the environment and limits",
        description = GET_ENVIRONMENT_CONFIG,
        output_schema = args::output_schema::<EnvironmentReport>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
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
            InstallEvent::Run(_, RunEvent::Admitted) => None,
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

impl CodeExecutor {
    /// install_dependencies and install_package: one call into the core, then the answer,
    /// honest about what pip did.
    async fn install(
        &self,
        packages: &[String],
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let (progress, events) = Progress::start_with(ctx, InstallNarration::default());
        let owner = self.conn.owner(principal_of(ctx).as_ref());
        let result = packages::install_dependencies(
            self.executor(),
            owner.as_deref(),
            packages,
            events,
            &ctx.ct,
        )
        .await;
        if let Some(p) = progress {
            p.finish().await;
        }
        let (report, said) = match result {
            Ok(r) => r,
            Err(e) => return answer(e),
        };
        let r = install_result(&report, said, packages);
        let lines: Vec<String> = r
            .packages
            .iter()
            .map(|p| match (p.status.as_str(), &p.version) {
                ("installed", Some(v)) => format!("{}: installed {v}", p.name),
                ("already_satisfied", Some(v)) => format!(
                    "{}: already satisfied by {}; nothing was installed for it",
                    p.name,
                    p.satisfied_by.clone().unwrap_or_else(|| v.clone())
                ),
                _ => format!("{}: not found after the install", p.name),
            })
            .collect();
        let mut text = format!(
            "{} {} ({}):\n{}",
            if r.changed {
                "installed into"
            } else {
                "nothing was installed; already in"
            },
            r.path,
            r.environment,
            lines.join("\n")
        );
        if !r.dependencies.is_empty() {
            text.push_str(&format!(
                "\ndependencies installed with them:\n{}",
                r.dependencies
                    .iter()
                    .map(|d| format!("{}: {}", d.name, d.version))
                    .collect::<Vec<_>>()
                    .join("\n")
            ));
        }
        Ok(with_structured(text, &r, false))
    }
}
