//! The layering of `src/`: no cycle between the top-level modules (`src/*`), and none between
//! the files of one module. Each file's paths (`crate::…`, `super::…`, `self::…`, `use` groups
//! included, test code included, comments and literals skipped) are resolved to the file that
//! defines the module they name; a failure names the first cycle found, file by file, with
//! the path that makes each step.
//!
//! Between files, an edge into a `mod.rs` does not count: a module's `mod.rs` declares what
//! its children share, and they reach it with `super::`. A cycle among leaf files is a
//! circle the `mod.rs` (or a file of its own) should hold the shared type of.
//!
//! Pure file reading, no Docker, no server: its own test binary, built in seconds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A module path: `["backend", "engine", "live"]`.
type ModPath = Vec<String>;

/// Every `.rs` file of the library (not `src/bin/`, another crate), with its module path.
fn library_files(src: &Path) -> BTreeMap<ModPath, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(src, &mut paths);
    let mut files = BTreeMap::new();
    for path in paths {
        let rel = path.strip_prefix(src).unwrap();
        if rel.starts_with("bin") {
            continue;
        }
        let mut parts: ModPath = rel
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
            parts.pop();
        }
        files.insert(parts, path);
    }
    files
}

/// `text` with comments, string, raw string and character literals blanked (lifetimes kept).
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // A raw string: r"…", r#"…"#, …
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (is_ident(b[i - 1]) || b[i - 1] == '$')
}

