//! A request of the sandboxed code, read without building its arguments.
//!
//! The frame is untrusted and up to the runner's frame limit. Its envelope (`id`, `op`,
//! `server`, `tool`) is borrowed from the frame's bytes; the arguments stay raw JSON until
//! the call is admitted. [`footprint`] tells, by a scan that allocates nothing, how much
//! memory the arguments will take once parsed into `serde_json::Value`s: compact JSON
//! grows 10 to 50 times when parsed (a list of zeros, a list of one-element lists), so a
//! run's pending calls are weighed by that, not by their raw size. [`Shown`] is how a name
//! the code sent goes into the log: escaped and capped.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// A request frame's envelope, borrowed from its bytes.
#[derive(Deserialize, Default)]
pub(super) struct Envelope<'a> {
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub op: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub server: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub tool: Option<Cow<'a, str>>,
    /// Raw; absent or `null`: no arguments.
    #[serde(default, borrow)]
    pub arguments: Option<&'a RawValue>,
}

/// The longest request id echoed back (the runner's ids are small integers).
const ID_BYTES: usize = 64;

impl<'a> Envelope<'a> {
    /// The envelope of `frame`, or an empty one when it is not a JSON object.
    pub fn parse(frame: &'a [u8]) -> Envelope<'a> {
        serde_json::from_slice(frame).unwrap_or_default()
    }

    /// The request id, echoed in the answer: `null` when absent or over [`ID_BYTES`].
    pub fn id(&self) -> Value {
        self.id
            .filter(|r| r.get().len() <= ID_BYTES)
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or(Value::Null)
    }
}

/// Bytes of one `Value` (a slot in its parent's vector or map node).
const SLOT: u64 = std::mem::size_of::<Value>() as u64;
/// Bytes of one `BTreeMap` node of `String` keys and `Value`s (11 of each, and links),
/// rounded up; a map of one entry takes a whole node.
const MAP_NODE: u64 = 11 * (SLOT + 24) + 32;

/// Bytes the parsed form of `raw` holds on the heap beyond its own slot, estimated from
/// above (a vector's spare capacity and map nodes counted as full), or `None` when it is
/// not valid JSON.
pub(super) fn footprint(raw: &RawValue) -> Option<u64> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    Heap.deserialize(&mut de).ok()
}

/// What [`footprint`] counts: the heap bytes of one value, its children's included.
struct Heap;

impl<'de> DeserializeSeed<'de> for Heap {
    type Value = u64;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

/// A vector of `n` values grows by doubling from 4.
fn vec_bytes(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        SLOT * n.max(4).next_power_of_two()
    }
}

impl<'de> Visitor<'de> for Heap {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_i64<E>(self, _: i64) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_u64<E>(self, _: u64) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_f64<E>(self, _: f64) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_unit<E>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_none<E>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_str<E>(self, v: &str) -> Result<u64, E> {
        Ok(v.len() as u64)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
        let (mut n, mut children) = (0u64, 0u64);
        while let Some(c) = seq.next_element_seed(Heap)? {
            n += 1;
            children += c;
        }
        Ok(vec_bytes(n) + children)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<u64, A::Error> {
        let (mut n, mut children) = (0u64, 0u64);
        while let Some(k) = map.next_key_seed(Heap)? {
            n += 1;
            children += k + map.next_value_seed(Heap)?;
        }
        // Nodes are at least half full, except a lone root.
        let nodes = if n == 0 { 0 } else { n.div_ceil(5) };
        Ok(nodes * MAP_NODE + children)
    }
}

/// A name the sandbox sent, as the log shows it: escaped (no line of its own, no control
/// characters) and cut at [`SHOWN_CHARS`].
pub(super) struct Shown<'a>(pub &'a str);

