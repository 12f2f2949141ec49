//! The check of a call's arguments against the tool's `inputSchema` before it leaves this
//! server: the JSON Schema keywords tools use in practice (`type`, `properties`,
//! `required`, `additionalProperties: false`, `enum`, `const`, `items`, `minimum`,
//! `maximum`, `minLength`, `maxLength`, `anyOf`/`oneOf` as "any of"). A keyword outside
//! this set is not checked here: the upstream checks its own arguments too.

use serde_json::{Map, Value};

/// Why `value` does not match `schema`, or `None`.
pub fn check(schema: &Value, value: &Value) -> Option<String> {
    at(schema, value, "arguments", 0)
}

/// [`check`] of a call's arguments against a tool's `inputSchema`, in place: the
/// arguments are given back unchanged (never copied), or why they do not match.
pub fn check_object(
    schema: &Map<String, Value>,
    args: Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    let v = Value::Object(args);
    let why = at_map(schema, &v, "arguments", 0);
    let Value::Object(args) = v else {
        unreachable!("made an object above")
    };
    match why {
        Some(e) => Err(e),
        None => Ok(args),
    }
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => true,
    }
}

fn at(schema: &Value, v: &Value, path: &str, depth: usize) -> Option<String> {
    at_map(schema.as_object()?, v, path, depth)
}

fn at_map(s: &Map<String, Value>, v: &Value, path: &str, depth: usize) -> Option<String> {
    if depth > 32 {
        return None;
    }
    match s.get("type") {
        Some(Value::String(t)) if !type_ok(t, v) => {
            return Some(format!("{path} should be of type {t}, got {}", kind(v)))
        }
        Some(Value::Array(ts)) if !ts.iter().any(|t| t.as_str().is_some_and(|t| type_ok(t, v))) => {
            return Some(format!(
                "{path} should be one of the types {}, got {}",
                Value::Array(ts.clone()),
                kind(v)
            ))
        }
        _ => {}
    }
    if let Some(Value::Array(choices)) = s.get("enum") {
        if !choices.contains(v) {
            return Some(format!(
                "{path} should be one of {}",
                Value::Array(choices.clone())
            ));
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return Some(format!("{path} should be {c}"));
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(alts)) = s.get(key) {
            if !alts.is_empty() && alts.iter().all(|a| at(a, v, path, depth + 1).is_some()) {
                return Some(format!("{path} matches none of the allowed forms"));
            }
        }
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = s.get("minimum").and_then(Value::as_f64) {
            if n < min {
                return Some(format!("{path} should be at least {min}"));
            }
        }
        if let Some(max) = s.get("maximum").and_then(Value::as_f64) {
            if n > max {
                return Some(format!("{path} should be at most {max}"));
            }
        }
    }
    if let Some(text) = v.as_str() {
        let len = text.chars().count() as u64;
        if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
            if len < min {
                return Some(format!("{path} should have at least {min} characters"));
            }
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                return Some(format!("{path} should have at most {max} characters"));
            }
        }
    }
    if let (Some(obj), true) = (
        v.as_object(),
        s.contains_key("properties") || s.contains_key("required"),
    ) {
        let props = s.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(req)) = s.get("required") {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    return Some(format!("{path} lacks the required `{r}`"));
                }
            }
        }
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => {
                    if let Some(e) = at(sub, val, &format!("{path}.{k}"), depth + 1) {
                        return Some(e);
                    }
                }
                None => {
                    if s.get("additionalProperties") == Some(&Value::Bool(false)) {
                        return Some(format!("{path} has an unknown property `{k}`"));
                    }
                }
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, item) in arr.iter().enumerate() {
            if let Some(e) = at(items, item, &format!("{path}[{i}]"), depth + 1) {
                return Some(e);
            }
        }
    }
    None
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked_against_the_input_schema() {
        let s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "n": {"type": "integer", "minimum": 1, "maximum": 3},
                "mode": {"enum": ["x", "y"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "name": {"type": ["string", "null"], "maxLength": 3}
            },
            "required": ["a"],
            "additionalProperties": false
        });
        assert_eq!(
            check(
                &s,
                &json!({"a": 1.5, "n": 2, "mode": "x", "tags": ["t"], "name": null})
            ),
            None
        );
        for (bad, says) in [
            (json!({}), "lacks the required `a`"),
            (json!({"a": "1"}), "arguments.a should be of type number"),
            (
                json!({"a": 1, "n": 2.5}),
                "arguments.n should be of type integer",
            ),
            (json!({"a": 1, "n": 9}), "at most 3"),
            (json!({"a": 1, "mode": "z"}), "should be one of"),
            (
                json!({"a": 1, "tags": [1]}),
                "arguments.tags[0] should be of type string",
            ),
            (json!({"a": 1, "name": "long"}), "at most 3 characters"),
            (json!({"a": 1, "zz": 1}), "unknown property `zz`"),
            (json!([1]), "should be of type object"),
        ] {
            let got = check(&s, &bad).unwrap_or_default();
            assert!(got.contains(says), "{bad}: {got}");
        }
        // Keywords it does not know are left to the upstream.
        assert_eq!(
            check(
                &json!({"type": "object", "patternProperties": {}}),
                &json!({"q": 1})
            ),
            None
        );
    }
}
