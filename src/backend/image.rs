//! The sandbox image, built through the Docker API from `images/sandbox/` (embedded in the
//! binary, so an installed binary needs no source tree).
//!
//! The tag carries a hash of the embedded files: a change to the Dockerfile or the runner
//! names a new image, so a stale one is never used silently. The base is pulled where a
//! registry answers; where none does, a Debian bookworm base is bootstrapped offline with
//! `debootstrap` and imported, and the build says so.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};
use bollard::Docker;
use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::docker::{classify, connect_docker, LABEL_MANAGED};
use super::BackendError;

/// The Dockerfile of the default sandbox.
pub const DOCKERFILE: &str = include_str!("../../images/sandbox/Dockerfile");
/// `(path, contents)` of a file under `images/sandbox/`.
macro_rules! runner_file {
    ($path:literal) => {
        ($path, include_str!(concat!("../../images/sandbox/", $path)))
    };
}
/// The runner, PID 1 of every sandbox: its launcher and the modules of its package, as
/// (path in the build context under `images/sandbox/`, contents).
pub const RUNNER_FILES: &[(&str, &str)] = &[
    runner_file!("runner.py"),
    runner_file!("mcp_runner/__init__.py"),
    runner_file!("mcp_runner/cgroup.py"),
    runner_file!("mcp_runner/child.py"),
    runner_file!("mcp_runner/figures.py"),
    runner_file!("mcp_runner/frames.py"),
    runner_file!("mcp_runner/job.py"),
    runner_file!("mcp_runner/limits.py"),
    runner_file!("mcp_runner/main.py"),
    runner_file!("mcp_runner/run.py"),
    runner_file!("mcp_runner/session.py"),
    runner_file!("mcp_runner/stubs.py"),
    runner_file!("mcp_runner/workspace.py"),
];
/// The matplotlib backend that turns figures into PNG artifacts.
pub const MPL_BACKEND: &str = include_str!("../../images/sandbox/mcp_backend.py");
/// Repository of the sandbox image; the tag is a content hash.
pub const IMAGE_REPO: &str = "mcp-code-executor/sandbox";
/// The base pulled where a registry is reachable.
pub const UPSTREAM_BASE: &str = "debian:bookworm-slim";
/// The equivalent base bootstrapped offline.
pub const BOOTSTRAP_BASE: &str = "mcp-code-executor/base:bookworm";
/// Debian mirror for the offline bootstrap.
pub const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// The image tag that matches this binary's `images/sandbox/`.
pub fn default_image() -> String {
    let mut h = Sha256::new();
    h.update(DOCKERFILE.as_bytes());
    h.update([0]);
    for (path, text) in RUNNER_FILES {
        h.update(path.as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        h.update([0]);
    }
    h.update(MPL_BACKEND.as_bytes());
    let hex: String = h
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{IMAGE_REPO}:{hex}")
}

/// How to build.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// A PEM bundle the build trusts in addition to Debian's (TLS-intercepting proxies).
    pub ca_bundle: Option<PathBuf>,
    /// Skip the pull and bootstrap the base offline.
    pub offline: bool,
    /// Debian mirror for the bootstrap ([`DEFAULT_MIRROR`] when `None`).
    pub mirror: Option<String>,
    /// Build even when the tag exists.
    pub force: bool,
}

