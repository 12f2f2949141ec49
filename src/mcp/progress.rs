//! Progress notifications for one tool call, sent only when the client asked for them with
//! a progress token. One forwarder for every kind of call: a [`Narration`] turns the call's
//! events into messages (a run: queued, container created, started, running with output
//! bytes so far, finished; an install: its phases), and output is throttled the same way.

use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;

use crate::backend::Events;
use crate::job::RunEvent;

/// At most one output notification per this interval: output floods must not flood the
/// client with notifications too.
const OUTPUT_EVERY: Duration = Duration::from_millis(500);

/// How a call's events read as progress messages.
pub trait Narration<E>: Send + 'static {
    /// Sent before any event.
    fn first(&self) -> Option<String> {
        None
    }
    /// The message for one event, if it deserves one.
    fn describe(&mut self, event: E) -> Option<String>;
    /// Sent once the events end (the call's sender was dropped).
    fn last(&self) -> String;
}

/// Counts output bytes and says when an output notification is due.
#[derive(Default)]
pub struct OutputThrottle {
    pub bytes: usize,
    last: Option<Instant>,
}

impl OutputThrottle {
    /// Count `n` bytes; `true` when a notification is due.
    pub fn add(&mut self, n: usize) -> bool {
        self.bytes += n;
        let due = self.last.is_none_or(|t| t.elapsed() >= OUTPUT_EVERY);
        if due {
            self.last = Some(Instant::now());
        }
        due
    }
}

/// Forwards a call's events as progress notifications until the call ends.
pub struct Progress {
    task: JoinHandle<()>,
    line: ProgressLine,
}

/// Sends the progress notifications of one token. Clones share the count, so the values
/// keep increasing whoever sends (the run's narration, code mode's upstream progress).
#[derive(Clone)]
pub struct ProgressLine {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    step: std::sync::Arc<tokio::sync::Mutex<f64>>,
}

impl ProgressLine {
    pub async fn say(&self, message: String) {
        // Held while sending: notifications leave in the order of their values.
        let mut step = self.step.lock().await;
        *step += 1.0;
        let param = ProgressNotificationParam::new(self.token.clone(), *step).with_message(message);
        if let Err(e) = self.peer.notify_progress(param).await {
            tracing::debug!(error = %e, "progress notification not delivered");
        }
    }
}

impl Progress {
    /// A run's progress, if the client sent a progress token. Returns the events sender to
    /// hand to the sandbox (`None` when nobody listens).
    pub fn start(ctx: &RequestContext<RoleServer>) -> (Option<Progress>, Events) {
        Self::start_with(ctx, RunNarration::default())
    }

    /// Progress told by `narration`, if the client sent a progress token.
    pub fn start_with<E: Send + 'static>(
        ctx: &RequestContext<RoleServer>,
        narration: impl Narration<E>,
    ) -> (Option<Progress>, Option<UnboundedSender<E>>) {
        let Some(token) = ctx.meta.get_progress_token() else {
            return (None, None);
        };
        let (tx, rx) = unbounded_channel();
        let line = ProgressLine {
            peer: ctx.peer.clone(),
            token,
            step: Default::default(),
        };
        let task = tokio::spawn(forward(line.clone(), rx, narration));
        (Some(Progress { task, line }), Some(tx))
    }

    /// Where more notifications of this call go (with values after the ones sent so far).
    pub fn line(&self) -> ProgressLine {
        self.line.clone()
    }

    /// Wait (briefly) until the last notification went out, so that it precedes the result.
    pub async fn finish(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.task).await;
    }
}

async fn forward<E>(
    line: ProgressLine,
    mut rx: UnboundedReceiver<E>,
    mut narration: impl Narration<E>,
) {
    let send = |message: String| {
        let line = line.clone();
        async move { line.say(message).await }
    };
    let mut said = false;
    if let Some(m) = narration.first() {
        said = true;
        send(m).await;
    }
    // The sender is dropped when the call ends (or is cancelled): the loop ends then.
    while let Some(event) = rx.recv().await {
        if let Some(m) = narration.describe(event) {
            said = true;
            send(m).await;
        }
    }
    // A call refused before it began (a quota, a bad argument) said nothing: it says no
    // "finished" either.
    if said {
        send(narration.last()).await;
    }
}

/// A run's phases.
#[derive(Default)]
struct RunNarration {
    output: OutputThrottle,
}

impl Narration<RunEvent> for RunNarration {
    fn describe(&mut self, event: RunEvent) -> Option<String> {
        match event {
            RunEvent::Admitted => Some("queued: waiting for a sandbox".into()),
            RunEvent::Created { .. } => Some("sandbox created".into()),
            RunEvent::Started => Some("started: the code is running".into()),
            RunEvent::Output { data, .. } => self
                .output
                .add(data.len())
                .then(|| format!("running: {} bytes of output so far", self.output.bytes)),
        }
    }

    fn last(&self) -> String {
        format!("finished: {} bytes of output", self.output.bytes)
    }
}
