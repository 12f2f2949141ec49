//! Code mode's hook in the frame loop: the runner's tool requests (`T` frames) go to the
//! job's tools; and what a run's tools and egress spent, for usage. Its own file, above both the wire format (`protocol.rs`) and the loop
//! (`live.rs`): the format knows neither the loop nor code mode.

use super::live::{FrameHook, Hook, Reply};
use crate::backend::protocol::{tool_unavailable, Frame};
use crate::backend::BackendError;

/// Code mode's [`FrameHook`] for one run or one session cell, around its
/// [`crate::job::ToolRun`] (`run`: started by the caller for this run or cell, its own
/// budget, whose [`crate::job::ToolRun::calls`] the caller reads when it has ended): `T`
/// requests go to the job's tools; in a session without tools (its stdin stays open, so
/// its runner relays) they are answered that no tools are there. A one-shot run without
/// tools gets no hook: its stdin is closed after the job and the runner answers by itself.
/// The loop owns the replies: those still pending when the conversation ends are dropped,
/// which cancels their upstream calls.
pub(crate) fn tool_hook_of(
    run: Option<std::sync::Arc<dyn crate::job::ToolRun>>,
    session: bool,
) -> Hook {
    struct ToolHook(Option<std::sync::Arc<dyn crate::job::ToolRun>>);
    impl FrameHook for ToolHook {
        fn frame(&self, frame: Frame) -> Result<Reply, BackendError> {
            let Frame::Tool(request) = frame else {
                return Err(BackendError::Runner(format!(
                    "the runner sent a frame this conversation does not take: {frame:?}"
                )));
            };
            Ok(match &self.0 {
                Some(run) => {
                    let run = run.clone();
                    Box::pin(async move { Some(run.answer(request).await) })
                }
                None => {
                    let answer = tool_unavailable(&request);
                    Box::pin(async move { Some(answer) })
                }
            })
        }
    }
    match run {
        Some(run) => Some(std::sync::Arc::new(ToolHook(Some(run)))),
        None if session => Some(std::sync::Arc::new(ToolHook(None))),
        None => None,
    }
}

/// What a run or a session cell used outside its sandbox (usage, #45), read once it has
/// ended: its tool requests and its egress bytes each way.
pub(crate) fn spent(
    tool_run: Option<std::sync::Arc<dyn crate::job::ToolRun>>,
    egress_run: Option<std::sync::Arc<dyn crate::job::EgressRun>>,
) -> crate::job::External {
    let (up, down) = egress_run.map_or((0, 0), |r| r.spent());
    crate::job::External {
        tool_calls: tool_run.map_or(0, |r| r.calls()),
        egress_up_bytes: up,
        egress_down_bytes: down,
    }
}
