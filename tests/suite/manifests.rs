//! The Kubernetes manifests (`deploy/kubernetes/`): `kubectl kustomize` renders them, every
//! rendered object validates against the Kubernetes OpenAPI schemas offline
//! (`kubernetes-validate`, strict: unknown fields fail), and the security-relevant parts say
//! what docs/kubernetes.md says they do. No skip: without `kubectl` or `kubernetes-validate` these
//! fail, with the command that installs them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The Kubernetes version the schemas are taken from (k8s-openapi's `v1_33` too).
const SCHEMA_VERSION: &str = "1.33.0";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `kubectl kustomize DIR`, as text.
fn render(dir: &str) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join(dir))
        .output()
        .unwrap_or_else(|e| {
            panic!("these tests need kubectl (scripts/test.sh installs it; apt-get install kubectl): {e}")
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {dir} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 YAML")
}

fn objects(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml).expect("kustomize's output is YAML")
}

/// Run `kubernetes-validate --strict` on `yaml`; Ok or its report.
fn validate(yaml: &str, name: &str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("manifests-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    // scripts/test.sh installs it in a venv under target/; else one on PATH.
    let venv = root().join("target/kube-validate/bin/kubernetes-validate");
    let validator = if venv.exists() {
        venv
    } else {
        PathBuf::from("kubernetes-validate")
    };
    let out = Command::new(&validator)
        .args(["--strict", "--no-warn", "-k", SCHEMA_VERSION])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "these tests need the offline schema validator: `pip install \
                 kubernetes-validate==1.37.0` (scripts/test.sh installs it in target/kube-validate): {e}"
            )
        });
    let _ = std::fs::remove_dir_all(&dir);
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(report)
    } else {
        Err(report)
    }
}