/// Every path in `code` that starts at `crate`, `super` or `self`, `use` groups expanded:
/// `use crate::{a::{b, c}, d}` gives `crate::a::b`, `crate::a::c` and `crate::d`.
fn paths(code: &str) -> Vec<Vec<String>> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if is_ident(b[i]) && !ident_before(&b, i) {
            let start = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            let prev = b[..start].iter().rev().find(|c| !c.is_whitespace());
            let after_colons = prev == Some(&':');
            if matches!(word.as_str(), "crate" | "super" | "self")
                && !after_colons
                && b.get(i) == Some(&':')
                && b.get(i + 1) == Some(&':')
            {
                let (found, end) = tree(&b, i, vec![word]);
                out.extend(found);
                i = end;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The rest of a path after `prefix`, from `i` (at `::` or at the end of the path): its
/// segments, or a `{…}` group of trees. Returns the paths and where they end.
fn tree(b: &[char], mut i: usize, mut prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    loop {
        let mut j = i;
        while j < b.len() && b[j].is_whitespace() {
            j += 1;
        }
        if !(b.get(j) == Some(&':') && b.get(j + 1) == Some(&':')) {
            return (vec![prefix], i);
        }
        j += 2;
        while j < b.len() && b[j].is_whitespace() {
            j += 1;
        }
        if b.get(j) == Some(&'{') {
            let mut found = Vec::new();
            j += 1;
            loop {
                while j < b.len() && (b[j].is_whitespace() || b[j] == ',') {
                    j += 1;
                }
                if j >= b.len() || b[j] == '}' {
                    return (found, j + 1);
                }
                let start = j;
                while j < b.len() && is_ident(b[j]) {
                    j += 1;
                }
                if start == j {
                    // `*` or something else we do not follow: the group's prefix itself.
                    found.push(prefix.clone());
                    while j < b.len() && !matches!(b[j], ',' | '}') {
                        j += 1;
                    }
                    continue;
                }
                let mut p = prefix.clone();
                p.push(b[start..j].iter().collect());
                let (sub, end) = tree(b, j, p);
                found.extend(sub);
                j = end;
                // Skip ` as name` up to the next item.
                while j < b.len() && !matches!(b[j], ',' | '}') {
                    j += 1;
                }
            }
        }
        let start = j;
        while j < b.len() && is_ident(b[j]) {
            j += 1;
        }
        if start == j {
            return (vec![prefix], i);
        }
        prefix.push(b[start..j].iter().collect());
        i = j;
    }
}

/// The module path `path`, written in module `here`, names, made absolute (`self` and
/// `super` count from the module, whichever file holds it).
fn absolute(here: &[String], path: &[String]) -> ModPath {
    let mut it = path.iter().peekable();
    let mut base: ModPath = match it.peek().map(|s| s.as_str()) {
        Some("crate") => {
            it.next();
            Vec::new()
        }
        _ => here.to_vec(),
    };
    while let Some(seg) = it.peek() {
        match seg.as_str() {
            "self" => {
                it.next();
            }
            "super" => {
                base.pop();
                it.next();
            }
            _ => break,
        }
    }
    base.extend(it.cloned());
    base
}

/// One edge of the graph: the file that uses, the path it writes.
#[derive(Clone, Debug)]
struct Why {
    file: String,
    path: String,
}

type Graph = BTreeMap<String, BTreeMap<String, Why>>;

/// The first cycle of `graph` (nodes in order, the first again at the end), by depth-first
/// search from each node in name order.
fn first_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &Graph,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flat_map(|e| e.keys()) {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// The cycle, one step a line, with the file and path that make it.
fn describe(what: &str, graph: &Graph, cycle: &[String]) -> String {
    let mut s = format!("a cycle between {what}: {}\n", cycle.join(" -> "));
    for w in cycle.windows(2) {
        let why = &graph[&w[0]][&w[1]];
        s.push_str(&format!(
            "  {} -> {}: {} uses {}\n",
            w[0], w[1], why.file, why.path
        ));
    }
    s
}

/// The two graphs of the library under `src`: between top-level modules, and between leaf
/// files (edges into a `mod.rs` left out).
fn graphs(src: &Path) -> (Graph, Graph) {
    let files = library_files(src);
    let rel = |p: &Path| {
        p.strip_prefix(src.parent().unwrap())
            .unwrap()
            .display()
            .to_string()
    };
    let mut modules = Graph::new();
    let mut leaves = Graph::new();
    for (here, file) in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for path in paths(&code_only(&text)) {
            let abs = absolute(here, &path);
            // The longest prefix that is a module of ours: the file it names.
            let Some(target) = (1..=abs.len())
                .rev()
                .map(|n| abs[..n].to_vec())
                .find(|p| files.contains_key(p))
            else {
                continue;
            };
            let why = Why {
                file: rel(file),
                path: path.join("::"),
            };
            if let (Some(a), Some(b)) = (here.first(), target.first()) {
                if a != b {
                    modules
                        .entry(a.clone())
                        .or_default()
                        .entry(b.clone())
                        .or_insert_with(|| why.clone());
                }
            }
            let target_file = &files[&target];
            if target_file != file && target_file.file_name().is_some_and(|n| n != "mod.rs") {
                leaves
                    .entry(rel(file))
                    .or_default()
                    .entry(rel(target_file))
                    .or_insert(why);
            }
        }
    }
    (modules, leaves)
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn top_level_modules_point_one_way() {
    let (modules, _) = graphs(&src());
    assert!(
        modules.len() > 5,
        "the module graph came out nearly empty ({} modules): the parser is broken",
        modules.len()
    );
    if let Some(cycle) = first_cycle(&modules) {
        panic!(
            "{}",
            describe("top-level modules of src/", &modules, &cycle)
        );
    }
}

#[test]
fn files_of_a_module_point_one_way() {
    let (_, leaves) = graphs(&src());
    if let Some(cycle) = first_cycle(&leaves) {
        panic!("{}", describe("files of src/", &leaves, &cycle));
    }
}

/// The checker itself: a cycle added to a scratch tree is found and named, with the paths
/// written in the ways the library writes them.
#[test]
fn a_cycle_is_found_and_named() {
    let root = std::env::temp_dir().join(format!("layering-{}", std::process::id()));
    let src = root.join("src");
    let write = |p: &str, s: &str| {
        let p = src.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    };
    write("lib.rs", "pub mod a; pub mod b; pub mod c;");
    write("a/mod.rs", "mod x; mod y; use crate::{b::Thing, c};");
    write(
        "a/x.rs",
        "// use super::y; (a comment)\nlet s = \"super::y\"; use super::y::{self, Z as W};",
    );
    write(
        "a/y.rs",
        "fn f<'a>() -> char { let _ = '\"'; super::x::g() }",
    );
    write("b.rs", "pub struct Thing; fn f() { r#\"crate::a\"#; }");
    write("c.rs", "fn f() { crate::b::Thing; }");
    let (modules, leaves) = graphs(&src);
    let module_cycle = first_cycle(&modules);
    let leaf_cycle = first_cycle(&leaves);
    let _ = std::fs::remove_dir_all(&root);

    assert_eq!(module_cycle, None, "{modules:?}");
    let cycle = leaf_cycle.expect("a/x.rs <-> a/y.rs is a cycle");
    let text = describe("files", &leaves, &cycle);
    assert!(text.contains("src/a/x.rs -> src/a/y.rs"), "{text}");
    assert!(text.contains("src/a/y.rs uses super::x::g"), "{text}");

    // Close a top-level one: b uses a.
    let mut modules = modules;
    modules.entry("b".into()).or_default().insert(
        "a".into(),
        Why {
            file: "src/b.rs".into(),
            path: "crate::a::x".into(),
        },
    );
    let cycle = first_cycle(&modules).expect("a -> b -> a");
    assert_eq!(cycle, ["a", "b", "a"]);
    assert!(describe("modules", &modules, &cycle).contains("src/b.rs uses crate::a::x"));
}
