//! Usage (issue 45 item 2): what a run uses outside its sandbox, counted per tenant. The
//! real binary (`serve --tools FILE --egress FILE`) on real Docker, the real upstream MCP
//! server of code mode (npm `server-everything`), a real HTTPS server on loopback named by
//! the egress policy, and the rmcp client: one run makes three code-mode tool calls, one
//! downloads a body of known size through the proxy, an `execute_python` session does one
//! of each in two cells, one install runs; then `mcp-code-executor usage` must show
//! exactly those.

use serde_json::{json, Value};

use crate::codemode::{call, last_json, node_server, run, TempDir};
use crate::common;
use crate::egress::TlsUpstream;
use crate::egress_sandbox::{policy, trusting};
use crate::process::Server;

/// The body the run downloads.
const BODY: u64 = 200_000;

#[tokio::test]
async fn usage_counts_tool_calls_egress_bytes_and_installs() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("usage-ext");
    let tools = dir.0.join("tools.toml");
    std::fs::write(
        &tools,
        format!(
            "[[servers]]\nname = \"everything\"\ncommand = \"node\"\nargs = [\"{}\"]\nallow = [\"get-sum\"]\n",
            node_server("everything")
        ),
    )
    .unwrap();
    let egress = dir.0.join("egress.toml");
    std::fs::write(&egress, policy(up.port)).unwrap();
    let mut args = vec![
        "--tools",
        tools.to_str().unwrap(),
        "--egress",
        egress.to_str().unwrap(),
    ];
    let runtime = common::runtime();
    if let Some(r) = &runtime {
        args.extend(["--runtime", r.as_str()]);
    }
    let s = Server::start("usage-ext", &args, &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    // Three code-mode tool calls.
    let (out, err, _) = run(
        &peer,
        "from tools import everything\nprint(sum(1 for i in range(3) if '3' in str(everything.get_sum(a=1, b=2))))",
    )
    .await;
    assert_eq!(out.trim(), "3", "{err}");
    // A download of BODY bytes through the proxy.
    let code = format!(
        "{}import requests\nr = requests.get('https://data.example.test:{}/big={BODY}', timeout=30)\nprint('{{\"n\": %d}}' % len(r.content))\n",
        trusting(&ca),
        up.port
    );
    let (out, err, _) = run(&peer, &code).await;
    assert_eq!(last_json(&out, &err), json!({"n": BODY}), "{err}");
    // An execute_python session: a cell with one tool call, a cell downloading BODY.
    let cells = [
        "from tools import everything\n'3' in str(everything.get_sum(a=1, b=2))".to_string(),
        format!(
            "{}import requests\nlen(requests.get('https://data.example.test:{}/big={BODY}', timeout=30).content)",
            trusting(&ca),
            up.port
        ),
    ];
    for (code, want) in cells.iter().zip(["True", &BODY.to_string()]) {
        let r = call(&peer, "execute_python", json!({ "code": code })).await;
        let t = format!("{:?} {:?}", r.structured_content, r.content);
        assert!(t.contains(want), "cell {code:?} answered {t}");
    }
    // An install (numpy: there already; whatever pip says, an install ran).
    let r = call(
        &peer,
        "install_dependencies",
        json!({"packages": ["numpy"]}),
    )
    .await;
    drop(client);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["usage", "--data-dir"])
        .arg(s.dir.join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let day = all.as_object().unwrap().values().next().unwrap();
    let t = &day[&s.tenant];
    assert_eq!(t["installs"], 1, "install answered {r:?}: {t}");
    assert_eq!(t["kinds"]["install"]["runs"], 1, "{t}");
    assert_eq!(t["kinds"]["run"]["runs"], 2, "{t}");
    assert_eq!(t["kinds"]["cell"]["runs"], 2, "{t}");
    // Three from the run, one from the session's cell.
    assert_eq!(t["tool_calls"], 4, "{t}");
    let down = t["egress_down_bytes"].as_u64().unwrap();
    // The body twice (a run's, a cell's), plus TLS and HTTP framing (a handshake with its
    // certificate: a few KiB each).
    assert!(
        (2 * BODY..2 * BODY + 32_768).contains(&down),
        "{down} bytes received for two {BODY}-byte bodies: {t}"
    );
    let up_bytes = t["egress_up_bytes"].as_u64().unwrap();
    assert!((200..32_768).contains(&up_bytes), "{up_bytes} sent: {t}");
    // Per principal (no sign-in: the static token) the same.
    assert_eq!(t["principals"]["static-token"]["tool_calls"], 4, "{t}");
    assert_eq!(t["principals"]["static-token"]["installs"], 1, "{t}");
}