/// Why the image could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Docker(#[from] BackendError),
    #[error("no base image: pulling {UPSTREAM_BASE} failed ({pull}) and the offline bootstrap failed: {bootstrap}")]
    NoBase { pull: String, bootstrap: String },
    #[error("the image build failed: {0}")]
    Build(String),
    #[error("cannot read the CA bundle {path}: {source}")]
    CaBundle {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Build `image` unless it is present (or `force`), reporting progress line by line.
/// Returns whether a build happened.
pub async fn ensure(
    image: &str,
    opts: &BuildOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<bool, ImageError> {
    let docker = connect_docker().await?;
    if !opts.force && docker.inspect_image(image).await.is_ok() {
        if let Some(ca) = &opts.ca_bundle {
            progress(&format!(
                "{image} is present: the CA bundle {} is only read when the image is \
                 built; add --force to rebuild with it",
                ca.display()
            ));
        }
        return Ok(false);
    }
    let base = base_image(&docker, opts, progress).await?;
    let ca = match &opts.ca_bundle {
        Some(p) => tokio::fs::read(p)
            .await
            .map_err(|source| ImageError::CaBundle {
                path: p.clone(),
                source,
            })?,
        None => Vec::new(),
    };
    progress(&format!("building {image} from {base}"));
    let labels = [(LABEL_MANAGED, "true")];
    build(&docker, build_context(&ca), image, &base, &labels, progress).await?;
    Ok(true)
}

/// Build `tag` from a context tar whose Dockerfile takes `BASE_IMAGE`, showing the build's
/// output line by line.
async fn build(
    docker: &Docker,
    context: Vec<u8>,
    tag: &str,
    base: &str,
    labels: &[(&str, &str)],
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), ImageError> {
    let args = HashMap::from([("BASE_IMAGE", base)]);
    let labels: HashMap<&str, &str> = labels.iter().copied().collect();
    let options = BuildImageOptionsBuilder::default()
        .t(tag)
        .buildargs(&args)
        .labels(&labels)
        .rm(true)
        .forcerm(true)
        .build();
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(context.into())));
    let mut last = String::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(line) = info.stream.as_deref().or(info.status.as_deref()) {
                    let line = line.trim_end();
                    if !line.is_empty() {
                        progress(line);
                        last = line.to_string();
                    }
                }
            }
            Err(e) => {
                let detail = e.to_string();
                if detail.contains("GLIBC") || last.contains("GLIBC") {
                    return Err(ImageError::Build(format!(
                        "{detail} {last}: the binary was built against a newer glibc than the image's base has. \
                         Build the image from source with images/server/Dockerfile (`docker-compose build`), \
                         or build the binary on a Debian bookworm host"
                    )));
                }
                return Err(ImageError::Build(detail));
            }
        }
    }
    if docker.inspect_image(tag).await.is_err() {
        return Err(ImageError::Build(format!(
            "the build ended but {tag} is not there"
        )));
    }
    progress(&format!("built {tag}"));
    Ok(())
}

/// The Dockerfile of the server image made from a built binary.
pub const SERVER_DOCKERFILE: &str = include_str!("../../images/server/prebuilt.Dockerfile");
/// The tag `image server` gives by default, and docker-compose.yml uses.
pub const SERVER_IMAGE: &str = "mcp-code-executor/server:local";

/// Build the server image (for docker-compose) from `binary`, on the same base as the
/// sandbox (pulled, or bootstrapped offline). The build runs the binary once: a binary
/// linked against a newer glibc than the base's fails here, with a message saying so.
pub async fn build_server(
    binary: &Path,
    tag: &str,
    opts: &BuildOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), ImageError> {
    let docker = connect_docker().await?;
    let exe = tokio::fs::read(binary)
        .await
        .map_err(|e| ImageError::Build(format!("cannot read {}: {e}", binary.display())))?;
    let base = base_image(&docker, opts, progress).await?;
    progress(&format!(
        "building {tag} from {base} with {} ({} MiB)",
        binary.display(),
        exe.len() >> 20
    ));
    let context = tar_of(&[
        ("Dockerfile", SERVER_DOCKERFILE.as_bytes(), 0o644),
        ("mcp-code-executor", &exe, 0o755),
    ]);
    // Not the `managed` label of sandboxes: containers inherit image labels, and the server's
    // own container must never look like a sandbox to sweeps and leak checks.
    let labels = [("io.mcp-code-executor.server", "true")];
    build(&docker, context, tag, &base, &labels, progress).await
}

