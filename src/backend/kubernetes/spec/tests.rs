use super::*;
use std::time::Duration;

fn config() -> KubeConfig {
    KubeConfig {
        runtime_class: Some("gvisor".into()),
        owner_pod: Some(OwnerPod {
            namespace: "sandboxes".into(),
            name: "server-0".into(),
            uid: "u-1".into(),
        }),
        namespace: "sandboxes".into(),
        data_dir: Some("/data".into()),
        ..KubeConfig::new("img:1")
    }
}

/// Every piece of hardening a pod gets, with limits unlike the defaults so that each
/// one is seen to come from the job.
#[test]
fn pod_hardening_is_all_there() {
    let l = Limits {
        memory_bytes: 300 << 20,
        cpus: 0.25,
        nofile: 99,
        workspace_bytes: 5 << 20,
        tmp_bytes: 3 << 20,
        timeout: Duration::from_secs(7),
        ..Limits::default()
    };
    let c = config();
    let p = pod(
        &c,
        "host/1/2",
        &l,
        &RunEnv::default(),
        "acme corp",
        "abc123",
        Lifetime::Run(l.timeout),
    )
    .unwrap();
    let meta = &p.metadata;
    assert_eq!(meta.name.as_deref(), Some("mcpx-abc123"));
    assert_eq!(meta.namespace.as_deref(), Some("sandboxes"));
    let labels = meta.labels.as_ref().unwrap();
    assert_eq!(labels[LABEL_MANAGED], "true");
    assert_eq!(labels[LABEL_JOB], "abc123");
    assert_eq!(labels[LABEL_TENANT], "acme_corp");
    assert_eq!(labels[LABEL_OWNER], owner_label("host/1/2"));
    assert_eq!(labels[LABEL_NETWORK], "none");
    let ann = meta.annotations.as_ref().unwrap();
    assert_eq!(ann[ANNOTATION_OWNER], "host/1/2");
    assert_eq!(ann[ANNOTATION_TENANT], "acme corp");
    let owners = meta.owner_references.as_ref().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str()
        ),
        ("Pod", "server-0", "u-1")
    );

    let s = p.spec.as_ref().unwrap();
    assert_eq!(s.restart_policy.as_deref(), Some("Never"));
    assert_eq!(s.automount_service_account_token, Some(false));
    assert_eq!(s.enable_service_links, Some(false));
    assert_eq!(s.host_network, Some(false));
    assert_eq!(s.host_pid, Some(false));
    assert_eq!(s.host_ipc, Some(false));
    assert_eq!(s.runtime_class_name.as_deref(), Some("gvisor"));
    // 7 s of code, 30 s to start, twice the runner's grace.
    assert_eq!(s.active_deadline_seconds, Some(47));
    let psc = s.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_user, Some(65534));
    assert_eq!(psc.run_as_group, Some(65534));
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    assert_eq!(psc.fs_group, None, "no claim, no fsGroup");

    assert_eq!(s.containers.len(), 1);
    let k = &s.containers[0];
    assert_eq!(k.image.as_deref(), Some("img:1"));
    assert_eq!(k.stdin, Some(true));
    assert_eq!(k.stdin_once, Some(true));
    assert_eq!(k.tty, Some(false));
    let cmd = k.command.as_ref().unwrap();
    assert_eq!(
        cmd.last().map(String::as_str),
        Some(crate::backend::image::PYTHON)
    );
    assert_eq!(cmd[cmd.len() - 2], RUNNER);
    assert!(
        cmd[4].contains("RLIMIT_NOFILE, (99, 99)"),
        "nofile from the job: {}",
        cmd[4]
    );
    let sc = k.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_user, Some(65534));
    assert_eq!(sc.run_as_group, Some(65534));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.privileged, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(caps.add, None);
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );

    let r = k.resources.as_ref().unwrap();
    let lim = r.limits.as_ref().unwrap();
    assert_eq!(lim["cpu"].0, "250m");
    assert_eq!(lim["memory"].0, (300u64 << 20).to_string());
    assert_eq!(lim["ephemeral-storage"].0, (8u64 << 20).to_string());
    assert_eq!(r.requests.as_ref(), Some(lim), "requests equal limits");

    let vols = s.volumes.as_ref().unwrap();
    assert_eq!(vols.len(), 2, "the workspace and /tmp, nothing else");
    for (v, size) in vols.iter().zip([5u64 << 20, 3 << 20]) {
        let ed = v.empty_dir.as_ref().unwrap();
        assert_eq!(ed.medium.as_deref(), Some("Memory"));
        assert_eq!(
            ed.size_limit.as_ref().map(|q| q.0.clone()),
            Some(size.to_string())
        );
    }
    let mounts: Vec<&str> = k
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert_eq!(mounts, ["/workspace", "/tmp"]);
    let env = k.env.as_ref().unwrap();
    assert!(env.iter().any(|e| e.name == "MCPX_WAIT_LIMIT"));
}

