//! What a client's `file_path` may name (a file directly inside the storage directory, and
//! nothing else), and the rule of every name shown to a client.

use std::path::{Component, Path, PathBuf};

use super::{defaults, StorageError, TEMP_PREFIX};

/// Map a client's `file_path` to a path directly inside the storage directory (`canonical`,
/// also spelt `root`), or refuse. Pure: looks only at the string (symlinks are refused when
/// the file is opened).
pub(super) fn resolve(
    canonical: &Path,
    root: &Path,
    file_path: &str,
) -> Result<PathBuf, StorageError> {
    let shown = || file_path.to_string();
    if file_path.contains('\0') {
        return Err(StorageError::NulByte { path: shown() });
    }
    if file_path.trim().is_empty() {
        return Err(StorageError::Empty);
    }
    if !file_path.chars().all(printable) {
        // A newline in a name would let it forge a line of a result or a listing.
        return Err(StorageError::Control {
            path: file_path.escape_debug().take(200).collect(),
        });
    }
    if file_path.len() > 4096 {
        return Err(StorageError::TooLong {
            path: format!("{}…", file_path.chars().take(64).collect::<String>()),
            max: defaults::MAX_NAME_BYTES,
        });
    }
    let p = Path::new(file_path);
    let rest = if p.is_absolute() {
        [canonical, root]
            .iter()
            .find_map(|r| p.strip_prefix(r).ok())
            .ok_or_else(|| {
                // `/storage/../etc/passwd` starts with the root but is traversal.
                if p.components().any(|c| c == Component::ParentDir) {
                    StorageError::Traversal { path: shown() }
                } else {
                    StorageError::Outside {
                        path: shown(),
                        root: canonical.display().to_string(),
                    }
                }
            })?
    } else {
        p
    };
    let mut comps = rest.components();
    let name = match (comps.next(), comps.next()) {
        (Some(Component::Normal(name)), None) if !file_path.ends_with('/') => name,
        _ => return Err(StorageError::Traversal { path: shown() }),
    };
    if name.len() > defaults::MAX_NAME_BYTES {
        return Err(StorageError::TooLong {
            path: shown(),
            max: defaults::MAX_NAME_BYTES,
        });
    }
    if name.to_string_lossy().starts_with(TEMP_PREFIX) {
        return Err(StorageError::Reserved { path: shown() });
    }
    Ok(canonical.join(name))
}

/// The client's `filename` reduced to `[A-Za-z0-9_-]`, without directories or `.py`;
/// `script` when nothing is left.
pub fn sanitize_stem(filename: Option<&str>) -> String {
    let raw = filename.unwrap_or("");
    let base = raw.rsplit(['/', '\\']).next().unwrap_or("");
    let base = base.strip_suffix(".py").unwrap_or(base);
    let stem: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(defaults::MAX_STEM_CHARS)
        .collect();
    let stem = stem.trim_matches('_');
    if stem.is_empty() {
        "script".to_string()
    } else {
        stem.to_string()
    }
}

