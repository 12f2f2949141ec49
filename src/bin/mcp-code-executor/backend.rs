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

/// Connect to Docker, sweep what dead processes left, and make sure the image exists
/// (building it on first use unless told not to).
pub async fn connect(opts: &SandboxOpts) -> Result<DockerBackend, String> {
    connect_with_pool(opts, 0, Limits::default(), false).await
}

/// [`connect`], with a warm pool of `pool_size` sandboxes made with `pool_limits` (or, with
/// `per_tenant`, one such pool per tenant, made at its first run).
pub async fn connect_with_pool(
    opts: &SandboxOpts,
    pool_size: usize,
    pool_limits: Limits,
    per_tenant: bool,
) -> Result<DockerBackend, String> {
    let image = opts.image.clone().unwrap_or_else(image::default_image);
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
    if !opts.no_build {
        let built = image::ensure(&image, &BuildOptions::default(), &mut |l| {
            eprintln!("[image] {l}")
        })
        .await
        .map_err(|e| e.to_string())?;
        if built {
            eprintln!("[image] the sandbox image {image} was built on first use");
        }
    }
    Ok(sandbox)
}

/// The bench's way to get a backend with a warm pool of a given size (0: none).
pub fn bench_connect(opts: SandboxOpts) -> mcp_code_executor::ops::bench::Connect {
    std::sync::Arc::new(move |pool_size| {
        let opts = opts.clone();
        Box::pin(async move {
            let b = connect_with_pool(&opts, pool_size, Limits::default(), false).await?;
            Ok(std::sync::Arc::new(b) as std::sync::Arc<dyn Backend>)
        })
    })
}
