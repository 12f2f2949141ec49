//! Traces across two replicas (docs/hosting.md "Traces"): a call on a session of replica A
//! sent to replica B is forwarded, and the trace goes with it: B's `POST` client span is the
//! child of the SDK's span, and A's `tools/call` server span is the child of B's `POST`
//! (the `traceparent` header on the forwarded request). Both replicas export to one
//! receiver (`crate::traces`, on the OpenTelemetry project's protobuf definitions).

use std::time::Duration;

use super::Cluster;
use crate::traces::{check_root, named, receiver, sdk_client, within_the_run};

#[tokio::test]
async fn a_forwarded_call_continues_the_trace_on_its_owner() {
    let rx = receiver().await;
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    let c = Cluster::start("traces", &["--otlp-endpoint", &endpoint]).await;
    let (a, b) = (&c.replicas[0], &c.replicas[1]);
    let marker = format!("secret-marker-{}", uuid::Uuid::new_v4().simple());
    let client = sdk_client(
        &["forward", &a.url("/mcp"), &b.url("/mcp"), &marker],
        &marker,
    )
    .await;
    let trace_id = client["trace_id"].as_str().unwrap();
    // The default batch delay is 5 s.
    let spans = rx
        .wait_for(
            trace_id,
            &[
                "POST",
                "tools/call execute_python",
                "executor.admit",
                "executor.queue",
                "sandbox.run",
                "sandbox.code",
                "sandbox.report",
            ],
            &marker,
            Duration::from_secs(30),
        )
        .await;
    let post = named(&spans, "POST");
    assert_eq!(post["kind"], 3, "a client span: {post}");
    assert_eq!(post["parent_span_id"], client["parent_span_id"], "{post}");
    assert_eq!(
        post["attributes"]["mcp_executor.replica"],
        a.id.as_str(),
        "{post}"
    );
    assert_eq!(post["attributes"]["http.request.method"], "POST", "{post}");
    assert_eq!(
        post["attributes"]["http.response.status_code"], 200,
        "{post}"
    );
    assert_eq!(
        post["attributes"]["server.port"],
        i64::from(a.port),
        "{post}"
    );
    let root = named(&spans, "tools/call execute_python");
    // The owner's span is the forward's child, in the client's trace.
    let mut expected_parent = client.clone();
    expected_parent["parent_span_id"] = post["span_id"].clone();
    check_root(root, &expected_parent, "execute_python");
    let queue = named(&spans, "executor.queue");
    assert_eq!(queue["parent_span_id"], root["span_id"], "{queue}");
    // The cell, in the session's sandbox (opened by the first call, in its own trace).
    let cell = named(&spans, "sandbox.run");
    assert_eq!(cell["parent_span_id"], root["span_id"], "{cell}");
    assert_eq!(cell["attributes"]["mcp_executor.session"], true, "{cell}");
    let admit = named(&spans, "executor.admit");
    assert_eq!(admit["parent_span_id"], root["span_id"], "{admit}");
    // The runner's own timings of the cell (a cell has no job going in).
    within_the_run(&spans, &["sandbox.code", "sandbox.report"]);
}
