use super::*;
use std::sync::Arc;

/// A sandbox that is alive until told otherwise, and says which one it is.
struct Fake(u32, bool);

impl Waiting for Fake {
    fn waiting_since(&mut self) -> Option<Instant> {
        self.1.then(Instant::now)
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn pool(size: usize) -> Pool<Fake> {
    Pool::new(Limits::default(), RunEnv::default(), size, "t").with_preload(s(&[
        "numpy",
        "pandas",
        "matplotlib.pyplot",
    ]))
}

/// Let the refill workers do all they would: claim and make until the plan is met.
fn fill(p: &Pool<Fake>, next: &mut u32) -> Vec<Vec<String>> {
    fill_ids(p, next).into_iter().map(|(k, _)| k).collect()
}

/// [`fill`], with the ids of the sandboxes made.
fn fill_ids(p: &Pool<Fake>, next: &mut u32) -> Vec<(Vec<String>, u32)> {
    let mut made = Vec::new();
    while let Some(kind) = p.claim() {
        *next += 1;
        p.made(&kind, Some(Fake(*next, true)));
        made.push((kind, *next));
    }
    made
}

fn take(p: &Pool<Fake>, code: &str) -> Option<Fake> {
    let imports = crate::backend::preload::imports_in(code.as_bytes());
    p.take(&Limits::default(), &RunEnv::default(), Some(&imports))
}

fn ready_of(p: &Pool<Fake>, kind: &[String]) -> usize {
    p.mix()
        .iter()
        .find(|k| k.modules == kind)
        .map_or(0, |k| k.ready)
}

#[test]
fn without_demand_a_pool_is_all_plain_and_plain_calls_keep_it_so() {
    let p = pool(2);
    let mut n = 0;
    assert_eq!(fill(&p, &mut n), vec![Vec::<String>::new(); 2]);
    for _ in 0..20 {
        assert!(take(&p, "print(1)").is_some());
        assert!(fill(&p, &mut n).iter().all(|k| k.is_empty()));
    }
    assert_eq!(p.stats().target, 2);
    assert_eq!(p.mix().len(), 1, "{:?}", p.mix());
}

#[test]
fn a_plain_call_takes_a_plain_sandbox_and_a_pandas_call_a_preloaded_one() {
    let p = pool(2);
    let mut n = 0;
    fill(&p, &mut n);
    // The first pandas call: none waits that has pandas, so a plain one (never cold).
    let first = take(&p, "import pandas as pd\nprint(1)").expect("a plain one");
    assert!(first.0 <= 2);
    let pandas: Vec<u32> = fill_ids(&p, &mut n)
        .into_iter()
        .filter(|(k, _)| k == &s(&["pandas"]))
        .map(|(_, id)| id)
        .collect();
    assert!(!pandas.is_empty(), "{:?}", p.mix());
    // A plain call never takes a pandas sandbox while a plain one waits.
    let plain = take(&p, "import os, json\nprint(1)").expect("plain");
    assert!(!pandas.contains(&plain.0));
    assert_eq!(ready_of(&p, &s(&["pandas"])), pandas.len());
    // The pandas call takes one.
    let got = take(&p, "import numpy as np\nimport pandas\n").expect("pandas");
    assert!(pandas.contains(&got.0));
    // With no plain sandbox waiting, a plain call takes a preloaded one, not cold.
    fill(&p, &mut n);
    while ready_of(&p, &[]) > 0 {
        take(&p, "print(1)").expect("plain");
    }
    assert!(ready_of(&p, &s(&["pandas"])) >= 1);
    assert!(take(&p, "print(1)").is_some());
}

#[test]
fn the_mix_follows_demand_and_a_plain_refill_never_waits_behind_imports() {
    let p = pool(2);
    let mut n = 0;
    fill(&p, &mut n);
    let calls = [
        "print(1)",
        "print(2)",
        "import pandas",
        "print(3)",
        "import matplotlib.pyplot as plt",
        "x = 1",
        "import pandas",
        "print(4)",
        "print(5)",
        "y = 2",
    ];
    for c in calls.iter().cycle().take(30) {
        take(&p, c);
        // At most two preloaded being made at once, and two plain.
        let mut claimed = Vec::new();
        while let Some(k) = p.claim() {
            claimed.push(k);
        }
        let pre = claimed.iter().filter(|k| !k.is_empty()).count();
        assert!(pre <= MAKING_PER_KIND && claimed.len() - pre <= MAKING_PER_KIND);
        for k in claimed {
            p.made(&k, Some(Fake(0, true)));
        }
        fill(&p, &mut n);
    }
    let mix = p.mix();
    let want = |k: &[&str], t: usize| {
        let m = mix
            .iter()
            .find(|m| m.modules == s(k))
            .unwrap_or_else(|| panic!("{k:?} in {mix:?}"));
        assert_eq!((m.target, m.ready), (t, t), "{mix:?}");
    };
    want(&[], 2);
    want(&["pandas"], 1);
    want(&["matplotlib.pyplot"], 1);
    // Demand moves to plain only: the preloaded kinds leave the plan, and their waiting
    // sandboxes make room when a kind lacks one.
    for _ in 0..DEMAND_WINDOW_FOR_TESTS {
        take(&p, "print(1)");
        fill(&p, &mut n);
    }
    assert_eq!(p.stats().target, 2, "{:?}", p.mix());
    // The tenant turns to pandas: the plain surplus goes, pandas sandboxes come.
    for _ in 0..DEMAND_WINDOW_FOR_TESTS {
        take(&p, "import pandas");
        fill(&p, &mut n);
    }
    assert_eq!(ready_of(&p, &s(&["pandas"])), 2, "{:?}", p.mix());
    assert_eq!(ready_of(&p, &[]), 1, "{:?}", p.mix());
}

const DEMAND_WINDOW_FOR_TESTS: usize = crate::backend::preload::DEMAND_WINDOW;

#[test]
fn a_dead_sandbox_is_never_given_and_nothing_preloads_without_candidates() {
    let p: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 1, "t");
    let mut n = 0;
    fill(&p, &mut n);
    assert!(take(&p, "import pandas").is_some());
    assert_eq!(fill(&p, &mut n), vec![Vec::<String>::new()]);
    p.made(&[], Some(Fake(99, false)));
    assert!(take(&p, "print(1)").is_some_and(|got| got.0 != 99));
    assert!(take(&p, "print(1)").is_none());
    assert_eq!(p.stats().discarded, 1);
}

#[test]
fn a_pool_told_its_runs_makes_them_all_at_once_and_never_more_than_are_left() {
    let p: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 4, "t");
    // Before: two plain ones at once, as a server's pool.
    let mut claimed = Vec::new();
    while let Some(k) = p.claim() {
        claimed.push(k);
    }
    assert_eq!(claimed.len(), MAKING_PER_KIND);
    p.expect_runs(10);
    while let Some(k) = p.claim() {
        claimed.push(k);
    }
    assert_eq!(claimed.len(), 4, "as many at once as the pool holds");
    let mut made = claimed.len();
    for k in claimed {
        p.made(&k, Some(Fake(0, true)));
    }
    let mut n = 0;
    for run in 1..=10 {
        assert!(
            take(&p, "print(1)").is_some(),
            "run {run} found one waiting"
        );
        let left = 10 - run;
        made += fill(&p, &mut n).len();
        let held = p.stats().ready;
        assert!(held <= left, "{held} held for {left} runs to come");
        assert_eq!(held, left.min(4));
    }
    assert_eq!(made, 10, "one sandbox per run, none for nothing");
    assert!(p.claim().is_none());
}

