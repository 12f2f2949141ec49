//! Usage per tenant and principal, durable (issue 45 item 2): one JSON line per finished
//! run, appended to `<data dir>/usage/<replica>.jsonl` by the replica that ran it (a file
//! per server process: replicas sharing the directory never write the same file), and read
//! back summed by day, tenant and principal, whichever replicas wrote them.
//!
//! Counted once: a record is one `write(2)` of one line with the run's unique job id,
//! made after the run ended and before its result is answered. A server killed (even
//! `kill -9`) after that write keeps the line (the kernel holds it); killed before it, the
//! run was not finished. The reader skips a torn last line (and any line that is not a
//! record, or a file it cannot read: counted in one warning) and counts each job id once.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::job::Outcome;

/// What a record is of.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// An `execute_code` / `execute_code_file` run (records written before kinds existed
    /// are runs).
    #[default]
    Run,
    /// An `execute_python` cell of a session.
    Cell,
    /// A package install.
    Install,
}

/// One finished run or cell.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The run's job id (unique): what makes a record count once.
    pub id: String,
    /// UTC day of the end of the run, `YYYY-MM-DD`.
    pub day: String,
    /// Seconds since the Unix epoch at its end.
    pub ts: u64,
    pub tenant: String,
    /// `static-token` (the tenant's token, or stdio) or `user:<digest>` (a signed-in user).
    pub principal: String,
    #[serde(default)]
    pub kind: Kind,
    /// `ok`, `error`, `timeout`, `oom`, `killed`, `cancelled`, `failed`.
    pub outcome: String,
    pub wall_s: f64,
    /// CPU seconds of the code, where the runner measured them.
    pub cpu_s: f64,
    /// The memory limit the run held.
    pub memory_limit_bytes: u64,
    /// The limit held times the wall time.
    pub memory_byte_s: f64,
    pub peak_memory_bytes: u64,
    /// stdout and stderr returned.
    pub output_bytes: u64,
    pub figures: u64,
    /// Code-mode tool requests the run made (records written before they were counted: 0).
    #[serde(default)]
    pub tool_calls: u64,
    /// Bytes the run's code sent through the egress proxy, and received.
    #[serde(default)]
    pub egress_up_bytes: u64,
    #[serde(default)]
    pub egress_down_bytes: u64,
}

impl Record {
    /// The record of a run of `tenant` by `principal` that ended with `result` after
    /// `wall_s`, having held `memory_limit_bytes`.
    pub fn of(
        id: &str,
        tenant: &str,
        principal: &str,
        outcome: Option<&Outcome>,
        label: &str,
        wall_s: f64,
        memory_limit_bytes: u64,
    ) -> Record {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Record {
            id: id.to_string(),
            day: day_of(ts),
            ts,
            tenant: tenant.to_string(),
            principal: principal.to_string(),
            kind: Kind::Run,
            outcome: label.to_string(),
            wall_s,
            cpu_s: outcome.and_then(|o| o.cpu_ms).unwrap_or(0) as f64 / 1000.0,
            memory_limit_bytes,
            memory_byte_s: memory_limit_bytes as f64 * wall_s,
            peak_memory_bytes: outcome.and_then(|o| o.peak_memory_bytes).unwrap_or(0),
            output_bytes: outcome.map_or(0, |o| (o.stdout.len() + o.stderr.len()) as u64),
            figures: outcome.map_or(0, |o| o.artifacts.len() as u64),
            tool_calls: outcome.map_or(0, |o| o.external.tool_calls),
            egress_up_bytes: outcome.map_or(0, |o| o.external.egress_up_bytes),
            egress_down_bytes: outcome.map_or(0, |o| o.external.egress_down_bytes),
        }
    }
}

/// Record a package install of `tenant` by `principal` (its
/// [`crate::tenancy::oauth::Principal::owner`]) that ended `label` (`ok`, `failed`,
/// `cancelled`) after `wall_s`.
pub(super) fn record_install(tenant: &str, principal: Option<&str>, label: &str, wall_s: f64) {
    let principal = principal.map_or("static-token".to_string(), |d| format!("user:{d}"));
    let mut r = Record::of(
        &crate::job::new_job_id(),
        tenant,
        &principal,
        None,
        label,
        wall_s,
        0,
    );
    r.kind = Kind::Install;
    record(&r);
}

