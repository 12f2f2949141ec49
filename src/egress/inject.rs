//! The headers a rule adds to the requests for its host (#41 item 3): `headers = {
//! Authorization = { env = "VAR" } }` or `{ file = "/path" }` in a rule. The value is read
//! by the server once, when the policy is loaded, and never enters the sandbox; no log,
//! error or `Debug` output shows it (a [`Secret`] prints as `<secret>`). A rule with
//! headers is served only by interception (the proxy terminates TLS for its host), never
//! by a `CONNECT` tunnel, where the proxy could not add them, nor by plain HTTP, where they
//! would cross the network in clear.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;

/// A header value read from the server's environment or a file. Its `Debug` hides it and
/// it has no `Display`: the only way to the bytes is [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that writes it into an upstream request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// One header a rule adds: its name (lower case, as HTTP/1.1 compares them) and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Secret,
}

/// Where a header's value comes from, as the file says it (exactly one key).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    #[serde(default)]
    env: Option<String>,
    #[serde(default)]
    file: Option<String>,
}

/// Headers the proxy sets itself or that frame the message: a rule may not add them.
const RESERVED: [&str; 9] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
];

/// Read and check a rule's headers; `rule` names it in errors (which never hold a value).
pub fn load(rule: &str, headers: BTreeMap<String, Source>) -> Result<Vec<Header>, String> {
    headers
        .into_iter()
        .map(|(name, src)| {
            let lower = name.to_ascii_lowercase();
            if lower.is_empty() || !lower.bytes().all(is_token) {
                return Err(format!("host `{rule}`: `{name}` is not a header name"));
            }
            if RESERVED.contains(&lower.as_str()) {
                return Err(format!(
                    "host `{rule}`: the header `{name}` is the proxy's own and cannot be added"
                ));
            }
            let value = read(rule, &name, src)?;
            Ok(Header {
                name: lower,
                value: Secret(value),
            })
        })
        .collect()
}

fn read(rule: &str, name: &str, src: Source) -> Result<String, String> {
    let raw = match (src.env, src.file) {
        (Some(var), None) => crate::config::operator_variable(&var).ok_or_else(|| {
            format!("host `{rule}`: header `{name}`: the environment variable `{var}` is not set (or not UTF-8)")
        })?,
        (None, Some(path)) => std::fs::read_to_string(&path).map_err(|e| {
            format!("host `{rule}`: header `{name}`: the file `{path}`: {}", e.kind())
        })?,
        _ => {
            return Err(format!(
                "host `{rule}`: header `{name}` needs exactly one of `env` or `file`"
            ))
        }
    };
    // A file written by `echo` ends in a newline that is not part of the value.
    let value = raw.trim_end_matches(['\r', '\n']);
    if value.is_empty() {
        return Err(format!(
            "host `{rule}`: header `{name}`: the value is empty"
        ));
    }
    if !value
        .bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return Err(format!(
            "host `{rule}`: header `{name}`: the value holds a control or non-ASCII character"
        ));
    }
    Ok(value.to_string())
}

/// RFC 9110 token characters.
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(env: Option<&str>, file: Option<&str>) -> Source {
        Source {
            env: env.map(str::to_string),
            file: file.map(str::to_string),
        }
    }

    #[test]
    fn reads_env_and_file_and_never_shows_the_value() {
        let var = "EGRESS_INJECT_TEST_TOKEN_A";
        std::env::set_var(var, "Bearer env-marker-1");
        let dir = std::env::temp_dir().join(format!("egress-inject-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "file-marker-2\n").unwrap();
        let got = load(
            "api.test",
            BTreeMap::from([
                ("Authorization".to_string(), src(Some(var), None)),
                (
                    "X-Api-Key".to_string(),
                    src(None, Some(path.to_str().unwrap())),
                ),
            ]),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        std::env::remove_var(var);
        let got = got.unwrap();
        assert_eq!(got[0].name, "authorization");
        assert_eq!(got[0].value.expose(), "Bearer env-marker-1");
        assert_eq!(got[1].name, "x-api-key");
        assert_eq!(got[1].value.expose(), "file-marker-2");
        let shown = format!("{got:?}");
        assert!(!shown.contains("marker"), "{shown}");
        assert!(shown.contains("<secret>"), "{shown}");
    }

    #[test]
    fn refuses_bad_names_sources_and_values_without_showing_them() {
        let var = "EGRESS_INJECT_TEST_TOKEN_B";
        let one = |name: &str, s: Source| load("api.test", BTreeMap::from([(name.into(), s)]));
        let err = |r: Result<Vec<Header>, String>| r.unwrap_err();
        assert!(err(one("Bad Name", src(Some(var), None))).contains("not a header name"));
        assert!(err(one("Host", src(Some(var), None))).contains("proxy's own"));
        assert!(err(one("A", src(None, None))).contains("exactly one"));
        assert!(err(one("A", src(Some(var), Some("/x")))).contains("exactly one"));
        assert!(err(one("A", src(Some("EGRESS_INJECT_UNSET_VAR"), None))).contains("not set"));
        assert!(err(one("A", src(None, Some("/nonexistent/egress/token")))).contains("not found"));
        std::env::set_var(var, "secret-marker-3\r\nX-Evil: 1");
        let e = err(one("A", src(Some(var), None)));
        std::env::set_var(var, "\n");
        let empty = err(one("A", src(Some(var), None)));
        std::env::remove_var(var);
        assert!(e.contains("control") && !e.contains("marker"), "{e}");
        assert!(empty.contains("empty"), "{empty}");
    }
}
