//! Egress stage 2 (#41): sandboxed code reaches the proxy through its runner's channel.
//! The real binary (`serve --egress FILE`) on real Docker, the code's own clients inside
//! the sandbox (`requests`, `pandas.read_csv` over `urllib`), a real HTTPS server on
//! loopback that the policy's `[resolve]` names, and the rmcp client.

use std::time::Duration;

use serde_json::{json, Value};

use crate::codemode::{call, last_json, TempDir};
use crate::common;
use crate::egress::TlsUpstream;
use crate::process::Server;

/// The policy of these tests: `data.example.test` on the upstream's port, which lives on
/// 127.0.0.1 (named by a rule, as loopback must be); `other.example.test` is not in it.
pub(crate) fn policy(port: u16) -> String {
    format!(
        r#"
[resolve]
"data.example.test" = "127.0.0.1"
"other.example.test" = "127.0.0.1"

[[rules]]
host = "data.example.test"
ports = [{port}]

[[rules]]
host = "127.0.0.1"
ports = [{port}]
"#
    )
}

/// `serve --egress FILE` with the egress log at info, its sandboxes under the suite's
/// runtime (`MCP_TEST_RUNTIME`: the gVisor pass of scripts/test.sh runs these again).
pub(crate) async fn start(name: &str, policy: &str, dir: &TempDir) -> Server {
    let file = dir.0.join("egress.toml");
    std::fs::write(&file, policy).unwrap();
    let runtime = common::runtime();
    let mut args = vec!["--egress", file.to_str().unwrap()];
    if let Some(r) = &runtime {
        args.extend(["--runtime", r.as_str()]);
    }
    Server::start(
        name,
        &args,
        &[(
            "RUST_LOG",
            "mcp_code_executor=warn,mcp_code_executor::egress=info",
        )],
    )
    .await
}

/// Python that makes the sandbox trust the test CA (as a user's code would for a
/// private CA); the proxy variables come from the runner.
pub(crate) fn trusting(ca: &str) -> String {
    format!(
        "import os\nopen('/tmp/ca.pem', 'w').write({ca:?})\n\
         os.environ['SSL_CERT_FILE'] = os.environ['REQUESTS_CA_BUNDLE'] = '/tmp/ca.pem'\n"
    )
}

/// Run `code` with execute_code: (stdout, stderr, structured report); the whole result
/// in the panic when it has no report.
pub(crate) async fn run_with(
    peer: &rmcp::Peer<rmcp::RoleClient>,
    code: &str,
    timeout: u64,
) -> (String, String, Value) {
    let r = call(
        peer,
        "execute_code",
        json!({"code": code, "timeout": timeout}),
    )
    .await;
    let s = r
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structured report: {r:?}"));
    let out = s["stdout"].as_str().unwrap_or_default().to_string();
    (out, s["stderr"].as_str().unwrap_or_default().to_string(), s)
}

/// Every way around the proxy the code might try, each as what happened.
const AROUND: &str = r#"
import socket
def attempt(f):
    try:
        return 'ok: %r' % (f(),)
    except Exception as e:
        return '%s: %s' % (type(e).__name__, e)
res['dns'] = attempt(lambda: socket.getaddrinfo('data.example.test', 443))
res['udp'] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53)))
res['tcp'] = attempt(lambda: socket.create_connection(('1.1.1.1', 443), timeout=3))
res['loopback_upstream'] = attempt(lambda: socket.create_connection(('127.0.0.1', PORT), timeout=3))
res['ifaces'] = [n for _, n in socket.if_nameindex()]
"#;

