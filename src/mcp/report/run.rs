//! The report of a run: the status line, stdout and stderr within the result's budget (the
//! whole of a long stream kept in the workspace, linked as a resource), figures and files.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use super::{kept_name, with_structured, Keep};
use crate::job::Outcome;
use crate::mcp::fit::{budget, escaped_len, head_tail};
use crate::mcp::{figures, resources};

/// The result of running code: the engine's outcome fields plus where the code is stored.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunReport {
    /// One line: how the run ended (exit code, timed out, OOM-killed, truncation, duration).
    pub status: String,
    /// True when the code exited 0 without being stopped.
    pub success: bool,
    /// Exit status; null when the code was killed by a signal or timed out.
    pub exit_code: Option<i64>,
    /// The signal that killed the code (9 for a timeout or the OOM killer); null otherwise.
    pub signal: Option<i32>,
    /// True when the run was killed at its wall-clock limit.
    pub timed_out: bool,
    /// True when the run was killed for using more than its memory limit.
    pub oom_killed: bool,
    /// What the code printed to stdout. A long output is cut to its head and tail (marked
    /// `[... N bytes not shown ...]`); the whole of it is then in the workspace file named
    /// by `stdout_file`.
    pub stdout: String,
    /// What the code printed to stderr (tracebacks), cut like stdout when long.
    pub stderr: String,
    /// True when the code printed more than the per-stream output limit and the rest was
    /// discarded in the sandbox.
    pub stdout_truncated: bool,
    /// As `stdout_truncated`, for stderr.
    pub stderr_truncated: bool,
    /// The workspace file (read_file, or `/workspace/<name>` in code) holding the whole
    /// stdout, when it was too long for this result; null otherwise.
    pub stdout_file: Option<String>,
    /// As `stdout_file`, for stderr.
    pub stderr_file: Option<String>,
    /// Wall time from the request to the result, container start-up included, in ms.
    pub duration_ms: u64,
    /// CPU time the code used, in ms, when measured.
    pub cpu_ms: Option<u64>,
    /// Peak memory of the sandbox in bytes, when measured.
    pub peak_memory_bytes: Option<u64>,
    /// The wall-clock limit that applied, in seconds.
    pub timeout_seconds: f64,
    /// The stored file that was run (pass it to read_code_file or execute_code_file);
    /// `<session>` for execute_python.
    pub file_path: String,
    /// The session whose workspace (and, for execute_python, REPL) this call used: pass it
    /// as `session_id` to continue it. Null when there is none to continue.
    pub session_id: Option<String>,
    /// Figures returned as image content, in order.
    pub figures: Vec<figures::FigureInfo>,
    /// Figures not returned: over the caps of the sandbox, or too large for this result.
    pub figures_dropped: u64,
    #[serde(skip)]
    #[schemars(skip)]
    images: Vec<crate::job::Artifact>,
    #[serde(skip)]
    #[schemars(skip)]
    files: Vec<crate::job::OutputFile>,
    #[serde(skip)]
    #[schemars(skip)]
    full: [String; 2],
    #[serde(skip)]
    #[schemars(skip)]
    notes: Vec<String>,
    /// Names kept in the session's workspace by this call (served as resources).
    #[serde(skip)]
    #[schemars(skip)]
    kept_names: Vec<String>,
}

impl RunReport {
    pub fn new(o: &Outcome, timeout_seconds: f64, file_path: String) -> Self {
        let (stdout, stderr) = (o.stdout_text(), o.stderr_text());
        RunReport {
            status: o.status_line(),
            success: o.success(),
            exit_code: o.exit_code,
            signal: o.signal,
            timed_out: o.timed_out,
            oom_killed: o.oom_killed,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
            stdout_file: None,
            stderr_file: None,
            duration_ms: o.duration_ms,
            cpu_ms: o.cpu_ms,
            peak_memory_bytes: o.peak_memory_bytes,
            timeout_seconds,
            file_path,
            session_id: None,
            figures: figures::infos(o),
            figures_dropped: o.artifacts_dropped,
            images: o.artifacts.clone(),
            files: o.files.clone(),
            full: [stdout, stderr],
            notes: Vec::new(),
            kept_names: Vec::new(),
        }
    }

    /// What the result cannot carry within [`budget`]: a stream whose text-block share cuts
    /// it, a figure that does not fit. The tool keeps these in the session's workspace,
    /// then calls [`RunReport::kept`].
    pub fn to_keep(&self) -> Keep {
        let mut keep = Keep::new();
        let [so, se] = shares(&self.full, budget::TEXT_OUTPUT);
        for (i, (stream, share)) in [("stdout", so), ("stderr", se)].into_iter().enumerate() {
            if escaped_len(&self.full[i]) > share {
                keep.push((kept_name(stream), self.full[i].as_bytes().to_vec()));
            }
        }
        // Every figure: those too large for the result, and the others too, so that
        // each can be read back as a resource (`resources/read`) or with read_file.
        for a in &self.images {
            keep.push((a.name.clone(), a.data.clone()));
        }
        keep
    }

