//! A finished span as the exporter takes it: plain data, nothing of the code, its output or
//! its arguments (the hooks set only the attributes named in docs/hosting.md "Traces").

use std::time::SystemTime;

use super::context::TraceContext;

/// OTLP's span kinds that we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Work inside this server (the queue, taking a sandbox, the run, shaping a result).
    Internal,
    /// A request this server answers (an MCP `tools/call`).
    Server,
    /// A request this server sends (an upstream tool call, a forward to a replica).
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Bool(bool),
    F64(f64),
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}
impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<usize> for Value {
    fn from(v: usize) -> Value {
        Value::from(v as u64)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F64(v)
    }
}

/// One ended span.
#[derive(Debug, Clone)]
pub struct Finished {
    pub ctx: TraceContext,
    pub parent: Option<[u8; 8]>,
    pub name: String,
    pub kind: Kind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, Value)>,
    /// `Some(description)`: the span's status is Error (a fixed word such as `tool_error`,
    /// never an error text that could quote code or output).
    pub error: Option<&'static str>,
}
