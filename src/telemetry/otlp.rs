//! OTLP/HTTP's JSON encoding of an `ExportTraceServiceRequest` (the protobuf's JSON mapping
//! with OTLP's exceptions: trace and span ids as hex strings, enums as integers, 64-bit
//! integers as decimal strings).

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value as Json};

use super::context::hex;
use super::record::{Finished, Kind, Value};

/// The instrumentation scope every span is reported under.
const SCOPE: &str = "mcp-code-executor";

/// The request body for `spans` of `service` (the resource's `service.name`).
pub fn encode(service: &str, spans: &[Finished]) -> Vec<u8> {
    let body = json!({
        "resourceSpans": [{
            "resource": {"attributes": [
                attribute("service.name", &Value::from(service)),
                attribute("service.version", &Value::from(env!("CARGO_PKG_VERSION"))),
            ]},
            "scopeSpans": [{
                "scope": {"name": SCOPE, "version": env!("CARGO_PKG_VERSION")},
                "spans": spans.iter().map(span).collect::<Vec<_>>(),
            }],
        }],
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

fn span(s: &Finished) -> Json {
    let mut out = json!({
        "traceId": hex(&s.ctx.trace_id),
        "spanId": hex(&s.ctx.span_id),
        "name": s.name,
        "kind": match s.kind {
            Kind::Internal => 1,
            Kind::Server => 2,
            Kind::Client => 3,
        },
        "startTimeUnixNano": nanos(s.start),
        "endTimeUnixNano": nanos(s.end),
        "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
        "flags": 0x100 | u32::from(s.ctx.sampled),
    });
    if let Some(parent) = s.parent {
        out["parentSpanId"] = Json::from(hex(&parent));
    }
    out["status"] = match s.error {
        Some(what) => json!({"code": 2, "message": what}),
        None => json!({"code": 0}),
    };
    out
}

fn attribute(key: &str, v: &Value) -> Json {
    let value = match v {
        Value::Str(s) => json!({ "stringValue": s }),
        Value::Int(i) => json!({ "intValue": i.to_string() }),
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::F64(f) => json!({ "doubleValue": f }),
    };
    json!({"key": key, "value": value})
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::context::TraceContext;

    #[test]
    fn a_span_in_otlp_json() {
        let ctx =
            TraceContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let t = UNIX_EPOCH + std::time::Duration::from_nanos(1_700_000_000_123_456_789);
        let s = Finished {
            ctx,
            parent: Some([1, 2, 3, 4, 5, 6, 7, 8]),
            name: "tools/call execute_code".into(),
            kind: Kind::Server,
            start: t,
            end: t,
            attributes: vec![("a", Value::Int(3)), ("b", Value::from(true))],
            error: Some("tool_error"),
        };
        let body: Json = serde_json::from_slice(&encode("svc", &[s])).unwrap();
        let rs = &body["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0],
            json!({"key": "service.name", "value": {"stringValue": "svc"}})
        );
        let sp = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(sp["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(sp["parentSpanId"], "0102030405060708");
        assert_eq!(sp["kind"], 2);
        assert_eq!(sp["startTimeUnixNano"], "1700000000123456789");
        assert_eq!(sp["attributes"][0]["value"]["intValue"], "3");
        assert_eq!(sp["status"]["code"], 2);
    }
}
