//! The runner's own timings of a run or cell (its report's `phases`) as children of the
//! `sandbox.run` span (#45): the job going in (read and unpacked), the code, the report
//! being gathered (output drained, figures and files sent). The runner measures them with
//! its own clock, as milliseconds before it sent the report; they are placed back from
//! the report's arrival here, so no clock is shared with the sandbox (a pod on another
//! node included).

use std::time::{Duration, SystemTime};

use crate::backend::protocol::Report;
use crate::telemetry::Span;

/// The phases the runner names and their spans; any other name is ignored (the report
/// comes from inside the sandbox).
const SPANS: [(&str, &str); 3] = [
    ("job", "sandbox.job_in"),
    ("code", "sandbox.code"),
    ("report", "sandbox.report"),
];

/// Record `report`'s phases as children of `run`, the report having arrived at `received`.
pub(super) fn record(run: &Span, report: &Report, received: SystemTime) {
    let Some(opened) = run.started() else {
        return;
    };
    for (name, start, end) in placed(&report.phases, received, opened) {
        run.child_done(name, start, end);
    }
}

/// Each known phase once, at its place in time: within `opened..=received`, where the
/// runner's figures (finite, non-negative, start before end) say.
fn placed(
    phases: &[(String, f64, f64)],
    received: SystemTime,
    opened: SystemTime,
) -> Vec<(&'static str, SystemTime, SystemTime)> {
    let before = |ms: f64| {
        (ms.is_finite() && ms >= 0.0)
            .then(|| received.checked_sub(Duration::from_secs_f64(ms.min(1e9) / 1000.0)))
            .flatten()
            .map(|t| t.max(opened))
    };
    let mut out: Vec<(&'static str, SystemTime, SystemTime)> = Vec::new();
    for (name, a, b) in phases {
        let Some(&(_, span)) = SPANS.iter().find(|(n, _)| n == name) else {
            continue;
        };
        if out.iter().any(|(s, _, _)| *s == span) {
            continue;
        }
        if let (Some(start), Some(end)) = (before(*a), before(*b)) {
            if start <= end {
                out.push((span, start, end));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn phases_are_placed_back_from_the_reports_arrival_within_the_run() {
        let received = SystemTime::UNIX_EPOCH + ms(10_000);
        let opened = received - ms(100);
        let phases = vec![
            ("job".to_string(), 90.0, 80.0),
            ("code".to_string(), 80.0, 5.0),
            ("report".to_string(), 5.0, 0.0),
        ];
        assert_eq!(
            placed(&phases, received, opened),
            vec![
                ("sandbox.job_in", received - ms(90), received - ms(80)),
                ("sandbox.code", received - ms(80), received - ms(5)),
                ("sandbox.report", received - ms(5), received),
            ]
        );
    }

    #[test]
    fn what_a_hostile_runner_sends_is_dropped_or_clamped() {
        let received = SystemTime::UNIX_EPOCH + ms(10_000);
        let opened = received - ms(100);
        let phases = vec![
            ("rm -rf".to_string(), 10.0, 0.0),   // not a phase
            ("job".to_string(), f64::NAN, 0.0),  // not a number
            ("code".to_string(), 1e12, -1.0),    // after the report
            ("code".to_string(), 5_000.0, 50.0), // before the run: starts with it
            ("code".to_string(), 20.0, 10.0),    // the second of a name
            ("report".to_string(), 1.0, 2.0),    // ends before it starts
        ];
        assert_eq!(
            placed(&phases, received, opened),
            vec![("sandbox.code", opened, received - ms(50))]
        );
    }
}
