//! The transports that carry the MCP tools: stdio, Streamable HTTP at `/mcp` and legacy
//! SSE at `/sse` + `/messages`.

pub mod auth;
pub mod bounds;
pub mod http;
pub mod paths;
pub mod sessions;
pub mod sse;
pub mod stdio;
