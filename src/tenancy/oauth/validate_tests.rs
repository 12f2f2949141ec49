//! The unit tests of [`super`]: one token's checks, with keys made for them.

use super::*;

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

fn jwt(header: Value, payload: Value) -> String {
    format!("{}.{}.c2ln", b64(&header), b64(&payload))
}

#[test]
fn peek_refuses_none_and_hmac_and_junk() {
    let p = serde_json::json!({"iss": "https://as.example"});
    for alg in ["none", "HS256", "HS512", "", "rs256"] {
        let t = jwt(serde_json::json!({"alg": alg}), p.clone());
        assert!(
            matches!(peek(&t), Err(Refusal::Invalid(_))),
            "{alg} must be refused"
        );
    }
    for junk in ["", "abc", "a.b", "a.b.c.d", "mcpx_0123"] {
        assert!(matches!(peek(junk), Err(Refusal::Invalid(_))), "{junk}");
    }
    let no_iss = jwt(serde_json::json!({"alg": "RS256"}), serde_json::json!({}));
    assert!(matches!(peek(&no_iss), Err(Refusal::Invalid(_))));
    let ok = jwt(
        serde_json::json!({"alg": "ES256", "kid": "k1", "jku": "https://evil.example/jwks"}),
        p,
    );
    assert_eq!(
        peek(&ok).unwrap(),
        Peeked {
            alg: Algorithm::ES256,
            kid: Some("k1".into()),
            issuer: "https://as.example".into()
        }
    );
    assert!(peek(&"a".repeat(MAX_TOKEN_BYTES + 1)).is_err());
}

#[test]
fn jwt_shape_tells_static_tokens_apart() {
    assert!(looks_like_jwt("eyJh.eyJi.sig"));
    assert!(looks_like_jwt("eyJh.eyJi."));
    assert!(!looks_like_jwt("mcpx_0123abcd"));
    assert!(!looks_like_jwt("a.b"));
    assert!(!looks_like_jwt("a b.c.d"));
}

#[test]
fn scopes_from_scope_or_scp() {
    let c: Claims = serde_json::from_value(serde_json::json!({
        "scope": "mcp  openid", "scp": ["extra", "mcp"]
    }))
    .unwrap();
    assert_eq!(scopes(&c), vec!["extra", "mcp", "openid"]);
    assert!(scopes(&Claims::new()).is_empty());
    let c: Claims = serde_json::from_value(serde_json::json!({"org": 7})).unwrap();
    assert_eq!(claim_text(&c, "org").as_deref(), Some("7"));
}

/// A P-256 key made for this test only (PKCS#8 DER) and its public JWK.
const TEST_KEY_DER: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgL3tj+CylrjOFPRhBHNH+eVi5XMIrXiocQZnRazzy+nOhRANCAARoiM6qHtIVuBsnJAacO/RtKHZBHu/NaWcVvUk2Xt2/Td395qcAPUzT7vSwahpEUldDlpufBNKPvhc60IZubBUL";

fn test_jwk() -> Jwk {
    serde_json::from_value(serde_json::json!({
        "kty": "EC", "crv": "P-256", "kid": "t1", "alg": "ES256",
        "x": "aIjOqh7SFbgbJyQGnDv0bSh2QR7vzWlnFb1JNl7dv00",
        "y": "3f3mpwA9TNPu9LBqGkRSV0OWm58E0o--FzrQhm5sFQs"
    }))
    .unwrap()
}

fn signed(claims: Value) -> String {
    let der = base64::engine::general_purpose::STANDARD
        .decode(TEST_KEY_DER)
        .unwrap();
    let mut h = jsonwebtoken::Header::new(Algorithm::ES256);
    h.kid = Some("t1".into());
    jsonwebtoken::encode(&h, &claims, &jsonwebtoken::EncodingKey::from_ec_der(&der)).unwrap()
}

fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

