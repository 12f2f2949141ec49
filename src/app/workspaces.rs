//! Workspaces: a directory on the server per session (`<root>/<tenant>.sessions/<random>`,
//! deleted when the session ends) or, with `shared_workspace`, one per tenant
//! (`<root>/<tenant>`). Its files are sent into every run and session at `/workspace`, and
//! files the code writes there come back into it. Paths get the same refusals as code
//! storage ([`CodeStorage::resolve`]: no traversal, no absolute paths outside, no
//! subdirectories, no NUL, no over-long names, symlinks never followed), plus caps on file
//! size, file count and total size.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::error::AppError;
use crate::job::InputFile;
use crate::storage::CodeStorage;
use crate::storage::Stamp;

/// Caps of a workspace.
pub mod caps {
    /// Largest file (as the code writes it).
    pub const FILE_BYTES: u64 = 8 << 20;
    /// Largest file one write_file call may carry: as base64 (4/3 of it) inside a JSON
    /// request it must fit the request body limit.
    pub const WRITE_BYTES: u64 = 5 << 20;
    /// Files in one workspace.
    pub const FILES: usize = 100;
    /// All files together.
    pub const TOTAL_BYTES: u64 = 32 << 20;
    /// Outputs the server kept in one workspace (a session's figures, long outputs): the
    /// newest; older ones nobody changed since are removed as new ones come, and before a
    /// write would pass a cap above.
    pub const KEPT_OUTPUTS: usize = 20;
}

/// Where the code sees the workspace.
pub const MOUNT: &str = "/workspace";

/// The key of a session's own workspace: `<tenant>.sessions/<id>`.
pub(super) fn session_key(tenant: &str, id: &str) -> String {
    format!("{tenant}.sessions/{id}")
}

/// Whether `key` names a session's own workspace (not a tenant's shared one).
fn is_sessions_own(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(tenant, _)| tenant.ends_with(".sessions"))
}

/// The workspaces of one server: one directory per tenant under `root`.
pub struct Workspaces {
    root: PathBuf,
    open: Mutex<HashMap<String, Arc<CodeStorage>>>,
    /// The tenant's storage quota, when it has one.
    quota: std::sync::OnceLock<Arc<crate::storage::StorageQuota>>,
    /// One writer at a time per workspace: the caps are checked and the file written under
    /// it, so that concurrent writes cannot each see room for themselves and overshoot
    /// together (issue 24, item 7).
    writing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Per workspace, the outputs this server kept there, oldest first, each as written.
    kept: Mutex<HashMap<String, std::collections::VecDeque<(String, Stamp)>>>,
}

impl Workspaces {
    pub fn new(root: PathBuf) -> Self {
        Workspaces {
            root,
            open: Mutex::default(),
            quota: std::sync::OnceLock::new(),
            writing: Mutex::default(),
            kept: Mutex::default(),
        }
    }

    pub fn root(&self) -> &std::path::Path {
        &self.root
    }

    /// Count workspace writes against `quota` (set once, before first use).
    pub fn set_quota(&self, quota: Arc<crate::storage::StorageQuota>) {
        let _ = self.quota.set(quota);
    }

    /// The workspace `key`, created on first use.
    pub fn of(&self, tenant: &str) -> Result<Arc<CodeStorage>, String> {
        if self.root.as_os_str().is_empty() {
            return Err(
                "the workspace is not available: this server has no workspace directory configured"
                    .into(),
            );
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = open.get(tenant) {
            return Ok(s.clone());
        }
        let dir = self.root.join(tenant);
        let mut s = CodeStorage::open(&dir)
            .map_err(|e| format!("the workspace is not available: {e}"))?
            .with_max_file_bytes(caps::FILE_BYTES);
        if is_sessions_own(tenant) {
            s = s.not_durable();
        }
        if let Some(q) = self.quota.get() {
            s.set_quota(q.clone());
        }
        let s = Arc::new(s);
        open.insert(tenant.to_string(), s.clone());
        Ok(s)
    }

    /// Forget a workspace and delete its directory (a session's, when its MCP session ends).
    pub fn remove(&self, key: &str) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        self.kept
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        let dir = self.root.join(key);
        if dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "session workspace not removed");
            }
            if let Some(q) = self.quota.get() {
                q.forget();
            }
        }
    }

    /// Every file of the tenant's workspace, to unpack at `/workspace`.
    pub async fn input_files(&self, tenant: &str) -> Result<Vec<InputFile>, String> {
        let stamped = self.input_files_stamped(tenant).await?;
        Ok(stamped.into_iter().map(|(f, _)| f).collect())
    }

    /// [`Workspaces::input_files`], each with its stamp taken before it was read (a write
    /// in between gives a stamp older than the contents: read again next time, never lost).
    pub async fn input_files_stamped(
        &self,
        tenant: &str,
    ) -> Result<Vec<(InputFile, Stamp)>, String> {
        let ws = self.of(tenant)?;
        let mut files = Vec::new();
        for (path, stamp) in ws.stamps().await.map_err(|e| e.to_string())? {
            let (_, contents) = ws.read_bytes(&path).await.map_err(|e| e.to_string())?;
            files.push((InputFile { path, contents }, stamp));
        }
        Ok(files)
    }

    /// The files of the tenant's workspace with their stamps, without reading them.
    pub async fn stamps(&self, tenant: &str) -> Result<Vec<(String, Stamp)>, String> {
        let ws = self.of(tenant)?;
        ws.stamps().await.map_err(|e| e.to_string())
    }
}

