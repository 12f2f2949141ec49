//! `image build`, `image name`, `image server`: the sandbox image and the server's.

use std::path::PathBuf;

use super::backend::image::{self, BuildOptions};
use super::{fail, Exit};
use crate::cli::run::exit;

/// An `image` command.
pub enum ImageRequest {
    Build(ImageBuild),
    Name,
    /// The server image, with this tag.
    Server {
        tag: String,
        options: BuildOptions,
    },
}

/// `image build`, `image name` or `image server`.
pub async fn image(req: ImageRequest) -> Exit {
    match req {
        ImageRequest::Build(b) => image_build(b).await,
        ImageRequest::Name => image_name(),
        ImageRequest::Server { tag, options } => image_server(&tag, options).await,
    }
}

/// `image build`: what to build, and how.
pub struct ImageBuild {
    /// The tag; `None`: the one this binary expects.
    pub tag: Option<String>,
    pub options: BuildOptions,
}

/// `image build`: build the sandbox image unless it exists (or with `force`), its progress
/// on stderr.
pub async fn image_build(req: ImageBuild) -> Exit {
    let tag = req.tag.unwrap_or_else(image::default_image);
    match image::ensure(&tag, &req.options, &mut |l| eprintln!("{l}")).await {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("{tag} is already built (use --force to rebuild)");
            0
        }
        Err(e) => fail(e, exit::INFRA),
    }
}

/// `image name`: the tag this binary uses.
pub fn image_name() -> Exit {
    println!("{}", image::default_image());
    0
}

/// `image server`: the server's image, from this very binary.
pub async fn image_server(tag: &str, options: BuildOptions) -> Exit {
    let exe: PathBuf = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fail(format!("cannot find this binary: {e}"), exit::INFRA),
    };
    match image::build_server(&exe, tag, &options, &mut |l| eprintln!("{l}")).await {
        Ok(()) => 0,
        Err(e) => fail(e, exit::INFRA),
    }
}