#[test]
fn verify_checks_signature_issuer_audience_and_times() {
    let aud = vec!["https://mcp.example.com/mcp".to_string()];
    let base = serde_json::json!({
        "iss": "https://as.example", "sub": "u1", "aud": "https://mcp.example.com/mcp",
        "exp": now() + 600, "scope": "mcp"
    });
    let with = |k: &str, v: Value| {
        let mut c = base.clone();
        if v.is_null() {
            c.as_object_mut().unwrap().remove(k);
        } else {
            c[k] = v;
        }
        c
    };
    let check = |t: &str| {
        let p = peek(t).unwrap();
        verify(t, &p, &test_jwk(), "https://as.example", &aud)
    };
    let c = check(&signed(base.clone())).unwrap();
    assert_eq!(c["sub"], "u1");
    assert_eq!(
        check(&signed(with("exp", (now() - 61).into()))),
        Err(Refusal::Expired)
    );
    // Within the 60 s leeway: still accepted.
    assert!(check(&signed(with("exp", (now() - 30).into()))).is_ok());
    assert!(matches!(
        check(&signed(with("nbf", (now() + 120).into()))),
        Err(Refusal::Invalid(_))
    ));
    assert!(check(&signed(with("nbf", (now() + 30).into()))).is_ok());
    assert_eq!(
        check(&signed(with("aud", "https://other.example".into()))),
        Err(Refusal::Audience)
    );
    assert_eq!(
        check(&signed(with("aud", Value::Null))),
        Err(Refusal::Audience)
    );
    assert!(check(&signed(with("aud", serde_json::json!(["x", aud[0]])))).is_ok());
    assert!(matches!(
        check(&signed(with("iss", "https://as.example/".into()))),
        Err(Refusal::Invalid(_))
    ));
    assert!(matches!(
        check(&signed(with("sub", Value::Null))),
        Err(Refusal::Invalid(_))
    ));
    assert!(matches!(
        check(&signed(with("exp", Value::Null))),
        Err(Refusal::Invalid(_))
    ));
    // A flipped signature byte.
    let t = signed(base.clone());
    let mut bad = t.clone().into_bytes();
    let last = bad.len() - 2;
    bad[last] = if bad[last] == b'A' { b'B' } else { b'A' };
    assert!(matches!(
        check(std::str::from_utf8(&bad).unwrap()),
        Err(Refusal::Invalid(_))
    ));
    // The key's own alg must match the header's.
    let mut rs_key = test_jwk();
    rs_key.common.key_algorithm = Some(jsonwebtoken::jwk::KeyAlgorithm::ES384);
    let p = peek(&t).unwrap();
    assert!(matches!(
        verify(&t, &p, &rs_key, "https://as.example", &aud),
        Err(Refusal::Invalid(_))
    ));
}

#[test]
fn reasons_are_the_metric_labels() {
    let all = [
        Refusal::Missing,
        Refusal::Invalid("x".into()),
        Refusal::Audience,
        Refusal::Expired,
        Refusal::Scope,
        Refusal::NoTenant(String::new()),
    ];
    let got: Vec<_> = all.iter().map(Refusal::reason).collect();
    assert_eq!(got, Refusal::REASONS);
}