fn kinds(objs: &[Value]) -> BTreeSet<String> {
    objs.iter()
        .map(|o| o["kind"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered manifests"))
}

fn assert_validates(dir: &str, name: &str) -> Vec<Value> {
    let yaml = render(dir);
    let report = validate(&yaml, name).unwrap_or_else(|r| {
        panic!("{dir} does not validate against the {SCHEMA_VERSION} schemas:\n{r}")
    });
    let objs = objects(&yaml);
    // One "passed" line per object: nothing was skipped as unknown.
    let passed = report.matches(" passed for resource ").count();
    assert_eq!(passed, objs.len(), "every object validated:\n{report}");
    objs
}

#[test]
fn base_renders_and_validates_against_the_schemas() {
    let objs = assert_validates("deploy/kubernetes", "base");
    let expected: BTreeSet<String> = [
        "Namespace",
        "NetworkPolicy",
        "ResourceQuota",
        "LimitRange",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Secret",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(kinds(&objs), expected);
    // The shipped alert rules, for the operator's Prometheus (docs/hosting.md "Operating").
    let rules = find(&objs, "ConfigMap", "mcp-code-executor-prometheus-rules");
    assert!(rules["data"]["rules.yml"]
        .as_str()
        .is_some_and(|r| r.contains("alert: McpExecutorPoolDry")));
    // More than one replica (docs/hosting.md "Scale"): two, one kept up in a disruption,
    // peers found through a headless Service that lists draining replicas too.
    let server = find(&objs, "Deployment", "mcp-code-executor");
    assert_eq!(server["spec"]["replicas"], 2);
    assert_eq!(
        server["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let pdb = find(&objs, "PodDisruptionBudget", "mcp-code-executor");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let peers = find(&objs, "Service", "mcp-code-executor-peers");
    assert_eq!(peers["spec"]["clusterIP"], "None");
    assert_eq!(peers["spec"]["publishNotReadyAddresses"], true);
    let env = server["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains("MCP_EXECUTOR_PEERS") && env.contains("dns+http://mcp-code-executor-peers."),
        "{env}"
    );
    assert!(env.contains("MCP_EXECUTOR_CLUSTER_SECRET"), "{env}");
}

#[test]
fn gvisor_variant_renders_and_validates_with_its_runtime_class() {
    let objs = assert_validates("deploy/kubernetes/gvisor", "gvisor");
    let rc = find(&objs, "RuntimeClass", "gvisor");
    assert_eq!(rc["handler"], "runsc");
    let env = &find(&objs, "Deployment", "mcp-code-executor")["spec"]["template"]["spec"]
        ["containers"][0]["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["value"] == "gvisor"),
        "the server is told to use the RuntimeClass: {env}"
    );
}

fn deploy_env(objs: &[Value]) -> Vec<Value> {
    find(objs, "Deployment", "mcp-code-executor")["spec"]["template"]["spec"]["containers"][0]
        ["env"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn environments_variant_puts_the_data_directory_on_a_claim() {
    let objs = assert_validates("deploy/kubernetes/environments", "environments");
    let pvc = find(&objs, "PersistentVolumeClaim", "mcp-code-executor-data");
    assert_eq!(
        pvc["spec"]["accessModes"],
        serde_json::json!(["ReadWriteMany"])
    );
    let pod = &find(&objs, "Deployment", "mcp-code-executor")["spec"]["template"]["spec"];
    let data = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "data")
        .unwrap();
    assert_eq!(
        data["persistentVolumeClaim"]["claimName"],
        "mcp-code-executor-data"
    );
    assert!(data.get("emptyDir").is_none(), "{data}");
    assert!(deploy_env(&objs)
        .iter()
        .any(|e| e["name"] == "MCP_EXECUTOR_KUBE_ENV_VOLUME"
            && e["value"] == "mcp-code-executor-data"));
}

#[test]
fn validator_rejects_a_broken_object() {
    // The check above means something only if a wrong object fails it.
    let broken = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replicas: one\n  selector: {}\n  template:\n    spec:\n      containers:\n        - name: a\n          image: b\n          notAField: true\n";
    let report = validate(broken, "broken").expect_err("a broken Deployment must fail validation");
    assert!(
        report.contains("replicas") || report.contains("notAField"),
        "{report}"
    );
}

#[test]
fn namespace_denies_all_traffic_and_bounds_resources() {
    let objs = objects(&render("deploy/kubernetes"));
    let deny = find(&objs, "NetworkPolicy", "default-deny");
    assert_eq!(deny["metadata"]["namespace"], "mcp-code-executor");
    assert_eq!(
        deny["spec"]["podSelector"],
        serde_json::json!({}),
        "every pod"
    );
    let types: BTreeSet<&str> = deny["spec"]["policyTypes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, BTreeSet::from(["Ingress", "Egress"]));
    assert!(deny["spec"].get("ingress").is_none() && deny["spec"].get("egress").is_none());
    // The one exception: installer pods to DNS and public addresses on 80/443.
    let egress = find(&objs, "NetworkPolicy", "installer-egress");
    assert_eq!(
        egress["spec"]["podSelector"]["matchLabels"]["io.mcp-code-executor.network"],
        "egress"
    );
    assert!(egress["spec"].get("ingress").is_none());
    let blocks = egress.to_string();
    for private in [
        "10.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.168.0.0/16",
    ] {
        assert!(
            blocks.contains(private),
            "installers cannot reach {private}"
        );
    }
    assert_eq!(
        find(&objs, "ResourceQuota", "sandboxes")["metadata"]["namespace"],
        "mcp-code-executor"
    );
    let lr = find(&objs, "LimitRange", "sandboxes");
    assert!(lr["spec"]["limits"][0]["max"]["memory"].is_string());
    let ns = find(&objs, "Namespace", "mcp-code-executor");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
}

#[test]
fn server_may_touch_only_pods_and_attach_in_its_namespace() {
    let objs = objects(&render("deploy/kubernetes"));
    let role = find(&objs, "Role", "mcp-code-executor-sandboxes");
    assert_eq!(role["metadata"]["namespace"], "mcp-code-executor");
    let mut resources = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(
            rule["apiGroups"],
            serde_json::json!([""]),
            "core group only"
        );
        for r in rule["resources"].as_array().unwrap() {
            resources.insert(r.as_str().unwrap().to_string());
        }
        for v in rule["verbs"].as_array().unwrap() {
            assert_ne!(v, "*", "no wildcard verbs");
        }
    }
    assert_eq!(
        resources,
        BTreeSet::from(["pods".to_string(), "pods/attach".to_string()])
    );
    assert!(
        !objs
            .iter()
            .any(|o| o["kind"] == "ClusterRole" || o["kind"] == "ClusterRoleBinding"),
        "no cluster-wide rights"
    );
    let binding = find(&objs, "RoleBinding", "mcp-code-executor-sandboxes");
    // Sandboxes in the server's own namespace: owner references to its pod are valid.
    let env = deploy_env(&objs);
    assert_eq!(
        env.iter()
            .find(|e| e["name"] == "MCP_EXECUTOR_KUBE_NAMESPACE")
            .unwrap()["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    for var in [
        "MCP_EXECUTOR_POD_NAME",
        "MCP_EXECUTOR_POD_UID",
        "MCP_EXECUTOR_POD_NAMESPACE",
    ] {
        assert!(
            env.iter()
                .any(|e| e["name"] == var && e["valueFrom"]["fieldRef"].is_object()),
            "{var} from the downward API"
        );
    }
    let deploy = find(&objs, "Deployment", "mcp-code-executor");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(binding["subjects"][0]["name"], pod["serviceAccountName"]);
    assert_eq!(
        binding["subjects"][0]["namespace"],
        deploy["metadata"]["namespace"]
    );
}

#[test]
fn server_has_probes_and_its_tenants_file_from_a_secret() {
    let objs = objects(&render("deploy/kubernetes"));
    let deploy = find(&objs, "Deployment", "mcp-code-executor");
    let pod = &deploy["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2).any(|w| w == ["--backend", "kubernetes"]),
        "{args:?}"
    );
    // The tenants volume names the generated Secret (with its hash suffix), which exists.
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tenants")
        .expect("a tenants volume");
    let secret = vol["secret"]["secretName"].as_str().unwrap();
    assert!(secret.starts_with("mcp-code-executor-tenants-"), "{secret}");
    let s = find(&objs, "Secret", secret);
    assert!(s["data"]["tenants.toml"].is_string());
    let env = c["env"].as_array().unwrap();
    let tenants = env
        .iter()
        .find(|e| e["name"] == "MCP_EXECUTOR_TENANTS")
        .expect("MCP_EXECUTOR_TENANTS");
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tenants")
        .unwrap();
    assert_eq!(
        Path::new(mount["mountPath"].as_str().unwrap()).join("tenants.toml"),
        Path::new(tenants["value"].as_str().unwrap())
    );
    let svc = find(&objs, "Service", "mcp-code-executor");
    assert_eq!(
        svc["spec"]["selector"],
        deploy["spec"]["selector"]["matchLabels"]
    );
    // The server itself meets the restricted profile.
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
}
