//! The stand-in's "kubelet": runs a pod as one Docker container built from its PodSpec and
//! writes what happens to it back into the pod's status, as a kubelet would: `Pending` with
//! the container waiting, `Running`, then `Succeeded`/`Failed` with the container
//! terminated (`exitCode`, `reason` `Completed`/`Error`/`OOMKilled`), or `Failed` with
//! `reason: DeadlineExceeded` when `activeDeadlineSeconds` passes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, RemoveContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::store::{now, Store};

/// Labels on every container the stand-in makes.
pub const LABEL_MANAGED: &str = "io.mcp-code-executor.managed";
pub const LABEL_OWNER: &str = "io.mcp-code-executor.owner";
pub const LABEL_INSTANCE: &str = "io.mcp-code-executor.kube-standin";

/// Pods with this label at `egress` get a network (the manifests' `installer-egress`).
pub const EGRESS_LABEL: &str = "io.mcp-code-executor.network";

/// What the kubelet side needs: the daemon, the store, this instance's labels.
pub struct Kubelet {
    pub docker: Docker,
    pub store: Arc<Store>,
    pub instance: String,
    pub owner: String,
    /// RuntimeClass name -> Docker runtime.
    pub runtime_classes: HashMap<String, String>,
    /// Set when the stand-in stops: no container is made after it.
    pub stopping: AtomicBool,
    /// Container creations in flight (the daemon finishes one even if we stop waiting):
    /// the stand-in waits for them before it removes its containers.
    pub creating: AtomicUsize,
}

/// A quantity (`256Mi`, `1G`, `500m`, `1.5`, `1e9`) as a number of units.
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (s, mult) in suffixes {
        if let Some(n) = q.strip_suffix(s) {
            return n.parse::<f64>().ok().map(|n| n * mult);
        }
    }
    q.parse::<f64>().ok()
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

fn waiting(c: &Container, reason: &str, message: Option<String>) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: String::new(),
        ready: false,
        restart_count: 0,
        started: Some(false),
        state: Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn condition(kind: &str, ok: bool, reason: Option<&str>, message: Option<String>) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: if ok { "True" } else { "False" }.into(),
        last_transition_time: Some(now()),
        reason: reason.map(str::to_string),
        message,
        ..Default::default()
    }
}

fn set_conditions(pod: &mut Pod, ready: bool, reason: Option<&str>) {
    let status = pod.status.get_or_insert_with(Default::default);
    status.conditions = Some(vec![
        condition("PodScheduled", true, None, None),
        condition("Initialized", true, None, None),
        condition("ContainersReady", ready, reason, None),
        condition("Ready", ready, reason, None),
    ]);
}