#[tokio::test]
async fn execute_code_reaches_an_allowed_host_and_nothing_else() {
    let up = TlsUpstream::start(&["data.example.test", "other.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-sbx");
    let s = start("egress-sbx", &policy(port), &dir).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    let code = format!(
        r#"{trust}
import json, requests, pandas as pd
res = {{'proxy': [os.environ.get(k) for k in ('HTTP_PROXY', 'HTTPS_PROXY', 'http_proxy', 'https_proxy')],
       'no_proxy': os.environ.get('NO_PROXY')}}
r = requests.get('https://data.example.test:{port}/hello', timeout=20)
res['get'] = [r.status_code, r.text]
df = pd.read_csv('https://data.example.test:{port}/x.csv')
res['csv'] = [list(df.columns), int(df['a'].sum()), int(df['b'].sum())]
def err(url):
    try:
        return 'reached: %s' % requests.get(url, timeout=20).text
    except Exception as e:
        return str(e)
res['other'] = err('https://other.example.test:{port}/')
res['redirect'] = err('https://data.example.test:{port}/redirect?to=https://other.example.test:{port}/')
PORT = {port}
{around}
print(json.dumps(res))
"#,
        trust = trusting(&ca),
        around = AROUND
    );
    let (out, err, rep) = run_with(&peer, &code, 90).await;
    let v = last_json(&out, &err);
    let proxy = "http://127.0.0.1:3128";
    assert_eq!(v["proxy"], json!([proxy, proxy, proxy, proxy]), "{v}");
    assert_eq!(v["no_proxy"], Value::Null, "{v}");
    // The upstream saw the client's own TLS: its SNI, through the tunnel.
    assert_eq!(
        v["get"],
        json!([
            200,
            format!("host=data.example.test:{port} sni=data.example.test")
        ]),
        "{v}"
    );
    assert_eq!(v["csv"], json!([["a", "b"], 4, 6]), "{v}");
    for key in ["other", "redirect"] {
        let e = v[key].as_str().unwrap();
        assert!(
            e.contains(&format!("other.example.test:{port} not in the policy")),
            "{key}: {e}"
        );
    }
    // No way around the proxy: no resolver, no interface but `lo`, nothing on loopback
    // but the runner's listener.
    let dns = v["dns"].as_str().unwrap();
    assert!(dns.starts_with("gaierror"), "{dns}");
    for key in ["udp", "tcp", "loopback_upstream"] {
        let e = v[key].as_str().unwrap();
        assert!(!e.starts_with("ok"), "{key}: {e}");
    }
    assert_eq!(v["ifaces"], json!(["lo"]), "{v}");
    assert_eq!(rep["exit_code"], 0, "{rep}");

    // The record: the refusals name the host; the allowed tunnels end `ok`.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = s.stderr();
    assert!(
        log.contains("egress refused") && log.contains("host=other.example.test"),
        "{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("egress connection")
            && l.contains("host=data.example.test")
            && l.contains("outcome=\"ok\"")),
        "{log}"
    );
    drop(client);
}

#[tokio::test]
async fn an_execute_python_session_reaches_an_allowed_host_cell_after_cell() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-ses");
    let s = start("egress-ses", &policy(port), &dir).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();

    let cells = [
        format!("{}import requests, pandas as pd\nos.environ['HTTPS_PROXY']", trusting(&ca)),
        format!("requests.get('https://data.example.test:{port}/hi', timeout=20).text"),
        format!("int(pd.read_csv('https://data.example.test:{port}/x.csv')['b'].sum())"),
        format!(
            "try:\n    requests.get('https://other.example.test:{port}/', timeout=20)\nexcept Exception as e:\n    print(e)"
        ),
        // A second cell's connection, after the first cell's streams ended.
        format!("requests.get('https://data.example.test:{port}/again', timeout=20).status_code"),
    ];
    let mut outs = vec![];
    for code in &cells {
        let r = call(&peer, "execute_python", json!({ "code": code })).await;
        outs.push(format!("{:?} {:?}", r.structured_content, r.content));
    }
    assert!(outs[0].contains("http://127.0.0.1:3128"), "{}", outs[0]);
    assert!(
        outs[1].contains(&format!(
            "host=data.example.test:{port} sni=data.example.test"
        )),
        "{}",
        outs[1]
    );
    assert!(outs[2].contains('6'), "{}", outs[2]);
    assert!(
        outs[3].contains(&format!("other.example.test:{port} not in the policy")),
        "{}",
        outs[3]
    );
    assert!(outs[4].contains("200"), "{}", outs[4]);
    drop(client);
}