/// Record a session cell of `tenant` in a session made by `principal` (its
/// [`crate::tenancy::oauth::Principal::owner`]) that ended with `result` (`None`: cancelled
/// or stopped by a shutdown while it ran) after `wall_s`, the session holding
/// `memory_limit_bytes`.
pub(super) fn record_cell(
    tenant: &str,
    principal: Option<&str>,
    result: Option<&Result<Outcome, crate::backend::BackendError>>,
    wall_s: f64,
    memory_limit_bytes: u64,
) {
    let label = match result {
        None => "cancelled",
        Some(Err(_)) => "failed",
        Some(Ok(o)) => super::metrics::outcome_label(o),
    };
    let principal = principal.map_or("static-token".to_string(), |d| format!("user:{d}"));
    let mut r = Record::of(
        &crate::job::new_job_id(),
        tenant,
        &principal,
        result.and_then(|r| r.as_ref().ok()),
        label,
        wall_s,
        memory_limit_bytes,
    );
    r.kind = Kind::Cell;
    record(&r);
}

/// `YYYY-MM-DD` (UTC) of a Unix time (civil-from-days, proleptic Gregorian).
pub fn day_of(ts: u64) -> String {
    let z = (ts / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The append-only file of this process.
struct Log {
    dir: PathBuf,
    file: Mutex<std::fs::File>,
}

static LOG: OnceLock<Log> = OnceLock::new();

/// The usage directory under a data directory.
pub fn dir_of(data_dir: &Path) -> PathBuf {
    data_dir.join("usage")
}

/// Open this process's usage file in `dir` (once, at start-up): a new file per process.
pub fn open(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let name = format!("{}-{}.jsonl", std::process::id(), crate::job::new_job_id());
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(dir.join(name))?;
    let _ = LOG.set(Log {
        dir: dir.to_path_buf(),
        file: Mutex::new(file),
    });
    Ok(())
}

/// The directory usage is recorded in, when it is.
pub fn recording_dir() -> Option<&'static Path> {
    LOG.get().map(|l| l.dir.as_path())
}

/// Append `r` (a no-op when usage is not recorded, e.g. in library tests).
pub fn record(r: &Record) {
    let Some(log) = LOG.get() else { return };
    let mut line = match serde_json::to_vec(r) {
        Ok(l) => l,
        Err(_) => return,
    };
    line.push(b'\n');
    let mut f = log.file.lock().unwrap_or_else(|e| e.into_inner());
    // One write of one line (an O_APPEND file): whole or, if the process dies inside the
    // call, a torn last line the reader skips.
    if let Err(e) = f.write_all(&line) {
        tracing::warn!(error = %e, "usage record not written");
    }
}

/// Sums of a set of records.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Totals {
    /// Records summed: runs, cells and installs alike (split in [`TenantDay::kinds`]).
    pub runs: u64,
    pub outcomes: BTreeMap<String, u64>,
    pub wall_s: f64,
    pub cpu_s: f64,
    pub memory_byte_s: f64,
    pub peak_memory_bytes: u64,
    pub output_bytes: u64,
    pub figures: u64,
    /// Package installs among the records (kind `install`).
    pub installs: u64,
    pub tool_calls: u64,
    pub egress_up_bytes: u64,
    pub egress_down_bytes: u64,
}

impl Totals {
    fn add(&mut self, r: &Record) {
        self.runs += 1;
        self.installs += u64::from(r.kind == Kind::Install);
        self.tool_calls += r.tool_calls;
        self.egress_up_bytes += r.egress_up_bytes;
        self.egress_down_bytes += r.egress_down_bytes;
        *self.outcomes.entry(r.outcome.clone()).or_default() += 1;
        self.wall_s += r.wall_s;
        self.cpu_s += r.cpu_s;
        self.memory_byte_s += r.memory_byte_s;
        self.peak_memory_bytes = self.peak_memory_bytes.max(r.peak_memory_bytes);
        self.output_bytes += r.output_bytes;
        self.figures += r.figures;
    }
}

