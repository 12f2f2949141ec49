//! The pods the stand-in holds, its one `resourceVersion` counter, and the event history
//! watches replay from. Everything the API handlers and the container tasks change goes
//! through here, under one lock, so every change is a numbered event.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::broadcast;

use super::selector::Selectors;

/// How many past events a watch can start from; older `resourceVersion`s get 410 Gone.
const HISTORY: usize = 4096;

/// A watch event as it goes out (`type` is `ADDED`, `MODIFIED` or `DELETED`).
#[derive(Clone, Debug)]
pub struct Event {
    pub rv: u64,
    pub kind: &'static str,
    pub pod: Pod,
}

/// An API error, answered as a `Status` object.
#[derive(Debug)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub name: Option<String>,
}

impl ApiError {
    pub fn not_found(name: &str) -> Self {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("pods \"{name}\" not found"),
            name: Some(name.into()),
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            name: None,
        }
    }
    pub fn invalid(name: &str, message: impl Into<String>) -> Self {
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!("Pod \"{name}\" is invalid: {}", message.into()),
            name: Some(name.into()),
        }
    }

    /// The `Status` object the API server answers with.
    pub fn status(&self) -> serde_json::Value {
        let mut details = serde_json::json!({ "kind": "pods" });
        if let Some(n) = &self.name {
            details["name"] = n.clone().into();
        }
        serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": details,
            "code": self.code,
        })
    }
}

struct Inner {
    rv: u64,
    pods: BTreeMap<(String, String), Pod>,
    history: VecDeque<Event>,
    /// Pod uid -> the Docker container running it.
    containers: HashMap<String, String>,
}

/// The stand-in's state.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Event>,
}

pub fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn key(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

impl Inner {
    fn emit(&mut self, tx: &broadcast::Sender<Event>, kind: &'static str, pod: Pod) {
        let rv = pod
            .metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse().ok())
            .unwrap_or(self.rv);
        let e = Event { rv, kind, pod };
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(e.clone());
        let _ = tx.send(e);
    }

    fn bump(&mut self, pod: &mut Pod) {
        self.rv += 1;
        pod.metadata.resource_version = Some(self.rv.to_string());
    }
}

impl Store {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(HISTORY);
        Store {
            inner: Mutex::new(Inner {
                rv: 1,
                pods: BTreeMap::new(),
                history: VecDeque::new(),
                containers: HashMap::new(),
            }),
            tx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Store a new pod (metadata already filled in): 409 if the name is taken.
    pub fn create(&self, mut pod: Pod) -> Result<Pod, ApiError> {
        let mut g = self.lock();
        let k = key(&pod);
        if g.pods.contains_key(&k) {
            return Err(ApiError {
                code: 409,
                reason: "AlreadyExists",
                message: format!("pods \"{}\" already exists", k.1),
                name: Some(k.1),
            });
        }
        g.bump(&mut pod);
        g.pods.insert(k, pod.clone());
        g.emit(&self.tx, "ADDED", pod.clone());
        Ok(pod)
    }

    pub fn get(&self, ns: &str, name: &str) -> Option<Pod> {
        self.lock().pods.get(&(ns.into(), name.into())).cloned()
    }

    /// Pods in `ns` (all namespaces when `None`) that match, and the list's resourceVersion.
    pub fn list(&self, ns: Option<&str>, sel: &Selectors) -> (Vec<Pod>, u64) {
        let g = self.lock();
        let pods = g
            .pods
            .iter()
            .filter(|((n, _), p)| ns.is_none_or(|ns| ns == n) && sel.matches(p))
            .map(|(_, p)| p.clone())
            .collect();
        (pods, g.rv)
    }

    pub fn all(&self) -> Vec<Pod> {
        self.lock().pods.values().cloned().collect()
    }

    /// Change the pod `ns/name` if it is still the one with `uid`: bumps its
    /// resourceVersion and sends MODIFIED. `None` when it is gone (deleted meanwhile).
    pub fn modify(&self, ns: &str, name: &str, uid: &str, f: impl FnOnce(&mut Pod)) -> Option<Pod> {
        let mut g = self.lock();
        let k = (ns.to_string(), name.to_string());
        let mut pod = g.pods.get(&k)?.clone();
        if pod.metadata.uid.as_deref() != Some(uid) {
            return None;
        }
        f(&mut pod);
        g.bump(&mut pod);
        g.pods.insert(k, pod.clone());
        g.emit(&self.tx, "MODIFIED", pod.clone());
        Some(pod)
    }

    /// Take the pod out and send DELETED (the object with its last resourceVersion bumped).
    pub fn remove(&self, ns: &str, name: &str, uid: &str) -> Option<Pod> {
        let mut g = self.lock();
        let k = (ns.to_string(), name.to_string());
        if g.pods.get(&k)?.metadata.uid.as_deref() != Some(uid) {
            return None;
        }
        let mut pod = g.pods.remove(&k)?;
        g.containers.remove(uid);
        g.bump(&mut pod);
        g.emit(&self.tx, "DELETED", pod.clone());
        Some(pod)
    }

    /// Pods whose `ownerReferences` name `uid` (the garbage collector's dependents).
    pub fn dependents_of(&self, uid: &str) -> Vec<Pod> {
        self.lock()
            .pods
            .values()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid)
            })
            .cloned()
            .collect()
    }

    /// Is there a pod with `uid` in `ns`?
    pub fn has_uid(&self, ns: &str, uid: &str) -> bool {
        self.lock()
            .pods
            .iter()
            .any(|((n, _), p)| n == ns && p.metadata.uid.as_deref() == Some(uid))
    }

    pub fn set_container(&self, uid: &str, id: &str) {
        self.lock().containers.insert(uid.into(), id.into());
    }

    pub fn container(&self, uid: &str) -> Option<String> {
        self.lock().containers.get(uid).cloned()
    }

    /// Start a watch: the events to send first and the live feed after them. From
    /// `rv` (`Some`): the kept events after it (410 when it is older than the history);
    /// from `None` (absent or "0"): ADDED for every current pod that matches.
    #[allow(clippy::type_complexity)]
    pub fn watch(
        &self,
        ns: Option<&str>,
        rv: Option<u64>,
        sel: &Selectors,
    ) -> Result<(Vec<Event>, u64, broadcast::Receiver<Event>), ApiError> {
        let g = self.lock();
        let rx = self.tx.subscribe();
        let in_ns = |p: &Pod| ns.is_none_or(|ns| p.metadata.namespace.as_deref() == Some(ns));
        let first: Vec<Event> = match rv {
            None => g
                .pods
                .values()
                .filter(|p| in_ns(p) && sel.matches(p))
                .map(|p| Event {
                    rv: g.rv,
                    kind: "ADDED",
                    pod: p.clone(),
                })
                .collect(),
            Some(rv) => {
                let oldest = g.history.front().map(|e| e.rv).unwrap_or(g.rv + 1);
                if rv + 1 < oldest && rv < g.rv {
                    return Err(ApiError {
                        code: 410,
                        reason: "Expired",
                        message: format!("too old resource version: {rv} ({})", oldest - 1),
                        name: None,
                    });
                }
                g.history
                    .iter()
                    .filter(|e| e.rv > rv && in_ns(&e.pod))
                    .cloned()
                    .collect()
            }
        };
        Ok((first, g.rv, rx))
    }
}
