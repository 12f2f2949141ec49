//! `pods/attach` over WebSocket, as the API server and kubelet serve it: subprotocol
//! `v5.channel.k8s.io` (or `v4.channel.k8s.io`), binary frames whose first byte is the
//! channel (0 stdin, 1 stdout, 2 stderr, 3 error/status), one 1-byte frame per channel
//! when the stream opens, a `Status` on channel 3 when the attached container ends (attach
//! reports `Success`: the exit code is in the pod's status, not here), and with v5 the
//! client's `[255, 0]` closing the container's stdin alone.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::{IntoResponse, Response};
use bollard::container::LogOutput;
use bollard::query_parameters::AttachContainerOptionsBuilder;
use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;

use super::api::{error, Params};
use super::kubelet::Kubelet;
use super::store::ApiError;

pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;

pub async fn attach(
    k: Arc<Kubelet>,
    ns: String,
    name: String,
    q: Params,
    ws: Option<WebSocketUpgrade>,
) -> Response {
    let Some(pod) = k.store.get(&ns, &name) else {
        return error(ApiError::not_found(&name));
    };
    let spec = pod.spec.clone().unwrap_or_default();
    let container = q
        .container
        .clone()
        .unwrap_or_else(|| spec.containers[0].name.clone());
    let Some(c) = spec.containers.iter().find(|c| c.name == container) else {
        return error(ApiError::bad_request(format!(
            "container {container} is not valid for pod {name}"
        )));
    };
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    if phase == "Succeeded" || phase == "Failed" {
        return error(ApiError::bad_request(format!(
            "cannot attach a container in a completed pod; current phase is {phase}"
        )));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let id = match (phase.as_str(), k.store.container(&uid)) {
        ("Running", Some(id)) => id,
        _ => {
            let reason = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.first())
                .and_then(|cs| cs.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone())
                .unwrap_or_else(|| "ContainerCreating".into());
            return error(ApiError::bad_request(format!(
                "container {container} in pod {name} is waiting to start: {reason}"
            )));
        }
    };
    let want_stdin = q.stdin.as_deref() == Some("true") || q.stdin.as_deref() == Some("1");
    let want_stdout = q.stdout.as_deref() == Some("true") || q.stdout.as_deref() == Some("1");
    let want_stderr = q.stderr.as_deref() == Some("true") || q.stderr.as_deref() == Some("1");
    if !want_stdin && !want_stdout && !want_stderr {
        return error(ApiError::bad_request(
            "you must specify at least 1 of stdin, stdout, stderr",
        ));
    }
    let stdin = want_stdin && c.stdin == Some(true);
    let Some(ws) = ws else {
        return error(ApiError::bad_request(
            "Upgrade request required (the stand-in speaks WebSocket only, not SPDY)",
        ));
    };
    let ws = ws.protocols([V5, V4]);
    if ws.selected_protocol().is_none() {
        return error(ApiError::bad_request(format!(
            "the stand-in speaks the {V5} and {V4} subprotocols only"
        )));
    }
    let attached = match k
        .docker
        .attach_container(
            &id,
            Some(
                AttachContainerOptionsBuilder::default()
                    .stdin(stdin)
                    .stdout(want_stdout)
                    .stderr(want_stderr)
                    .stream(true)
                    .logs(false)
                    .build(),
            ),
        )
        .await
    {
        Ok(a) => a,
        Err(e) => {
            return error(ApiError {
                code: 500,
                reason: "InternalError",
                message: format!("error attaching to container: {e}"),
                name: None,
            })
        }
    };
    ws.on_upgrade(move |socket| pump(socket, attached, stdin, want_stdout, want_stderr))
        .into_response()
}

async fn pump(
    socket: WebSocket,
    attached: bollard::container::AttachContainerResults,
    stdin: bool,
    stdout: bool,
    stderr: bool,
) {
    let v5 = socket.protocol().and_then(|p| p.to_str().ok()) == Some(V5);
    let (mut tx, mut rx) = socket.split();
    let mut output = attached.output;
    let mut input = Some(attached.input);
    for (open, ch) in [
        (stdin, STDIN),
        (stdout, STDOUT),
        (stderr, STDERR),
        (true, STATUS),
    ] {
        if open && tx.send(Message::Binary(vec![ch].into())).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            out = output.next() => match out {
                Some(Ok(LogOutput::StdOut { message })) | Some(Ok(LogOutput::Console { message })) => {
                    let mut f = Vec::with_capacity(message.len() + 1);
                    f.push(STDOUT);
                    f.extend_from_slice(&message);
                    if tx.send(Message::Binary(f.into())).await.is_err() { return; }
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    let mut f = Vec::with_capacity(message.len() + 1);
                    f.push(STDERR);
                    f.extend_from_slice(&message);
                    if tx.send(Message::Binary(f.into())).await.is_err() { return; }
                }
                Some(Ok(LogOutput::StdIn { .. })) => {}
                Some(Err(_)) | None => break,
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(b))) if !b.is_empty() => match b[0] {
                    STDIN => {
                        if let Some(w) = input.as_mut() {
                            if w.write_all(&b[1..]).await.is_err() || w.flush().await.is_err() {
                                input = None;
                            }
                        }
                    }
                    CLOSE if v5 && b.get(1) == Some(&STDIN) => {
                        if let Some(mut w) = input.take() {
                            let _ = w.shutdown().await;
                        }
                    }
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
    let status = serde_json::json!({"metadata": {}, "status": "Success"});
    let mut f = vec![STATUS];
    f.extend_from_slice(status.to_string().as_bytes());
    let _ = tx.send(Message::Binary(f.into())).await;
    let _ = tx.send(Message::Close(None)).await;
}
