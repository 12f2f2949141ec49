//! A dead replica's sessions always get the same answer (issue #42, a newcomer's finding:
//! after a `kill -9`, most sessions answered that they were gone, one started a new, empty
//! session). Right after the kill, while the survivor still holds pooled connections to the
//! dead replica, every call on its sessions, through the balancer, straight at the survivor,
//! and through a protocol session (2025-11-25) that the survivor holds, says the session is
//! gone, names the dead replica, and runs nothing. (Before, the last answered "not found: it
//! may have expired", which reads like a session that timed out; and so it did while the
//! replica lived, where it now says which replica holds the session.)

use super::*;

/// A protocol session (2025-11-25) opened on `r` over raw HTTP: its `Mcp-Session-Id`.
async fn protocol_session(r: &Replica) -> String {
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "replicas", "version": "0"}}});
    let resp = http
        .post(r.url("/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let sid = resp.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let _ = resp.text().await;
    let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let resp = http
        .post(r.url("/mcp"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", &sid)
        .header("MCP-Protocol-Version", "2025-11-25")
        .body(done.to_string())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    sid
}

/// `execute_python` naming `session` through the protocol session `protocol` at `url`.
async fn call_in_protocol_session(url: &str, protocol: &str, session: &str) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"code": "x + 1", "session_id": session}}});
    let resp = reqwest::Client::new()
        .post(url)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Session-Id", protocol)
        .header("MCP-Protocol-Version", "2025-11-25")
        .body(body.to_string())
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, rpc_message(&text))
}

#[tokio::test]
async fn every_call_on_a_dead_replicas_sessions_says_it_is_gone() {
    let mut c = Cluster::start("gone", &["--max-sessions", "48"]).await;
    let (dead, alive) = (&c.replicas[0], &c.replicas[1]);
    let mut sessions = Vec::new();
    for _ in 0..6 {
        sessions.push(session_on(dead, "x = 41", &[]).await);
    }
    // The survivor forwards to the dead one-to-be (its pool keeps those connections) and
    // holds a protocol session of the 2025 revisions.
    for sid in &sessions {
        let (status, msg) = raw_tool(
            &alive.url("/mcp"),
            "execute_python",
            json!({"code": "x + 1", "session_id": sid}),
            &[],
        )
        .await;
        assert_eq!(status, 200, "{msg}");
        assert!(text_of(&msg).contains("42"), "{msg}");
    }
    let protocol = protocol_session(alive).await;
    let dead_id = dead.id.clone();
    // While its replica lives, such a session named through the survivor's protocol session
    // is said to be there, not "not found".
    let (status, msg) = call_in_protocol_session(&alive.url("/mcp"), &protocol, &sessions[0]).await;
    let text = text_of(&msg);
    assert_eq!(status, 200, "{msg}");
    assert_eq!(msg["result"]["isError"], true, "{msg}");
    assert!(
        text.contains("is held by the server replica") && text.contains(&dead_id),
        "{msg}"
    );
    let (alive_url, lb_url) = (alive.url("/mcp"), c.lb("/mcp"));

    c.replicas[0].signal(libc::SIGKILL);
    let _ = c.replicas[0].child.wait().await;
    // At once, all together: each session straight at the survivor and through the
    // balancer; then through the survivor's protocol session.
    let mut calls = Vec::new();
    for sid in &sessions {
        for url in [&alive_url, &lb_url] {
            let (url, sid) = (url.clone(), sid.clone());
            calls.push(tokio::spawn(async move {
                let a = raw_tool(
                    &url,
                    "execute_python",
                    json!({"code": "x + 1", "session_id": sid}),
                    &[],
                )
                .await;
                (format!("{url} {sid}"), a)
            }));
        }
    }
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    // One after the other in the protocol session (rmcp answers its concurrent requests on
    // streams a client is to resume).
    for sid in &sessions {
        let a = call_in_protocol_session(&alive_url, &protocol, sid).await;
        answers.push((format!("protocol session {sid}"), a));
    }
    let mut wrong = Vec::new();
    for (what, (status, msg)) in &answers {
        let text = text_of(msg);
        let same = *status == 200
            && msg["result"]["isError"] == true
            && text.contains("is gone")
            && text.contains(&dead_id)
            && !text.contains("new session was started");
        if !same {
            wrong.push(format!("{what}: {status} {msg}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} calls on the dead replica's sessions got another answer:\n{}",
        wrong.len(),
        answers.len(),
        wrong.join("\n")
    );
}
