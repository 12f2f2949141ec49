//! What the tools answer: a text block an LLM reads first (status line, stdout, stderr) and
//! `structuredContent` a program can rely on, declared by each tool's `outputSchema`.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use crate::job::Outcome;

/// The result of running code: the engine's outcome fields plus where the code is stored.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunReport {
    /// One line: how the run ended (exit code, timed out, OOM-killed, truncation, duration).
    pub status: String,
    /// True when the code exited 0 without being stopped.
    pub success: bool,
    /// Exit status; null when the code was killed by a signal or timed out.
    pub exit_code: Option<i64>,
    /// The signal that killed the code (9 for a timeout or the OOM killer).
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Wall time from the request to the result, container start-up included.
    pub duration_ms: u64,
    pub cpu_ms: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    /// The wall-clock limit that applied, in seconds.
    pub timeout_seconds: f64,
    /// The stored file that was run; pass it to read_code_file or execute_code_file.
    pub file_path: String,
    /// Figures returned as image content, in order.
    pub figures: Vec<super::figures::FigureInfo>,
    /// Figures over the caps, not returned.
    pub figures_dropped: u64,
    #[serde(skip)]
    #[schemars(skip)]
    images: Vec<crate::job::Artifact>,
    #[serde(skip)]
    #[schemars(skip)]
    files: Vec<crate::job::OutputFile>,
}

impl RunReport {
    pub fn new(o: &Outcome, timeout_seconds: f64, file_path: String) -> Self {
        RunReport {
            status: o.status_line(),
            success: o.success(),
            exit_code: o.exit_code,
            signal: o.signal,
            timed_out: o.timed_out,
            oom_killed: o.oom_killed,
            stdout: o.stdout_text(),
            stderr: o.stderr_text(),
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
            duration_ms: o.duration_ms,
            cpu_ms: o.cpu_ms,
            peak_memory_bytes: o.peak_memory_bytes,
            timeout_seconds,
            file_path,
            figures: super::figures::infos(o),
            figures_dropped: o.artifacts_dropped,
            images: o.artifacts.clone(),
            files: o.files.clone(),
        }
    }

    /// The tool result: `isError` unless the code succeeded.
    pub fn into_result(self, note: Option<String>) -> CallToolResult {
        let mut text = format!("{}\nfile_path: {}\n", self.status, self.file_path);
        if let Some(n) = note {
            text.push_str(&format!("note: {n}\n"));
        }
        if !self.stdout.is_empty() {
            text.push_str(&format!("--- stdout ---\n{}", self.stdout));
            if !self.stdout.ends_with('\n') {
                text.push('\n');
            }
        }
        if !self.stderr.is_empty() {
            text.push_str(&format!("--- stderr ---\n{}", self.stderr));
            if !self.stderr.ends_with('\n') {
                text.push('\n');
            }
        }
        if self.stdout.is_empty() && self.stderr.is_empty() {
            text.push_str("(no output)\n");
        }
        text.push_str(&super::figures::text(&self.figures, self.figures_dropped));
        let (blocks, files_note) = super::figures::embed_files(&self.files);
        text.push_str(&files_note);
        let mut result = with_structured(text, &self, !self.success);
        super::figures::attach(&mut result, &self.images);
        result.content.extend(blocks);
        result
    }
}

/// The result of a file tool (initialize, append, read).
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
    pub default_timeout_seconds: f64,
    pub max_timeout_seconds: f64,
    pub memory_bytes: u64,
    pub cpus: f64,
    pub output_bytes_per_stream: u64,
    pub max_code_bytes: u64,
    pub max_file_bytes: u64,
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
pub fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_runs_are_errors_with_their_output() {
        let o = Outcome {
            exit_code: Some(2),
            stderr: b"boom\n".to_vec(),
            ..Default::default()
        };
        let r = RunReport::new(&o, 30.0, "/s/x.py".into()).into_result(None);
        assert_eq!(r.is_error, Some(true));
        let text = &r.content[0].as_text().unwrap().text;
        assert!(text.starts_with("exit code 2"), "{text}");
        assert!(text.contains("--- stderr ---\nboom\n"), "{text}");
        let s = r.structured_content.unwrap();
        assert_eq!(s["exit_code"], 2);
        assert_eq!(s["file_path"], "/s/x.py");
        assert_eq!(s["success"], false);
    }
}
