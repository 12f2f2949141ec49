//! What `run` was given, turned into the files it runs: plain files as named, directories
//! as every `*.py` under them, glob patterns as what they match; all read before anything
//! runs, so a typo in the last name fails the job at once (exit 2), not after the others.

use std::path::{Path, PathBuf};

/// The largest source file `run` accepts.
pub const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// One file to run.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// As reports name it: the path as given (or found under a directory), `-` for stdin.
    pub name: String,
    /// Where to read it; `None` for stdin.
    pub path: Option<PathBuf>,
    /// Its name in the sandbox (tracebacks point at it): see [`entry_name`].
    pub entry: String,
    /// The code, once [`read_all`] read it.
    pub code: Vec<u8>,
}

/// Expand the arguments, in their order: a directory gives every `*.py` under it (hidden
/// files and directories such as `.venv` or `.git` skipped, symbolic links to directories
/// not followed) sorted by path; an argument naming nothing that holds `*`, `?` or `[`
/// is a glob pattern (`**` crosses directories); anything else is taken as a file name.
/// A file named twice runs once. Errors are usage errors, in words.
pub fn expand(args: &[String]) -> Result<Vec<SourceFile>, String> {
    let mut out: Vec<SourceFile> = Vec::new();
    let mut push = |name: String, path: Option<PathBuf>| {
        if !out.iter().any(|f| f.name == name) {
            out.push(SourceFile {
                entry: entry_name(&name),
                name,
                path,
                code: Vec::new(),
            });
        }
    };
    for arg in args {
        if arg == "-" {
            push(arg.clone(), None);
            continue;
        }
        let path = Path::new(arg);
        if path.is_dir() {
            let found = python_files_under(path)?;
            if found.is_empty() {
                return Err(format!("no *.py file under {arg}"));
            }
            for p in found {
                push(display(&p), Some(p));
            }
        } else if !path.exists() && arg.contains(['*', '?', '[']) {
            // As a shell does: `*` does not match a leading dot (`.venv`, `.git`).
            let opts = glob::MatchOptions {
                require_literal_leading_dot: true,
                ..glob::MatchOptions::new()
            };
            let matches =
                glob::glob_with(arg, opts).map_err(|e| format!("bad glob pattern `{arg}`: {e}"))?;
            let mut found = Vec::new();
            for m in matches {
                let p = m.map_err(|e| format!("cannot read {}: {e}", e.path().display()))?;
                if p.is_dir() {
                    found.extend(python_files_under(&p)?);
                } else {
                    found.push(p);
                }
            }
            if found.is_empty() {
                return Err(format!("no file matches `{arg}`"));
            }
            found.sort();
            for p in found {
                push(display(&p), Some(p));
            }
        } else {
            push(arg.clone(), Some(path.to_path_buf()));
        }
    }
    Ok(out)
}

fn display(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Every `*.py` under `dir`, sorted by path (so the order is the same on every machine).
fn python_files_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| format!("cannot read {}: {e}", d.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot read {}: {e}", d.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
            let path = entry.path();
            if kind.is_dir() {
                todo.push(path);
            } else if name.ends_with(".py") && path.is_file() {
                // `is_file` follows a symbolic link: a link to a file counts, one to a
                // directory is neither walked nor run.
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Read every file (stdin for `-`), at most [`MAX_SOURCE_BYTES`] each.
pub async fn read_all(files: &mut [SourceFile]) -> Result<(), String> {
    for f in files.iter_mut() {
        f.code = read_source(&f.name, f.path.as_deref()).await?;
    }
    Ok(())
}

async fn read_source(name: &str, path: Option<&Path>) -> Result<Vec<u8>, String> {
    use tokio::io::AsyncReadExt;
    let mut buf = Vec::new();
    match path {
        None => {
            tokio::io::stdin()
                .take(MAX_SOURCE_BYTES + 1)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| format!("cannot read the code from stdin: {e}"))?;
        }
        Some(path) => {
            let f = tokio::fs::File::open(path)
                .await
                .map_err(|e| format!("cannot read {name}: {e}"))?;
            f.take(MAX_SOURCE_BYTES + 1)
                .read_to_end(&mut buf)
                .await
                .map_err(|e| format!("cannot read {name}: {e}"))?;
        }
    }
    if buf.len() as u64 > MAX_SOURCE_BYTES {
        return Err(format!(
            "{name} is larger than {} MiB",
            MAX_SOURCE_BYTES >> 20
        ));
    }
    Ok(buf)
}

/// The name the file gets in the sandbox: its own base name when that is a plain `.py`
/// name (tracebacks then point at it), `main.py` otherwise.
pub fn entry_name(path: &str) -> String {
    let base = path.rsplit('/').next().unwrap_or("");
    let plain = base.ends_with(".py")
        && base.len() <= 255
        && base
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && !base.starts_with('.');
    if plain {
        base.to_string()
    } else {
        "main.py".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names() {
        assert_eq!(entry_name("tests/smoke_1.py"), "smoke_1.py");
        assert_eq!(entry_name("-"), "main.py");
        assert_eq!(entry_name("weird name.py"), "main.py");
        assert_eq!(entry_name("script"), "main.py");
        assert_eq!(entry_name(".hidden.py"), "main.py");
    }

    fn tree() -> PathBuf {
        let root = std::env::temp_dir().join(format!("mcpx-files-{}", uuid::Uuid::new_v4()));
        for (p, body) in [
            ("b.py", "1"),
            ("a.py", "2"),
            ("notes.txt", "x"),
            ("sub/z.py", "3"),
            ("sub/deeper/c.py", "4"),
            (".venv/lib/site.py", "5"),
            ("sub/.hidden.py", "6"),
        ] {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }
        root
    }

    fn names(files: &[SourceFile], root: &Path) -> Vec<String> {
        let prefix = format!("{}/", root.display());
        files
            .iter()
            .map(|f| f.name.strip_prefix(&prefix).unwrap_or(&f.name).to_string())
            .collect()
    }

    #[test]
    fn a_directory_gives_its_python_files_in_path_order_without_hidden_ones() {
        let root = tree();
        let files = expand(&[format!("{}/", root.display())]).unwrap();
        assert_eq!(
            names(&files, &root),
            ["a.py", "b.py", "sub/deeper/c.py", "sub/z.py"]
        );
        assert_eq!(files[2].entry, "c.py");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn globs_expand_and_a_file_named_twice_runs_once() {
        let root = tree();
        let r = root.display();
        let files = expand(&[
            format!("{r}/sub/z.py"),
            format!("{r}/**/*.py"),
            format!("{r}/?.py"),
        ])
        .unwrap();
        assert_eq!(
            names(&files, &root),
            ["sub/z.py", "a.py", "b.py", "sub/deeper/c.py"]
        );
        let e = expand(&[format!("{r}/*.rs")]).unwrap_err();
        assert!(e.contains("no file matches"), "{e}");
        std::fs::create_dir_all(root.join("empty")).unwrap();
        let e = expand(&[format!("{r}/empty")]).unwrap_err();
        assert!(e.contains("no *.py file under"), "{e}");
        // A name that matches nothing and is no pattern is left for the read to refuse.
        let files = expand(&["missing.py".to_string(), "-".to_string()]).unwrap();
        assert_eq!(files.len(), 2);
        assert!(files[1].path.is_none());
        std::fs::remove_dir_all(root).unwrap();
    }
}
