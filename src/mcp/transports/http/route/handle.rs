//! What a request names: the handle that says which replica owns the state it works on.
//!
//! Where the handle is: the `Mcp-Session-Id` header (a protocol session of the 2025
//! revisions), `sessionId` in the query of a legacy SSE `POST /messages`, or in the JSON-RPC
//! body: `session_id` in a `tools/call`'s arguments, `taskId` of `tasks/*`, the session in a
//! `resources/read` URI, a stored file's `file_path`, the `requestState` of a retry that
//! answers a question. The body is parsed once into a few
//! borrowed fields (serde skips the rest). Pure functions, no I/O: the router
//! ([`super`]) decides with them.

use serde_json::Value;

use crate::ids;

/// What a request names, for the answer when its owner is gone.
#[derive(Debug, Clone, PartialEq)]
pub enum Handle {
    /// A protocol session (Streamable HTTP or legacy SSE).
    Protocol(String),
    /// An `execute_python` session named in a tool call.
    Session(String),
    /// An MCP task.
    Task(String),
    /// A resource URI (of a session's workspace).
    Resource(String),
    /// The `requestState` of a retry answering a question (`input_required`,
    /// [`crate::mcp::asking`]): the run that asked waits on the replica it names.
    Question(String),
    /// A stored code file's `file_path`: served by the replica that stored it while it
    /// lives (its storage may be its own), else here (a shared storage has it too).
    File(String),
}

/// The few fields of a JSON-RPC request that may name a handle.
#[derive(serde::Deserialize, Default)]
struct Message<'a> {
    #[serde(default, borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    params: Option<Params<'a>>,
}

#[derive(serde::Deserialize, Default)]
struct Params<'a> {
    #[serde(default, borrow)]
    arguments: Option<Arguments<'a>>,
    #[serde(default, rename = "taskId", borrow)]
    task_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    uri: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, rename = "requestState", borrow)]
    request_state: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize, Default)]
struct Arguments<'a> {
    #[serde(default, borrow)]
    session_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    file_path: Option<std::borrow::Cow<'a, str>>,
}

/// What the body of a request without a protocol session names: the handle, the JSON-RPC
/// id and method (for an answer made here).
pub fn inspect(body: &[u8]) -> (Option<Handle>, Value, String) {
    let m: Message = serde_json::from_slice(body).unwrap_or_default();
    let id = m.id.unwrap_or(Value::Null);
    let method = m.method.as_deref().unwrap_or_default().to_string();
    let p = m.params.unwrap_or_default();
    let handle = match method.as_str() {
        // A retry with an answer goes where its run waits, whatever else it names.
        "tools/call" => match p.request_state {
            Some(q) => Some(Handle::Question(q.into_owned())),
            None => p.arguments.and_then(|a| match (a.session_id, a.file_path) {
                (Some(s), _) => Some(Handle::Session(s.into_owned())),
                (None, Some(f)) => Some(Handle::File(f.into_owned())),
                (None, None) => None,
            }),
        },
        m if m.starts_with("tasks/") => p.task_id.map(|t| Handle::Task(t.into_owned())),
        "resources/read" => p.uri.map(|u| Handle::Resource(u.into_owned())),
        _ => None,
    };
    (handle, id, method)
}

impl Handle {
    /// The replica that owns it, when it names one.
    pub fn owner(&self) -> Option<String> {
        match self {
            Handle::Protocol(h) | Handle::Session(h) | Handle::Task(h) | Handle::Question(h) => {
                ids::owner(h).map(str::to_string)
            }
            Handle::Resource(u) => crate::mcp::resources::parse(u)
                .and_then(|p| ids::owner(&p.handle).map(str::to_string)),
            Handle::File(f) => ids::file_owner(f).map(str::to_string),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_body_names_its_handle() {
        let b = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"execute_python","arguments":{"code":"x = 41","session_id":"s_0123abcd_ff"}}}"#;
        let (h, id, m) = inspect(b);
        assert_eq!(h, Some(Handle::Session("s_0123abcd_ff".into())));
        assert_eq!((id, m.as_str()), (json!(7), "tools/call"));
        assert_eq!(h.unwrap().owner().as_deref(), Some("0123abcd"));
        let b = br#"{"jsonrpc":"2.0","id":"a","method":"tasks/cancel","params":{"taskId":"t_0123abcd_9"}}"#;
        assert_eq!(inspect(b).0, Some(Handle::Task("t_0123abcd_9".into())));
        let u = crate::mcp::resources::uri("s_0123abcd_ff", "out.txt", None);
        let b = json!({"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri": u}})
            .to_string();
        let (h, _, _) = inspect(b.as_bytes());
        assert_eq!(h.unwrap().owner().as_deref(), Some("0123abcd"));
        // A retry answering a question goes where the run waits, not where its session is.
        let b = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_python","arguments":{"code":"1","session_id":"s_0123abcd_ff"},"requestState":"q_89abcdef_00ff","inputResponses":{}}}"#;
        let (h, _, _) = inspect(b);
        assert_eq!(h, Some(Handle::Question("q_89abcdef_00ff".into())));
        assert_eq!(h.unwrap().owner().as_deref(), Some("89abcdef"));
        for b in [
            &b"not json"[..],
            br#"{"method":"tools/call","params":{"arguments":{"code":"1"}}}"#,
            br#"[1,2]"#,
        ] {
            assert_eq!(inspect(b).0, None);
        }
    }
}
