//! Tool arguments, with the names the tools' existing users already send, and the extractor
//! that turns a malformed call into an `invalid_params` error naming the argument at fault.
//! An argument a tool does not know (a misspelling such as `timout`) is such an error too
//! ([`check_known`], applied to every tool before it runs), never silently ignored.

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::ErrorData;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::fit::{capped_message, quote, ERROR_MAX};

/// The parsed arguments of a tool call. Unlike rmcp's `Parameters`, a type error names the
/// argument (`timeout: invalid type: string "x", expected f64`).
pub struct Args<T>(pub T);

impl<S, T: DeserializeOwned> FromContextPart<ToolCallContext<'_, S>> for Args<T> {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let object = context.arguments.take().unwrap_or_default();
        parse(serde_json::Value::Object(object)).map(Args)
    }
}

/// Deserialize tool arguments, reporting the path of the offending argument.
pub fn parse<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ErrorData> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if path == "." || path.is_empty() {
            format!("invalid arguments: {inner}")
        } else {
            format!("invalid argument `{}`: {inner}", quote(&path))
        };
        // serde quotes the offending value whole (a 7 MB string, say): a short prefix.
        ErrorData::invalid_params(capped_message(&message, ERROR_MAX).into_owned(), None)
    })
}

/// Refuse arguments the tool's input schema does not name, listing the ones it accepts.
/// Only `arguments` is looked at: a request's `_meta` (progress token and the like) travels
/// beside it in the request params, never inside.
pub fn check_known(
    tool: &str,
    schema: &rmcp::model::JsonObject,
    arguments: &rmcp::model::JsonObject,
) -> Result<(), ErrorData> {
    let accepted: Vec<&str> = schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().map(String::as_str).collect())
        .unwrap_or_default();
    let unknown: Vec<&str> = arguments
        .keys()
        .map(String::as_str)
        .filter(|k| !accepted.contains(k))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("`{}`", quote(n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let what = if unknown.len() == 1 {
        format!("unknown argument {}", quoted(&unknown))
    } else {
        format!("unknown arguments {}", quoted(&unknown))
    };
    let accepts = if accepted.is_empty() {
        "it takes no arguments".to_string()
    } else {
        format!("it accepts {}", quoted(&accepted))
    };
    let message = format!("invalid arguments for `{}`: {what}; {accepts}", quote(tool));
    Err(ErrorData::invalid_params(
        capped_message(&message, ERROR_MAX).into_owned(),
        None,
    ))
}

/// The JSON Schema clients see for the arguments `T` (rmcp's draft 2020-12 settings, made
/// [`portable`]).
pub fn schema<T: JsonSchema + 'static>() -> std::sync::Arc<rmcp::model::JsonObject> {
    cached::<T>("input", || {
        let s = rmcp::handler::server::common::schema_for_input::<T>()
            .unwrap_or_else(|e| panic!("input schema of {}: {e}", std::any::type_name::<T>()));
        portable_object((*s).clone())
    })
}

/// The output schema of a tool whose `structuredContent` is a `T`, made [`portable`].
pub fn output_schema<T: JsonSchema + 'static>() -> std::sync::Arc<rmcp::model::JsonObject> {
    cached::<T>("output", || {
        portable_object((*rmcp::handler::server::common::schema_for_output::<T>()).clone())
    })
}

/// Schemas are made once per type and shared: every connection builds its tool router, and
/// must not generate, walk and copy every schema again (a burst of connections would).
fn cached<T: 'static>(
    kind: &'static str,
    make: impl FnOnce() -> rmcp::model::JsonObject,
) -> std::sync::Arc<rmcp::model::JsonObject> {
    use std::any::TypeId;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Cache = Mutex<HashMap<(TypeId, &'static str), Arc<rmcp::model::JsonObject>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (TypeId::of::<T>(), kind);
    let cache = CACHE.get_or_init(Cache::default);
    if let Some(s) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return s.clone();
    }
    let made = Arc::new(make());
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_insert(made)
        .clone()
}

fn portable_object(o: rmcp::model::JsonObject) -> rmcp::model::JsonObject {
    let mut v = serde_json::Value::Object(o);
    portable(&mut v);
    match v {
        serde_json::Value::Object(o) => o,
        _ => unreachable!("an object stays an object"),
    }
}

/// Formats schemars adds for Rust's number types, which JSON Schema does not define:
/// validators print "unknown format ignored" for each.
const RUST_FORMATS: [&str; 12] = [
    "uint", "int", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float", "double",
];

