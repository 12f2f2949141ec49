//! Output and files as MCP resources, with a real rmcp client: a run's result carries
//! `resource_link` blocks (the whole of a stdout too long for the result, in pages that each
//! fit one message; every figure; the files the code wrote to /workspace) whose URIs
//! `resources/read` serves (text as text, binary as `blob`); `resources/list` lists the
//! session's workspace; a URI of another session, or of another tenant's session, is
//! "resource not found" (-32002), like a file that does not exist.

use crate::mcp_support;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use mcp_support::*;
use rmcp::model::{ReadResourceRequestParams, ResourceContents};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

fn links(r: &rmcp::model::CallToolResult) -> Vec<rmcp::model::Resource> {
    r.content
        .iter()
        .filter_map(|c| c.as_resource_link().cloned())
        .collect()
}

async fn read(
    c: &rmcp::Peer<RoleClient>,
    uri: &str,
) -> Result<ResourceContents, rmcp::ServiceError> {
    let r = c.read_resource(ReadResourceRequestParams::new(uri)).await?;
    Ok(r.contents.into_iter().next().expect("one content"))
}

fn not_found(e: rmcp::ServiceError) -> bool {
    matches!(e, rmcp::ServiceError::McpError(ref d) if d.code.0 == -32002)
}

#[tokio::test]
async fn runs_return_resource_links_that_resources_read_serves() {
    let s = server("t-res-links").await;
    let c = s.client().await;

    // The server declares resources.
    let info = c.peer_info().expect("server info");
    assert!(info.capabilities.resources.is_some(), "{info:?}");

    // A 3 MB print: the sandbox keeps 1 MiB (the output limit); the result carries its head
    // and tail, and links to the whole of it in pages that each fit one message.
    let r = call(
        &c,
        "execute_code",
        json!({"code": "print('head'); print('x' * 3_000_000)"}),
    )
    .await;
    let sid = structured(&r)["session_id"].as_str().unwrap().to_string();
    let stdout_links: Vec<_> = links(&r)
        .into_iter()
        .filter(|l| l.name == "last-run-stdout.txt")
        .collect();
    assert!(stdout_links.len() >= 2, "{:?}", links(&r));
    let t = text(&r);
    assert!(
        t.contains(&stdout_links[0].uri),
        "the text names the URIs: {t}"
    );
    let mut whole = String::new();
    for l in &stdout_links {
        assert!(
            l.uri.starts_with(&format!("workspace://sessions/{sid}/")),
            "{}",
            l.uri
        );
        match read(&c, &l.uri).await.unwrap() {
            ResourceContents::TextResourceContents { text, .. } => {
                assert!(text.len() < 1 << 20, "one page fits one message");
                whole.push_str(&text)
            }
            other => panic!("text expected: {other:?}"),
        }
    }
    assert!(whole.starts_with("head\nxxxx"), "{}", &whole[..20]);
    assert_eq!(
        whole.len(),
        1 << 20,
        "all of the kept stdout, up to the output limit"
    );

    // A figure and a file the code wrote: linked, and read back (the PNG as a blob).
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nopen('/workspace/out.csv', 'w').write('a,b\\n1,2\\n')";
    let r = call(&c, "execute_code", json!({ "code": code })).await;
    assert!(!is_error(&r), "{}", text(&r));
    let ls = links(&r);
    let fig = ls
        .iter()
        .find(|l| l.name == "figure-001.png")
        .expect("figure link");
    assert_eq!(fig.mime_type.as_deref(), Some("image/png"));
    match read(&c, &fig.uri).await.unwrap() {
        ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        } => {
            let png = base64::engine::general_purpose::STANDARD
                .decode(blob)
                .unwrap();
            assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
            assert_eq!(mime_type.as_deref(), Some("image/png"));
        }
        other => panic!("blob expected: {other:?}"),
    }
    let csv = ls.iter().find(|l| l.name == "out.csv").expect("file link");
    match read(&c, &csv.uri).await.unwrap() {
        ResourceContents::TextResourceContents { text, .. } => assert_eq!(text, "a,b\n1,2\n"),
        other => panic!("text expected: {other:?}"),
    }

    // resources/list: the session's workspace.
    let listed = c.list_all_resources().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|r| r.name.as_str()).collect();
    for n in ["out.csv", "figure-001.png", "last-run-stdout.txt"] {
        assert!(names.contains(&n), "{names:?}");
    }

    // Another session's URI, a made-up one, a missing file: all "resource not found".
    let other = s.client().await;
    let r2 = call(
        &other,
        "write_file",
        json!({"path": "mine.txt", "content": "b's"}),
    )
    .await;
    let other_sid = structured(&r2)["session_id"].as_str().unwrap().to_string();
    let wrong_session = csv.uri.replace(&sid, &other_sid);
    assert!(not_found(read(&c, &wrong_session).await.unwrap_err()));
    let made_up = format!("workspace://sessions/s_{}/out.csv", "0".repeat(32));
    assert!(not_found(read(&c, &made_up).await.unwrap_err()));
    let missing = format!("workspace://sessions/{sid}/nope.txt");
    assert!(not_found(read(&c, &missing).await.unwrap_err()));
    assert!(not_found(read(&c, "file:///etc/passwd").await.unwrap_err()));
    let traversal = format!("workspace://sessions/{sid}/..%2F..%2Fetc%2Fpasswd");
    assert!(not_found(read(&c, &traversal).await.unwrap_err()));

    other.cancel().await.unwrap();
    c.cancel().await.unwrap();
    s.finish().await;
}

