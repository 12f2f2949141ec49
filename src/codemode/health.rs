//! How an upstream has been doing: the failures in a row (a start that failed, an
//! upstream that exited or hung) and when it may be started again.
//!
//! A crashed upstream is started again at once the first time; after that each further
//! failure in a row doubles the wait (1 s, 2 s, 4 s, … at most [`MAX_BACKOFF`]), during which
//! calls fail at once with the reason, across runs (the upstream is the tenant's). A call
//! that gets an answer ends the streak.

use std::time::{Duration, Instant};

/// The longest wait before an upstream that keeps failing is started again.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(super) struct Health {
    /// Failures in a row.
    failures: u32,
    /// No start before then.
    retry_at: Option<Instant>,
    /// What the last failure was.
    last: String,
}

/// The wait after `n` failures in a row.
fn backoff(n: u32) -> Duration {
    if n <= 1 {
        Duration::ZERO
    } else {
        Duration::from_secs(1u64 << (n - 2).min(6)).min(MAX_BACKOFF)
    }
}

impl Health {
    /// A failure: `what` happened. Returns the failures in a row.
    pub fn failed(&mut self, what: &str, now: Instant) -> u32 {
        self.failures += 1;
        self.retry_at = Some(now + backoff(self.failures));
        self.last = what.to_string();
        self.failures
    }

    /// A call was answered: the streak ends.
    pub fn answered(&mut self) {
        self.failures = 0;
        self.retry_at = None;
    }

    /// Why the upstream may not be started now, or `None`.
    pub fn refusal(&self, now: Instant) -> Option<String> {
        let at = self.retry_at?;
        (at > now).then(|| {
            format!(
                "{} ({} failures in a row); it is started again in {:.1}s",
                self.last,
                self.failures,
                (at - now).as_secs_f64()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_double_the_wait_and_an_answer_ends_them() {
        let t = Instant::now();
        let mut h = Health::default();
        assert_eq!(h.refusal(t), None);
        h.failed("it exited", t);
        assert_eq!(h.refusal(t), None, "the first restart is at once");
        h.failed("it exited", t);
        let why = h.refusal(t).unwrap();
        assert!(why.starts_with("it exited (2 failures in a row)"), "{why}");
        assert_eq!(h.refusal(t + Duration::from_millis(1001)), None);
        for _ in 0..20 {
            h.failed("it hung", t);
        }
        assert!(h.refusal(t + Duration::from_secs(59)).is_some());
        assert_eq!(h.refusal(t + MAX_BACKOFF + Duration::from_millis(1)), None);
        h.answered();
        h.failed("it exited", t);
        assert_eq!(h.refusal(t), None);
        // 99 crashes a run could cause before: the restarts in 28 s are now 6.
        let (mut at, mut n, mut h) = (Duration::ZERO, 0, Health::default());
        while at < Duration::from_millis(27_800) {
            if h.refusal(t + at).is_none() {
                n += 1;
                h.failed("it exited", t + at);
            }
            at += Duration::from_millis(10);
        }
        assert!(n <= 6, "{n} restarts");
    }
}
