//! Workspace file tools: `write_file`, `read_file`, `list_files` on a directory on the host:
//! one per MCP session (`<root>/<tenant>.sessions/<random>`, deleted when the session ends) or,
//! with `shared_workspace`, one per tenant (`<root>/<tenant>`). Its files are sent into every run and session
//! at `/workspace`. Paths get the same refusals as code storage ([`CodeStorage::resolve`]:
//! no traversal, no absolute paths outside, no subdirectories, no NUL, no over-long names,
//! symlinks never followed), plus caps on file size, file count and total size.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use rmcp::handler::server::common::schema_for_output;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router, ErrorData};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::args::{self, Args};
use super::report::{tool_error, with_structured};
use super::CodeExecutor;
use crate::job::InputFile;
use crate::storage::CodeStorage;

/// Caps of a workspace.
pub mod caps {
    /// Largest file (as the code writes it).
    pub const FILE_BYTES: u64 = 8 << 20;
    /// Largest file one write_file call may carry: as base64 (4/3 of it) inside a JSON
    /// request it must fit the request body limit.
    pub const WRITE_BYTES: u64 = 5 << 20;
    /// Files in one workspace.
    pub const FILES: usize = 100;
    /// All files together.
    pub const TOTAL_BYTES: u64 = 32 << 20;
}

// A write_file call of WRITE_BYTES, base64-encoded, with room for the JSON-RPC envelope.
const _: () = assert!(
    (caps::WRITE_BYTES as usize).div_ceil(3) * 4 + (64 << 10) <= super::defaults::MAX_BODY_BYTES
);

/// Where the code sees the workspace.
pub const MOUNT: &str = "/workspace";

/// The workspaces of one server: one directory per tenant under `root`.
pub struct Workspaces {
    root: PathBuf,
    open: Mutex<HashMap<String, Arc<CodeStorage>>>,
    /// The tenant's storage quota, when it has one.
    quota: std::sync::OnceLock<Arc<crate::storage::StorageQuota>>,
}

impl Workspaces {
    pub fn new(root: PathBuf) -> Self {
        Workspaces {
            root,
            open: Mutex::default(),
            quota: std::sync::OnceLock::new(),
        }
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// Count workspace writes against `quota` (set once, before first use).
    pub fn set_quota(&self, quota: Arc<crate::storage::StorageQuota>) {
        let _ = self.quota.set(quota);
    }

    /// The tenant's workspace, created on first use.
    pub fn of(&self, tenant: &str) -> Result<Arc<CodeStorage>, String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = open.get(tenant) {
            return Ok(s.clone());
        }
        let dir = self.root.join(tenant);
        let s = CodeStorage::open(&dir)
            .map_err(|e| format!("the workspace is not available: {e}"))?
            .with_max_file_bytes(caps::FILE_BYTES);
        if let Some(q) = self.quota.get() {
            s.set_quota(q.clone());
        }
        let s = Arc::new(s);
        open.insert(tenant.to_string(), s.clone());
        Ok(s)
    }

    /// Forget a workspace and delete its directory (a session's, when its MCP session ends).
    pub fn remove(&self, key: &str) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        let dir = self.root.join(key);
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "session workspace not removed");
            }
        }
    }

    /// Every file of the tenant's workspace, to unpack at `/workspace`.
    pub async fn input_files(&self, tenant: &str) -> Result<Vec<InputFile>, String> {
        let ws = self.of(tenant)?;
        let mut files = Vec::new();
        for (name, _) in ws.list().await.map_err(|e| e.to_string())? {
            let (_, contents) = ws.read_bytes(&name).await.map_err(|e| e.to_string())?;
            files.push(InputFile {
                path: name,
                contents,
            });
        }
        Ok(files)
    }
}

