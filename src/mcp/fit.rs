//! What fits in one message: the byte budget of a tool result and the cutting of text to it
//! (JSON-escaped lengths, head and tail, quotes, capped error messages). A leaf of the MCP
//! layer: the reports ([`super::report`]) and the resources ([`super::resources`]) both
//! cut with it.

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

/// Bytes `s` takes as a JSON string (quotes and escapes included).
pub fn escaped_len(s: &str) -> usize {
    serde_json::to_string(s)
        .map(|j| j.len())
        .unwrap_or(s.len() * 6)
}

/// The longest prefix of `s` whose JSON-escaped length is at most `max`, on a char boundary.
pub fn prefix_within(s: &str, max: usize) -> &str {
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
}
