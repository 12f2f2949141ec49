//! The Kubernetes API stand-in (`tests/kube_standin/`) against clients we did not write:
//! kube-rs's own `Api::<Pod>` calls (create, get, list with selectors, watch, the runtime's
//! watcher and `await_condition`, attach with stdin, delete) and `kubectl` (`get`,
//! `create -f`, `delete`), and pods that really run: the PodSpec's hardening reaches the
//! container, OOM and the deadline come back in the pod status. What passes here is what
//! the backend may rely on; `tests/kube_standin/README.md` says what it does not prove.

use crate::kube_standin;

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{AttachParams, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{conditions, wait::await_condition, watcher, WatchStreamExt};
use kube::Api;
use kube_standin::StandIn;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long any one wait may take before the test fails (a bound, not a measurement).
const BOUND: Duration = Duration::from_secs(90);

/// The sandbox image (built if missing, offline): it has Python.
fn image() -> String {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let image = mcp_code_executor::backend::image::default_image();
            let tag = image.clone();
            // On a thread of its own: callers may be inside a runtime already.
            std::thread::spawn(move || {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(mcp_code_executor::backend::docker::image::ensure(
                    &tag,
                    &Default::default(),
                    &mut |l| eprintln!("[image] {l}"),
                ))
                .unwrap_or_else(|e| panic!("the sandbox image could not be built: {e}"));
            })
            .join()
            .expect("the image is there");
            image
        })
        .clone()
}

/// A pod running `python3 -c code` as `nobody`; `stdin` keeps stdin open for an attach.
fn python_pod(name: &str, code: &str, stdin: bool) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "standin-test", "case": name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": image(),
                "imagePullPolicy": "Never",
                "command": ["python3", "-I", "-c", code],
                "stdin": stdin,
                "stdinOnce": stdin,
                "securityContext": {"runAsUser": 65534, "runAsGroup": 65534}
            }]
        }
    }))
    .expect("a valid Pod")
}

async fn api(k: &StandIn) -> Api<Pod> {
    Api::namespaced(k.client().await, &k.namespace)
}

