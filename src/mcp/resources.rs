//! Workspace files as MCP resources: the `resource_link` blocks a run's result carries (the
//! whole of an output too long for the result, figures, files the code wrote) and what
//! `resources/list` and `resources/read` answer.
//!
//! A URI names a session and a file of its workspace:
//! `workspace://sessions/<session_id>/<name>`, optionally with `?offset=A&length=B` for one
//! page of a file too large for one message. The session is looked up among the caller's
//! tenant's sessions only: another tenant's (or an expired) session is "resource not found",
//! exactly like a file that does not exist.

use base64::Engine as _;
use rmcp::model::{ContentBlock, ErrorData, Resource, ResourceContents};

use super::fit::budget;

/// The scheme and authority of every URI this server serves.
pub const PREFIX: &str = "workspace://sessions/";

/// The most one `resources/read` answer carries (JSON-escaped text, or base64), so that
/// the whole message stays under [`budget::MESSAGE`].
pub const PAGE: usize = budget::MESSAGE - budget::OVERHEAD;

/// The URI of workspace file `name` of session `handle` (bytes `range` of it, if given).
pub fn uri(handle: &str, name: &str, range: Option<(usize, usize)>) -> String {
    let mut u = format!("{PREFIX}{handle}/{}", encode(name));
    if let Some((offset, length)) = range {
        u.push_str(&format!("?offset={offset}&length={length}"));
    }
    u
}

/// A workspace URI taken apart: session handle, file name, byte range.
#[derive(Debug, PartialEq)]
pub struct Parsed {
    pub handle: String,
    pub name: String,
    pub range: Option<(usize, usize)>,
}

/// Parse a URI made by [`uri`]; `None` for anything else.
pub fn parse(uri: &str) -> Option<Parsed> {
    let rest = uri.strip_prefix(PREFIX)?;
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let (handle, name) = path.split_once('/')?;
    let name = decode(name)?;
    if handle.is_empty() || name.is_empty() || name.contains('/') {
        return None;
    }
    let range = match query {
        None => None,
        Some(q) => {
            let (mut offset, mut length) = (None, None);
            for kv in q.split('&') {
                match kv.split_once('=')? {
                    ("offset", v) => offset = Some(v.parse().ok()?),
                    ("length", v) => length = Some(v.parse().ok()?),
                    _ => return None,
                }
            }
            Some((offset?, length?))
        }
    };
    Some(Parsed {
        handle: handle.to_string(),
        name,
        range,
    })
}

fn encode(name: &str) -> String {
    let mut s = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The media type of a workspace file, by its extension.
pub fn mime_of(path: &str) -> &'static str {
    let ext = path.rsplit('.').next().unwrap_or("").to_ascii_lowercase();
    match ext.as_str() {
        "csv" => "text/csv",
        "json" => "application/json",
        "txt" | "log" | "md" | "py" => "text/plain",
        "html" => "text/html",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "svg" => "image/svg+xml",
        "parquet" => "application/vnd.apache.parquet",
        _ => "application/octet-stream",
    }
}

/// Is `data` served as text (UTF-8, not an image)?
fn is_text(name: &str, data: &[u8]) -> bool {
    !mime_of(name).starts_with("image/") && std::str::from_utf8(data).is_ok()
}

/// The byte ranges `data` is served in: one (the whole file) when it fits [`PAGE`], else
/// consecutive pages that each fit (text cut on character boundaries).
pub fn pages(name: &str, data: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let end = page_end(name, data, at);
        out.push((at, end - at));
        if end >= data.len() {
            return out;
        }
        at = end;
    }
}

/// Where the page of `data` starting at `offset` ends.
fn page_end(name: &str, data: &[u8], offset: usize) -> usize {
    if is_text(name, data) {
        let text = std::str::from_utf8(data).unwrap_or_default();
        let mut start = offset.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let chunk = super::fit::prefix_within(&text[start..], PAGE);
        // At least one character, so that paging always moves on.
        let len = chunk
            .len()
            .max(text[start..].chars().next().map_or(0, char::len_utf8));
        start + len
    } else {
        (offset + PAGE / 4 * 3).min(data.len())
    }
}

/// The `resource_link` blocks for workspace file `name` of session `handle`: one for the
/// whole file, or one per page when it is too large for one `resources/read` answer.
pub fn links(handle: &str, name: &str, data: &[u8], description: &str) -> Vec<ContentBlock> {
    let all = pages(name, data);
    let n = all.len();
    all.into_iter()
        .enumerate()
        .map(|(i, (offset, length))| {
            let (u, title) = if n == 1 {
                (uri(handle, name, None), name.to_string())
            } else {
                (
                    uri(handle, name, Some((offset, length))),
                    format!(
                        "{name} (part {} of {n}: bytes {offset}-{})",
                        i + 1,
                        offset + length
                    ),
                )
            };
            ContentBlock::resource_link(
                Resource::new(u, name)
                    .with_title(title)
                    .with_description(description)
                    .with_mime_type(mime_of(name))
                    .with_size(length as u64),
            )
        })
        .collect()
}

/// The URIs of [`links`], for the text block.
pub fn uris(blocks: &[ContentBlock]) -> Vec<String> {
    blocks
        .iter()
        .filter_map(|b| b.as_resource_link().map(|r| r.uri.clone()))
        .collect()
}

