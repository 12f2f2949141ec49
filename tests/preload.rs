//! Preloading against the real daemon (docs/mcp.md "Preloading"): a pool sandbox's
//! interpreter imports its list before the job comes, and nothing but time changes. A call
//! takes the waiting sandbox its code's imports need (plain code a plain one), and a pool
//! makes preloaded sandboxes only for what its recent calls imported. Each test uses
//! per-tenant pools under its own tenant label, so they run in parallel.

mod common;

use std::time::{Duration, Instant};

use mcp_code_executor::backend::docker::{DockerBackend, DockerConfig};
use mcp_code_executor::backend::preload::PreloadConfig;
use mcp_code_executor::backend::Backend;
use mcp_code_executor::backend::{image, PoolConfig};
use mcp_code_executor::job::{JobSpec, Limits, Outcome, RunEnv};

const PANDAS: &str = "import pandas as pd\n\
df = pd.DataFrame({'a': [1, 2, 3], 'b': [0.5, 1.5, 2.5]})\n\
print(df.sum().a)\n\
print(df.describe().to_string())\n";

/// Is `module` already imported when the user's code starts? The one thing a preload lets
/// the code see (besides time): how these tests know the preload happened. The code names
/// `module` (and `also`) in import statements it never runs, so that it is dispatched as
/// code that needs them (the dispatch reads the source).
fn probe(module: &str) -> String {
    probe_also(module, &[])
}

fn probe_also(module: &str, also: &[&str]) -> String {
    let mut code =
        format!("import sys\nprint('PRELOADED' if {module:?} in sys.modules else 'COLD')\n");
    for m in std::iter::once(&module).chain(also) {
        code.push_str(&format!("if False:\n    import {m}\n"));
    }
    code
}

