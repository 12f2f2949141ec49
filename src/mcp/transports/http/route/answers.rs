//! What the router answers itself: a call on a handle of a replica that is gone (what was
//! lost, what survives, what to do), a replica that stopped answering, a draining replica
//! with nobody to take its new calls. JSON-RPC errors (or, for a tool call, a tool result
//! with `isError`) that a client shows its user, never a bare status.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::handle::Handle;

pub(super) fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// 502: the owner (`owner`, still alive) took the request and its answer broke off.
pub(super) fn bad_gateway(owner: &str, id: &Value, detail: &str) -> Response {
    let message = format!(
        "the server replica that owns this call (`{owner}`) broke off its answer ({detail}); \
         the call may or may not have run. Check its result (read_file, the task) before calling again."
    );
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(rpc_error(id, -32000, &message)),
    )
        .into_response()
}

/// 504: the owner took the request and, asked whether it is alive while the answer was
/// awaited, did not say so in time (a hung or stopped process). What it holds may come back.
pub(super) fn silent(owner: &str, id: &Value, waited: std::time::Duration) -> Response {
    let message = format!(
        "the server replica that owns this call (`{owner}`) took it and stopped answering \
         (no answer after {:.0} s, and none to a liveness check within {} s): the call may or may not have run. \
         Its sessions are not known to be lost: retry in a while; if it stays so, start a new session.",
        waited.as_secs_f64(),
        crate::cluster::peers::ASK_TIMEOUT.as_secs()
    );
    (
        StatusCode::GATEWAY_TIMEOUT,
        [(header::RETRY_AFTER, "10")],
        axum::Json(rpc_error(id, -32000, &message)),
    )
        .into_response()
}

/// 503: this replica is shutting down and no peer takes the call.
pub(super) fn draining_refusal(id: &Value) -> Response {
    let message =
        "this server replica is shutting down and takes no new calls: retry in a few seconds";
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, "2")],
        axum::Json(rpc_error(id, -32000, message)),
    )
        .into_response()
}

/// What a call on a handle of replica `owner`, which is gone, gets: what was lost, what
/// survives, what to do.
pub fn gone(owner: &str, handle: &Handle, id: &Value, method: &str) -> Response {
    const KEPT: &str =
        "Kept: code stored with initialize_code_file, append_to_code_file or execute_code \
        (its file_path still works with execute_code_file and read_code_file).";
    match handle {
        Handle::Session(h) if method == "tools/call" => {
            let text = format!(
                "session `{h}` is gone: the server replica that held it (`{owner}`) stopped or restarted. \
                 Lost: the session's variables and imports, and the files of its workspace. {KEPT} \
                 Call again without session_id to start a new session."
            );
            // `resultType`: what 2026-07-28 asks of every result (other revisions ignore it).
            axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": {
                "resultType": "complete",
                "content": [{"type": "text", "text": text}], "isError": true}}))
            .into_response()
        }
        Handle::Task(t) => {
            let message = format!(
                "task `{t}` is gone: the server replica that ran it (`{owner}`) stopped or restarted, \
                 and its run and result went with it. Start the call again."
            );
            axum::Json(rpc_error(id, -32602, &message)).into_response()
        }
        Handle::Question(_) => {
            let message = format!(
                "the run that asked this question is gone: the server replica that ran it (`{owner}`) stopped or restarted. \
                 Call the tool again without requestState."
            );
            axum::Json(rpc_error(id, -32602, &message)).into_response()
        }
        Handle::Resource(u) => {
            let message = format!(
                "resource `{u}` is gone: the server replica that held its session (`{owner}`) stopped or restarted, \
                 and the session's workspace files went with it. {KEPT}"
            );
            axum::Json(rpc_error(id, -32002, &message)).into_response()
        }
        Handle::Session(_) | Handle::Protocol(_) | Handle::File(_) => {
            let message = format!(
                "session not found: the server replica that held this MCP session (`{owner}`) stopped or restarted. \
                 Lost: its execute_python variables and workspace files. {KEPT} Start a new session (initialize)."
            );
            (
                StatusCode::NOT_FOUND,
                axum::Json(rpc_error(id, -32001, &message)),
            )
                .into_response()
        }
    }
}

/// What a call through a protocol session of this replica gets when it names a session,
/// task or resource of `owner`, another replica that lives: a protocol session reaches only
/// its own replica's state, and forwarding the call would lose the protocol session.
pub fn elsewhere(owner: &str, handle: &Handle, id: &Value, method: &str) -> Response {
    let here = crate::ids::replica();
    let (what, name) = match handle {
        Handle::Session(h) => ("session", h),
        Handle::Task(t) => ("task", t),
        Handle::Resource(u) => ("resource", u),
        Handle::Question(q) => ("requestState", q),
        Handle::Protocol(h) | Handle::File(h) => ("handle", h),
    };
    let text = format!(
        "{what} `{name}` is held by the server replica `{owner}`, and this MCP session \
         (Mcp-Session-Id) by the replica `{here}`: a call in an MCP session reaches only its own \
         replica's state. Use the {what} from the MCP session that made it, or from a client \
         without MCP sessions (MCP 2026-07-28), or start a new session here (call without session_id)."
    );
    match handle {
        Handle::Session(_) if method == "tools/call" => {
            axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": {
                "content": [{"type": "text", "text": text}], "isError": true}}))
            .into_response()
        }
        _ => axum::Json(rpc_error(id, -32602, &text)).into_response(),
    }
}
