//! The Docker ceiling, for the benchmark's profile: how long each step of a container's
//! life takes on this daemon, with the same hardening but no runner and no Python, so the
//! engine's figures can be read against what Docker alone allows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use futures::StreamExt;

use super::spec::{host_config, LABEL_MANAGED, LABEL_OWNER};
use super::{classify, DockerDriver};
use crate::backend::{BackendError, LifecycleFigures};
use crate::job::{new_job_id, Limits, RunEnv};

/// Run `total` containers of `/bin/true` with `concurrency` at once, through the full
/// create → start → wait → remove cycle ([`Backend::lifecycle_ceiling`](crate::backend::Backend::lifecycle_ceiling)).
pub(super) async fn ceiling(
    inner: &Arc<DockerDriver>,
    total: usize,
    concurrency: usize,
) -> Result<LifecycleFigures, BackendError> {
    let inner = inner.clone();
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let t = Instant::now();
    let tasks = (0..total).map(|_| {
        let inner = inner.clone();
        let sem = sem.clone();
        tokio::spawn(async move {
            let _p = sem.acquire().await.expect("open");
            let d = &inner.docker;
            let name = format!("mcpx-ceiling-{}", new_job_id());
            let body = ContainerCreateBody {
                image: Some(inner.config.image.clone()),
                cmd: Some(vec!["/bin/true".into()]),
                labels: Some(
                    [
                        (LABEL_MANAGED.to_string(), "true".to_string()),
                        (LABEL_OWNER.to_string(), inner.owner.clone()),
                    ]
                    .into(),
                ),
                host_config: Some(host_config(
                    &Limits::default(),
                    &RunEnv::default(),
                    inner.config.runtime.clone(),
                )?),
                ..Default::default()
            };
            let s = Instant::now();
            let id = d
                .create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                    body,
                )
                .await
                .map_err(|e| classify("creating", e))?
                .id;
            let create = s.elapsed();
            let s = Instant::now();
            let started = d.start_container(&id, None).await;
            let start = s.elapsed();
            let s = Instant::now();
            let _ = d.wait_container(&id, None).next().await;
            let wait = s.elapsed();
            let s = Instant::now();
            let removed = d
                .remove_container(
                    &id,
                    Some(RemoveContainerOptionsBuilder::default().force(true).build()),
                )
                .await;
            let remove = s.elapsed();
            started.map_err(|e| classify("starting", e))?;
            removed.map_err(|e| classify("removing", e))?;
            Ok::<_, BackendError>([create, start, wait, remove])
        })
    });
    let mut steps: [Vec<Duration>; 4] = Default::default();
    for r in futures::future::join_all(tasks).await {
        let r = r.map_err(|e| BackendError::Runner(e.to_string()))??;
        for (i, d) in r.into_iter().enumerate() {
            steps[i].push(d);
        }
    }
    let wall = t.elapsed();
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v.get(v.len() / 2).copied().unwrap_or_default()
    };
    Ok(LifecycleFigures {
        create: median(&mut steps[0]),
        start: median(&mut steps[1]),
        wait: median(&mut steps[2]),
        remove: median(&mut steps[3]),
        per_second: total as f64 / wall.as_secs_f64(),
    })
}