/// Whether `c` may stand in a file name shown to a client (a result, a listing): the rule
/// of every name, written by `write_file` or by code (the sandbox's runner applies Python's
/// `str.isprintable`, which this follows): no control character (a newline would forge a
/// line), no format character (U+202E turns `gpj.py` around, U+200B hides), no separator
/// other than the space (U+2028 is a line break to many readers), no private-use character.
/// Code points not yet assigned are the one difference (Python refuses them; no Unicode
/// table here).
pub fn printable(c: char) -> bool {
    let u = c as u32;
    let format = matches!(u,
        0xAD | 0x600..=0x605 | 0x61C | 0x6DD | 0x70F | 0x890..=0x891 | 0x8E2 | 0x180E
        | 0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F | 0xFEFF
        | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F | 0x1BCA0..=0x1BCA3
        | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F);
    let separator = matches!(
        u,
        0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000
    );
    let private = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let nonchar = (u & 0xFFFE) == 0xFFFE || (0xFDD0..=0xFDEF).contains(&u);
    !(c.is_control() || format || separator || private || nonchar)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::tmp;
    use super::*;

    #[test]
    fn stems_are_sanitised() {
        assert_eq!(sanitize_stem(Some("matrix_gen")), "matrix_gen");
        assert_eq!(sanitize_stem(Some("my script.py")), "my_script");
        assert_eq!(sanitize_stem(Some("../../etc/passwd")), "passwd");
        assert_eq!(sanitize_stem(Some("..")), "script");
        assert_eq!(sanitize_stem(None), "script");
        assert_eq!(sanitize_stem(Some(&"a".repeat(500))).len(), 64);
    }

    #[test]
    fn resolve_accepts_names_and_paths_inside() {
        let (_d, s) = tmp();
        let inside = s.dir().join("a_1.py");
        assert_eq!(s.resolve("a_1.py").unwrap(), inside);
        assert_eq!(s.resolve(inside.to_str().unwrap()).unwrap(), inside);
    }

    #[test]
    fn resolve_refuses_traversal() {
        let (_d, s) = tmp();
        let root = s.dir().display().to_string();
        let cases: Vec<(String, &str)> = vec![
            ("/etc/passwd".into(), "outside"),
            ("../../x".into(), "not allowed"),
            ("..".into(), "not allowed"),
            ("sub/x.py".into(), "not allowed"),
            ("./x.py".into(), "not allowed"),
            (format!("{root}/../x.py"), "not allowed"),
            (format!("{root}/sub/x.py"), "not allowed"),
            (format!("{root}/"), "not allowed"),
            ("x\0.py".into(), "NUL"),
            ("a\nstatus: exit code 0".into(), "control characters"),
            ("bell\u{7}.txt".into(), "control characters"),
            // Issue 24, item 8: what the sandbox refuses for files the code writes.
            ("a\u{2028}b.txt".into(), "control characters"),
            ("x\u{202e}txt.py".into(), "control characters"),
            ("zero\u{200b}width".into(), "control characters"),
            ("".into(), "empty"),
            ("a".repeat(300), "too long"),
            ("a".repeat(5000), "too long"),
        ];
        for (p, want) in cases {
            let e = s.resolve(&p).unwrap_err().to_string();
            assert!(e.contains(want), "{p:?}: {e}");
        }
    }
}

#[cfg(test)]
mod printable_tests {
    use super::printable;
    use proptest::prelude::*;

    #[test]
    fn what_python_does_not_print_is_refused() {
        for c in [
            '\n',
            '\t',
            '\u{0}',
            '\u{7f}',
            '\u{85}',
            '\u{2028}',
            '\u{2029}',
            '\u{202e}',
            '\u{200b}',
            '\u{feff}',
            '\u{a0}',
            '\u{3000}',
            '\u{e000}',
            '\u{fffe}',
            '\u{e0041}',
        ] {
            assert!(!printable(c), "{:?}", c);
        }
        for c in ['a', ' ', '.', '-', 'é', '€', '😀', '中', '\u{300}'] {
            assert!(printable(c), "{:?}", c);
        }
    }

    proptest! {
        /// Every character Python's `isprintable` refuses among those below is refused here
        /// too (checked once against the host's Python: tests/fuzz_args.rs sends them).
        #[test]
        fn names_of_plain_letters_pass(s in "[a-zA-Z0-9 ._éü€中-]{1,40}") {
            prop_assert!(s.chars().all(printable));
        }

        #[test]
        fn one_bad_character_is_enough(s in "[a-z]{0,10}", bad in prop::sample::select(vec!['\n', '\u{2028}', '\u{202e}', '\u{200b}', '\u{1b}']), t in "[a-z]{0,10}") {
            let name = format!("{s}{bad}{t}");
            prop_assert!(!name.chars().all(printable));
        }
    }
}
