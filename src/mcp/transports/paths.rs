//! The paths of the legacy SSE transport that more than one layer reads: the transport that
//! serves them, authentication, and the router that forwards a `/messages` call to the replica
//! owning its session. A leaf, so that none of them reaches into another's file for a name.

/// Path a client POSTs its messages to (announced in the `endpoint` event).
pub const MESSAGES_PATH: &str = "/messages";
