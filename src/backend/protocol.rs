//! The wire protocol between the server and the runner (`images/sandbox/mcp_runner/`),
//! PID 1 of every sandbox. Pure code, no I/O: the Docker backend feeds it bytes.
//!
//! - stdin: `u32` header length, JSON [`JobHeader`], then `tar_len` bytes of tar. A
//!   session then sends messages one at a time, each answered by frames ending in `X`:
//!   a cell ([`encode_cell`]) or files to put into the workspace ([`encode_put_files`]).
//! - stdout: frames of `kind: u8`, `len: u32` (big-endian), payload; see [`Frame`].

use serde::{Deserialize, Serialize};

use super::archive::{self, ArchiveError};
use crate::job::{InputFile, JobSpec};

/// Where the workspace tmpfs is mounted inside the sandbox.
pub const WORKDIR: &str = "/workspace";

/// Where a sandbox that has a directory of its own on the host (Docker under runc) sees it:
/// the server listens on [`EGRESS_SOCKET`] in it during a run with egress, and the runner
/// (`netrelay.py`, which names the same path) connects the code's connections there.
pub const SANDBOX_DIR: &str = "/run/mcp-egress";

/// The egress socket's name in the sandbox's directory.
pub const EGRESS_SOCKET: &str = "egress.sock";

/// Largest frame the server accepts: output comes in 64 KiB chunks, artifacts are capped
/// at 4 MiB by the runner.
const MAX_FRAME: usize = 9 << 20;

/// How long past its timeout the runner waits for the server to kill the sandbox before it
/// kills the code itself (the server is gone: a crash, `kill -9`, a recreated service).
pub const BACKSTOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a started runner waits for its job before it exits by itself: longer than a
/// pool container may wait ([`crate::backend::docker`]'s pool replaces them sooner), so
/// only the containers of a server that died ever reach it.
pub const WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(900);

/// What every sandbox's runner is told in its environment (and takes out of it before the
/// code starts): how long to wait for its job ([`WAIT_LIMIT`]), and its CPU limit, to which
/// it sizes the thread pools of numerical libraries (OpenBLAS, OpenMP, MKL, numexpr:
/// otherwise one thread per host core, whatever the quota).
pub fn runner_env(limits: &crate::job::Limits) -> [(String, String); 2] {
    [
        ("MCPX_WAIT_LIMIT".into(), WAIT_LIMIT.as_secs().to_string()),
        ("MCPX_CPUS".into(), limits.cpus.to_string()),
    ]
}

/// The job description the runner reads before the archive.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct JobHeader {
    pub tar_len: u64,
    /// The interpreter; the runner has already started its default one and starts another
    /// only when this differs.
    pub python: String,
    /// The file to run, relative to `workdir`.
    pub entry: String,
    pub workdir: String,
    pub output_limit: u64,
    /// Send back the files the code creates or changes under the workspace.
    #[serde(default)]
    pub return_files: bool,
    /// `run` (one file, then exit) or `session` (cells until stdin closes).
    #[serde(default = "run_mode")]
    pub mode: String,
    /// Seconds after which the runner kills the code itself: the timeout plus
    /// [`BACKSTOP_GRACE`]. The server normally kills the sandbox first, at the timeout.
    #[serde(default)]
    pub deadline_s: Option<f64>,
    /// Bytes of figures and workspace files one run (or one cell) may return in all
    /// ([`RETURN_BYTES`]): what does not fit is left out and said in the report's `notes`.
    #[serde(default)]
    pub return_limit: Option<u64>,
    /// Egress (#41): the runner listens on loopback, gives the code the proxy variables and
    /// relays each connection as a stream (frames `N`, stdin messages of kind `net`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// With egress: the interception CA's certificate (PEM, public), which the runner adds
    /// to the system's CAs in the bundle it names in `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`
    /// and `CURL_CA_BUNDLE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_ca: Option<String>,
}

/// What one run (or one cell) may return besides its output: figures and workspace files
/// together, in bytes. With the output caps (stdout and stderr, `output_bytes` each) it
/// bounds a result's size whatever the per-figure and per-file caps allow one by one.
pub const RETURN_BYTES: u64 = 16 << 20;

fn run_mode() -> String {
    "run".to_string()
}

