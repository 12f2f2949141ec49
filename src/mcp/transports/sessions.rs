//! Streamable HTTP protocol sessions, capped: rmcp's [`LocalSessionManager`] keeps every
//! session until it has been idle `session_idle`, however many there are. [`Sessions`] wraps
//! it per tenant, with one [`SessionBook`] shared by all tenants: past the cap (per tenant,
//! or in all) the session idle longest (at least [`REAP_AFTER_IDLE`], none with a request
//! in flight or a stream open) is closed to make room; when none is, `initialize` is refused
//! with a clear error. A closed or expired session is gone from both maps, and the
//! allocator is asked to give freed memory back to the system.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt as _};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};

/// A session idle at least this long (or half the idle timeout, if shorter) may be closed
/// to make room for a new one.
pub const REAP_AFTER_IDLE: Duration = Duration::from_secs(30);

struct Entry {
    tenant: String,
    last_used: Instant,
    busy: usize,
    owner: Weak<LocalSessionManager>,
    /// The principal whose `initialize` made it (see [`SessionBook::bind`]): `None` until
    /// bound, then the [`crate::tenancy::oauth::Principal::owner`] of that principal.
    principal: Option<Option<String>>,
}

/// The open sessions of every tenant.
pub struct SessionBook {
    max: usize,
    reap_after: Duration,
    max_per_tenant: usize,
    entries: Mutex<HashMap<SessionId, Entry>>,
    /// One creation at a time, so that two cannot both take the last place.
    create: tokio::sync::Mutex<()>,
    refused: AtomicU64,
    reaped: AtomicU64,
}

impl SessionBook {
    /// `idle`: the sessions' idle timeout.
    pub fn new(max: usize, max_per_tenant: usize, idle: Duration) -> Arc<SessionBook> {
        Arc::new(SessionBook {
            max,
            reap_after: REAP_AFTER_IDLE.min(idle / 2),
            max_per_tenant,
            entries: Mutex::default(),
            create: tokio::sync::Mutex::new(()),
            refused: AtomicU64::new(0),
            reaped: AtomicU64::new(0),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Open sessions: in all, and of `tenant`.
    pub fn count(&self, tenant: &str) -> (usize, usize) {
        let e = self.entries();
        (e.len(), e.values().filter(|x| x.tenant == tenant).count())
    }

    /// Make room for a session of `tenant`: the sessions to close first, or an error text.
    fn room(&self, tenant: &str) -> Result<Vec<(SessionId, Weak<LocalSessionManager>)>, String> {
        let entries = self.entries();
        let mine = entries.values().filter(|x| x.tenant == tenant).count();
        let reapable = |scope: Option<&str>| {
            entries
                .iter()
                .filter(|(_, x)| scope.is_none_or(|t| x.tenant == t))
                .filter(|(_, x)| x.busy == 0 && x.last_used.elapsed() >= self.reap_after)
                .min_by_key(|(_, x)| x.last_used)
                .map(|(id, x)| (id.clone(), x.owner.clone()))
        };
        let mut victims = Vec::new();
        if mine >= self.max_per_tenant {
            match reapable(Some(tenant)) {
                Some(v) => victims.push(v),
                None => {
                    return Err(format!(
                        "too many open MCP sessions for this tenant ({mine} of {}, none idle for {} s): \
                         close unused ones (HTTP DELETE /mcp) or retry later; the cap is --max-protocol-sessions-per-tenant \
                         (MCP_EXECUTOR_MAX_PROTOCOL_SESSIONS_PER_TENANT)",
                        self.max_per_tenant,
                        self.reap_after.as_secs()
                    ))
                }
            }
        } else if entries.len() >= self.max {
            // The tenant holding the most sessions gives one up first.
            let mut by_tenant: HashMap<&str, usize> = HashMap::new();
            for x in entries.values() {
                *by_tenant.entry(x.tenant.as_str()).or_default() += 1;
            }
            let mut tenants: Vec<_> = by_tenant.into_iter().collect();
            tenants.sort_by_key(|t| std::cmp::Reverse(t.1));
            let v = tenants
                .iter()
                .find_map(|(t, _)| reapable(Some(t)))
                .or_else(|| reapable(None));
            match v {
                Some(v) => victims.push(v),
                None => {
                    return Err(format!(
                        "too many open MCP sessions on this server ({} of {}, none idle for {} s): retry later; \
                         the cap is --max-protocol-sessions (MCP_EXECUTOR_MAX_PROTOCOL_SESSIONS)",
                        entries.len(),
                        self.max,
                        self.reap_after.as_secs()
                    ))
                }
            }
        }
        Ok(victims)
    }

    /// Bind session `id` to the principal that made it (`owner`: its
    /// [`crate::tenancy::oauth::Principal::owner`]); a session is bound once.
    pub fn bind(&self, id: &str, owner: Option<String>) {
        if let Some(e) = self.entries().get_mut(id) {
            e.principal.get_or_insert(owner);
        }
    }

    /// May the principal with `owner` use session `id`? No when the session is bound to
    /// another principal; yes when it is its own, or unknown (rmcp then answers 404).
    pub fn may_use(&self, id: &str, owner: Option<&str>) -> bool {
        match self.entries().get(id).and_then(|e| e.principal.as_ref()) {
            Some(bound) => bound.as_deref() == owner,
            None => true,
        }
    }

    fn touch(&self, id: &SessionId) {
        if let Some(e) = self.entries().get_mut(id) {
            e.last_used = Instant::now();
        }
    }

    fn busy(self: &Arc<Self>, id: &SessionId) -> Busy {
        if let Some(e) = self.entries().get_mut(id) {
            e.busy += 1;
            e.last_used = Instant::now();
        }
        Busy {
            book: self.clone(),
            id: id.clone(),
        }
    }

    fn remove(&self, id: &SessionId) {
        let removed = self.entries().remove(id).is_some();
        if removed {
            self.trim_soon();
        }
    }

    fn trim_soon(&self) {
        trim_soon();
    }

    /// Prometheus lines.
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let mut by_tenant: HashMap<String, usize> = HashMap::new();
        for x in self.entries().values() {
            *by_tenant.entry(x.tenant.clone()).or_default() += 1;
        }
        let _ = writeln!(
            out,
            "# HELP mcp_protocol_sessions Open Streamable HTTP protocol sessions, by tenant."
        );
        let _ = writeln!(out, "# TYPE mcp_protocol_sessions gauge");
        let mut v: Vec<_> = by_tenant.into_iter().collect();
        v.sort();
        for (t, n) in v {
            let _ = writeln!(out, "mcp_protocol_sessions{{tenant=\"{t}\"}} {n}");
        }
        let _ = writeln!(out, "# HELP mcp_protocol_sessions_refused_total initialize refused: the session caps were reached.");
        let _ = writeln!(out, "# TYPE mcp_protocol_sessions_refused_total counter");
        let _ = writeln!(
            out,
            "mcp_protocol_sessions_refused_total {}",
            self.refused.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP mcp_protocol_sessions_reaped_total Idle sessions closed to make room for new ones.");
        let _ = writeln!(out, "# TYPE mcp_protocol_sessions_reaped_total counter");
        let _ = writeln!(
            out,
            "mcp_protocol_sessions_reaped_total {}",
            self.reaped.load(Ordering::Relaxed)
        );
        out
    }
}

/// Give freed memory back to the system soon, at most every few seconds (glibc keeps freed
/// memory in its arenas otherwise: closed sessions left RSS where it was).
pub fn trim_soon() {
    static SCHEDULED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SCHEDULED.swap(true, Ordering::AcqRel) {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async {
                // After the closed sessions' tasks have ended and dropped their memory.
                tokio::time::sleep(Duration::from_secs(2)).await;
                SCHEDULED.store(false, Ordering::Release);
                trim_memory();
            });
        }
        Err(_) => SCHEDULED.store(false, Ordering::Release),
    }
}

/// Hand memory freed by the allocator back to the system.
pub fn trim_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A request in flight or a stream open in a session: it is not idle.
struct Busy {
    book: Arc<SessionBook>,
    id: SessionId,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(e) = self.book.entries().get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            e.last_used = Instant::now();
        }
    }
}

