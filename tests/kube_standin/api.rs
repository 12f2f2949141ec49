//! The HTTP side: discovery, pods (create, get, list, watch, delete, deletecollection),
//! `pods/status` and `pods/attach`, with paths, query parameters, bodies and `Status`
//! errors as the Kubernetes API reference gives them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::kubelet::{self, Kubelet};
use super::selector::Selectors;
use super::store::{now, ApiError, Event};

/// Query parameters of the pod endpoints (unknown ones are ignored, as the server does).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Params {
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub watch: Option<String>,
    pub resource_version: Option<String>,
    pub timeout_seconds: Option<u64>,
    pub grace_period_seconds: Option<i64>,
    pub dry_run: Option<String>,
    pub field_validation: Option<String>,
    pub send_initial_events: Option<bool>,
    pub container: Option<String>,
    pub stdin: Option<String>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    pub tty: Option<String>,
}

type K = State<Arc<Kubelet>>;

/// A `Status` error response.
pub fn error(e: ApiError) -> Response {
    let code = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json(code, e.status())
}

fn json(code: StatusCode, v: impl serde::Serialize) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&v).unwrap_or_default(),
    )
        .into_response()
}

pub fn router(k: Arc<Kubelet>) -> Router {
    Router::new()
        .route("/version", get(version))
        .route("/api", get(api_versions))
        .route("/api/v1", get(resources))
        .route("/apis", get(groups))
        .route("/openapi/v3", get(openapi_root))
        .route("/openapi/v3/api/v1", get(openapi_core))
        .route("/api/v1/pods", get(list_all))
        .route(
            "/api/v1/namespaces/{ns}/pods",
            get(list_ns).post(create).delete(delete_collection),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}",
            get(get_pod).delete(delete_pod),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/status",
            get(get_pod_status),
        )
        .route(
            "/api/v1/namespaces/{ns}/pods/{name}/attach",
            get(attach).post(attach),
        )
        .fallback(|| async {
            error(ApiError {
                code: 404,
                reason: "NotFound",
                message: "the server could not find the requested resource".into(),
                name: None,
            })
        })
        .with_state(k)
}

async fn version() -> Response {
    json(
        StatusCode::OK,
        serde_json::json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-standin",
            "gitCommit": "standin", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "n/a", "compiler": "n/a", "platform": "linux/amd64"
        }),
    )
}

async fn api_versions(headers: HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    json(
        StatusCode::OK,
        serde_json::json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]
        }),
    )
}

async fn groups() -> Response {
    json(
        StatusCode::OK,
        serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
    )
}

async fn resources() -> Response {
    json(
        StatusCode::OK,
        serde_json::json!({
            "kind": "APIResourceList", "groupVersion": "v1",
            "resources": [
                {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                 "verbs": ["create", "delete", "deletecollection", "get", "list", "watch"],
                 "shortNames": ["po"], "categories": ["all"]},
                {"name": "pods/attach", "singularName": "", "namespaced": true,
                 "kind": "PodAttachOptions", "verbs": ["create", "get"]},
                {"name": "pods/status", "singularName": "", "namespaced": true, "kind": "Pod",
                 "verbs": ["get"]}
            ]
        }),
    )
}

/// The OpenAPI v3 index: one group-version document, the core one.
async fn openapi_root() -> Response {
    json(
        StatusCode::OK,
        serde_json::json!({"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=STANDIN"}}}),
    )
}

