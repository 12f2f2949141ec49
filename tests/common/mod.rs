//! Shared set-up for tests against the real Docker daemon. There is no skip: without a
//! daemon or without the image these tests fail, loudly, with the fix in the message.
#![allow(dead_code)]

use std::process::Command;
use std::sync::Arc;

use mcp_code_executor::job::{JobSpec, Limits, Outcome};
use mcp_code_executor::sandbox::docker::{DockerConfig, DockerSandbox, LABEL_TENANT};
use mcp_code_executor::sandbox::image;
use mcp_code_executor::sandbox::Sandbox;

/// A sandbox on the real daemon with the image this binary expects.
pub async fn sandbox() -> Arc<DockerSandbox> {
    let s = DockerSandbox::connect(DockerConfig::new(image::default_image())).await.unwrap_or_else(|e| {
        panic!("these tests need a running Docker daemon (run .ci/run or scripts/setup-docker.sh): {e}")
    });
    // As the product does at start-up: what a dead test process left is removed.
    s.sweep_leftovers().await.expect("sweep");
    image::ensure(&image::default_image(), &Default::default(), &mut |l| {
        eprintln!("[image] {l}")
    })
    .await
    .unwrap_or_else(|e| panic!("the sandbox image could not be built: {e}"));
    Arc::new(s)
}

/// Run `code` for `tenant` (a per-test label) and return the outcome.
pub async fn run(s: &DockerSandbox, tenant: &str, code: &str, limits: Limits) -> Outcome {
    let mut job = JobSpec::python(code, limits);
    job.tenant = tenant.to_string();
    s.run(job, None)
        .await
        .unwrap_or_else(|e| panic!("infrastructure error running {code:?}: {e}"))
}

/// Containers of ours carrying this tenant label, running or not.
pub fn containers_of(tenant: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label={LABEL_TENANT}={tenant}"))
        .output()
        .expect("the docker CLI runs");
    assert!(out.status.success(), "docker ps failed: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Wait for background removals, then check that nothing of `tenant` is left.
pub async fn assert_clean(s: &DockerSandbox, tenant: &str) {
    s.drain().await;
    let left = containers_of(tenant);
    assert!(
        left.is_empty(),
        "containers left behind for {tenant}: {left:?}"
    );
}

/// Free bytes on the filesystem that holds Docker's data.
pub fn docker_disk_free() -> u64 {
    let out = Command::new("stat")
        .args(["-f", "-c", "%a %S", "/var/lib/docker"])
        .output()
        .expect("stat runs");
    let s = String::from_utf8_lossy(&out.stdout);
    let mut it = s.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    it.next().unwrap() * it.next().unwrap()
}

pub fn limits() -> Limits {
    Limits::default()
}