#[tokio::test]
async fn the_gate_waits_for_a_sandbox_being_made_and_promises_each_once() {
    let p: Arc<Pool<Fake>> = Arc::new(Pool::new(Limits::default(), RunEnv::default(), 2, "t"));
    // Without a count of runs the gate never waits.
    assert!(!p.pass().await);
    p.expect_runs(3);
    let a = p.claim().expect("a claim");
    let b = p.claim().expect("a claim");
    // Two runs wait for the two being made; each gets its own.
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move { p.pass().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        waiting.iter().all(|w| !w.is_finished()),
        "nothing waits yet"
    );
    p.made(&a, Some(Fake(1, true)));
    p.made(&b, Some(Fake(2, true)));
    for w in waiting {
        assert!(tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap()
            .unwrap());
    }
    assert!(take(&p, "print(1)").is_some());
    assert!(take(&p, "print(1)").is_some());
    // One run to come: the pool makes it; a failed make lets the run go its own way.
    let c = p.claim().expect("the third");
    assert!(p.claim().is_none(), "no more than the runs to come");
    let third = {
        let p = p.clone();
        tokio::spawn(async move { p.pass().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    p.made(&c, None);
    assert!(!tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .unwrap()
        .unwrap());
    // All runs taken: nothing more is made and nobody waits.
    assert!(take(&p, "print(1)").is_none());
    assert!(p.claim().is_none());
    assert!(!p.pass().await);
}

#[test]
fn a_pool_found_dry_keeps_more_plain_ones_and_gives_them_back_when_it_keeps_up() {
    let p: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 2, "t");
    let mut n = 0;
    assert_eq!(fill(&p, &mut n).len(), 2);
    assert!(take(&p, "print(1)").is_some());
    assert!(take(&p, "print(1)").is_some());
    assert!(take(&p, "print(1)").is_none(), "dry");
    assert_eq!(p.stats().target, 3, "one more after a dry run");
    assert_eq!(fill(&p, &mut n).len(), 3);
    for _ in 0..3 {
        assert!(take(&p, "print(1)").is_some());
    }
    assert!(take(&p, "print(1)").is_none());
    assert!(take(&p, "print(1)").is_none());
    assert_eq!(p.stats().target, 4, "at most twice its size");
    for _ in 0..depth::SHALLOWER_AFTER {
        fill(&p, &mut n);
        assert!(take(&p, "print(1)").is_some());
    }
    assert_eq!(
        p.stats().target,
        3,
        "one back after runs served without a miss"
    );
    // A one-shot run's pool is never deepened.
    let r: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 2, "t");
    r.expect_runs(5);
    assert!(take(&r, "print(1)").is_none());
    assert_eq!(r.stats().target, 2);
}

/// Claims made before any sandbox is made: how many the workers would make at once.
fn claims_at_once(p: &Pool<Fake>) -> Vec<Vec<String>> {
    std::iter::from_fn(|| p.claim()).take(16).collect()
}

#[test]
fn a_pool_found_dry_makes_more_plain_ones_at_once() {
    // Two plain ones at once while it keeps up: the rest of the machine is the runs'.
    let p: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 2, "t");
    assert_eq!(claims_at_once(&p).len(), 2);
    // Dry twice (under gVisor a make takes about a second): it now keeps four, and makes
    // all four at once instead of two at a time.
    assert!(take(&p, "print(1)").is_none());
    assert!(take(&p, "print(1)").is_none());
    assert_eq!(p.stats().target, 4);
    let more = claims_at_once(&p);
    assert_eq!(
        more.len(),
        2,
        "two more beside the two being made: {more:?}"
    );
    assert!(more.iter().all(|k| k.is_empty()), "plain ones: {more:?}");
}

