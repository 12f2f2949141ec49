//! `bench`: the engine's latency and throughput beside plain `docker run`, or (with
//! `fairness_only`) the fair scheduler against first come, first served.

use super::backend::{self, image};
use super::{fail, Exit};
use crate::cli::run::exit;
use crate::config::BackendConfig;
use crate::job::Limits;
use crate::ops::bench::{self, Connect};
use std::sync::Arc;

/// What `bench` measures.
pub struct BenchRequest {
    pub backend: BackendConfig,
    pub samples: usize,
    pub pool_size: usize,
    pub throughput_runs: usize,
    pub concurrency: Vec<usize>,
    pub burst: usize,
    pub fairness_only: bool,
}

/// Print the tables; 1 when the bench failed.
pub async fn bench(req: BenchRequest) -> Exit {
    // Connected once first: a missing image is built (and a dead daemon said) up front.
    match backend::connect(&req.backend).await {
        Ok(sandbox) => drop(sandbox),
        Err(e) => return fail(e, exit::INFRA),
    }
    let opts = bench::BenchOptions {
        image: req
            .backend
            .image
            .clone()
            .unwrap_or_else(image::default_image),
        runtime: req.backend.runtime.clone(),
        connect: bench_connect(req.backend),
        samples: req.samples,
        pool_size: req.pool_size,
        throughput_runs: req.throughput_runs,
        concurrency: req.concurrency,
        burst: req.burst,
    };
    let result = if req.fairness_only {
        bench::fairness(&opts).await.map(|_| None)
    } else {
        bench::engine(&opts).await
    };
    match result {
        Ok(_) => 0,
        Err(e) => fail(format!("bench failed: {e}"), 1),
    }
}

/// The bench's way to get a backend with a warm pool of a given size (0: none).
fn bench_connect(cfg: BackendConfig) -> Connect {
    Arc::new(move |pool_size| {
        let cfg = BackendConfig {
            pool_size,
            ..cfg.clone()
        };
        Box::pin(async move {
            backend::connect_with_pool(&cfg, Limits::default(), false, &mut backend::print_build)
                .await
        })
    })
}
