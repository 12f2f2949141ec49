//! Figures (matplotlib PNGs) of a run as MCP image content, and what the text and the
//! structured content say about them.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use crate::job::{Artifact, Outcome, OutputFile};

/// Files written under /workspace are embedded in the result up to this many bytes in all
/// (and within the room the result's budget leaves); the rest are named, to be read with
/// read_file.
pub const MAX_EMBEDDED_BYTES: usize = 256 << 10;

/// One figure returned with a run (its bytes travel as an image content block).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FigureInfo {
    /// e.g. `figure-001.png`.
    pub name: String,
    /// The media type, `image/png`.
    pub mime_type: String,
    /// Size of the image in bytes (before base64).
    pub size_bytes: u64,
    /// True when the figure was larger than 4 megapixels and was scaled down to fit.
    pub downscaled: bool,
}

/// The figures of an outcome, for the report.
pub fn infos(o: &Outcome) -> Vec<FigureInfo> {
    o.artifacts
        .iter()
        .map(|a| FigureInfo {
            name: a.name.clone(),
            mime_type: a.mime().to_string(),
            size_bytes: a.data.len() as u64,
            downscaled: a.name.ends_with("-downscaled.png"),
        })
        .collect()
}

/// Lines for the text block: which figures follow as images, which were downscaled, how
/// many were dropped over the caps. Empty when there are none.
pub fn text(figures: &[FigureInfo], dropped: u64) -> String {
    let mut s = String::new();
    if !figures.is_empty() {
        let names: Vec<String> = figures
            .iter()
            .map(|f| {
                if f.downscaled {
                    format!("{} (downscaled to at most 4 megapixels)", f.name)
                } else {
                    f.name.clone()
                }
            })
            .collect();
        s.push_str(&format!(
            "figures: {} returned as PNG images after this text: {}\n",
            figures.len(),
            names.join(", ")
        ));
    }
    if dropped > 0 {
        s.push_str(&format!(
            "figures dropped: {dropped} (over the caps of 10 figures per run and 4 MiB each); close figures you do not need or save fewer\n"
        ));
    }
    s
}

/// Append one image content block per figure, after the text.
pub fn attach(result: &mut CallToolResult, artifacts: &[Artifact]) {
    for a in artifacts {
        let data = base64::engine::general_purpose::STANDARD.encode(&a.data);
        result.content.push(ContentBlock::image(data, a.mime()));
    }
}

/// Embedded resources for the files the code wrote under /workspace (text as text, the
/// rest base64), within [`MAX_EMBEDDED_BYTES`] and `room` serialized bytes; and a line for
/// the text block.
pub fn embed_files(files: &[OutputFile], room: usize) -> (Vec<ContentBlock>, String) {
    use rmcp::model::ResourceContents;
    let mut blocks = Vec::new();
    let mut embedded = Vec::new();
    let mut skipped = Vec::new();
    let mut total = 0usize;
    let mut wire = 0usize;
    for f in files {
        if total + f.data.len() > MAX_EMBEDDED_BYTES {
            skipped.push(f.path.clone());
            continue;
        }
        let uri = format!("file:///workspace/{}", f.path);
        let mime = mime_of(&f.path);
        let contents = match std::str::from_utf8(&f.data) {
            Ok(t) if !mime.starts_with("image/") => ResourceContents::text(t, uri),
            _ => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(&f.data),
                uri,
            ),
        }
        .with_mime_type(mime);
        let block = ContentBlock::resource(contents);
        let size = serde_json::to_string(&block)
            .map(|s| s.len())
            .unwrap_or(usize::MAX);
        if wire.saturating_add(size) > room {
            skipped.push(f.path.clone());
            continue;
        }
        total += f.data.len();
        wire += size;
        blocks.push(block);
        embedded.push(f.path.clone());
    }
    let mut line = String::new();
    if !embedded.is_empty() {
        line.push_str(&format!(
            "files written under /workspace, embedded after this text: {}\n",
            embedded.join(", ")
        ));
    }
    if !skipped.is_empty() {
        line.push_str(&format!(
            "files not embedded (over {} KiB in all, or no room left in this result; use read_file): {}\n",
            MAX_EMBEDDED_BYTES >> 10,
            skipped.join(", ")
        ));
    }
    (blocks, line)
}

fn mime_of(path: &str) -> &'static str {
    let ext = path.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "csv" => "text/csv",
        "json" => "application/json",
        "txt" | "log" | "md" | "py" => "text/plain",
        "html" => "text/html",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod embed_tests {
    use super::*;

    #[test]
    fn files_are_embedded_within_the_cap() {
        let files = vec![
            OutputFile {
                path: "out.csv".into(),
                data: b"a,b\n1,2\n".to_vec(),
            },
            OutputFile {
                path: "raw.bin".into(),
                data: vec![0xff, 0x00],
            },
            OutputFile {
                path: "big.txt".into(),
                data: vec![b'x'; MAX_EMBEDDED_BYTES],
            },
        ];
        let (blocks, line) = embed_files(&files, 1 << 20);
        assert_eq!(blocks.len(), 2);
        let first = blocks[0].as_resource().unwrap();
        let json = serde_json::to_value(first).unwrap();
        assert_eq!(json["resource"]["uri"], "file:///workspace/out.csv");
        assert_eq!(json["resource"]["mimeType"], "text/csv");
        assert_eq!(json["resource"]["text"], "a,b\n1,2\n");
        let second = serde_json::to_value(blocks[1].as_resource().unwrap()).unwrap();
        assert_eq!(second["resource"]["blob"], "/wA=");
        assert!(
            line.contains("embedded after this text: out.csv, raw.bin"),
            "{line}"
        );
        assert!(
            line.contains("not embedded") && line.contains("big.txt"),
            "{line}"
        );
    }
}
