//! JUnit XML for `run --junit`: one test case per file, so CI systems show which script
//! failed and how.

use crate::job::Outcome;

/// One file's result, or the infrastructure error that kept it from running.
pub struct CaseResult<'a> {
    pub name: &'a str,
    pub result: Result<&'a Outcome, String>,
}

/// Render a `<testsuites>` document.
pub fn render(cases: &[CaseResult<'_>]) -> String {
    let failures = cases
        .iter()
        .filter(|c| matches!(c.result, Ok(o) if !o.success()))
        .count();
    let errors = cases.iter().filter(|c| c.result.is_err()).count();
    let total_ms: u64 = cases
        .iter()
        .filter_map(|c| c.result.as_ref().ok().map(|o| o.duration_ms))
        .sum();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    s.push_str(&format!(
        "<testsuites tests=\"{n}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{t:.3}\">\n\
         <testsuite name=\"mcp-code-executor\" tests=\"{n}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{t:.3}\">\n",
        n = cases.len(),
        t = total_ms as f64 / 1000.0
    ));
    for c in cases {
        let time = c.result.as_ref().map(|o| o.duration_ms).unwrap_or(0) as f64 / 1000.0;
        s.push_str(&format!(
            "  <testcase classname=\"run\" name=\"{}\" time=\"{time:.3}\">\n",
            escape(c.name)
        ));
        match &c.result {
            Ok(o) => {
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
            Err(e) => s.push_str(&format!(
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
        let xml = render(&[
            CaseResult {
                name: "a.py",
                result: Ok(&ok),
            },
            CaseResult {
                name: "b\"py",
                result: Ok(&bad),
            },
            CaseResult {
                name: "c.py",
                result: Err("daemon down".into()),
            },
        ]);
        assert!(xml.contains("tests=\"3\" failures=\"1\" errors=\"1\""));
        assert!(xml.contains("&lt;ok&gt; &amp; fine"));
        assert!(xml.contains("name=\"b&quot;py\""));
        assert!(xml.contains("<failure type=\"timeout\""));
        assert!(xml.contains("<error type=\"infrastructure\" message=\"daemon down\""));
    }
}
