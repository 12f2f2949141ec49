//! Asking the user the 2026-07-28 way (SEP-2322, multi round-trip requests): a server of
//! that revision sends no request to its client, so a run whose code-mode call needs the
//! user's consent answers the client's `tools/call` with an `input_required` result (the
//! question as an elicitation, and a `requestState`), and the client calls again with the
//! answer and that state. The run itself never stops meanwhile: it waits in its sandbox,
//! its tool call pending, and the retry picks it up where it waits.
//!
//! - [`wanted`]: only for a client of 2026-07-28 or later whose request declares the
//!   elicitation capability (others keep elicitation, or `ToolDenied`).
//! - [`start`]: the call runs in its own task; this request waits for the first of its
//!   answer or a question. A question parks the run under a fresh `requestState`.
//! - [`resume`]: a retry with a `requestState`: the parked run of this tenant and this
//!   principal, for this tool, takes the answer; the state is then spent (a replay, a
//!   tampered or expired state, another user's, are all the same clear refusal, and
//!   change nothing).
//! - A question nobody answers within the call's own limit ends the run (its sandbox is
//!   removed) and is forgotten.
//! - A task's run ([`for_task`]) asks through the tasks extension instead: the task's status
//!   is `input_required` with the question in `tasks/get`, and `tasks/update` answers it.
//!
//! The state is an unguessable handle naming this replica ([`crate::ids`]); what
//! it stands for stays here, in memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitationSchema, InputRequest,
    InputRequests, InputRequiredResult, InputResponses,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// The key of the one question in an `input_required` result (and of its answer).
pub(crate) const KEY: &str = "consent";

/// How long, at most, a parked run that has ended stays for a retry to collect its result:
/// no longer than its question was open (the call's limit), and never over a minute.
const KEEP_ENDED: Duration = Duration::from_secs(60);

/// What a run tells the request waiting on it.
enum Event {
    /// A question for the user, and where the answer goes.
    Ask {
        question: String,
        answer: oneshot::Sender<bool>,
        /// How long the question stays open, from the moment it is put to the client.
        limit: Duration,
        /// Told when the question is put to the client (its clock starts then: a question
        /// pending behind another is not yet seen).
        seen: oneshot::Sender<()>,
    },
    /// The call's result.
    Done(Result<CallToolResponse, ErrorData>),
}

/// The run's side, in its request context: code mode's consent comes here
/// ([`super::tools`]' caller uses it when the request carries one).
#[derive(Clone)]
pub(crate) struct Asker {
    to: To,
    run: CancellationToken,
    /// Why the run was stopped, when a question stopped it.
    stopped: Stopped,
}

/// Where a question goes.
#[derive(Clone)]
enum To {
    /// The request waiting on the run (which answers `input_required`).
    Call(mpsc::Sender<Event>),
    /// The run's task: its status turns `input_required` until `tasks/update` answers;
    /// each question under a key of its own.
    Task(rmcp::task_manager::TaskContext, Arc<AtomicUsize>),
}

type Stopped = Arc<Mutex<Option<String>>>;

impl Asker {
    /// Put `question` to the user and wait up to `limit` for the answer: `None` when the
    /// call is no longer waited on. Past `limit` the run is stopped (the user went away).
    pub(crate) fn ask(&self, question: String, limit: Duration) -> BoxFuture<'_, Option<bool>> {
        Box::pin(async move {
            let answered = match &self.to {
                To::Call(events) => {
                    let (tx, rx) = oneshot::channel();
                    let (seen_tx, seen) = oneshot::channel();
                    let ask = Event::Ask {
                        question,
                        answer: tx,
                        limit,
                        seen: seen_tx,
                    };
                    events.send(ask).await.ok()?;
                    // Unseen, it waits behind another question (bounded by that one's clock)
                    // or for the request to come back; never put, it is never answered.
                    seen.await.ok()?;
                    tokio::time::timeout(limit, rx).await.map(|r| r.ok())
                }
                To::Task(task, n) => {
                    let key = format!("{KEY}-{}", n.fetch_add(1, Ordering::Relaxed) + 1);
                    let ask = task.request_input(key, InputRequest::Elicitation(elicit(question)));
                    tokio::time::timeout(limit, ask)
                        .await
                        .map(|r| r.ok().map(|v| approved(&v)))
                }
            };
            match answered {
                Ok(Some(yes)) => Some(yes),
                Ok(None) | Err(_) => {
                    tracing::info!(
                        seconds = limit.as_secs(),
                        "code mode: the user's answer did not come in time; the run is stopped"
                    );
                    *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                        "the run was stopped: its question to the user was not answered within {}s (the call's limit, call_timeout_s)",
                        limit.as_secs()
                    ));
                    self.run.cancel();
                    Some(false)
                }
            }
        })
    }
}

