//! Figures (matplotlib PNGs) of a run as MCP image content, and what the text and the
//! structured content say about them.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use crate::job::{Artifact, Outcome};

/// One figure returned with a run (its bytes travel as an image content block).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct FigureInfo {
    /// e.g. `figure-001.png`.
    pub name: String,
    pub mime_type: String,
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