/// Why a session could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error("{0}")]
    Full(String),
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// One tenant's session manager.
pub struct Sessions {
    tenant: String,
    inner: Arc<LocalSessionManager>,
    book: Arc<SessionBook>,
}

impl Sessions {
    pub fn new(tenant: &str, book: Arc<SessionBook>, idle: Duration) -> Sessions {
        let mut inner = LocalSessionManager::default();
        let mut config = SessionConfig::default();
        config.keep_alive = Some(idle);
        inner.session_config = config;
        Sessions {
            tenant: tenant.to_string(),
            inner: Arc::new(inner),
            book,
        }
    }

    /// Is there room for one more session of this tenant (closing an idle one if need be)?
    /// The error text says why not.
    pub async fn make_room(&self) -> Result<(), String> {
        let _one_at_a_time = self.book.create.lock().await;
        self.make_room_locked().await
    }

    async fn make_room_locked(&self) -> Result<(), String> {
        let victims = self.book.room(&self.tenant).inspect_err(|_| {
            self.book.refused.fetch_add(1, Ordering::Relaxed);
        })?;
        for (id, owner) in victims {
            self.book.remove(&id);
            self.book.reaped.fetch_add(1, Ordering::Relaxed);
            tracing::info!(session = %id, tenant = %self.tenant, "closed the protocol session idle longest to make room for a new one");
            if let Some(m) = owner.upgrade() {
                let _ = m.close_session(&id).await;
            }
        }
        Ok(())
    }

    fn busy_stream<S: Stream<Item = ServerSseMessage> + Send + Sync + 'static>(
        &self,
        id: &SessionId,
        s: S,
    ) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static {
        let busy = self.book.busy(id);
        s.map(move |m| {
            let _held = &busy;
            m
        })
    }
}

impl SessionManager for Sessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let _one_at_a_time = self.book.create.lock().await;
        self.make_room_locked().await.map_err(SessionsError::Full)?;
        let (id, transport) = self.inner.create_session().await?;
        self.book.entries().insert(
            id.clone(),
            Entry {
                tenant: self.tenant.clone(),
                last_used: Instant::now(),
                busy: 0,
                owner: Arc::downgrade(&self.inner),
                principal: None,
            },
        );
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let _busy = self.book.busy(id);
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.book.touch(id);
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.book.remove(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let s = self.inner.create_stream(id, message).await?;
        Ok(self.busy_stream(id, s))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.book.touch(id);
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let s = self.inner.create_standalone_stream(id).await?;
        Ok(self.busy_stream(id, s))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let s = self.inner.resume(id, last_event_id).await?;
        Ok(self.busy_stream(id, s))
    }
}
