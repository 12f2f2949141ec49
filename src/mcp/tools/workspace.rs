//! Workspace file tools: `write_file`, `read_file`, `list_files` on this connection's
//! workspace ([`crate::app::workspaces`] holds the directories and their caps).

use base64::Engine as _;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, ErrorData, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{answer, CodeExecutor, NO_SESSION};
use crate::app::workspaces::{caps, too_large, MOUNT};
use crate::mcp::args::{self, Args};
use crate::mcp::fit::prefix_within;
use crate::mcp::report::{tool_error, with_structured};

/// The most of a file one read_file call returns (JSON-escaped): the content travels in the
/// text block and in `structuredContent`, and a result stays well under 1 MiB.
pub const READ_PAGE: usize = 192 << 10;

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
    /// The session whose workspace to write to: the session_id an earlier call returned. Omit it to use your connection's own session; a client without one (MCP 2026-07-28 over HTTP) gets a new session, whose session_id the result gives.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFile {
    /// File name in the workspace, e.g. `result.csv` or `/workspace/result.csv`.
    pub path: String,
    /// Byte offset to start reading at (default 0); a long file is read in pages, the result gives the next offset.
    #[serde(default)]
    pub offset: Option<u64>,
    /// The most bytes to return (default and maximum: about 192 KiB; at least one character comes back while any is left).
    #[serde(default)]
    pub length: Option<u64>,
    /// The session whose workspace to read: the session_id an earlier call returned. Omit it to use your connection's own session.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFiles {
    /// Only names starting with this prefix (default: all files).
    #[serde(default)]
    pub path: Option<String>,
    /// The session whose workspace to list: the session_id an earlier call returned. Omit it to use your connection's own session.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// A workspace file.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WorkspaceFile {
    /// Name in the workspace; the code sees it at `/workspace/<path>`.
    pub path: String,
    /// Size of the whole file in bytes.
    pub size_bytes: u64,
    /// `text` or `base64` (read_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// The content from `offset` on (read_file only): all of it, or one page of a long file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The byte offset `content` starts at (read_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Where the next page starts, to pass as `offset`; absent when `content` reaches the end of the file (read_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
    /// The session whose workspace holds the file: pass it as session_id to keep using it (write_file and read_file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// The answer of list_files.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FileList {
    /// The files, by name.
    pub files: Vec<WorkspaceFile>,
    /// Their sizes added up, in bytes.
    pub total_bytes: u64,
    /// The session whose workspace this is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

const WRITE_FILE: &str = "Write a file into your workspace (created or replaced). Your code sees workspace files at /workspace/<path> \
in every execute_code, execute_code_file and execute_python call (e.g. pandas.read_csv('/workspace/data.csv')). \
`encoding`: `text` (default) or `base64` for binary data. Flat: a file name without directories. \
At most 5 MiB per write_file call (what one request can carry once base64-encoded); files your code writes may reach 8 MiB; 100 files and 32 MiB in all. \
The workspace belongs to your session and is deleted when the session ends (unless the server shares one workspace per tenant). \
The result gives a session_id: pass it as `session_id` to the calls that should see the file (some clients keep no connection between calls, and then each call without it gets a new, empty workspace).";

const READ_FILE: &str = "Read a file from your workspace: files you wrote with write_file and files your code wrote to /workspace (also the whole output of a run too long for its result). \
Returns text, or base64 (encoding `base64`) when the file is not UTF-8. A long file comes in pages of about 192 KiB: pass the result's next_offset as `offset` for the next one. \
Pass the session_id of the session that holds the file.";

/// `list_files` with no session: a refusal (`isError`), not an empty listing a model could
/// take for "no files" (issue 42).
const LIST_NO_SESSION: &str = "list_files needs the argument `session_id`: no session was named, and this client keeps \
no connection between calls (MCP 2026-07-28 over HTTP), so there is no workspace to list. This is not an empty listing: \
call list_files again with the session_id that execute_python, write_file or execute_code returned.";

const LIST_FILES: &str =
    "List the files of your workspace (name and size). Your code sees them at /workspace/<name>. Pass the session_id of the session whose workspace to list.";

