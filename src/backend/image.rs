//! The sandbox image, described independently of the backend that builds it: the files of
//! `images/sandbox/` (embedded in the binary, so an installed binary needs no source tree),
//! the tag they give, the build options, and the build context tar. Talking to a daemon to
//! build or inspect the image is the backend's business ([`crate::backend::docker::image`]
//! for Docker); what is here is pure, so any backend (or a CI job that pushes the image to
//! a registry for a cluster) names and packs the same image.
//!
//! The tag carries a hash of the embedded files: a change to the Dockerfile or the runner
//! names a new image, so a stale one is never used silently. The base is pulled where a
//! registry answers; where none does, a Debian bookworm base is bootstrapped offline with
//! `debootstrap` and imported, and the build says so.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

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
    runner_file!("mcp_runner/output.py"),
    runner_file!("mcp_runner/preload.py"),
    runner_file!("mcp_runner/run.py"),
    runner_file!("mcp_runner/session.py"),
    runner_file!("mcp_runner/stubs.py"),
    runner_file!("mcp_runner/watch.py"),
    runner_file!("mcp_runner/workspace.py"),
    // Code mode (#26): the relay, and the `tools` package the code imports.
    runner_file!("mcp_runner/toolrelay.py"),
    runner_file!("mcp_runner/netrelay.py"),
    runner_file!("tools/__init__.py"),
];
/// The matplotlib backend that turns figures into PNG artifacts.
pub const MPL_BACKEND: &str = include_str!("../../images/sandbox/mcp_backend.py");
/// The sandbox image's own interpreter: the runner's, and the code's unless an environment
/// brings another.
pub const PYTHON: &str = "/usr/bin/python3";
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

/// About how long a first build takes on a fresh machine, minutes: the Debian packages of
/// the scientific stack dominate (plus about a minute when the base is bootstrapped offline).
pub const FIRST_BUILD_MINUTES: u32 = 5;

/// What a build reports as it goes: a few lines a person reads. The build's own output
/// (every shell line of a RUN step) is logged at debug level, not reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildEvent<'a> {
    /// The image is missing and is being built; about `minutes` minutes.
    Started { image: &'a str, minutes: u32 },
    /// A phase around the build: pulling or bootstrapping the base, what it builds from.
    Note(&'a str),
    /// Step `index` of `total` of the Dockerfile began; `name` is its instruction, shortened.
    Step {
        index: usize,
        total: usize,
        name: &'a str,
    },
    /// The image is built.
    Finished { image: &'a str, secs: u64 },
}

impl std::fmt::Display for BuildEvent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildEvent::Started { image, minutes } => write!(
                f,
                "building the sandbox image {image} (first run, about {minutes} minutes; later starts reuse it)"
            ),
            BuildEvent::Note(n) => f.write_str(n),
            BuildEvent::Step { index, total, name } => {
                write!(f, "step {index} of {total}: {name}")
            }
            BuildEvent::Finished { image, secs } => {
                write!(f, "built {image} in {}m{:02}s", secs / 60, secs % 60)
            }
        }
    }
}

/// The step a line of a classic Docker build announces (`Step 4/13 : RUN set -eux; …`):
/// (index, total, the instruction with its whitespace collapsed, at most 60 characters).
pub fn parse_step(line: &str) -> Option<(usize, usize, String)> {
    let rest = line.trim_start().strip_prefix("Step ")?;
    let (counts, instruction) = rest.split_once(" : ")?;
    let (i, n) = counts.split_once('/')?;
    let (index, total) = (i.trim().parse().ok()?, n.trim().parse().ok()?);
    let words: Vec<&str> = instruction.split_whitespace().collect();
    let mut name = words.join(" ");
    const MAX: usize = 60;
    if name.chars().count() > MAX {
        name = name.chars().take(MAX - 1).collect::<String>() + "…";
    }
    Some((index, total, name))
}