/// A small OpenAPI v3 document of the pod operations served here. kubectl reads it for one
/// thing: whether `fieldValidation` is supported for Pods, which it looks up on the PATCH
/// operation of the GVK (so PATCH is listed; a PATCH request gets 405). With it, `kubectl
/// create` sends `fieldValidation=Strict` and leaves validation to the server (below).
async fn openapi_core() -> Response {
    let gvk = serde_json::json!({"group": "", "version": "v1", "kind": "Pod"});
    let q =
        |name: &str| serde_json::json!({"name": name, "in": "query", "schema": {"type": "string"}});
    let op = |id: &str, action: &str, params: Vec<serde_json::Value>| {
        serde_json::json!({
            "operationId": id, "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk, "parameters": params,
            "responses": {"200": {"description": "OK"}}
        })
    };
    json(
        StatusCode::OK,
        serde_json::json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes (stand-in)", "version": "v1.33.0"},
            "paths": {
                "/api/v1/namespaces/{namespace}/pods": {
                    "get": op("listCoreV1NamespacedPod", "list", vec![q("labelSelector"), q("fieldSelector"), q("resourceVersion"), q("watch"), q("timeoutSeconds")]),
                    "post": op("createCoreV1NamespacedPod", "post", vec![q("fieldValidation"), q("fieldManager"), q("dryRun")]),
                    "delete": op("deleteCoreV1CollectionNamespacedPod", "deletecollection", vec![q("labelSelector"), q("gracePeriodSeconds")])
                },
                "/api/v1/namespaces/{namespace}/pods/{name}": {
                    "get": op("readCoreV1NamespacedPod", "get", vec![]),
                    "delete": op("deleteCoreV1NamespacedPod", "delete", vec![q("gracePeriodSeconds")]),
                    "patch": op("patchCoreV1NamespacedPod", "patch", vec![q("fieldValidation"), q("fieldManager")])
                }
            },
            "components": {"schemas": {}}
        }),
    )
}

/// Paths of fields in `sent` that `kept` (the object as decoded and encoded again) lacks:
/// the unknown fields a strict decode refuses.
fn unknown_fields(
    sent: &serde_json::Value,
    kept: &serde_json::Value,
    at: &str,
    out: &mut Vec<String>,
) {
    match (sent, kept) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in a {
                let path = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                match b.get(k) {
                    Some(w) => unknown_fields(v, w, &path, out),
                    None if v.is_null() => {}
                    None => out.push(path),
                }
            }
        }
        (serde_json::Value::Array(a), serde_json::Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                unknown_fields(v, w, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn selectors(q: &Params) -> Result<Selectors, ApiError> {
    Selectors::parse(q.label_selector.as_deref(), q.field_selector.as_deref())
        .map_err(ApiError::bad_request)
}

async fn list_all(k: K, Query(q): Query<Params>, h: HeaderMap) -> Response {
    list(k.0, None, q, wants_table(&h)).await
}

async fn list_ns(k: K, Path(ns): Path<String>, Query(q): Query<Params>, h: HeaderMap) -> Response {
    list(k.0, Some(ns), q, wants_table(&h)).await
}

/// Did the client ask for server-side printing (`Accept: application/json;as=Table;...`,
/// as `kubectl get` does)?
fn wants_table(h: &HeaderMap) -> bool {
    h.get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=Table") && a.contains("v=v1;"))
}

fn age(p: &Pod) -> String {
    let Some(t) = &p.metadata.creation_timestamp else {
        return "<unknown>".into();
    };
    let s = (k8s_openapi::jiff::Timestamp::now().as_second() - t.0.as_second()).max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// The columns `kubectl get pods` shows, computed as the API server's pod printer does.
fn row(p: &Pod) -> serde_json::Value {
    let status = p.status.clone().unwrap_or_default();
    let cs = status.container_statuses.clone().unwrap_or_default();
    let total = p.spec.as_ref().map(|s| s.containers.len()).unwrap_or(0);
    let ready = cs.iter().filter(|c| c.ready).count();
    let mut reason = status
        .reason
        .clone()
        .or(status.phase.clone())
        .unwrap_or_default();
    for c in &cs {
        if let Some(st) = &c.state {
            if let Some(w) = st.waiting.as_ref().and_then(|w| w.reason.clone()) {
                reason = w;
            } else if let Some(t) = &st.terminated {
                reason = t
                    .reason
                    .clone()
                    .unwrap_or_else(|| format!("ExitCode:{}", t.exit_code));
            }
        }
    }
    if p.metadata.deletion_timestamp.is_some() {
        reason = "Terminating".into();
    }
    let restarts: i32 = cs.iter().map(|c| c.restart_count).sum();
    let node = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| "<none>".into());
    serde_json::json!({
        "cells": [p.metadata.name, format!("{ready}/{total}"), reason, restarts.to_string(), age(p),
                  status.pod_ip.unwrap_or_else(|| "<none>".into()), node],
        "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": p.metadata},
    })
}

/// A `meta.k8s.io/v1` Table of `pods`.
fn table(pods: &[Pod], rv: u64) -> Response {
    let col = |name: &str, format: &str, priority: u8, description: &str| {
        serde_json::json!({"name": name, "type": "string", "format": format,
                           "description": description, "priority": priority})
    };
    json(
        StatusCode::OK,
        serde_json::json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": rv.to_string()},
            "columnDefinitions": [
                col("Name", "name", 0, "Name must be unique within a namespace."),
                col("Ready", "", 0, "The aggregate readiness state of this pod for accepting traffic."),
                col("Status", "", 0, "The aggregate status of the containers in this pod."),
                col("Restarts", "", 0, "The number of times the containers in this pod have been restarted."),
                col("Age", "", 0, "CreationTimestamp is a timestamp representing the server time when this object was created."),
                col("IP", "", 1, "IP address allocated to the pod."),
                col("Node", "", 1, "NodeName is a request to schedule this pod onto a specific node."),
            ],
            "rows": pods.iter().map(row).collect::<Vec<_>>(),
        }),
    )
}

