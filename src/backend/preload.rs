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

// ---- Dispatch by imports, and pools sized by demand ----
//
// A pool holds waiting sandboxes of several kinds: plain (nothing preloaded) and
// preloaded with some of its candidate modules (the configured list and the learned
// one). What a call needs is read from its source before the run ([`imports_in`]):
// the candidates it imports ([`need_of`]). It takes the waiting sandbox that covers most
// of that and preloads least beyond it ([`choose`]): a call that imports nothing of the
// candidates takes a plain sandbox while one waits, and a preloaded one only when no
// plain one does (never a cold start while a sandbox waits). How many of each kind the
// pool keeps waiting follows what its recent calls needed ([`plan`]): a pool whose calls
// never import pandas never makes a sandbox that preloads it.

/// Recent calls per pool whose needs size it.
pub const DEMAND_WINDOW: usize = 32;
/// Preloaded kinds a pool keeps at most (besides plain).
pub const MAX_KINDS: usize = 3;
/// Source bytes read for imports, at most (as the runner reads).
const MAX_SOURCE: usize = 1 << 20;

/// What importing a module imports besides (a sandbox that preloaded the key has these).
const IMPLIED: &[(&str, &[&str])] = &[
    ("pandas", &["numpy"]),
    ("matplotlib", &["numpy"]),
    ("matplotlib.pyplot", &["matplotlib", "numpy"]),
    ("scipy", &["numpy"]),
    ("sklearn", &["numpy", "scipy"]),
    (
        "seaborn",
        &["numpy", "pandas", "matplotlib", "matplotlib.pyplot"],
    ),
    ("statsmodels", &["numpy", "pandas", "scipy"]),
];

/// `name` is `m` or a submodule of it.
fn within(name: &str, m: &str) -> bool {
    name == m || (name.len() > m.len() && name.starts_with(m) && name.as_bytes()[m.len()] == b'.')
}

/// A sandbox that preloaded `m` has `name` loaded too (itself, a submodule of a
/// preloaded package as far as the package imports it, or what `m` imports anyway).
pub fn covers_one(m: &str, name: &str) -> bool {
    if within(name, m) {
        return true;
    }
    IMPLIED.iter().any(|(k, implied)| {
        (m == *k || (within(m, k) && !k.contains('.'))) && implied.iter().any(|i| within(name, i))
    })
}

/// Does a sandbox that preloaded `list` have `name` loaded?
pub fn covers(list: &[String], name: &str) -> bool {
    list.iter().any(|m| covers_one(m, name))
}

