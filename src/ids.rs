//! Handles that name their owner: every handle this process makes (an `execute_python`
//! session, an MCP task, a legacy SSE session, a Streamable HTTP `Mcp-Session-Id`; a
//! resource URI carries its session's handle) reads `KIND_REPLICA_REST`, where `REPLICA` is
//! this process's replica id: 8 random characters `[0-9a-f]`, new at every start, so that a
//! handle of a replica that restarted names a replica that is gone, not a stranger.
//!
//! A leaf (no other module of the crate): storage names its files with it, the core its
//! sessions, the MCP layer its tasks and protocol sessions, the router reads it.

use std::sync::OnceLock;

/// Length of a replica id.
pub const LEN: usize = 8;

static REPLICA: OnceLock<String> = OnceLock::new();

/// This process's replica id (made on first use).
pub fn replica() -> &'static str {
    REPLICA.get_or_init(|| uuid::Uuid::new_v4().simple().to_string()[..LEN].to_string())
}

/// A handle of kind `kind` (one lowercase letter: `s` session, `t` task, `m` protocol
/// session) owned by this replica, `rest` its unique part.
pub fn mint(kind: char, rest: &str) -> String {
    format!("{kind}_{}_{rest}", replica())
}

/// The replica that owns `handle`, when it is one of ours (`KIND_REPLICA_REST`); `None` for
/// anything else (an older handle, garbage).
pub fn owner(handle: &str) -> Option<&str> {
    let mut parts = handle.splitn(3, '_');
    let kind = parts.next()?;
    let rid = parts.next()?;
    let rest = parts.next()?;
    let kind_ok = kind.len() == 1 && kind.bytes().all(|b| b.is_ascii_lowercase());
    let rid_ok = rid.len() == LEN && rid.bytes().all(|b| b.is_ascii_hexdigit());
    (kind_ok && rid_ok && !rest.is_empty()).then_some(rid)
}

/// Is `handle` this replica's own (or a handle naming no replica, which only this one can
/// mean)?
pub fn is_mine(handle: &str) -> bool {
    owner(handle).is_none_or(|r| r == replica())
}

/// `handle` without this replica's `KIND_REPLICA_` prefix (other handles unchanged): the id
/// a library minted, which this replica wrapped with [`mint`].
pub fn unwrap_mine(handle: &str) -> &str {
    match owner(handle) {
        Some(r) if r == replica() => &handle[2 + LEN + 1..],
        _ => handle,
    }
}

/// The replica that stored code file `path` (its name `STEM_REPLICA_RANDOM.py`, as
/// [`crate::storage::CodeStorage::create`] makes it), when its name says.
pub fn file_owner(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?.strip_suffix(".py")?;
    let mut parts = name.rsplitn(3, '_');
    let random = parts.next()?;
    let rid = parts.next()?;
    let stem = parts.next()?;
    let hex8 = |s: &str| s.len() == LEN && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex8(random) && hex8(rid) && !stem.is_empty()).then_some(rid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_file_names_its_replica() {
        assert_eq!(
            file_owner("/d/code/t/my_flow_0123abcd_89abcdef.py"),
            Some("0123abcd")
        );
        assert_eq!(file_owner("flow_0123abcd_89abcdef.py"), Some("0123abcd"));
        for other in [
            "flow_89abcdef.py",
            "/x/_0123abcd_89abcdef.py",
            "a_0123abcd_89abcdef.txt",
            "",
        ] {
            assert_eq!(file_owner(other), None, "{other}");
        }
    }

    #[test]
    fn a_minted_handle_names_this_replica_and_unwraps() {
        let h = mint('t', "0b9e-uuid_with_underscores");
        assert_eq!(owner(&h), Some(replica()));
        assert!(is_mine(&h));
        assert_eq!(unwrap_mine(&h), "0b9e-uuid_with_underscores");
        assert_eq!(owner("s_0123abcd_ff"), Some("0123abcd"));
        assert!(!is_mine("s_0123abce_ff") || replica() == "0123abce");
        for other in [
            "s_ff",
            "s__x",
            "ab_0123abcd_x",
            "s_0123abcd_",
            "",
            "uuid-like-1234",
        ] {
            assert_eq!(owner(other), None, "{other}");
            assert!(is_mine(other));
            assert_eq!(unwrap_mine(other), other);
        }
    }
}