/// A tenant's usage of one day: its totals, each kind's (`run`, `cell`, `install`) and each
/// principal's.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct TenantDay {
    #[serde(flatten)]
    pub totals: Totals,
    pub kinds: BTreeMap<Kind, Totals>,
    pub principals: BTreeMap<String, Totals>,
}

/// What [`read`] returns: day -> tenant -> usage.
pub type Report = BTreeMap<String, BTreeMap<String, TenantDay>>;

/// Which records a read sums.
#[derive(Debug, Default, Clone, Copy)]
pub struct Filter<'a> {
    /// One tenant's only.
    pub tenant: Option<&'a str>,
    /// One principal's only (`static-token` or `user:<digest>`).
    pub principal: Option<&'a str>,
    /// Days from (`YYYY-MM-DD`, compared as text, inclusive).
    pub from: Option<&'a str>,
    /// Days to (inclusive).
    pub to: Option<&'a str>,
}

impl Filter<'_> {
    fn keeps(&self, r: &Record) -> bool {
        self.tenant.is_none_or(|t| t == r.tenant)
            && self.principal.is_none_or(|p| p == r.principal)
            && self.from.is_none_or(|f| r.day.as_str() >= f)
            && self.to.is_none_or(|t| r.day.as_str() <= t)
    }
}

/// Every record in the `*.jsonl` files of `dir` that `filter` keeps, each job id once,
/// summed. Read line by line (a file is never held whole); a line that is not a record
/// (torn, or not JSON) and a file that cannot be read are skipped, and counted in one
/// warning per read: one bad line never hides the rest. Blocking: call it off the async
/// runtime (`spawn_blocking`).
pub fn read(dir: &Path, filter: Filter<'_>) -> std::io::Result<Report> {
    let mut out = Report::new();
    let mut seen = HashSet::new();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
        Err(e) => return Err(e),
    };
    files.sort();
    let (mut bad_lines, mut bad_files) = (0u64, 0u64);
    let mut first_error = None;
    for f in files {
        let mut lines = match std::fs::File::open(&f) {
            Ok(file) => std::io::BufReader::new(file),
            Err(e) => {
                bad_files += 1;
                first_error.get_or_insert_with(|| format!("{}: {e}", f.display()));
                continue;
            }
        };
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    bad_files += 1;
                    first_error.get_or_insert_with(|| format!("{}: {e}", f.display()));
                    break;
                }
            }
            // Only whole lines: a line without its newline is torn.
            let record = line
                .strip_suffix(b"\n")
                .and_then(|l| serde_json::from_slice::<Record>(l).ok());
            let Some(r) = record else {
                bad_lines += 1;
                continue;
            };
            if !filter.keeps(&r) || !seen.insert(r.id.clone()) {
                continue;
            }
            let day = out
                .entry(r.day.clone())
                .or_default()
                .entry(r.tenant.clone())
                .or_default();
            day.totals.add(&r);
            day.kinds.entry(r.kind).or_default().add(&r);
            day.principals
                .entry(r.principal.clone())
                .or_default()
                .add(&r);
        }
    }
    if (bad_lines > 0 || bad_files > 0) && skips_changed(&LAST_SKIPS, bad_lines, bad_files) {
        tracing::warn!(
            dir = %dir.display(),
            bad_lines,
            bad_files,
            first_error = first_error.as_deref().unwrap_or(""),
            "usage: records skipped (torn or invalid lines, unreadable files); the rest are summed"
        );
    }
    Ok(out)
}

/// The skipped lines and files of the last read that warned.
static LAST_SKIPS: Mutex<(u64, u64)> = Mutex::new((0, 0));

