//! `serve`: [`crate::server::run`] with the configuration the command line resolved to,
//! stopped by SIGINT or SIGTERM, and a shutdown that cannot hang: what has not finished
//! [`SHUTDOWN_LIMIT`] after the signal (or at a second one) is abandoned.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Exit;
use crate::app;
use crate::config::serve::BackendKind;
use crate::config::ServeConfig;
use crate::server;

/// Serve until a signal; 0 after a clean shutdown, 1 when start-up failed (or the shutdown
/// had to be abandoned).
pub async fn serve(cfg: ServeConfig) -> Exit {
    let shutdown = CancellationToken::new();
    let config = server::Config::from(cfg);
    watch_signals(
        shutdown.clone(),
        Abandon {
            serving: config.serving.subscribe(),
            backend: config.serve.backend.kind,
            docker_host: config.serve.backend.docker_host.clone(),
        },
    );
    match server::run(config, shutdown).await {
        Ok(()) => 0,
        Err(e) => super::fail(format!("{e:#}"), 1),
    }
}

/// How long a shutdown may take from SIGTERM (or SIGINT) to the end of the process. Runs
/// are cancelled at once and their containers removed, sessions get
/// [`crate::config::defaults::SHUTDOWN_DEADLINE`]; what still has not finished by this
/// deadline (a request stuck in a loop or on a file, a daemon that does not answer) is
/// abandoned: it is logged, the containers of this process are removed, and the process
/// exits (status 1). Under Kubernetes' default grace period of 30 s.
pub use crate::config::defaults::SHUTDOWN_LIMIT;

/// What an abandoned shutdown needs: what is in flight (once serving), and where this
/// process's containers are.
struct Abandon {
    serving: tokio::sync::watch::Receiver<Option<Arc<app::Service>>>,
    backend: BackendKind,
    docker_host: Option<String>,
}

impl Abandon {
    /// Say what is left, remove this process's containers (at most 10 s), exit 1.
    async fn now(self, why: &str) -> ! {
        let service = self.serving.borrow().clone();
        let left = match service {
            Some(s) => {
                let (running, waiting, sessions) = s.in_flight();
                format!("{running} runs going, {waiting} calls waiting, {sessions} sessions open")
            }
            None => "start-up not finished".to_string(),
        };
        say!("mcp-code-executor: {why}; abandoning what is left ({left})");
        tracing::error!(left = %left, "shutdown abandoned: {why}");
        match self.backend {
            BackendKind::Docker => {
                let removed = tokio::time::timeout(
                    Duration::from_secs(10),
                    crate::backend::docker::remove_own_containers(self.docker_host.as_deref()),
                )
                .await;
                match removed {
                    Ok(Ok(n)) => say!("mcp-code-executor: removed {n} containers of this process"),
                    Ok(Err(e)) => say!("mcp-code-executor: could not remove this process's containers ({e}); the next start-up sweep removes them"),
                    Err(_) => say!("mcp-code-executor: the Docker daemon did not answer within 10 s; the next start-up sweep removes this process's containers"),
                }
            }
            _ => say!("mcp-code-executor: the pods of this process go to the next start-up sweep"),
        }
        std::process::exit(1)
    }
}

/// Signals are watched on a thread of their own, with its own small runtime: a request that
/// holds every worker of the server's runtime (a loop that never yields) must not stop the
/// shutdown. The first signal cancels `shutdown` (runs stop, the server drains); if the
/// process is still there [`SHUTDOWN_LIMIT`] later, or at a second signal, what is left is
/// abandoned ([`Abandon::now`]).
fn watch_signals(shutdown: CancellationToken, abandon: Abandon) {
    let spawned = std::thread::Builder::new()
        .name("mce-signals".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    say!("mcp-code-executor: no runtime for the signal watcher: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                wait_for_signal().await;
                say!("mcp-code-executor: shutting down; stopping runs");
                shutdown.cancel();
                let why = tokio::select! {
                    _ = tokio::time::sleep(SHUTDOWN_LIMIT) => format!(
                        "the shutdown did not finish within {} s", SHUTDOWN_LIMIT.as_secs()),
                    _ = wait_for_signal() => "a second signal came".to_string(),
                };
                abandon.now(&why).await
            })
        });
    if let Err(e) = spawned {
        say!("mcp-code-executor: cannot watch for signals: {e}");
    }
}

/// SIGINT or SIGTERM.
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