/// Issue 42, finding 10: `crit: ["exp"]` was accepted, `sub: ""` made every such token
/// the same user, and `exp` up to `u64::MAX` (a token that never expires) was accepted.
#[test]
fn crit_empty_sub_and_absurd_exp_are_refused() {
    let aud = vec!["https://mcp.example.com/mcp".to_string()];
    let check = |t: &str| {
        let p = peek(t)?;
        verify(t, &p, &test_jwk(), "https://as.example", &aud)
    };
    let claims = |sub: Value, exp: Value| {
        serde_json::json!({
            "iss": "https://as.example", "sub": sub, "aud": "https://mcp.example.com/mcp",
            "exp": exp, "scope": "mcp"
        })
    };
    let ok = |r: Result<Claims, Refusal>| r.is_ok();
    let why = |r: Result<Claims, Refusal>| match r {
        Err(Refusal::Invalid(w)) => w,
        other => panic!("refused as invalid expected, got {other:?}"),
    };
    assert!(ok(check(&signed(claims(
        "u1".into(),
        (now() + 600).into()
    )))));
    // Empty, blank or not a string: refused.
    assert!(why(check(&signed(claims("".into(), (now() + 600).into())))).contains("empty sub"));
    assert!(why(check(&signed(claims("  ".into(), (now() + 600).into())))).contains("empty sub"));
    assert!(why(check(&signed(claims(7.into(), (now() + 600).into())))).contains("sub"));
    // exp: a year ahead is the most.
    let year = MAX_EXP_AHEAD as i64;
    assert!(ok(check(&signed(claims(
        "u1".into(),
        (now() + year - 60).into()
    )))));
    for exp in [
        Value::from(now() + year + 3600),
        Value::from(u64::MAX),
        Value::from(i64::MAX),
        serde_json::json!(1e300),
    ] {
        let r = check(&signed(claims("u1".into(), exp.clone())));
        assert!(matches!(r, Err(Refusal::Invalid(_))), "exp {exp}: {r:?}");
    }
    // crit in the header: refused whatever it names, before any key is looked at.
    for crit in [
        serde_json::json!(["exp"]),
        serde_json::json!(["b64"]),
        serde_json::json!([]),
    ] {
        let t = jwt(
            serde_json::json!({"alg": "ES256", "kid": "t1", "crit": crit, "exp": 1}),
            serde_json::json!({"iss": "https://as.example"}),
        );
        let w = match peek(&t) {
            Err(Refusal::Invalid(w)) => w,
            other => panic!("{other:?}"),
        };
        assert!(w.contains("crit"), "{w}");
    }
}

/// `typ`: an access token's (`at+jwt`, also `JWT` or none, as Keycloak, Entra ID and Auth0
/// sign theirs); the type of another kind of JWT is refused.
#[test]
fn typ_must_be_an_access_tokens() {
    let p = serde_json::json!({"iss": "https://as.example"});
    let with_typ = |typ: Value| {
        let mut h = serde_json::json!({"alg": "ES256", "kid": "t1"});
        if !typ.is_null() {
            h["typ"] = typ;
        }
        jwt(h, p.clone())
    };
    for ok in [
        Value::Null,
        "at+jwt".into(),
        "application/at+jwt".into(),
        "AT+JWT".into(),
        "JWT".into(),
        "application/okta-internal-at+jwt".into(),
    ] {
        assert!(peek(&with_typ(ok.clone())).is_ok(), "typ {ok}");
    }
    for bad in [
        Value::from("dpop+jwt"),
        "logout+jwt".into(),
        "secevent+jwt".into(),
        "xat+jwt".into(),
        "application/jwt+id_token".into(),
        "".into(),
        7.into(),
    ] {
        assert!(
            matches!(peek(&with_typ(bad.clone())), Err(Refusal::Invalid(_))),
            "typ {bad}"
        );
    }
}

/// Issue 42, finding 9: what a refusal says of a token is quoted, escaped and cut.
#[test]
fn values_from_tokens_are_shown_escaped_and_cut() {
    assert_eq!(shown("kid-1"), "\"kid-1\"");
    let forged = format!("x\nINFO oauth: FORGED admin sign-in{}", "A".repeat(20_000));
    let s = shown(&forged);
    assert!(!s.contains('\n'), "{s}");
    assert!(s.contains("\\n"), "{s}");
    assert!(s.len() < 120, "{} bytes", s.len());
    assert!(s.ends_with(&format!("({} bytes)", forged.len())), "{s}");
    // An issuer of 12 KiB in a refusal's text: cut.
    let t = jwt(
        serde_json::json!({"alg": "none"}),
        serde_json::json!({"iss": "https://as.example"}),
    );
    assert!(matches!(peek(&t), Err(Refusal::Invalid(w)) if w.len() < 100));
    let long_alg = "R".repeat(10_000);
    let t = jwt(
        serde_json::json!({"alg": long_alg}),
        serde_json::json!({"iss": "x"}),
    );
    assert!(matches!(peek(&t), Err(Refusal::Invalid(w)) if w.len() < 200));
}