fn modules(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A backend with one pool per tenant of `size` sandboxes preloading `preload`.
async fn backend(preload: PreloadConfig, size: usize) -> DockerBackend {
    common::sandbox().await; // the image is there
    let config = DockerConfig {
        pool: PoolConfig {
            size,
            per_tenant: true,
            ..PoolConfig::default()
        },
        preload,
        ..DockerConfig::new(image::default_image())
    };
    DockerBackend::connect(config).await.expect("docker")
}

/// Run `code` for `tenant` as a usual run (it keeps the tenant's pool warm).
async fn run(s: &DockerBackend, tenant: &str, code: &str, limits: &Limits) -> Outcome {
    let mut job = JobSpec::python(code, limits.clone());
    job.tenant = tenant.to_string();
    job.keep_warm = true;
    s.run(job, None)
        .await
        .unwrap_or_else(|e| panic!("infrastructure error running {code:?}: {e}"))
}

/// Wait until the tenant's pool has a waiting sandbox (made with its current list).
async fn wait_warm(s: &DockerBackend) {
    let t = Instant::now();
    loop {
        let st = s.pool_stats().expect("pool on");
        if st.ready >= 1 {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the pool never filled: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until the tenant's pool has a sandbox waiting that preloads all of `modules`
/// (its calls needed them: see `DockerBackend::pool_mix`).
async fn wait_kind(s: &DockerBackend, tenant: &str, modules: &[&str]) {
    let t = Instant::now();
    loop {
        let mix = s.pool_mix(tenant).expect("the tenant's pool");
        if mix
            .iter()
            .any(|k| k.ready >= 1 && modules.iter().all(|m| k.modules.iter().any(|n| n == m)))
        {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no sandbox preloading {modules:?} ever waited: {mix:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many of the tenant's sandboxes preloading exactly `modules` wait.
fn ready_of(s: &DockerBackend, tenant: &str, modules: &[&str]) -> usize {
    s.pool_mix(tenant)
        .expect("the tenant's pool")
        .iter()
        .filter(|k| k.modules == self::modules(modules))
        .map(|k| k.ready)
        .sum()
}

/// A run from a warm pool sandbox: the pool is started by a first run, filled, then used.
async fn warm_run(s: &DockerBackend, tenant: &str, code: &str, limits: &Limits) -> Outcome {
    wait_warm(s).await;
    let hits = s.pool_stats().expect("pool on").hits;
    let o = run(s, tenant, code, limits).await;
    assert_eq!(
        s.pool_stats().expect("pool on").hits,
        hits + 1,
        "the run did not come from the pool"
    );
    o
}

fn ok(o: &Outcome) -> String {
    assert!(o.success(), "{o:?}");
    o.stdout_text()
}

#[tokio::test]
async fn a_preloaded_pandas_run_gives_the_same_output_as_a_cold_one() {
    let tenant = "t-preload-same";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let cold = common::sandbox().await;
    let s = backend(PreloadConfig::server_default(), 1).await;
    // The first run starts the tenant's pool (it runs cold itself), and says pandas is
    // needed: the pool makes a sandbox that preloads it.
    assert_eq!(
        ok(&run(&s, tenant, &probe("pandas"), &limits).await).trim(),
        "COLD"
    );
    wait_kind(&s, tenant, &["pandas"]).await;
    assert_eq!(
        ok(&warm_run(&s, tenant, &probe("pandas"), &limits).await).trim(),
        "PRELOADED"
    );

    wait_kind(&s, tenant, &["pandas"]).await;
    let warm = warm_run(&s, tenant, PANDAS, &limits).await;
    let mut job = JobSpec::python(PANDAS, limits.clone());
    job.tenant = tenant.to_string();
    let reference = cold.run(job, None).await.expect("cold run");
    assert_eq!(ok(&warm), ok(&reference));
    assert_eq!(warm.stderr, reference.stderr);

    // The figure: the sandbox's backend and show() hook as without preloading.
    let fig =
        "import matplotlib\nimport matplotlib.pyplot as plt\nprint(matplotlib.get_backend())\n\
print(plt.get_fignums())\nplt.plot([1, 2, 3]); print(plt.gcf().number); plt.show()\n\
print(plt.get_fignums(), plt.figure().number)\n";
    // A figure call: the pool (of one sandbox besides plain) learns to preload pyplot too.
    run(&s, tenant, fig, &limits).await;
    wait_kind(&s, tenant, &["matplotlib.pyplot"]).await;
    assert_eq!(
        ok(&warm_run(&s, tenant, &probe("matplotlib.pyplot"), &limits).await).trim(),
        "PRELOADED"
    );
    wait_kind(&s, tenant, &["matplotlib.pyplot"]).await;
    let warm = warm_run(&s, tenant, fig, &limits).await;
    let mut job = JobSpec::python(fig, limits.clone());
    job.tenant = tenant.to_string();
    let reference = cold.run(job, None).await.expect("cold run");
    assert_eq!(ok(&warm), ok(&reference));
    assert_eq!(warm.artifacts.len(), 2, "{warm:?}");
    assert_eq!(reference.artifacts.len(), 2);
    assert!(warm.artifacts[0].data.starts_with(b"\x89PNG"));
    // The preload's warm-up figure left nothing behind: the same numbers, the same names
    // (the figure still open at the end is saved as the second, as in a cold run).
    assert_eq!(ok(&warm), "module://mcp_backend\n[]\n1\n[] 1\n");
    let names = |o: &Outcome| {
        o.artifacts
            .iter()
            .map(|a| a.name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&warm), names(&reference));

    // cpu_ms is the run's, not the preload's nor what the waiting interpreter used (numpy's
    // BLAS threads spin for a while after the import): a preloaded print(1) that waited
    // reports about what a cold one does (its interpreter's start-up included), not the
    // 50 ms and more it used to.
    let one = "print(1)\nif False:\n    import pandas\n";
    wait_kind(&s, tenant, &["pandas"]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let warm = warm_run(&s, tenant, one, &limits).await;
    let mut job = JobSpec::python(one, limits.clone());
    job.tenant = tenant.to_string();
    let reference = cold.run(job, None).await.expect("cold run");
    let (w, c) = (
        warm.cpu_ms.expect("cpu_ms"),
        reference.cpu_ms.expect("cpu_ms"),
    );
    eprintln!("cpu_ms of print(1): preloaded {w}, cold {c}");
    assert!(
        w <= c + 20,
        "preloaded print(1) reports {w} ms of CPU, a cold one {c}"
    );

    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
    common::assert_clean(&cold, tenant).await;
}

#[tokio::test]
async fn two_sandboxes_print_different_random_numbers() {
    let tenant = "t-preload-random";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(
        PreloadConfig {
            modules: modules(&["numpy"]),
            ..PreloadConfig::off()
        },
        2,
    )
    .await;
    let code =
        "import sys\nprint('numpy' in sys.modules)\nimport numpy as np\nprint(np.random.rand())\n";
    // Two calls that need numpy: the pool makes numpy sandboxes for them.
    run(&s, tenant, code, &limits).await;
    run(&s, tenant, code, &limits).await;
    wait_kind(&s, tenant, &["numpy"]).await;
    let a = ok(&warm_run(&s, tenant, code, &limits).await);
    wait_kind(&s, tenant, &["numpy"]).await;
    let b = ok(&warm_run(&s, tenant, code, &limits).await);
    assert!(
        a.starts_with("True\n") && b.starts_with("True\n"),
        "{a} {b}"
    );
    assert_ne!(a, b, "two sandboxes drew the same numbers");
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

#[tokio::test]
async fn a_module_missing_from_the_environment_does_not_fail_a_run() {
    let tenant = "t-preload-missing";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(
        PreloadConfig {
            modules: modules(&["no_such_module_xyz", "numpy", "no_such_pkg.sub"]),
            ..PreloadConfig::off()
        },
        1,
    )
    .await;
    let code = probe_also("numpy", &["no_such_module_xyz", "no_such_pkg.sub"]);
    run(&s, tenant, &code, &limits).await;
    wait_kind(&s, tenant, &["numpy"]).await;
    let o = warm_run(&s, tenant, &code, &limits).await;
    assert_eq!(ok(&o).trim(), "PRELOADED");
    assert!(o.stderr.is_empty(), "{}", o.stderr_text());
    // The pool says it once and preloads only what the environment has from then on.
    assert_eq!(s.preload_list(tenant), Some(modules(&["numpy"])));
    let o = warm_run(&s, tenant, "import no_such_module_xyz", &limits).await;
    assert!(!o.success());
    assert!(o.stderr_text().contains("ModuleNotFoundError"), "{o:?}");
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

#[tokio::test]
async fn a_preload_that_does_not_fit_under_max_memory_is_dropped_without_failing_runs() {
    let tenant = "t-preload-memory";
    let _clean = common::remove_on_drop(tenant);
    // A tenant's max_memory of 64m: half of it is the preload's budget, which numpy fits
    // (about 15 MiB here) and numpy + pandas (about 38 MiB) do not.
    let limits = Limits {
        memory_bytes: 64 << 20,
        ..Limits::default()
    };
    let s = backend(PreloadConfig::server_default(), 1).await;
    let code = probe_also("pandas", &["matplotlib.pyplot"]);
    run(&s, tenant, &code, &limits).await;
    wait_kind(&s, tenant, &["pandas", "matplotlib.pyplot"]).await;
    let o = warm_run(&s, tenant, &code, &limits).await;
    assert_eq!(
        ok(&o).trim(),
        "COLD",
        "pandas was preloaded over the budget"
    );
    let list = s.preload_list(tenant).expect("the tenant's pool");
    assert!(
        !list.contains(&"pandas".to_string()) && !list.contains(&"matplotlib.pyplot".to_string()),
        "{list:?}"
    );
    // The runs go on, and the code may still import what was dropped.
    let o = warm_run(&s, tenant, PANDAS, &limits).await;
    assert!(ok(&o).starts_with("6.0\n"), "{o:?}");

    // A list that does not fit at all (1% of the limit): nothing is preloaded, runs work.
    let s2 = backend(
        PreloadConfig {
            modules: modules(&["numpy"]),
            memory_percent: 1,
            ..PreloadConfig::off()
        },
        1,
    )
    .await;
    let tenant2 = "t-preload-memory2";
    let _clean2 = common::remove_on_drop(tenant2);
    run(&s2, tenant2, &probe("numpy"), &limits).await;
    wait_kind(&s2, tenant2, &["numpy"]).await;
    let o = warm_run(&s2, tenant2, &probe("numpy"), &limits).await;
    assert_eq!(ok(&o).trim(), "COLD");
    assert_eq!(s2.preload_list(tenant2), Some(Vec::new()));
    s.shutdown().await;
    s2.shutdown().await;
    common::assert_clean(&s, tenant).await;
    common::assert_clean(&s2, tenant2).await;
}

#[tokio::test]
async fn learned_modules_appear_after_runs_import_them_and_never_one_the_environment_lacks() {
    let tenant = "t-preload-learn";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(
        PreloadConfig {
            learn: true,
            ..PreloadConfig::off()
        },
        1,
    )
    .await;
    let env = RunEnv::default();
    // A module of the workspace, the standard library, modules nobody has (one imported,
    // one only written where an older runner read the imported names), and scipy.stats,
    // which the image has and no list names.
    let code = "open('mymod_local.py', 'w').write('X = 1\\n')\n\
import mymod_local, json\n\
try:\n    import no_such_module_xyz\nexcept ImportError:\n    pass\n\
__import__('os').write(4, b'I fakemod_zz\\n')\n\
import scipy.stats\nprint(scipy.stats.norm.cdf(0))\n";
    for _ in 0..3 {
        assert_eq!(ok(&run(&s, tenant, code, &limits).await).trim(), "0.5");
    }
    let learned = s.learned_preloads(tenant, &env);
    assert!(learned.contains(&"scipy.stats".to_string()), "{learned:?}");
    for bad in [
        "mymod_local",
        "json",
        "os",
        "no_such_module_xyz",
        "fakemod_zz",
    ] {
        assert!(
            !learned.contains(&bad.to_string()),
            "{bad} learned: {learned:?}"
        );
    }
    let list = s.preload_list(tenant).expect("the tenant's pool");
    assert!(list.contains(&"scipy.stats".to_string()), "{list:?}");
    // The pool's next sandboxes preload it: wait until one made with the new list waits
    // (the one made before may still be there: use it up).
    wait_kind(&s, tenant, &["scipy.stats"]).await;
    let mut preloaded = false;
    for _ in 0..3 {
        let o = warm_run(&s, tenant, &probe("scipy.stats"), &limits).await;
        if ok(&o).trim() == "PRELOADED" {
            preloaded = true;
            break;
        }
    }
    assert!(preloaded, "scipy.stats was never preloaded");
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

#[tokio::test]
async fn a_session_opened_on_a_pool_sandbox_has_its_first_cell_preloaded() {
    let tenant = "t-preload-session";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(PreloadConfig::server_default(), 1).await;
    // The tenant's calls import pandas; a session takes the most preloaded sandbox.
    run(&s, tenant, PANDAS, &limits).await;
    wait_kind(&s, tenant, &["pandas"]).await;
    let hits = s.pool_stats().expect("pool on").hits;
    let mut job = JobSpec::python("", limits.clone());
    job.files.clear();
    job.tenant = tenant.to_string();
    job.keep_warm = true;
    let mut session = s.open_session(job).await.expect("session");
    assert_eq!(s.pool_stats().expect("pool on").hits, hits + 1);
    let o = session
        .exec(&probe("pandas"), Duration::from_secs(60), None)
        .await
        .expect("cell");
    assert_eq!(ok(&o).trim(), "PRELOADED");
    let o = session
        .exec(
            "import pandas as pd\npd.DataFrame({'a': [1, 2]}).sum().a",
            Duration::from_secs(60),
            None,
        )
        .await
        .expect("cell");
    assert_eq!(ok(&o), "3\n");
    drop(session);
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

/// A waiting preloading sandbox has the lowest CPU weight (its imports yield to the server,
/// the daemon and the runs); the run that takes it has the default weight back before its
/// code starts.
#[tokio::test]
async fn a_waiting_preloading_sandbox_yields_the_cpu_and_its_run_gets_it_back() {
    let tenant = "t-preload-weight";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(PreloadConfig::server_default(), 1).await;
    run(&s, tenant, PANDAS, &limits).await; // starts the tenant's pool, needs pandas
    wait_kind(&s, tenant, &["pandas"]).await;
    let ids: Vec<String> = common::own_containers_of(tenant)
        .into_iter()
        .filter(|id| preloads_of(id).is_some())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let (weight, normal) = common::host_weight(&ids[0]);
    assert!(weight == "2" || weight == "1", "waiting at weight {weight}");
    let code = "import os\nif False:\n    import pandas\n\
ps = ['/sys/fs/cgroup/cpu/cpu.shares', '/sys/fs/cgroup/cpu,cpuacct/cpu.shares', '/sys/fs/cgroup/cpu.weight']\n\
print(next(open(p).read().strip() for p in ps if os.path.exists(p)))\n";
    let o = warm_run(&s, tenant, code, &limits).await;
    assert_eq!(ok(&o).trim(), normal, "the run's own weight");
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

/// What container `id` was made to preload (its `MCPX_PRELOAD`); `None`: a plain one.
fn preloads_of(id: &str) -> Option<String> {
    let out = std::process::Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{range .Config.Env}}{{println .}}{{end}}",
            id,
        ])
        .output()
        .expect("docker inspect runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("MCPX_PRELOAD=").map(str::to_string))
}

/// Issue 29: plain code takes a plain sandbox while one waits (the preloaded one is left
/// for the code that needs it), and pandas code takes the one that preloaded pandas.
#[tokio::test]
async fn a_plain_call_takes_a_plain_sandbox_and_a_pandas_call_a_preloaded_one() {
    let tenant = "t-preload-dispatch";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(PreloadConfig::server_default(), 2).await;
    // The first call imports pandas: the pool makes a sandbox that preloads it.
    assert_eq!(
        ok(&run(&s, tenant, &probe("pandas"), &limits).await).trim(),
        "COLD"
    );
    wait_kind(&s, tenant, &["pandas"]).await;
    // Use up the plain sandboxes made before it, so that the pandas one is the oldest
    // waiting (first in line, were sandboxes taken in order), then wait for a new plain one.
    while ready_of(&s, tenant, &[]) > 0 {
        ok(&run(&s, tenant, "print(0)", &limits).await);
    }
    let t = Instant::now();
    while ready_of(&s, tenant, &[]) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{:?}",
            s.pool_mix(tenant)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ready_of(&s, tenant, &["pandas"]) >= 1,
        "{:?}",
        s.pool_mix(tenant)
    );
    // Plain code (the standard library only): a plain sandbox, pandas not loaded (a
    // sandbox that preloads pandas has it in sys.modules before the code starts). The
    // number of pandas sandboxes waiting is not compared: the pool may retire a surplus
    // one meanwhile, as its demand (mostly plain calls here) asks fewer.
    let plain = "import sys, json, os\nprint('pandas' in sys.modules, 'numpy' in sys.modules)\n";
    assert_eq!(
        ok(&warm_run(&s, tenant, plain, &limits).await).trim(),
        "False False"
    );
    assert!(
        ready_of(&s, tenant, &["pandas"]) >= 1,
        "{:?}",
        s.pool_mix(tenant)
    );
    // Code that imports pandas: the preloaded one.
    assert_eq!(
        ok(&warm_run(&s, tenant, &probe("pandas"), &limits).await).trim(),
        "PRELOADED"
    );
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

/// Issue 29: each tenant's pool holds what its own calls need. A tenant whose calls never
/// import pandas never has a sandbox made that preloads anything; one whose calls do gets
/// preloaded sandboxes next to plain ones.
#[tokio::test]
async fn the_pool_mix_follows_each_tenant_s_demand() {
    let plain_t = "t-preload-mix-plain";
    let data_t = "t-preload-mix-data";
    let _c1 = common::remove_on_drop(plain_t);
    let _c2 = common::remove_on_drop(data_t);
    let limits = Limits::default();
    let s = backend(PreloadConfig::server_default(), 2).await;
    for i in 0..4 {
        ok(&run(&s, plain_t, &format!("import json\nprint({i})"), &limits).await);
        ok(&run(&s, data_t, PANDAS, &limits).await);
    }
    wait_kind(&s, data_t, &["pandas"]).await;
    let t = Instant::now();
    while ready_of(&s, plain_t, &[]) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{:?}",
            s.pool_mix(plain_t)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mix = s.pool_mix(plain_t).unwrap();
    assert!(mix.iter().all(|k| k.modules.is_empty()), "{mix:?}");
    for id in common::own_containers_of(plain_t) {
        assert_eq!(
            preloads_of(&id),
            None,
            "a plain tenant's sandbox {id} preloads"
        );
    }
    // The pandas tenant: mostly pandas sandboxes, a plain one as the cover of other code.
    let mix = s.pool_mix(data_t).unwrap();
    let pandas = mix
        .iter()
        .find(|k| k.modules == modules(&["pandas"]))
        .expect("a pandas kind");
    let plain = mix
        .iter()
        .find(|k| k.modules.is_empty())
        .expect("a plain kind");
    // One plain as the cover; two when a burst found the pool dry on a loaded machine
    // (a dry pool refills deeper), never more plain than pandas.
    assert!(
        pandas.target >= 2 && (1..=pandas.target).contains(&plain.target),
        "{mix:?}"
    );
    assert!(
        common::own_containers_of(data_t)
            .iter()
            .any(|id| preloads_of(id).as_deref() == Some("pandas")),
        "no container of the data tenant preloads pandas"
    );
    s.shutdown().await;
    common::assert_clean(&s, plain_t).await;
    common::assert_clean(&s, data_t).await;
}

/// Open a session of `tenant` for its first cell `first` (whose imports choose the sandbox).
async fn open_for(
    s: &DockerBackend,
    tenant: &str,
    first: &str,
    limits: &Limits,
) -> Box<dyn mcp_code_executor::backend::Session> {
    let mut job = JobSpec::python("", limits.clone());
    job.files.clear();
    job.tenant = tenant.to_string();
    job.keep_warm = true;
    job.first_cell = Some(first.to_string());
    s.open_session(job).await.expect("session")
}

async fn cell(session: &mut Box<dyn mcp_code_executor::backend::Session>, code: &str) -> String {
    let o = session
        .exec(code, Duration::from_secs(60), None)
        .await
        .expect("cell");
    ok(&o).trim().to_string()
}

/// Issue 43: a session's first cell chooses its sandbox as a run's code does (plain code a
/// plain one while a preloaded one waits; pandas the one that preloaded it, whose
/// interpreter, waiting since before the session, runs the cells: nothing is imported
/// again), and sessions' first cells alone make the pool keep what they import.
#[tokio::test]
async fn a_session_s_first_cell_chooses_its_sandbox_and_counts_in_the_demand() {
    let tenant = "t-preload-session-first";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(PreloadConfig::server_default(), 2).await;
    // No run at all: a session whose first cell imports pandas starts the tenant's pool
    // (cold: nothing waited yet), and its demand makes the pool preload pandas.
    let mut first = open_for(&s, tenant, &probe("pandas"), &limits).await;
    assert_eq!(cell(&mut first, &probe("pandas")).await, "COLD");
    drop(first);
    wait_kind(&s, tenant, &["pandas"]).await;
    let t = Instant::now();
    while ready_of(&s, tenant, &[]) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{:?}",
            s.pool_mix(tenant)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A plain first cell: a plain sandbox, although a pandas one waits (a session without
    // a first cell takes the most preloaded).
    let plain = "import sys, json, os\nprint('pandas' in sys.modules, 'numpy' in sys.modules)\n";
    let hits = s.pool_stats().expect("pool on").hits;
    let mut p = open_for(&s, tenant, plain, &limits).await;
    assert_eq!(s.pool_stats().expect("pool on").hits, hits + 1);
    assert_eq!(cell(&mut p, plain).await, "False False");
    drop(p);
    // A pandas first cell: the pandas sandbox. Its cells run in the interpreter that
    // preloaded pandas while the sandbox waited: one started seconds before the session
    // opened (a second interpreter started for the session would be younger than the
    // wait), with pandas in sys.modules before the cell.
    wait_kind(&s, tenant, &["pandas"]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let hits = s.pool_stats().expect("pool on").hits;
    let age = "import os\nif False:\n    import pandas\n\
up = float(open('/proc/uptime').read().split()[0])\n\
start = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\n\
print(round(up - start / os.sysconf('SC_CLK_TCK'), 2))\n";
    let mut p = open_for(&s, tenant, age, &limits).await;
    assert_eq!(s.pool_stats().expect("pool on").hits, hits + 1);
    let age: f64 = cell(&mut p, age).await.parse().expect("an age");
    assert!(age > 2.5, "the session's interpreter is {age} s old");
    assert_eq!(cell(&mut p, &probe("pandas")).await, "PRELOADED");
    drop(p);
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}

/// Issue 43: what a session's later cells import is learned as a run's imports are: two
/// sessions that import `scipy.stats` after a plain first cell put it on the pool's list,
/// the next session asks for it with its first cell's imports (so the pool makes such a
/// sandbox), and the one after opens with `scipy.stats` already imported.
#[tokio::test]
async fn what_sessions_import_after_their_first_cell_is_learned() {
    let tenant = "t-preload-session-later";
    let _clean = common::remove_on_drop(tenant);
    let limits = Limits::default();
    let s = backend(PreloadConfig::server_default(), 1).await;
    for _ in 0..2 {
        let mut p = open_for(&s, tenant, "x = 1", &limits).await;
        assert_eq!(cell(&mut p, "x = 1").await, "");
        assert_eq!(
            cell(&mut p, "import scipy.stats\nprint(scipy.stats.norm.cdf(0))").await,
            "0.5"
        );
    }
    let list = s.preload_list(tenant).expect("the tenant's pool");
    assert!(list.contains(&"scipy.stats".to_string()), "{list:?}");
    let sys = "import sys\nprint('scipy.stats' in sys.modules)";
    drop(open_for(&s, tenant, sys, &limits).await);
    wait_kind(&s, tenant, &["scipy.stats"]).await;
    let mut p = open_for(&s, tenant, sys, &limits).await;
    assert_eq!(cell(&mut p, sys).await, "True");
    drop(p);
    s.shutdown().await;
    common::assert_clean(&s, tenant).await;
}
