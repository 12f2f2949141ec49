//! docs/hosting.md's OAuth quick start, run as written: its shell block (after the
//! `<!-- quickstart:oauth` marker) in a network namespace of its own (so that its fixed
//! ports 9000 and 4000 are free whatever else runs on this machine), from a directory
//! holding the files it names (deploy/oauth/authorization-server.mjs,
//! deploy/tenants.oauth.example.toml, tests/oauth/sdk_oauth.py), with `mcp-code-executor`,
//! the official SDK's `python3` (target/py-sdk) and an `npm` first on the `PATH`. That `npm`
//! is the one stand-in: the namespace has no network, so it checks that it is asked for the
//! very package and version scripts/test.sh installed under target/oidc-provider and links
//! those. Then, beside the block, a user of an organisation no rule maps is refused, and the
//! server's log at its default level and `/metrics` say why.

use super::*;

/// The quick start's shell block.
fn quickstart_block() -> String {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/hosting.md")).unwrap();
    let after = doc
        .split("<!-- quickstart:oauth")
        .nth(1)
        .expect("docs/hosting.md has the quickstart:oauth marker");
    let block = after
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a ```sh block after the marker");
    block.to_string()
}

/// The oidc-provider version scripts/test.sh installs.
fn pinned_oidc_provider() -> String {
    let script = std::fs::read_to_string(format!("{ROOT}/scripts/test.sh")).unwrap();
    script
        .split_whitespace()
        .find(|w| w.starts_with("oidc-provider@"))
        .expect("scripts/test.sh installs oidc-provider@VERSION")
        .to_string()
}

#[tokio::test]
async fn the_oauth_quick_start_runs_as_written_and_signs_in() {
    let modules = Path::new(ROOT).join("target/oidc-provider/node_modules");
    assert!(
        modules.join("oidc-provider").is_dir(),
        "npm oidc-provider is needed at {}: run scripts/test.sh",
        modules.display()
    );
    let py_sdk = Path::new(ROOT).join("target/py-sdk/bin");
    assert!(
        py_sdk.join("python3").exists(),
        "the official MCP Python SDK is needed at {}: run scripts/test.sh",
        py_sdk.display()
    );
    assert!(
        std::process::Command::new("unshare")
            .args(["--net", "true"])
            .status()
            .is_ok_and(|s| s.success()),
        "this test runs the quick start in a network namespace of its own: `unshare --net` \
         (util-linux, as root) must work"
    );
    let block = quickstart_block();
    let pin = pinned_oidc_provider();
    assert!(
        block.contains(&format!("npm install --prefix deploy/oauth {pin}")),
        "the quick start installs the version the tests use ({pin}):\n{block}"
    );

    let _image = common::sandbox().await;
    let dir = tempdir();
    for f in [
        "deploy/oauth/authorization-server.mjs",
        "deploy/tenants.oauth.example.toml",
        "tests/oauth/sdk_oauth.py",
    ] {
        std::fs::create_dir_all(dir.join(f).parent().unwrap()).unwrap();
        std::fs::copy(Path::new(ROOT).join(f), dir.join(f)).unwrap();
    }
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_mcp-code-executor"),
        bin.join("mcp-code-executor"),
    )
    .unwrap();
    let npm = format!(
        "#!/bin/sh\n[ \"$*\" = \"install --prefix deploy/oauth {pin}\" ] || {{ echo \"npm stand-in: unexpected $*\" >&2; exit 1; }}\n\
         mkdir -p deploy/oauth && ln -s {} deploy/oauth/node_modules\n",
        modules.display()
    );
    std::fs::write(bin.join("npm"), npm).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(bin.join("npm"), std::fs::Permissions::from_mode(0o755)).unwrap();

    // The block, then the test's own checks, then every background job stopped (SIGTERM:
    // the server removes its sandboxes).
    let script = format!(
        "set -e\nip link set lo up\ntrap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\n\
         {block}\n\
         echo '--- beside the quick start ---'\n\
         python3 tests/oauth/sdk_oauth.py http://127.0.0.1:4000/mcp bob@globex && exit 3\n\
         curl -sf http://127.0.0.1:4000/metrics | grep '^mcp_auth_refused_total'\n"
    );
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        py_sdk.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = tokio::process::Command::new("unshare")
        .args(["--net", "bash", "-c", &script])
        .current_dir(&*dir)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .env("CODE_STORAGE_DIR", dir.join("code"))
        .env("MCP_EXECUTOR_DATA_DIR", dir.join("data"))
        .env("MCP_EXECUTOR_WORKSPACE_DIR", dir.join("ws"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("unshare runs");
    let pgid = child.id().unwrap() as i32;
    let out = tokio::time::timeout(Duration::from_secs(300), async {
        let mut stdout = String::new();
        let mut stderr = String::new();
        use tokio::io::AsyncReadExt;
        let (mut o, mut e) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let _ = tokio::join!(o.read_to_string(&mut stdout), e.read_to_string(&mut stderr));
        (child.wait().await.unwrap(), stdout, stderr)
    })
    .await;
    let Ok((status, stdout, stderr)) = out else {
        // SAFETY: kill(2) of the process group this test made (process_group(0) above).
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        common::remove_containers(&common::containers_of("acme"));
        panic!("the quick start did not finish in 300 s");
    };
    eprintln!("{stdout}\n{stderr}");
    let left = common::containers_of("acme");
    common::remove_containers(&left);
    assert!(status.success(), "the quick start failed: {status:?}");
    let (quick, beside) = stdout
        .split_once("--- beside the quick start ---")
        .expect("the block ran to its end");
    assert!(quick.contains("ok: signed in"), "{quick}");
    assert!(quick.contains("ok: auto 2026-07-28"), "{quick}");
    // bob@globex: a valid token, no rule: refused, and the reason is in the default log...
    assert!(!beside.contains("ok: signed in"), "{beside}");
    assert!(
        stderr.lines().any(|l| l.contains("WARN")
            && l.contains("refused: authentication")
            && l.contains("no_tenant")
            && l.contains(r#"org=\"globex\""#)),
        "the refusal's reason at the default log level: {stderr}"
    );
    // ...and counted by reason.
    assert!(
        metric(beside, "no_tenant") >= 1,
        "mcp_auth_refused_total: {beside}"
    );
    // The start-up says what the documented default pool size (2) means with a tenants file.
    assert!(
        stderr.contains(
            "each tenant's warm pool (2 sandboxes, --pool-size) is made at its first run"
        ),
        "{stderr}"
    );
    assert!(left.is_empty(), "sandboxes of tenant acme left: {left:?}");
}