/// A run waiting for an answer, under its `requestState`.
struct Parked {
    /// Whose it is: the tenant and the principal ([`crate::app::Connection::owner`]).
    tenant: String,
    owner: Option<String>,
    tool: String,
    answer: oneshot::Sender<bool>,
    waiting: Waiting,
}

/// What a request waits on: the run's events, its token, and why it was stopped.
struct Waiting {
    events: mpsc::Receiver<Event>,
    run: CancellationToken,
    stopped: Stopped,
}

static PARKED: LazyLock<Mutex<HashMap<String, Parked>>> = LazyLock::new(Default::default);

fn parked() -> std::sync::MutexGuard<'static, HashMap<String, Parked>> {
    PARKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Does this request's client take `input_required` for a question? A 2026-07-28 (or
/// later) request that declares elicitation in its own `_meta`.
pub(crate) fn wanted(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28)
        && ctx
            .meta
            .client_capabilities()
            .is_some_and(|c| c.elicitation.is_some())
}

/// Whose call this is, for binding a parked run to its caller.
pub(crate) struct Caller {
    pub tenant: String,
    pub owner: Option<String>,
    pub tool: String,
}

/// Run `call` (the tool call of `ctx`, given the [`Asker`] to put in its context) in its
/// own task, and answer with its result or with its first question.
pub(crate) async fn start<F>(
    who: Caller,
    mut ctx: RequestContext<RoleServer>,
    shutdown: &CancellationToken,
    call: F,
) -> Result<CallToolResponse, ErrorData>
where
    F: FnOnce(
            RequestContext<RoleServer>,
        ) -> BoxFuture<'static, Result<CallToolResponse, ErrorData>>
        + Send
        + 'static,
{
    let (tx, events) = mpsc::channel(1);
    // The run outlives this request (it may wait for the retry): its own token, ended by
    // the request's cancellation while one waits on it, by a question left unanswered, or
    // by shutdown.
    let run = shutdown.child_token();
    let request_ct = std::mem::replace(&mut ctx.ct, run.clone());
    let stopped = Stopped::default();
    ctx.extensions.insert(Asker {
        to: To::Call(tx.clone()),
        run: run.clone(),
        stopped: stopped.clone(),
    });
    let fut = call(ctx);
    let ended = run.clone();
    tokio::spawn(async move {
        let done = fut.await;
        // Ended first: a question still pending in the channel is then dropped by the
        // waiting side, and a parked one is forgotten in time, even while this send waits.
        ended.cancel();
        let _ = tx.send(Event::Done(done)).await;
    });
    wait(
        who,
        Waiting {
            events,
            run,
            stopped,
        },
        request_ct,
    )
    .await
}

/// A retry carrying `state`: the parked run takes the answer in `responses`, and this
/// request waits for its result or its next question.
pub(crate) async fn resume(
    who: Caller,
    state: &str,
    responses: Option<&InputResponses>,
    request_ct: CancellationToken,
) -> Result<CallToolResponse, ErrorData> {
    let refused = || {
        ErrorData::invalid_params(
            format!(
                "this requestState is unknown, expired, already answered or not yours: call `{}` again without it",
                who.tool
            ),
            None,
        )
    };
    let waiting = {
        let mut map = parked();
        let mine = map
            .get(state)
            .is_some_and(|p| p.tenant == who.tenant && p.owner == who.owner && p.tool == who.tool);
        if !mine {
            return Err(refused());
        }
        let Some(answer) = responses.and_then(|r| r.get(KEY)) else {
            return Err(ErrorData::invalid_params(
                format!("inputResponses has no `{KEY}`: answer the question of the requestState"),
                None,
            ));
        };
        let p = map.remove(state).ok_or_else(refused)?;
        let _ = p.answer.send(approved(answer));
        p.waiting
    };
    wait(who, waiting, request_ct).await
}

