//! The application core: the executor service every front end calls (the MCP tools, `run`,
//! `bench`), so that quotas, scheduling and metrics are the same whoever asks.
//!
//! - [`service`]: the [`Service`]: the backend, the run slots shared fairly by all tenants,
//!   the counters, shutdown, readiness; one [`Executor`] per tenant.
//! - [`executor`]: a tenant's [`Executor`]: admission (runs per minute), the environment's
//!   read lock, a run slot, then the backend; cancellation and shutdown race every run;
//!   code storage.
//! - [`connection`]: a client's [`Connection`] to its executor (explicit constructor
//!   [`Connection::new`]): picks the session a call works on (its own, removed when it is
//!   dropped, or one named by a handle); one-shot runs of stored code with a session's
//!   workspace files; [`execute`]: a one-shot run of code in one call (timeout, session,
//!   stored code, run, files kept for the result); the timeouts of runs and tasks
//!   (`timeouts`).
//! - [`sessions`]: the registry of sessions by handle (own, standalone and files sessions;
//!   caps, reaper, idle expiry); [`cell`]: one cell in a session (its turn, environment, run slot, files
//!   in and out).
//! - [`workspaces`]: workspace directories, their caps, files returned by runs.
//! - [`packages`]: package checks, installs and environment switches of a tenant; [`pip`]:
//!   what pip said an install did.
//! - [`settings`]: what a tenant's executor may do (limits, quotas, session options).
//! - [`metrics`]: the counters behind `/metrics`.
//! - [`error`]: [`AppError`], which front ends translate.

pub mod cell;
pub mod connection;
pub mod error;
pub mod execute;
pub mod executor;
pub mod health_metrics;
pub mod metrics;
pub mod packages;
pub mod pip;
pub mod service;
pub mod sessions;
pub mod settings;
mod timeouts;
pub mod usage;
pub mod workspaces;

pub use connection::{Connection, RunDone, Wanted};
pub use error::AppError;
pub use execute::{Code, CodeRun, Keep, Kept, NotRun, Ran};
pub use executor::{Executor, TenantParts};
pub use service::{Capacity, Phase, Readiness, Service, Startup};
pub use sessions::SessionRef;
pub use settings::{Quota, SessionOptions, Settings};

#[cfg(test)]
mod files_sessions_tests;
#[cfg(test)]
mod tests;
