//! What a sandbox pod is made of: labels, command, the hardening of its securityContext,
//! its resources and volumes, and how the environment's [`Source`]s reach it, all in one
//! place so that one unit test (`pod_hardening_is_all_there`) sees every piece of it.
//! Pure: nothing here talks to the API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::KubeConfig;
use crate::backend::{protocol, BackendError};
use crate::job::{Limits, RunEnv, Source};

/// Labels (the Docker backend's keys: valid Kubernetes label names as they are).
pub use crate::backend::labels::{LABEL_JOB, LABEL_MANAGED, LABEL_OWNER, LABEL_TENANT};
/// `egress` on the pods of jobs that may reach the network (installers), `none` on the
/// others: a NetworkPolicy allows egress to the first only.
pub const LABEL_NETWORK: &str = "io.mcp-code-executor.network";
/// The full owner id (`host/pid/start-time`), which does not fit a label value.
pub const ANNOTATION_OWNER: &str = "io.mcp-code-executor/owner";
/// The server pod (`namespace/name/uid`) that made this pod, when the server runs in the
/// cluster: the sweep removes the pods of a server pod that is gone.
pub const ANNOTATION_OWNER_POD: &str = "io.mcp-code-executor/owner-pod";
/// The tenant id as given (its label is a sanitised form).
pub const ANNOTATION_TENANT: &str = "io.mcp-code-executor/tenant";

/// The sandbox's one container.
pub const CONTAINER: &str = "sandbox";
/// Uid and gid the code runs as (`nobody`).
const SANDBOX_ID: i64 = 65534;
/// The runner, started with `-I -S`; the interpreter for the code is appended.
const RUNNER: &str = "/opt/mcp-code-executor/runner.py";

/// The pod's command: a PodSpec has no ulimits, so a short Python prelude lowers
/// `RLIMIT_NOFILE` (soft and hard: the code cannot raise it again) to the job's and
/// `exec`s the runner as the Docker backend starts it.
fn command(nofile: u64, venvs: &[String], python: String) -> Vec<String> {
    let venvs = serde_json::to_string(venvs).expect("strings serialise");
    let prelude = format!(
        "import os, resource, sys\n\
         resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))\n\
         for p in {venvs}:\n    \
         import venv; venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=True).create(p)\n\
         os.execv(sys.executable, [sys.executable, '-I', '-S'] + sys.argv[1:])\n"
    );
    [
        crate::backend::image::PYTHON.to_string(),
        "-I".into(),
        "-S".into(),
        "-c".into(),
        prelude,
        RUNNER.into(),
        python,
    ]
    .into()
}

/// The server's own pod, from the downward API, for `ownerReferences`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

pub use crate::backend::engine::Lifetime;

/// A label value: at most 63 of `[A-Za-z0-9_.-]`, beginning and ending with an
/// alphanumeric; anything else becomes `_`, an empty result `x`.
pub fn label_value(s: &str) -> String {
    let mut v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    while v.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.pop();
    }
    let v = v.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if v.is_empty() {
        "x".into()
    } else {
        v.to_string()
    }
}

/// The owner label: a short hash of the owner id (which holds `/`).
pub fn owner_label(owner: &str) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(owner.as_bytes());
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The pod's name for job (or pool slot) `id`: a DNS label.
pub fn pod_name(id: &str) -> String {
    let id: String = id
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(50)
        .collect();
    format!("mcpx-{}", id.trim_matches('-'))
}

/// The interpreter a job with `env` runs (after [`Placement`] mapped it).
fn python<'a>(config: &'a KubeConfig, env: &'a RunEnv) -> &'a str {
    env.python.as_deref().unwrap_or(&config.python)
}

/// How the job's environment reaches a pod: volumes (and their mounts), and the interpreter
/// to run. Environments are directories of the server's data directory; in a cluster that
/// directory is the environment volume (a PVC the server mounts there), and each source
/// under it is mounted with its `subPath` at the same path in the pod. Without a volume a
/// pod has the image's own Python only: the managed environment is a venv over that Python
/// with nothing installed, so it is run as the image's Python; installs are refused.
#[derive(Debug, Default, PartialEq)]
pub struct Placement {
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
    pub python: Option<String>,
    /// Managed environments the pod makes before its runner starts (no volume).
    pub venvs: Vec<String>,
}

/// Is `rel` (under the data directory) a managed environment: `envs/default` or
/// `tenants/<id>/envs/default`?
fn is_managed_env(rel: &Path) -> bool {
    let parts: Vec<_> = rel.components().map(|c| c.as_os_str()).collect();
    match parts.as_slice() {
        [e, d] => *e == "envs" && *d == "default",
        [t, _, e, d] => *t == "tenants" && *e == "envs" && *d == "default",
        _ => false,
    }
}