/// Why writing `len` bytes as `name` into a workspace that holds `existing` would pass
/// one of its caps; `None` when it fits.
fn over_caps(existing: &[(String, u64)], name: &str, len: u64) -> Option<String> {
    let others: Vec<_> = existing.iter().filter(|(n, _)| n != name).collect();
    let total: u64 = others.iter().map(|(_, s)| s).sum::<u64>() + len;
    if others.len() + 1 > caps::FILES {
        return Some(format!(
            "the workspace already holds {} files, the most it may; nothing was written",
            others.len()
        ));
    }
    (total > caps::TOTAL_BYTES).then(|| {
        format!(
            "the workspace would hold {total} bytes, over its cap of {} bytes; nothing was written",
            caps::TOTAL_BYTES
        )
    })
}

/// Write `data` as `name` into `ws`; a quota's refusal told apart.
async fn write_bytes(ws: &CodeStorage, name: &str, data: &[u8]) -> Result<u64, WriteError> {
    match ws.write_bytes(name, data).await {
        Ok((_, size)) => Ok(size),
        Err(e) => {
            let quota = matches!(e, crate::storage::StorageError::Quota { .. });
            let e = AppError::Failed(ws_error(e));
            Err(if quota {
                WriteError::Quota(e)
            } else {
                WriteError::Refused(e)
            })
        }
    }
}

/// Save `o.files` into the tenant's workspace within its caps; a sentence saying what was
/// saved and what was not, or `None` when the code wrote nothing.
pub async fn save_returned(
    workspaces: &Workspaces,
    tenant: &str,
    o: &crate::job::Outcome,
) -> Option<String> {
    if o.files.is_empty() && o.files_dropped == 0 {
        return None;
    }
    if let Err(e) = workspaces.of(tenant) {
        return Some(e);
    }
    let mut saved = Vec::new();
    let mut refused = Vec::new();
    for f in &o.files {
        let why = if f.path.contains('/') {
            Some("in a subdirectory; the workspace keeps only top-level files".to_string())
        } else {
            match workspaces.put(tenant, &f.path, &f.data, false).await {
                Ok(_) => None,
                Err(WriteError::Quota(e) | WriteError::Refused(e)) => Some(e.to_string()),
            }
        };
        match why {
            None => saved.push(f.path.clone()),
            Some(w) => refused.push(format!("{} ({w})", f.path)),
        }
    }
    let mut parts = Vec::new();
    if !saved.is_empty() {
        parts.push(format!(
            "files written to /workspace saved to your workspace (read_file): {}",
            saved.join(", ")
        ));
    }
    if !refused.is_empty() {
        parts.push(format!("not saved: {}", refused.join(", ")));
    }
    if o.files_dropped > 0 {
        parts.push(format!(
            "{} more files were not returned (over 100 files, 8 MiB each or 32 MiB in all)",
            o.files_dropped
        ));
    }
    Some(parts.join("; "))
}

/// A client's path as a workspace file name: `/workspace/x` and `./x` mean `x`.
pub fn name_of(path: &str) -> &str {
    let p = path.strip_prefix("/workspace/").unwrap_or(path);
    p.strip_prefix("./").unwrap_or(p)
}

/// Storage errors speak of code storage; here it is the workspace.
fn ws_error(e: crate::storage::StorageError) -> String {
    if let crate::storage::StorageError::NotFound { path } = &e {
        let name = std::path::Path::new(path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.clone());
        return format!(
            "file `{name}` does not exist in this session's workspace: list_files shows what is there. \
             Write it with write_file, or let your code write it to /workspace/{name}; a client that passes session_id must pass the same one it used then"
        );
    }
    e.to_string()
        .replace("file_path", "path")
        .replace("the code storage directory", "the workspace")
        .replace(
            ". Split the code into several append_to_code_file calls",
            "",
        )
}

