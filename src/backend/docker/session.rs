//! A stateful session: one container, one interpreter, cell after cell. Only a timeout, an
//! OOM kill or a dead interpreter ends it; dropping it removes the container.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::live::{Ended, Live};
use super::Inner;
use crate::backend::protocol;
use crate::backend::{emit, BackendError, Events, Session};
use crate::job::{Limits, Outcome, RunEvent};

/// A session: one container, one interpreter, cell after cell.
pub(super) struct DockerSession {
    inner: Arc<Inner>,
    live: Live,
    limits: Limits,
    alive: bool,
}

impl DockerSession {
    /// A session over `live`, whose runner has been sent the session's opening input.
    pub(super) fn new(inner: Arc<Inner>, live: Live, limits: Limits) -> Self {
        DockerSession {
            inner,
            live,
            limits,
            alive: true,
        }
    }
}

#[async_trait]
impl Session for DockerSession {
    async fn exec(
        &mut self,
        code: &str,
        timeout: Duration,
        events: Events,
    ) -> Result<Outcome, BackendError> {
        if !self.alive {
            return Err(BackendError::Rejected(
                "this session has ended; open a new one".into(),
            ));
        }
        let started = Instant::now();
        let limits = Limits {
            timeout,
            ..self.limits.clone()
        };
        emit(
            &events,
            RunEvent::Created {
                container: self.live.guard.id().to_string(),
            },
        );
        let cell = protocol::encode_cell(code, limits.output_bytes);
        let ended = match self.live.execute(&cell, false, &limits, &events).await {
            Ok(e) => e,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        let report_ok = matches!(&ended, Ended::Report(r, _) if !r.ended && r.signal.is_none() && r.exit_code.is_some_and(|c| c <= 1));
        let mut outcome = match self.inner.outcome_of(ended, &self.live.guard).await {
            Ok(o) => o,
            Err(e) => {
                self.alive = false;
                return Err(e);
            }
        };
        // A timeout, an OOM kill or a dead interpreter (`exit()` included, whatever its
        // status) ends the session: its state is gone.
        if !report_ok || outcome.timed_out || outcome.oom_killed {
            self.alive = false;
        }
        outcome.duration_ms = started.elapsed().as_millis() as u64;
        Ok(outcome)
    }

    async fn put_files(
        &mut self,
        files: &[crate::job::InputFile],
        timeout: Duration,
    ) -> Result<(), BackendError> {
        if files.is_empty() {
            return Ok(());
        }
        let o = self.exec(&put_files_code(files), timeout, None).await?;
        if o.success() {
            Ok(())
        } else {
            Err(BackendError::Runner(format!(
                "workspace files could not be copied into the session: {}",
                o.stderr_text()
            )))
        }
    }

    fn alive(&self) -> bool {
        self.alive
    }
}

/// A cell that writes `files` into /workspace without touching the session's variables.
fn put_files_code(files: &[crate::job::InputFile]) -> String {
    use base64::Engine as _;
    let mut items = String::new();
    for f in files {
        let name = serde_json::to_string(&f.path).unwrap_or_default();
        let data = base64::engine::general_purpose::STANDARD.encode(&f.contents);
        items.push_str(&format!("({name}, '{data}'),"));
    }
    format!(
        "__import__('builtins').exec(\"import base64\\nfor n, d in FILES:\\n    open('/workspace/' + n, 'wb').write(base64.b64decode(d))\", {{'FILES': [{items}]}})"
    )
}