/// Save `o.files` into the tenant's workspace within its caps; a sentence saying what was
/// saved and what was not, or `None` when the code wrote nothing.
pub async fn save_returned(
    workspaces: &Workspaces,
    tenant: &str,
    o: &crate::job::Outcome,
) -> Option<String> {
    if o.files.is_empty() && o.files_dropped == 0 {
        return None;
    }
    let ws = match workspaces.of(tenant) {
        Ok(w) => w,
        Err(e) => return Some(e),
    };
    let mut saved = Vec::new();
    let mut refused = Vec::new();
    for f in &o.files {
        let existing = ws.list().await.unwrap_or_default();
        let others: Vec<_> = existing.iter().filter(|(n, _)| *n != f.path).collect();
        let total = others.iter().map(|(_, s)| s).sum::<u64>() + f.data.len() as u64;
        let why = if f.path.contains('/') {
            Some("in a subdirectory; the workspace keeps only top-level files".to_string())
        } else if others.len() + 1 > caps::FILES || total > caps::TOTAL_BYTES {
            Some("over the workspace caps".to_string())
        } else {
            ws.write_bytes(&f.path, &f.data).await.err().map(ws_error)
        };
        match why {
            None => saved.push(f.path.clone()),
            Some(w) => refused.push(format!("{} ({w})", f.path)),
        }
    }
    let mut parts = Vec::new();
    if !saved.is_empty() {
        parts.push(format!(
            "files written to /workspace saved to your workspace (read_file): {}",
            saved.join(", ")
        ));
    }
    if !refused.is_empty() {
        parts.push(format!("not saved: {}", refused.join(", ")));
    }
    if o.files_dropped > 0 {
        parts.push(format!(
            "{} more files were not returned (over 100 files, 8 MiB each or 32 MiB in all)",
            o.files_dropped
        ));
    }
    Some(parts.join("; "))
}

/// A client's path as a workspace file name: `/workspace/x` and `./x` mean `x`.
fn name_of(path: &str) -> &str {
    let p = path.strip_prefix("/workspace/").unwrap_or(path);
    p.strip_prefix("./").unwrap_or(p)
}