#[tool_router(router = workspace_router, vis = "pub(super)")]
impl CodeExecutor {
    #[tool(
        title = "Write a workspace file",
        description = WRITE_FILE,
        input_schema = args::schema::<WriteFile>(),
        output_schema = args::output_schema::<WorkspaceFile>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn write_file(
        &self,
        Args(a): Args<WriteFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
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
        let session = match self.session(a.session_id.as_deref(), &ctx, true) {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(tool_error(NO_SESSION)),
            Err(r) => return Ok(r),
        };
        match self.conn.write_file(&session, &a.path, &data).await {
            Ok((name, size)) => {
                let r = WorkspaceFile {
                    path: name.clone(),
                    size_bytes: size,
                    encoding: None,
                    content: None,
                    offset: None,
                    next_offset: None,
                    session_id: Some(session.handle().to_string()),
                };
                let text = format!(
                    "wrote {size} bytes to {name}; your code sees it at {MOUNT}/{name}\nsession_id: {} (pass it as session_id to the calls that should see this file)",
                    session.handle()
                );
                Ok(with_structured(text, &r, false))
            }
            Err(e) => answer(e),
        }
    }

    #[tool(
        title = "Read a workspace file",
        description = READ_FILE,
        input_schema = args::schema::<ReadFile>(),
        output_schema = args::output_schema::<WorkspaceFile>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn read_file(
        &self,
        Args(a): Args<ReadFile>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = match self.session(a.session_id.as_deref(), &ctx, false) {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(tool_error(NO_SESSION)),
            Err(r) => return Ok(r),
        };
        let (name, data) = match self.conn.read_file(&session, &a.path).await {
            Ok(v) => v,
            Err(e) => return answer(e),
        };
        let size = data.len() as u64;
        let offset = usize::try_from(a.offset.unwrap_or(0)).unwrap_or(usize::MAX);
        let want = a.length.map_or(READ_PAGE, |l| {
            usize::try_from(l).unwrap_or(usize::MAX).min(READ_PAGE)
        });
        let (encoding, offset, content, end) = page(&data, offset, want);
        let next_offset = (end < data.len()).then_some(end as u64);
        let r = WorkspaceFile {
            path: name.clone(),
            size_bytes: size,
            encoding: Some(encoding.into()),
            content: Some(content.clone()),
            offset: Some(offset as u64),
            next_offset,
            session_id: Some(session.handle().to_string()),
        };
        let whole = offset == 0 && next_offset.is_none();
        let mut text = if whole && encoding == "text" {
            content
        } else if whole {
            format!("{name}: {size} bytes of binary data, base64:\n{content}")
        } else {
            format!(
                "{name}: bytes {offset} to {end} of {size}{}{}:\n{content}",
                if encoding == "base64" { ", base64" } else { "" },
                match next_offset {
                    Some(n) => format!(" (more follows: call read_file with offset {n})"),
                    None => " (the end of the file)".into(),
                }
            )
        };
        if session.created || super::stateless(&ctx) {
            text.push_str(&format!("\nsession_id: {}", session.handle()));
        }
        Ok(with_structured(text, &r, false))
    }

