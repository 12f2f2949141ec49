//! `run --format github`: GitHub Actions workflow commands. A failed file becomes an
//! `::error file=...,line=...::` annotation at the line of its uncaught exception (the
//! deepest traceback frame in the file itself), so the failure shows on the diff; each
//! file's output sits in a collapsible `::group::`, between `::stop-commands::` markers so
//! that what the untrusted code prints is never taken for a workflow command.

use crate::job::Outcome;

/// Where a failure points and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The line in the user's file, when a traceback names one.
    pub line: Option<u32>,
    /// The exception (`ValueError: bad value`), or how the run ended.
    pub message: String,
}

/// What an unsuccessful outcome points at: the last traceback's deepest frame in the file
/// that ran as `entry` in the sandbox, and its exception line; without a traceback (an
/// exit status, a timeout, an OOM kill) no line and the status.
pub fn failure(o: &Outcome, entry: &str) -> Failure {
    let stderr = o.stderr_text();
    let from_traceback = if o.timed_out || o.oom_killed {
        None
    } else {
        traceback(&stderr, entry)
    };
    match from_traceback {
        Some((line, exception)) => Failure {
            line,
            message: exception.unwrap_or_else(|| o.status_line()),
        },
        None => Failure {
            line: None,
            message: o.status_line(),
        },
    }
}

/// Parse the last `Traceback (most recent call last):` block of `stderr`, or, when there
/// is none, the error `python FILE` prints for a file that does not compile (its `File`
/// line, the source and the caret, then `SyntaxError: ...`, with no header): the line of
/// its last frame in `/workspace/{entry}` and the exception line that ends it. `None` when
/// there is neither.
fn traceback(stderr: &str, entry: &str) -> Option<(Option<u32>, Option<String>)> {
    let lines: Vec<&str> = stderr.lines().collect();
    let start = match lines
        .iter()
        .rposition(|l| l.trim_end() == "Traceback (most recent call last):")
    {
        Some(header) => header + 1,
        None => lines.iter().position(|l| l.starts_with("  File \""))?,
    };
    let ours = [format!("/workspace/{entry}"), entry.to_string()];
    let mut line = None;
    let mut exception = None;
    for l in &lines[start..] {
        if let Some(rest) = l.trim_start().strip_prefix("File \"") {
            if let Some((path, after)) = rest.split_once('"') {
                if ours.iter().any(|o| o == path) {
                    line = after
                        .strip_prefix(", line ")
                        .and_then(|n| n.split(',').next())
                        .and_then(|n| n.trim().parse().ok())
                        .or(line);
                }
            }
        } else if !l.is_empty() && !l.starts_with(char::is_whitespace) {
            exception = Some(l.trim_end().to_string());
            break;
        }
    }
    Some((line, exception))
}

/// `::error file=NAME,line=N,title=TITLE::MESSAGE` for a failed file (no `file` for stdin).
pub fn error_command(name: &str, title: &str, failure: &Failure) -> String {
    let mut props = Vec::new();
    if name != "-" {
        props.push(format!(
            "file={}",
            property(name.strip_prefix("./").unwrap_or(name))
        ));
        if let Some(line) = failure.line {
            props.push(format!("line={line}"));
        }
    }
    props.push(format!("title={}", property(title)));
    format!("::error {}::{}", props.join(","), data(&failure.message))
}

/// Escape a command's message (GitHub's `escapeData`).
pub fn data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// Escape a command's property value (GitHub's `escapeProperty`).
pub fn property(s: &str) -> String {
    data(s).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(stderr: &str) -> Outcome {
        Outcome {
            exit_code: Some(1),
            stderr: stderr.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn the_deepest_frame_in_the_users_file_and_the_exception() {
        let tb = "Traceback (most recent call last):\n  File \"/workspace/tb_1.py\", line 6, in <module>\n    f(\"{bad\")\n  File \"/workspace/tb_1.py\", line 4, in f\n    return json.loads(x)\n           ^^^^^^^^^^^^^\n  File \"/usr/lib/python3.11/json/__init__.py\", line 346, in loads\n    return _default_decoder.decode(s)\njson.decoder.JSONDecodeError: Expecting property name: line 1 column 2 (char 1)\n";
        let f = failure(&failed(tb), "tb_1.py");
        assert_eq!(f.line, Some(4));
        assert_eq!(
            f.message,
            "json.decoder.JSONDecodeError: Expecting property name: line 1 column 2 (char 1)"
        );
        assert_eq!(
            error_command("./tests/tb_1.py", "exit code 1", &f),
            "::error file=tests/tb_1.py,line=4,title=exit code 1::json.decoder.JSONDecodeError: Expecting property name: line 1 column 2 (char 1)"
        );
    }

    #[test]
    fn a_syntax_error_points_at_its_line() {
        let tb = "Traceback (most recent call last):\n  File \"<string>\", line 54, in <module>\n  File \"<string>\", line 33, in _mcp_run\n  File \"/workspace/syn.py\", line 7\n    x = (\n        ^\nSyntaxError: '(' was never closed\n";
        let f = failure(&failed(tb), "syn.py");
        assert_eq!(f.line, Some(7));
        assert_eq!(f.message, "SyntaxError: '(' was never closed");
        // As `python FILE` shows it, which the runner now does too: no header.
        let bare = "  File \"/workspace/syn.py\", line 2\n    y = (\n        ^\nSyntaxError: '(' was never closed\n";
        let f = failure(&failed(bare), "syn.py");
        assert_eq!(f.line, Some(2));
        assert_eq!(f.message, "SyntaxError: '(' was never closed");
    }

    #[test]
    fn the_last_of_chained_tracebacks_and_other_files_frames() {
        let tb = "Traceback (most recent call last):\n  File \"/workspace/a.py\", line 2, in <module>\nKeyError: 1\n\nDuring handling of the above exception, another exception occurred:\n\nTraceback (most recent call last):\n  File \"/workspace/a.py\", line 4, in <module>\n  File \"/workspace/other.py\", line 9, in g\nValueError: second\n";
        let f = failure(&failed(tb), "a.py");
        assert_eq!(
            (f.line, f.message.as_str()),
            (Some(4), "ValueError: second")
        );
    }

    #[test]
    fn no_traceback_no_line() {
        let o = Outcome {
            timed_out: true,
            signal: Some(9),
            duration_ms: 2000,
            ..Default::default()
        };
        let f = failure(&o, "spin.py");
        assert_eq!(f.line, None);
        assert!(f.message.starts_with("timed out"));
        let cmd = error_command("spin.py", "timed out", &f);
        assert!(cmd.starts_with("::error file=spin.py,title=timed out::timed out"));
        let f = failure(&failed("some noise\n"), "x.py");
        assert_eq!(f.line, None);
        assert_eq!(
            error_command("-", "t", &f),
            "::error title=t::exit code 1, 0 ms"
        );
    }

    #[test]
    fn escaping() {
        assert_eq!(data("50%\r\nnext"), "50%25%0D%0Anext");
        assert_eq!(property("a:b,c"), "a%3Ab%2Cc");
    }
}
