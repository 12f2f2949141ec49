//! Our client as code mode's [`Caller`]: the progress of a long upstream call goes out as
//! progress of the client's `execute_code` / `execute_python` call, and a destructive
//! upstream tool the operator has not allowed is put to the client's user through MCP
//! elicitation, when the client declared it (protocol revisions before 2026-07-28, which
//! has no server-to-client requests), or as an `input_required` result for a 2026-07-28
//! client that declared it ([`crate::mcp::asking`]).

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use rmcp::model::{ElicitRequestParams, ElicitationAction, ElicitationSchema};
use rmcp::service::ElicitationMode;
use rmcp::service::RequestContext;
use rmcp::{Peer, RoleServer};

use crate::codemode::Caller;
use crate::mcp::progress::{Progress, ProgressLine};

struct Client {
    peer: Peer<RoleServer>,
    line: Option<ProgressLine>,
    /// For a 2026-07-28 client that can answer: questions go out as `input_required`.
    asker: Option<crate::mcp::asking::Asker>,
}

/// The caller of the request in `ctx`, whose progress (if it asked) is `progress`.
pub(super) fn caller(
    ctx: &RequestContext<RoleServer>,
    progress: Option<&Progress>,
) -> Arc<dyn Caller> {
    Arc::new(Client {
        peer: ctx.peer.clone(),
        line: progress.map(Progress::line),
        asker: crate::mcp::asking::asker(ctx),
    })
}

impl Caller for Client {
    fn progress(&self, message: String) -> BoxFuture<'_, ()> {
        match &self.line {
            Some(line) => line.say(message).boxed(),
            None => futures::future::ready(()).boxed(),
        }
    }

    fn consent(&self, message: String, limit: Duration) -> BoxFuture<'_, Option<bool>> {
        if let Some(asker) = &self.asker {
            return asker.ask(message, limit);
        }
        async move {
            if !self
                .peer
                .supported_elicitation_modes()
                .contains(&ElicitationMode::Form)
            {
                return None;
            }
            let schema = ElicitationSchema::builder()
                .optional_bool("approve", true)
                .build()
                .ok()?;
            let asked = self
                .peer
                .create_elicitation_with_timeout(
                    ElicitRequestParams::FormElicitationParams {
                        meta: None,
                        message,
                        requested_schema: schema,
                    },
                    Some(limit),
                )
                .await;
            match asked {
                Ok(r) => Some(
                    r.action == ElicitationAction::Accept
                        && r.content
                            .as_ref()
                            .and_then(|c| c.get("approve"))
                            .and_then(|v| v.as_bool())
                            != Some(false),
                ),
                // No server-to-client requests on this connection (2026-07-28).
                Err(rmcp::ServiceError::McpError(_)) => None,
                Err(e) => {
                    tracing::info!(error = %e, "code mode: the client did not answer the consent request");
                    Some(false)
                }
            }
        }
        .boxed()
    }
}