/// Wait (bounded) until `cond` holds for pod `name`; the pod then.
async fn wait(api: &Api<Pod>, name: &str, cond: impl kube::runtime::wait::Condition<Pod>) -> Pod {
    tokio::time::timeout(BOUND, await_condition(api.clone(), name, cond))
        .await
        .unwrap_or_else(|_| panic!("pod {name}: the condition did not hold within {BOUND:?}"))
        .expect("the watch works")
        .expect("the pod exists")
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn ended(p: Option<&Pod>) -> bool {
    p.is_some_and(|p| matches!(phase(p).as_str(), "Succeeded" | "Failed"))
}

fn terminated(p: &Pod) -> k8s_openapi::api::core::v1::ContainerStateTerminated {
    p.status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .expect("the container is terminated")
}

fn docker_inspect(id: &str) -> serde_json::Value {
    let out = Command::new("docker")
        .args(["inspect", id])
        .output()
        .expect("docker CLI");
    assert!(out.status.success(), "docker inspect {id}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0].clone()
}

fn container_exists(id: &str) -> bool {
    Command::new("docker")
        .args(["inspect", id])
        .output()
        .expect("docker CLI")
        .status
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_creates_lists_watches_and_deletes_pods() {
    let k = StandIn::start();
    let pods = api(&k).await;
    let created = pods
        .create(
            &PostParams::default(),
            &python_pod("lister", "print('hello')", false),
        )
        .await
        .expect("create");
    assert_eq!(phase(&created), "Pending");
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    pods.create(&PostParams::default(), &python_pod("other", "pass", false))
        .await
        .expect("create another");

    // Label selectors, as the API defines them.
    let by = |s: &str| ListParams::default().labels(s);
    let names = |l: kube::api::ObjectList<Pod>| {
        let mut n: Vec<String> = l
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        n.sort();
        n
    };
    assert_eq!(
        names(pods.list(&by("case=lister")).await.unwrap()),
        ["lister"]
    );
    assert_eq!(
        names(pods.list(&by("app=standin-test")).await.unwrap()),
        ["lister", "other"]
    );
    assert_eq!(
        names(pods.list(&by("case in (other,nope)")).await.unwrap()),
        ["other"]
    );
    assert_eq!(
        names(pods.list(&by("case!=lister,app")).await.unwrap()),
        ["other"]
    );
    assert!(pods.list(&by("!app")).await.unwrap().items.is_empty());
    let fields = ListParams::default().fields("metadata.name=other");
    assert_eq!(names(pods.list(&fields).await.unwrap()), ["other"]);

    // A watch from the list's resourceVersion sees the pod run, end and go.
    let list = pods.list(&by("case=lister")).await.unwrap();
    let rv = list
        .metadata
        .resource_version
        .clone()
        .expect("a list resourceVersion");
    let mut events = pods
        .watch(
            &WatchParams::default().labels("case=lister").timeout(60),
            &rv,
        )
        .await
        .expect("watch")
        .boxed();
    let mut seen = Vec::new();
    let mut last_rv = rv.parse::<u64>().unwrap();
    let mut deleted = false;
    while let Ok(Some(e)) = tokio::time::timeout(BOUND, events.next()).await {
        let e = e.expect("a watch event");
        let (kind, p) = match e {
            WatchEvent::Added(p) => ("ADDED", p),
            WatchEvent::Modified(p) => ("MODIFIED", p),
            WatchEvent::Deleted(p) => ("DELETED", p),
            other => panic!("unexpected event {other:?}"),
        };
        let prv: u64 = p
            .metadata
            .resource_version
            .clone()
            .unwrap()
            .parse()
            .unwrap();
        assert!(prv > last_rv, "resourceVersions grow");
        last_rv = prv;
        seen.push((kind, phase(&p)));
        if kind == "MODIFIED" && phase(&p) == "Succeeded" {
            let t = terminated(&p);
            assert_eq!((t.exit_code, t.reason.as_deref()), (0, Some("Completed")));
            let gone = pods
                .delete("lister", &DeleteParams::default())
                .await
                .expect("delete");
            let marked = gone.left().expect("graceful deletion returns the pod");
            assert!(marked.metadata.deletion_timestamp.is_some());
        }
        if kind == "DELETED" {
            deleted = true;
            break;
        }
    }
    assert!(deleted, "the watch ends with DELETED: {seen:?}");
    assert!(seen.contains(&("MODIFIED", "Running".into())), "{seen:?}");
    assert!(
        seen.iter().all(|(k, _)| *k != "ADDED"),
        "a watch from a resourceVersion replays nothing older: {seen:?}"
    );
    // Gone for good: 404 as a Status.
    match pods.get("lister").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
        }
        other => panic!("expected 404, got {other:?}"),
    }
    assert!(k.container_of("lister").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_runtime_watcher_and_await_condition_follow_a_pod() {
    let k = StandIn::start();
    let pods = api(&k).await;
    // The runtime's watcher: list, then watch from its resourceVersion.
    let cfg = watcher::Config::default().labels("case=watched");
    let mut stream = watcher(pods.clone(), cfg).applied_objects().boxed();
    pods.create(
        &PostParams::default(),
        &python_pod("watched", "import sys; sys.exit(3)", false),
    )
    .await
    .unwrap();
    let mut phases = Vec::new();
    while let Ok(Some(p)) = tokio::time::timeout(BOUND, stream.next()).await {
        let p = p.expect("a watcher event");
        phases.push(phase(&p));
        if phase(&p) == "Failed" {
            let t = terminated(&p);
            assert_eq!((t.exit_code, t.reason.as_deref()), (3, Some("Error")));
            break;
        }
    }
    assert_eq!(
        phases.last().map(String::as_str),
        Some("Failed"),
        "{phases:?}"
    );
    // await_condition (a watcher on metadata.name) on another pod.
    let created = pods
        .create(
            &PostParams::default(),
            &python_pod("awaited", "import time; time.sleep(60)", false),
        )
        .await
        .unwrap();
    let running = wait(&pods, "awaited", conditions::is_pod_running()).await;
    assert_eq!(phase(&running), "Running");
    let uid = created.metadata.uid.unwrap();
    pods.delete("awaited", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(
        BOUND,
        await_condition(pods.clone(), "awaited", conditions::is_deleted(&uid)),
    )
    .await
    .expect("deleted in time")
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_attach_streams_stdin_and_closes_it_cleanly() {
    let k = StandIn::start();
    let pods = api(&k).await;
    let code = "import sys, hashlib\n\
                data = sys.stdin.buffer.read()\n\
                print(len(data), hashlib.sha256(data).hexdigest(), flush=True)\n\
                sys.stderr.write('eof seen\\n')";
    pods.create(&PostParams::default(), &python_pod("attached", code, true))
        .await
        .unwrap();
    // Attach before the pod runs is refused, as the API server does; wait for Running.
    wait(&pods, "attached", conditions::is_pod_running()).await;
    let mut p = pods
        .attach(
            "attached",
            &AttachParams::default()
                .container("main")
                .stdin(true)
                .stdout(true)
                .stderr(true),
        )
        .await
        .expect("attach over WebSocket");
    let mut stdin = p.stdin().expect("stdin");
    let mut stdout = p.stdout().expect("stdout");
    let mut stderr = p.stderr().expect("stderr");
    let status = p.take_status().expect("a status future");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let expected = {
        use sha2::Digest;
        format!("{:x}", sha2::Sha256::digest(&payload))
    };
    let writer = tokio::spawn(async move {
        stdin.write_all(&payload).await.unwrap();
        stdin.flush().await.unwrap();
        // Dropping the writer is v5's close of stdin alone: the runner sees EOF.
        drop(stdin);
    });
    let mut out = String::new();
    let mut err = String::new();
    let read = async {
        tokio::try_join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        )
    };
    tokio::time::timeout(BOUND, read)
        .await
        .expect("output in time")
        .unwrap();
    writer.await.unwrap();
    assert_eq!(out.trim(), format!("300000 {expected}"));
    assert_eq!(err.trim(), "eof seen");
    let status = tokio::time::timeout(BOUND, status)
        .await
        .unwrap()
        .expect("a Status on channel 3");
    assert_eq!(status.status.as_deref(), Some("Success"));
    p.join().await.expect("the attach ends cleanly");
    let done = wait(&pods, "attached", |p: Option<&Pod>| ended(p)).await;
    assert_eq!(phase(&done), "Succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podspec_hardening_and_limits_reach_the_container() {
    let k = StandIn::start();
    let pods = api(&k).await;
    let code = "import os, sys\n\
                sys.stdin.read()\n\
                st = os.statvfs('/workspace')\n\
                caps = [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'NoNewPrivs'))]\n\
                try:\n    open('/rootfs-probe', 'w'); ro = 'writable'\n\
                except OSError: ro = 'read-only'\n\
                open('/workspace/f', 'w').write('x')\n\
                print(os.getuid(), os.getgid(), ro, st.f_blocks * st.f_frsize, os.environ['GREETING'], *[c.split()[1] for c in caps])";
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hardened", "labels": {"io.mcp-code-executor.network": "none"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "activeDeadlineSeconds": 300,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "sandbox", "image": image(), "imagePullPolicy": "Never",
                "command": ["python3", "-I", "-c", code],
                "stdin": true, "stdinOnce": true,
                "env": [{"name": "GREETING", "value": "hi"}],
                "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": {"memory": "128Mi", "cpu": "500m", "ephemeral-storage": "64Mi"}},
                "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]
            }],
            "volumes": [{"name": "workspace", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]
        }
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    // The API server's defaults: requests from limits, so the pod is Guaranteed.
    let status = created.status.as_ref().unwrap();
    assert_eq!(status.qos_class.as_deref(), Some("Guaranteed"));
    wait(&pods, "hardened", conditions::is_pod_running()).await;
    let id = k.container_of("hardened").expect("a container");
    let hc = docker_inspect(&id)["HostConfig"].clone();
    assert_eq!(hc["Memory"], 128 * 1024 * 1024);
    assert_eq!(hc["MemorySwap"], 128 * 1024 * 1024, "no swap, as on a node");
    assert_eq!(hc["NanoCpus"], 500_000_000);
    assert_eq!(hc["ReadonlyRootfs"], true);
    assert_eq!(hc["NetworkMode"], "none");
    assert_eq!(hc["CapDrop"], json!(["ALL"]));
    assert!(
        hc["SecurityOpt"].to_string().contains("no-new-privileges"),
        "{hc}"
    );
    assert!(
        hc["Tmpfs"]["/workspace"]
            .as_str()
            .unwrap()
            .contains("size=16777216"),
        "{hc}"
    );
    let mut p = pods
        .attach(
            "hardened",
            &AttachParams::default()
                .stdin(true)
                .stdout(true)
                .stderr(false),
        )
        .await
        .unwrap();
    drop(p.stdin().unwrap());
    let mut out = String::new();
    tokio::time::timeout(BOUND, p.stdout().unwrap().read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let f: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        f[..5],
        ["65534", "65534", "read-only", "16777216", "hi"],
        "{out}"
    );
    assert_eq!(f[5], "0000000000000000", "no capabilities: {out}");
    assert_eq!(f[6], "1", "no new privileges: {out}");
    let done = wait(&pods, "hardened", |p: Option<&Pod>| ended(p)).await;
    assert_eq!(phase(&done), "Succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_and_deadline_come_back_in_the_pod_status() {
    let k = StandIn::start();
    let pods = api(&k).await;
    let mut oom = python_pod("oom", "b = bytearray(1 << 30)", false);
    oom.spec.as_mut().unwrap().containers[0].resources = Some(
        serde_json::from_value(json!({
            "limits": {"memory": "64Mi"}
        }))
        .unwrap(),
    );
    pods.create(&PostParams::default(), &oom).await.unwrap();
    let mut slow = python_pod("slow", "import time; time.sleep(600)", false);
    slow.spec.as_mut().unwrap().active_deadline_seconds = Some(2);
    pods.create(&PostParams::default(), &slow).await.unwrap();

    let oom = wait(&pods, "oom", |p: Option<&Pod>| ended(p)).await;
    assert_eq!(phase(&oom), "Failed");
    let t = terminated(&oom);
    assert_eq!(t.reason.as_deref(), Some("OOMKilled"), "{t:?}");
    assert_eq!(t.exit_code, 137);

    let slow = wait(&pods, "slow", |p: Option<&Pod>| ended(p)).await;
    let s = slow.status.as_ref().unwrap();
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(terminated(&slow).exit_code, 137);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_status_objects() {
    let k = StandIn::start();
    let pods = api(&k).await;
    let code = |r: Result<Pod, kube::Error>| match r {
        Err(kube::Error::Api(s)) => (s.code, s.reason),
        other => panic!("expected a Status error, got {other:?}"),
    };
    assert_eq!(code(pods.get("missing").await), (404, "NotFound".into()));
    pods.create(&PostParams::default(), &python_pod("twice", "pass", false))
        .await
        .unwrap();
    assert_eq!(
        code(
            pods.create(&PostParams::default(), &python_pod("twice", "pass", false))
                .await
        ),
        (409, "AlreadyExists".into())
    );
    let mut rc = python_pod("runtime", "pass", false);
    rc.spec.as_mut().unwrap().runtime_class_name = Some("no-such-class".into());
    assert_eq!(
        code(pods.create(&PostParams::default(), &rc).await),
        (403, "Forbidden".into())
    );
    // generateName: the server picks the name.
    let mut g = python_pod("x", "pass", false);
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let made = pods.create(&PostParams::default(), &g).await.unwrap();
    let name = made.metadata.name.unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    // A missing image: the pod waits, as with imagePullPolicy Never on a node without it.
    let mut missing = python_pod("noimage", "pass", false);
    missing.spec.as_mut().unwrap().containers[0].image =
        Some("mcp-code-executor/none:missing".into());
    pods.create(&PostParams::default(), &missing).await.unwrap();
    let waiting = wait(&pods, "noimage", |p: Option<&Pod>| {
        p.and_then(|p| {
            p.status.as_ref()?.container_statuses.as_ref()?[0]
                .state
                .as_ref()?
                .waiting
                .as_ref()?
                .reason
                .clone()
        })
        .is_some_and(|r| r == "ErrImageNeverPull")
    })
    .await;
    assert_eq!(phase(&waiting), "Pending");
    // Attach to a pod that is not running is refused (kube-rs 4 reports the status code
    // only; the body is the API server's Status, read here over plain HTTP).
    match pods
        .attach("noimage", &AttachParams::default().stdin(true))
        .await
    {
        Err(e) => assert!(e.to_string().contains("400"), "{e}"),
        Ok(_) => panic!("attach to a waiting pod must fail"),
    }
    let url = format!(
        "{}/api/v1/namespaces/{}/pods/noimage/attach?stdin=true&container=main",
        k.base_url, k.namespace
    );
    let resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status(), 400);
    let status: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status["kind"], "Status");
    assert_eq!(
        status["message"],
        "container main in pod noimage is waiting to start: ErrImageNeverPull"
    );
    // Strict field validation (what kubectl asks for) refuses unknown fields.
    let mut bad = serde_json::to_value(python_pod("strict", "pass", false)).unwrap();
    bad["spec"]["notAField"] = json!(1);
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/namespaces/{}/pods?fieldValidation=Strict",
            k.base_url, k.namespace
        ))
        .json(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let status: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        status["message"],
        "strict decoding error: unknown field \"spec.notAField\""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_owner_deletes_its_dependents_and_orphans_go() {
    let k = StandIn::start();
    let pods = api(&k).await;
    let owner = pods
        .create(
            &PostParams::default(),
            &python_pod("owner", "import time; time.sleep(600)", false),
        )
        .await
        .unwrap();
    let owned = |name: &str, uid: &str| {
        let mut p = python_pod(name, "import time; time.sleep(600)", false);
        p.metadata.owner_references = Some(vec![serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": uid
        }))
        .unwrap()]);
        p
    };
    let dep = pods
        .create(
            &PostParams::default(),
            &owned("dependent", owner.metadata.uid.as_deref().unwrap()),
        )
        .await
        .unwrap();
    let orphan = pods
        .create(&PostParams::default(), &owned("orphan", "no-such-uid"))
        .await
        .unwrap();
    wait(&pods, "dependent", conditions::is_pod_running()).await;
    let gone = |p: &Pod| p.metadata.uid.clone().unwrap();
    tokio::time::timeout(
        BOUND,
        await_condition(
            pods.clone(),
            "orphan",
            conditions::is_deleted(&gone(&orphan)),
        ),
    )
    .await
    .expect("an orphan is collected")
    .unwrap();
    assert!(
        pods.get_opt("dependent").await.unwrap().is_some(),
        "a pod with a live owner stays"
    );
    pods.delete("owner", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::timeout(
        BOUND,
        await_condition(
            pods.clone(),
            "dependent",
            conditions::is_deleted(&gone(&dep)),
        ),
    )
    .await
    .expect("the dependent is collected with its owner")
    .unwrap();
}