/// The refusal of an install (or of any networked job) without an environment volume.
pub const NO_VOLUME_FOR_INSTALLS: &str = "installing packages on the Kubernetes backend needs \
     an environment volume (--kube-env-volume CLAIM, a ReadWriteMany PVC the server mounts at its \
     data directory): without one, sandboxes have the image's own Python and packages only; \
     bake what you need into the sandbox image, or configure the volume";

/// Map `env`'s sources to pod volumes, or say why one cannot be given.
pub fn place(config: &KubeConfig, env: &RunEnv) -> Result<Placement, BackendError> {
    let mut p = Placement {
        python: env.python.clone(),
        ..Placement::default()
    };
    let data = config.data_dir.as_deref();
    let under_data = |path: &Path| -> Option<PathBuf> {
        let d = data?;
        path.strip_prefix(d).ok().map(Path::to_path_buf)
    };
    if env.network && config.env_volume.is_none() {
        return Err(BackendError::Rejected(NO_VOLUME_FOR_INSTALLS.into()));
    }
    for (i, s) in env.sources.iter().enumerate() {
        match s {
            Source::Image { .. } => {}
            Source::HostPath { path, writable } => {
                let Some(rel) = under_data(path) else {
                    return Err(BackendError::Rejected(format!(
                        "the Kubernetes backend cannot mount the server's `{}` into a pod: \
                         sandboxes run on other nodes. Environments must live under the \
                         server's data directory on the environment volume \
                         (--kube-env-volume), or be baked into the sandbox image",
                        path.display()
                    )));
                };
                let name = format!("env-{i}");
                match &config.env_volume {
                    Some(claim) => {
                        p.volumes.push(Volume {
                            name: name.clone(),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: claim.clone(),
                                read_only: Some(!writable),
                            }),
                            ..Default::default()
                        });
                        p.mounts.push(VolumeMount {
                            name,
                            mount_path: path.display().to_string(),
                            sub_path: (!rel.as_os_str().is_empty())
                                .then(|| rel.display().to_string()),
                            read_only: Some(!writable),
                            ..Default::default()
                        });
                    }
                    None if !is_managed_env(&rel) => {
                        return Err(BackendError::Rejected(format!(
                            "`{}` is not on an environment volume: without --kube-env-volume \
                             the Kubernetes backend has the managed environment only (the \
                             image's Python); configure the volume to use other environments",
                            path.display()
                        )));
                    }
                    None => {
                        // The managed environment without a volume: a venv over the image's
                        // Python with nothing installed (installs need the volume). Each pod
                        // makes it anew, in a small memory-backed directory at its path,
                        // before the runner starts; its creation job writes it there too.
                        p.volumes.push(Volume {
                            name: name.clone(),
                            empty_dir: Some(EmptyDirVolumeSource {
                                medium: Some("Memory".into()),
                                size_limit: Some(Quantity("16Mi".into())),
                            }),
                            ..Default::default()
                        });
                        p.mounts.push(VolumeMount {
                            name,
                            mount_path: path.display().to_string(),
                            ..Default::default()
                        });
                        if !writable {
                            p.venvs.push(path.display().to_string());
                        }
                    }
                }
            }
            Source::Volume {
                name,
                subpath,
                target,
                writable,
            } => {
                crate::backend::sources::check_volume("claim", name, target)?;
                let vname = format!("env-{i}");
                p.volumes.push(Volume {
                    name: vname.clone(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: name.clone(),
                        read_only: Some(!writable),
                    }),
                    ..Default::default()
                });
                p.mounts.push(VolumeMount {
                    name: vname,
                    mount_path: target.display().to_string(),
                    sub_path: subpath.as_ref().map(|s| s.display().to_string()),
                    read_only: Some(!writable),
                    ..Default::default()
                });
            }
        }
    }
    Ok(p)
}