/// Whether `settle` is still waiting after `ms` more of (paused) time.
async fn settling_after(task: &tokio::task::JoinHandle<()>, ms: u64) -> bool {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    tokio::task::yield_now().await;
    !task.is_finished()
}

#[tokio::test(start_paused = true)]
async fn a_refill_waits_a_moment_after_a_take_while_a_sandbox_waits() {
    let p: Arc<Pool<Fake>> = Arc::new(Pool::new(Limits::default(), RunEnv::default(), 3, "t"));
    let mut n = 0;
    // Never taken from: nothing to wait for.
    p.settle().await;
    fill(&p, &mut n);
    assert!(take(&p, "print(1)").is_some());
    let waiting = {
        let p = p.clone();
        tokio::spawn(async move { p.settle().await })
    };
    assert!(settling_after(&waiting, 100).await, "waits after a take");
    assert!(!settling_after(&waiting, 60).await, "at most REFILL_DEFER");

    // A take that leaves none waiting ends the wait at once.
    assert!(take(&p, "print(2)").is_some());
    let waiting = {
        let p = p.clone();
        tokio::spawn(async move { p.settle().await })
    };
    assert!(settling_after(&waiting, 10).await);
    assert!(take(&p, "print(3)").is_some());
    assert!(
        !settling_after(&waiting, 1).await,
        "the pool ran dry: refill now"
    );

    // Dry from the start: no wait at all.
    assert!(take(&p, "print(4)").is_none());
    let dry = tokio::time::Instant::now();
    p.settle().await;
    assert_eq!(dry.elapsed(), Duration::ZERO);

    // A one-shot run's pool makes what its runs need at once.
    let r: Pool<Fake> = Pool::new(Limits::default(), RunEnv::default(), 3, "t");
    r.expect_runs(5);
    fill(&r, &mut n);
    assert!(take(&r, "print(1)").is_some());
    let at = tokio::time::Instant::now();
    r.settle().await;
    assert_eq!(at.elapsed(), Duration::ZERO);
}

fn late(p: &Arc<Pool<Fake>>) -> tokio::task::JoinHandle<Option<u32>> {
    let p = p.clone();
    tokio::spawn(async move { p.take_late().await.map(|f| f.0) })
}

/// [`fill`], each make taking `ms` (the pool times its plain makes).
async fn fill_taking(p: &Pool<Fake>, next: &mut u32, ms: u64) {
    while let Some(kind) = p.claim() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        *next += 1;
        p.made(&kind, Some(Fake(*next, true)));
    }
}