#[test]
fn dropping_the_stand_in_removes_its_containers() {
    let k = StandIn::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let id = rt.block_on(async {
        let pods = api(&k).await;
        pods.create(
            &PostParams::default(),
            &python_pod("left", "import time; time.sleep(600)", false),
        )
        .await
        .unwrap();
        wait(&pods, "left", conditions::is_pod_running()).await;
        k.container_of("left").expect("a container")
    });
    let labels = docker_inspect(&id)["Config"]["Labels"].clone();
    assert_eq!(labels["io.mcp-code-executor.managed"], "true");
    assert_eq!(labels[kube_standin::LABEL_INSTANCE], k.instance.as_str());
    assert!(labels["io.mcp-code-executor.owner"]
        .as_str()
        .unwrap()
        .contains(&format!("/{}/", std::process::id())));
    assert!(container_exists(&id));
    drop(k);
    assert!(
        !container_exists(&id),
        "the stand-in removed its container when dropped"
    );
}

/// `kubectl` with the stand-in's kubeconfig, or with `--server` alone; stdout, or panic
/// with stderr.
fn kubectl(k: &StandIn, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.kubeconfig_path)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("these tests need kubectl (it comes with the machine image): {e}")
        });
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kubectl_gets_creates_and_deletes_pods() {
    let k = StandIn::start();
    let dir = std::env::temp_dir().join(format!("kubectl-standin-{}", k.instance));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pod.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: from-kubectl\n  labels:\n    made-by: kubectl\n\
             spec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    image: {}\n\
             \x20   imagePullPolicy: Never\n    command: [python3, -c, 'import time; time.sleep(600)']\n\
             \x20   securityContext:\n      runAsUser: 65534\n",
            image()
        ),
    )
    .unwrap();
    let made = kubectl(&k, &["create", "-f", file.to_str().unwrap()]);
    assert_eq!(made.trim(), "pod/from-kubectl created");
    // `--server` alone, as an operator would point kubectl at it.
    let out = Command::new("kubectl")
        .args(["--server", &k.base_url, "-n", &k.namespace, "get", "pods"])
        .output()
        .expect("kubectl");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(listed.contains("from-kubectl"), "{listed}");
    let mut phase = String::new();
    for _ in 0..180 {
        phase = kubectl(
            &k,
            &[
                "get",
                "pod",
                "from-kubectl",
                "-o",
                "jsonpath={.status.phase}",
            ],
        );
        if phase == "Running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(phase, "Running");
    // Server-side printing (a meta.k8s.io Table), as `kubectl get` asks for it.
    let table = kubectl(&k, &["get", "pods", "-o", "wide"]);
    let mut lines = table.lines();
    let head: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        head,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"],
        "{table}"
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["from-kubectl", "1/1", "Running", "0"], "{table}");
    let by_label = kubectl(&k, &["get", "pods", "-l", "made-by=kubectl", "-o", "name"]);
    assert_eq!(by_label.trim(), "pod/from-kubectl");
    assert!(kubectl(
        &k,
        &["get", "pods", "-l", "made-by=someone-else", "-o", "name"]
    )
    .trim()
    .is_empty());
    let id = k.container_of("from-kubectl").expect("a container");
    // `kubectl delete` waits (a watch on the name) until the pod is gone.
    let deleted = kubectl(&k, &["delete", "pod", "from-kubectl"]);
    assert_eq!(deleted.trim(), "pod \"from-kubectl\" deleted");
    assert!(k.pod("from-kubectl").is_none());
    assert!(!container_exists(&id), "its container is removed");
    let none = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&k.kubeconfig_path)
        .args(["get", "pods"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&none.stderr).contains("No resources found"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A raw WebSocket attach to pod `name` offering `protocols`: the socket and the chosen one.
async fn raw_attach(
    k: &StandIn,
    name: &str,
    protocols: &str,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<
            tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
        >,
        String,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = format!(
        "{}/api/v1/namespaces/{}/pods/{name}/attach?container=main&stdin=true&stdout=true&stderr=true",
        k.base_url.replace("http://", "ws://"),
        k.namespace
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
    let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
    let chosen = resp
        .headers()
        .get("Sec-WebSocket-Protocol")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    Ok((ws, chosen))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_framing_at_the_byte_level_v5_and_v4() {
    use futures::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let k = StandIn::start();
    let pods = api(&k).await;
    let echo = "import sys\nfor line in sys.stdin:\n    print('out:' + line.strip(), flush=True)\n    print('err:' + line.strip(), file=sys.stderr, flush=True)\nprint('eof', flush=True)";
    for name in ["v5pod", "v4pod"] {
        pods.create(&PostParams::default(), &python_pod(name, echo, true))
            .await
            .unwrap();
        wait(&pods, name, conditions::is_pod_running()).await;
    }
    // An unknown subprotocol is refused before the upgrade.
    assert!(raw_attach(&k, "v5pod", "base64.channel.k8s.io")
        .await
        .is_err());

    // v5: 1-byte frames open the channels, then channel-prefixed data; [255, 0] closes
    // stdin alone and the output still arrives; a Status on channel 3 ends it.
    let (mut ws, chosen) = raw_attach(&k, "v5pod", "v5.channel.k8s.io, v4.channel.k8s.io")
        .await
        .expect("upgrade");
    assert_eq!(chosen, "v5.channel.k8s.io");
    ws.send(Message::binary(b"\x00hello\n".to_vec()))
        .await
        .unwrap();
    ws.send(Message::binary(vec![255u8, 0])).await.unwrap();
    let mut frames: Vec<Vec<u8>> = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(BOUND, ws.next()).await {
        match m.expect("a frame") {
            Message::Binary(b) => frames.push(b.to_vec()),
            Message::Close(_) => break,
            _ => {}
        }
    }
    let opened: Vec<&Vec<u8>> = frames.iter().take_while(|f| f.len() == 1).collect();
    assert_eq!(opened, [&vec![0u8], &vec![1u8], &vec![2u8], &vec![3u8]]);
    let on = |ch: u8| -> String {
        frames
            .iter()
            .filter(|f| f.len() > 1 && f[0] == ch)
            .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
            .collect()
    };
    assert_eq!(on(1), "out:hello\neof\n");
    assert_eq!(on(2), "err:hello\n");
    let status: serde_json::Value = serde_json::from_str(&on(3)).expect("a Status on channel 3");
    assert_eq!(status["status"], "Success");
    assert_eq!(frames.last().unwrap()[0], 3, "the Status comes last");

    // v4: no close message: a [255, 0] is not one, so stdin stays open and a line sent
    // after it still reaches the program.
    let (mut ws, chosen) = raw_attach(&k, "v4pod", "v4.channel.k8s.io")
        .await
        .expect("upgrade");
    assert_eq!(chosen, "v4.channel.k8s.io");
    ws.send(Message::binary(b"\x00hi\n".to_vec()))
        .await
        .unwrap();
    ws.send(Message::binary(vec![255u8, 0])).await.unwrap();
    ws.send(Message::binary(b"\x00again\n".to_vec()))
        .await
        .unwrap();
    let mut out = String::new();
    while !out.contains("out:again") {
        match tokio::time::timeout(BOUND, ws.next())
            .await
            .expect("output in time")
        {
            Some(Ok(Message::Binary(b))) if b.len() > 1 && b[0] == 1 => {
                out.push_str(&String::from_utf8_lossy(&b[1..]))
            }
            Some(Ok(_)) => {}
            other => panic!("the stream ended early: {other:?} after {out:?}"),
        }
    }
    assert_eq!(out, "out:hi\nout:again\n");
    ws.close(None).await.unwrap();
}