impl Kubelet {
    /// Run `pod` to its end (or until it is deleted). Spawned once per created pod.
    pub async fn run(self: Arc<Self>, pod: Pod) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = uid_of(&pod);
        let spec = pod.spec.clone().unwrap_or_default();
        let c = spec.containers[0].clone();
        let started_at = now();
        // Accepted by the "node": scheduled, container being created.
        let accepted = self.store.modify(&ns, &name, &uid, |p| {
            let spec = p.spec.get_or_insert_with(Default::default);
            spec.node_name = Some("standin".into());
            let s = p.status.get_or_insert_with(Default::default);
            s.host_ip = Some("127.0.0.1".into());
            s.start_time = Some(started_at.clone());
            s.container_statuses = Some(vec![waiting(&c, "ContainerCreating", None)]);
            set_conditions(p, false, Some("ContainersNotReady"));
        });
        if accepted.is_none() {
            return;
        }
        let body = match self.body(&pod, &spec, &c).await {
            Ok(b) => b,
            Err((reason, message)) => {
                self.store.modify(&ns, &name, &uid, |p| {
                    let s = p.status.get_or_insert_with(Default::default);
                    s.container_statuses = Some(vec![waiting(&c, reason, Some(message))]);
                });
                return;
            }
        };
        let cname = format!(
            "k8s_{}_{}_{}_{}",
            c.name,
            name,
            ns,
            &uid[..8.min(uid.len())]
        );
        self.creating.fetch_add(1, Ordering::SeqCst);
        if self.stopping.load(Ordering::SeqCst) {
            self.creating.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        let created = self
            .docker
            .create_container(
                Some(
                    CreateContainerOptionsBuilder::default()
                        .name(&cname)
                        .build(),
                ),
                body,
            )
            .await;
        self.creating.fetch_sub(1, Ordering::SeqCst);
        let id = match created {
            Ok(r) => r.id,
            Err(e) => {
                self.store.modify(&ns, &name, &uid, |p| {
                    let s = p.status.get_or_insert_with(Default::default);
                    s.container_statuses = Some(vec![waiting(
                        &c,
                        "CreateContainerError",
                        Some(e.to_string()),
                    )]);
                });
                return;
            }
        };
        self.store.set_container(&uid, &id);
        // Deleted while the container was being made: the delete path may have missed it.
        if self.store.get(&ns, &name).and_then(|p| p.metadata.uid) != Some(uid.clone()) {
            remove(&self.docker, &id).await;
            return;
        }
        let mut wait = self.docker.wait_container(&id, None);
        if let Err(e) = self.docker.start_container(&id, None).await {
            self.store.modify(&ns, &name, &uid, |p| {
                let s = p.status.get_or_insert_with(Default::default);
                s.phase = Some("Failed".into());
                s.container_statuses = Some(vec![terminated(
                    &c,
                    &id,
                    128,
                    "StartError",
                    Some(e.to_string()),
                    None,
                )]);
                set_conditions(p, false, Some("PodFailed"));
            });
            return;
        }
        let running_since = self
            .docker
            .inspect_container(&id, None)
            .await
            .ok()
            .and_then(|i| i.state.and_then(|s| s.started_at))
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(Time)
            .unwrap_or_else(now);
        self.store.modify(&ns, &name, &uid, |p| {
            let s = p.status.get_or_insert_with(Default::default);
            s.phase = Some("Running".into());
            s.pod_ip = None;
            s.container_statuses = Some(vec![ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone().unwrap_or_default(),
                image_id: format!("docker-pullable://{}", c.image.clone().unwrap_or_default()),
                container_id: Some(format!("docker://{id}")),
                ready: true,
                started: Some(true),
                restart_count: 0,
                state: Some(ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(running_since.clone()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]);
            set_conditions(p, true, None);
        });
        let deadline = spec
            .active_deadline_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64));
        let deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let mut exceeded = false;
        tokio::select! {
            _ = wait.next() => {}
            _ = deadline => {
                exceeded = true;
                let _ = self
                    .docker
                    .kill_container(&id, Some(KillContainerOptionsBuilder::default().signal("SIGKILL").build()))
                    .await;
                let _ = wait.next().await;
            }
        }
        // Docker sets `OOMKilled` from the OOM event, which can land just after the exit
        // that ended the wait: a container killed by SIGKILL (137) and not (yet) marked is
        // looked at again a few times before it is called an `Error` (as a kubelet reads
        // the OOM kill from the cgroup's events, not from the order they arrived in).
        let mut state = None;
        for look in 0..6 {
            if look > 0 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            state = self
                .docker
                .inspect_container(&id, None)
                .await
                .ok()
                .and_then(|i| i.state);
            let unmarked_kill = state
                .as_ref()
                .is_some_and(|s| s.exit_code == Some(137) && s.oom_killed != Some(true));
            if !unmarked_kill {
                break;
            }
        }
        let Some(state) = state else {
            return; // removed under us: the pod was deleted
        };
        let code = state.exit_code.unwrap_or(-1);
        let oom = state.oom_killed.unwrap_or(false);
        let finished = state
            .finished_at
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .map(Time)
            .unwrap_or_else(now);
        let reason = if oom {
            "OOMKilled"
        } else if code == 0 {
            "Completed"
        } else {
            "Error"
        };
        self.store.modify(&ns, &name, &uid, |p| {
            let s = p.status.get_or_insert_with(Default::default);
            let mut cs = terminated(&c, &id, code as i32, reason, None, Some(finished.clone()));
            if let Some(t) = cs.state.as_mut().and_then(|s| s.terminated.as_mut()) {
                t.started_at = Some(running_since.clone());
            }
            s.container_statuses = Some(vec![cs]);
            if exceeded {
                s.phase = Some("Failed".into());
                s.reason = Some("DeadlineExceeded".into());
                s.message =
                    Some("Pod was active on the node longer than the specified deadline".into());
                set_conditions(p, false, Some("PodFailed"));
            } else {
                s.phase = Some(if code == 0 { "Succeeded" } else { "Failed" }.into());
                set_conditions(
                    p,
                    false,
                    Some(if code == 0 {
                        "PodCompleted"
                    } else {
                        "PodFailed"
                    }),
                );
            }
        });
    }