/// The bytes to write to the runner's stdin for `job`, run with `python`.
pub fn encode_job(job: &JobSpec, python: &str) -> Result<Vec<u8>, ArchiveError> {
    archive::check_relative_path(&job.entry)?;
    encode(job, python, "run")
}

/// The bytes that open a session: its files, then the runner waits for cells.
pub fn encode_session(job: &JobSpec, python: &str) -> Result<Vec<u8>, ArchiveError> {
    encode(job, python, "session")
}

/// One cell of a session: `u32` length, JSON `{"kind": "cell", "code", "output_limit"}`,
/// with `warm`, the modules its interpreter imports once the cell is done and the session
/// waits (the idle warm-up, issue 43), when there are any.
pub fn encode_cell(code: &str, output_limit: u64, warm: &[String]) -> Vec<u8> {
    let mut cell = serde_json::json!({
        "kind": "cell",
        "code": code,
        "output_limit": output_limit,
        "return_limit": RETURN_BYTES,
    });
    if !warm.is_empty() {
        cell["warm"] = serde_json::json!(warm);
    }
    message(&cell)
}

/// Files to put into a live session's workspace: `u32` length, JSON
/// `{"kind": "files", "tar_len"}`, then the tar. The runner unpacks it itself, as safely as
/// a job's archive (a symlink the code left where a file goes is replaced, never
/// followed), without running anything in the session's interpreter, and answers with a
/// report: exit code 0, or 1 with the reason on stderr; the session goes on either way.
pub fn encode_put_files(files: &[InputFile]) -> Result<Vec<u8>, ArchiveError> {
    let tar = archive::pack(files)?;
    let mut out = message(&serde_json::json!({
        "kind": "files",
        "tar_len": tar.len(),
    }));
    out.extend_from_slice(&tar);
    Ok(out)
}

/// A session message: `u32` length, JSON.
fn message(body: &serde_json::Value) -> Vec<u8> {
    let body = serde_json::to_vec(body).expect("a message serializes");
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

fn encode(job: &JobSpec, python: &str, mode: &str) -> Result<Vec<u8>, ArchiveError> {
    let tar = archive::pack(&job.files)?;
    let header = JobHeader {
        tar_len: tar.len() as u64,
        python: python.to_string(),
        entry: job.entry.clone(),
        workdir: WORKDIR.to_string(),
        output_limit: job.limits.output_bytes,
        return_files: job.return_files,
        mode: mode.to_string(),
        deadline_s: (mode == "run").then(|| (job.limits.timeout + BACKSTOP_GRACE).as_secs_f64()),
        return_limit: Some(RETURN_BYTES),
        egress: job.egress.is_some(),
        egress_ca: job.egress.as_ref().map(|e| e.0.ca_pem()),
    };
    let header = serde_json::to_vec(&header).expect("header serializes");
    let mut out = Vec::with_capacity(4 + header.len() + tar.len());
    out.extend_from_slice(&(header.len() as u32).to_be_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&tar);
    Ok(out)
}

/// The runner's final report (frame `X`).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct Report {
    pub exit_code: Option<i64>,
    pub signal: Option<i32>,
    /// The runner's own backstop deadline killed the code (the server did not).
    #[serde(default)]
    pub timed_out: bool,
    pub cpu_ms: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    #[serde(default)]
    pub oom_kills: u64,
    #[serde(default)]
    pub stdout_bytes: u64,
    #[serde(default)]
    pub stderr_bytes: u64,
    /// Figures over the runner's caps (count or size), not sent.
    #[serde(default)]
    pub artifacts_dropped: u64,
    /// Workspace files over the runner's caps, not sent.
    #[serde(default)]
    pub files_dropped: u64,
    /// A session's interpreter exited during the cell (`exit()`, `sys.exit()`, a crash):
    /// the session can run no further cell.
    #[serde(default)]
    pub ended: bool,
    /// What the runner left out and why (the return limit, a figure that was not a PNG,
    /// a file name unfit to show, a workspace too deep to walk), one sentence each.
    #[serde(default)]
    pub notes: Vec<String>,
    /// What the sandbox's preload did (pool sandboxes of a one-shot run; see
    /// [`crate::backend::preload`]).
    #[serde(default)]
    pub preload: Option<Box<crate::backend::preload::PreloadReport>>,
    /// Modules the run's file imports that the environment holds (names only, at most two
    /// levels deep; the learner checks them again).
    #[serde(default)]
    pub imported: Vec<String>,
    /// What a session's idle warm-ups imported or skipped so far (never asked for again).
    #[serde(default)]
    pub warmed: Vec<String>,
    /// The runner's own timings, for the trace: `(name, start, end)` in milliseconds before
    /// the report was sent (see [`crate::backend::engine`]'s `phases`).
    #[serde(default)]
    pub phases: Vec<(String, f64, f64)>,
}

