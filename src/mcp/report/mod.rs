//! What the tools answer: a text block an LLM reads first (status line, stdout, stderr) and
//! `structuredContent` a program can rely on, declared by each tool's `outputSchema`.
//!
//! A run's report is in `run` ([`RunReport`]); the file tools', the environment's and a
//! tool error are here. What fits in one result is [`super::fit`]'s.

mod run;

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use super::fit::{capped_message, TOOL_ERROR_MAX};
pub use run::RunReport;

/// The workspace file that keeps a stream too long for a result.
pub fn kept_name(stream: &str) -> String {
    format!("last-run-{stream}.txt")
}

/// What a result cannot carry and the workspace should keep (the core keeps it).
pub use crate::app::Keep;

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileReport {
    /// The stored file; pass it to the next append_to_code_file / execute_code_file call.
    pub file_path: String,
    /// Size of the file in bytes after the call.
    pub size_bytes: u64,
    /// The file's content (read_code_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// The answer of get_environment_config.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EnvironmentReport {
    /// `default`: the sandbox image's own Python (the only type available so far).
    #[serde(rename = "type")]
    pub env_type: String,
    /// The interpreter that runs the code, inside the sandbox.
    pub python: String,
    /// The environment's directory (`sys.prefix` in runs), when environments are on.
    pub path: Option<String>,
    /// Its Python version, as the environment's own interpreter reports it.
    pub python_version: Option<String>,
    /// The base interpreter mounted (read-only) beside a venv.
    pub base_prefix: Option<String>,
    /// The sandbox image.
    pub image: String,
    /// The environment is mounted read-only: code cannot install into it.
    pub read_only: bool,
    /// Where stored code lives on the server.
    pub code_storage_dir: String,
    /// ENV_TYPE as configured on the server, if set (not honoured yet).
    pub requested_env_type: Option<String>,
    /// Resource limits of each run.
    pub limits: LimitsReport,
}

/// The limits a run gets, for the LLM to plan around.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LimitsReport {
    /// The wall-clock limit of a run that asks for none, in seconds.
    pub default_timeout_seconds: f64,
    /// The largest `timeout` a call may ask for, in seconds.
    pub max_timeout_seconds: f64,
    /// Memory of a run's sandbox, in bytes.
    pub memory_bytes: u64,
    /// CPUs of a run's sandbox.
    pub cpus: f64,
    /// stdout and stderr are each kept up to this many bytes; the rest is discarded.
    pub output_bytes_per_stream: u64,
    /// The most code one call may send, in bytes.
    pub max_code_bytes: u64,
    /// The largest stored code file, in bytes.
    pub max_file_bytes: u64,
    /// Whether runs reach the network (never).
    pub network: bool,
}

/// A result with `text` for the model and `value` as structured content.
pub fn with_structured<T: Serialize>(text: String, value: &T, is_error: bool) -> CallToolResult {
    let mut r = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    r.structured_content = Some(serde_json::to_value(value).unwrap_or_default());
    r
}

/// A tool error the model should read (refused path, missing file, feature not built yet).
/// Its message within [`TOOL_ERROR_MAX`].
pub fn tool_error(message: impl Into<String>) -> CallToolResult {
    let message: String = message.into();
    let message = match capped_message(&message, TOOL_ERROR_MAX) {
        std::borrow::Cow::Borrowed(_) => message,
        std::borrow::Cow::Owned(m) => m,
    };
    CallToolResult::error(vec![ContentBlock::text(message)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::fit::{capped_error, ERROR_MAX};

    #[test]
    fn a_huge_value_in_a_protocol_error_is_cut() {
        let e = rmcp::ErrorData::invalid_params(format!("bad `{}`", "a".repeat(7 << 20)), None);
        let e = capped_error(e);
        assert!(e.message.len() <= ERROR_MAX, "{}", e.message.len());
        let r = tool_error("b".repeat(1 << 20));
        let t = &r.content[0].as_text().unwrap().text;
        assert!(t.len() <= TOOL_ERROR_MAX, "{}", t.len());
    }
}
