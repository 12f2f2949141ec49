//! Usage per tenant and principal (issue 45 item 2), against the real binary and the real
//! issuer: a known workload for two tenants (acme, globex) and two users of acme (the
//! client-credentials clients `acme-ci` and `acme-ci-2`: two `sub`s), with one run killed
//! by its memory limit, one timed out and one cancelled by its client; the server killed with SIGKILL between runs and
//! started again on the same data directory (and a session cell of globex, kind `cell`);
//! then every figure checked against what ran,
//! through `mcp-code-executor usage` (the operator: every tenant) and `GET /usage` (a
//! tenant's static token: that tenant, every principal; a signed-in user: their own
//! records only), with bad lines and an unreadable file among the records.

use super::*;

async fn run(url: &str, token: &str, code: &str, timeout: u64) -> Value {
    tool(
        url,
        token,
        "execute_code",
        json!({"code": code, "timeout": timeout}),
    )
    .await
}

#[tokio::test]
async fn usage_counts_every_finished_run_once_across_a_kill_9() {
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let data = dir.join("data");
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let flags = |data: &Path| -> Vec<String> {
        vec![
            "--port".into(),
            port.to_string(),
            "--public-url".into(),
            format!("http://127.0.0.1:{port}"),
            "--oauth-issuer".into(),
            issuer.url(),
            "--data-dir".into(),
            data.display().to_string(),
        ]
    };
    // acme's static token: its operator, who sees every principal of acme.
    let operator = token::generate();
    let file = format!(
        "[[tenants]]\nid = \"{a}\"\ntoken_sha256 = \"{t}\"\n\n[[tenants]]\nid = \"{g}\"\n\n\
         [[oauth_rules]]\nissuer = \"{i}\"\nclaim = \"org\"\nvalue = \"acme\"\ntenant = \"{a}\"\n\n\
         [[oauth_rules]]\nissuer = \"{i}\"\nclaim = \"org\"\nvalue = \"globex\"\ntenant = \"{g}\"\n",
        a = acme("usage"),
        g = globex("usage"),
        i = issuer.url(),
        t = token::to_hex(&token::hash(&operator)),
    );
    let ids = [acme("usage"), globex("usage")];
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let alice = issuer.token("acme-ci", "mcp", &resource).await;
    let bob = issuer.token("acme-ci-2", "mcp", &resource).await;
    let gus = issuer.token("globex-ci", "mcp", &resource).await;

    // First life: alice 2 ok + 1 OOM; bob 1 timeout + 1 cancelled; gus 1 ok.
    let s = Hosted::start(Some(&file), &ids, &flags(&data)).await;
    let mcp = s.url("/mcp");
    for _ in 0..2 {
        let r = run(&mcp, &alice, "print('x' * 99)", 30).await;
        assert!(tool_text(&r).contains(&"x".repeat(99)), "{r}");
    }
    let r = run(
        &mcp,
        &alice,
        "chunks = []\nwhile True:\n    chunks.append('x' * (8 << 20))\n",
        60,
    )
    .await;
    assert_eq!(r["isError"], true, "{r}");
    let r = run(&mcp, &bob, "import time\ntime.sleep(30)", 2).await;
    assert_eq!(r["isError"], true, "{r}");
    run(&mcp, &gus, "print(1)", 30).await;
    // bob's client (rmcp, a protocol session) gives up on a call: notifications/cancelled.
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(mcp.clone()).auth_header(bob.clone()),
        ))
        .await
        .expect("rmcp's client connects with the token");
    let args = json!({"code": "import time\ntime.sleep(30)", "timeout": 60});
    let params = rmcp::model::CallToolRequestParams::new("execute_code")
        .with_arguments(args.as_object().unwrap().clone());
    assert!(
        tokio::time::timeout(Duration::from_secs(3), client.call_tool(params))
            .await
            .is_err(),
        "the call was still running when its client gave up"
    );
    let usage = |data: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_mcp-code-executor"))
            .args(["usage", "--data-dir"])
            .arg(data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let t0 = Instant::now();
    while !usage(&data).to_string().contains("\"cancelled\":1") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the cancelled run was not recorded: {}",
            usage(&data)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = client.cancel().await;
    // kill -9 between runs: every run above was answered, so recorded.
    let pid = s.child.id().unwrap() as i32;
    // SAFETY: kill(2) of the server this test spawned and still holds.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(s);

    // Second life, same data directory: alice 1 ok, gus 1 ok.
    let s = Hosted::start(Some(&file), &ids, &flags(&data)).await;
    let mcp = s.url("/mcp");
    run(&mcp, &alice, "print(2)", 30).await;
    run(&mcp, &gus, "print(3)", 30).await;
    // A session cell (execute_python) of gus: recorded as kind `cell`.
    let r = tool(
        &mcp,
        &gus,
        "execute_python",
        json!({"code": "print('c' * 9)"}),
    )
    .await;
    assert!(tool_text(&r).contains(&"c".repeat(9)), "{r}");

    // A torn line, a line that is not JSON and an unreadable `.jsonl` (a directory) in
    // the usage directory: skipped, never failing the report.
    let records = data.join("usage");
    let written = std::fs::read_dir(&records)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&written)
        .unwrap();
    std::io::Write::write_all(&mut f, b"{\"id\": \"not a record\"}\n\xff garbage\n").unwrap();
    std::fs::write(records.join("zz-torn.jsonl"), b"{\"id\": \"torn").unwrap();
    std::fs::create_dir(records.join("zz-dir.jsonl")).unwrap();

    // The operator of the service: every tenant.
    let all = usage(&data);
    eprintln!("{}", serde_json::to_string_pretty(&all).unwrap());
    let days = all.as_object().unwrap();
    assert_eq!(days.len(), 1, "one day: {all}");
    let day = days.values().next().unwrap();
    let a = &day[acme("usage")];
    let g = &day[globex("usage")];
    assert_eq!(a["runs"], 6, "{a}");
    assert_eq!(
        a["outcomes"],
        json!({"ok": 3, "oom": 1, "timeout": 1, "cancelled": 1}),
        "{a}"
    );
    assert_eq!(g["runs"], 3, "two runs and a cell: {g}");
    assert_eq!(g["outcomes"], json!({"ok": 3}), "{g}");
    assert_eq!(g["kinds"]["run"]["runs"], 2, "{g}");
    assert_eq!(g["kinds"]["cell"]["runs"], 1, "{g}");
    assert!(
        g["kinds"]["cell"]["output_bytes"].as_u64().unwrap() >= 10,
        "{g}"
    );
    assert!(g["kinds"]["cell"]["wall_s"].as_f64().unwrap() > 0.0, "{g}");
    assert_eq!(a["kinds"]["run"]["runs"], 6, "no cells in acme: {a}");
    let principals = a["principals"].as_object().unwrap();
    assert_eq!(principals.len(), 2, "alice and bob: {a}");
    let mut per: Vec<(u64, Value)> = principals
        .values()
        .map(|p| (p["runs"].as_u64().unwrap(), p["outcomes"].clone()))
        .collect();
    per.sort_by_key(|p| p.0);
    assert_eq!(per[0], (2, json!({"timeout": 1, "cancelled": 1})));
    assert_eq!(per[1], (4, json!({"ok": 3, "oom": 1})));
    assert!(principals.keys().all(|k| k.starts_with("user:")));
    // Figures: the timeout held its limit for about 2 s, the memory limit (512 MiB) times
    // wall time; output bytes: alice's 2 x 100 bytes plus "2\n".
    let limit = 512.0 * 1024.0 * 1024.0;
    let wall = a["wall_s"].as_f64().unwrap();
    assert!(wall >= 2.0, "{a}");
    let mem = a["memory_byte_s"].as_f64().unwrap();
    assert!(
        (mem - limit * wall).abs() < limit * 0.01,
        "{mem} vs {}",
        limit * wall
    );
    assert!(a["output_bytes"].as_u64().unwrap() >= 202, "{a}");
    assert!(a["cpu_s"].as_f64().unwrap() > 0.0, "{a}");
    assert!(
        a["peak_memory_bytes"].as_u64().unwrap() > 100 << 20,
        "the OOM run's peak: {a}"
    );

    // Over HTTP: a tenant's static token sees that tenant only, every principal of it;
    // a signed-in user sees their own records only.
    let get = |token: String| {
        let url = s.url("/usage");
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let all: Value = r.json().await.unwrap();
            let days = all.as_object().unwrap();
            assert_eq!(days.len(), 1, "one day: {all}");
            let day = days.values().next().unwrap().as_object().unwrap().clone();
            assert_eq!(day.len(), 1, "one tenant: {all}");
            day.into_iter().next().unwrap()
        }
    };
    let (tenant, mine) = get(gus.clone()).await;
    assert_eq!(tenant, globex("usage"));
    assert_eq!(mine["runs"], 3);
    let (tenant, whole) = get(operator.clone()).await;
    assert_eq!(tenant, acme("usage"));
    assert_eq!(&whole, a, "acme's operator sees all of acme");
    for (user, runs) in [(&alice, 4), (&bob, 2)] {
        let (tenant, mine) = get(user.clone()).await;
        assert_eq!(tenant, acme("usage"));
        assert_eq!(mine["runs"], runs, "{mine}");
        let p = mine["principals"].as_object().unwrap();
        assert_eq!(p.len(), 1, "only their own: {mine}");
        assert_eq!(p.values().next().unwrap()["runs"], runs, "{mine}");
    }
    let r = reqwest::get(s.url("/usage")).await.unwrap();
    assert_eq!(r.status(), 401, "no token, no usage");
    s.finish().await;
}
