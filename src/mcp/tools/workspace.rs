//! Workspace file tools: `write_file`, `read_file`, `list_files` on this connection's
//! workspace ([`crate::app::workspaces`] holds the directories and their caps).

use base64::Engine as _;
use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router, ErrorData};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{answer, CodeExecutor};
use crate::app::workspaces::{caps, too_large, MOUNT};
use crate::mcp::args::{self, Args};
use crate::mcp::report::with_structured;

// A write_file call of WRITE_BYTES, base64-encoded, with room for the JSON-RPC envelope.
const _: () = assert!(
    (caps::WRITE_BYTES as usize).div_ceil(3) * 4 + (64 << 10)
        <= crate::mcp::defaults::MAX_BODY_BYTES
);

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFile {
    /// File name in the workspace, e.g. `data.csv` (the code sees `/workspace/data.csv`). No subdirectories.
    pub path: String,
    /// The content: text, or base64 when `encoding` is `base64`.
    pub content: String,
    /// `text` (default) or `base64` for binary content.
    #[serde(default)]
    pub encoding: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// File name in the workspace, e.g. `result.csv` or `/workspace/result.csv`.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// Only names starting with this prefix (default: all files).
    #[serde(default)]
    pub path: Option<String>,
}

/// A workspace file.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WorkspaceFile {
    /// Name in the workspace; the code sees it at `/workspace/<path>`.
    pub path: String,
    pub size_bytes: u64,
    /// `text` or `base64` (read_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// The content (read_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// The answer of list_files.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileList {
    pub files: Vec<WorkspaceFile>,
    pub total_bytes: u64,
}

const WRITE_FILE: &str = "Write a file into your workspace (created or replaced). Your code sees workspace files at /workspace/<path> \
in every execute_code, execute_code_file and execute_python call (e.g. pandas.read_csv('/workspace/data.csv')). \
`encoding`: `text` (default) or `base64` for binary data. Flat: a file name without directories. \
At most 5 MiB per write_file call (what one request can carry once base64-encoded); files your code writes may reach 8 MiB; 100 files and 32 MiB in all. \
The workspace belongs to your MCP session and is deleted when it ends (unless the server shares one workspace per tenant).";

const READ_FILE: &str = "Read a file from your workspace: files you wrote with write_file and files your code wrote to /workspace. \
Returns text, or base64 (encoding `base64`) when the file is not UTF-8.";

const LIST_FILES: &str =
    "List the files of your workspace (name and size). Your code sees them at /workspace/<name>.";

#[tool_router(router = workspace_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        description = WRITE_FILE,
        input_schema = args::schema::<WriteFile>(),
        output_schema = schema_for_output::<WorkspaceFile>()
    )]
    async fn write_file(&self, Args(a): Args<WriteFile>) -> Result<CallToolResult, ErrorData> {
        let limit_b64 = (caps::WRITE_BYTES as usize).div_ceil(3) * 4;
        let data = match a.encoding.as_deref().unwrap_or("text") {
            "text" => a.content.into_bytes(),
            // Decoded size, estimated before decoding anything large.
            "base64" if a.content.trim().len() > limit_b64 => {
                return answer(too_large(a.content.trim().len() as u64 / 4 * 3))
            }
            "base64" => base64::engine::general_purpose::STANDARD
                .decode(a.content.trim())
                .map_err(|e| {
                    ErrorData::invalid_params(
                        format!("invalid argument `content`: not base64: {e}"),
                        None,
                    )
                })?,
            other => {
                return Err(ErrorData::invalid_params(
                    format!("invalid argument `encoding`: `{other}`; use `text` or `base64`"),
                    None,
                ))
            }
        };
        match self.conn.write_file(&a.path, &data).await {
            Ok((name, size)) => {
                let r = WorkspaceFile {
                    path: name.clone(),
                    size_bytes: size,
                    encoding: None,
                    content: None,
                };
                let text =
                    format!("wrote {size} bytes to {name}; your code sees it at {MOUNT}/{name}");
                Ok(with_structured(text, &r, false))
            }
            Err(e) => answer(e),
        }
    }

    #[tool(
        description = READ_FILE,
        input_schema = args::schema::<ReadFile>(),
        output_schema = schema_for_output::<WorkspaceFile>()
    )]
    async fn read_file(&self, Args(a): Args<ReadFile>) -> Result<CallToolResult, ErrorData> {
        let (name, data) = match self.conn.read_file(&a.path).await {
            Ok(v) => v,
            Err(e) => return answer(e),
        };
        let size = data.len() as u64;
        let (encoding, content) = match String::from_utf8(data) {
            Ok(t) => ("text", t),
            Err(e) => (
                "base64",
                base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
            ),
        };
        let r = WorkspaceFile {
            path: name.clone(),
            size_bytes: size,
            encoding: Some(encoding.into()),
            content: Some(content.clone()),
        };
        let text = if encoding == "text" {
            content
        } else {
            format!("{name}: {size} bytes of binary data, base64:\n{content}")
        };
        Ok(with_structured(text, &r, false))
    }

    #[tool(
        description = LIST_FILES,
        input_schema = args::schema::<ListFiles>(),
        output_schema = schema_for_output::<FileList>()
    )]
    async fn list_files(&self, Args(a): Args<ListFiles>) -> Result<CallToolResult, ErrorData> {
        let all = match self.conn.list_files(a.path.as_deref()).await {
            Ok(v) => v,
            Err(e) => return answer(e),
        };
        let files: Vec<WorkspaceFile> = all
            .into_iter()
            .map(|(path, size_bytes)| WorkspaceFile {
                path,
                size_bytes,
                encoding: None,
                content: None,
            })
            .collect();
        let total_bytes = files.iter().map(|f| f.size_bytes).sum();
        let text = if files.is_empty() {
            format!("the workspace ({MOUNT}) has no files")
        } else {
            let mut t = format!("{} files in {MOUNT}, {total_bytes} bytes:\n", files.len());
            for f in &files {
                t.push_str(&format!("{}  {} bytes\n", f.path, f.size_bytes));
            }
            t
        };
        Ok(with_structured(
            text,
            &FileList { files, total_bytes },
            false,
        ))
    }
}
