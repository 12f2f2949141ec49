//! Preloading, backend-neutral: what a waiting sandbox imports before its job (the
//! configuration), what its runner says it did (the report), and what the server learns
//! from the modules runs import (the [`Learner`]).
//!
//! A pool sandbox's interpreter imports its list before the runner says it is ready (see
//! `images/sandbox/mcp_runner/preload.py`), so the request path is dispatch plus the
//! user's code. The list of a pool is the configured one (the server's, or its tenant's
//! from the tenants file) followed by the learned one: the modules the recent runs of that
//! tenant and environment imported most, at most [`PreloadConfig::learn_max`], never one
//! that pool found missing or too big. Cold sandboxes preload nothing.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::Hash;

use serde::Deserialize;

pub use crate::config::preload::{
    parse_modules, valid_name, PreloadConfig, DEFAULT_LEARN_MAX, DEFAULT_MEMORY_PERCENT,
    DEFAULT_MODULES,
};

/// Recent runs per tenant and environment the learner remembers.
pub const LEARN_WINDOW: usize = 32;
/// Runs among them that must have imported a module for it to be learned.
pub const LEARN_MIN_RUNS: usize = 2;
/// Names the server takes from one report.
const MAX_NAMES: usize = 32;

/// What the runner says its preload did (the `preload` object of its report).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PreloadReport {
    /// Imported before the job came.
    #[serde(default)]
    pub loaded: Vec<String>,
    /// Not in the environment: skipped.
    #[serde(default)]
    pub missing: Vec<String>,
    /// Failed at import or did not fit under the memory budget: left out.
    #[serde(default)]
    pub dropped: Vec<String>,
    /// CPU the imports took (taken out of the run's `cpu_ms`).
    #[serde(default)]
    pub cpu_ms: u64,
    /// The sandbox's memory once preloaded.
    pub memory_bytes: Option<u64>,
    /// CPU the whole sandbox had used when it said ready (runner, interpreter, imports):
    /// what a refill costs inside the sandbox.
    pub ready_cpu_ms: Option<u64>,
    /// The sandbox's memory when it said ready: what a waiting sandbox holds.
    pub ready_memory_bytes: Option<u64>,
}

/// The learned modules per key (tenant and environment): the runs' imports over a window of
/// recent runs, and what must never be preloaded again under that key (missing from the
/// environment, too big, failing at import).
#[derive(Debug)]
pub struct Learner<K> {
    max: usize,
    keys: HashMap<K, Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    runs: VecDeque<Vec<String>>,
    banned: BTreeSet<String>,
}

impl<K: Hash + Eq + Clone> Learner<K> {
    pub fn new(max: usize) -> Self {
        Learner {
            max,
            keys: HashMap::new(),
        }
    }

    /// One run of `key` imported `imported` (module names at most two levels deep, as the
    /// runner read them from the run's source; checked and capped here). Returns the learned list when it changed.
    pub fn observe(&mut self, key: &K, imported: &[String]) -> Option<Vec<String>> {
        let before = self.learned(key);
        let names: Vec<String> = imported
            .iter()
            .filter(|n| valid_name(n) && n.split('.').count() <= 2)
            .take(MAX_NAMES)
            .cloned()
            .collect();
        let r = self.keys.entry(key.clone()).or_default();
        r.runs.push_back(names);
        while r.runs.len() > LEARN_WINDOW {
            r.runs.pop_front();
        }
        let after = self.learned(key);
        (after != before).then_some(after)
    }

    /// Never learn these for `key` again (a pool found them missing or too big). Returns
    /// the learned list when it changed.
    pub fn ban(&mut self, key: &K, names: &[String]) -> Option<Vec<String>> {
        let before = self.learned(key);
        let r = self.keys.entry(key.clone()).or_default();
        r.banned.extend(names.iter().cloned());
        let after = self.learned(key);
        (after != before).then_some(after)
    }

    /// Names `key` must not preload.
    pub fn banned(&self, key: &K) -> BTreeSet<String> {
        self.keys
            .get(key)
            .map(|r| r.banned.clone())
            .unwrap_or_default()
    }

    /// The modules imported by at least [`LEARN_MIN_RUNS`] of `key`'s recent runs, most
    /// runs first (ties: the one seen first), at most `max`.
    pub fn learned(&self, key: &K) -> Vec<String> {
        let Some(r) = self.keys.get(key) else {
            return Vec::new();
        };
        let mut counts: Vec<(String, usize, usize)> = Vec::new();
        for (i, run) in r.runs.iter().enumerate() {
            for n in run {
                if r.banned.contains(n) {
                    continue;
                }
                match counts.iter_mut().find(|(m, _, _)| m == n) {
                    Some(c) => c.1 += 1,
                    None => counts.push((n.clone(), 1, i)),
                }
            }
        }
        counts.retain(|c| c.1 >= LEARN_MIN_RUNS);
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)));
        counts.into_iter().take(self.max).map(|c| c.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn modules_parse_and_refuse_what_is_not_a_name() {
        assert_eq!(
            parse_modules(" numpy, matplotlib.pyplot ,numpy").unwrap(),
            s(&["numpy", "matplotlib.pyplot"])
        );
        assert!(parse_modules("none").unwrap().is_empty());
        assert!(parse_modules("").unwrap().is_empty());
        assert!(parse_modules("os; import x").is_err());
        assert!(parse_modules("a..b").is_err());
        assert!(parse_modules("1abc").is_err());
    }

    #[test]
    fn learned_after_two_runs_most_imported_first_bounded_and_never_banned() {
        let mut l = Learner::new(2);
        let k = "t".to_string();
        assert_eq!(l.observe(&k, &s(&["scipy"])), None);
        assert_eq!(
            l.observe(&k, &s(&["scipy", "sklearn"])),
            Some(s(&["scipy"]))
        );
        l.observe(&k, &s(&["sklearn", "bad name", "x.y.z"]));
        l.observe(&k, &s(&["sklearn", "torch"]));
        l.observe(&k, &s(&["torch"]));
        // sklearn 3 runs, scipy 2 (seen first), torch 2: at most 2.
        assert_eq!(l.learned(&k), s(&["sklearn", "scipy"]));
        assert_eq!(l.ban(&k, &s(&["sklearn"])), Some(s(&["scipy", "torch"])));
        l.observe(&k, &s(&["sklearn"]));
        assert!(!l.learned(&k).contains(&"sklearn".to_string()));
        assert!(l.learned(&"other".to_string()).is_empty());
    }

    #[test]
    fn old_runs_fall_out_of_the_window() {
        let mut l = Learner::new(4);
        let k = 1u8;
        l.observe(&k, &s(&["scipy"]));
        l.observe(&k, &s(&["scipy"]));
        assert_eq!(l.learned(&k), s(&["scipy"]));
        for _ in 0..LEARN_WINDOW {
            l.observe(&k, &s(&["polars"]));
        }
        assert_eq!(l.learned(&k), s(&["polars"]));
    }

    #[test]
    fn the_report_reads_with_fields_missing() {
        let r: PreloadReport = serde_json::from_str(r#"{"loaded": ["numpy"]}"#).unwrap();
        assert_eq!(r.loaded, s(&["numpy"]));
        assert_eq!(r.cpu_ms, 0);
    }
}
