//! The Kubernetes API stand-in (`tests/kube_standin/`) against clients we did not write:
//! kube-rs's own `Api::<Pod>` calls and `kubectl`. What passes here is what the backend
//! may rely on; see `tests/kube_standin/README.md` for what the stand-in does not prove.

#[path = "kube_standin/mod.rs"]
mod kube_standin;

#[test]
fn starts() {
    let k = kube_standin::StandIn::start();
    assert!(k.base_url.starts_with("http://127.0.0.1:"));
}