/// Storage errors speak of code storage; here it is the workspace.
fn ws_error(e: crate::storage::StorageError) -> String {
    e.to_string()
        .replace("file_path", "path")
        .replace("the code storage directory", "the workspace")
        .replace(
            "in the code storage directory: create it with initialize_code_file first",
            "in the workspace (see list_files)",
        )
        .replace(
            ". Split the code into several append_to_code_file calls",
            "",
        )
}

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
        let too_large = |size: u64| {
            Ok(tool_error(format!(
                "nothing was written: the file is {size} bytes, and write_file takes at most {} bytes ({} MiB) per call, \
                 what one request can carry once base64-encoded. Write a smaller file, or let your code produce larger ones in /workspace",
                caps::WRITE_BYTES,
                caps::WRITE_BYTES >> 20
            )))
        };
        let limit_b64 = (caps::WRITE_BYTES as usize).div_ceil(3) * 4;
        let data = match a.encoding.as_deref().unwrap_or("text") {
            "text" => a.content.into_bytes(),
            // Decoded size, estimated before decoding anything large.
            "base64" if a.content.trim().len() > limit_b64 => {
                return too_large(a.content.trim().len() as u64 / 4 * 3)
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
        if data.len() as u64 > caps::WRITE_BYTES {
            return too_large(data.len() as u64);
        }
        let ws = match self.conn.extras.workspaces.of(&self.conn.workspace_key()) {
            Ok(w) => w,
            Err(e) => return Ok(tool_error(e)),
        };
        let name = name_of(&a.path);
        if let Err(e) = ws.resolve(name) {
            return Ok(tool_error(ws_error(e)));
        }
        let existing = ws.list().await.unwrap_or_default();
        let others: Vec<_> = existing.iter().filter(|(n, _)| n != name).collect();
        let total: u64 = others.iter().map(|(_, s)| s).sum::<u64>() + data.len() as u64;
        if others.len() + 1 > caps::FILES {
            return Ok(tool_error(format!(
                "the workspace already holds {} files, the most it may; nothing was written",
                others.len()
            )));
        }
        if total > caps::TOTAL_BYTES {
            return Ok(tool_error(format!(
                "the workspace would hold {total} bytes, over its cap of {} bytes; nothing was written",
                caps::TOTAL_BYTES
            )));
        }
        Ok(match ws.write_bytes(name, &data).await {
            Ok((_, size)) => {
                let r = WorkspaceFile {
                    path: name.to_string(),
                    size_bytes: size,
                    encoding: None,
                    content: None,
                };
                let text =
                    format!("wrote {size} bytes to {name}; your code sees it at {MOUNT}/{name}");
                with_structured(text, &r, false)
            }
            Err(e) => {
                self.count_quota(&e);
                tool_error(ws_error(e))
            }
        })
    }

    #[tool(
        description = READ_FILE,
        input_schema = args::schema::<ReadFile>(),
        output_schema = schema_for_output::<WorkspaceFile>()
    )]
    async fn read_file(&self, Args(a): Args<ReadFile>) -> Result<CallToolResult, ErrorData> {
        let ws = match self.conn.extras.workspaces.of(&self.conn.workspace_key()) {
            Ok(w) => w,
            Err(e) => return Ok(tool_error(e)),
        };
        let name = name_of(&a.path);
        Ok(match ws.read_bytes(name).await {
            Ok((_, data)) => {
                let size = data.len() as u64;
                let (encoding, content) = match String::from_utf8(data) {
                    Ok(t) => ("text", t),
                    Err(e) => (
                        "base64",
                        base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                    ),
                };
                let r = WorkspaceFile {
                    path: name.to_string(),
                    size_bytes: size,
                    encoding: Some(encoding.into()),
                    content: Some(content.clone()),
                };
                let text = if encoding == "text" {
                    content
                } else {
                    format!("{name}: {size} bytes of binary data, base64:\n{content}")
                };
                with_structured(text, &r, false)
            }
            Err(e) => tool_error(ws_error(e)),
        })
    }

    #[tool(
        description = LIST_FILES,
        input_schema = args::schema::<ListFiles>(),
        output_schema = schema_for_output::<FileList>()
    )]
    async fn list_files(&self, Args(a): Args<ListFiles>) -> Result<CallToolResult, ErrorData> {
        let ws = match self.conn.extras.workspaces.of(&self.conn.workspace_key()) {
            Ok(w) => w,
            Err(e) => return Ok(tool_error(e)),
        };
        let prefix = a
            .path
            .as_deref()
            .map(name_of)
            .filter(|p| !matches!(*p, "" | "." | "/"))
            .unwrap_or("");
        Ok(match ws.list().await {
            Ok(all) => {
                let files: Vec<WorkspaceFile> = all
                    .into_iter()
                    .filter(|(n, _)| n.starts_with(prefix))
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
                with_structured(text, &FileList { files, total_bytes }, false)
            }
            Err(e) => tool_error(ws_error(e)),
        })
    }
}

impl CodeExecutor {
    /// Put the tenant's workspace files into a one-shot job (a file named like the job's
    /// entry is left out: the code wins).
    pub(super) async fn add_workspace_files(&self, job: &mut crate::job::JobSpec) {
        let x = &self.conn.extras;
        match x.workspaces.input_files(&self.conn.workspace_key()).await {
            Ok(files) => {
                let entry = job.entry.clone();
                job.files
                    .extend(files.into_iter().filter(|f| f.path != entry));
            }
            Err(e) => tracing::warn!(error = %e, "workspace files not sent"),
        }
        job.return_files = true;
    }

    /// Save the files the code wrote under /workspace into the tenant's workspace, and add
    /// what happened to `note`.
    pub(super) async fn save_workspace_files(
        &self,
        o: &crate::job::Outcome,
        note: Option<String>,
    ) -> Option<String> {
        let x = &self.conn.extras;
        let said = save_returned(&x.workspaces, &self.conn.workspace_key(), o).await;
        match (note, said) {
            (Some(n), Some(s)) => Some(format!("{n}; {s}")),
            (n, s) => n.or(s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::name_of;

    #[test]
    fn workspace_prefixes_are_stripped() {
        assert_eq!(name_of("/workspace/data.csv"), "data.csv");
        assert_eq!(name_of("./data.csv"), "data.csv");
        assert_eq!(name_of("data.csv"), "data.csv");
        assert_eq!(name_of("/etc/passwd"), "/etc/passwd");
        assert_eq!(name_of("/workspacex"), "/workspacex");
    }
}
