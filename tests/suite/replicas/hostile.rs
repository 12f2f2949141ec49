//! Replicas under hostile or broken clients and peers (issue #42, findings 4, 5 and 10):
//!
//! - with `--peers`, a request the server would refuse (no token, a wrong `Host`, past the
//!   stream caps) is refused at once, before its body is read: 64 connections with no token
//!   and 7 MiB bodies leave the replica's memory flat; a token-holder's slow body gets 408
//!   after `--body-timeout`; a call naming a replica that is gone gets the 401 of any
//!   request without a token, not an answer about the session;
//! - a peer that takes requests and never answers (SIGSTOP: the kernel still accepts its
//!   connections) ends a forwarded call with a 504 after a liveness check, calls naming an
//!   unknown replica stop waiting for it after the first, and once it runs again its
//!   sessions still work (they were not declared gone).

use super::*;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A POST /mcp with `Content-Length: declared`, of which `sent` bytes are sent; then the
/// first line of the answer, if one comes within `wait` (the body never completes).
async fn slow_post(
    port: u16,
    host: &str,
    token: Option<&str>,
    declared: usize,
    sent: usize,
    wait: Duration,
) -> (Option<String>, Duration) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{auth}Content-Length: {declared}\r\n\r\n"
    );
    let t0 = Instant::now();
    let (mut rd, mut wr) = s.split();
    let write = async {
        let _ = wr.write_all(head.as_bytes()).await;
        let chunk = vec![b' '; 64 << 10];
        let mut left = sent;
        while left > 0 {
            let n = left.min(chunk.len());
            if wr.write_all(&chunk[..n]).await.is_err() {
                break;
            }
            left -= n;
        }
        // Then nothing more: the body stays incomplete.
        std::future::pending::<()>().await;
    };
    let read = async {
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(2).any(|w| w == b"\r\n") {
                        break;
                    }
                }
            }
        }
        let text = String::from_utf8_lossy(&got).to_string();
        (!text.is_empty()).then(|| text.lines().next().unwrap_or_default().to_string())
    };
    let first = tokio::time::timeout(wait, async {
        tokio::select! {
            _ = write => None,
            line = read => line,
        }
    })
    .await
    .ok()
    .flatten();
    (first, t0.elapsed())
}

