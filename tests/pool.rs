//! The warm pool against the real daemon: containers are single-use, dead ones are replaced
//! instead of used, and nothing is left after shutdown.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use mcp_code_executor::backend::docker::{DockerBackend, DockerConfig, PoolStats, LABEL_OWNER};
use mcp_code_executor::backend::{Backend, PoolConfig};
use mcp_code_executor::job::{JobSpec, Limits, RunEvent};

/// The pool tests share the `pool` tenant label: run them one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn pooled(size: usize) -> DockerBackend {
    pooled_with(size, Limits::default()).await
}

/// A pool of `size` sandboxes for runs under `limits`.
async fn pooled_with(size: usize, limits: Limits) -> DockerBackend {
    common::sandbox().await; // the image is there
    let config = DockerConfig {
        pool: PoolConfig {
            size,
            limits,
            ..PoolConfig::default()
        },
        ..common::config()
    };
    DockerBackend::connect(config).await.expect("docker")
}

async fn wait_ready(s: &DockerBackend, n: usize) -> PoolStats {
    let t = Instant::now();
    loop {
        let st = s.pool_stats().expect("pool on");
        if st.ready >= n {
            return st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "pool never filled: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Run `code` and return (stdout, container id).
async fn run_seen(s: &DockerBackend, code: &str) -> (String, String) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let o = s
        .run(JobSpec::python(code, Limits::default()), Some(tx))
        .await
        .expect("runs");
    let mut container = String::new();
    while let Ok(ev) = rx.try_recv() {
        if let RunEvent::Created { container: c } = ev {
            container = c;
        }
    }
    assert!(o.success(), "{o:?}");
    (o.stdout_text(), container)
}

/// Shut `s` down and check that no container of this test process is left.
async fn shut_down_clean(s: DockerBackend) {
    s.shutdown().await;
    assert!(
        pool_containers().is_empty(),
        "left: {:?}",
        pool_containers()
    );
}

/// Waiting or used pool containers made by this test process (a `serve` elsewhere on the
/// daemon labels its pool containers `pool` too).
fn pool_containers() -> Vec<String> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mine = format!("{}/{}/", host.trim(), std::process::id());
    common::containers_of("pool")
        .into_iter()
        .filter(|id| {
            let out = Command::new("docker")
                .args(["inspect", "-f"])
                .arg(format!("{{{{index .Config.Labels \"{LABEL_OWNER}\"}}}}"))
                .arg(id)
                .output()
                .expect("docker inspect runs");
            String::from_utf8_lossy(&out.stdout).starts_with(&mine)
        })
        .collect()
}

#[tokio::test]
async fn pool_containers_serve_one_run_each_and_are_refilled() {
    let _g = SERIAL.lock().await;
    let s = pooled(2).await;
    wait_ready(&s, 2).await;
    let mut seen = HashSet::new();
    for i in 0..5 {
        let (out, container) = run_seen(&s, &format!("print({i})")).await;
        assert_eq!(out, format!("{i}\n"));
        assert!(
            seen.insert(container.clone()),
            "container {container} reused"
        );
        wait_ready(&s, 2).await;
    }
    let st = s.pool_stats().unwrap();
    assert_eq!(st.hits, 5, "{st:?}");
    assert_eq!(st.misses, 0, "{st:?}");
    // A job of another shape takes the cold path.
    let big = Limits {
        memory_bytes: 256 << 20,
        ..Limits::default()
    };
    let o = s
        .run(JobSpec::python("print('cold')", big), None)
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "cold\n");
    assert_eq!(s.pool_stats().unwrap().misses, 1);
    shut_down_clean(s).await;
}

/// Issue 29: a pool that runs dry (runs come faster than it refills) keeps more waiting,
/// so that the next runs find one instead of starting cold.
#[tokio::test]
async fn a_pool_found_dry_refills_deeper_and_serves_the_next_burst_warm() {
    let _g = SERIAL.lock().await;
    let s = pooled(1).await;
    wait_ready(&s, 1).await;
    // Three runs at once on a pool of one: one warm, two find it dry (each then takes a
    // sandbox being made for the pool, or starts its own when none is yet).
    let (a, b, c) = tokio::join!(
        run_seen(&s, "print(0)"),
        run_seen(&s, "print(1)"),
        run_seen(&s, "print(2)")
    );
    assert_eq!([a.0, b.0, c.0], ["0\n", "1\n", "2\n"]);
    assert!(
        a.1 != b.1 && b.1 != c.1 && a.1 != c.1,
        "a sandbox ran two jobs"
    );
    let st = s.pool_stats().unwrap();
    let (hits, misses) = (st.hits, st.misses);
    assert_eq!(misses, 2, "{st:?}");
    assert!((1..=3).contains(&hits), "{st:?}");
    assert_eq!(st.target, 2, "one more kept after the pool ran dry: {st:?}");
    wait_ready(&s, 2).await;
    // The next two at once are both served warm.
    let (a, b) = tokio::join!(run_seen(&s, "print(3)"), run_seen(&s, "print(4)"));
    assert_eq!([a.0, b.0], ["3\n", "4\n"]);
    let st = s.pool_stats().unwrap();
    shut_down_clean(s).await;
    assert_eq!((st.hits, st.misses), (hits + 2, misses), "{st:?}");
}

