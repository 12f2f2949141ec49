//! What a refused sign-in writes to the log, bounded: a request needs no credentials to be
//! refused, so each refusal writing a line let anyone grow the log at will (issue 42:
//! 2,000 requests with bad tokens wrote 22.3 MB in 7.2 s, with the token's untrusted `iss`
//! and `kid` in every line). Now at most [`BURST`] refusals are logged per [`WINDOW`]; the
//! next line logged after a quiet spell says how many were not; each line's detail is at
//! most [`DETAIL_CHARS`] characters, with the token's values quoted and cut where they are
//! made ([`super::validate::shown`]). Every refusal is still counted, by reason, in
//! `/metrics` (`mcp_auth_refused_total{reason}`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals logged per window at most...
pub const BURST: u32 = 5;
/// ...of this length.
pub const WINDOW: Duration = Duration::from_secs(10);
/// The most characters of a refusal's detail a line carries.
pub const DETAIL_CHARS: usize = 200;

#[derive(Debug)]
struct State {
    window_start: Option<Instant>,
    logged: u32,
    /// Refusals not logged since the last line.
    quiet: u64,
}

/// The rate limit of refusal lines (one per server front).
#[derive(Debug)]
pub struct RefusalLog {
    state: Mutex<State>,
}

impl Default for RefusalLog {
    fn default() -> Self {
        RefusalLog {
            state: Mutex::new(State {
                window_start: None,
                logged: 0,
                quiet: 0,
            }),
        }
    }
}

impl RefusalLog {
    /// May a refusal at `now` be logged? `Some(n)`: yes, and `n` refusals before it were
    /// not; `None`: not now (it is counted for the next line).
    pub fn admit(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.window_start
            .is_none_or(|t| now.saturating_duration_since(t) >= WINDOW)
        {
            s.window_start = Some(now);
            s.logged = 0;
        }
        if s.logged < BURST {
            s.logged += 1;
            Some(std::mem::take(&mut s.quiet))
        } else {
            s.quiet += 1;
            None
        }
    }
}

/// `detail` with control characters escaped, cut at about [`DETAIL_CHARS`] characters
/// (with `…` when cut): for a log line.
pub fn detail(detail: &str) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in detail.chars() {
        if shown >= DETAIL_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            let e: String = c.escape_default().collect();
            shown += e.chars().count();
            out.push_str(&e);
        } else {
            shown += 1;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_a_count_of_the_quiet_ones() {
        let log = RefusalLog::default();
        let t0 = Instant::now();
        let admitted: Vec<_> = (0..2000).map(|_| log.admit(t0)).collect();
        assert_eq!(
            admitted.iter().filter(|a| a.is_some()).count(),
            BURST as usize
        );
        assert!(admitted[..BURST as usize].iter().all(|a| *a == Some(0)));
        // The next window: the first line says how many were not logged.
        let t1 = t0 + WINDOW;
        assert_eq!(log.admit(t1), Some(2000 - u64::from(BURST)));
        assert_eq!(log.admit(t1), Some(0));
    }

    #[test]
    fn details_are_cut_and_escaped() {
        assert_eq!(detail("bad signature"), "bad signature");
        let d = detail(&format!("a\nb\u{1b}[31m{}", "x".repeat(10_000)));
        assert!(d.starts_with("a\\nb\\u{1b}[31m"), "{d}");
        assert!(!d.contains('\n') && !d.contains('\u{1b}'));
        assert!(
            d.chars().count() <= DETAIL_CHARS + 10 && d.ends_with('…'),
            "{d}"
        );
        let controls = detail(&"\u{1}".repeat(10_000));
        assert!(controls.chars().count() <= DETAIL_CHARS + 10, "{controls}");
    }
}
