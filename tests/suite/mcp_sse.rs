//! The legacy HTTP+SSE transport (protocol 2024-11-05) as older clients speak it: `GET /sse`,
//! the `endpoint` event, `POST /messages?sessionId=…`, answers as `message` events. The client
//! here is written by hand on purpose: it is the wire format that must not drift.

use crate::mcp_support;

use std::time::Duration;

use futures::StreamExt;
use mcp_support::server;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// A minimal legacy SSE client.
struct LegacyClient {
    http: reqwest::Client,
    post_url: String,
    events: mpsc::UnboundedReceiver<(String, String)>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for LegacyClient {
    /// Closing the event stream is how a legacy client disconnects.
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl LegacyClient {
    async fn open(base: &str) -> LegacyClient {
        let http = reqwest::Client::new();
        let resp = http.get(format!("{base}/sse")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        let (tx, mut events) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut buf = String::new();
            let (mut event, mut data) = (String::new(), String::new());
            while let Some(Ok(chunk)) = body.next().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(i) = buf.find('\n') {
                    let line = buf[..i].trim_end_matches('\r').to_string();
                    buf.drain(..=i);
                    if line.is_empty() {
                        if !data.is_empty() || !event.is_empty() {
                            let _ =
                                tx.send((std::mem::take(&mut event), std::mem::take(&mut data)));
                        }
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        if !data.is_empty() {
                            data.push('\n');
                        }
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
            }
        });
        let (event, data) = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("endpoint event in time")
            .expect("stream open");
        assert_eq!(event, "endpoint");
        assert!(data.starts_with("/messages?sessionId="), "{data}");
        LegacyClient {
            http,
            post_url: format!("{base}{data}"),
            events,
            reader,
        }
    }

    async fn post(&self, body: String) -> reqwest::Response {
        self.http
            .post(&self.post_url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn notify(&self, method: &str) {
        let r = self
            .post(json!({"jsonrpc": "2.0", "method": method}).to_string())
            .await;
        assert_eq!(r.status(), 202);
    }

    async fn initialize(&mut self) {
        let init = self
            .request(
                1,
                "initialize",
                json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "legacy", "version": "1"}}),
            )
            .await;
        assert_eq!(init["result"]["protocolVersion"], "2024-11-05", "{init}");
        self.notify("notifications/initialized").await;
    }

    /// Send a request and wait for the `message` event that answers it.
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        let r = self
            .post(
                json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
            )
            .await;
        assert_eq!(r.status(), 202, "{:?}", r.text().await);
        loop {
            let (event, data) = tokio::time::timeout(Duration::from_secs(60), self.events.recv())
                .await
                .expect("answer in time")
                .expect("stream open");
            assert_eq!(event, "message");
            let v: Value = serde_json::from_str(&data).unwrap();
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
}

#[tokio::test]
async fn legacy_sse_session_initializes_and_executes() {
    let s = server("t-mcp-sse").await;
    let base = s.url("");
    let mut c = LegacyClient::open(&base).await;
    let init = c
        .request(
            1,
            "initialize",
            json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "legacy", "version": "1"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2024-11-05", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "mcp-code-executor");
    c.notify("notifications/initialized").await;

    let tools = c.request(2, "tools/list", json!({})).await;
    assert_eq!(
        tools["result"]["tools"].as_array().unwrap().len(),
        15,
        "{tools}"
    );

    let r = c
        .request(
            3,
            "tools/call",
            json!({"name": "execute_code", "arguments": {"code": "import numpy as np; print(np.random.rand(3,3))"}}),
        )
        .await;
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(
        r["result"]["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .lines()
            .count(),
        3,
        "{r}"
    );

    let r = c
        .request(
            4,
            "tools/call",
            json!({"name": "read_code_file", "arguments": {"file_path": "/etc/passwd"}}),
        )
        .await;
    assert_eq!(r["result"]["isError"], true, "{r}");

    let r = c
        .request(5, "tools/call", json!({"name": "nope", "arguments": {}}))
        .await;
    assert_eq!(r["error"]["code"], -32602, "{r}");

    // malformed bodies are answered with JSON-RPC errors, unknown sessions with 404
    let bad = c.post("{not json".into()).await;
    assert_eq!(bad.status(), 400);
    let v: Value = bad.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    let bad = c.post(json!({"hello": "world"}).to_string()).await;
    assert_eq!(bad.status(), 400);
    let v: Value = bad.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32600, "{v}");
    let r = c
        .http
        .post(format!("{base}/messages?sessionId=nope"))
        .body(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    drop(c);
    s.finish().await;
}

#[tokio::test]
async fn closing_the_event_stream_stops_the_run() {
    let s = server("t-mcp-sse-gone").await;
    let mut c = LegacyClient::open(&s.url("")).await;
    c.initialize().await;
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "execute_code",
        "arguments": {"code": "import time\ntime.sleep(120)\n"},
        "_meta": {"progressToken": "p1"}}});
    assert_eq!(c.post(call.to_string()).await.status(), 202);
    // wait for the `started` progress notification, then go away
    loop {
        let (_, data) = tokio::time::timeout(Duration::from_secs(30), c.events.recv())
            .await
            .expect("progress in time")
            .expect("stream open");
        let v: Value = serde_json::from_str(&data).unwrap();
        if v["method"] == "notifications/progress"
            && v["params"]["message"]
                .as_str()
                .unwrap_or("")
                .starts_with("started")
        {
            break;
        }
    }
    assert!(!mcp_support::common::containers_of(&s.tenant).is_empty());
    drop(c);
    s.sandbox_drained_within(Duration::from_secs(20)).await;
    s.finish().await;
}