    /// The session this call used, what was kept in its workspace, and why something was
    /// not (`refused`).
    pub fn kept(
        mut self,
        session: Option<&str>,
        names: Vec<String>,
        refused: Option<String>,
    ) -> Self {
        self.session_id = session.map(str::to_string);
        for n in &names {
            if *n == kept_name("stdout") {
                self.stdout_file = Some(n.clone());
            } else if *n == kept_name("stderr") {
                self.stderr_file = Some(n.clone());
            }
        }
        self.kept_names = names;
        if let Some(e) = refused {
            self.notes.push(format!(
                "not all of the output could be kept in the workspace: {e}"
            ));
        }
        self
    }

    /// Which images fit the budget beside the output (indices kept, indices dropped).
    fn fit_images(&self) -> (Vec<usize>, Vec<usize>) {
        let mut used = budget::OVERHEAD + budget::STRUCTURED_OUTPUT + budget::TEXT_OUTPUT;
        let (mut fit, mut dropped) = (Vec::new(), Vec::new());
        for (i, a) in self.images.iter().enumerate() {
            let size = a.data.len().div_ceil(3) * 4 + 256;
            if used + size <= budget::MESSAGE {
                used += size;
                fit.push(i);
            } else {
                dropped.push(i);
            }
        }
        (fit, dropped)
    }

    /// The tool result: `isError` unless the code succeeded.
    pub fn into_result(mut self, note: Option<String>) -> CallToolResult {
        let streams = ["stdout", "stderr"];
        let files = [self.stdout_file.clone(), self.stderr_file.clone()];
        let full = std::mem::take(&mut self.full);
        // structuredContent: the output within its share.
        let shares_s = shares(&full, budget::STRUCTURED_OUTPUT);
        let where_ = |i: usize| match &files[i] {
            Some(f) => format!("the whole {} is in the workspace file {f}", streams[i]),
            None => format!("the rest of {} was not kept", streams[i]),
        };
        self.stdout = head_tail(&full[0], shares_s[0], &where_(0));
        self.stderr = head_tail(&full[1], shares_s[1], &where_(1));
        // The images that fit; the others were kept in the workspace (or not).
        let (fit, dropped) = self.fit_images();
        let mut images = Vec::new();
        let mut figures = Vec::new();
        for i in &fit {
            images.push(self.images[*i].clone());
            figures.push(self.figures[*i].clone());
        }
        let mut notes: Vec<String> = note.into_iter().collect();
        notes.append(&mut self.notes);
        if !dropped.is_empty() {
            let names: Vec<String> = dropped
                .iter()
                .map(|i| self.images[*i].name.clone())
                .collect();
            notes.push(format!(
                "figures not sent, too large for one result (at most {} KiB): {}; they are in the workspace under those names when it could keep them (read_file, list_files)",
                budget::MESSAGE >> 10,
                names.join(", ")
            ));
            self.figures_dropped += dropped.len() as u64;
        }
        self.figures = figures;
        // The text block: the status, the session, notes, then the output within its share.
        let mut text = format!("{}\n", self.status);
        if self.file_path != "<session>" {
            text.push_str(&format!("file_path: {}\n", self.file_path));
        }
        if let Some(id) = &self.session_id {
            text.push_str(&format!(
                "session_id: {id} (pass it as session_id to keep using this session)\n"
            ));
        }
        for n in &notes {
            text.push_str(&format!("note: {n}\n"));
        }
        let links = self.links(&full);
        if !links.is_empty() {
            text.push_str(&format!(
                "resources (resource_link blocks after this text; read each with resources/read, or the file with read_file and this session_id): {}\n",
                resources::uris(&links).join(" ")
            ));
        }
        let shares_t = shares(&full, budget::TEXT_OUTPUT);
        for i in 0..2 {
            if full[i].is_empty() {
                continue;
            }
            let shown = head_tail(&full[i], shares_t[i], &where_(i));
            if shown.len() < full[i].len() {
                text.push_str(&format!(
                    "{} is {} bytes, more than one result carries: shown are its first and last lines; {}{}\n",
                    streams[i],
                    full[i].len(),
                    where_(i),
                    match &files[i] {
                        Some(f) => format!(
                            " (read_file with path `{f}` and offset/length to page through it, or open /workspace/{f} in your code{})",
                            self.session_id.as_ref().map(|s| format!(", with session_id {s}")).unwrap_or_default()
                        ),
                        None => String::new(),
                    }
                ));
            }
            text.push_str(&format!("--- {} ---\n{shown}", streams[i]));
            if !shown.ends_with('\n') {
                text.push('\n');
            }
        }
        if full[0].is_empty() && full[1].is_empty() {
            text.push_str("(no output)\n");
        }
        text.push_str(&figures::text(&self.figures, self.figures_dropped));
        let used = serde_json::to_string(&self).map(|s| s.len()).unwrap_or(0)
            + escaped_len(&text)
            + images
                .iter()
                .map(|a| a.data.len().div_ceil(3) * 4 + 256)
                .sum::<usize>();
        let room = budget::MESSAGE.saturating_sub(used + budget::OVERHEAD);
        let (blocks, files_note) = figures::embed_files(&self.files, room);
        text.push_str(&files_note);
        let mut result = with_structured(text, &self, !self.success);
        figures::attach(&mut result, &images);
        result.content.extend(blocks);
        result.content.extend(links);
        result
    }

