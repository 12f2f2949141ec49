//! What the command line resolved to, as the library's types: conversions from clap's
//! structs to what each function of `commands` takes.

use mcp_code_executor::backend::image::BuildOptions;
use mcp_code_executor::cli::output::Format;
use mcp_code_executor::commands::{BenchRequest, ImageBuild, ImageRequest, RunRequest};
use mcp_code_executor::config::BackendConfig;
use mcp_code_executor::job::Limits;

use crate::args::{BenchCmd, FormatArg, ImageCmd, RunCmd, SandboxOpts};

/// The backend the flags and the process environment name, without a warm pool.
impl From<&SandboxOpts> for BackendConfig {
    fn from(opts: &SandboxOpts) -> BackendConfig {
        opts.config_from_process(0)
    }
}

impl From<RunCmd> for RunRequest {
    fn from(cmd: RunCmd) -> RunRequest {
        RunRequest {
            limits: Limits {
                timeout: cmd.timeout.0,
                memory_bytes: cmd.memory.0,
                cpus: cmd.cpus,
                pids: cmd.pids,
                output_bytes: cmd.output_limit.0,
                workspace_bytes: cmd.workspace_size.0,
                ..Limits::default()
            },
            format: match (cmd.json, cmd.format) {
                (true, _) | (_, FormatArg::Json) => Format::Json,
                (_, FormatArg::Text) => Format::Text,
                (_, FormatArg::Github) => Format::Github,
            },
            jobs: cmd.jobs.map(usize::from),
            fail_fast: cmd.fail_fast,
            junit: cmd.junit,
            backend: BackendConfig::from(&cmd.sandbox),
            files: cmd.files,
            tools: cmd.tools,
            egress: cmd.egress,
        }
    }
}

impl From<BenchCmd> for BenchRequest {
    fn from(cmd: BenchCmd) -> BenchRequest {
        BenchRequest {
            backend: BackendConfig::from(&cmd.sandbox),
            samples: cmd.samples,
            pool_size: cmd.pool_size,
            throughput_runs: cmd.throughput_runs,
            concurrency: cmd.concurrency,
            burst: cmd.burst,
            fairness_only: cmd.fairness_only,
        }
    }
}

impl From<ImageCmd> for ImageRequest {
    fn from(cmd: ImageCmd) -> ImageRequest {
        match cmd {
            ImageCmd::Name => ImageRequest::Name,
            ImageCmd::Build {
                ca_bundle,
                offline,
                mirror,
                force,
                image,
            } => ImageRequest::Build(ImageBuild {
                tag: image,
                options: BuildOptions {
                    ca_bundle,
                    offline,
                    mirror: Some(mirror),
                    force,
                },
            }),
            ImageCmd::Server {
                tag,
                offline,
                mirror,
            } => ImageRequest::Server {
                tag,
                options: BuildOptions {
                    offline,
                    mirror: Some(mirror),
                    ..BuildOptions::default()
                },
            },
        }
    }
}
