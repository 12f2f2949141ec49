//! MCP names (`get-sum`, `read_text_file`, `server.v2`) as Python identifiers: every
//! character that cannot be in one becomes `_`, a leading digit gets a `_` before it, a
//! keyword or a name the `tools` package itself uses gets a `_` after it; two tools that
//! come out the same are told apart by `_2`, `_3`, … in the order the server lists them.

const KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "match", "case",
];

/// Names of the `tools` package a server module must not hide.
const PACKAGE: &[&str] = &[
    "ToolError",
    "ToolDenied",
    "ToolTimeout",
    "BudgetExceeded",
    "Result",
    "call",
    "acall",
    "search",
    "help",
    "servers",
];

/// A Python identifier for `name`.
pub fn identifier(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    if KEYWORDS.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// The module name of a server (`from tools import NAME`).
pub fn module(server: &str) -> String {
    let s = identifier(server);
    if PACKAGE.contains(&s.as_str()) || s.starts_with("__") {
        format!("{s}_")
    } else {
        s
    }
}

/// Identifiers for `names`, in order, unique among themselves (and never `aio` or
/// `mcp_name`, the attributes of a tool function, nor a dunder).
pub fn unique(names: &[&str]) -> Vec<String> {
    let mut taken = std::collections::HashSet::new();
    names
        .iter()
        .map(|n| {
            let mut base = identifier(n);
            if base.starts_with("__") || base == "server" {
                base.push('_');
            }
            let mut candidate = base.clone();
            let mut i = 2;
            while !taken.insert(candidate.clone()) {
                candidate = format!("{base}_{i}");
                i += 1;
            }
            candidate
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_names_become_identifiers() {
        assert_eq!(identifier("get-sum"), "get_sum");
        assert_eq!(identifier("read_text_file"), "read_text_file");
        assert_eq!(identifier("2fa"), "_2fa");
        assert_eq!(identifier("import"), "import_");
        assert_eq!(identifier("a.b/c é"), "a_b_c__");
        assert_eq!(identifier(""), "_");
        assert_eq!(module("help"), "help_");
        assert_eq!(module("server-everything"), "server_everything");
        assert_eq!(
            unique(&["get-sum", "get_sum", "get.sum", "__x", "server"]),
            vec!["get_sum", "get_sum_2", "get_sum_3", "__x_", "server_"]
        );
    }
}
