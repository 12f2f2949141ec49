//! The Kubernetes backend end to end against the API stand-in (`tests/kube_standin/`: the
//! real API's pods subset, attach over WebSocket v5, each pod a real Docker container):
//! a run, the hardening the stand-in received, the pool, a session, cancellation, a
//! timeout, OOM, the deadline from the pod status, the sweep by label, owner references
//! (and the garbage collection they give), egress relayed over the attach (#41), and
//! `serve --backend kubernetes --kubeconfig`
//! serving `execute_code` to the official Python SDK.
#![cfg(feature = "kubernetes")]

use crate::common;
#[allow(unused_imports)]
use crate::{contract, kube_standin};

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::kubernetes::{spec, KubeBackend, KubeConfig, OwnerPod};
use mcp_code_executor::backend::{Backend, BackendError, PoolConfig};
use mcp_code_executor::job::{JobSpec, Limits, RunEvent};
use tokio::io::{AsyncBufReadExt, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_mcp-code-executor");

/// The stand-in, with the sandbox image on the daemon it runs pods on.
async fn standin() -> kube_standin::StandIn {
    common::sandbox().await;
    tokio::task::spawn_blocking(kube_standin::StandIn::start)
        .await
        .unwrap()
}

fn config(k: &kube_standin::StandIn) -> KubeConfig {
    KubeConfig {
        kubeconfig: Some(k.kubeconfig_path.clone()),
        ..KubeConfig::new(image::default_image())
    }
}

async fn connect(config: KubeConfig) -> KubeBackend {
    KubeBackend::connect(config)
        .await
        .unwrap_or_else(|e| panic!("the backend could not reach the stand-in: {e}"))
}

fn job(code: &str, tenant: &str) -> JobSpec {
    let mut j = JobSpec::python(code, Limits::default());
    j.tenant = tenant.into();
    j
}

/// The stand-in's pods carrying the job label `id`.
fn pods_of_job(k: &kube_standin::StandIn, id: &str) -> Vec<serde_json::Value> {
    k.pods()
        .into_iter()
        .filter(|p| p["metadata"]["labels"][spec::LABEL_JOB] == id)
        .collect()
}

/// Wait (bounded) until the stand-in holds no pod made by this backend.
async fn assert_no_pods_left(k: &kube_standin::StandIn, b: &KubeBackend) {
    b.drain().await;
    let selector_owner = b
        .own_pods_selector()
        .split(',')
        .find_map(|kv| {
            kv.strip_prefix(&format!("{}=", spec::LABEL_OWNER))
                .map(String::from)
        })
        .unwrap();
    let mine = || {
        k.pods()
            .into_iter()
            .filter(|p| p["metadata"]["labels"][spec::LABEL_OWNER] == selector_owner.as_str())
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .count()
    };
    for _ in 0..100 {
        if mine() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pods of this backend left: {}", mine());
}

contract::contract_tests!(contract_on_kubernetes, async {
    let k = standin().await;
    let b = connect(config(&k)).await;
    (std::sync::Arc::new(b) as std::sync::Arc<dyn Backend>, k)
});

/// A run is a pod with the hardening, code goes in through attach, output comes back,
/// the pod is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_is_a_hardened_pod_and_is_deleted() {
    let k = standin().await;
    let b = connect(config(&k)).await;
    assert_eq!(b.namespace(), k.namespace);
    let info = b.info().await.unwrap();
    assert_eq!(info.kind, "kubernetes");

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let j = job(
        "import os, sys\nprint('hello', os.getuid(), os.getgid())\nprint('err', file=sys.stderr)\n\
         open('/workspace/w', 'w').write('x')\n\
         try:\n    open('/etc/x', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n\
         import time; time.sleep(1)\nsys.exit(3)\n",
        "t-kube-run",
    );
    let id = j.id.clone();
    let run = tokio::spawn({
        let b = std::sync::Arc::new(b);
        let b2 = b.clone();
        async move { (b2.run(j, Some(tx)).await, b) }
    });
    // While it runs: the pod the stand-in received.
    let pod_name = loop {
        match rx.recv().await.expect("events until Created") {
            RunEvent::Created { container } => break container,
            _ => continue,
        }
    };
    let pod = k.pod(&pod_name).expect("the pod exists while it runs");
    let s = &pod["spec"];
    assert_eq!(s["restartPolicy"], "Never");
    assert_eq!(s["automountServiceAccountToken"], false);
    assert_eq!(s["enableServiceLinks"], false);
    assert_eq!(s["securityContext"]["runAsUser"], 65534);
    assert_eq!(s["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        s["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let c = &s["containers"][0];
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(
        c["resources"]["limits"]["memory"],
        (512u64 << 20).to_string()
    );
    assert!(s["activeDeadlineSeconds"].as_i64().unwrap() > 30);
    assert_eq!(pod["metadata"]["labels"][spec::LABEL_TENANT], "t-kube-run");

    let (outcome, b) = run.await.unwrap();
    let o = outcome.unwrap();
    assert_eq!(o.exit_code, Some(3), "{o:?}");
    let out = o.stdout_text();
    assert!(out.contains("hello 65534 65534"), "{out}");
    assert!(out.contains("ro 30"), "read-only root: {out}");
    assert_eq!(o.stderr_text(), "err\n");
    assert!(!o.timed_out && !o.oom_killed);
    assert_no_pods_left(&k, &b).await;
    assert!(pods_of_job(&k, &id)
        .iter()
        .all(|p| !p["metadata"]["deletionTimestamp"].is_null()));
}

/// A timeout kills the pod; a memory hog is reported as OOM; the pod is deleted after each.
#[tokio::test(flavor = "multi_thread")]
async fn timeout_and_oom() {
    let k = standin().await;
    let b = connect(config(&k)).await;
    let mut j = job("while True:\n    pass\n", "t-kube-limits");
    j.limits.timeout = Duration::from_secs(2);
    let o = b.run(j, None).await.unwrap();
    assert!(o.timed_out, "{o:?}");

    let mut j = job(
        "x = []\nwhile True:\n    x.append(bytearray(16 << 20))\n",
        "t-kube-limits",
    );
    j.limits.memory_bytes = 96 << 20;
    let o = b.run(j, None).await.unwrap();
    assert!(o.oom_killed, "{o:?}");
    assert_no_pods_left(&k, &b).await;
}

/// `activeDeadlineSeconds` is the backstop: the kubelet (here the stand-in) ends the pod,
/// and the backend reads `DeadlineExceeded` from the pod status as a timeout.
#[tokio::test(flavor = "multi_thread")]
async fn the_deadline_comes_from_the_pod_status() {
    let k = standin().await;
    let b = connect(KubeConfig {
        long_deadline: Duration::from_secs(3),
        ..config(&k)
    })
    .await;
    let mut s = b.open_session(job("", "t-kube-deadline")).await.unwrap();
    let o = s
        .exec(
            "import time\ntime.sleep(60)\n",
            Duration::from_secs(50),
            None,
        )
        .await
        .unwrap();
    assert!(o.timed_out, "{o:?}");
    assert!(!s.alive());
    drop(s);
    assert_no_pods_left(&k, &b).await;
}

/// Warm pods: made before the run, single use, refilled.
#[tokio::test(flavor = "multi_thread")]
async fn warm_pods_serve_runs_and_are_refilled() {
    let k = standin().await;
    let b = connect(KubeConfig {
        pool: PoolConfig {
            size: 1,
            ..PoolConfig::default()
        },
        ..config(&k)
    })
    .await;
    let wait_ready = || async {
        for _ in 0..300 {
            if b.pool_stats().unwrap().ready == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the pool did not fill: {:?}", b.pool_stats());
    };
    wait_ready().await;
    let waiting: Vec<String> = k
        .pods()
        .into_iter()
        .filter(|p| p["metadata"]["labels"][spec::LABEL_TENANT] == "pool")
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(waiting.len(), 1, "one warm pod waits");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let o = b
        .run(job("print(6 * 7)", "t-kube-pool"), Some(tx))
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "42\n");
    let used = loop {
        if let RunEvent::Created { container } = rx.recv().await.unwrap() {
            break container;
        }
    };
    assert_eq!(used, waiting[0], "the run took the warm pod");
    assert_eq!(b.pool_stats().unwrap().hits, 1);
    wait_ready().await;
    let o = b.run(job("print(1)", "t-kube-pool"), None).await.unwrap();
    assert_eq!(o.stdout_text(), "1\n");
    assert_eq!(b.pool_stats().unwrap().hits, 2, "refilled, and single use");
    assert_eq!(
        b.pool_stats().unwrap().discarded,
        0,
        "a waiting pod whose runner said `R` after the attach is alive, not discarded"
    );
    b.shutdown().await;
    assert_no_pods_left(&k, &b).await;
}

/// A session is one pod: state survives between cells, files go in, and dropping it
/// deletes the pod.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_is_a_pod() {
    let k = standin().await;
    let b = connect(config(&k)).await;
    let mut s = b.open_session(job("", "t-kube-session")).await.unwrap();
    let t = Duration::from_secs(20);
    let o = s.exec("x = 41", t, None).await.unwrap();
    assert!(o.success(), "{o:?}");
    s.put_files(
        &[mcp_code_executor::job::InputFile {
            path: "d.txt".into(),
            contents: b"data".to_vec(),
        }],
        t,
    )
    .await
    .unwrap();
    let o = s
        .exec("print(x + 1, open('d.txt').read())", t, None)
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "42 data\n");
    let o = s.exec("raise ValueError('no')", t, None).await.unwrap();
    assert_eq!(o.exit_code, Some(1));
    assert!(s.alive(), "an exception keeps the session");
    drop(s);
    assert_no_pods_left(&k, &b).await;
}

/// Code mode's requests reach the job's tools from a pod (over `pods/attach`, as on
/// Docker), in a run and in a session's cells; answers come back to the code.
#[tokio::test(flavor = "multi_thread")]
async fn code_mode_requests_reach_the_jobs_tools_from_a_pod() {
    use mcp_code_executor::job::{ToolHost, ToolRun, Tools};
    /// Answers every call with its tool and arguments, as a structured result.
    struct Echo;
    struct EchoRun;
    impl ToolHost for Echo {
        fn start(&self) -> std::sync::Arc<dyn ToolRun> {
            std::sync::Arc::new(EchoRun)
        }
    }
    #[async_trait::async_trait]
    impl ToolRun for EchoRun {
        async fn answer(&self, request: Vec<u8>) -> Vec<u8> {
            let req: serde_json::Value = serde_json::from_slice(&request).unwrap();
            let body = serde_json::json!({
                "kind": "tool",
                "id": req["id"],
                "structured": {"tool": req["tool"], "arguments": req["arguments"]},
            });
            let json = serde_json::to_vec(&body).unwrap();
            let mut msg = (json.len() as u32).to_be_bytes().to_vec();
            msg.extend(json);
            msg
        }
    }
    let k = standin().await;
    let b = connect(config(&k)).await;
    let code = "import tools\nr = tools.call('up', 'echo', a=1)\nprint(r['tool'], r['arguments'])";
    let mut j = job(code, "t-kube-tools");
    j.tools = Some(Tools(std::sync::Arc::new(Echo)));
    let o = b.run(j, None).await.unwrap();
    assert_eq!(o.stdout_text(), "echo {'a': 1}\n", "{o:?}");

    let mut j = job("", "t-kube-tools");
    j.tools = Some(Tools(std::sync::Arc::new(Echo)));
    let mut s = b.open_session(j).await.unwrap();
    let t = Duration::from_secs(20);
    let o = s.exec("import tools", t, None).await.unwrap();
    assert!(o.success(), "{o:?}");
    let o = s
        .exec("print(tools.call('up', 'again', b=2)['tool'])", t, None)
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "again\n", "{o:?}");
    drop(s);
    assert_no_pods_left(&k, &b).await;
}

