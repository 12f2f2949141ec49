//! Label and field selectors as the API reference defines them
//! (`labelSelector=app=x,tier!=db,env in (a,b),!legacy`; `fieldSelector=metadata.name=x`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Label {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// One requirement of a field selector (`=`, `==` or `!=` on a supported field).
#[derive(Debug, Clone, PartialEq)]
struct Field {
    path: String,
    value: String,
    equal: bool,
}

/// A parsed `labelSelector` and `fieldSelector` pair.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    labels: Vec<Label>,
    fields: Vec<Field>,
}

/// Fields a pod field selector may name (as the API server's pod field label conversion).
const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "status.phase",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "status.podIP",
];

impl Selectors {
    /// Parse both selectors; the error text is what the API server says in a 400.
    pub fn parse(label: Option<&str>, field: Option<&str>) -> Result<Self, String> {
        let mut s = Selectors::default();
        if let Some(l) = label.filter(|l| !l.trim().is_empty()) {
            for part in split_top(l) {
                s.labels.push(parse_label(part.trim())?);
            }
        }
        if let Some(f) = field.filter(|f| !f.trim().is_empty()) {
            for part in f.split(',') {
                let part = part.trim();
                let (path, value, equal) = if let Some((p, v)) = part.split_once("!=") {
                    (p, v, false)
                } else if let Some((p, v)) = part.split_once("==") {
                    (p, v, true)
                } else if let Some((p, v)) = part.split_once('=') {
                    (p, v, true)
                } else {
                    return Err(format!(
                        "invalid selector: '{f}'; can't understand '{part}'"
                    ));
                };
                if !POD_FIELDS.contains(&path) {
                    return Err(format!("field label not supported: {path}"));
                }
                s.fields.push(Field {
                    path: path.to_string(),
                    value: value.to_string(),
                    equal,
                });
            }
        }
        Ok(s)
    }

    /// Does `pod` satisfy every requirement?
    pub fn matches(&self, pod: &Pod) -> bool {
        let empty = BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        self.labels.iter().all(|r| label_matches(r, labels))
            && self.fields.iter().all(|f| {
                let actual = field_of(pod, &f.path);
                (actual == f.value) == f.equal
            })
    }
}

fn field_of(pod: &Pod, path: &str) -> String {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    match path {
        "metadata.name" => pod.metadata.name.clone(),
        "metadata.namespace" => pod.metadata.namespace.clone(),
        "status.phase" => status.and_then(|s| s.phase.clone()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.restartPolicy" => spec.and_then(|s| s.restart_policy.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()),
        _ => None,
    }
    .unwrap_or_default()
}

fn label_matches(r: &Label, labels: &BTreeMap<String, String>) -> bool {
    match r {
        Label::Eq(k, v) => labels.get(k) == Some(v),
        Label::Ne(k, v) => labels.get(k) != Some(v),
        Label::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
        Label::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        Label::Exists(k) => labels.contains_key(k),
        Label::NotExists(k) => !labels.contains_key(k),
    }
}

/// Split on commas outside parentheses (`a in (x,y),b` is two requirements).
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_label(p: &str) -> Result<Label, String> {
    let bad = || format!("unable to parse requirement: invalid label selector '{p}'");
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Label::NotExists(k.trim().to_string()));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Label::Ne(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = p.split_once("==") {
        return Ok(Label::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = p.split_once('=') {
        return Ok(Label::Eq(k.trim().into(), v.trim().into()));
    }
    let set = |rest: &str| -> Result<Vec<String>, String> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(bad)?;
        Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
    };
    if let Some((k, rest)) = p.split_once(" notin ") {
        return Ok(Label::NotIn(k.trim().into(), set(rest)?));
    }
    if let Some((k, rest)) = p.split_once(" in ") {
        return Ok(Label::In(k.trim().into(), set(rest)?));
    }
    if p.is_empty() || p.contains(' ') || p.contains('(') {
        return Err(bad());
    }
    Ok(Label::Exists(p.to_string()))
}