/// Issue 29: a run that finds the pool dry while a plain sandbox is being made takes that
/// one once made (before any run that came after it) instead of starting its own beside
/// it, and the pool makes one more for it meanwhile (the make its cold start would have
/// been), which then waits for the next run.
#[tokio::test(start_paused = true)]
async fn a_run_that_finds_the_pool_dry_takes_a_plain_sandbox_being_made() {
    let p: Arc<Pool<Fake>> = Arc::new(Pool::new(Limits::default(), RunEnv::default(), 1, "t"));
    let mut n = 0;
    fill_taking(&p, &mut n, 400).await;
    assert!(take(&p, "print(1)").is_some());
    assert!(take(&p, "print(1)").is_none(), "dry");
    assert!(
        late(&p).await.unwrap().is_none(),
        "nothing being made: its own, at once"
    );
    // Dry twice: one more kept (see `depth`), so two are made; then the plan is met.
    let a = p.claim().expect("a refill");
    let b = p.claim().expect("one more, the pool ran dry");
    assert!(a.is_empty() && b.is_empty());
    assert!(p.claim().is_none(), "the plan is met");
    assert!(take(&p, "print(1)").is_none(), "still dry");
    let first = late(&p);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!first.is_finished(), "it waits for one being made");
    let c = p.claim().expect("one more for the run that waits");
    assert!(c.is_empty());
    assert!(p.claim().is_none());
    p.made(&a, Some(Fake(100, true)));
    assert!(
        take(&p, "print(1)").is_none(),
        "the run that waited gets it, not one that came after"
    );
    assert_eq!(first.await.unwrap(), Some(100));
    p.made(&b, Some(Fake(101, true)));
    p.made(&c, Some(Fake(102, true)));
    assert_eq!(take(&p, "print(1)").map(|f| f.0), Some(101));
    let st = p.stats();
    assert_eq!((st.hits, st.misses, st.ready), (3, 3, 1), "{st:?}");
}

/// A run waits only for a plain make (a preloading one imports for seconds), only while
/// more are being made than runs wait for them, and only as long as a plain make lately
/// took; a failed make ends the wait at once. Each time it then starts its own.
#[tokio::test(start_paused = true)]
async fn a_run_waits_for_a_make_only_when_it_is_plain_spare_and_soon() {
    let p: Arc<Pool<Fake>> = Arc::new(pool(2));
    let mut n = 0;
    fill_taking(&p, &mut n, 300).await;
    // Pandas demand: the plan takes in a preloaded sandbox.
    for _ in 0..4 {
        assert!(take(&p, "import pandas").is_some());
        fill_taking(&p, &mut n, 300).await;
    }
    while take(&p, "import pandas").is_some() {}
    let kinds: Vec<Vec<String>> = std::iter::from_fn(|| p.claim()).collect();
    let (plain, preloaded): (Vec<_>, Vec<_>) = kinds.into_iter().partition(|k| k.is_empty());
    assert!(!preloaded.is_empty(), "{plain:?} {preloaded:?}");
    for k in &plain {
        p.made(k, Some(Fake(1, true)));
    }
    while take(&p, "print(1)").is_some() {}
    // Only preloading makes in flight: no wait.
    assert!(late(&p).await.unwrap().is_none());
    for k in &preloaded {
        p.made(k, Some(Fake(2, true)));
    }
    while take(&p, "print(1)").is_some() {}
    // Plain makes in flight (the preloaded ones made and taken): as many runs wait as
    // there are of them, and no more.
    let claimed: Vec<Vec<String>> = std::iter::from_fn(|| p.claim()).collect();
    let (making, preloaded): (Vec<_>, Vec<_>) = claimed.into_iter().partition(|k| k.is_empty());
    assert!(!making.is_empty(), "{making:?}");
    for k in &preloaded {
        p.made(k, Some(Fake(3, true)));
    }
    while take(&p, "print(1)").is_some() {}
    let began = tokio::time::Instant::now();
    let mut waiting = Vec::new();
    for _ in &making {
        waiting.push(late(&p));
        tokio::task::yield_now().await;
    }
    assert!(
        late(&p).await.unwrap().is_none(),
        "one run waiting per make"
    );
    // Nothing comes: each gives up after twice what a plain make lately took (at most
    // 2 x 300 ms: the depth's early makes timed 0).
    for w in waiting {
        assert!(w.await.unwrap().is_none());
    }
    let waited = began.elapsed();
    assert!(
        waited > Duration::from_millis(50) && waited <= Duration::from_millis(600),
        "{waited:?}"
    );
    // A failed make ends the wait at once.
    let second = late(&p);
    tokio::task::yield_now().await;
    let began = tokio::time::Instant::now();
    p.made(&making[0], None);
    assert!(second.await.unwrap().is_none());
    assert!(began.elapsed() < Duration::from_millis(10));
}