/// The refusal of a file larger than one write_file call may carry.
pub fn too_large(size: u64) -> AppError {
    AppError::Failed(format!(
        "nothing was written: the file is {size} bytes, and write_file takes at most {} bytes ({} MiB) per call, \
         what one request can carry once base64-encoded. Write a smaller file, or let your code produce larger ones in /workspace",
        caps::WRITE_BYTES,
        caps::WRITE_BYTES >> 20
    ))
}

impl Workspaces {
    /// Hold the writer's place of workspace `key` (its caps are checked and its files
    /// written under it).
    async fn write_lock(&self, key: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut w = self.writing.lock().unwrap_or_else(|e| e.into_inner());
            w.retain(|_, l| Arc::strong_count(l) > 1);
            w.entry(key.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    /// Write `data` as `name` into workspace `key` (a write_file call), within the caps:
    /// its size.
    pub async fn write(&self, key: &str, name: &str, data: &[u8]) -> Result<u64, WriteError> {
        if data.len() as u64 > caps::WRITE_BYTES {
            return Err(WriteError::Refused(too_large(data.len() as u64)));
        }
        self.put(key, name, data, false).await
    }

    /// Keep output `data` (a figure, output too long for a result) as `name` in workspace
    /// `key` within the workspace caps (not those of one write_file call): its size. Of the
    /// outputs kept in one workspace the newest [`caps::KEPT_OUTPUTS`] stay.
    pub async fn keep(&self, key: &str, name: &str, data: &[u8]) -> Result<u64, WriteError> {
        self.put(key, name, data, true).await
    }

    /// Write `data` as `name` into workspace `key` within the workspace caps, first
    /// removing outputs kept there before (oldest first, unchanged since) as far as the
    /// caps, or the count of kept outputs when this is one (`output`), need.
    async fn put(
        &self,
        key: &str,
        name: &str,
        data: &[u8],
        output: bool,
    ) -> Result<u64, WriteError> {
        let ws = self
            .of(key)
            .map_err(|e| WriteError::Refused(AppError::Failed(e)))?;
        let _writing = self.write_lock(key).await;
        if let Err(e) = ws.resolve(name) {
            return Err(WriteError::Refused(AppError::Failed(ws_error(e))));
        }
        let mut existing = ws.list().await.unwrap_or_default();
        loop {
            let over = over_caps(&existing, name, data.len() as u64).is_some();
            let too_many = output && self.kept_other_than(key, name) >= caps::KEPT_OUTPUTS;
            if !over && !too_many {
                break;
            }
            let Some((old, stamp)) = self.oldest_kept_other_than(key, name) else {
                break;
            };
            if ws.remove_unchanged(&old, stamp).await.unwrap_or(false) {
                existing.retain(|(n, _)| *n != old);
            }
        }
        let written = match over_caps(&existing, name, data.len() as u64) {
            Some(why) => Err(WriteError::Refused(AppError::Failed(why))),
            None => write_bytes(&ws, name, data).await,
        };
        let stamp = match (output, &written) {
            (true, Ok(_)) => ws.stamp(name).await.ok().flatten(),
            _ => None,
        };
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(list) = kept.get_mut(key) {
            list.retain(|(n, _)| n != name);
        }
        if let Some(stamp) = stamp {
            kept.entry(key.to_string())
                .or_default()
                .push_back((name.to_string(), stamp));
        }
        written
    }

    /// How many outputs are kept in workspace `key`, `name` aside.
    fn kept_other_than(&self, key: &str, name: &str) -> usize {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.get(key)
            .map_or(0, |l| l.iter().filter(|(n, _)| n != name).count())
    }

    /// The oldest output kept in workspace `key` but `name`, taken off the list.
    fn oldest_kept_other_than(&self, key: &str, name: &str) -> Option<(String, Stamp)> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let list = kept.get_mut(key)?;
        let at = list.iter().position(|(n, _)| n != name)?;
        list.remove(at)
    }

    /// The bytes of `name` in workspace `key`.
    pub async fn read(&self, key: &str, name: &str) -> Result<Vec<u8>, AppError> {
        let ws = self.of(key).map_err(AppError::Failed)?;
        ws.read_bytes(name)
            .await
            .map(|(_, data)| data)
            .map_err(|e| AppError::Failed(ws_error(e)))
    }

    /// The files of workspace `key` whose names start with `prefix`, with their sizes.
    pub async fn list_prefixed(
        &self,
        key: &str,
        prefix: &str,
    ) -> Result<Vec<(String, u64)>, AppError> {
        let ws = self.of(key).map_err(AppError::Failed)?;
        ws.list()
            .await
            .map(|all| {
                all.into_iter()
                    .filter(|(n, _)| n.starts_with(prefix))
                    .collect()
            })
            .map_err(|e| AppError::Failed(ws_error(e)))
    }
}

/// Why a write was refused; a refusal by the storage quota is counted by the caller.
#[derive(Debug)]
pub enum WriteError {
    Quota(AppError),
    Refused(AppError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24, item 7: 12 writes of 5 MiB at once into one workspace keep at most its
    /// 32 MiB. Before: each checked the caps before any wrote, and 36.7 MB were kept.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_writes_stay_within_the_cap() {
        let root = std::env::temp_dir().join(format!("mcpx-ws-{}", crate::job::new_job_id()));
        let ws = Arc::new(Workspaces::new(root.clone()));
        let data = Arc::new(vec![b'x'; 5 << 20]);
        let writes: Vec<_> = (0..12)
            .map(|i| {
                let (ws, data) = (ws.clone(), data.clone());
                tokio::spawn(async move { ws.write("t", &format!("f{i}.bin"), &data).await })
            })
            .collect();
        let mut ok = 0;
        for w in writes {
            ok += usize::from(w.await.unwrap().is_ok());
        }
        let kept: u64 = ws
            .list_prefixed("t", "")
            .await
            .unwrap()
            .iter()
            .map(|(_, s)| s)
            .sum();
        let _ = std::fs::remove_dir_all(&root);
        assert!(
            kept <= caps::TOTAL_BYTES,
            "{kept} bytes kept by {ok} writes"
        );
        assert_eq!(ok, 6, "as many as fit");
    }

