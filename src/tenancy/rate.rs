//! Runs per minute: a token bucket per tenant, checked before anything is started.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A bucket of `per_minute` runs that refills continuously; a full minute's worth may be
/// spent at once.
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u32,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(per_minute: u32) -> Self {
        RateLimiter {
            per_minute,
            state: Mutex::new((f64::from(per_minute), Instant::now())),
        }
    }

    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Take one run, or say how long until one is free.
    pub fn try_take(&self) -> Result<(), Duration> {
        self.try_take_at(Instant::now())
    }

    fn try_take_at(&self, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(self.per_minute) / 60.0;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * rate).min(f64::from(self.per_minute));
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - s.0) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_of_runs_then_waits_then_refills() {
        let r = RateLimiter::new(3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(r.try_take_at(t0).is_ok());
        }
        let wait = r.try_take_at(t0).unwrap_err();
        assert!(
            (19.9..=20.1).contains(&wait.as_secs_f64()),
            "3/min: one every 20 s, got {wait:?}"
        );
        assert!(r.try_take_at(t0 + Duration::from_secs(10)).is_err());
        assert!(r.try_take_at(t0 + Duration::from_secs(21)).is_ok());
        assert!(r.try_take_at(t0 + Duration::from_secs(22)).is_err());
        // Idle for long: back to a full bucket, never more.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert!(r.try_take_at(later).is_ok());
        }
        assert!(r.try_take_at(later).is_err());
    }
}
