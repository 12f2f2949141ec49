//! What the tools answer: a text block an LLM reads first (status line, stdout, stderr) and
//! `structuredContent` a program can rely on, declared by each tool's `outputSchema`.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Serialize;

use crate::job::Outcome;

/// How large a tool result may be. The official MCP SDKs refuse a server-sent event over
/// 1 MiB (the Python SDK: "Server-sent event exceeded the 1048576 byte limit", and its
/// session dies), so every result stays well under that, whatever the transport.
pub mod budget {
    /// The largest serialized tool result.
    pub const MESSAGE: usize = 640 << 10;
    /// stdout and stderr together in `structuredContent`, JSON-escaped.
    pub const STRUCTURED_OUTPUT: usize = 256 << 10;
    /// stdout and stderr together in the text block, JSON-escaped: the text summarises
    /// `structuredContent` (all of a short output, head and tail of a long one).
    pub const TEXT_OUTPUT: usize = 64 << 10;
    /// Room kept for the status line, notes, figure names and the JSON-RPC envelope.
    pub const OVERHEAD: usize = 24 << 10;
}

/// The workspace file that keeps a stream too long for a result.
pub fn kept_name(stream: &str) -> String {
    format!("last-run-{stream}.txt")
}

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
    pub figures: Vec<super::figures::FigureInfo>,
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

/// What a result cannot carry and the workspace should keep: (file name, bytes).
pub type Keep = Vec<(String, Vec<u8>)>;

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
            figures: super::figures::infos(o),
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
                super::resources::uris(&links).join(" ")
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
        text.push_str(&super::figures::text(&self.figures, self.figures_dropped));
        let used = serde_json::to_string(&self).map(|s| s.len()).unwrap_or(0)
            + escaped_len(&text)
            + images
                .iter()
                .map(|a| a.data.len().div_ceil(3) * 4 + 256)
                .sum::<usize>();
        let room = budget::MESSAGE.saturating_sub(used + budget::OVERHEAD);
        let (blocks, files_note) = super::figures::embed_files(&self.files, room);
        text.push_str(&files_note);
        let mut result = with_structured(text, &self, !self.success);
        super::figures::attach(&mut result, &images);
        result.content.extend(blocks);
        result.content.extend(links);
        result
    }

    /// `resource_link` blocks for what this call left in the session's workspace: the whole
    /// of a stream too long for the result, the figures, the files the code wrote.
    fn links(&self, full: &[String; 2]) -> Vec<ContentBlock> {
        use super::resources::links;
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

/// Bytes `s` takes as a JSON string (quotes and escapes included).
pub fn escaped_len(s: &str) -> usize {
    serde_json::to_string(s)
        .map(|j| j.len())
        .unwrap_or(s.len() * 6)
}

/// The longest prefix of `s` whose JSON-escaped length is at most `max`, on a char boundary.
pub(crate) fn prefix_within(s: &str, max: usize) -> &str {
    let mut used = 2;
    for (i, c) in s.char_indices() {
        let w = match c {
            '"' | '\\' => 2,
            c if (c as u32) < 0x20 => {
                if matches!(c, '\n' | '\r' | '\t' | '\u{8}' | '\u{c}') {
                    2
                } else {
                    6
                }
            }
            c => c.len_utf8(),
        };
        if used + w > max {
            return &s[..i];
        }
        used += w;
    }
    s
}

/// The longest suffix of `s` within `max` escaped bytes.
fn suffix_within(s: &str, max: usize) -> &str {
    let mut used = 2;
    for (i, c) in s.char_indices().rev() {
        let w = escaped_len(c.encode_utf8(&mut [0; 4])) - 2;
        if used + w > max {
            return &s[i + c.len_utf8()..];
        }
        used += w;
    }
    s
}

/// `s` itself when it fits `max` escaped bytes, else its head and tail (cut at line ends
/// where one is near) around a marker saying how much is not shown and where it is.
pub fn head_tail(s: &str, max: usize, where_: &str) -> String {
    if escaped_len(s) <= max {
        return s.to_string();
    }
    let marker_room = 200 + where_.len();
    let half = max.saturating_sub(marker_room) / 2;
    let mut head = prefix_within(s, half);
    if let Some(nl) = head.rfind('\n') {
        if nl > head.len() / 2 {
            head = &head[..=nl];
        }
    }
    let mut tail = suffix_within(s, half);
    if let Some(nl) = tail.find('\n') {
        if nl < tail.len() / 2 {
            tail = &tail[nl + 1..];
        }
    }
    let hidden = s.len() - head.len() - tail.len();
    let nl = if head.ends_with('\n') { "" } else { "\n" };
    format!("{head}{nl}[... {hidden} bytes not shown: {where_} ...]\n{tail}")
}

/// The longest error message a client gets back (protocol errors, and tool errors that
/// quote what was sent): an error names what is wrong and quotes at most a short prefix of
/// the offending value, however large the value was (a stored task keeps its error for 15
/// minutes: issue 24).
pub const ERROR_MAX: usize = 512;

/// The most of one client-sent value an error quotes.
pub const QUOTE_MAX: usize = 64;

/// `value` as an error quotes it: whole when short, else its first [`QUOTE_MAX`] bytes (on
/// a character boundary) and how long it was.
pub fn quote(value: &str) -> String {
    if value.len() <= QUOTE_MAX {
        return value.to_string();
    }
    let mut cut = QUOTE_MAX;
    while !value.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes)", &value[..cut], value.len())
}

