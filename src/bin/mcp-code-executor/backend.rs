//! The one place the binary names a concrete backend: every command gets its sandboxes
//! from here, as a [`Backend`] (today always Docker), and builds its images through
//! [`image`].

use mcp_code_executor::backend::docker::{DockerBackend, DockerConfig};
use mcp_code_executor::backend::Backend;
use mcp_code_executor::job::Limits;

use self::image::BuildOptions;
use crate::args::SandboxOpts;

/// The sandbox image: what names and packs it (backend-neutral), and the backend's build of
/// it (`ensure`, `build_server`), under one name for the image commands.
pub mod image {
    pub use mcp_code_executor::backend::docker::image::{build_server, ensure};
    pub use mcp_code_executor::backend::image::*;
}

/// Connect to Docker, make sure the image exists (building it on first use unless told
/// not to, its progress as `[image]` lines), and sweep what dead processes left.
pub async fn connect(opts: &SandboxOpts) -> Result<DockerBackend, String> {
    connect_with_pool(opts, 0, Limits::default(), false, &mut print_build).await
}

/// A build's progress as `[image] …` lines on stderr.
pub fn print_build(e: &image::BuildEvent) {
    eprintln!("[image] {e}");
}

/// [`connect`], with a warm pool of `pool_size` sandboxes made with `pool_limits` (or, with
/// `per_tenant`, one such pool per tenant, made at its first run), and the build's
/// progress told to `report`. The image comes first: the pool starts filling only once it
/// exists, so that a first run is not a stream of failed refills.
pub async fn connect_with_pool(
    opts: &SandboxOpts,
    pool_size: usize,
    pool_limits: Limits,
    per_tenant: bool,
    report: &mut (dyn FnMut(&image::BuildEvent) + Send),
) -> Result<DockerBackend, String> {
    let image = opts.image.clone().unwrap_or_else(image::default_image);
    if !opts.no_build {
        image::ensure(&image, &BuildOptions::default(), report)
            .await
            .map_err(|e| e.to_string())?;
    }
    let config = DockerConfig {
        runtime: opts.runtime.clone(),
        pool_size,
        pool_limits,
        pool_per_tenant: per_tenant,
        ..DockerConfig::new(image.clone())
    };
    let sandbox = DockerBackend::connect(config)
        .await
        .map_err(|e| e.to_string())?;
    if let Err(e) = sandbox.sweep().await {
        tracing::warn!(error = %e, "sweep of leftover containers failed");
    }
    Ok(sandbox)
}

/// The bench's way to get a backend with a warm pool of a given size (0: none).
pub fn bench_connect(opts: SandboxOpts) -> mcp_code_executor::ops::bench::Connect {
    std::sync::Arc::new(move |pool_size| {
        let opts = opts.clone();
        Box::pin(async move {
            let b = connect_with_pool(&opts, pool_size, Limits::default(), false, &mut print_build)
                .await?;
            Ok(std::sync::Arc::new(b) as std::sync::Arc<dyn Backend>)
        })
    })
}