    /// `resource_link` blocks for what this call left in the session's workspace: the whole
    /// of a stream too long for the result, the figures, the files the code wrote.
    fn links(&self, full: &[String; 2]) -> Vec<ContentBlock> {
        use crate::mcp::resources::links;
        let Some(handle) = self.session_id.as_deref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, stream) in ["stdout", "stderr"].into_iter().enumerate() {
            let name = kept_name(stream);
            if self.kept_names.contains(&name) {
                out.extend(links(
                    handle,
                    &name,
                    full[i].as_bytes(),
                    &format!("the whole {stream} of the run"),
                ));
            }
        }
        for a in &self.images {
            if self.kept_names.contains(&a.name) {
                out.extend(links(handle, &a.name, &a.data, "a figure of the run (PNG)"));
            }
        }
        for f in &self.files {
            if !self.kept_names.contains(&f.path) {
                out.extend(links(
                    handle,
                    &f.path,
                    &f.data,
                    "a file the code wrote to /workspace",
                ));
            }
        }
        out
    }
}

/// Each stream's share of `total` (JSON-escaped bytes): all of both when they fit, else
/// stderr at least a quarter (its tail holds the traceback) and stdout the rest.
fn shares(full: &[String; 2], total: usize) -> [usize; 2] {
    let (o, e) = (escaped_len(&full[0]), escaped_len(&full[1]));
    if o + e <= total {
        return [o, e];
    }
    let err = e.min((total / 4).max(total.saturating_sub(o)));
    [total - err, err]
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

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn a_huge_output_and_figure_fit_one_message_with_head_tail_and_where_the_rest_is() {
        let mut stdout = b"first line\n".to_vec();
        stdout.extend(std::iter::repeat_n(b'x', 1 << 20));
        stdout.extend(b"\nlast line\n");
        let o = Outcome {
            exit_code: Some(0),
            stdout,
            stderr: "\u{1}".repeat(300_000).into_bytes(),
            artifacts: vec![crate::job::Artifact {
                name: "figure-001.png".into(),
                data: vec![7; 700 << 10],
            }],
            ..Default::default()
        };
        let report = RunReport::new(&o, 30.0, "/s/x.py".into());
        let keep = report.to_keep();
        let names: Vec<&str> = keep.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "last-run-stdout.txt",
                "last-run-stderr.txt",
                "figure-001.png"
            ]
        );
        assert_eq!(keep[0].1.len(), o.stdout.len(), "the whole stdout is kept");
        let names = names.iter().map(|n| n.to_string()).collect();
        let r = report.kept(Some("s_1"), names, None).into_result(None);
        let size = serde_json::to_string(&r).unwrap().len();
        assert!(size < budget::MESSAGE, "{size}");
        let text = &r.content[0].as_text().unwrap().text;
        assert!(
            text.contains("first line") && text.contains("last line"),
            "head and tail"
        );
        assert!(text.contains("read_file") && text.contains("last-run-stdout.txt"));
        assert!(text.contains("session_id: s_1"));
        let s = r.structured_content.unwrap();
        assert_eq!(s["stdout_file"], "last-run-stdout.txt");
        assert_eq!(s["figures_dropped"], 1);
        assert!(s["stdout"].as_str().unwrap().ends_with("last line\n"));
        // A short output is whole in both.
        let small = Outcome {
            exit_code: Some(0),
            stdout: b"42\n".to_vec(),
            ..Default::default()
        };
        let r = RunReport::new(&small, 30.0, "<session>".into());
        assert!(r.to_keep().is_empty());
        let r = r.kept(None, vec![], None).into_result(None);
        assert_eq!(r.structured_content.unwrap()["stdout"], "42\n");
    }
}
