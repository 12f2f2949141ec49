//! Building the sandbox image (and the server image) through the Docker API, from what
//! [`crate::backend::image`] describes: present? pull the base or bootstrap it offline,
//! then build from the embedded context.

use std::collections::HashMap;
use std::path::Path;

use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder};
use bollard::Docker;
use futures::{StreamExt, TryStreamExt};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{classify, connect_docker, LABEL_MANAGED};
use crate::backend::image::{
    build_context, parse_step, server_context, strip_control, BuildEvent, BuildOptions, ImageError,
    BOOTSTRAP_BASE, DEFAULT_MIRROR, FIRST_BUILD_MINUTES, UPSTREAM_BASE,
};

/// Lines of the build's own output kept for the error message of a failed build (they are
/// logged at debug level only).
const TAIL_LINES: usize = 25;

/// Report a [`BuildEvent::Note`].
fn note(progress: &mut (dyn FnMut(&BuildEvent) + Send), text: &str) {
    progress(&BuildEvent::Note(text));
}

/// Build `image` unless it is present (or `force`), reporting progress as a few
/// [`BuildEvent`]s (the build's own output goes to the debug log). Returns whether a build
/// happened.
pub async fn ensure(
    image: &str,
    opts: &BuildOptions,
    progress: &mut (dyn FnMut(&BuildEvent) + Send),
) -> Result<bool, ImageError> {
    let docker = connect_docker().await?;
    if !opts.force && docker.inspect_image(image).await.is_ok() {
        if let Some(ca) = &opts.ca_bundle {
            note(
                progress,
                &format!(
                    "{image} is present: the CA bundle {} is only read when the image is \
                     built; add --force to rebuild with it",
                    ca.display()
                ),
            );
        }
        return Ok(false);
    }
    let started = std::time::Instant::now();
    let bootstrap = docker.inspect_image(UPSTREAM_BASE).await.is_err()
        && docker.inspect_image(BOOTSTRAP_BASE).await.is_err();
    progress(&BuildEvent::Started {
        image,
        minutes: FIRST_BUILD_MINUTES + u32::from(bootstrap),
    });
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
    note(progress, &format!("building {image} from {base}"));
    let labels = [(LABEL_MANAGED, "true")];
    build(&docker, build_context(&ca), image, &base, &labels, progress).await?;
    progress(&BuildEvent::Finished {
        image,
        secs: started.elapsed().as_secs(),
    });
    Ok(true)
}

/// Build `tag` from a context tar whose Dockerfile takes `BASE_IMAGE`: each step reported
/// as a [`BuildEvent::Step`], the rest of the build's output (terminal control sequences
/// stripped) logged at debug level and its last lines kept for the error of a failed build.
async fn build(
    docker: &Docker,
    context: Vec<u8>,
    tag: &str,
    base: &str,
    labels: &[(&str, &str)],
    progress: &mut (dyn FnMut(&BuildEvent) + Send),
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
    let mut tail: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                let Some(text) = info.stream.as_deref().or(info.status.as_deref()) else {
                    continue;
                };
                for line in strip_control(text).lines() {
                    let line = line.trim_end();
                    if line.trim().is_empty() {
                        continue;
                    }
                    match parse_step(line) {
                        Some((index, total, name)) => progress(&BuildEvent::Step {
                            index,
                            total,
                            name: &name,
                        }),
                        None => tracing::debug!(target: "mcp_code_executor::image_build", "{line}"),
                    }
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line.to_string());
                }
            }
            Err(e) => {
                let detail = strip_control(&e.to_string());
                let last = tail.back().cloned().unwrap_or_default();
                if detail.contains("GLIBC") || last.contains("GLIBC") {
                    return Err(ImageError::Build(format!(
                        "{detail} {last}: the binary was built against a newer glibc than the image's base has. \
                         Build the image from source with images/server/Dockerfile (`docker-compose build`), \
                         or build the binary on a Debian bookworm host"
                    )));
                }
                let output: Vec<String> = tail.into_iter().collect();
                return Err(ImageError::Build(format!(
                    "{detail}\nthe build's last lines:\n  {}",
                    output.join("\n  ")
                )));
            }
        }
    }
    if docker.inspect_image(tag).await.is_err() {
        return Err(ImageError::Build(format!(
            "the build ended but {tag} is not there"
        )));
    }
    Ok(())
}

/// Build the server image (for docker-compose) from `binary`, on the same base as the
/// sandbox (pulled, or bootstrapped offline). The build runs the binary once: a binary
/// linked against a newer glibc than the base's fails here, with a message saying so.
pub async fn build_server(
    binary: &Path,
    tag: &str,
    opts: &BuildOptions,
    progress: &mut (dyn FnMut(&BuildEvent) + Send),
) -> Result<(), ImageError> {
    let docker = connect_docker().await?;
    let exe = tokio::fs::read(binary)
        .await
        .map_err(|e| ImageError::Build(format!("cannot read {}: {e}", binary.display())))?;
    let base = base_image(&docker, opts, progress).await?;
    note(
        progress,
        &format!(
            "building {tag} from {base} with {} ({} MiB)",
            binary.display(),
            exe.len() >> 20
        ),
    );
    let context = server_context(&exe);
    // Not the `managed` label of sandboxes: containers inherit image labels, and the server's
    // own container must never look like a sandbox to sweeps and leak checks.
    let labels = [("io.mcp-code-executor.server", "true")];
    build(&docker, context, tag, &base, &labels, progress).await?;
    note(progress, &format!("built {tag}"));
    Ok(())
}

/// The base to build on: pulled, already bootstrapped, or bootstrapped now.
async fn base_image(
    docker: &Docker,
    opts: &BuildOptions,
    progress: &mut (dyn FnMut(&BuildEvent) + Send),
) -> Result<String, ImageError> {
    let pull_error = if opts.offline {
        "skipped (--offline)".to_string()
    } else {
        if docker.inspect_image(UPSTREAM_BASE).await.is_ok() {
            return Ok(UPSTREAM_BASE.to_string());
        }
        note(progress, &format!("pulling {UPSTREAM_BASE}"));
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
        note(
            progress,
            &format!("no registry ({pull_error}); using the bootstrapped base {BOOTSTRAP_BASE}"),
        );
        return Ok(BOOTSTRAP_BASE.to_string());
    }
    note(
        progress,
        &format!(
            "no registry ({pull_error}); bootstrapping a Debian bookworm base offline with debootstrap (about a minute)"
        ),
    );
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
    progress: &mut (dyn FnMut(&BuildEvent) + Send),
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
    progress: &mut (dyn FnMut(&BuildEvent) + Send),
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
            note(progress, &format!("debootstrap: {}", strip_control(&line)));
        }
    }
    let status = child.wait().await.map_err(|e| e.to_string())?;
    if !status.success() {
        let err = err_task.await.unwrap_or_default();
        return Err(format!("debootstrap exited with {status}: {}", err.trim()));
    }
    note(
        progress,
        &format!("importing the bootstrapped root as {BOOTSTRAP_BASE}"),
    );
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