#[tokio::test]
async fn a_dead_pool_container_is_replaced_not_used() {
    let _g = SERIAL.lock().await;
    let s = pooled(1).await;
    wait_ready(&s, 1).await;
    let waiting = pool_containers();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let status = Command::new("docker")
        .args(["kill", &waiting[0]])
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    // Give the attach stream a moment to see the end.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (out, container) = run_seen(&s, "print('still fine')").await;
    assert_eq!(out, "still fine\n");
    assert!(
        !container.starts_with(&waiting[0]) && !waiting[0].starts_with(&container[..12]),
        "the killed container was used"
    );
    assert!(s.pool_stats().unwrap().discarded >= 1);
    shut_down_clean(s).await;
}

#[tokio::test]
async fn timeouts_and_state_do_not_leak_between_pool_runs() {
    let _g = SERIAL.lock().await;
    let s = pooled(2).await;
    wait_ready(&s, 2).await;
    let short = Limits {
        timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let o = s
        .run(
            JobSpec::python(
                "open('/tmp/secret','w').write('x')\nwhile True: pass",
                short,
            ),
            None,
        )
        .await
        .unwrap();
    assert!(o.timed_out);
    let (out, _) = run_seen(&s, "import os\nprint(os.path.exists('/tmp/secret'))").await;
    assert_eq!(out, "False\n", "a later run saw an earlier run's file");
    shut_down_clean(s).await;
}

#[tokio::test]
async fn a_changed_environment_never_gets_a_stale_pool_container() {
    let _g = SERIAL.lock().await;
    let s = pooled(2).await;
    wait_ready(&s, 2).await;
    let stale = pool_containers();
    let env = mcp_code_executor::job::RunEnv {
        vars: vec![("MCPX_MARK".into(), "new".into())],
        ..Default::default()
    };
    s.prewarm("any", &env).await;
    wait_ready(&s, 2).await;
    let mut job = JobSpec::python(
        "import os; print(os.environ.get('MCPX_MARK'))",
        Limits::default(),
    );
    job.env = env;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let o = s.run(job, Some(tx)).await.unwrap();
    assert_eq!(o.stdout_text(), "new\n");
    while let Ok(ev) = rx.try_recv() {
        if let RunEvent::Created { container } = ev {
            assert!(
                !stale.iter().any(|c| container.starts_with(c)),
                "a stale container ran"
            );
        }
    }
    assert!(s.pool_stats().unwrap().hits >= 1);
    shut_down_clean(s).await;
}

#[tokio::test]
async fn a_job_of_another_environment_never_takes_a_pool_container() {
    let _g = SERIAL.lock().await;
    let s = pooled(1).await;
    wait_ready(&s, 1).await;
    let waiting = pool_containers();
    // No prewarm: the pool still holds containers of the default environment.
    let mut job = JobSpec::python(
        "import os; print(os.environ.get('MCPX_MARK'))",
        Limits::default(),
    );
    job.env = mcp_code_executor::job::RunEnv {
        vars: vec![("MCPX_MARK".into(), "other".into())],
        ..Default::default()
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let o = s.run(job, Some(tx)).await.unwrap();
    assert_eq!(o.stdout_text(), "other\n");
    while let Ok(ev) = rx.try_recv() {
        if let RunEvent::Created { container } = ev {
            assert!(
                !waiting.iter().any(|c| container.starts_with(c)),
                "a container of the pool's environment ran a job of another"
            );
        }
    }
    let st = s.pool_stats().unwrap();
    assert_eq!((st.hits, st.misses), (0, 1), "{st:?}");
    shut_down_clean(s).await;
}

#[tokio::test]
async fn a_pool_container_killed_just_before_dispatch_still_gives_the_right_result() {
    let _g = SERIAL.lock().await;
    let s = pooled(1).await;
    for i in 0..3 {
        wait_ready(&s, 1).await;
        // The previous round's container is removed, not just dropped.
        s.drain().await;
        // Kill every waiting one: a round whose job found the pool without a live one (the
        // pool saw the death first) leaves the pool deeper (two) for the next.
        // (One the pool is still making may not run yet, on a loaded machine: `docker kill`
        // refuses it, and it is left to the pool.)
        let waiting = pool_containers();
        assert!(!waiting.is_empty(), "round {i}: {:?}", s.pool_stats());
        let mut killed = 0;
        for id in &waiting {
            let k = Command::new("docker").args(["kill", id]).output().unwrap();
            let err = String::from_utf8_lossy(&k.stderr);
            assert!(
                k.status.success() || err.contains("is not running"),
                "{k:?}"
            );
            killed += usize::from(k.status.success());
        }
        assert!(killed >= 1, "round {i}: none of {waiting:?} was running");
        // No pause: the pool may not have seen the deaths yet. Either it replaces the
        // containers, or the job finds its one dead and runs again in a fresh one; never
        // a result of a dead one.
        let (out, _) = run_seen(&s, &format!("print({i})")).await;
        assert_eq!(out, format!("{i}\n"));
    }
    shut_down_clean(s).await;
}

#[tokio::test]
async fn a_pool_container_killed_while_its_job_runs_silently_does_not_run_it_again() {
    let _g = SERIAL.lock().await;
    let s = pooled(1).await;
    wait_ready(&s, 1).await;
    // Silent code: nothing it says tells the server it ran. Its sandbox is killed from
    // outside while it sleeps; the job must end there (an error: its outcome is unknown),
    // not start over in a fresh sandbox (which would print `done` after another 6 s).
    let code = "import time\ntime.sleep(6)\nprint('done')";
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let killer = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            if let RunEvent::Created { container } = ev {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                let k = Command::new("docker").args(["kill", &container]).output();
                return k.map(|o| o.status.success()).unwrap_or(false);
            }
        }
        false
    });
    let t = Instant::now();
    let got = s
        .run(JobSpec::python(code, Limits::default()), Some(tx))
        .await;
    let took = t.elapsed();
    assert!(killer.await.unwrap(), "the test could not kill the sandbox");
    let e = got.expect_err("a killed run has no outcome");
    assert!(
        e.to_string().contains("stopped before its runner reported"),
        "{e}"
    );
    assert!(took < Duration::from_secs(6), "ran again: {took:?}");
    let st = s.pool_stats().unwrap();
    assert_eq!(st.hits, 1, "{st:?}");
    shut_down_clean(s).await;
}