/// `uid:gid` of `env.user`, or the sandbox's `nobody`.
fn ids(env: &RunEnv) -> (i64, i64) {
    env.user
        .as_deref()
        .and_then(|u| {
            let (a, b) = u.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or((SANDBOX_ID, SANDBOX_ID))
}

fn quantity(bytes: u64) -> Quantity {
    Quantity(bytes.to_string())
}

/// What a pod for `tenant`'s job (or pool slot) `id` is: the runner as its command waiting
/// on stdin, the hardening, the job's limits, the environment's volumes.
pub fn pod(
    config: &KubeConfig,
    owner: &str,
    limits: &Limits,
    env: &RunEnv,
    tenant: &str,
    id: &str,
    lifetime: Lifetime,
) -> Result<Pod, BackendError> {
    let placed = place(config, env)?;
    let py = placed
        .python
        .clone()
        .unwrap_or_else(|| python(config, &RunEnv::default()).to_string());
    let (uid, gid) = ids(env);
    let has_claim = placed
        .volumes
        .iter()
        .any(|v| v.persistent_volume_claim.is_some());
    let labels = BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_JOB.to_string(), label_value(id)),
        (LABEL_TENANT.to_string(), label_value(tenant)),
        (LABEL_OWNER.to_string(), owner_label(owner)),
        (
            LABEL_NETWORK.to_string(),
            if env.network { "egress" } else { "none" }.to_string(),
        ),
    ]);
    let mut annotations = BTreeMap::from([
        (ANNOTATION_OWNER.to_string(), owner.to_string()),
        (ANNOTATION_TENANT.to_string(), tenant.to_string()),
    ]);
    let mut owner_references = None;
    if let Some(o) = &config.owner_pod {
        annotations.insert(
            ANNOTATION_OWNER_POD.to_string(),
            format!("{}/{}/{}", o.namespace, o.name, o.uid),
        );
        // An owner must be in the dependent's namespace: a reference across namespaces
        // reads as an owner that does not exist, and the garbage collector would delete
        // the sandbox at once. Then the sweep of the next server removes them.
        if o.namespace == config.namespace {
            owner_references = Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: Some(false),
                block_owner_deletion: Some(false),
            }]);
        }
    }
    let deadline = match lifetime {
        Lifetime::Run(timeout) => {
            timeout + crate::backend::engine::live::START_DEADLINE + protocol::BACKSTOP_GRACE * 2
        }
        Lifetime::Long => config.long_deadline,
    };
    let resources = {
        let l = BTreeMap::from([
            (
                "cpu".to_string(),
                Quantity(format!(
                    "{}m",
                    ((limits.cpus * 1000.0).round() as u64).max(1)
                )),
            ),
            ("memory".to_string(), quantity(limits.memory_bytes)),
            (
                "ephemeral-storage".to_string(),
                quantity(limits.workspace_bytes + limits.tmp_bytes),
            ),
        ]);
        ResourceRequirements {
            // Requests equal to limits: the Guaranteed class, and a scheduler that places
            // a pod only where its limits fit.
            requests: Some(l.clone()),
            limits: Some(l),
            ..Default::default()
        }
    };
    let memory_dir = |size: u64| EmptyDirVolumeSource {
        medium: Some("Memory".into()),
        size_limit: Some(quantity(size)),
    };
    let mut volumes = vec![
        Volume {
            name: "workspace".into(),
            empty_dir: Some(memory_dir(limits.workspace_bytes)),
            ..Default::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(memory_dir(limits.tmp_bytes)),
            ..Default::default()
        },
    ];
    volumes.extend(placed.volumes.iter().cloned());
    let mut mounts = vec![
        VolumeMount {
            name: "workspace".into(),
            mount_path: protocol::WORKDIR.into(),
            ..Default::default()
        },
        VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..Default::default()
        },
    ];
    mounts.extend(placed.mounts.iter().cloned());
    let env_vars: Vec<EnvVar> = env
        .vars
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(protocol::runner_env(limits))
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            ..Default::default()
        })
        .collect();
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(id)),
            namespace: Some(config.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references,
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            hostname: Some("sandbox".into()),
            runtime_class_name: config.runtime_class.clone(),
            active_deadline_seconds: Some(deadline.as_secs().max(1) as i64),
            termination_grace_period_seconds: Some(0),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(uid),
                run_as_group: Some(gid),
                run_as_non_root: Some(true),
                // A claim's files belong to the sandbox group, so that installers (and
                // the server, same uid) can write into the environment volume.
                fs_group: has_claim.then_some(gid),
                fs_group_change_policy: has_claim.then(|| "OnRootMismatch".to_string()),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(config.image.clone()),
                image_pull_policy: Some(config.pull_policy.clone()),
                command: Some(command(limits.nofile, &placed.venvs, py)),
                env: Some(env_vars),
                working_dir: Some(protocol::WORKDIR.into()),
                stdin: Some(true),
                stdin_once: Some(true),
                tty: Some(false),
                resources: Some(resources),
                security_context: Some(SecurityContext {
                    run_as_user: Some(uid),
                    run_as_group: Some(gid),
                    run_as_non_root: Some(true),
                    read_only_root_filesystem: Some(true),
                    allow_privilege_escalation: Some(false),
                    privileged: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        add: None,
                    }),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                volume_mounts: Some(mounts),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
