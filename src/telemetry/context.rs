//! W3C trace context: the ids of a span and the `traceparent` header that carries them
//! (`00-{trace id, 32 hex}-{span id, 16 hex}-{flags, 2 hex}`).

/// Where a span sits: its trace and its own id, and whether the trace is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl TraceContext {
    /// A context read from a `traceparent` value; `None` for anything malformed or for the
    /// all-zero ids the specification calls invalid. Versions other than `00` are read as
    /// far as version 00 goes, as the specification asks.
    pub fn parse(value: &str) -> Option<TraceContext> {
        let v = value.trim();
        let mut parts = v.split('-');
        let version = parts.next()?;
        let (trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        let [_]: [u8; 1] = hex_bytes(version)?;
        let trace_id: [u8; 16] = hex_bytes(trace)?;
        let span_id: [u8; 8] = hex_bytes(span)?;
        let [flags]: [u8; 1] = hex_bytes(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The `traceparent` value of this context.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.span_id),
            u8::from(self.sampled)
        )
    }

    /// A new trace (the root of one): random ids, sampled.
    pub fn new_root() -> TraceContext {
        TraceContext {
            trace_id: random(),
            span_id: random(),
            sampled: true,
        }
    }

    /// A child of this context: the same trace, a new span id.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            span_id: random(),
            ..*self
        }
    }
}

/// Lower-case hex, as OTLP/JSON and `traceparent` write ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from exactly `2N` lower- or upper-case hex digits.
fn hex_bytes<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Random non-zero ids (v4 UUIDs' randomness: the crate is in the tree already).
fn random<const N: usize>() -> [u8; N] {
    loop {
        let bytes = *uuid::Uuid::new_v4().as_bytes();
        let mut out = [0u8; N];
        out.copy_from_slice(&bytes[..N]);
        if out != [0u8; N] {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_malformed_ones_are_refused() {
        let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = TraceContext::parse(v).unwrap();
        assert!(c.sampled);
        assert_eq!(c.traceparent(), v);
        assert_eq!(hex(&c.span_id), "00f067aa0ba902b7");
        let unsampled = TraceContext::parse(&v.replace("-01", "-00")).unwrap();
        assert!(!unsampled.sampled);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad}");
        }
        // A later version with more fields is read as version 00.
        assert!(TraceContext::parse(&format!("01{}-extra", &v[2..])).is_some());
        let child = c.child();
        assert_eq!(child.trace_id, c.trace_id);
        assert_ne!(child.span_id, c.span_id);
    }
}