#[tokio::test]
async fn without_a_policy_the_sandbox_has_no_proxy_and_no_listener() {
    let dir = TempDir::new("egress-none");
    let _ = &dir;
    let s = Server::start("egress-none", &[], &[]).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let code = r#"
import json, os, socket
env = sorted(k for k in os.environ if 'proxy' in k.lower())
try:
    socket.create_connection(('127.0.0.1', 3128), timeout=3)
    listener = 'connected'
except Exception as e:
    listener = type(e).__name__
print(json.dumps({'env': env, 'listener': listener}))
"#;
    let (out, err, _) = run_with(&peer, code, 60).await;
    let v = last_json(&out, &err);
    assert_eq!(
        v,
        json!({"env": [], "listener": "ConnectionRefusedError"}),
        "{err}"
    );
    drop(client);
}

#[tokio::test]
async fn run_with_a_policy_file_reaches_an_allowed_host() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-run");
    let file = dir.0.join("egress.toml");
    std::fs::write(&file, policy(port)).unwrap();
    let script = dir.0.join("fetch.py");
    let code = format!(
        "{}import requests\nprint(requests.get('https://data.example.test:{port}/ci', timeout=20).text)\n\
         try:\n    requests.get('https://other.example.test:{port}/', timeout=20)\nexcept Exception as e:\n    print(e)\n",
        trusting(&ca)
    );
    std::fs::write(&script, code).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
            .args([
                "run",
                "--egress",
                file.to_str().unwrap(),
                script.to_str().unwrap(),
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run ends within 120 s")
    .expect("the binary starts");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!(
            "host=data.example.test:{port} sni=data.example.test"
        )),
        "{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("other.example.test:{port} not in the policy")),
        "{stdout}\n{stderr}"
    );
    // Without the flag the same file has no way out.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
        .args(["run", script.to_str().unwrap()])
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
}

