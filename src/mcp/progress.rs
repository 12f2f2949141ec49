//! Progress notifications for one tool call: the run's phases (queued, container created,
//! started, running with output bytes so far, finished), sent only when the client asked
//! for them with a progress token.

use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::task::JoinHandle;

use crate::job::RunEvent;
use crate::sandbox::Events;

/// At most one "running" notification per this interval: output floods must not flood the
/// client with notifications too.
const OUTPUT_EVERY: Duration = Duration::from_millis(500);

/// Forwards a run's events as progress notifications until the run ends.
pub struct Progress {
    task: JoinHandle<()>,
}

impl Progress {
    /// Start forwarding if the client sent a progress token. Returns the events sender to
    /// hand to the sandbox (`None` when nobody listens).
    pub fn start(ctx: &RequestContext<RoleServer>) -> (Option<Progress>, Events) {
        let Some(token) = ctx.meta.get_progress_token() else {
            return (None, None);
        };
        let (tx, rx) = unbounded_channel();
        let task = tokio::spawn(forward(ctx.peer.clone(), token, rx));
        (Some(Progress { task }), Some(tx))
    }

    /// Wait (briefly) until the last notification went out, so that it precedes the result.
    pub async fn finish(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

async fn forward(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    mut rx: UnboundedReceiver<RunEvent>,
) {
    let mut step = 0.0;
    let mut send = |message: String| {
        step += 1.0;
        let param = ProgressNotificationParam::new(token.clone(), step).with_message(message);
        let peer = peer.clone();
        async move {
            if let Err(e) = peer.notify_progress(param).await {
                tracing::debug!(error = %e, "progress notification not delivered");
            }
        }
    };
    send("queued: waiting for a sandbox".into()).await;
    let mut bytes = 0usize;
    let mut last_output: Option<Instant> = None;
    // The sandbox drops its sender when the run ends (or is cancelled): the loop ends then.
    while let Some(event) = rx.recv().await {
        match event {
            RunEvent::Created { .. } => send("sandbox created".into()).await,
            RunEvent::Started => send("started: the code is running".into()).await,
            RunEvent::Output { data, .. } => {
                bytes += data.len();
                if last_output.is_none_or(|t| t.elapsed() >= OUTPUT_EVERY) {
                    last_output = Some(Instant::now());
                    send(format!("running: {bytes} bytes of output so far")).await;
                }
            }
        }
    }
    send(format!("finished: {bytes} bytes of output")).await;
}