/// One message from the runner.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// `R`: the runner is up and reads its job.
    Ready,
    /// `S`: the runner has its whole job: whatever happens to the sandbox from here on
    /// happened to this job (a sandbox that dies before it was never given the job).
    Started,
    /// `O`: user stdout.
    Stdout(Vec<u8>),
    /// `E`: user stderr.
    Stderr(Vec<u8>),
    /// `A`: a file the code produced (a figure).
    Artifact { name: String, data: Vec<u8> },
    /// `W`: a file the code created or changed under the workspace.
    File { path: String, data: Vec<u8> },
    /// `X`: the code has ended.
    Exit(Report),
    /// `F`: the runner could not run the job.
    Failed(String),
    /// `N`: egress (#41): stream `stream` of the code's connections to the proxy, see
    /// [`crate::backend::relay`].
    Net {
        stream: u32,
        op: NetOp,
        data: Vec<u8>,
    },
    /// `T`: code mode: a request of the code (JSON, as the code wrote it: unchecked) for
    /// the server, answered by a [`encode_tool_answer`] message on stdin.
    Tool(Vec<u8>),
}

/// What an `N` frame (runner to server) or a `net` message (server to runner) does to its
/// stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetOp {
    /// The code connected (runner to server only).
    Open,
    /// Bytes of the stream.
    Data,
    /// No more bytes this way (a half-close).
    Eof,
    /// The stream is gone, both ways.
    Close,
    /// The reader took this many more bytes (`u32` payload): the sender may send them.
    Credit,
}

impl NetOp {
    fn of(byte: u8) -> Option<NetOp> {
        Some(match byte {
            b'o' => NetOp::Open,
            b'd' => NetOp::Data,
            b'e' => NetOp::Eof,
            b'c' => NetOp::Close,
            b'k' => NetOp::Credit,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            NetOp::Open => "open",
            NetOp::Data => "data",
            NetOp::Eof => "eof",
            NetOp::Close => "close",
            NetOp::Credit => "credit",
        }
    }
}

/// A `net` message for the runner: `u32` length, JSON `{"kind": "net", "s", "op", "len"}`,
/// then `len` bytes of `data` (a credit's amount is its `k`).
pub fn encode_net(stream: u32, op: NetOp, data: &[u8], credit: u32) -> Vec<u8> {
    let mut out = message(&serde_json::json!({
        "kind": "net",
        "s": stream,
        "op": op.name(),
        "len": data.len(),
        "k": credit,
    }));
    out.extend_from_slice(data);
    out
}

/// Code mode's answer to a `T` request: a session-style message of kind `tool` (the runner
/// passes it to the code).
pub fn encode_tool_answer(answer: &serde_json::Value) -> Vec<u8> {
    message(answer)
}

/// The answer to a `T` request of a run that has no tools (a session's runner keeps
/// relaying, since its stdin stays open): an error the code raises as `ToolError`.
pub fn tool_unavailable(request: &[u8]) -> Vec<u8> {
    let id = serde_json::from_slice::<serde_json::Value>(request)
        .ok()
        .and_then(|v| v.get("id").cloned())
        .unwrap_or(serde_json::Value::Null);
    let catalog = serde_json::from_slice::<serde_json::Value>(request)
        .ok()
        .is_some_and(|v| v.get("op").and_then(|o| o.as_str()) == Some("catalog"));
    if catalog {
        return message(&serde_json::json!({"kind": "tool", "id": id, "servers": []}));
    }
    message(&serde_json::json!({
        "kind": "tool",
        "id": id,
        "error": {"type": "ToolError", "message": "code mode is not available in this run (no tools are configured for this server)"},
    }))
}

/// Why the runner's stream cannot be understood.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProtocolError {
    #[error("frame of unknown kind {0:#04x}")]
    UnknownKind(u8),
    #[error("frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("malformed report: {0}")]
    BadReport(String),
}