    /// The container for `c` of `pod`, or the waiting reason and message a kubelet gives.
    async fn body(
        &self,
        pod: &Pod,
        spec: &PodSpec,
        c: &Container,
    ) -> Result<ContainerCreateBody, (&'static str, String)> {
        let image = c.image.clone().unwrap_or_default();
        let inspected = match self.docker.inspect_image(&image).await {
            Ok(i) => i,
            Err(_) => {
                return Err((
                    "ErrImageNeverPull",
                    format!("Container image \"{image}\" is not present with pull policy of Never"),
                ))
            }
        };
        let psc = spec.security_context.clone().unwrap_or_default();
        let csc = c.security_context.clone().unwrap_or_default();
        let user = csc.run_as_user.or(psc.run_as_user);
        let group = csc.run_as_group.or(psc.run_as_group);
        let non_root = csc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false);
        let image_user = inspected.config.and_then(|c| c.user).unwrap_or_default();
        if non_root {
            let root = match user {
                Some(u) => u == 0,
                None => {
                    image_user.is_empty() || image_user == "root" || image_user.starts_with("0")
                }
            };
            if root {
                return Err((
                    "CreateContainerConfigError",
                    "container has runAsNonRoot and image will run as root".into(),
                ));
            }
        }
        let user = match (user, group) {
            (Some(u), Some(g)) => Some(format!("{u}:{g}")),
            (Some(u), None) => Some(u.to_string()),
            (None, Some(g)) => Some(format!(
                "{}:{g}",
                image_user.split(':').next().unwrap_or("0")
            )),
            (None, None) => None,
        };
        let mut security_opt = Vec::new();
        if csc.allow_privilege_escalation == Some(false) {
            security_opt.push("no-new-privileges".to_string());
        }
        let seccomp = csc.seccomp_profile.or(psc.seccomp_profile);
        if seccomp.as_ref().is_some_and(|s| s.type_ == "Unconfined") {
            security_opt.push("seccomp=unconfined".to_string());
        }
        let caps = csc.capabilities.unwrap_or_default();
        let limits = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        let memory = limits
            .get("memory")
            .and_then(|q| quantity(&q.0))
            .map(|b| b as i64);
        let nano_cpus = limits
            .get("cpu")
            .and_then(|q| quantity(&q.0))
            .map(|c| (c * 1e9) as i64);
        let mut tmpfs = HashMap::new();
        let mut mounts = Vec::new();
        for m in c.volume_mounts.iter().flatten() {
            let Some(v) = spec.volumes.iter().flatten().find(|v| v.name == m.name) else {
                return Err((
                    "CreateContainerConfigError",
                    format!("volume \"{}\" not found", m.name),
                ));
            };
            if let Some(e) = &v.empty_dir {
                let mut opts = vec![
                    if m.read_only == Some(true) {
                        "ro"
                    } else {
                        "rw"
                    }
                    .to_string(),
                    "mode=1777".to_string(),
                ];
                if let Some(size) = e.size_limit.as_ref().and_then(|q| quantity(&q.0)) {
                    opts.push(format!("size={}", size as u64));
                }
                tmpfs.insert(m.mount_path.clone(), opts.join(","));
            } else if let Some(pvc) = &v.persistent_volume_claim {
                if self.docker.inspect_volume(&pvc.claim_name).await.is_err() {
                    return Err((
                        "CreateContainerConfigError",
                        format!("persistentvolumeclaim \"{}\" not found", pvc.claim_name),
                    ));
                }
                mounts.push(Mount {
                    typ: Some(MountType::VOLUME),
                    source: Some(pvc.claim_name.clone()),
                    target: Some(m.mount_path.clone()),
                    read_only: Some(m.read_only == Some(true) || pvc.read_only == Some(true)),
                    ..Default::default()
                });
            } else {
                return Err((
                    "CreateContainerConfigError",
                    format!(
                        "volume \"{}\": the stand-in has emptyDir and persistentVolumeClaim only",
                        m.name
                    ),
                ));
            }
        }
        let runtime = match &spec.runtime_class_name {
            Some(rc) => self.runtime_classes.get(rc).cloned(),
            None => None,
        };
        let uid = uid_of(pod);
        let mut labels = HashMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_OWNER.to_string(), self.owner.clone()),
            (LABEL_INSTANCE.to_string(), self.instance.clone()),
            (
                "io.kubernetes.pod.name".to_string(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                "io.kubernetes.pod.namespace".to_string(),
                pod.metadata.namespace.clone().unwrap_or_default(),
            ),
            ("io.kubernetes.pod.uid".to_string(), uid),
        ]);
        for (k, v) in pod.metadata.labels.iter().flatten() {
            labels.insert(format!("io.kubernetes.pod.label.{k}"), v.clone());
        }
        let stdin = c.stdin.unwrap_or(false);
        // The effect of the manifests' NetworkPolicies, hard-wired: no network, except
        // for pods labelled for egress (installers).
        let egress = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(EGRESS_LABEL))
            .is_some_and(|v| v == "egress");
        Ok(ContainerCreateBody {
            image: Some(image),
            entrypoint: c.command.clone(),
            cmd: c.args.clone(),
            env: Some(
                c.env
                    .iter()
                    .flatten()
                    .filter_map(|e| e.value.as_ref().map(|v| format!("{}={v}", e.name)))
                    .collect(),
            ),
            working_dir: c.working_dir.clone(),
            user,
            hostname: Some(
                spec.hostname
                    .clone()
                    .or(pod.metadata.name.clone())
                    .unwrap_or_default()
                    .chars()
                    .take(63)
                    .collect(),
            ),
            open_stdin: Some(stdin),
            stdin_once: Some(c.stdin_once.unwrap_or(false)),
            attach_stdin: Some(stdin),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(c.tty.unwrap_or(false)),
            labels: Some(labels),
            host_config: Some(HostConfig {
                network_mode: Some(if egress { "bridge" } else { "none" }.into()),
                readonly_rootfs: csc.read_only_root_filesystem,
                cap_drop: caps.drop,
                cap_add: caps.add,
                security_opt: Some(security_opt),
                memory,
                memory_swap: memory,
                nano_cpus,
                tmpfs: Some(tmpfs),
                mounts: Some(mounts),
                runtime,
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

fn terminated(
    c: &Container,
    id: &str,
    code: i32,
    reason: &str,
    message: Option<String>,
    finished: Option<Time>,
) -> ContainerStatus {
    ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        image_id: format!("docker-pullable://{}", c.image.clone().unwrap_or_default()),
        container_id: Some(format!("docker://{id}")),
        ready: false,
        started: Some(false),
        restart_count: 0,
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.into()),
                message,
                finished_at: finished,
                container_id: Some(format!("docker://{id}")),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Force-remove a container (killing it); gone already is fine.
pub async fn remove(docker: &Docker, id: &str) {
    let opts = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    for attempt in 0..5u64 {
        match docker.remove_container(id, Some(opts.clone())).await {
            Ok(())
            | Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(100 * (attempt + 1))).await,
        }
    }
}