/// What `resources/list` gives for one workspace file.
pub fn listed(handle: &str, name: &str, size: u64) -> Resource {
    Resource::new(uri(handle, name, None), name)
        .with_description(format!(
            "workspace file /workspace/{name} of session {handle}"
        ))
        .with_mime_type(mime_of(name))
        .with_size(size)
}

/// The contents `resources/read` answers for `data` (file `name`, asked as `uri`): the
/// range asked for, else the whole file, else (too large for one answer) its first page,
/// whose `_meta` names the URI of the next.
pub fn contents(uri_asked: &str, p: &Parsed, data: &[u8]) -> Result<ResourceContents, ErrorData> {
    let (start, end) = match p.range {
        Some((offset, length)) => {
            if offset > data.len() {
                return Err(ErrorData::invalid_params(
                    format!(
                        "offset {offset} is past the end of {} ({} bytes)",
                        p.name,
                        data.len()
                    ),
                    None,
                ));
            }
            (offset, offset.saturating_add(length).min(data.len()))
        }
        None => (0, data.len()),
    };
    let mut end = end;
    let cap = page_end(&p.name, data, start);
    let cut = end > cap;
    if cut {
        end = cap;
    }
    let text = is_text(&p.name, data);
    let mut start = start;
    if text {
        let t = std::str::from_utf8(data).unwrap_or_default();
        while !t.is_char_boundary(start) {
            start -= 1;
        }
        while !t.is_char_boundary(end) {
            end -= 1;
        }
    }
    let slice = &data[start..end];
    let c = if text {
        ResourceContents::text(String::from_utf8_lossy(slice), uri_asked)
    } else {
        ResourceContents::blob(
            base64::engine::general_purpose::STANDARD.encode(slice),
            uri_asked,
        )
    }
    .with_mime_type(mime_of(&p.name));
    if cut {
        let mut meta = serde_json::Map::new();
        meta.insert(
            "next".into(),
            serde_json::Value::String(uri(&p.handle, &p.name, Some((end, PAGE)))),
        );
        meta.insert("size".into(), serde_json::Value::from(data.len() as u64));
        return Ok(c.with_meta(rmcp::model::MetaObject(meta)));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip() {
        let u = uri("s_ab12", "my file%.csv", None);
        assert_eq!(u, "workspace://sessions/s_ab12/my%20file%25.csv");
        let p = parse(&u).unwrap();
        assert_eq!(
            (p.handle.as_str(), p.name.as_str(), p.range),
            ("s_ab12", "my file%.csv", None)
        );
        let p = parse(&uri("s_x", "a.txt", Some((5, 7)))).unwrap();
        assert_eq!(p.range, Some((5, 7)));
        for bad in [
            "file:///workspace/a.txt",
            "workspace://sessions/s_x",
            "workspace://sessions/s_x/",
            "workspace://sessions/s_x/a%2Fb",
            "workspace://sessions/s_x/a?offset=1",
            "workspace://sessions/s_x/a?x=1&length=2",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn large_files_are_served_in_pages_that_fit_and_join_up() {
        let text = "x\"é\n".repeat(400_000);
        let data = text.as_bytes();
        let ps = pages("out.txt", data);
        assert!(ps.len() > 2, "{ps:?}");
        let mut joined = Vec::new();
        for (o, l) in &ps {
            let u = uri("s_a", "out.txt", Some((*o, *l)));
            let c = contents(&u, &parse(&u).unwrap(), data).unwrap();
            let j = serde_json::to_string(&c).unwrap();
            assert!(j.len() < budget::MESSAGE, "{}", j.len());
            match c {
                ResourceContents::TextResourceContents { text, .. } => {
                    joined.extend_from_slice(text.as_bytes())
                }
                _ => panic!("text expected"),
            }
        }
        assert_eq!(joined, data);
        // Text that escapes to six times its size pages as few pages as it needs.
        let ctl = "\u{1}".repeat(300_000);
        let ps = pages("ctl.txt", ctl.as_bytes());
        assert_eq!(ps.len(), 3, "{ps:?}");
        assert_eq!(ps.iter().map(|p| p.1).sum::<usize>(), ctl.len());
        // The whole-file URI of a large file gives its first page and names the next.
        let u = uri("s_a", "out.txt", None);
        let c = contents(&u, &parse(&u).unwrap(), data).unwrap();
        let j = serde_json::to_value(&c).unwrap();
        assert!(
            j["_meta"]["next"].as_str().unwrap().contains("offset="),
            "{j}"
        );
        // Binary as blob.
        let png = vec![0x89u8, b'P', b'N', b'G', 0xff];
        let u = uri("s_a", "figure-001.png", None);
        let c = contents(&u, &parse(&u).unwrap(), &png).unwrap();
        let j = serde_json::to_value(&c).unwrap();
        assert_eq!(
            j["blob"],
            base64::engine::general_purpose::STANDARD.encode(&png)
        );
        assert_eq!(j["mimeType"], "image/png");
        assert_eq!(links("s_a", "figure-001.png", &png, "a figure").len(), 1);
    }
}