#[test]
fn owner_references_only_within_the_namespace() {
    let mut c = config();
    c.owner_pod.as_mut().unwrap().namespace = "server".into();
    let p = pod(
        &c,
        "o",
        &Limits::default(),
        &RunEnv::default(),
        "t",
        "j",
        Lifetime::Long,
    )
    .unwrap();
    assert_eq!(p.metadata.owner_references, None);
    assert_eq!(
        p.metadata.annotations.unwrap()[ANNOTATION_OWNER_POD],
        "server/server-0/u-1"
    );
    assert_eq!(
        p.spec.unwrap().active_deadline_seconds,
        Some(c.long_deadline.as_secs() as i64)
    );
}

#[test]
fn labels_and_names_are_valid() {
    assert_eq!(label_value("-a/b c-"), "a_b_c");
    assert_eq!(label_value("///"), "x");
    assert_eq!(label_value(&"x".repeat(100)).len(), 63);
    assert_eq!(pod_name("AB_c"), "mcpx-ab-c");
    assert_eq!(owner_label("host/1/2").len(), 16);
}

#[test]
fn environments_come_from_the_volume_or_the_image() {
    let managed = PathBuf::from("/data/envs/default");
    let run_env = RunEnv {
        python: Some("/data/envs/default/bin/python".into()),
        sources: vec![Source::host(&managed)],
        ..RunEnv::default()
    };
    // No volume: the pod makes the managed environment (a venv over the image's
    // Python, nothing installed) in a memory-backed directory at its path.
    let p = place(&config(), &run_env).unwrap();
    assert_eq!(p.python.as_deref(), Some("/data/envs/default/bin/python"));
    assert_eq!(p.venvs, ["/data/envs/default"]);
    assert_eq!(p.mounts[0].mount_path, "/data/envs/default");
    assert!(p.volumes[0].empty_dir.is_some());
    // Any other environment needs the volume.
    assert!(place(
        &config(),
        &RunEnv {
            sources: vec![Source::host("/data/my-venv")],
            ..RunEnv::default()
        }
    )
    .is_err());
    // Installs are refused with the reason.
    let install = RunEnv {
        network: true,
        sources: vec![Source::host_writable("/data/install/x")],
        ..RunEnv::default()
    };
    match place(&config(), &install) {
        Err(BackendError::Rejected(m)) => assert!(m.contains("--kube-env-volume"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A host path outside the data directory cannot reach a pod.
    assert!(place(
        &config(),
        &RunEnv {
            sources: vec![Source::host("/opt/venv")],
            ..RunEnv::default()
        }
    )
    .is_err());
    // With a volume: the PVC, at the same path, read-only for runs, writable for
    // installers.
    let c = KubeConfig {
        env_volume: Some("envs".into()),
        ..config()
    };
    let p = place(&c, &run_env).unwrap();
    assert_eq!(p.python.as_deref(), Some("/data/envs/default/bin/python"));
    let pvc = p.volumes[0].persistent_volume_claim.as_ref().unwrap();
    assert_eq!(
        (pvc.claim_name.as_str(), pvc.read_only),
        ("envs", Some(true))
    );
    assert_eq!(p.mounts[0].mount_path, "/data/envs/default");
    assert_eq!(p.mounts[0].sub_path.as_deref(), Some("envs/default"));
    assert_eq!(p.mounts[0].read_only, Some(true));
    let p = place(&c, &install).unwrap();
    assert_eq!(p.mounts[0].read_only, Some(false));
    let spec = pod(
        &c,
        "o",
        &Limits::default(),
        &run_env,
        "t",
        "j",
        Lifetime::Long,
    )
    .unwrap()
    .spec
    .unwrap();
    assert_eq!(spec.security_context.unwrap().fs_group, Some(65534));
}
