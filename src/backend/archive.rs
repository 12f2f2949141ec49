//! The tar archives the server sends into sandboxes. Built here from in-memory regular
//! files only: a symlink or device entry in an uploaded tar could redirect a later write,
//! so the archive never contains one, and paths are checked before they are packed.

use crate::job::InputFile;

/// Why a file cannot be packed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArchiveError {
    #[error("file path `{0}` is not a plain relative path (no `..`, no leading `/`, no NUL)")]
    BadPath(String),
    #[error("file path `{0}` appears twice")]
    Duplicate(String),
    #[error("file path `{file}` is also a directory of `{inside}`: one of them must be renamed")]
    FileIsDirectory { file: String, inside: String },
}

/// Check that `path` is relative, `/`-separated, without `.`/`..` components or NUL.
pub fn check_relative_path(path: &str) -> Result<(), ArchiveError> {
    let bad = path.is_empty()
        || path.len() > 1024
        || path.starts_with('/')
        || path.contains('\0')
        || path.contains('\\')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        Err(ArchiveError::BadPath(path.to_string()))
    } else {
        Ok(())
    }
}

/// Pack `files` into an uncompressed tar of regular files (mode 0644, owner 0, mtime 0).
pub fn pack(files: &[InputFile]) -> Result<Vec<u8>, ArchiveError> {
    let mut seen = std::collections::HashSet::new();
    for f in files {
        check_relative_path(&f.path)?;
        if !seen.insert(f.path.as_str()) {
            return Err(ArchiveError::Duplicate(f.path.clone()));
        }
    }
    // `a` and `a/b` cannot both be unpacked: `a` would have to be a file and a directory.
    for f in files {
        let mut dir = f.path.as_str();
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if seen.contains(parent) {
                return Err(ArchiveError::FileIsDirectory {
                    file: parent.to_string(),
                    inside: f.path.clone(),
                });
            }
            dir = parent;
        }
    }
    let mut builder = tar::Builder::new(Vec::new());
    for f in files {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(f.contents.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        // GNU long-name extensions keep paths over 100 bytes intact.
        builder
            .append_data(&mut header, &f.path, f.contents.as_slice())
            .map_err(|_| ArchiveError::BadPath(f.path.clone()))?;
    }
    Ok(builder.into_inner().expect("writing to a Vec cannot fail"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, data: &[u8]) -> InputFile {
        InputFile {
            path: path.into(),
            contents: data.to_vec(),
        }
    }

    #[test]
    fn packs_regular_files_that_read_back() {
        let long = format!("{}/x.py", "d".repeat(150));
        let tar = pack(&[file("main.py", b"print(1)"), file(&long, b"")]).unwrap();
        let mut ar = tar::Archive::new(tar.as_slice());
        let entries: Vec<_> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                assert_eq!(e.header().entry_type(), tar::EntryType::Regular);
                e.path().unwrap().to_string_lossy().into_owned()
            })
            .collect();
        assert_eq!(entries, vec!["main.py".to_string(), long]);
    }

    #[test]
    fn refuses_paths_that_escape() {
        for p in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a\0b",
            "a\\b",
        ] {
            assert_eq!(
                check_relative_path(p),
                Err(ArchiveError::BadPath(p.into())),
                "{p:?}"
            );
        }
        assert!(check_relative_path("pkg/mod.py").is_ok());
        assert_eq!(
            pack(&[file("a", b""), file("a", b"")]),
            Err(ArchiveError::Duplicate("a".into()))
        );
    }

    #[test]
    fn refuses_a_file_that_is_also_a_directory() {
        for files in [
            vec![file("a", b""), file("a/b/c.py", b"")],
            vec![file("a/b/c.py", b""), file("a/b", b"")],
        ] {
            assert!(
                matches!(pack(&files), Err(ArchiveError::FileIsDirectory { .. })),
                "{files:?}"
            );
        }
        assert!(pack(&[file("a/b.py", b""), file("a/c.py", b""), file("ab", b"")]).is_ok());
    }
}
