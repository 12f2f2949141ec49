//! A started container as the engine's [`Live`]: the
//! attach's multiplexed output as chunks of the runner's stdout and stderr.

use std::pin::Pin;

use bollard::container::LogOutput;
use bollard::errors::Error as BollardError;
use futures::{Stream, StreamExt};

use super::classify;
use crate::backend::engine::guard::Guard;
use crate::backend::engine::live::{Chunk, Input, ReadError};
use crate::backend::engine::Live;

type Attached = Pin<Box<dyn Stream<Item = Result<LogOutput, BollardError>> + Send>>;

/// The conversation over a container's attach, made before its start: its runner's `R`
/// is still to come.
pub(super) fn live(guard: Guard, input: Input, output: Attached) -> Live {
    let output = output.filter_map(|item| async move {
        match item {
            Ok(LogOutput::StdOut { message }) => Some(Ok(Chunk::Out(message))),
            Ok(LogOutput::StdErr { message }) => Some(Ok(Chunk::Err(message))),
            Ok(_) => None,
            Err(e) => Some(Err(Box::new(move |action| classify(action, e)) as ReadError)),
        }
    });
    Live::new(guard, input, Box::pin(output), false)
}
