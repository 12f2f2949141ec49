//! The sandbox engine: what every backend does the same way over its own driver. The
//! conversation with a runner ([`live`]).

pub mod live;