    #[tool(
        title = "List workspace files",
        description = LIST_FILES,
        input_schema = args::schema::<ListFiles>(),
        output_schema = args::output_schema::<FileList>(),
        annotations(
            read_only_hint = true,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_files(
        &self,
        Args(a): Args<ListFiles>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let session = match self.session(a.session_id.as_deref(), &ctx, false) {
            Ok(Some(s)) => s,
            Ok(None) => return Ok(tool_error(LIST_NO_SESSION)),
            Err(r) => return Ok(r),
        };
        let all = match self.conn.list_files(&session, a.path.as_deref()).await {
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
                offset: None,
                next_offset: None,
                session_id: None,
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
        let session_id = Some(session.handle().to_string());
        Ok(with_structured(
            text,
            &FileList {
                files,
                total_bytes,
                session_id,
            },
            false,
        ))
    }
}

/// One page of `data` from `offset`: at most `want` bytes of the file and at most
/// [`READ_PAGE`] bytes once JSON-escaped, UTF-8 text as text (cut on a character
/// boundary), anything else as base64 (of a multiple of 3 bytes when `want` allows, so
/// pages join up). Always at least one character or byte when any is left, so paging moves
/// on whatever `want` is. The encoding, where the page starts, the content and where it ends.
fn page(data: &[u8], offset: usize, want: usize) -> (&'static str, usize, String, usize) {
    let offset = offset.min(data.len());
    if let Ok(text) = std::str::from_utf8(data) {
        let mut start = offset;
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let rest = &text[start..];
        let first = rest.chars().next().map_or(0, char::len_utf8);
        let mut len = rest.len().min(want);
        while !rest.is_char_boundary(len) {
            len -= 1;
        }
        let fits = prefix_within(&rest[..len.max(first)], READ_PAGE).len();
        let chunk = &rest[..fits.max(first)];
        return ("text", start, chunk.to_string(), start + chunk.len());
    }
    let most = READ_PAGE / 4 * 3;
    let bytes = match want.clamp(1, most) {
        n if n >= 3 => n / 3 * 3,
        n => n,
    };
    let end = (offset + bytes).min(data.len());
    let encoded = base64::engine::general_purpose::STANDARD.encode(&data[offset..end]);
    ("base64", offset, encoded, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::fit::escaped_len;
    use proptest::prelude::*;

    /// Reads `data` page by page with `want`, checking each page's bounds, and joins them.
    fn read_all(data: &[u8], want: usize) -> Vec<u8> {
        let (mut back, mut at) = (Vec::new(), 0);
        while at < data.len() {
            let (enc, start, chunk, end) = page(data, at, want);
            assert_eq!(start, at, "pages start where the last one ended");
            assert!(end > at, "a page moves on: {at} -> {end} (want {want})");
            if enc == "text" {
                assert!(escaped_len(&chunk) <= READ_PAGE);
                assert!(chunk.len() <= want.max(4), "{} > {want}", chunk.len());
                back.extend(chunk.as_bytes());
            } else {
                assert!(chunk.len() <= READ_PAGE);
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(chunk)
                    .unwrap();
                assert!(bytes.len() <= want.max(1));
                back.extend(bytes);
            }
            at = end;
        }
        back
    }

    /// Issue 42: without a session, list_files answered an empty listing with
    /// `isError: false`; it is a refusal naming the argument to pass.
    #[test]
    fn list_files_without_a_session_is_a_refusal_naming_session_id() {
        let r = tool_error(LIST_NO_SESSION);
        assert_eq!(r.is_error, Some(true));
        let text = format!("{:?}", r.content);
        assert!(text.contains("`session_id`"), "{text}");
        assert!(text.contains("not an empty listing"), "{text}");
        assert!(r.structured_content.is_none(), "no listing rides along");
    }

    #[test]
    fn pages_fit_and_join_up() {
        let text = "é\u{1}\"".repeat(100_000);
        assert_eq!(read_all(text.as_bytes(), READ_PAGE), text.as_bytes());
        let bin: Vec<u8> = (0..500_000u32).map(|i| (i % 251) as u8 | 0x80).collect();
        assert_eq!(read_all(&bin, READ_PAGE), bin);
    }

    /// Issue 24, F1: `length` 0 or 1 looped forever (the escaped length of an empty chunk
    /// counts two quotes, so it never fit a budget of 1).
    #[test]
    fn tiny_lengths_answer_and_move_on() {
        for want in [0, 1, 2, 3] {
            let (enc, _, chunk, end) = page(b"hi", 0, want);
            assert_eq!(enc, "text");
            assert_eq!(chunk, &"hi"[..end]);
            assert!(end >= 1);
            assert_eq!(
                read_all("h\u{1}é\"€😀".as_bytes(), want),
                "h\u{1}é\"€😀".as_bytes()
            );
            assert_eq!(
                read_all(&[0xff, 0xfe, 0, 1, 2], want),
                [0xff, 0xfe, 0, 1, 2]
            );
        }
        // An offset past the end, or inside a character, still answers.
        assert_eq!(page(b"hi", 99, 1).3, 2);
        let (_, start, chunk, _) = page("é".as_bytes(), 1, 1);
        assert_eq!((start, chunk.as_str()), (0, "é"));
    }

    proptest! {
        #[test]
        fn any_text_pages_back_whole(s in "\\PC{0,200}|[\\x00-\\x1f\"\\\\é€😀a]{0,200}", want in 0usize..40) {
            prop_assert_eq!(read_all(s.as_bytes(), want), s.as_bytes());
        }

        #[test]
        fn any_bytes_page_back_whole(b in proptest::collection::vec(any::<u8>(), 0..300), want in 0usize..40) {
            prop_assert_eq!(read_all(&b, want), b);
        }
    }
}
