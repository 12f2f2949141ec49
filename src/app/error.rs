//! Why a call into the core gave no result. Front ends translate: the MCP tools make
//! [`AppError::Invalid`] a protocol error (`invalid_params`) and every other variant a tool
//! error whose text the model reads; `run` maps them to exit codes.

use crate::backend::BackendError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The request itself is malformed (a bad argument): nothing was attempted.
    #[error("{0}")]
    Invalid(String),
    #[error("the request was cancelled; the run was stopped")]
    Cancelled,
    #[error("the server is shutting down; the run was stopped")]
    ShuttingDown,
    /// A quota said no before any container existed; the text says which and when to retry.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Any other failure, in words for the caller (storage, environments, sessions).
    #[error("{0}")]
    Failed(String),
}

impl AppError {
    /// The metrics label of a run that ended with this error; `None` when it never started.
    pub fn run_label(&self) -> Option<&'static str> {
        match self {
            AppError::Cancelled | AppError::ShuttingDown => Some("cancelled"),
            AppError::Backend(_) => Some("failed"),
            AppError::Invalid(_) | AppError::Refused(_) | AppError::Failed(_) => None,
        }
    }
}