/// Reassembles frames from the chunks Docker delivers.
#[derive(Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete frame, if the buffer holds one.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtocolError::TooLarge(len));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let kind = self.buf[0];
        let payload: Vec<u8> = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        let frame = match kind {
            b'R' => Frame::Ready,
            b'S' => Frame::Started,
            b'O' => Frame::Stdout(payload),
            b'E' => Frame::Stderr(payload),
            b'A' => {
                let (name, data) = named(&payload)?;
                Frame::Artifact { name, data }
            }
            b'W' => {
                let (path, data) = named(&payload)?;
                Frame::File { path, data }
            }
            b'X' => Frame::Exit(
                serde_json::from_slice(&payload)
                    .map_err(|e| ProtocolError::BadReport(e.to_string()))?,
            ),
            b'F' => {
                #[derive(Deserialize)]
                struct Failure {
                    error: String,
                }
                let f: Failure = serde_json::from_slice(&payload)
                    .map_err(|e| ProtocolError::BadReport(e.to_string()))?;
                Frame::Failed(f.error)
            }
            b'T' => Frame::Tool(payload),
            b'N' => {
                if payload.len() < 5 {
                    return Err(ProtocolError::BadReport("short net frame".into()));
                }
                let stream = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                let op = NetOp::of(payload[4])
                    .ok_or_else(|| ProtocolError::BadReport("unknown net operation".into()))?;
                Frame::Net {
                    stream,
                    op,
                    data: payload[5..].to_vec(),
                }
            }
            other => return Err(ProtocolError::UnknownKind(other)),
        };
        Ok(Some(frame))
    }

    /// Bytes received that do not yet form a frame.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