/// Standard, portable JSON Schema: no Rust number formats, and no `type` arrays (a nullable
/// field's `["integer", "null"]` becomes `anyOf` of single types, which clients that map
/// schemas onto a single-type dialect accept; the Inspector's `--strict` asks for it).
pub fn portable(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(o) => {
            if o.get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| RUST_FORMATS.contains(&f))
            {
                o.remove("format");
            }
            if let Some(Value::Array(types)) = o.get("type").cloned() {
                o.remove("type");
                // Annotations stay on the field; the rest describes the non-null value.
                let keep = ["description", "title", "default", "examples", "deprecated"];
                let moved: Vec<String> = o
                    .keys()
                    .filter(|k| !keep.contains(&k.as_str()))
                    .cloned()
                    .collect();
                let mut constraints = serde_json::Map::new();
                for k in moved {
                    if let Some(x) = o.remove(&k) {
                        constraints.insert(k, x);
                    }
                }
                let branches: Vec<Value> = types
                    .iter()
                    .map(|t| {
                        let mut b = serde_json::Map::new();
                        b.insert("type".into(), t.clone());
                        if t != "null" {
                            b.extend(constraints.clone());
                        }
                        Value::Object(b)
                    })
                    .collect();
                o.insert("anyOf".into(), Value::Array(branches));
            }
            for (_, x) in o.iter_mut() {
                portable(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(portable),
        _ => {}
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteCode {
    /// The Python source to run, as a complete script.
    pub code: String,
    /// Short name for the stored copy (letters, digits, `_`, `-`); a unique suffix is added.
    #[serde(default)]
    pub filename: Option<String>,
    /// Wall-clock limit in seconds; capped by the server's maximum.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// The session whose workspace files the run sees at /workspace (and keeps the files it writes there): the session_id an earlier call returned. Omit it to use your connection's own session; a client without one (MCP 2026-07-28 over HTTP) gets a new session when the run writes files.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InitializeCodeFile {
    /// The first part of the script.
    pub content: String,
    /// A short name for the file (letters, digits, `_`, `-`); a unique suffix is added.
    #[serde(default)]
    pub filename: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendToCodeFile {
    /// The file_path returned by initialize_code_file (or just its file name).
    pub file_path: String,
    /// Code to add at the end of the file, exactly as given (include the newlines you need).
    pub content: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteCodeFile {
    /// The file_path returned by initialize_code_file or execute_code (or just its file name).
    pub file_path: String,
    /// Wall-clock limit in seconds; capped by the server's maximum.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// The session whose workspace files the run sees at /workspace, as for execute_code.
    #[serde(default)]
    pub session_id: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadCodeFile {
    /// The file_path returned by initialize_code_file or execute_code (or just its file name).
    pub file_path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Packages {
    /// Distribution names as on PyPI, e.g. ["numpy", "pandas"].
    pub packages: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigureEnvironment {
    /// Environment type: `conda`, `venv` or `venv-uv`.
    #[serde(rename = "type")]
    pub env_type: String,
    /// Name of the conda environment (type `conda`).
    #[serde(default)]
    pub conda_name: Option<String>,
    /// Path of the virtualenv (type `venv`).
    #[serde(default)]
    pub venv_path: Option<String>,
    /// Path of the uv virtualenv (type `venv-uv`).
    #[serde(default)]
    pub uv_venv_path: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_argument() {
        let e = parse::<ExecuteCode>(json!({"code": "x", "timeout": "soon"})).unwrap_err();
        assert!(e.message.contains("`timeout`"), "{}", e.message);
        let e = parse::<ExecuteCode>(json!({"filename": "x"})).unwrap_err();
        assert!(e.message.contains("code"), "{}", e.message);
        let e = parse::<Packages>(json!({"packages": "numpy"})).unwrap_err();
        assert!(e.message.contains("`packages`"), "{}", e.message);
    }

    #[test]
    fn unknown_arguments_are_named_with_the_accepted_ones() {
        let schema = schema::<ExecuteCode>();
        let args = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert!(check_known("execute_code", &schema, &args(json!({"code": "x"}))).is_ok());
        let e = check_known(
            "execute_code",
            &schema,
            &args(json!({"code": "x", "timout": 5})),
        )
        .unwrap_err();
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        for want in ["`timout`", "`code`", "`filename`", "`timeout`"] {
            assert!(e.message.contains(want), "{want}: {}", e.message);
        }
        let none = rmcp::model::JsonObject::new();
        let e = check_known("reset_session", &none, &args(json!({"force": true}))).unwrap_err();
        assert!(e.message.contains("takes no arguments"), "{}", e.message);
        // The schema says so too, and parsing refuses them on its own.
        let s = serde_json::Value::Object((*schema).clone());
        assert_eq!(s["additionalProperties"], false, "{s}");
        assert!(parse::<ExecuteCode>(json!({"code": "x", "timout": 5})).is_err());
    }

    #[test]
    fn type_is_the_wire_name() {
        let c: ConfigureEnvironment = parse(json!({"type": "conda", "conda_name": "x"})).unwrap();
        assert_eq!(c.env_type, "conda");
        let s = serde_json::Value::Object((*schema::<ConfigureEnvironment>()).clone());
        assert!(s["properties"]["type"].is_object(), "{s}");
    }
}