/// The base to build on: pulled, already bootstrapped, or bootstrapped now.
async fn base_image(
    docker: &Docker,
    opts: &BuildOptions,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<String, ImageError> {
    let pull_error = if opts.offline {
        "skipped (--offline)".to_string()
    } else {
        if docker.inspect_image(UPSTREAM_BASE).await.is_ok() {
            return Ok(UPSTREAM_BASE.to_string());
        }
        progress(&format!("pulling {UPSTREAM_BASE}"));
        let pull = docker
            .create_image(
                Some(
                    CreateImageOptionsBuilder::default()
                        .from_image(UPSTREAM_BASE)
                        .build(),
                ),
                None,
                None,
            )
            .try_for_each(|_| async { Ok(()) })
            .await;
        match pull {
            Ok(()) => return Ok(UPSTREAM_BASE.to_string()),
            Err(e) => e.to_string(),
        }
    };
    if docker.inspect_image(BOOTSTRAP_BASE).await.is_ok() {
        progress(&format!(
            "no registry ({pull_error}); using the bootstrapped base {BOOTSTRAP_BASE}"
        ));
        return Ok(BOOTSTRAP_BASE.to_string());
    }
    progress(&format!(
        "no registry ({pull_error}); bootstrapping a Debian bookworm base offline with debootstrap (about a minute)"
    ));
    bootstrap(
        docker,
        opts.mirror.as_deref().unwrap_or(DEFAULT_MIRROR),
        progress,
    )
    .await
    .map_err(|bootstrap| ImageError::NoBase {
        pull: pull_error,
        bootstrap,
    })?;
    Ok(BOOTSTRAP_BASE.to_string())
}

async fn bootstrap(
    docker: &Docker,
    mirror: &str,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("mcp-code-executor-rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let result = bootstrap_into(docker, &dir, mirror, progress).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn bootstrap_into(
    docker: &Docker,
    dir: &Path,
    mirror: &str,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<(), String> {
    let mut child = tokio::process::Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(dir)
        .arg(mirror)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            format!("cannot start debootstrap ({e}); install it with `apt-get install debootstrap` (needs root)")
        })?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let stderr = child.stderr.take().expect("piped");
    let err_task = tokio::spawn(async move {
        let mut s = String::new();
        let mut r = BufReader::new(stderr);
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut r, &mut s).await;
        s
    });
    while let Ok(Some(line)) = lines.next_line().await {
        if line.starts_with("I: Retrieving") || line.starts_with("I: Base system") {
            progress(&format!("debootstrap: {line}"));
        }
    }
    let status = child.wait().await.map_err(|e| e.to_string())?;
    if !status.success() {
        let err = err_task.await.unwrap_or_default();
        return Err(format!("debootstrap exited with {status}: {}", err.trim()));
    }
    progress(&format!(
        "importing the bootstrapped root as {BOOTSTRAP_BASE}"
    ));
    let mut tar = tokio::process::Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["--numeric-owner", "-c", "."])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start tar: {e}"))?;
    let body = tokio_util::io::ReaderStream::new(tar.stdout.take().expect("piped"));
    let (repo, tag) = BOOTSTRAP_BASE.split_once(':').expect("tagged");
    docker
        .create_image(
            Some(
                CreateImageOptionsBuilder::default()
                    .from_src("-")
                    .repo(repo)
                    .tag(tag)
                    .build(),
            ),
            Some(bollard::body_try_stream(body)),
            None,
        )
        .try_for_each(|_| async { Ok(()) })
        .await
        .map_err(|e| classify("importing the base image", e).to_string())?;
    let status = tar.wait().await.map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("tar exited with {status}"));
    }
    Ok(())
}

/// The build context: the embedded files, plus the CA bundle (empty when none).
fn build_context(ca: &[u8]) -> Vec<u8> {
    let mut files = vec![("Dockerfile", DOCKERFILE.as_bytes(), 0o644)];
    files.extend(RUNNER_FILES.iter().map(|(p, t)| (*p, t.as_bytes(), 0o644)));
    files.push(("mcp_backend.py", MPL_BACKEND.as_bytes(), 0o644));
    files.push(("extra-ca.crt", ca, 0o644));
    tar_of(&files)
}

/// An in-memory tar of (name, contents, mode).
fn tar_of(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data, mode) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_mtime(0);
        b.append_data(&mut h, name, *data).expect("in-memory tar");
    }
    b.into_inner().expect("in-memory tar")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_is_a_content_hash() {
        let img = default_image();
        assert!(img.starts_with("mcp-code-executor/sandbox:"));
        assert_eq!(img.len(), IMAGE_REPO.len() + 1 + 12);
        assert_eq!(img, default_image());
    }

    #[test]
    fn context_holds_the_embedded_files() {
        let ctx = build_context(b"");
        let mut ar = tar::Archive::new(ctx.as_slice());
        let names: Vec<String> = ar
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        let mut want = vec!["Dockerfile"];
        want.extend(RUNNER_FILES.iter().map(|(p, _)| *p));
        want.extend(["mcp_backend.py", "extra-ca.crt"]);
        assert_eq!(names, want);
        assert!(names.contains(&"mcp_runner/main.py".to_string()));
        // Every module of the runner's package is embedded: a new one must be listed.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/images/sandbox/mcp_runner");
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            if name.ends_with(".py") {
                let path = format!("mcp_runner/{name}");
                assert!(names.contains(&path), "{path} is not in RUNNER_FILES");
            }
        }
    }
}
