//! Traces' configuration, from OpenTelemetry's standard variables (the exporter's
//! specification: `OTEL_EXPORTER_OTLP_*`, `OTEL_SERVICE_NAME`, the batch span processor's
//! `OTEL_BSP_*`) and `serve --otlp-endpoint`. No endpoint: traces are off.

use std::time::Duration;

use super::vars;

/// Export timeout when `OTEL_EXPORTER_OTLP_TIMEOUT` is unset (the specification's 10 s).
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Spans waiting to be sent, at most (`OTEL_BSP_MAX_QUEUE_SIZE`'s default): past it, new
/// spans are dropped and counted.
pub const QUEUE_SIZE: usize = 2048;
/// How long the sender gathers a batch after its first span (`OTEL_BSP_SCHEDULE_DELAY`'s
/// default).
pub const SCHEDULE_DELAY: Duration = Duration::from_secs(5);
/// `service.name` when `OTEL_SERVICE_NAME` is unset.
pub const SERVICE_NAME: &str = "mcp-code-executor";

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceConfig {
    /// The OTLP/HTTP traces URL (`…/v1/traces`); `None`: traces are off.
    pub endpoint: Option<String>,
    /// Headers sent with every export (an API key, for instance).
    pub headers: Vec<(String, String)>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// Bound on one export request.
    pub timeout: Duration,
    /// Spans the queue holds.
    pub queue_size: usize,
    /// How long a batch is gathered.
    pub schedule_delay: Duration,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            endpoint: None,
            headers: Vec::new(),
            service_name: SERVICE_NAME.into(),
            timeout: TIMEOUT,
            queue_size: QUEUE_SIZE,
            schedule_delay: SCHEDULE_DELAY,
        }
    }
}

impl TraceConfig {
    /// From `base` (`--otlp-endpoint`, which clap reads from `OTEL_EXPORTER_OTLP_ENDPOINT`:
    /// `/v1/traces` is appended) and the other variables; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
    /// is the traces URL itself and wins.
    pub fn from_vars(base: Option<&str>, get: impl Fn(&str) -> Option<String>) -> TraceConfig {
        let set = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let endpoint = set(vars::OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).or_else(|| {
            base.map(str::trim)
                .filter(|b| !b.is_empty())
                .map(|b| format!("{}/v1/traces", b.trim_end_matches('/')))
        });
        let millis = |k: &str| {
            set(k)
                .and_then(|v| v.parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        TraceConfig {
            endpoint,
            headers: set(vars::OTEL_EXPORTER_OTLP_HEADERS)
                .map(|h| headers(&h))
                .unwrap_or_default(),
            service_name: set(vars::OTEL_SERVICE_NAME).unwrap_or_else(|| SERVICE_NAME.into()),
            timeout: millis(vars::OTEL_EXPORTER_OTLP_TIMEOUT).unwrap_or(TIMEOUT),
            queue_size: set(vars::OTEL_BSP_MAX_QUEUE_SIZE)
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or(QUEUE_SIZE),
            schedule_delay: millis(vars::OTEL_BSP_SCHEDULE_DELAY).unwrap_or(SCHEDULE_DELAY),
        }
    }
}

/// `key1=value1,key2=value2`, values percent-encoded (the specification's format);
/// malformed entries are skipped.
fn headers(s: &str) -> Vec<(String, String)> {
    s.split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_unless_an_endpoint_and_the_standard_variables_read() {
        assert_eq!(
            TraceConfig::from_vars(None, |_| None),
            TraceConfig::default()
        );
        let c = TraceConfig::from_vars(Some("http://127.0.0.1:4318/"), |_| None);
        assert_eq!(
            c.endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        let get = |k: &str| {
            Some(
                match k {
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => "http://c:9/traces",
                    "OTEL_EXPORTER_OTLP_HEADERS" => "api-key=a%20b,bad,x=1",
                    "OTEL_SERVICE_NAME" => "svc",
                    "OTEL_EXPORTER_OTLP_TIMEOUT" => "250",
                    "OTEL_BSP_MAX_QUEUE_SIZE" => "16",
                    "OTEL_BSP_SCHEDULE_DELAY" => "100",
                    _ => return None,
                }
                .to_string(),
            )
        };
        let c = TraceConfig::from_vars(Some("http://ignored"), get);
        assert_eq!(c.endpoint.as_deref(), Some("http://c:9/traces"));
        assert_eq!(
            c.headers,
            [("api-key".into(), "a b".into()), ("x".into(), "1".into())]
        );
        assert_eq!(c.service_name, "svc");
        assert_eq!(c.timeout, Duration::from_millis(250));
        assert_eq!(c.queue_size, 16);
        assert_eq!(c.schedule_delay, Duration::from_millis(100));
    }
}
