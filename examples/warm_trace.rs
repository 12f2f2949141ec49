//! Where the time of a warm-pool run goes: run with RUST_LOG=mcp_code_executor=trace.
use std::time::{Duration, Instant};

use mcp_code_executor::backend::docker::{DockerBackend, DockerConfig};
use mcp_code_executor::backend::image;
use mcp_code_executor::backend::{Backend, PoolConfig};
use mcp_code_executor::job::{JobSpec, Limits};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let s = DockerBackend::connect(DockerConfig {
        pool: PoolConfig {
            size: 2,
            ..PoolConfig::default()
        },
        ..DockerConfig::new(image::default_image())
    })
    .await
    .unwrap();
    for _ in 0..5 {
        while s.pool_stats().unwrap().ready < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.drain().await;
        let t = Instant::now();
        let o = s
            .run(JobSpec::python("print(1)", Limits::default()), None)
            .await
            .unwrap();
        eprintln!(
            "=== {:?} {:?} cpu_ms={:?}",
            t.elapsed(),
            o.stdout_text(),
            o.cpu_ms
        );
    }
    s.shutdown().await;
}