/// `text` without terminal control sequences (colours, cursor moves, titles) or other
/// control characters (tabs kept): what a build prints, safe for logs and compose output.
pub fn strip_control(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters and intermediates, then one final byte in @..~.
                Some('[') => {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC, DCS, APC, PM, SOS: up to BEL or ST (ESC \\).
                Some(']' | 'P' | '_' | '^' | 'X') => {
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                // Two-character sequences (ESC c, ESC 7, ...).
                _ => {}
            },
            // C1 CSI.
            '\u{9b}' => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            '\t' | '\n' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// The Dockerfile of the server image made from a built binary.
pub const SERVER_DOCKERFILE: &str = include_str!("../../images/server/prebuilt.Dockerfile");
/// The tag `image server` gives by default, and docker-compose.yml uses.
pub const SERVER_IMAGE: &str = "mcp-code-executor/server:local";

/// The build context: the embedded files, plus the CA bundle (empty when none).
pub(crate) fn build_context(ca: &[u8]) -> Vec<u8> {
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

/// The build context of the server image: its Dockerfile and the binary.
pub(crate) fn server_context(exe: &[u8]) -> Vec<u8> {
    tar_of(&[
        ("Dockerfile", SERVER_DOCKERFILE.as_bytes(), 0o644),
        ("mcp-code-executor", exe, 0o755),
    ])
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
    /// A module left out of [`RUNNER_FILES`] is missing from the image, and every runner
    /// would die at its import.
    #[test]
    fn every_runner_module_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("images/sandbox");
        for dir in ["mcp_runner", "tools"] {
            for entry in std::fs::read_dir(root.join(dir)).expect("the runner's sources") {
                let name = entry.expect("an entry").file_name();
                let name = name.to_string_lossy();
                if !name.ends_with(".py") {
                    continue;
                }
                let path = format!("{dir}/{name}");
                assert!(
                    RUNNER_FILES.iter().any(|(p, _)| *p == path),
                    "{path} is not in RUNNER_FILES"
                );
            }
        }
    }

    #[test]
    fn control_sequences_are_stripped() {
        assert_eq!(strip_control("\u{1b}[91mE: boom\u{1b}[0m"), "E: boom");
        assert_eq!(strip_control("\u{1b}[0m"), "");
        assert_eq!(
            strip_control("a\u{1b}]0;title\u{7}b\u{1b}]8;;x\u{1b}\\c"),
            "abc"
        );
        assert_eq!(strip_control("50%\r100%\u{8}\tok\n"), "50%100%\tok\n");
        assert_eq!(strip_control("\u{1b}7saved\u{1b}[2K\u{9b}1mx"), "savedx");
        assert_eq!(strip_control("plain – ünïcode"), "plain – ünïcode");
    }

    #[test]
    fn build_steps_are_named_briefly() {
        let (i, n, name) = parse_step("Step 4/13 : RUN set -eux;     export DEBIAN_FRONTEND=noninteractive;     apt-get update; apt-get install -y python3").unwrap();
        assert_eq!((i, n), (4, 13));
        assert!(
            name.starts_with("RUN set -eux; export DEBIAN_FRONTEND"),
            "{name}"
        );
        assert_eq!(name.chars().count(), 60);
        assert!(name.ends_with('…'));
        assert_eq!(
            parse_step("Step 10/13 : USER 65534:65534").unwrap(),
            (10, 13, "USER 65534:65534".to_string())
        );
        assert!(parse_step(" ---> Using cache").is_none());
        assert!(parse_step("Step x/13 : USER").is_none());
        let e = BuildEvent::Step {
            index: 4,
            total: 13,
            name: "RUN x",
        };
        assert_eq!(e.to_string(), "step 4 of 13: RUN x");
        let e = BuildEvent::Finished {
            image: "i:t",
            secs: 125,
        };
        assert_eq!(e.to_string(), "built i:t in 2m05s");
    }
}