async fn list(k: Arc<Kubelet>, ns: Option<String>, q: Params, as_table: bool) -> Response {
    let sel = match selectors(&q) {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    if matches!(q.watch.as_deref(), Some("true") | Some("1")) {
        return watch(k, ns, q, sel);
    }
    let (items, rv) = k.store.list(ns.as_deref(), &sel);
    if as_table {
        return table(&items, rv);
    }
    json(
        StatusCode::OK,
        serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    )
}

fn line(kind: &str, object: impl serde::Serialize) -> Bytes {
    let mut v = serde_json::to_vec(&serde_json::json!({"type": kind, "object": object}))
        .unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

fn watch(k: Arc<Kubelet>, ns: Option<String>, q: Params, sel: Selectors) -> Response {
    let initial = q.send_initial_events == Some(true);
    let rv = match q.resource_version.as_deref() {
        _ if initial => None,
        None | Some("") | Some("0") => None,
        Some(r) => match r.parse::<u64>() {
            Ok(r) => Some(r),
            Err(_) => {
                return error(ApiError::bad_request(format!(
                    "invalid resource version: {r}"
                )))
            }
        },
    };
    let (first, at, mut rx) = match k.store.watch(ns.as_deref(), rv, &sel) {
        Ok(v) => v,
        Err(e) => {
            // As the server does: 200, then one ERROR event carrying the Status.
            let body = line("ERROR", e.status());
            return (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response();
        }
    };
    let timeout = Duration::from_secs(q.timeout_seconds.unwrap_or(1800).clamp(1, 3600));
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let until = tokio::time::Instant::now() + timeout;
        let mut last = 0u64;
        let wanted = |e: &Event| {
            ns.as_deref()
                .is_none_or(|ns| e.pod.metadata.namespace.as_deref() == Some(ns))
                && sel.matches(&e.pod)
        };
        for e in first {
            last = last.max(e.rv);
            if wanted(&e) && tx.send(Ok(line(e.kind, &e.pod))).await.is_err() {
                return;
            }
        }
        if initial {
            // A streaming list: the initial events end with this bookmark.
            let bookmark = serde_json::json!({
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"resourceVersion": at.to_string(),
                             "annotations": {"k8s.io/initial-events-end": "true"}}
            });
            last = last.max(at);
            if tx.send(Ok(line("BOOKMARK", bookmark))).await.is_err() {
                return;
            }
        }
        loop {
            let next = tokio::time::timeout_at(until, rx.recv()).await;
            match next {
                Err(_) => return, // timeoutSeconds: the server ends the watch
                Ok(Ok(e)) => {
                    if e.rv <= last && last != 0 {
                        continue; // already sent from the history
                    }
                    if wanted(&e) && tx.send(Ok(line(e.kind, &e.pod))).await.is_err() {
                        return;
                    }
                }
                Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {
                    let gone = ApiError {
                        code: 410,
                        reason: "Expired",
                        message: "the watcher fell behind: start again from a new list".into(),
                        name: None,
                    };
                    let _ = tx.send(Ok(line("ERROR", gone.status()))).await;
                    return;
                }
                Ok(Err(_)) => return,
            }
        }
    });
    let stream = tokio_stream_from(body_rx);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn get_pod(k: K, Path((ns, name)): Path<(String, String)>, h: HeaderMap) -> Response {
    match k.store.get(&ns, &name) {
        Some(p) if wants_table(&h) => {
            let rv = p.metadata.resource_version.clone().unwrap_or_default();
            table(&[p], rv.parse().unwrap_or(0))
        }
        Some(p) => json(StatusCode::OK, p),
        None => error(ApiError::not_found(&name)),
    }
}

async fn get_pod_status(k: K, Path((ns, name)): Path<(String, String)>) -> Response {
    get_pod(k, Path((ns, name)), HeaderMap::new()).await
}

async fn attach(
    k: K,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<Params>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    super::attach::attach(k.0, ns, name, q, ws.ok()).await
}

/// Random lowercase alphanumerics, as `generateName` appends (5 of them).
fn suffix() -> String {
    let u = uuid::Uuid::new_v4().simple().to_string();
    u.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(5)
        .collect()
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

async fn create(k: K, Path(ns): Path<String>, Query(q): Query<Params>, body: Bytes) -> Response {
    let mut pod: Pod = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return error(ApiError::bad_request(format!(
                "the body of the request was in an unknown format: {e}"
            )))
        }
    };
    if q.field_validation.as_deref() == Some("Strict") {
        let sent: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let kept = serde_json::to_value(&pod).unwrap_or_default();
        let mut unknown = Vec::new();
        unknown_fields(&sent, &kept, "", &mut unknown);
        if let Some(f) = unknown.first() {
            return error(ApiError::bad_request(format!(
                "strict decoding error: unknown field \"{f}\""
            )));
        }
    }
    if q.dry_run.is_some() {
        return error(ApiError::bad_request(
            "the stand-in does not support dryRun",
        ));
    }
    if let Some(n) = &pod.metadata.namespace {
        if *n != ns {
            return error(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let name = match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        (_, Some(g)) if !g.is_empty() => format!("{g}{}", suffix()),
        _ => {
            return error(ApiError::invalid(
                "",
                "metadata.name: Required value: name or generateName is required",
            ))
        }
    };
    if !dns_label(&name) {
        return error(ApiError::invalid(
            &name,
            "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        ));
    }
    let Some(spec) = pod.spec.as_mut() else {
        return error(ApiError::invalid(&name, "spec: Required value"));
    };
    if spec.containers.len() != 1 || spec.init_containers.as_ref().is_some_and(|c| !c.is_empty()) {
        return error(ApiError::invalid(
            &name,
            "spec.containers: the stand-in runs pods of exactly one container and no init containers",
        ));
    }
    if spec.host_network == Some(true) {
        return error(ApiError::invalid(
            &name,
            "spec.hostNetwork: the stand-in gives no host network",
        ));
    }
    if let Some(rc) = &spec.runtime_class_name {
        if !k.runtime_classes.contains_key(rc) {
            return error(ApiError {
                code: 403,
                reason: "Forbidden",
                message: format!(
                    "pods \"{name}\" is forbidden: pod rejected: RuntimeClass \"{rc}\" not found"
                ),
                name: Some(name.clone()),
            });
        }
    }
    // The API server's defaults.
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.enable_service_links.get_or_insert(true);
    spec.priority.get_or_insert(0);
    spec.security_context.get_or_insert_with(Default::default);
    if spec.service_account_name.is_none() {
        spec.service_account_name = Some("default".into());
        spec.service_account = Some("default".into());
    }
    let mut qos_guaranteed = true;
    let mut any = false;
    for c in spec.containers.iter_mut() {
        if c.image.as_deref().unwrap_or("").is_empty() {
            return error(ApiError::invalid(
                &name,
                "spec.containers[0].image: Required value",
            ));
        }
        let img = c.image.clone().unwrap_or_default();
        c.image_pull_policy.get_or_insert_with(|| {
            if img.ends_with(":latest") || !img.rsplit('/').next().unwrap_or("").contains(':') {
                "Always".into()
            } else {
                "IfNotPresent".into()
            }
        });
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
        c.termination_message_policy
            .get_or_insert_with(|| "File".into());
        let r = c.resources.get_or_insert_with(Default::default);
        if let Some(limits) = r.limits.clone() {
            let req = r.requests.get_or_insert_with(Default::default);
            for (k, v) in limits {
                req.entry(k).or_insert(v);
            }
        }
        let lim = r.limits.clone().unwrap_or_default();
        let req = r.requests.clone().unwrap_or_default();
        any |= !lim.is_empty() || !req.is_empty();
        for res in ["cpu", "memory"] {
            let (l, q) = (lim.get(res), req.get(res));
            let same = match (l, q) {
                (Some(Quantity(l)), Some(Quantity(q))) => {
                    kubelet::quantity(l) == kubelet::quantity(q)
                }
                _ => false,
            };
            qos_guaranteed &= same;
        }
    }
    let uid = uuid::Uuid::new_v4().to_string();
    pod.metadata = ObjectMeta {
        name: Some(name),
        generate_name: pod.metadata.generate_name.clone(),
        namespace: Some(ns),
        uid: Some(uid),
        creation_timestamp: Some(now()),
        resource_version: None,
        ..pod.metadata.clone()
    };
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        qos_class: Some(
            if qos_guaranteed {
                "Guaranteed"
            } else if any {
                "Burstable"
            } else {
                "BestEffort"
            }
            .into(),
        ),
        ..Default::default()
    });
    match k.store.create(pod) {
        Ok(p) => {
            tokio::spawn(k.0.clone().run(p.clone()));
            collect_if_orphan(&k.0, &p);
            json(StatusCode::CREATED, p)
        }
        Err(e) => error(e),
    }
}

/// Graceful deletion: `deletionTimestamp` is set (MODIFIED) and the pod returned; the
/// container is then killed and removed, the pod taken out (DELETED), and its dependents
/// (pods whose `ownerReferences` name it) deleted the same way.
pub fn delete(k: &Arc<Kubelet>, pod: &Pod, grace: i64) -> Option<Pod> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let marked = if pod.metadata.deletion_timestamp.is_some() {
        Some(pod.clone())
    } else {
        k.store.modify(&ns, &name, &uid, |p| {
            p.metadata.deletion_timestamp = Some(now());
            p.metadata.deletion_grace_period_seconds = Some(grace);
        })
    }?;
    let k2 = k.clone();
    tokio::spawn(async move {
        if let Some(id) = k2.store.container(&uid) {
            kubelet::remove(&k2.docker, &id).await;
        }
        k2.store.remove(&ns, &name, &uid);
        for d in k2.store.dependents_of(&uid) {
            delete(&k2, &d, 0);
        }
    });
    Some(marked)
}

/// The garbage collector's view of a new pod: an owner (a Pod; other kinds are not
/// known here) that does not exist in the pod's namespace makes it garbage, deleted soon
/// after, as a real cluster does with an owner reference across namespaces.
fn collect_if_orphan(k: &Arc<Kubelet>, pod: &Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let absent = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Pod" && o.api_version == "v1" && !k.store.has_uid(&ns, &o.uid));
    if absent {
        let (k, pod) = (k.clone(), pod.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Some(p) = k
                .store
                .get(&ns, pod.metadata.name.as_deref().unwrap_or_default())
            {
                if p.metadata.uid == pod.metadata.uid {
                    delete(&k, &p, 0);
                }
            }
        });
    }
}

async fn delete_pod(
    k: K,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<Params>,
    body: Bytes,
) -> Response {
    let opts: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let grace = q
        .grace_period_seconds
        .or(opts.get("gracePeriodSeconds").and_then(|g| g.as_i64()))
        .unwrap_or(30);
    let Some(pod) = k.store.get(&ns, &name) else {
        return error(ApiError::not_found(&name));
    };
    match delete(&k.0, &pod, grace) {
        Some(p) => json(StatusCode::OK, p),
        None => error(ApiError::not_found(&name)),
    }
}

async fn delete_collection(k: K, Path(ns): Path<String>, Query(q): Query<Params>) -> Response {
    let sel = match selectors(&q) {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    let (pods, rv) = k.store.list(Some(&ns), &sel);
    let grace = q.grace_period_seconds.unwrap_or(30);
    let items: Vec<Pod> = pods.iter().filter_map(|p| delete(&k.0, p, grace)).collect();
    json(
        StatusCode::OK,
        serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": rv.to_string()},
            "items": items,
        }),
    )
}