    /// A long session's figures never fill its workspace: of the outputs the server kept
    /// the newest stay; one the user rewrote is theirs and stays; and a user's write that
    /// would pass the file cap makes room from the kept outputs instead of being refused.
    #[tokio::test]
    async fn kept_outputs_make_room_and_never_take_the_users_files() {
        let root = std::env::temp_dir().join(format!("mcpx-ws-{}", crate::job::new_job_id()));
        let ws = Workspaces::new(root.clone());
        async fn names(ws: &Workspaces) -> Vec<String> {
            let l = ws.list_prefixed("t", "").await.unwrap();
            l.into_iter().map(|(n, _)| n).collect()
        }
        ws.write("t", "data.csv", b"1,2\n").await.unwrap();
        ws.keep("t", "figure-001.png", b"png 1").await.unwrap();
        // The user's own copy under a kept name: no longer the server's to remove.
        ws.write("t", "figure-001.png", b"mine").await.unwrap();
        for i in 2..=30 {
            let name = format!("figure-{i:03}.png");
            ws.keep("t", &name, format!("png {i}").as_bytes())
                .await
                .unwrap();
        }
        let mut want = vec!["data.csv".to_string(), "figure-001.png".to_string()];
        want.extend((11..=30).map(|i| format!("figure-{i:03}.png")));
        assert_eq!(
            names(&ws).await,
            want,
            "the newest {} kept",
            caps::KEPT_OUTPUTS
        );
        // Fill the file cap with the user's files: the next ones take kept outputs' places.
        for i in 0..(caps::FILES - want.len()) {
            ws.write("t", &format!("u{i:02}.txt"), b"u").await.unwrap();
        }
        ws.write("t", "one-more.txt", b"u").await.unwrap();
        let now = names(&ws).await;
        assert_eq!(now.len(), caps::FILES);
        assert!(
            !now.contains(&"figure-011.png".to_string()),
            "the oldest went first"
        );
        assert!(now.contains(&"figure-012.png".to_string()));
        assert!(
            now.contains(&"figure-001.png".to_string()) && now.contains(&"data.csv".to_string())
        );
        // With no kept output left to remove, the cap refuses as before.
        for i in 0..(caps::KEPT_OUTPUTS - 1) {
            ws.write("t", &format!("v{i:02}.txt"), b"v").await.unwrap();
        }
        let refused = ws.write("t", "too-many.txt", b"v").await;
        assert!(matches!(refused, Err(WriteError::Refused(_))));
        assert_eq!(ws.read("t", "figure-001.png").await.unwrap(), b"mine");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn only_a_sessions_own_workspace_is_not_durable() {
        let key = super::session_key("acme", "0123abcd");
        assert_eq!(key, "acme.sessions/0123abcd");
        assert!(super::is_sessions_own(&key));
        // A tenant's shared workspace, and names that only look alike.
        for shared in ["acme", "acme.sessions", "acme/sessions", "sessions/x"] {
            assert!(!super::is_sessions_own(shared), "{shared}");
        }
    }

    #[test]
    fn workspace_prefixes_are_stripped() {
        assert_eq!(name_of("/workspace/data.csv"), "data.csv");
        assert_eq!(name_of("./data.csv"), "data.csv");
        assert_eq!(name_of("data.csv"), "data.csv");
        assert_eq!(name_of("/etc/passwd"), "/etc/passwd");
        assert_eq!(name_of("/workspacex"), "/workspacex");
    }
}
