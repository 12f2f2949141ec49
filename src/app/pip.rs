//! What pip said it did, read from an install's output: which requested packages it
//! installed now, which were already satisfied (and by what), which are missing after it.
//! The answer of an install is honest about what pip did.

use std::collections::HashMap;

use crate::env::manager::InstallReport;
use crate::env::spec::normalize;

/// What became of one requested package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackageDone {
    /// pip installed or upgraded it now.
    Installed,
    /// It was there already: nothing was installed for it; `by` says where pip found it
    /// ("<version> in <location>") when pip said so.
    AlreadySatisfied { by: Option<String> },
    /// Not found after the install.
    Missing,
}

impl PackageDone {
    /// The status as the tools' answers name it.
    pub fn as_str(&self) -> &'static str {
        match self {
            PackageDone::Installed => "installed",
            PackageDone::AlreadySatisfied { .. } => "already_satisfied",
            PackageDone::Missing => "missing",
        }
    }
}

/// An install as pip told it: whether it installed anything at all, and each requested
/// package (in the order of the report's `installed`) with what became of it.
#[derive(Debug, Clone)]
pub struct PipSaid {
    pub changed: bool,
    pub packages: Vec<PackageDone>,
}

/// Read what pip did from `report`'s output.
pub fn what_pip_did(report: &InstallReport) -> PipSaid {
    let pip = report.outcome.stderr_text() + &report.outcome.stdout_text();
    let fresh: Vec<(String, String)> = pip
        .lines()
        .find(|l| l.trim().starts_with("Successfully installed"))
        .map(|l| {
            l.trim()
                .trim_start_matches("Successfully installed")
                .split_whitespace()
                .filter_map(|item| {
                    let (n, v) = item.rsplit_once('-')?;
                    Some((n.to_string(), v.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    let fresh_names: Vec<String> = fresh.iter().map(|(n, _)| normalize(n)).collect();
    let satisfied = already_satisfied(&pip);
    let packages = report
        .installed
        .iter()
        .map(|p| {
            let key = normalize(&p.name);
            if p.version.is_none() {
                PackageDone::Missing
            } else if fresh_names.contains(&key) {
                PackageDone::Installed
            } else {
                PackageDone::AlreadySatisfied {
                    by: satisfied.get(&key).cloned(),
                }
            }
        })
        .collect();
    PipSaid {
        changed: !fresh.is_empty(),
        packages,
    }
}

/// What pip said of each package: `Requirement already satisfied: six in /usr/lib/python3/dist-packages (1.16.0)`
/// lines, by normalized name, as "<version> in <location>".
fn already_satisfied(pip_output: &str) -> HashMap<String, String> {
    let mut found = HashMap::new();
    for line in pip_output.lines() {
        let Some(rest) = line.trim().strip_prefix("Requirement already satisfied: ") else {
            continue;
        };
        let Some((req, place)) = rest.split_once(" in ") else {
            continue;
        };
        let name: String = req
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .collect();
        let place = place.trim();
        let said = match place.rsplit_once(" (") {
            Some((loc, v)) => format!("{} in {loc}", v.trim_end_matches(')')),
            None => place.to_string(),
        };
        found.insert(normalize(&name), said);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn already_satisfied_lines_name_version_and_place() {
        let out = "Requirement already satisfied: six in /usr/lib/python3/dist-packages (1.16.0)\n\
                   Requirement already satisfied: Requests_Toolbelt>=1 in /env/lib (1.0.0)\n";
        let found = already_satisfied(out);
        assert_eq!(found["six"], "1.16.0 in /usr/lib/python3/dist-packages");
        assert_eq!(found[&normalize("Requests_Toolbelt")], "1.0.0 in /env/lib");
    }
}