/// The characters of a code-sent name a log line shows, at most.
const SHOWN_CHARS: usize = 64;

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(SHOWN_CHARS) {
            write!(f, "{}", c.escape_debug())?;
        }
        if chars.next().is_some() {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    /// Counts the bytes this thread has allocated and not freed, to compare
    /// [`footprint`] with what parsing really takes.
    struct Counting;

    thread_local! {
        static LIVE: Cell<i64> = const { Cell::new(0) };
    }

    // SAFETY: forwards to the system allocator; the counter is a const-initialised
    // thread-local Cell (no allocation, no re-entrance).
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let _ = LIVE.try_with(|c| c.set(c.get() + l.size() as i64));
            System.alloc(l)
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            let _ = LIVE.try_with(|c| c.set(c.get() - l.size() as i64));
            System.dealloc(p, l)
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            let _ = LIVE.try_with(|c| c.set(c.get() + new as i64 - l.size() as i64));
            System.realloc(p, l, new)
        }
    }

    #[global_allocator]
    static ALLOC: Counting = Counting;

    fn live() -> i64 {
        LIVE.with(|c| c.get())
    }

    /// What parsing `json` into a map of values really holds, and what [`footprint`] says.
    fn measured(json: &str) -> (i64, u64) {
        let raw: Box<RawValue> = serde_json::from_str(json).unwrap();
        let estimate = footprint(&raw).unwrap();
        let before = live();
        let parsed: serde_json::Map<String, Value> = serde_json::from_str(json).unwrap();
        let held = live() - before;
        drop(parsed);
        (held, estimate)
    }

    #[test]
    fn the_footprint_bounds_what_parsing_holds_and_stays_near_it() {
        let zeros = format!("{{\"x\": [{}]}}", vec!["0"; 340_000].join(","));
        let singles = format!("{{\"x\": [{}]}}", vec!["[0]"; 200_000].join(","));
        let objects = format!("{{\"x\": [{}]}}", vec!["{\"a\":1}"; 50_000].join(","));
        let big_map = format!(
            "{{{}}}",
            (0..20_000)
                .map(|i| format!("\"k{i}\":{i}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let text = format!("{{\"s\": \"{}\"}}", "a".repeat(1 << 20));
        for json in [&zeros, &singles, &objects, &big_map, &text] {
            let (held, estimate) = measured(json);
            assert!(
                estimate as i64 >= held,
                "{} raw bytes: parsed {held}, estimated {estimate}",
                json.len()
            );
            assert!(
                (estimate as i64) < held * 3 + 4096,
                "{} raw bytes: parsed {held}, estimated {estimate}: too far above",
                json.len()
            );
        }
        // The review's shapes: a 1 MB list of zeros holds ~16 MB parsed, a list of
        // one-element lists ~32x its raw size.
        let (held, _) = measured(&singles);
        assert!(held > 20 * singles.len() as i64, "{held}");
    }

    #[test]
    fn envelopes_borrow_and_ids_are_bounded() {
        let f =
            br#"{"id": 7, "op": "call", "server": "s", "tool": "t\n", "arguments": {"a": [1]}}"#;
        let e = Envelope::parse(f);
        assert_eq!(e.id(), serde_json::json!(7));
        assert_eq!(e.op.as_deref(), Some("call"));
        assert_eq!(e.tool.as_deref(), Some("t\n"));
        assert_eq!(e.arguments.unwrap().get(), r#"{"a": [1]}"#);
        let long = format!(r#"{{"id": "{}", "op": "call"}}"#, "x".repeat(100));
        assert_eq!(Envelope::parse(long.as_bytes()).id(), Value::Null);
        assert_eq!(Envelope::parse(b"\xff garbage").op, None);
    }

    #[test]
    fn shown_names_are_one_escaped_capped_line() {
        let forged = "x\n2026-11-28T00:00:00Z INFO oauth: FORGED admin sign-in";
        let s = Shown(forged).to_string();
        assert!(!s.contains('\n'), "{s}");
        assert!(s.starts_with("x\\n2026"), "{s}");
        let huge = "a".repeat(1 << 20);
        let s = Shown(&huge).to_string();
        assert!(s.len() < 100, "{}", s.len());
        assert!(s.ends_with("(1048576 bytes)"), "{s}");
        assert_eq!(Shown("get-sum").to_string(), "get-sum");
    }
}
