//! Our own MCP client, as code mode sees it while one `execute_code` / `execute_python`
//! call runs: where the progress of a long upstream call goes (as progress of that call),
//! and who may consent to a destructive tool (MCP elicitation, when the client declared
//! it). The MCP layer provides it ([`with_caller`] around the call); code mode does not
//! know the protocol's types.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

/// The client of the call that started a run.
pub trait Caller: Send + Sync {
    /// Tell the client (a progress notification of its call, if it asked for progress).
    fn progress(&self, message: String) -> BoxFuture<'_, ()>;
    /// Ask the client's user `message` (approve or not) within `limit`: `None` when the
    /// client cannot be asked (it declared no elicitation, or its protocol has no
    /// server-to-client requests), else whether the user approved.
    fn consent(&self, message: String, limit: Duration) -> BoxFuture<'_, Option<bool>>;
}

tokio::task_local! {
    static CALLER: Arc<dyn Caller>;
}

/// Run `fut` (one tool call of our client) with `caller` as the client of the runs and
/// cells it starts.
pub async fn with_caller<F: Future>(caller: Arc<dyn Caller>, fut: F) -> F::Output {
    CALLER.scope(caller, fut).await
}

/// The client of the call being served, if any (a task's run has none: its call ended).
pub(super) fn current() -> Option<Arc<dyn Caller>> {
    CALLER.try_with(Arc::clone).ok()
}
