//! The record of each connection: one structured log line when it ends (tenant, run, host,
//! port, bytes each way, outcome, duration; never payloads, paths or header values) and
//! the metrics. Host names come from sandboxed code: they are escaped and capped
//! ([`shown`]) before any log or error shows them, and refusal lines, which hostile code
//! can cause at will, are rate-limited.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::defaults;

/// `s` as logs and errors show it: printable ASCII kept, anything else (control bytes,
/// quotes, backslashes, non-ASCII) escaped, at most [`defaults::SHOWN_NAME_CHARS`]
/// characters and then `...`.
pub fn shown(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if out.len() >= defaults::SHOWN_NAME_CHARS {
            out.push_str("...");
            break;
        }
        if c.is_ascii_graphic() && c != '"' && c != '\\' {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

/// One connection (or one refused attempt), logged and counted when it ends.
#[derive(Debug)]
pub struct Record {
    tenant: String,
    run: String,
    host: String,
    port: u16,
    /// `connect` (a tunnel) or `http` (a forwarded plain HTTP request).
    kind: &'static str,
    /// The rule that allowed it, as written: the metrics' host label (bounded by the
    /// policy, unlike the names code asks for); `-` when none did.
    rule: Option<String>,
    /// Whether an upstream connection was opened (else: refused before, or failed).
    connected: bool,
    started: Instant,
}

impl Record {
    pub fn new(tenant: &str, run: &str, host: &str, port: u16, kind: &'static str) -> Record {
        Record {
            tenant: tenant.to_string(),
            run: run.to_string(),
            host: shown(host),
            port,
            kind,
            rule: None,
            connected: false,
            started: Instant::now(),
        }
    }

    /// The rule that allowed the connection.
    pub fn allowed_by(&mut self, rule: &str) {
        self.rule = Some(rule.to_string());
    }

    /// The upstream connection is open.
    pub fn connected(&mut self) {
        self.connected = true;
    }

    /// The connection ended with `outcome` (`ok`, `limit`, `idle_timeout`, `not_tls`, `sni_mismatch`,
    /// `error`, `cancelled`, or a refusal's label) after `up` bytes sent and `down`
    /// received.
    pub fn finish(self, outcome: &'static str, up: u64, down: u64) {
        let ms = self.started.elapsed().as_millis() as u64;
        let host_label = self.rule.as_deref().unwrap_or("-");
        super::metrics::egress().connection(&self.tenant, host_label, outcome, up, down);
        if !self.connected {
            let Some(suppressed) = refusal_log_allowed() else {
                return;
            };
            tracing::info!(
                target: "mcp_code_executor::egress",
                tenant = %self.tenant, run = %self.run, host = %self.host, port = self.port,
                kind = self.kind, outcome, bytes_up = up, bytes_down = down, duration_ms = ms,
                suppressed_before = suppressed,
                "egress refused"
            );
        } else {
            tracing::info!(
                target: "mcp_code_executor::egress",
                tenant = %self.tenant, run = %self.run, host = %self.host, port = self.port,
                kind = self.kind, outcome, bytes_up = up, bytes_down = down, duration_ms = ms,
                "egress connection"
            );
        }
    }
}

/// Refusal lines per second, process-wide; past it they are counted and the next line
/// that is logged says how many were not.
fn refusal_log_allowed() -> Option<u64> {
    static WINDOW: Mutex<Option<(Instant, u32)>> = Mutex::new(None);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let mut w = WINDOW.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    let (start, n) = w.get_or_insert((now, 0));
    if now.duration_since(*start).as_secs() >= 1 {
        *start = now;
        *n = 0;
    }
    if *n >= defaults::REFUSAL_LOGS_PER_SECOND {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    *n += 1;
    Some(SUPPRESSED.swap(0, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_capped() {
        assert_eq!(shown("data.example.test"), "data.example.test");
        assert_eq!(shown("a\r\nb"), "a\\r\\nb");
        assert_eq!(shown("q\"\\"), "q\\\"\\\\");
        assert_eq!(shown("caf\u{e9}"), "caf\\u{e9}");
        let long = shown(&"x".repeat(10_000));
        assert!(long.len() <= defaults::SHOWN_NAME_CHARS + 3 && long.ends_with("..."));
    }
}