/// The longest text of a tool error: it may carry an installer's own report, and it may
/// quote what was sent (each quoted value itself cut to [`QUOTE_MAX`] where it is made).
pub const TOOL_ERROR_MAX: usize = 4096;

/// `message` within `max` bytes (at least 256): whole when it fits, else its head and tail
/// (where "expected ..." and the like are said) around a marker of what was left out.
pub fn capped_message(message: &str, max: usize) -> std::borrow::Cow<'_, str> {
    let max = max.max(256);
    if message.len() <= max {
        return message.into();
    }
    const TAIL: usize = 96;
    let mut head = max - TAIL - 48;
    while !message.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = message.len() - TAIL;
    while !message.is_char_boundary(tail) {
        tail += 1;
    }
    let hidden = tail - head;
    format!(
        "{}… [{hidden} bytes not shown] …{}",
        &message[..head],
        &message[tail..]
    )
    .into()
}

/// A protocol error with its message within [`ERROR_MAX`] (what every tool call answers
/// passes through here).
pub fn capped_error(mut e: rmcp::ErrorData) -> rmcp::ErrorData {
    if e.message.len() > ERROR_MAX {
        e.message = capped_message(&e.message, ERROR_MAX).into_owned().into();
    }
    e
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

/// Property tests of the pure functions that cut, escape and quote (issue 24).
#[cfg(test)]
mod property_tests {
    use super::*;
    use proptest::prelude::*;

    /// Text with what escaping makes longer: quotes, backslashes, control characters,
    /// multi-byte characters, separators.
    fn text() -> impl Strategy<Value = String> {
        "[a\\\"\n\t\u{0}\u{1}\u{1f}é€😀\u{2028}\u{202e} ]{0,300}"
    }

    proptest! {
        #[test]
        fn prefix_within_is_the_longest_prefix_that_fits(s in text(), max in 0usize..400) {
            let p = prefix_within(&s, max);
            prop_assert!(s.starts_with(p));
            if max >= 2 {
                prop_assert!(escaped_len(p) <= max, "{} > {max}", escaped_len(p));
            }
            if p.len() < s.len() && max >= 2 {
                let next = s[p.len()..].chars().next().unwrap();
                let longer = &s[..p.len() + next.len_utf8()];
                prop_assert!(escaped_len(longer) > max);
            }
        }

        #[test]
        fn head_tail_fits_and_keeps_both_ends(s in text(), max in 300usize..2000) {
            let out = head_tail(&s, max, "the rest is elsewhere");
            if escaped_len(&s) <= max {
                prop_assert_eq!(&out, &s);
            } else {
                prop_assert!(escaped_len(&out) <= max, "{} > {max}", escaped_len(&out));
                prop_assert!(out.contains("bytes not shown: the rest is elsewhere"));
                let (head, rest) = out.split_once("[... ").unwrap();
                let tail = rest.split_once(" ...]\n").unwrap().1;
                prop_assert!(s.starts_with(head.trim_end_matches('\n')));
                prop_assert!(s.ends_with(tail));
            }
        }

        #[test]
        fn quote_is_short_and_a_prefix(s in text()) {
            let q = quote(&s);
            prop_assert!(q.len() <= QUOTE_MAX + 32, "{}", q.len());
            let shown = q.split("… (").next().unwrap();
            prop_assert!(s.starts_with(shown));
        }

        #[test]
        fn capped_messages_fit(s in text(), n in 0usize..20_000, max in 0usize..5000) {
            let m = format!("invalid argument `x`: {}{s}", "9".repeat(n));
            let c = capped_message(&m, max);
            prop_assert!(c.len() <= max.max(256), "{} > {}", c.len(), max.max(256));
            if m.len() <= max.max(256) {
                prop_assert_eq!(c.as_ref(), m.as_str());
            } else {
                prop_assert!(c.starts_with("invalid argument `x`: "));
                prop_assert!(c.contains("bytes not shown"));
            }
        }
    }

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
