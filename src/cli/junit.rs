//! JUnit XML for `run --junit`: one test case per file, so CI systems show which script
//! failed and how.

use crate::job::Outcome;

/// One file's result: its outcome, the infrastructure error that kept it from running, or
/// why it was not run.
pub struct CaseResult<'a> {
    pub name: &'a str,
    pub result: Case<'a>,
}

/// What became of one file.
pub enum Case<'a> {
    Ran(&'a Outcome),
    Error(String),
    /// Not run; the reason (e.g. `--fail-fast` after another file failed).
    Skipped(&'a str),
}

/// Render a `<testsuites>` document. Times are each file's wall time; the suite's `time`
/// is `wall_ms` when given (files ran in parallel), else their sum.
pub fn render(cases: &[CaseResult<'_>], wall_ms: Option<u64>) -> String {
    let failures = cases
        .iter()
        .filter(|c| matches!(c.result, Case::Ran(o) if !o.success()))
        .count();
    let errors = cases
        .iter()
        .filter(|c| matches!(c.result, Case::Error(_)))
        .count();
    let skipped = cases
        .iter()
        .filter(|c| matches!(c.result, Case::Skipped(_)))
        .count();
    let total_ms: u64 = wall_ms.unwrap_or_else(|| {
        cases
            .iter()
            .filter_map(|c| match c.result {
                Case::Ran(o) => Some(o.duration_ms),
                _ => None,
            })
            .sum()
    });
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    s.push_str(&format!(
        "<testsuites tests=\"{n}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{t:.3}\">\n\
         <testsuite name=\"mcp-code-executor\" tests=\"{n}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\" time=\"{t:.3}\">\n",
        n = cases.len(),
        t = total_ms as f64 / 1000.0
    ));
    for c in cases {
        let ms = match c.result {
            Case::Ran(o) => o.duration_ms,
            _ => 0,
        };
        let time = ms as f64 / 1000.0;
        s.push_str(&format!(
            "  <testcase classname=\"run\" name=\"{}\" time=\"{time:.3}\">\n",
            escape(c.name)
        ));
        match &c.result {
            Case::Skipped(why) => {
                s.push_str(&format!("    <skipped message=\"{}\"/>\n", escape(why)))
            }
            Case::Ran(o) => {
                if !o.success() {
                    let kind = if o.timed_out {
                        "timeout"
                    } else if o.oom_killed {
                        "oom"
                    } else {
                        "exit"
                    };
                    s.push_str(&format!(
                        "    <failure type=\"{kind}\" message=\"{}\"/>\n",
                        escape(&o.status_line())
                    ));
                }
                s.push_str(&format!(
                    "    <system-out>{}</system-out>\n    <system-err>{}</system-err>\n",
                    escape(&o.stdout_text()),
                    escape(&o.stderr_text())
                ));
            }
            Case::Error(e) => s.push_str(&format!(
                "    <error type=\"infrastructure\" message=\"{}\"/>\n",
                escape(e)
            )),
        }
        s.push_str("  </testcase>\n");
    }
    s.push_str("</testsuite>\n</testsuites>\n");
    s
}

/// Escape for XML text and attributes, dropping characters XML 1.0 cannot hold.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_and_errors_are_counted_and_escaped() {
        let ok = Outcome {
            exit_code: Some(0),
            stdout: b"<ok> & \x01fine".to_vec(),
            ..Default::default()
        };
        let bad = Outcome {
            timed_out: true,
            ..Default::default()
        };
        let xml = render(
            &[
                CaseResult {
                    name: "a.py",
                    result: Case::Ran(&ok),
                },
                CaseResult {
                    name: "b\"py",
                    result: Case::Ran(&bad),
                },
                CaseResult {
                    name: "c.py",
                    result: Case::Error("daemon down".into()),
                },
                CaseResult {
                    name: "d.py",
                    result: Case::Skipped("not run: --fail-fast"),
                },
            ],
            None,
        );
        assert!(xml.contains("tests=\"4\" failures=\"1\" errors=\"1\" skipped=\"1\""));
        assert!(xml.contains(
            "name=\"d.py\" time=\"0.000\">\n    <skipped message=\"not run: --fail-fast\"/>"
        ));
        assert!(xml.contains("&lt;ok&gt; &amp; fine"));
        assert!(xml.contains("name=\"b&quot;py\""));
        assert!(xml.contains("<failure type=\"timeout\""));
        assert!(xml.contains("<error type=\"infrastructure\" message=\"daemon down\""));
    }
}