/// Was the elicitation answered with approval? Accept, unless the form said no.
fn approved(answer: &serde_json::Value) -> bool {
    answer.get("action").and_then(|a| a.as_str()) == Some("accept")
        && answer
            .get("content")
            .and_then(|c| c.get("approve"))
            .and_then(|v| v.as_bool())
            != Some(false)
}

/// Wait for the run's next event: its result (the answer), or a question (parked, and
/// answered as `input_required`). The request going away stops the run.
async fn wait(
    who: Caller,
    mut w: Waiting,
    request_ct: CancellationToken,
) -> Result<CallToolResponse, ErrorData> {
    let ev = loop {
        let ev = tokio::select! {
            ev = w.events.recv() => ev,
            _ = request_ct.cancelled() => {
                w.run.cancel();
                w.events.recv().await
            }
        };
        match ev {
            // A question of a run that has ended (its result follows): nobody to ask.
            Some(Event::Ask { .. }) if w.run.is_cancelled() => continue,
            ev => break ev,
        }
    };
    match ev {
        Some(Event::Done(r)) => {
            let why = w.stopped.lock().unwrap_or_else(|e| e.into_inner()).take();
            match why {
                Some(why) => Ok(super::report::tool_error(why).into()),
                None => r,
            }
        }
        Some(Event::Ask {
            question,
            answer,
            limit,
            seen,
        }) => {
            let state = crate::ids::mint('q', &uuid::Uuid::new_v4().simple().to_string());
            let forget = state.clone();
            let run = w.run.clone();
            parked().insert(
                state.clone(),
                Parked {
                    tenant: who.tenant,
                    owner: who.owner,
                    tool: who.tool,
                    answer,
                    waiting: w,
                },
            );
            // Once the run has ended (an unanswered question stops it; so does its own
            // timeout), a retry may still collect its result for a while, then the state
            // has expired.
            tokio::spawn(async move {
                run.cancelled().await;
                tokio::time::sleep(limit.min(KEEP_ENDED)).await;
                parked().remove(&forget);
            });
            let _ = seen.send(());
            Ok(CallToolResponse::InputRequired(question_for(
                question, state,
            )))
        }
        None => Err(ErrorData::internal_error(
            "the run ended without a result",
            None,
        )),
    }
}

fn question_for(question: String, state: String) -> InputRequiredResult {
    let mut requests = InputRequests::new();
    requests.insert(KEY.to_string(), InputRequest::Elicitation(elicit(question)));
    InputRequiredResult::new(Some(requests), Some(state))
}

/// The question as a form elicitation: one optional boolean `approve`, true by default.
fn elicit(question: String) -> ElicitRequest {
    let schema = ElicitationSchema::builder()
        .optional_bool("approve", true)
        .build()
        .unwrap_or_else(|_| ElicitationSchema::builder().build().expect("empty schema"));
    ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: question,
        requested_schema: schema,
    })
}

/// The asker of a task's run (`ctx` its context, `task` its task) when the request that
/// made the task takes `input_required` ([`wanted`]): a question turns the task's status to
/// `input_required`, and `tasks/update` answers it.
pub(crate) fn for_task(
    ctx: &mut RequestContext<RoleServer>,
    task: rmcp::task_manager::TaskContext,
) {
    ctx.extensions.insert(Asker {
        to: To::Task(task, Arc::default()),
        run: ctx.ct.clone(),
        stopped: Stopped::default(),
    });
}

/// The run's asker, when its request is one that takes `input_required`.
pub(crate) fn asker(ctx: &RequestContext<RoleServer>) -> Option<Asker> {
    ctx.extensions.get::<Asker>().cloned()
}
