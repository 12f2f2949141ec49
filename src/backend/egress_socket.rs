//! Egress (#41), the direct channel: during a run with egress the server listens on a Unix
//! socket in the sandbox's own directory ([`super::sandbox_dir`], mounted inside at
//! [`SANDBOX_DIR`](super::protocol::SANDBOX_DIR)), and the runner connects each of the
//! code's connections to it: one socket connection per connection, no framing, no window
//! (the kernel's socket buffers are the flow control), and no byte through the runner's
//! stdin/stdout (the container runtime's attach stream, which cost most of the CPU of a
//! download relayed over it). Each connection is handed to the run's [`EgressRun`], the
//! same proxy the relay ([`super::relay`]) feeds: policy, limits, logs and metrics do not
//! depend on the channel. Where the socket is absent or cannot be connected (Kubernetes,
//! gVisor, a remote daemon) the runner relays instead.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::protocol::EGRESS_SOCKET;
use crate::job::{EgressChannel, EgressRun};

/// The answer to a connection over the run's bound ([`EgressRun::max_streams`]): without
/// a bound, code opening a thousand connections and never reading would pin most of a GiB
/// of the server's memory (a window each way per stream). It never reaches the proxy.
pub(crate) fn too_many(max: usize) -> Vec<u8> {
    let body = format!(
        "egress refused: this run already has {max} connections open through the proxy (the most one run may hold); close some and try again\n"
    );
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The socket of one conversation: dropped, it stops taking connections, ends those it
/// took and removes the socket's file.
pub(crate) struct Listening {
    cancel: CancellationToken,
    path: PathBuf,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.cancel.cancel();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listen on [`EGRESS_SOCKET`] in `dir` for `run`'s connections. The socket is open to
/// every uid (the runner's is the image's or the environment's); the directory is the
/// sandbox's alone, so only this sandbox (and the host) can reach it. At most
/// [`EgressRun::max_streams`] connections at once, as over the relay; one more is answered
/// 429 there (the proxy never sees it).
pub(crate) fn listen(run: Arc<dyn EgressRun>, dir: &Path) -> std::io::Result<Listening> {
    let path = dir.join(EGRESS_SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let max = run.max_streams();
    let slots = Arc::new(Semaphore::new(max));
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                _ = stop.cancelled() => return,
            };
            let Ok((mut conn, _)) = conn else {
                continue;
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!("a run's connection over its socket's bound");
                tokio::spawn(async move {
                    let _ = conn.write_all(&too_many(max)).await;
                    let _ = conn.shutdown().await;
                });
                continue;
            };
            let serve = run.serve(Box::new(conn), EgressChannel::Socket);
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = serve => {}
                    _ = stop.cancelled() => {}
                }
                drop(slot);
            });
        }
    });
    Ok(Listening { cancel, path })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixStream;

    /// A proxy that sends back what it gets, two connections at most.
    struct Echo;
    impl EgressRun for Echo {
        fn serve(
            &self,
            io: Box<dyn crate::job::EgressStream>,
            channel: EgressChannel,
        ) -> futures::future::BoxFuture<'static, ()> {
            assert_eq!(channel, EgressChannel::Socket);
            Box::pin(async move {
                let (mut r, mut w) = tokio::io::split(io);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            })
        }

        fn max_streams(&self) -> usize {
            2
        }
    }

    /// Each connection reaches the run's proxy; one over the bound is told why; the socket
    /// is open to any uid and gone with the guard, its connections ended.
    #[tokio::test]
    async fn connections_reach_the_run_and_end_with_the_guard() {
        let dir = crate::scratch::tempdir();
        let listening = listen(Arc::new(Echo), dir.as_path()).unwrap();
        let path = dir.as_path().join(EGRESS_SOCKET);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        let mut a = UnixStream::connect(&path).await.unwrap();
        let mut b = UnixStream::connect(&path).await.unwrap();
        for (c, m) in [(&mut a, b"one"), (&mut b, b"two")] {
            c.write_all(m).await.unwrap();
            let mut got = [0u8; 3];
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, m);
        }
        let mut over = UnixStream::connect(&path).await.unwrap();
        let mut text = String::new();
        over.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 429 "), "{text}");
        drop(listening);
        assert!(!path.exists());
        let mut rest = vec![];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), a.read_to_end(&mut rest))
            .await
            .expect("the connection ends with the run")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
}
