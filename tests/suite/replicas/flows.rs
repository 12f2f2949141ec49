//! The flows through a balancer without affinity, a `kill -9`, SIGTERM, and the same flows
//! on the Kubernetes backend (see the parent module's doc).

use super::*;

#[tokio::test]
async fn sdk_flows_twenty_times_through_a_balancer_without_affinity() {
    let c = Cluster::start("flows", &["--max-sessions", "48"]).await;
    let t0 = Instant::now();
    let out = script(vec!["flows".into(), c.lb("/mcp"), "20".into()]).await;
    eprintln!("{out}flows took {:.1} s", t0.elapsed().as_secs_f64());
    assert!(out.contains("ok: auto 2026-07-28 x20"), "{out}");
    assert!(out.contains("ok: legacy 2025-11-25 x20"), "{out}");
    assert!(out.contains("ok: tasks x20"), "{out}");
    // Round robin spread the calls: each replica sent some to the other.
    for r in &c.replicas {
        let n = metric(r, "mcp_executor_forwarded_total").await;
        assert!(n > 0.0, "replica {} forwarded nothing:\n{}", r.id, r.log());
    }
    // The replicas' own endpoint and header are not for clients: a wrong secret is refused,
    // and without one the internal path does not exist.
    let http = reqwest::Client::new();
    let r = http
        .post(c.lb("/mcp"))
        .header("X-Mcp-Executor-Forwarded", "guessed")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = http.get(c.lb("/internal/replica")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // The forwarding overhead: the same call on its owner and through the other replica.
    let out = script(vec![
        "overhead".into(),
        c.replicas[0].url("/mcp"),
        c.replicas[1].url("/mcp"),
        "200".into(),
    ])
    .await;
    let p50: Value = serde_json::from_str(out.trim()).expect("p50s as JSON");
    let (owner, fwd) = (
        p50["owner"].as_f64().unwrap(),
        p50["forwarded"].as_f64().unwrap(),
    );
    eprintln!(
        "forwarding overhead, read_file on a session, p50 of 100 each: on the owner {owner:.2} ms, \
         forwarded {fwd:.2} ms, overhead {:.2} ms",
        fwd - owner
    );
    assert!(fwd - owner < 25.0, "forwarding costs {} ms", fwd - owner);
}

#[tokio::test]
async fn a_killed_replica_costs_only_its_own_handles_and_the_survivor_sweeps_it() {
    let mut c = Cluster::start("kill", &["--sweep-every", "2"]).await;
    let (dead_id, dead_pid) = (c.replicas[0].id.clone(), c.replicas[0].pid);
    let out = script(vec!["session".into(), c.lb("/mcp"), dead_id.clone()]).await;
    let lines: Vec<String> = out.lines().map(str::to_string).collect();
    let (sid, path, tid) = (&lines[0], &lines[1], &lines[2]);
    assert!(sid.starts_with(&format!("s_{dead_id}_")), "{sid}");
    let lb = c.lb("/mcp");
    let call = || {
        script(vec![
            "call".into(),
            lb.clone(),
            sid.clone(),
            path.clone(),
            tid.clone(),
        ])
    };
    // Two servers, one daemon: the other replica sweeps every 2 s; after a few sweeps the
    // live replica's sandboxes (its session, its running task, its pool) are all there.
    let before = common::containers_left_by(dead_pid, true);
    assert!(
        before.len() >= 2,
        "the replica's session and task containers: {before:?}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = common::containers_left_by(dead_pid, true);
    for id in &before {
        assert!(
            after.contains(id),
            "a live replica's container {id} was removed by the other's sweep"
        );
    }
    let alive: Value = serde_json::from_str(call().await.trim()).unwrap();
    assert_eq!(alive["session"]["is_error"], false, "{alive}");
    assert!(
        alive["session"]["text"].as_str().unwrap().contains("42"),
        "{alive}"
    );
    assert_eq!(alive["task"]["status"], "working", "{alive}");

    c.replicas[0].signal(libc::SIGKILL);
    let _ = c.replicas[0].child.wait().await;
    let gone: Value = serde_json::from_str(call().await.trim()).unwrap();
    let text = gone["session"]["text"].as_str().unwrap();
    assert_eq!(gone["session"]["is_error"], true, "{gone}");
    for words in [
        "is gone",
        &dead_id,
        "variables",
        "Kept",
        "without session_id",
    ] {
        assert!(text.contains(words), "{words:?} not in {text}");
    }
    assert_eq!(gone["stored"]["is_error"], false, "{gone}");
    assert!(
        gone["stored"]["text"]
            .as_str()
            .unwrap()
            .contains("stored survives"),
        "{gone}"
    );
    assert_eq!(gone["new"]["is_error"], false, "{gone}");
    assert!(
        gone["new"]["text"].as_str().unwrap().contains('2'),
        "{gone}"
    );
    let task_error = gone["task"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        task_error.contains("is gone") && task_error.contains(&dead_id),
        "{gone}"
    );
    // The survivor's next sweeps remove everything the dead replica left.
    let t0 = Instant::now();
    loop {
        let left = common::containers_left_by(dead_pid, true);
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the killed replica's containers are still there: {left:?}\n{}",
            c.replicas[1].log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let n = metric(&c.replicas[1], "mcp_executor_owner_gone_total").await;
    assert!(n >= 2.0, "calls on the dead replica's handles counted: {n}");
}

#[tokio::test]
async fn sigterm_drops_readiness_first_and_answers_every_run() {
    let mut c = Cluster::start("term", &["--drain-grace", "8"]).await;
    let short = tokio::spawn(raw_call(
        c.replicas[0].url("/mcp"),
        "import time\ntime.sleep(4)\nprint('finished in the grace')",
        60,
    ));
    let long = tokio::spawn(raw_call(
        c.replicas[0].url("/mcp"),
        "import time\ntime.sleep(60)\nprint('never')",
        90,
    ));
    // Both runs started (their containers are the replica's, beside its pool sandbox).
    let t0 = Instant::now();
    while common::containers_left_by(c.replicas[0].pid, false).len() < 3 {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the runs did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.replicas[0].signal(libc::SIGTERM);
    let t_term = Instant::now();
    // Readiness drops at once, while the runs go on.
    loop {
        let r = reqwest::get(c.replicas[0].url("/readyz")).await.unwrap();
        if r.status().as_u16() == 503 {
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["draining"], true, "{body}");
            break;
        }
        assert!(
            t_term.elapsed() < Duration::from_secs(1),
            "/readyz still 200 after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new call through the balancer still works (on the draining replica it is sent on).
    for _ in 0..2 {
        let (status, msg) = raw_call(c.lb("/mcp"), "print(6 * 7)", 30).await;
        assert_eq!(status, 200, "{msg}");
        assert!(text_of(&msg).contains("42"), "{msg}");
    }
    let (status, msg) = short.await.unwrap();
    assert_eq!(
        (status, msg["result"]["isError"].clone()),
        (200, json!(false)),
        "{msg}"
    );
    assert!(text_of(&msg).contains("finished in the grace"), "{msg}");
    let (status, msg) = long.await.unwrap();
    assert_eq!(status, 200, "{msg}");
    assert_eq!(msg["result"]["isError"], true, "{msg}");
    assert!(text_of(&msg).contains("shutting down"), "{msg}");
    let waited = t_term.elapsed();
    assert!(
        waited >= Duration::from_secs(7),
        "the long run was stopped before the grace: {waited:?}"
    );
    let exit = tokio::time::timeout(Duration::from_secs(30), c.replicas[0].child.wait()).await;
    assert!(
        exit.is_ok(),
        "the replica did not exit:\n{}",
        c.replicas[0].log()
    );
    common::assert_nothing_left_by(c.replicas[0].pid);
}

/// The same flows with both replicas on the Kubernetes backend, pointed at the API stand-in
/// (`tests/kube_standin`, whose pods are containers of the local daemon): handles,
/// forwarding and the balancer do not depend on the backend. Twenty rounds in each mode
/// and of tasks, as on Docker.
#[tokio::test(flavor = "multi_thread")]
async fn sdk_flows_through_a_balancer_with_two_replicas_on_the_kubernetes_standin() {
    common::sandbox().await;
    let k = tokio::task::spawn_blocking(crate::kube_standin::StandIn::start)
        .await
        .unwrap();
    let kubeconfig = k.kubeconfig_path.to_str().unwrap().to_string();
    // `--allow-unsafe`: a PodSpec has no pids limit (on a cluster it is the kubelet's), and
    // the stand-in runs containers without one, so the self-test's fork bomb fails there.
    let c = Cluster::start(
        "flows-kube",
        &[
            "--max-sessions",
            "48",
            "--allow-unsafe",
            "--backend",
            "kubernetes",
            "--kubeconfig",
            &kubeconfig,
        ],
    )
    .await;
    let out = script(vec!["flows".into(), c.lb("/mcp"), "20".into()]).await;
    assert!(out.contains("ok: auto 2026-07-28 x20"), "{out}");
    assert!(out.contains("ok: legacy 2025-11-25 x20"), "{out}");
    assert!(out.contains("ok: tasks x20"), "{out}");
    for r in &c.replicas {
        let n = metric(r, "mcp_executor_forwarded_total").await;
        assert!(n > 0.0, "replica {} forwarded nothing:\n{}", r.id, r.log());
    }
    // The sandboxes were the stand-in's pods (each replica keeps a warm one).
    assert!(!k.pods().is_empty(), "no pod in the stand-in");
    drop(c);
}