/// `u16 name length, name, bytes`.
fn named(payload: &[u8]) -> Result<(String, Vec<u8>), ProtocolError> {
    if payload.len() < 2 {
        return Err(ProtocolError::BadReport("short named frame".into()));
    }
    let n = u16::from_be_bytes([payload[0], payload[1]]) as usize;
    if payload.len() < 2 + n {
        return Err(ProtocolError::BadReport("name overruns the frame".into()));
    }
    Ok((
        String::from_utf8_lossy(&payload[2..2 + n]).into_owned(),
        payload[2 + n..].to_vec(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Limits;

    fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![kind];
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn frames_split_across_chunks_reassemble() {
        let mut bytes = frame(b'R', b"");
        bytes.extend(frame(b'S', b""));
        bytes.extend(frame(b'O', b"hello\n"));
        bytes.extend(frame(b'E', b"\xffoops"));
        bytes.extend(frame(
            b'X',
            br#"{"exit_code":3,"signal":null,"cpu_ms":7,"peak_memory_bytes":100,"oom_kills":0,"stdout_bytes":6,"stderr_bytes":5}"#,
        ));
        let mut d = FrameDecoder::default();
        let mut got = vec![];
        for chunk in bytes.chunks(3) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(d.pending(), 0);
        assert_eq!(got.len(), 5);
        assert_eq!(got[0], Frame::Ready);
        assert_eq!(got[1], Frame::Started);
        assert_eq!(got[2], Frame::Stdout(b"hello\n".to_vec()));
        assert_eq!(got[3], Frame::Stderr(b"\xffoops".to_vec()));
        match &got[4] {
            Frame::Exit(r) => {
                assert_eq!(r.exit_code, Some(3));
                assert_eq!(r.cpu_ms, Some(7));
            }
            f => panic!("unexpected {f:?}"),
        }
    }

    #[test]
    fn bad_frames_are_errors() {
        let mut d = FrameDecoder::default();
        d.push(&frame(b'Z', b""));
        assert_eq!(d.next_frame(), Err(ProtocolError::UnknownKind(b'Z')));
        let mut d = FrameDecoder::default();
        d.push(&[b'O', 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(ProtocolError::TooLarge(_))));
        let mut d = FrameDecoder::default();
        d.push(&frame(b'A', b"\x00\x05a.png\x89PNG"));
        assert_eq!(
            d.next_frame().unwrap(),
            Some(Frame::Artifact {
                name: "a.png".into(),
                data: b"\x89PNG".to_vec()
            })
        );
        d.push(&frame(b'A', b"\x00\x09a.png"));
        assert!(d.next_frame().is_err());
        let mut d = FrameDecoder::default();
        d.push(&frame(b'F', br#"{"error":"disk full"}"#));
        assert_eq!(
            d.next_frame().unwrap(),
            Some(Frame::Failed("disk full".into()))
        );
    }

    #[test]
    fn tool_requests_and_their_answers() {
        let mut d = FrameDecoder::default();
        d.push(&frame(b'T', br#"{"id":3,"op":"call"}"#));
        assert_eq!(
            d.next_frame().unwrap(),
            Some(Frame::Tool(br#"{"id":3,"op":"call"}"#.to_vec()))
        );
        let bytes = tool_unavailable(br#"{"id":3,"op":"call"}"#);
        let (msg, rest) = split_message(&bytes);
        assert!(rest.is_empty());
        assert_eq!(msg["kind"], "tool");
        assert_eq!(msg["id"], 3);
        assert_eq!(msg["error"]["type"], "ToolError");
        let bytes = tool_unavailable(br#"{"id":"x","op":"catalog"}"#);
        let (msg, _) = split_message(&bytes);
        assert_eq!(
            msg,
            serde_json::json!({"kind": "tool", "id": "x", "servers": []})
        );
        let bytes = tool_unavailable(b"garbage");
        let (msg, _) = split_message(&bytes);
        assert_eq!(msg["id"], serde_json::Value::Null);
    }

    #[test]
    fn job_encoding_has_header_then_tar() {
        let job = JobSpec::python("print(1)", Limits::default());
        let bytes = encode_job(&job, "/usr/bin/python3").unwrap();
        let hlen = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        let header: JobHeader = serde_json::from_slice(&bytes[4..4 + hlen]).unwrap();
        assert_eq!(header.python, "/usr/bin/python3");
        assert_eq!(header.entry, "main.py");
        assert_eq!(header.tar_len as usize, bytes.len() - 4 - hlen);
        assert_eq!(header.output_limit, 1 << 20);
        assert_eq!(header.deadline_s, Some(35.0));
        let mut bad = job.clone();
        bad.entry = "../x.py".into();
        assert!(encode_job(&bad, "python3").is_err());
    }

    /// Splits a session message into its JSON and what follows it.
    fn split_message(bytes: &[u8]) -> (serde_json::Value, &[u8]) {
        let n = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        (
            serde_json::from_slice(&bytes[4..4 + n]).unwrap(),
            &bytes[4 + n..],
        )
    }

    #[test]
    fn a_cell_is_one_message() {
        let bytes = encode_cell("x = 1", 99, &[]);
        let (msg, rest) = split_message(&bytes);
        assert_eq!(
            msg,
            serde_json::json!({"kind": "cell", "code": "x = 1", "output_limit": 99, "return_limit": RETURN_BYTES})
        );
        assert!(rest.is_empty());
        let bytes = encode_cell("x = 1", 99, &["pandas".to_string()]);
        assert_eq!(
            split_message(&bytes).0["warm"],
            serde_json::json!(["pandas"])
        );
    }

    #[test]
    fn put_files_is_a_message_then_a_tar() {
        let files = [
            InputFile {
                path: "data/a.csv".into(),
                contents: b"1,2\n".to_vec(),
            },
            InputFile {
                path: "b.txt".into(),
                contents: vec![],
            },
        ];
        let bytes = encode_put_files(&files).unwrap();
        let (msg, tar) = split_message(&bytes);
        assert_eq!(msg["kind"], "files");
        assert_eq!(msg["tar_len"].as_u64(), Some(tar.len() as u64));
        let mut ar = tar::Archive::new(tar);
        let got: Vec<(String, Vec<u8>)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                assert_eq!(e.header().entry_type(), tar::EntryType::Regular);
                let mut data = vec![];
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                (e.path().unwrap().to_string_lossy().into_owned(), data)
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("data/a.csv".to_string(), b"1,2\n".to_vec()),
                ("b.txt".to_string(), vec![]),
            ]
        );
        let escape = [InputFile {
            path: "../etc/x".into(),
            contents: vec![],
        }];
        assert!(encode_put_files(&escape).is_err());
    }
}