/// Figures (`--nocapture`): a fresh HTTPS GET (new session: connection and handshake each
/// time) from the sandbox through the runner's channel and the proxy, against the same GET
/// from the host's Python straight to the server.
#[tokio::test]
async fn a_fresh_https_get_from_the_sandbox_and_from_the_host() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-lat");
    let s = start("egress-lat", &policy(port), &dir).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let timing = |host: &str| {
        format!(
            r#"
import json, time, requests
ms = []
for _ in range(40):
    t = time.perf_counter()
    with requests.Session() as s:
        assert s.get('https://{host}:{port}/t', timeout=20).status_code == 200
    ms.append((time.perf_counter() - t) * 1000)
ms.sort()
print(json.dumps({{'p50': ms[len(ms) // 2], 'p95': ms[int(len(ms) * 0.95)]}}))
"#
        )
    };
    let code = format!("{}{}", trusting(&ca), timing("data.example.test"));
    let (out, err, _) = run_with(&peer, &code, 120).await;
    let sandbox = last_json(&out, &err);
    let (ok, out, err) = crate::egress::python(&timing("127.0.0.1"), "", &up.ca).await;
    assert!(ok, "{out}\n{err}");
    let host = last_json(&out, &err);
    println!(
        "fresh HTTPS GET, 40 rounds: sandbox through the proxy p50 {:.1} ms p95 {:.1} ms; host direct p50 {:.1} ms p95 {:.1} ms",
        sandbox["p50"].as_f64().unwrap(),
        sandbox["p95"].as_f64().unwrap(),
        host["p50"].as_f64().unwrap(),
        host["p95"].as_f64().unwrap()
    );
    // A 200 MB download, streamed (the issue's goal: at least half the host's throughput).
    let download = |host: &str| {
        format!(
            r#"
import json, time, requests
n, got = 200_000_000, 0
t = time.perf_counter()
with requests.get('https://{host}:{port}/big={{}}'.format(n), stream=True, timeout=60) as r:
    for chunk in r.iter_content(1 << 20):
        got += len(chunk)
s = time.perf_counter() - t
assert got >= n, got
print(json.dumps({{'mb_s': got / s / 1e6}}))
"#
        )
    };
    let code = format!("{}{}", trusting(&ca), download("data.example.test"));
    let (out, err, _) = run_with(&peer, &code, 300).await;
    let sandbox = last_json(&out, &err)["mb_s"].as_f64().unwrap();
    let (ok, out, err) = crate::egress::python(&download("127.0.0.1"), "", &up.ca).await;
    assert!(ok, "{out}\n{err}");
    let host = last_json(&out, &err)["mb_s"].as_f64().unwrap();
    println!(
        "200 MB HTTPS download: sandbox through the proxy {sandbox:.0} MB/s; host direct {host:.0} MB/s ({:.0} %)",
        100.0 * sandbox / host
    );
    drop(client);
}

/// Rules of the tenants file (`[[tenants.egress]]`) serve their tenant alone: the first
/// tenant reaches its host (by name and by the loopback address its rule names), the
/// second, on the same server with the same policy file, is refused both.
#[tokio::test]
async fn a_tenants_own_rules_are_not_another_tenants() {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;

    let up = TlsUpstream::start(&["data.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-ten");
    // The server-wide file says where the name lives and allows nothing.
    let file = dir.0.join("egress.toml");
    std::fs::write(&file, "[resolve]\n\"data.example.test\" = \"127.0.0.1\"\n").unwrap();
    let own = format!(
        "[[tenants.egress]]\nhost = \"data.example.test\"\nports = [{port}]\n\
         [[tenants.egress]]\nhost = \"127.0.0.1\"\nports = [{port}]\n"
    );
    let (tenants, a, b, ta, tb) = crate::codemode::two_tenants(&dir.0, "eg", &own, "");
    let runtime = common::runtime();
    let mut args = vec![
        "--egress",
        file.to_str().unwrap(),
        "--tenants",
        tenants.to_str().unwrap(),
    ];
    if let Some(r) = &runtime {
        args.extend(["--runtime", r.as_str()]);
    }
    let s = Server::start(
        "egress-ten",
        &args,
        &[(
            "RUST_LOG",
            "mcp_code_executor=warn,mcp_code_executor::egress=info",
        )],
    )
    .await;
    let _clean_a = common::remove_on_drop(&a);
    let _clean_b = common::remove_on_drop(&b);
    let log = s.stderr();
    assert!(log.contains("egress policy"), "{log}");
    let code = format!(
        r#"{trust}
import json, requests
res = {{}}
for name, url in [('name', 'https://data.example.test:{port}/t'), ('address', 'https://127.0.0.1:{port}/t')]:
    try:
        r = requests.get(url, timeout=20, verify=False if name == 'address' else True)
        res[name] = 'status %d' % r.status_code
    except Exception as e:
        res[name] = str(e)
print(json.dumps(res))
"#,
        trust = trusting(&ca)
    );
    let mut seen = vec![];
    for token in [&ta, &tb] {
        let t = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(s.url("/mcp"))
                .auth_header(token.to_string()),
        );
        let client = ().serve(t).await.expect("connects");
        let (out, err, _) = run_with(client.peer(), &code, 60).await;
        seen.push(last_json(&out, &err));
        drop(client);
    }
    assert_eq!(seen[0]["name"], "status 200", "{:?}", seen[0]);
    assert_eq!(seen[0]["address"], "status 200", "{:?}", seen[0]);
    for (what, host) in [
        ("name", format!("data.example.test:{port}")),
        ("address", format!("127.0.0.1:{port}")),
    ] {
        let said = seen[1][what].as_str().unwrap_or_default();
        assert!(
            said.contains(&format!("{host} not in the policy")),
            "{what}: {:?}",
            seen[1]
        );
    }
}

/// Through the official Python SDK (`tests/sdk/egress.py`), in its default mode (2026-07-28,
/// no protocol session) and its legacy mode: execute_code reaches the allowed host
/// (tunnelled: the server saw the client's own SNI) and is refused another, and an
/// execute_python session reaches it cell after cell.
#[tokio::test]
async fn the_official_python_sdk_reaches_an_allowed_host_in_both_modes() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let dir = TempDir::new("egress-sdk");
    let s = start("egress-sdk", &policy(up.port), &dir).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let port = up.port.to_string();
    let out =
        crate::codemode::sdk_script(&s, "egress.py", &[port.as_ref(), up.ca.as_os_str()]).await;
    assert!(out.contains("ok: auto 2026-07-28"), "{out}");
    assert!(out.contains("ok: legacy 2025-11-25"), "{out}");
}

/// The connections of `tenant` handed to the proxy by `channel` (`socket`, `relay`), read
/// off the server's `/metrics`.
async fn streams_by(s: &Server, channel: &str) -> u64 {
    let text = reqwest::get(s.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!(
        "mcp_executor_egress_streams_total{{tenant=\"{}\",channel=\"{channel}\"}} ",
        s.tenant
    );
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Under runc the code's connections reach the proxy over the sandbox's own Unix socket
/// (mounted read-only at /run/mcp-egress, the bytes skip the attach stream), none over the
/// runner's relay; with the socket gone (removed from the host while the code waits) the
/// runner relays them instead, and the code sees no difference. Under gVisor (no socket:
/// runsc refuses host sockets unless run with `--host-uds=open`) every connection is
/// relayed.
#[tokio::test]
async fn the_direct_socket_carries_egress_under_runc_and_the_relay_stands_in() {
    let up = TlsUpstream::start(&["data.example.test"]).await;
    let port = up.port;
    let ca = std::fs::read_to_string(&up.ca).unwrap();
    let dir = TempDir::new("egress-chan");
    let s = start("egress-chan", &policy(port), &dir).await;
    let _clean = common::remove_on_drop(&s.tenant);
    let client = s.client().await;
    let peer = client.peer().clone();
    let gvisor = common::runtime().is_some_and(|r| r.starts_with("runsc"));
    let get = format!(
        "import requests\nprint(requests.get('https://data.example.test:{port}/hi', timeout=20).text)\n"
    );
    let sni = format!("host=data.example.test:{port} sni=data.example.test");

    // The socket is there (or, under gVisor, the directory is not), read-only to the code.
    let code = format!(
        "{trust}import os\nprint(os.path.exists('/run/mcp-egress/egress.sock'))\n\
         try:\n    open('/run/mcp-egress/x', 'w')\nexcept OSError as e:\n    print('write:', e.errno)\n{get}",
        trust = trusting(&ca)
    );
    let (out, err, _) = run_with(&peer, &code, 60).await;
    assert!(out.contains(&sni), "{out}\n{err}");
    let (socket, relay) = (
        streams_by(&s, "socket").await,
        streams_by(&s, "relay").await,
    );
    if gvisor {
        assert!(out.starts_with("False\n"), "{out}");
        assert_eq!((socket, relay > 0), (0, true), "{socket} {relay}");
    } else {
        assert!(out.starts_with("True\nwrite: 30\n"), "{out}");
        assert!(socket > 0 && relay == 0, "socket {socket}, relay {relay}");
        // The directory is the sandbox's alone and goes with it.
        let root = s.dir.join("data").join("sandboxes");
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(&root).unwrap().count() > 0 {
            assert!(
                std::time::Instant::now() < until,
                "directories left in {root:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // The socket removed from the host under the running code: the relay stands in.
        let code = format!(
            "{trust}import os, time\nfor _ in range(300):\n    if not os.path.exists('/run/mcp-egress/egress.sock'):\n        break\n    time.sleep(0.1)\n{get}",
            trust = trusting(&ca)
        );
        let remover = tokio::spawn(async move {
            for _ in 0..300 {
                for d in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                    if std::fs::remove_file(d.path().join("egress.sock")).is_ok() {
                        return true;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        });
        let (out, err, _) = run_with(&peer, &code, 60).await;
        assert!(remover.await.unwrap(), "the socket never appeared");
        assert!(out.contains(&sni), "{out}\n{err}");
        assert_eq!(streams_by(&s, "socket").await, socket);
        assert!(streams_by(&s, "relay").await > 0);
    }
    drop(client);
}
