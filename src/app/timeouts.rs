//! How long a run may take: as asked, up to the server's maximum, or for a run started as an
//! MCP task (which outlives its request) up to the task maximum.

use std::time::Duration;

use super::error::AppError;
use super::executor::Executor;

impl Executor {
    /// The timeout of a run and the note that says it was capped, or [`AppError::Invalid`]
    /// for a malformed one: [`Executor::timeout`] for a run answered in its request,
    /// [`Executor::task_timeout`] for one started as a task (`as_task`).
    pub fn run_timeout(
        &self,
        asked: Option<f64>,
        as_task: bool,
    ) -> Result<(Duration, Option<String>), AppError> {
        if as_task {
            self.task_timeout(asked)
        } else {
            self.timeout(asked)
        }
    }

    /// The timeout of a task run: as asked, capped at the task maximum
    /// (`max_task_timeout`); the server's default when none is asked for.
    pub fn task_timeout(&self, asked: Option<f64>) -> Result<(Duration, Option<String>), AppError> {
        let max = self.settings().max_task_timeout;
        let Some(secs) = asked else {
            return self.timeout(None);
        };
        if !secs.is_finite() || secs <= 0.0 {
            return Err(AppError::Invalid(format!(
                "invalid argument `timeout`: must be a positive number of seconds, got {secs}"
            )));
        }
        let asked = Duration::from_secs_f64(secs.min(1e9));
        if asked > max {
            let note = format!(
                "timeout {secs} s capped at the maximum of a task run, {} s",
                max.as_secs_f64()
            );
            return Ok((max, Some(note)));
        }
        Ok((asked, None))
    }
}