/// The modules a Python source imports (absolute `import a.b`, `from a.b import c`, and
/// `a.c` for `from a import c`), at most two levels deep, in order, at most 32: a plain
/// line scan, read before the run to choose its sandbox (a wrong guess costs time, never
/// correctness: every sandbox can import everything).
pub fn imports_in(src: &[u8]) -> Vec<String> {
    let src = &src[..src.len().min(MAX_SOURCE)];
    let src = String::from_utf8_lossy(src);
    let mut out: Vec<String> = Vec::new();
    let mut add = |name: &str| {
        let name = name
            .trim()
            .trim_matches(|c| c == '(' || c == ')' || c == '\\');
        let two: Vec<&str> = name.split('.').take(2).collect();
        let name = two.join(".");
        if out.len() < MAX_NAMES && valid_name(&name) && !out.contains(&name) {
            out.push(name);
        }
    };
    for line in src.lines() {
        for stmt in line.split(';') {
            let s = stmt.trim_start();
            if let Some(rest) = s.strip_prefix("import ") {
                for part in rest.split(',') {
                    if let Some(n) = part.split_whitespace().next() {
                        add(n);
                    }
                }
            } else if let Some(rest) = s.strip_prefix("from ") {
                let Some((module, names)) = rest.split_once(" import ") else {
                    continue;
                };
                let module = module.trim();
                if module.starts_with('.') || !valid_name(module) {
                    continue;
                }
                add(module);
                if !module.contains('.') {
                    for part in names.split(',') {
                        let n = part.trim().trim_matches(|c| c == '(' || c == ')');
                        if let Some(n) = n.split_whitespace().next() {
                            if n != "*" && valid_name(n) {
                                add(&format!("{module}.{n}"));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// What a call that imports `imports` needs preloaded: the `candidates` it imports (a
/// package's import wants its preloaded submodule too: `import matplotlib` wants
/// `matplotlib.pyplot`), less what another of them brings anyway (`numpy` with
/// `pandas`), in the candidates' order.
pub fn need_of(imports: &[String], candidates: &[String]) -> Vec<String> {
    let wanted: Vec<String> = candidates
        .iter()
        .filter(|m| imports.iter().any(|n| within(n, m) || within(m, n)))
        .cloned()
        .collect();
    reduce(wanted)
}

/// `list` without what another of its modules brings anyway.
fn reduce(list: Vec<String>) -> Vec<String> {
    list.iter()
        .filter(|n| !list.iter().any(|m| m != *n && covers_one(m, n)))
        .cloned()
        .collect()
}

/// Which waiting sandbox a call takes, by the kinds (preload lists) waiting, oldest first:
/// `need` is what the call needs ([`need_of`]), `None` for a session (its cells are not
/// known yet: it takes the sandbox that preloaded most). The one covering most of the
/// need, then the one preloading least beyond it; a call whose need no sandbox covers at
/// all takes a plain one, or the least preloaded. `None` only when nothing waits.
pub fn choose<'a>(
    need: Option<&[String]>,
    waiting: impl IntoIterator<Item = &'a [String]>,
) -> Option<usize> {
    let mut best: Option<(usize, (usize, std::cmp::Reverse<usize>))> = None;
    for (i, list) in waiting.into_iter().enumerate() {
        let score = match need {
            None => (list.len(), std::cmp::Reverse(0)),
            Some(need) => (
                need.iter().filter(|n| covers(list, n)).count(),
                std::cmp::Reverse(list.len()),
            ),
        };
        if best.as_ref().is_none_or(|(_, b)| score > *b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// How many waiting sandboxes of each kind a pool of `size` keeps, from the needs of its
/// recent calls (oldest first; an empty need is a plain call), each kind's modules in the
/// order of `candidates`. Plain sandboxes: `size` times the share of plain calls, at
/// least one (the cover of every call). Each preloaded kind seen: `size` times its
/// share, at least one, at most [`MAX_KINDS`] kinds (the rarest merged into one that
/// covers them all). All together at most twice `size`. Without demand, all plain.
pub fn plan(
    size: usize,
    needs: &[Vec<String>],
    candidates: &[String],
) -> Vec<(Vec<String>, usize)> {
    if size == 0 {
        return Vec::new();
    }
    let n = needs.len();
    let plain = needs.iter().filter(|x| x.is_empty()).count();
    let share = |c: usize| (size * c).div_ceil(n.max(1)).max(1);
    let plain_target = if n == 0 { size } else { share(plain) };
    let mut kinds: Vec<(Vec<String>, usize)> = Vec::new();
    for need in needs.iter().filter(|x| !x.is_empty()) {
        match kinds.iter_mut().find(|(k, _)| k == need) {
            Some(k) => k.1 += 1,
            None => kinds.push((need.clone(), 1)),
        }
    }
    // Most needed first; among equals, the one seen most recently first.
    kinds.reverse();
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    let room = (2 * size).saturating_sub(plain_target);
    let keep = kinds.len().min(room).min(MAX_KINDS);
    if keep == 0 {
        kinds.clear();
    } else if kinds.len() > keep {
        let rest: Vec<(Vec<String>, usize)> = kinds.split_off(keep - 1);
        let mut union: Vec<String> = Vec::new();
        let mut count = 0;
        for (k, c) in rest {
            count += c;
            for m in k {
                if !union.contains(&m) {
                    union.push(m);
                }
            }
        }
        union.sort_by_key(|m| candidates.iter().position(|c| c == m).unwrap_or(usize::MAX));
        kinds.push((reduce(union), count));
    }
    let mut out = vec![(Vec::new(), plain_target)];
    let mut targets: Vec<(Vec<String>, usize)> =
        kinds.into_iter().map(|(k, c)| (k, share(c))).collect();
    while targets.iter().map(|t| t.1).sum::<usize>() > room {
        match targets.iter_mut().filter(|t| t.1 > 1).max_by_key(|t| t.1) {
            Some(t) => t.1 -= 1,
            None => break,
        }
    }
    out.extend(targets);
    out
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
    #[test]
    fn imports_are_read_from_the_source() {
        let src = b"import os, numpy as np\nfrom matplotlib import pyplot as plt, cm\n\
from .local import x\nfrom scipy.stats import norm\n    import pandas.io.json  # indented\n\
x = 1; import sklearn.linear_model.base\nfrom json import *\n";
        assert_eq!(
            imports_in(src),
            s(&[
                "os",
                "numpy",
                "matplotlib",
                "matplotlib.pyplot",
                "matplotlib.cm",
                "scipy.stats",
                "pandas.io",
                "sklearn.linear_model",
                "json"
            ])
        );
        assert!(imports_in(b"print(1)\n").is_empty());
        assert!(imports_in(b"\xff\xfe import numpy").is_empty());
    }

    #[test]
    fn a_call_needs_the_candidates_it_imports_less_what_another_brings() {
        let c = s(&["numpy", "pandas", "matplotlib.pyplot", "scipy.stats"]);
        assert!(need_of(&s(&["os", "json", "requests"]), &c).is_empty());
        assert_eq!(need_of(&s(&["pandas", "numpy"]), &c), s(&["pandas"]));
        assert_eq!(need_of(&s(&["numpy.linalg"]), &c), s(&["numpy"]));
        assert_eq!(need_of(&s(&["matplotlib"]), &c), s(&["matplotlib.pyplot"]));
        assert_eq!(
            need_of(&s(&["numpy", "matplotlib.pyplot", "pandas"]), &c),
            s(&["pandas", "matplotlib.pyplot"])
        );
        assert_eq!(need_of(&s(&["scipy"]), &c), s(&["scipy.stats"]));
        assert!(covers(&s(&["pandas"]), "numpy"));
        assert!(!covers(&s(&["numpy"]), "pandas"));
        assert!(covers(&s(&["matplotlib.pyplot"]), "matplotlib"));
    }

    #[test]
    fn dispatch_takes_plain_for_plain_calls_and_the_closest_cover_otherwise() {
        let plain: Vec<String> = Vec::new();
        let pandas = s(&["pandas"]);
        let figure = s(&["matplotlib.pyplot"]);
        let both = s(&["pandas", "matplotlib.pyplot"]);
        fn w<'a>(v: &[&'a Vec<String>]) -> Vec<&'a [String]> {
            v.iter().map(|l| l.as_slice()).collect()
        }
        // A plain call: a plain sandbox while one waits, even behind preloaded ones.
        assert_eq!(choose(Some(&[]), w(&[&pandas, &both, &plain])), Some(2));
        // ... else the least preloaded (never a cold start while one waits).
        assert_eq!(choose(Some(&[]), w(&[&both, &pandas])), Some(1));
        // A pandas call: the pandas sandbox, not the one with more, not plain.
        assert_eq!(choose(Some(&pandas), w(&[&plain, &both, &pandas])), Some(2));
        assert_eq!(choose(Some(&pandas), w(&[&plain, &both])), Some(1));
        // Needs nobody covers: plain.
        assert_eq!(choose(Some(&s(&["scipy"])), w(&[&pandas, &plain])), Some(1));
        // Partly covered: the closest cover.
        assert_eq!(choose(Some(&both), w(&[&plain, &figure, &both])), Some(2));
        assert_eq!(choose(Some(&both), w(&[&plain, &figure])), Some(1));
        // A session: the most preloaded.
        assert_eq!(choose(None, w(&[&plain, &both, &pandas])), Some(1));
        assert_eq!(choose(Some(&[]), w(&[])), None);
    }

    #[test]
    fn pools_are_sized_by_their_recent_calls() {
        let c = s(&["numpy", "pandas", "matplotlib.pyplot"]);
        let plain: Vec<String> = Vec::new();
        // No demand yet, or only plain calls: all plain, nothing preloaded.
        assert_eq!(plan(2, &[], &c), vec![(plain.clone(), 2)]);
        assert_eq!(
            plan(2, &vec![plain.clone(); 20], &c),
            vec![(plain.clone(), 2)]
        );
        assert!(plan(0, &[], &c).is_empty());
        // The mix: 70 % plain, 20 % pandas, 10 % figures.
        let mut mix = vec![plain.clone(); 7];
        mix.extend(vec![s(&["pandas"]); 2]);
        mix.push(s(&["matplotlib.pyplot"]));
        assert_eq!(
            plan(2, &mix, &c),
            vec![
                (plain.clone(), 2),
                (s(&["pandas"]), 1),
                (s(&["matplotlib.pyplot"]), 1)
            ]
        );
        // Only pandas: mostly pandas, one plain.
        assert_eq!(
            plan(2, &vec![s(&["pandas"]); 10], &c),
            vec![(plain.clone(), 1), (s(&["pandas"]), 2)]
        );
        // Size 1 with two preloaded kinds: merged into one that covers both.
        let two = vec![s(&["pandas"]), s(&["matplotlib.pyplot"]), s(&["pandas"])];
        assert_eq!(
            plan(1, &two, &c),
            vec![(plain.clone(), 1), (s(&["pandas", "matplotlib.pyplot"]), 1)]
        );
        // Never more than twice the size in all.
        let many: Vec<Vec<String>> = (0..8)
            .map(|i| s(&[["numpy", "pandas", "matplotlib.pyplot", "x"][i % 4]]))
            .collect();
        let p = plan(2, &many, &s(&["numpy", "pandas", "matplotlib.pyplot", "x"]));
        assert!(p.iter().map(|k| k.1).sum::<usize>() <= 4, "{p:?}");
        assert!(p.len() <= 1 + MAX_KINDS);
    }
}