#[tokio::test]
async fn memory_bombs_in_warm_sandboxes_are_reported_out_of_memory_and_run_once() {
    let _g = SERIAL.lock().await;
    let limits = Limits {
        memory_bytes: 64 << 20,
        ..Limits::default()
    };
    let s = pooled_with(1, limits.clone()).await;
    let owner = mcp_code_executor::backend::docker::owner_label(std::process::id()).unwrap();
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let code = "chunks = []\nwhile True:\n    chunks.append('x' * (8 << 20))\n";
    for _ in 0..3 {
        wait_ready(&s, 1).await;
        let o = s
            .run(JobSpec::python(code, limits.clone()), None)
            .await
            .expect("an outcome");
        assert!(o.oom_killed, "{o:?}");
    }
    let st = s.pool_stats().unwrap();
    assert_eq!((st.hits, st.misses), (3, 0), "{st:?}");
    shut_down_clean(s).await;
    // Each bomb was killed once, in the sandbox it was given: one `oom` event each (under
    // gVisor a bomb ends its whole sandbox silently, which once looked like a sandbox
    // that died before its job and ran the bomb a second time).
    let until = (std::time::SystemTime::now() + Duration::from_secs(1))
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let events = Command::new("docker")
        .args(["events", "--since", &since, "--until", &until])
        .args(["--filter", "event=oom", "--filter"])
        .arg(format!("label={LABEL_OWNER}={owner}"))
        .args(["--format", "{{.Actor.ID}}"])
        .output()
        .unwrap();
    assert!(events.status.success(), "{events:?}");
    let ooms = String::from_utf8_lossy(&events.stdout).lines().count();
    assert_eq!(ooms, 3, "{}", String::from_utf8_lossy(&events.stdout));
}

/// Under gVisor a waiting plain sandbox starts and waits at the lowest CPU weight (its
/// kernel's boot and its runner's start yield to the run in flight), and the run that
/// takes it has the default weight back while its code runs; under runc a plain one is
/// left at the default.
#[tokio::test]
async fn a_waiting_plain_sandbox_yields_the_cpu_under_gvisor_only() {
    let _g = SERIAL.lock().await;
    let s = pooled(1).await;
    wait_ready(&s, 1).await;
    let waiting = pool_containers();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let (weight, normal) = common::host_weight(&waiting[0]);
    if common::gvisor() {
        assert!(weight == "2" || weight == "1", "waiting at weight {weight}");
    } else {
        assert_eq!(weight, normal, "a plain sandbox under runc");
    }
    // The run reads nothing of the host's cgroups from inside gVisor: the host's file is
    // read while the code sleeps.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let run = s.run(
        JobSpec::python("import time\ntime.sleep(2)", Limits::default()),
        Some(tx),
    );
    let look = async {
        while let Some(ev) = rx.recv().await {
            if let RunEvent::Created { container } = ev {
                tokio::time::sleep(Duration::from_millis(1000)).await;
                return Some((container.clone(), common::host_weight(&container).0));
            }
        }
        None
    };
    let (o, seen) = tokio::join!(run, look);
    assert!(o.expect("runs").success());
    let (container, during) = seen.expect("the run's container");
    assert!(
        waiting[0].starts_with(&container[..12]),
        "{container} is not the waiting one"
    );
    assert_eq!(during, normal, "the run's own weight");
    shut_down_clean(s).await;
}