/// Dropping a run's future (a cancelled call) deletes its pod.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_run_deletes_its_pod() {
    let k = standin().await;
    let b = std::sync::Arc::new(connect(config(&k)).await);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn({
        let b = b.clone();
        async move {
            b.run(
                job("import time\ntime.sleep(120)\n", "t-kube-cancel"),
                Some(tx),
            )
            .await
        }
    });
    let name = loop {
        if let RunEvent::Created { container } = rx.recv().await.unwrap() {
            break container;
        }
    };
    // Running: the code has started.
    loop {
        if let Some(RunEvent::Started) = rx.recv().await {
            break;
        }
    }
    assert!(k.pod(&name).is_some());
    task.abort();
    let _ = task.await;
    assert_no_pods_left(&k, &b).await;
    assert!(
        k.pod(&name)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null()),
        "the cancelled run's pod is deleted"
    );
}

/// A pod made by the sandbox image, sleeping, with these labels and annotations.
fn idle_pod(
    name: &str,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": image::default_image(),
                "command": ["/usr/bin/python3", "-c", "import time; time.sleep(300)"],
                "securityContext": {"runAsUser": 65534, "runAsGroup": 65534}
            }]
        }
    }))
    .unwrap()
}

/// The sweep deletes, by label selector, the pods whose owner is gone (a process of this
/// host that died; a server pod that no longer exists), and keeps the others.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_removes_what_a_dead_server_left() {
    let k = standin().await;
    let b = connect(config(&k)).await;
    let api: Api<Pod> = Api::namespaced(k.client().await, &k.namespace);
    let managed = |owner: &str| {
        BTreeMap::from([
            (spec::LABEL_MANAGED.to_string(), "true".to_string()),
            (spec::LABEL_OWNER.to_string(), spec::owner_label(owner)),
        ])
    };
    let dead = common::owner_of(4_000_000, "1");
    let me = common::owner_id();
    let made = [
        (
            "sweep-dead-process",
            managed(&dead),
            BTreeMap::from([(spec::ANNOTATION_OWNER.to_string(), dead.clone())]),
        ),
        (
            "sweep-dead-server",
            managed("server"),
            BTreeMap::from([(
                spec::ANNOTATION_OWNER_POD.to_string(),
                format!("{}/no-such-server/uid-1", k.namespace),
            )]),
        ),
        (
            "sweep-alive",
            managed(&me),
            BTreeMap::from([(spec::ANNOTATION_OWNER.to_string(), me.clone())]),
        ),
    ];
    for (name, labels, ann) in made {
        api.create(&PostParams::default(), &idle_pod(name, labels, ann))
            .await
            .unwrap();
    }
    let removed = b.sweep().await.unwrap();
    assert_eq!(removed, 2);
    let gone = |name: &str| {
        k.pod(name)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
    };
    assert!(gone("sweep-dead-process"));
    assert!(gone("sweep-dead-server"));
    assert!(!gone("sweep-alive"), "a live owner's pod is kept");
    api.delete("sweep-alive", &DeleteParams::default())
        .await
        .unwrap();
}

