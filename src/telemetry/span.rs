//! Spans as guard objects. A request's root span ([`Span::root`]) is made where the
//! request is read; work inside it runs in its scope ([`Span::scope`], a task-local), and a
//! hook anywhere below is one line, `let _s = telemetry::span("sandbox.take");`, which is
//! a child of the span in scope and ends when dropped. With traces off, or outside any
//! request's scope, a span is inert: no clock read, no allocation beyond the guard.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use super::context::TraceContext;
use super::export::Exporter;
use super::record::{Finished, Kind, Value};

/// The span in scope: where new spans go and whose children they are.
#[derive(Clone)]
struct Current {
    exporter: Arc<Exporter>,
    ctx: TraceContext,
}

tokio::task_local! {
    static CURRENT: Current;
}

/// A span being timed; sent to the exporter when dropped (or [`Span::end`]).
#[must_use = "a span ends when dropped: bind it to a variable"]
pub struct Span(Option<Box<Open>>);

struct Open {
    exporter: Arc<Exporter>,
    ctx: TraceContext,
    parent: Option<[u8; 8]>,
    name: String,
    kind: Kind,
    start: SystemTime,
    attributes: Vec<(&'static str, Value)>,
    error: Option<&'static str>,
}

/// A child of the span in scope, of kind internal.
pub fn span(name: &'static str) -> Span {
    Span::child(name.to_string(), Kind::Internal)
}

/// A child of the span in scope, of kind client (a request this server sends).
pub fn client_span(name: String) -> Span {
    Span::child(name, Kind::Client)
}

/// The `traceparent` of the span in scope, for a request this server sends on.
pub fn current_traceparent() -> Option<String> {
    CURRENT.try_with(|c| c.ctx.traceparent()).ok()
}

impl Span {
    /// A span that records nothing.
    pub fn off() -> Span {
        Span(None)
    }

    /// The root of a request's spans in this server: a child of `parent` (the caller's
    /// `traceparent`) when given, else a new trace. `None` exporter: traces are off. A
    /// caller whose trace is not sampled gets no spans here either.
    pub fn root(
        exporter: Option<&Arc<Exporter>>,
        name: String,
        kind: Kind,
        parent: Option<TraceContext>,
    ) -> Span {
        let Some(exporter) = exporter else {
            return Span::off();
        };
        if parent.is_some_and(|p| !p.sampled) {
            return Span::off();
        }
        let ctx = parent.map_or_else(TraceContext::new_root, |p| p.child());
        Span::open(exporter.clone(), ctx, parent.map(|p| p.span_id), name, kind)
    }

    fn child(name: String, kind: Kind) -> Span {
        CURRENT
            .try_with(|c| {
                Span::open(
                    c.exporter.clone(),
                    c.ctx.child(),
                    Some(c.ctx.span_id),
                    name,
                    kind,
                )
            })
            .unwrap_or_else(|_| Span::off())
    }

    fn open(
        exporter: Arc<Exporter>,
        ctx: TraceContext,
        parent: Option<[u8; 8]>,
        name: String,
        kind: Kind,
    ) -> Span {
        Span(Some(Box::new(Open {
            exporter,
            ctx,
            parent,
            name,
            kind,
            start: SystemTime::now(),
            attributes: Vec::new(),
            error: None,
        })))
    }

    /// Is this span recorded (traces on, inside a request)?
    pub fn recording(&self) -> bool {
        self.0.is_some()
    }

    /// Set attribute `key` (a name from OpenTelemetry's conventions, or ours under
    /// `mcp_executor.`). Never code, output, arguments or secrets.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        if let Some(o) = &mut self.0 {
            o.attributes.push((key, value.into()));
        }
    }

    /// [`Span::set`], by value, for a span made and described on one line.
    pub fn with(mut self, key: &'static str, value: impl Into<Value>) -> Span {
        self.set(key, value);
        self
    }

    /// Mark the span failed, with `what` (a fixed word, also set as `error.type`).
    pub fn fail(&mut self, what: &'static str) {
        if let Some(o) = &mut self.0 {
            o.error = Some(what);
            o.attributes.push(("error.type", Value::from(what)));
        }
    }

    /// When this span started (`None`: not recorded).
    pub fn started(&self) -> Option<SystemTime> {
        self.0.as_ref().map(|o| o.start)
    }

    /// A finished child of this span, timed elsewhere (the runner's phases, measured
    /// inside the sandbox).
    pub fn child_done(&self, name: &'static str, start: SystemTime, end: SystemTime) {
        if let Some(o) = &self.0 {
            o.exporter.send(Finished {
                ctx: o.ctx.child(),
                parent: Some(o.ctx.span_id),
                name: name.to_string(),
                kind: Kind::Internal,
                start,
                end,
                attributes: Vec::new(),
                error: None,
            });
        }
    }

    /// The `traceparent` of this span, for a request sent on its behalf.
    pub fn traceparent(&self) -> Option<String> {
        self.0.as_ref().map(|o| o.ctx.traceparent())
    }

    /// Run `f` with this span in scope: the spans it makes are this one's children.
    pub async fn scope<F: Future>(&self, f: F) -> F::Output {
        match &self.0 {
            Some(o) => {
                let current = Current {
                    exporter: o.exporter.clone(),
                    ctx: o.ctx,
                };
                CURRENT.scope(current, f).await
            }
            None => f.await,
        }
    }

    /// End the span now.
    pub fn end(self) {}
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            let o = *o;
            o.exporter.send(Finished {
                ctx: o.ctx,
                parent: o.parent,
                name: o.name,
                kind: o.kind,
                start: o.start,
                end: SystemTime::now(),
                attributes: o.attributes,
                error: o.error,
            });
        }
    }
}

/// Run `f` in the scope of the span in scope now, for work handed to another task.
pub fn carry<F: Future>(f: F) -> impl Future<Output = F::Output> {
    let current = CURRENT.try_with(Current::clone).ok();
    async move {
        match current {
            Some(c) => CURRENT.scope(c, f).await,
            None => f.await,
        }
    }
}
