//! Command implementations that are more than a call into the library: `run`.

pub mod junit;
pub mod run;