/// Whether this read's skipped lines and files differ from the last read's that warned.
/// A torn line stays in its file for good (a process killed mid-write never comes back
/// to that file), so without this every `/usage` call would warn again about the same
/// line; a new torn line or unreadable file still warns.
fn skips_changed(last: &Mutex<(u64, u64)>, bad_lines: u64, bad_files: u64) -> bool {
    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
    let changed = *last != (bad_lines, bad_files);
    *last = (bad_lines, bad_files);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_skips_warn_once() {
        let last = Mutex::new((0, 0));
        assert!(skips_changed(&last, 1, 0));
        assert!(!skips_changed(&last, 1, 0));
        assert!(skips_changed(&last, 2, 0));
        assert!(skips_changed(&last, 2, 1));
        assert!(!skips_changed(&last, 2, 1));
    }

    #[test]
    fn days_are_utc_calendar_days() {
        assert_eq!(day_of(0), "1970-01-01");
        assert_eq!(day_of(951_782_400), "2000-02-29");
        assert_eq!(day_of(1_795_842_383), "2026-11-28");
    }

    #[test]
    fn torn_and_bad_lines_and_unreadable_files_are_skipped_and_ids_count_once() {
        let dir = std::env::temp_dir().join(format!("usage-test-{}", crate::job::new_job_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = |id: &str, tenant: &str, p: &str| {
            let mut r = Record::of(id, tenant, p, None, "ok", 2.0, 100);
            r.day = "2026-11-28".into();
            serde_json::to_string(&r).unwrap()
        };
        std::fs::write(
            dir.join("a.jsonl"),
            format!(
                "{}\n{}\n{}",
                r("1", "acme", "user:x"),
                r("2", "acme", "user:y"),
                &r("3", "acme", "user:y")[..20]
            ),
        )
        .unwrap();
        // The same run in another file (a copy): counted once.
        std::fs::write(
            dir.join("b.jsonl"),
            format!(
                "{}\n{}\n",
                r("1", "acme", "user:x"),
                r("4", "globex", "static-token")
            ),
        )
        .unwrap();
        // A bad line mid-file (not JSON, not UTF-8) and an unreadable `.jsonl` (a
        // directory): skipped, the rest summed.
        std::fs::write(
            dir.join("c.jsonl"),
            [
                b"{not json\n\xff\xfe\n".as_slice(),
                format!("{}\n", r("5", "globex", "static-token")).as_bytes(),
            ]
            .concat(),
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("d.jsonl")).unwrap();
        // A cell, and a record written before kinds existed (a run).
        let mut cell = Record::of("6", "globex", "static-token", None, "ok", 1.0, 100);
        cell.day = "2026-11-28".into();
        cell.kind = Kind::Cell;
        let mut old = serde_json::to_value(Record {
            id: "7".into(),
            ..cell.clone()
        })
        .unwrap();
        old.as_object_mut().unwrap().remove("kind");
        std::fs::write(
            dir.join("e.jsonl"),
            format!("{}\n{old}\n", serde_json::to_string(&cell).unwrap()),
        )
        .unwrap();
        let all = read(&dir, Filter::default()).unwrap();
        let acme = &all["2026-11-28"]["acme"];
        assert_eq!(acme.totals.runs, 2);
        assert_eq!(acme.totals.memory_byte_s, 400.0);
        assert_eq!(acme.principals["user:y"].runs, 1);
        let globex = &all["2026-11-28"]["globex"];
        assert_eq!(globex.totals.runs, 4);
        assert_eq!(globex.kinds[&Kind::Run].runs, 3);
        assert_eq!(globex.kinds[&Kind::Cell].runs, 1);
        assert_eq!(globex.kinds[&Kind::Cell].wall_s, 1.0);
        let only = |f: Filter<'_>| read(&dir, f).unwrap();
        let globex = only(Filter {
            tenant: Some("globex"),
            ..Filter::default()
        });
        assert!(!globex["2026-11-28"].contains_key("acme"));
        let y = only(Filter {
            tenant: Some("acme"),
            principal: Some("user:y"),
            ..Filter::default()
        });
        assert_eq!(y["2026-11-28"]["acme"].totals.runs, 1);
        assert_eq!(y["2026-11-28"]["acme"].principals.len(), 1);
        assert!(only(Filter {
            from: Some("2026-11-29"),
            ..Filter::default()
        })
        .is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