/// In the cluster, sandbox pods name the server's pod as their owner: when the server pod
/// goes, the garbage collector (here the stand-in's) removes its sandboxes.
#[tokio::test(flavor = "multi_thread")]
async fn owner_references_let_the_collector_remove_a_dead_servers_pods() {
    let k = standin().await;
    let api: Api<Pod> = Api::namespaced(k.client().await, &k.namespace);
    let server = api
        .create(
            &PostParams::default(),
            &idle_pod("server-0", BTreeMap::new(), BTreeMap::new()),
        )
        .await
        .unwrap();
    let uid = server.metadata.uid.clone().unwrap();
    let b = connect(KubeConfig {
        owner_pod: Some(OwnerPod {
            namespace: k.namespace.clone(),
            name: "server-0".into(),
            uid: uid.clone(),
        }),
        ..config(&k)
    })
    .await;
    let mut s = b.open_session(job("", "t-kube-owner")).await.unwrap();
    let o = s
        .exec("print('up')", Duration::from_secs(20), None)
        .await
        .unwrap();
    assert_eq!(o.stdout_text(), "up\n");
    let sandbox = k
        .pods()
        .into_iter()
        .find(|p| p["metadata"]["labels"][spec::LABEL_TENANT] == "t-kube-owner")
        .expect("the session's pod");
    let refs = &sandbox["metadata"]["ownerReferences"];
    assert_eq!(refs[0]["kind"], "Pod");
    assert_eq!(refs[0]["name"], "server-0");
    assert_eq!(refs[0]["uid"], uid.as_str());
    let name = sandbox["metadata"]["name"].as_str().unwrap().to_string();
    // The server pod goes (its node died, say): its sandboxes follow.
    api.delete("server-0", &DeleteParams::default())
        .await
        .unwrap();
    let mut gone = false;
    for _ in 0..300 {
        // Deleted, and its container gone with it (not only marked for deletion).
        if k.pod(&name).is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the collector removed the dead server's sandbox");
    let e = s.exec("print(1)", Duration::from_secs(10), None).await;
    assert!(
        matches!(&e, Err(BackendError::Runner(_))) || e.as_ref().is_ok_and(|o| !o.success()),
        "{e:?}"
    );
    drop(s);
    assert_no_pods_left(&k, &b).await;
}

/// Installs without an environment volume are refused with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn installs_need_the_environment_volume() {
    let k = standin().await;
    let b = connect(config(&k)).await;
    let mut j = job("print(1)", "t-kube-install");
    j.env.network = true;
    match b.run(j, None).await {
        Err(BackendError::Rejected(m)) => assert!(m.contains("--kube-env-volume"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// One execute_code call through the SDK's ClientSession over streamable HTTP.
const SDK_CLIENT: &str = r#"
import asyncio, sys
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main():
    async with streamable_http_client(sys.argv[1]) as (r, w, *_):
        async with ClientSession(r, w) as s:
            await s.initialize()
            res = await s.call_tool("execute_code", {"code": "import socket\nprint(sum(range(10)), socket.gethostname())"})
            print("".join(getattr(c, "text", "") for c in res.content))
            print("is_error", res.is_error)

asyncio.run(main())
"#;

/// `serve --backend kubernetes --kubeconfig FILE` pointed at the stand-in serves
/// execute_code to the official Python SDK, and removes its pods when it stops.
#[tokio::test(flavor = "multi_thread")]
async fn serve_on_kubernetes_answers_the_python_sdk() {
    let python = common::sdk_python();
    let k = standin().await;
    let dir = std::env::temp_dir().join(format!("mcpx-kube-{}", uuid::Uuid::new_v4().simple()));
    let mut server = tokio::process::Command::new(BIN)
        .args([
            "serve",
            "--port",
            "0",
            "--pool-size",
            "1",
            "--tenant",
            "t-kube-serve",
        ])
        // A PodSpec has no pids limit: on a cluster it is the kubelet's podPidsLimit, the
        // same for every pod of a node, and the stand-in runs containers without one. The
        // self-test says so (checked below); everything else it checks must pass.
        .args(["--allow-unsafe", "--backend", "kubernetes", "--kubeconfig"])
        .arg(&k.kubeconfig_path)
        .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
        .env("CODE_STORAGE_DIR", dir.join("code"))
        .env("RUST_LOG", "mcp_code_executor=warn")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    let base = loop {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("serve prints its address; it said: {seen}"))
            .unwrap()
            .unwrap_or_else(|| panic!("serve exited: {seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.split("Streamable HTTP at ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let failed: Vec<&str> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL"))
        .map(|l| l.trim().split("  ").next().unwrap_or(""))
        .collect();
    assert_eq!(
        failed,
        ["fork bomb contained"],
        "only the node-level pids limit is missing: {seen}"
    );
    assert!(seen.contains("ok    nofile limit"), "{seen}");
    let out = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(python)
            .args(["-c", SDK_CLIENT, &base])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"").unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("45 sandbox"), "{stdout}");
    assert!(stdout.contains("is_error False"), "{stdout}");
    let tenant_pods = || {
        k.pods()
            .into_iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| {
                let t = &p["metadata"]["labels"][spec::LABEL_TENANT];
                t == "t-kube-serve" || t == "pool"
            })
            .count()
    };
    let pid = server.id().unwrap();
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let status = tokio::time::timeout(Duration::from_secs(60), server.wait())
        .await
        .expect("serve exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(tenant_pods(), 0, "serve deleted its pods at shutdown");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Resident memory (kB) and CPU time (clock ticks) of process `pid`.
fn rss_and_cpu(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after
        .split(' ')
        .skip(11)
        .take(2)
        .map(|v| v.parse().unwrap())
        .collect();
    (rss, f[0] + f[1])
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The figures of "Scale on Kubernetes" in docs/kubernetes.md, measured against the stand-in (run
/// by hand: `cargo test --test suite kube_backend:: -- --ignored --nocapture`). Prints, asserts
/// nothing about speed.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement for docs/kubernetes.md, run by hand"]
async fn measure_figures_for_the_readme() {
    let k = standin().await;
    let docker = common::sandbox().await;
    let b = connect(config(&k)).await;
    let mut kube_cold = vec![];
    let mut docker_cold = vec![];
    for _ in 0..8 {
        let t = std::time::Instant::now();
        let o = b
            .run(job("print(1)", "t-kube-measure"), None)
            .await
            .unwrap();
        assert_eq!(o.stdout_text(), "1\n");
        kube_cold.push(t.elapsed());
        let t = std::time::Instant::now();
        let o = docker
            .run(job("print(1)", "t-kube-measure"), None)
            .await
            .unwrap();
        assert_eq!(o.stdout_text(), "1\n");
        docker_cold.push(t.elapsed());
    }
    let pooled = connect(KubeConfig {
        pool: PoolConfig {
            size: 1,
            ..PoolConfig::default()
        },
        ..config(&k)
    })
    .await;
    let mut kube_warm = vec![];
    for _ in 0..5 {
        while pooled.pool_stats().unwrap().ready < 1 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let t = std::time::Instant::now();
        pooled
            .run(job("print(1)", "t-kube-measure"), None)
            .await
            .unwrap();
        kube_warm.push(t.elapsed());
    }
    pooled.shutdown().await;
    println!(
        "cold run print(1): kubernetes (stand-in) {:?}, docker {:?}; warm pod {:?}",
        median(kube_cold),
        median(docker_cold),
        median(kube_warm)
    );

    // The server's cost per live sandbox: `serve` with 0 and with N attached warm pods.
    let n = 16;
    let mut figures = vec![];
    for pool in [0usize, n] {
        let dir =
            std::env::temp_dir().join(format!("mcpx-kube-m-{}", uuid::Uuid::new_v4().simple()));
        let mut server = tokio::process::Command::new(BIN)
            .args([
                "serve",
                "--port",
                "0",
                "--allow-unsafe",
                "--tenant",
                "t-kube-measure",
            ])
            .args(["--pool-size", &pool.to_string()])
            .args(["--backend", "kubernetes", "--kubeconfig"])
            .arg(&k.kubeconfig_path)
            .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
            .env("CODE_STORAGE_DIR", dir.join("code"))
            .env("RUST_LOG", "mcp_code_executor=warn")
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
        loop {
            let l = lines.next_line().await.unwrap().expect("serve runs");
            if l.contains("Streamable HTTP at ") {
                break;
            }
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let pool_pods = || {
            k.pods()
                .into_iter()
                .filter(|p| p["metadata"]["labels"][spec::LABEL_TENANT] == "pool")
                .filter(|p| p["status"]["phase"] == "Running")
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .count()
        };
        for _ in 0..600 {
            if pool_pods() >= pool {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pid = server.id().unwrap();
        let (rss, cpu0) = rss_and_cpu(pid);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (_, cpu1) = rss_and_cpu(pid);
        figures.push((pool, rss, cpu1 - cpu0));
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(60), server.wait()).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    for (pool, rss, ticks) in &figures {
        println!("serve with {pool} attached warm pods: RSS {rss} kB, CPU over 10 s idle: {ticks} ticks (1/100 s)");
    }
    let per = (figures[1].1 as f64 - figures[0].1 as f64) / n as f64;
    println!("server memory per live sandbox (attached pod): {per:.0} kB");
}

/// A Docker volume the stand-in serves as a PersistentVolumeClaim of that name; removed on
/// drop.
struct Claim(String);

impl Claim {
    fn new() -> Claim {
        let name = format!(
            "mcpx-kenv-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let ok = Command::new("docker")
            .args(["volume", "create", &name])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "docker volume create {name}");
        // As fsGroup would on a cluster (the stand-in does not apply it): the sandbox
        // group owns the claim's root.
        let ok = Command::new("docker")
            .args(["run", "--rm", "--user", "0", "--network", "none", "-v"])
            .arg(format!("{name}:/v"))
            .args([
                "--entrypoint",
                "/bin/chown",
                &image::default_image(),
                "65534:65534",
                "/v",
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok, "chown of the claim's root");
        Claim(name)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["volume", "rm", "-f", &self.0])
            .stdout(Stdio::null())
            .status();
    }
}

/// With an environment volume, a job that may write into an environment (an installer)
/// writes to the claim, and runs see the environment from it, read-only.
#[tokio::test(flavor = "multi_thread")]
async fn environments_live_on_the_volume_read_only_in_runs() {
    common::sandbox().await; // the image, for the claim's chown
                             // Declared first, dropped last: after the stand-in has removed its containers.
    let claim = Claim::new();
    let k = standin().await;
    let b = connect(KubeConfig {
        env_volume: Some(claim.0.clone()),
        data_dir: Some("/srv/data".into()),
        ..config(&k)
    })
    .await;
    let env_dir = "/srv/data/envs/default";
    let mut install = job(
        &format!("open('{env_dir}/installed.txt', 'w').write('pkg 1.0')\nprint('written')"),
        "t-kube-env",
    );
    install.env.sources = vec![mcp_code_executor::job::Source::host_writable(env_dir)];
    let o = b.run(install, None).await.unwrap();
    assert_eq!(o.stdout_text(), "written\n", "{o:?}");

    let mut run = job(
        &format!(
            "print(open('{env_dir}/installed.txt').read())\n\
             try:\n    open('{env_dir}/x', 'w')\nexcept OSError as e:\n    print('ro', e.errno)\n"
        ),
        "t-kube-env",
    );
    run.env.sources = vec![mcp_code_executor::job::Source::host(env_dir)];
    let o = b.run(run, None).await.unwrap();
    assert_eq!(o.stdout_text(), "pkg 1.0\nro 30\n", "{o:?}");
    assert_no_pods_left(&k, &b).await;
}

/// When the OOM killer takes the runner itself (here: many small processes, none larger
/// than the runner, fill the pod's memory), nothing reports from inside: the verdict is
/// the pod status's `OOMKilled`, and the pod is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn oom_of_the_whole_pod_comes_from_the_pod_status() {
    let k = standin().await;
    let b = connect(config(&k)).await;
    // Which process the kernel's OOM killer picks is its choice: when it spares the runner,
    // the runner reports the kill itself (also a right verdict, but not the path under
    // test). Each attempt must be an OOM verdict; one of three must come from the pod
    // status (one in several took the runner's path on a clean clone, 2026-11-28).
    let mut from_status = 0;
    for _ in 0..3 {
        let mut j = job(
            "import os, time\nfor i in range(30):\n    if os.fork() == 0:\n        b = bytearray(3 << 20)\n        time.sleep(20)\n        os._exit(0)\ntime.sleep(20)\n",
            "t-kube-oom",
        );
        j.limits.memory_bytes = 64 << 20;
        j.limits.timeout = Duration::from_secs(15);
        let o = b.run(j, None).await.unwrap();
        assert!(o.oom_killed, "{o:?}");
        assert!(!o.timed_out, "{o:?}");
        assert_eq!(o.exit_code, None, "{o:?}");
        if o.cpu_ms.is_none() {
            // No report from the runner: the verdict came from the pod status.
            from_status += 1;
            break;
        }
    }
    assert_eq!(
        from_status, 1,
        "no attempt's verdict came from the pod status"
    );
    assert_no_pods_left(&k, &b).await;
}

/// Egress from a pod (#41): the runner's channel is `pods/attach` here, and the code's
/// connections are relayed over it to the proxy as on Docker: a run and a session's cells
/// reach the allowed loopback HTTPS host (tunnelled: the server saw the client's own SNI),
/// and a host not in the policy is refused with the clear error.
#[tokio::test(flavor = "multi_thread")]
async fn egress_reaches_an_allowed_host_from_a_pod() {
    use mcp_code_executor::egress::{sandbox::with_proxy, Policy, Proxy};
    let up = crate::egress::TlsUpstream::start(&["data.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let policy = Policy::parse(&crate::egress_sandbox::policy(port)).unwrap();
    let proxy = Proxy::new(policy);
    let tenant = "t-kube-egress";
    let k = standin().await;
    let b = connect(config(&k)).await;
    let trust = crate::egress_sandbox::trusting(&ca);
    let code = format!(
        "{trust}import requests\nprint(requests.get('https://data.example.test:{port}/k', timeout=20).text)\n\
         try:\n    requests.get('https://other.example.test:{port}/', timeout=20)\nexcept Exception as e:\n    print(e)\n"
    );
    let mut j = job(&code, tenant);
    j.limits.timeout = Duration::from_secs(60);
    j.egress = Some(with_proxy(proxy.clone(), tenant));
    let o = b.run(j, None).await.unwrap();
    let out = o.stdout_text();
    assert!(
        out.contains(&format!(
            "host=data.example.test:{port} sni=data.example.test"
        )),
        "{o:?}"
    );
    assert!(
        out.contains(&format!("other.example.test:{port} not in the policy")),
        "{o:?}"
    );

    let mut j = job("", tenant);
    j.egress = Some(with_proxy(proxy, tenant));
    let mut s = b.open_session(j).await.unwrap();
    let t = Duration::from_secs(60);
    let o = s
        .exec(&format!("{trust}import requests"), t, None)
        .await
        .unwrap();
    assert!(o.success(), "{o:?}");
    for n in 2..=3 {
        let o = s
            .exec(
                &format!("print(requests.get('https://data.example.test:{port}/c{n}', timeout=20).status_code)"),
                t,
                None,
            )
            .await
            .unwrap();
        assert_eq!(o.stdout_text(), "200\n", "cell {n}: {o:?}");
    }
    drop(s);
    assert_no_pods_left(&k, &b).await;
}

/// Injection from a pod (#41): the rule for `api.example.test` adds `Authorization` (read
/// from a file by the server), so the proxy intercepts that host with its CA, which reaches
/// the pod's runner in the job (as on Docker) and becomes the sandbox's bundle: the code,
/// which says nothing about the proxy or a CA, gets the upstream's body; the upstream
/// received the rule's header over the proxy's TLS; the secret is in no output of the run
/// nor in the pod's environment and files the code can read.
#[tokio::test(flavor = "multi_thread")]
async fn egress_injects_a_header_for_a_pod() {
    use mcp_code_executor::egress::{sandbox::with_proxy, Policy, Proxy};
    let marker = crate::egress_inject::MARKER;
    let up = crate::egress::TlsUpstream::start(&["api.example.test", "data.example.test"]).await;
    let port = up.port;
    let (_g, dir) = common::TempDirs::one("kube-inject");
    let token = dir.join("token");
    std::fs::write(&token, format!("Bearer {marker}")).unwrap();
    let text = crate::egress_inject::policy(
        port,
        &up.ca,
        &format!("{{ file = \"{}\" }}", token.display()),
    );
    let proxy = Proxy::new(Policy::parse(&text).unwrap());
    let tenant = "t-kube-inject";
    let k = standin().await;
    let b = connect(config(&k)).await;
    let (a, h) = marker.split_at(marker.len() / 2);
    let code = format!(
        r#"import glob, os, requests
r = requests.get('https://api.example.test:{port}/headers?via=pod', timeout=30)
print(r.status_code, r.text)
needle = ({a:?} + {h:?}).encode()
found, looked = [], 0
for p in glob.glob('/proc/*/environ') + glob.glob('/tmp/**', recursive=True):
    try:
        if needle in open(p, 'rb').read():
            found.append(p)
        looked += 1
    except OSError:
        pass
print('found', found, looked > 1)
"#
    );
    let mut j = job(&code, tenant);
    j.limits.timeout = Duration::from_secs(60);
    j.egress = Some(with_proxy(proxy, tenant));
    let o = b.run(j, None).await.unwrap();
    let out = o.stdout_text();
    let seen = std::fs::read_to_string(up.ca.with_file_name("seen.jsonl")).unwrap_or_default();
    assert!(
        out.contains(&format!(
            "200 host=api.example.test:{port} sni=api.example.test"
        )),
        "{o:?}\n{seen}"
    );
    assert!(out.contains("found [] True"), "{o:?}");
    let l: serde_json::Value = seen
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["path"] == "/headers?via=pod")
        .unwrap_or_else(|| panic!("the upstream saw no request: {seen}"));
    assert_eq!(
        l["auth"],
        serde_json::json!([format!("Bearer {marker}")]),
        "{seen}"
    );
    assert!(!format!("{o:?}").contains(marker), "{o:?}");
    assert_no_pods_left(&k, &b).await;
}
