//! The application core: what every front end (the MCP tools, `run`, `bench`) calls.

pub mod metrics;
