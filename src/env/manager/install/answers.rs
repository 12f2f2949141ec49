//! What the installer containers answer (pip's lines and the scripts' JSON), and the
//! wheel platforms and Python versions an install asks for.

use serde::Deserialize;

use super::super::{failed, ManagerError, PackageStatus};
use crate::job::Outcome;

/// The sandbox image is Debian bookworm: glibc 2.36, so wheels tagged up to
/// manylinux_2_36 run in it.
pub(super) const IMAGE_GLIBC_MINOR: u32 = 36;

/// Platform tags of wheels that run in the sandbox image, newest first. pip 23 does not
/// expand `manylinux_2_36` to the older glibc tags by itself, so all are given.
pub fn manylinux_platforms(arch: &str) -> Vec<String> {
    let mut tags: Vec<String> = (17..=IMAGE_GLIBC_MINOR)
        .rev()
        .map(|minor| format!("manylinux_2_{minor}_{arch}"))
        .collect();
    tags.push(format!("manylinux2014_{arch}"));
    if arch == "x86_64" || arch == "i686" {
        tags.push(format!("manylinux2010_{arch}"));
        tags.push(format!("manylinux1_{arch}"));
    }
    tags
}

/// How the platforms are named in messages.
pub(super) fn platform_words() -> String {
    format!(
        "Linux {} (manylinux wheels, glibc 2.17 to 2.{IMAGE_GLIBC_MINOR})",
        std::env::consts::ARCH
    )
}

/// `3.11.7` → `3.11`; `None` when it is not a version.
pub(super) fn major_minor_of(v: &str) -> Option<String> {
    let mut it = v.trim().split('.');
    let major = it
        .next()
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()))?;
    let minor: String = it
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    (!minor.is_empty()).then(|| format!("{major}.{minor}"))
}

/// Does an environment of Python `mm` (`3.12`) need a pip of its own? The image's pip
/// (23.0.1) runs on Python 3.7 to 3.11 only (on 3.12 it fails on `pkgutil.ImpImporter`):
/// for other versions the fetch phase also downloads the newest pip wheel that supports
/// the environment's Python, and the install phase runs the environment's Python with it
/// (offline, like the image's pip would run).
pub(super) fn needs_own_pip(mm: &str) -> bool {
    let mut it = mm.split('.').map(|p| p.parse::<u32>().ok());
    match (it.next().flatten(), it.next().flatten()) {
        (Some(3), Some(minor)) => !(7..=11).contains(&minor),
        _ => true,
    }
}

/// The fetch phase's answer.
#[derive(Debug, Deserialize)]
pub(super) struct FetchAnswer {
    pub(super) ok: bool,
    #[serde(default)]
    missing: Vec<Missing>,
}

/// A requirement pip found no wheel for.
#[derive(Debug, Deserialize)]
struct Missing {
    requirement: String,
    /// Versions with a usable wheel, as pip listed them (`none`, or oldest first).
    wheel_versions: Option<String>,
    /// Versions on the index of any kind (newest first); `None`: no such package.
    versions: Option<String>,
}

impl FetchAnswer {
    pub(super) fn error(&self, mm: &str, o: &Outcome) -> ManagerError {
        if self.missing.is_empty() {
            return failed("fetching wheels", o);
        }
        let mut no_wheel = false;
        let missing = self
            .missing
            .iter()
            .map(|m| match (&m.versions, m.wheel_versions.as_deref()) {
                (None, _) => format!(
                    "`{}`: no such package on the package index (check the name)",
                    m.requirement
                ),
                (Some(all), None | Some("none")) => {
                    no_wheel = true;
                    format!(
                        "`{}`: no wheel for Python {mm} on this platform (the index has versions {}, as source distributions or for other platforms)",
                        m.requirement,
                        few(all, false)
                    )
                }
                (Some(all), Some(wheels)) => {
                    no_wheel = true;
                    format!(
                        "`{}`: no version with a wheel matches (versions with a wheel: {}; all versions: {})",
                        m.requirement,
                        few(wheels, true),
                        few(all, false)
                    )
                }
            })
            .collect();
        ManagerError::NotAvailable {
            missing,
            no_wheel,
            python: mm.to_string(),
            platform: platform_words(),
        }
    }
}

/// At most ten of a comma-separated version list, the newest ones.
pub(super) fn few(list: &str, oldest_first: bool) -> String {
    let mut v: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if oldest_first {
        v.reverse();
    }
    let more = v.len() > 10;
    v.truncate(10);
    format!("{}{}", v.join(", "), if more { ", ..." } else { "" })
}

/// The install phase's answer.
#[derive(Debug, Deserialize)]
pub(super) struct InstallAnswer {
    /// pip's `Successfully installed a-1.0 b-2.0` line, if it installed anything.
    pub(super) summary: Option<String>,
    pub(super) installed: Vec<PackageStatus>,
}

/// The last line of stdout as JSON.
pub(super) fn last_json_line<T: serde::de::DeserializeOwned>(
    o: &Outcome,
    what: &'static str,
) -> Result<T, ManagerError> {
    let text = o.stdout_text();
    let last = text.lines().last().unwrap_or_default();
    serde_json::from_str(last).map_err(|e| ManagerError::Failed {
        what,
        status: "unreadable answer".into(),
        stderr: e.to_string(),
    })
}

/// `Successfully installed certifi-2024.2.2 charset_normalizer-3.3.2` → name, version
/// pairs (pip prints `name-version`; a normalized version has no `-`).
pub fn parse_successfully_installed(line: &str) -> Vec<(String, String)> {
    line.trim()
        .strip_prefix("Successfully installed")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|item| {
            let (name, version) = item.rsplit_once('-')?;
            (!name.is_empty() && !version.is_empty())
                .then(|| (name.to_string(), version.to_string()))
        })
        .collect()
}