#[tokio::test]
async fn with_peers_a_request_is_refused_before_its_body_is_read() {
    let c = Cluster::start_with(
        "auth-first",
        &["--body-timeout", "3", "--max-streams-per-tenant", "2"],
        true,
    )
    .await;
    let token = c.token.clone().unwrap();
    let r = &c.replicas[0];
    let host = format!("127.0.0.1:{}", r.port);

    // 64 connections, no token, 7 MiB of an 8 MiB body each, then silence.
    let before = rss_mib(r);
    let attacks: Vec<_> = (0..64)
        .map(|_| {
            let host = host.clone();
            let port = r.port;
            tokio::spawn(async move {
                slow_post(port, &host, None, 8 << 20, 7 << 20, Duration::from_secs(10)).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = rss_mib(r);
    let mut answers = Vec::new();
    for a in attacks {
        answers.push(a.await.unwrap());
    }
    let slowest = answers.iter().map(|a| a.1).max().unwrap_or_default();
    let refused = answers
        .iter()
        .filter(|a| a.0.as_deref().is_some_and(|l| l.contains(" 401 ")))
        .count();
    eprintln!(
        "64 slow bodies without a token: RSS {before:.0} -> {during:.0} MiB after 3 s; {refused} of 64 got 401 within 10 s, the last answer after {:.2} s",
        slowest.as_secs_f64()
    );
    assert_eq!(
        refused, 64,
        "requests without a token (bodies unfinished) not refused within 10 s: {answers:?}"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "401 came after {slowest:?}"
    );
    assert!(
        during - before < 64.0,
        "the replica grew from {before:.0} to {during:.0} MiB on bodies of refused requests"
    );

    // A wrong Host: 403 at once, whatever the body.
    let (first, took) = slow_post(
        r.port,
        "evil.example",
        None,
        1 << 20,
        1000,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        first.as_deref().is_some_and(|l| l.contains(" 403 ")),
        "{first:?} after {took:?}"
    );

    // A token-holder's slow body: 408 after --body-timeout (3 s), as without peers.
    let (first, took) = slow_post(
        r.port,
        &host,
        Some(&token),
        1000,
        10,
        Duration::from_secs(15),
    )
    .await;
    eprintln!("an authenticated slow body: {first:?} after {took:?}");
    assert!(
        first.as_deref().is_some_and(|l| l.contains(" 408 ")),
        "{first:?} after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(6),
        "408 after {took:?}, --body-timeout 3"
    );

    // The stream caps come before the body: two slow bodies hold the tenant's two streams,
    // a third request is refused at once (429).
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (host, token, port) = (host.clone(), token.clone(), r.port);
            tokio::spawn(async move {
                slow_post(port, &host, Some(&token), 1000, 10, Duration::from_secs(15)).await
            })
        })
        .collect();
    // Well inside --body-timeout (3 s), after which they would give their streams back.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = Instant::now();
    let third = reqwest::Client::new()
        .post(r.url("/mcp"))
        .bearer_auth(&token)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body("{}")
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    let status = third.map(|t| t.status().as_u16());
    assert_eq!(
        status.as_ref().ok(),
        Some(&429),
        "{status:?} after {:?}",
        t0.elapsed()
    );
    for h in held {
        let (first, _) = h.await.unwrap();
        assert!(first.is_some_and(|l| l.contains(" 408 ")));
    }

    // Finding 10: no token and a handle of a replica that is gone: the 401 of any request
    // without a token, not an answer about the session.
    let (status, msg) = raw_tool(
        &r.url("/mcp"),
        "execute_python",
        json!({"code": "x", "session_id": "s_0123abcd_00112233445566778899aabbccddeeff"}),
        &[],
    )
    .await;
    assert_eq!(status, 401, "{msg}");
    // With the token it is the answer about the session.
    let bearer = format!("Bearer {token}");
    let (status, msg) = raw_tool(
        &r.url("/mcp"),
        "execute_python",
        json!({"code": "x", "session_id": "s_0123abcd_00112233445566778899aabbccddeeff"}),
        &[("Authorization", &bearer)],
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    assert!(text_of(&msg).contains("is gone"), "{msg}");
}

#[tokio::test]
async fn a_peer_that_stops_answering_is_not_waited_for() {
    let c = Cluster::start("hang", &[]).await;
    let (r0, r1) = (&c.replicas[0], &c.replicas[1]);
    // A session on r1, used through r0 (r0 learns where r1 is).
    let sid = session_on(r1, "x = 41", &[]).await;
    let (status, msg) = raw_tool(
        &r0.url("/mcp"),
        "execute_python",
        json!({"code": "x + 1", "session_id": sid}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    assert!(text_of(&msg).contains("42"), "{msg}");

    // r1 stops: its connections are still accepted (by the kernel), nothing answers.
    r1.signal(libc::SIGSTOP);
    struct Cont(u32);
    impl Drop for Cont {
        fn drop(&mut self) {
            // SAFETY: signalling our own child.
            unsafe {
                libc::kill(self.0 as i32, libc::SIGCONT);
            }
        }
    }
    let cont = Cont(r1.pid);
    // Calls naming an unknown replica: the stopped peer is waited for once, not each time.
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        let (status, msg) = raw_tool(
            &r0.url("/mcp"),
            "execute_python",
            json!({"code": "x", "session_id": "s_0123abcd_00112233445566778899aabbccddeeff"}),
            &[],
        )
        .await;
        times.push(t0.elapsed().as_secs_f64());
        assert_eq!(status, 200, "{msg}");
        assert!(text_of(&msg).contains("is gone"), "{msg}");
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    eprintln!("calls naming an unknown replica while a peer is stopped, s: {times:.3?}");
    let waited = times.iter().filter(|t| **t >= 1.0).count();
    assert!(
        waited <= 1,
        "{waited} of 5 calls naming an unknown replica waited for the stopped peer: {times:.3?} s"
    );

    // The stopped replica's session: forwarded, and given up after a liveness check.
    let t0 = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        raw_tool(
            &r0.url("/mcp"),
            "execute_python",
            json!({"code": "x + 2", "session_id": sid}),
            &[],
        ),
    )
    .await;
    let took = t0.elapsed();
    let (status, msg) = answer.unwrap_or_else(|_| {
        panic!("a call forwarded to a stopped replica had no answer after 30 s (unknown-replica calls took {times:.3?} s)")
    });
    eprintln!(
        "a call on a stopped replica's session: {status} after {:.2} s: {msg}",
        took.as_secs_f64()
    );
    assert_eq!(status, 504, "{msg}");
    let message = msg["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("stopped answering") && message.contains(&r1.id),
        "{msg}"
    );
    assert!(took < Duration::from_secs(10), "504 after {took:?}");

    // r1 runs again: its session was never declared gone.
    drop(cont);
    still_41(r0, r1, &sid, "after the stop").await;
}

/// `x + 1` in session `sid` (owned by `owner`), asked through `via`, answers 42: the
/// session and its state are there.
async fn still_41(via: &Replica, owner: &Replica, sid: &str, when: &str) {
    let (status, msg) = raw_tool(
        &via.url("/mcp"),
        "execute_python",
        json!({"code": "x + 1", "session_id": sid}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{msg}");
    assert!(
        text_of(&msg).contains("42"),
        "{when}: the session lost its state: {msg}\nthe log of {}:\n{}",
        owner.id,
        owner.log()
    );
}

/// A forwarded call whose forwarder hung up before the owner read it (a forwarder gives up
/// on an owner that stopped answering, and the owner resumes later): the owner does not run
/// it, and the session it names keeps its state.
#[tokio::test]
async fn a_forwarded_call_whose_forwarder_hung_up_is_not_run() {
    let c = Cluster::start("hungup", &[]).await;
    let r1 = &c.replicas[1];
    let sid = session_on(r1, "x = 41", &[]).await;
    for round in 0..3 {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "execute_python",
        "arguments": {"code": "import time; time.sleep(0.5); x = 0", "session_id": sid},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "replicas", "version": "0"},
            "io.modelcontextprotocol/clientCapabilities": {},
        }}})
        .to_string();
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
             Mcp-Method: tools/call\r\nMcp-Name: execute_python\r\n\
             x-mcp-executor-forwarded: test-secret-123\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // Sent to a stopped replica, and hung up on before it resumes: it finds the request
        // and its end together.
        r1.signal(libc::SIGSTOP);
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", r1.port))
            .await
            .unwrap();
        s.write_all(format!("{head}{body}").as_bytes())
            .await
            .unwrap();
        s.shutdown().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        r1.signal(libc::SIGCONT);
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
        drop(s);
        tokio::time::sleep(Duration::from_millis(800)).await;
        let when = format!(
            "round {round} ({} bytes answered to the hung-up call)",
            answer.len()
        );
        still_41(r1, r1, &sid, &when).await;
    }
}