/// Two tenants on one `serve --tenants`: Bob cannot read Alice's resources.
#[tokio::test]
async fn another_tenants_resource_is_not_found() {
    use mcp_code_executor::tenancy::token;
    const ALICE: &str = "t-res-alice";
    const BOB: &str = "t-res-bob";
    let _a = common::remove_on_drop(ALICE);
    let _b = common::remove_on_drop(BOB);
    let _image = common::sandbox().await;
    let dir = std::env::temp_dir().join(format!("mcp-test-res-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _dir_guard = crate::common::TempDirs(vec![dir.clone()]);
    std::fs::create_dir_all(&dir).unwrap();
    let mut toml = String::new();
    for (id, tok) in [
        (ALICE, "alice-token-0123456789"),
        (BOB, "bob-token-0123456789"),
    ] {
        toml.push_str(&format!(
            "[[tenants]]\nid = \"{id}\"\ntoken_sha256 = \"{}\"\n\n",
            token::to_hex(&token::hash(tok))
        ));
    }
    std::fs::write(dir.join("tenants.toml"), toml).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["serve", "--port", "0", "--pool-size", "0", "--tenants"])
        .arg(dir.join("tenants.toml"))
        .env("CODE_STORAGE_DIR", dir.join("code"))
        .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
        .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.join("ws"))
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let url = common::announced_url(&mut lines, Duration::from_secs(180), false).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let client = |token: &'static str| {
        let url = url.clone();
        async move {
            let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(token);
            let c: RunningService<RoleClient, ()> =
                ().serve(StreamableHttpClientTransport::from_config(config))
                    .await
                    .expect("connects");
            Arc::new(c)
        }
    };
    let alice = client("alice-token-0123456789").await;
    let bob = client("bob-token-0123456789").await;
    let r = call(
        &alice,
        "execute_code",
        json!({"code": "open('/workspace/secret.txt', 'w').write('alice only')"}),
    )
    .await;
    let l = links(&r)
        .into_iter()
        .find(|l| l.name == "secret.txt")
        .expect("link");
    match read(&alice, &l.uri).await.unwrap() {
        ResourceContents::TextResourceContents { text, .. } => assert_eq!(text, "alice only"),
        other => panic!("{other:?}"),
    }
    let e = read(&bob, &l.uri).await.unwrap_err();
    assert!(not_found(e), "Bob gets not found");
    drop(alice);
    drop(bob);
    let pid = child.id().unwrap() as i32;
    // SAFETY: kill(2) on the pid of a child this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
    for t in [ALICE, BOB] {
        assert!(
            common::containers_of(t).is_empty(),
            "containers of {t} left"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
