//! Every negative case of the validation matrix, tenants from claims, users of one tenant
//! kept apart.

use super::*;

#[tokio::test]
async fn tokens_are_validated_tenants_come_from_claims_and_users_are_kept_apart() {
    let dir = tempdir();
    let issuer = Issuer::start(free_port(), &dir.join("keys.json"), false).await;
    let port = free_port();
    let static_token = token::generate();
    let s = Hosted::oauth("matrix", port, &issuer.url(), &static_token).await;
    let mcp = s.url("/mcp");
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let meta = format!(
        r#"resource_metadata="http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", scope="mcp""#
    );
    let http = reqwest::Client::new();

    // -- Protected Resource Metadata: no token, the configured URL whatever the Host, CORS.
    for (suffix, want) in [
        ("", format!("http://127.0.0.1:{port}")),
        ("/mcp", resource.clone()),
        ("/sse", format!("http://127.0.0.1:{port}/sse")),
    ] {
        let r = http
            .get(s.url(&format!("/.well-known/oauth-protected-resource{suffix}")))
            .header("Host", "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{suffix}");
        assert_eq!(r.headers()["access-control-allow-origin"], "*");
        let m: Value = r.json().await.unwrap();
        assert_eq!(m["resource"], want.as_str(), "{m}");
        assert_eq!(m["authorization_servers"], json!([issuer.url()]), "{m}");
        assert_eq!(m["scopes_supported"], json!(["mcp"]), "{m}");
        assert_eq!(m["bearer_methods_supported"], json!(["header"]), "{m}");
    }
    let pre = http
        .request(
            reqwest::Method::OPTIONS,
            s.url("/.well-known/oauth-protected-resource/mcp"),
        )
        .header("Origin", "https://chat.example")
        .header("Access-Control-Request-Method", "GET")
        .send()
        .await
        .unwrap();
    assert_eq!(pre.status(), 204);
    assert_eq!(pre.headers()["access-control-allow-origin"], "*");

    // -- The negative matrix: each refusal with its status, challenge and counted reason.
    let t_acme = issuer.token("acme-ci", "mcp", &resource).await;
    let claims = |extra: Value| {
        let mut c = json!({
            "iss": issuer.url(), "sub": "forged", "aud": resource, "scope": "mcp", "org": "acme",
            "client_id": "acme-ci", "iat": now(), "exp": now() + 600,
        });
        for (k, v) in extra.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    // A token the issuer's key signs, as the test asks: valid first (the control).
    let (signed_ok, public_jwk) = issuer.sign(json!({}), claims(json!({}))).await;
    let (expired, _) = issuer
        .sign(
            json!({}),
            claims(json!({"exp": now() - 120, "iat": now() - 900})),
        )
        .await;
    let (not_yet, _) = issuer
        .sign(json!({}), claims(json!({"nbf": now() + 600})))
        .await;
    let (wrong_iss, _) = issuer
        .sign(
            json!({}),
            claims(json!({"iss": format!("{}/other", issuer.url())})),
        )
        .await;
    let (no_aud, _) = issuer.sign(json!({}), claims(json!({"aud": null}))).await;
    let (unknown_kid, _) = issuer
        .sign(json!({"kid": "no-such-key"}), claims(json!({})))
        .await;
    let (with_jku, _) = issuer
        .sign(json!({"kid": "attacker", "jku": "http://127.0.0.1:9/jwks.json", "x5u": "http://127.0.0.1:9/x.pem"}), claims(json!({})))
        .await;
    let wrong_aud = issuer
        .token("acme-ci", "mcp", "http://other.example/mcp")
        .await;
    let no_scope = issuer.token("acme-ci", "other", &resource).await;
    let no_tenant = issuer.token("initech-ci", "mcp", &resource).await;
    let body = b64(&serde_json::to_vec(&claims(json!({}))).unwrap());
    let alg_none = format!("{}.{body}.", b64(br#"{"alg":"none","typ":"at+jwt"}"#));
    // HS256 with the issuer's public key as the HMAC secret (the key-confusion attack):
    // the JWK as JSON, and its modulus.
    let hs_with = |secret: &[u8]| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        h.kid = public_jwk["kid"].as_str().map(str::to_string);
        jsonwebtoken::encode(
            &h,
            &claims(json!({})),
            &jsonwebtoken::EncodingKey::from_secret(secret),
        )
        .unwrap()
    };
    let hs_json = hs_with(public_jwk.to_string().as_bytes());
    let hs_n = hs_with(public_jwk["n"].as_str().unwrap().as_bytes());

    let list = |t: Option<&str>| {
        let mcp = mcp.clone();
        let t = t.map(str::to_string);
        async move { rpc(&mcp, t.as_deref(), "tools/list", json!({}), json!({})).await }
    };
    let (st, ch, r) = list(Some(&signed_ok)).await;
    assert_eq!(
        st, 200,
        "a token signed by the issuer's key is accepted: {ch} {r}"
    );
    let (st, ch, _) = list(Some(&t_acme)).await;
    assert_eq!(st, 200, "a client-credentials token: {ch}");
    let (st, ch, _) = list(None).await;
    assert_eq!(
        (st, ch.as_str()),
        (401, format!("Bearer {meta}").as_str()),
        "no token"
    );
    let mut matrix = vec![];
    for (what, t, status, error) in [
        ("malformed", "abc.def.ghi".to_string(), 401, "invalid_token"),
        ("not a JWT", "hello".to_string(), 401, "invalid_token"),
        ("expired", expired, 401, "invalid_token"),
        ("nbf in the future", not_yet, 401, "invalid_token"),
        ("wrong iss", wrong_iss, 401, "invalid_token"),
        ("wrong aud", wrong_aud, 401, "invalid_token"),
        ("missing aud", no_aud, 401, "invalid_token"),
        ("alg none", alg_none, 401, "invalid_token"),
        ("HS256 with the public JWK", hs_json, 401, "invalid_token"),
        ("HS256 with the public modulus", hs_n, 401, "invalid_token"),
        ("unknown kid", unknown_kid, 401, "invalid_token"),
        ("jku/x5u not followed", with_jku, 401, "invalid_token"),
        ("missing scope", no_scope, 403, "insufficient_scope"),
    ] {
        let (st, ch, r) = list(Some(&t)).await;
        assert_eq!(st, status, "{what}: {ch} {r}");
        assert!(ch.starts_with(&format!("Bearer {meta}")), "{what}: {ch}");
        assert!(ch.contains(&format!(r#"error="{error}""#)), "{what}: {ch}");
        matrix.push(format!("{what}: {st} {ch}"));
    }
    let (st, ch, r) = list(Some(&no_tenant)).await;
    assert_eq!(st, 403, "no tenant: {r}");
    assert!(
        ch.is_empty(),
        "no challenge for a valid token no tenant admits: {ch}"
    );
    assert_eq!(r["error"], "forbidden", "{r}");
    matrix.push(format!("no matching tenant: {st} {r}"));
    // A token in the query string: refused, even a valid one.
    let r = http
        .post(format!("{mcp}?access_token={t_acme}"))
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a token in the query string");
    matrix.push(format!("token in the query string: {}", r.status()));
    // The legacy SSE endpoint challenges with its own metadata.
    let r = http.get(s.url("/sse")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("oauth-protected-resource/sse"));
    // A browser client of an allowed origin can read the challenge.
    let r = http
        .post(&mcp)
        .header("Origin", "http://localhost:6274")
        .header("Content-Type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:6274"
    );
    assert!(r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .contains("WWW-Authenticate"));
    for m in &matrix {
        eprintln!("matrix: {m}");
    }

    // -- Refusals counted by reason; no token in the log.
    let m = http
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metric(&m, "missing") >= 3, "{m}");
    assert!(metric(&m, "invalid") >= 10, "{m}");
    assert!(metric(&m, "audience") >= 2, "{m}");
    assert_eq!(metric(&m, "expired"), 1, "{m}");
    assert_eq!(metric(&m, "scope"), 1, "{m}");
    assert_eq!(metric(&m, "no_tenant"), 1, "{m}");

    // -- Tenants from claims, users apart. A and B: two clients of org acme (one tenant, two
    // users); G: org globex; S: the static token, which works as before.
    let (ta, tb) = (t_acme, issuer.token("acme-ci-2", "mcp", &resource).await);
    let tg = issuer.token("globex-ci", "mcp", &resource).await;
    // rmcp's client with a client-credentials token.
    let client = ()
        .serve(StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(mcp.clone()).auth_header(ta.clone()),
        ))
        .await
        .expect("rmcp's client connects with the token");
    let r = call(&client, "execute_python", json!({"code": "x = 41"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let sa = structured(&r)["session_id"].as_str().unwrap().to_string();
    let r = call(
        &client,
        "execute_python",
        json!({"code": "x + 1", "session_id": sa}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "42\n", "{}", text(&r));
    let r = call(
        &client,
        "write_file",
        json!({"path": "a.txt", "content": "secret of A", "session_id": sa}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let uri = format!("workspace://sessions/{sa}/a.txt");
    let (_, _, r) = rpc(
        &mcp,
        Some(&ta),
        "resources/read",
        json!({"uri": uri}),
        json!({}),
    )
    .await;
    assert_eq!(
        r["contents"][0]["text"], "secret of A",
        "A reads its own resource: {r}"
    );
    // B (same tenant, another user): A's session, files and resources are not found.
    for (name, args) in [
        ("execute_python", json!({"code": "x", "session_id": sa})),
        ("read_file", json!({"path": "a.txt", "session_id": sa})),
        ("list_files", json!({"session_id": sa})),
        (
            "write_file",
            json!({"path": "b.txt", "content": "x", "session_id": sa}),
        ),
        (
            "execute_code",
            json!({"code": "print(open('/workspace/a.txt').read())", "session_id": sa}),
        ),
    ] {
        let r = tool(&mcp, &tb, name, args).await;
        let t = tool_text(&r);
        assert!(
            r["isError"] == true && t.contains("not found") && !t.contains("secret of A"),
            "B {name}: {r}"
        );
    }
    let (_, _, r) = rpc(
        &mcp,
        Some(&tb),
        "resources/read",
        json!({"uri": uri}),
        json!({}),
    )
    .await;
    assert!(
        r["error"].is_object() && !r.to_string().contains("secret of A"),
        "B reads A's resource: {r}"
    );
    // The static token of another tenant, and G of another org: not found either.
    for t in [&static_token, &tg] {
        let r = tool(
            &mcp,
            t,
            "read_file",
            json!({"path": "a.txt", "session_id": sa}),
        )
        .await;
        assert!(tool_text(&r).contains("not found"), "{r}");
    }
    // G lands in its own tenant.
    let r = tool(&mcp, &tg, "execute_python", json!({"code": "y = 1"})).await;
    assert!(r["isError"] != true, "{r}");
    assert!(
        s.log_text()
            .lines()
            .any(|l| l.contains("standalone session opened") && l.contains(&globex("matrix"))),
        "globex's session is in its tenant"
    );
    // The static token still works, beside OAuth.
    let r = tool(
        &mcp,
        &static_token,
        "execute_code",
        json!({"code": "print(6 * 7)"}),
    )
    .await;
    assert!(tool_text(&r).contains("42"), "{r}");

    // Tasks: A's task id is unknown to B.
    let tasks = json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } });
    let (_, _, created) = rpc(
        &mcp,
        Some(&ta),
        "tools/call",
        json!({"name": "execute_code", "arguments": {"code": "print('task of A')"}}),
        tasks.clone(),
    )
    .await;
    let task = created["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("a task: {created}"))
        .to_string();
    let (_, _, mine) = rpc(
        &mcp,
        Some(&ta),
        "tasks/get",
        json!({"taskId": task}),
        tasks.clone(),
    )
    .await;
    assert!(mine.get("error").is_none(), "A polls its task: {mine}");
    for (m, p) in [
        ("tasks/get", json!({"taskId": task})),
        ("tasks/cancel", json!({"taskId": task})),
    ] {
        let (_, _, r) = rpc(&mcp, Some(&tb), m, p, tasks.clone()).await;
        assert!(r["error"].is_object(), "B {m} on A's task: {r}");
    }

    // Mcp-Session-Id: A's protocol session refuses B's token.
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}});
    let r = http
        .post(&mcp)
        .bearer_auth(&ta)
        .header("Content-Type", "application/json")
        .header("Accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let list_in = |t: String| {
        let (http, mcp, sid) = (http.clone(), mcp.clone(), sid.clone());
        async move {
            http.post(&mcp)
                .bearer_auth(t)
                .header("Content-Type", "application/json")
                .header("Accept", "application/json, text/event-stream")
                .header("Mcp-Session-Id", sid)
                .header("MCP-Protocol-Version", "2025-06-18")
                .body(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string())
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(list_in(tb.clone()).await, 404, "B on A's Mcp-Session-Id");
    assert_eq!(
        list_in(ta.clone()).await,
        200,
        "A on its own Mcp-Session-Id"
    );

    // Legacy SSE: A's stream refuses B's messages (another principal's session is unknown).
    let mut sse = http
        .get(s.url("/sse"))
        .bearer_auth(&ta)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let mut first = String::new();
    while !first.contains("sessionId=") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), sse.chunk())
            .await
            .expect("the endpoint event comes")
            .unwrap()
            .expect("the stream stays open");
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    let endpoint = first
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .unwrap()
        .trim()
        .to_string();
    let init_text = init.to_string();
    let post_as = |t: String| {
        let (http, url, body) = (http.clone(), s.url(&endpoint), init_text.clone());
        async move {
            http.post(url)
                .bearer_auth(t)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(post_as(tb.clone()).await, 404, "B on A's SSE session");
    assert_eq!(post_as(ta.clone()).await, 202, "A on its own SSE session");
    drop(sse);

    // No token in the log; the log names tenants and principal digests.
    let log = s.log_text();
    for t in [&ta, &tb, &tg, &static_token, &signed_ok] {
        let sig = t.rsplit('.').next().unwrap();
        assert!(!log.contains(sig), "a token in the log");
    }
    assert!(log.contains("principal=user:"), "{log}");
    drop(client);
    s.finish().await;
}
