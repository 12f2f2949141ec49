//! Egress (#41), the direct channel: during a run with egress the server listens on a Unix
//! socket in the sandbox's own directory ([`super::sandbox_dir`], mounted inside at
//! [`SANDBOX_DIR`](super::protocol::SANDBOX_DIR)), and the runner hands each of the code's
//! connections to it: one socket connection per connection, carrying one byte and the
//! connection's own descriptor (`SCM_RIGHTS`). From then on the server reads and writes the
//! code's TCP socket itself: no byte goes through the runner (its copy, then its splice
//! loop, spent the sandbox's one CPU beside the code's own client) nor through its
//! stdin/stdout (the container runtime's attach stream). Each connection is handed to the
//! run's [`EgressRun`], the same proxy the relay ([`super::relay`]) feeds: policy, limits,
//! logs and metrics do not depend on the channel. Where the socket is absent or cannot be
//! connected, or the descriptor cannot be passed (Kubernetes, gVisor, a remote daemon), the
//! runner relays instead.
//!
//! What the sandbox sends is checked as hostile: exactly one descriptor, a connected TCP
//! stream socket (IPv4 or IPv6, not listening), else the connection is dropped and every
//! descriptor that came with it closed; one that sends nothing within [`HANDOFF_TIMEOUT`]
//! is dropped too. Reading and writing a socket the sandbox made gives the server nothing
//! the sandbox did not have: the code is at its other end.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{
    getsockopt, recvmsg, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockType,
    SockaddrLike, SockaddrStorage,
};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::protocol::EGRESS_SOCKET;
use crate::job::{EgressChannel, EgressRun};

/// How long a connection to the socket may take to hand its descriptor over.
pub(crate) const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);

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
/// 429 on it (the proxy never sees it). Handoffs still to come are bounded the same way.
pub(crate) fn listen(run: Arc<dyn EgressRun>, dir: &Path) -> std::io::Result<Listening> {
    let path = dir.join(EGRESS_SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    let max = run.max_streams();
    let slots = Arc::new(Semaphore::new(max));
    let handoffs = Arc::new(Semaphore::new(max));
    tokio::spawn(async move {
        loop {
            let conn = tokio::select! {
                c = listener.accept() => c,
                _ = stop.cancelled() => return,
            };
            let Ok((conn, _)) = conn else {
                continue;
            };
            let Ok(handoff) = handoffs.clone().try_acquire_owned() else {
                tracing::debug!("a run's handoff over its socket's bound");
                continue; // dropped: the descriptor in flight is closed with it
            };
            let (run, slots, stop) = (run.clone(), slots.clone(), stop.clone());
            tokio::spawn(async move {
                let code = tokio::select! {
                    c = tokio::time::timeout(HANDOFF_TIMEOUT, receive(&conn)) => c,
                    _ = stop.cancelled() => return,
                };
                drop(handoff);
                drop(conn);
                let mut code = match code {
                    Ok(Ok(code)) => code,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "a handoff over the sandbox's egress socket refused");
                        return;
                    }
                    Err(_) => return,
                };
                let Ok(slot) = slots.try_acquire_owned() else {
                    tracing::debug!("a run's connection over its socket's bound");
                    let _ = code.write_all(&too_many(max)).await;
                    let _ = code.shutdown().await;
                    return;
                };
                tokio::select! {
                    _ = run.serve(Box::new(code), EgressChannel::Socket) => {}
                    _ = stop.cancelled() => {}
                }
                drop(slot);
            });
        }
    });
    Ok(Listening { cancel, path })
}

/// The code's connection handed over `conn`: one byte with exactly one descriptor, a
/// connected TCP socket; every descriptor that came is closed otherwise.
async fn receive(conn: &UnixStream) -> std::io::Result<TcpStream> {
    let fds = loop {
        conn.readable().await?;
        match conn.try_io(Interest::READABLE, || recv_fds(conn.as_raw_fd())) {
            Ok(got) => break got,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    let mut fds = fds.into_iter();
    let (Some(fd), None) = (fds.next(), fds.next()) else {
        return Err(refused("not exactly one descriptor"));
    };
    let socket = std::net::TcpStream::from(checked(fd)?);
    socket.set_nonblocking(true)?;
    TcpStream::from_std(socket)
}

/// One message's descriptors (each owned at once: closed when dropped); none at the
/// connection's end.
fn recv_fds(fd: std::os::fd::RawFd) -> std::io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    // Room for as many descriptors as one message can carry (SCM_MAX_FD): none is left
    // installed and unseen by a truncated control buffer.
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 253]);
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(std::io::Error::from)?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(got) = cmsg {
            // SAFETY: the kernel installed these descriptors in this process for this
            // message; nothing else refers to them.
            fds.extend(got.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
        }
    }
    Ok(fds)
}

/// `fd` if it is a connected TCP stream socket (IPv4 or IPv6, not listening).
fn checked(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    let stream = getsockopt(&fd, sockopt::SockType).map_err(|_| refused("not a socket"))?;
    if stream != SockType::Stream || getsockopt(&fd, sockopt::AcceptConn).unwrap_or(true) {
        return Err(refused("not a connected stream socket"));
    }
    let local: SockaddrStorage =
        nix::sys::socket::getsockname(fd.as_raw_fd()).map_err(std::io::Error::from)?;
    if !matches!(
        local.family(),
        Some(AddressFamily::Inet | AddressFamily::Inet6)
    ) {
        return Err(refused("not a TCP socket"));
    }
    Ok(fd)
}

fn refused(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{sendmsg, ControlMessage};
    use std::os::fd::{AsFd, AsRawFd, RawFd};
    use tokio::io::AsyncReadExt;

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

    /// What the runner does: one byte and `fds` over a new connection to `path`; our
    /// copies are closed after.
    fn hand(path: &Path, fds: &[RawFd]) {
        let conn = std::os::unix::net::UnixStream::connect(path).unwrap();
        let iov = [std::io::IoSlice::new(b"F")];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
        sendmsg::<()>(conn.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).unwrap();
    }

    /// A connected pair on loopback: (the code's end, the end the runner hands over).
    async fn pair() -> (TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let code = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (theirs, _) = l.accept().unwrap();
        (code, theirs)
    }

    async fn ends(code: &mut TcpStream) -> bool {
        let mut rest = vec![];
        tokio::time::timeout(Duration::from_secs(5), code.read_to_end(&mut rest))
            .await
            .is_ok_and(|n| n.map(|n| n == 0).unwrap_or(true))
    }

    /// Each connection handed over reaches the run's proxy; one over the bound is told why
    /// on itself; the socket is open to any uid and gone with the guard, its connections
    /// ended.
    // Two workers: the tests read and write blocking sockets while the listener works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connections_reach_the_run_and_end_with_the_guard() {
        let dir = crate::scratch::tempdir();
        let listening = listen(Arc::new(Echo), dir.as_path()).unwrap();
        let path = dir.as_path().join(EGRESS_SOCKET);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        let mut held = vec![];
        for m in [b"one", b"two"] {
            let (mut code, theirs) = pair().await;
            hand(&path, &[theirs.as_raw_fd()]);
            drop(theirs);
            code.write_all(m).await.unwrap();
            let mut got = [0u8; 3];
            code.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, m);
            held.push(code);
        }
        let (mut over, theirs) = pair().await;
        hand(&path, &[theirs.as_raw_fd()]);
        drop(theirs);
        let mut text = String::new();
        over.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 429 "), "{text}");
        drop(listening);
        assert!(!path.exists());
        for code in &mut held {
            assert!(ends(code).await, "a connection outlived its run");
        }
    }

    /// What hostile code may send instead is refused and every descriptor that came is
    /// closed: nothing, two descriptors, a pipe, a listening socket. The run is never
    /// called.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hostile_handoff_is_refused_and_its_descriptors_closed() {
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Never(Arc<AtomicBool>);
        impl EgressRun for Never {
            fn serve(
                &self,
                _: Box<dyn crate::job::EgressStream>,
                _: EgressChannel,
            ) -> futures::future::BoxFuture<'static, ()> {
                self.0.store(true, Ordering::SeqCst);
                Box::pin(async {})
            }
            fn max_streams(&self) -> usize {
                4
            }
        }
        let served = Arc::new(AtomicBool::new(false));
        let dir = crate::scratch::tempdir();
        let _listening = listen(Arc::new(Never(served.clone())), dir.as_path()).unwrap();
        let path = dir.as_path().join(EGRESS_SOCKET);
        // Nothing: the connection is dropped.
        let mut bare = std::os::unix::net::UnixStream::connect(&path).unwrap();
        std::io::Write::write_all(&mut bare, b"GET / HTTP/1.1\r\n\r\n").unwrap();
        bare.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 16];
        match std::io::Read::read(&mut bare, &mut buf) {
            Ok(n) => assert_eq!(n, 0),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        // Two connections at once: both closed.
        let (mut a, ta) = pair().await;
        let (mut b, tb) = pair().await;
        hand(&path, &[ta.as_raw_fd(), tb.as_raw_fd()]);
        drop((ta, tb));
        assert!(ends(&mut a).await && ends(&mut b).await);
        // A pipe: its write end closed.
        let (r, w) = nix::unistd::pipe().unwrap();
        hand(&path, &[w.as_fd().as_raw_fd()]);
        drop(w);
        let mut r = std::fs::File::from(r);
        let mut rest = vec![];
        assert_eq!(std::io::Read::read_to_end(&mut r, &mut rest).unwrap(), 0);
        // A listening socket: closed (a connection to it is refused after).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        hand(&path, &[l.as_raw_fd()]);
        drop(l);
        let mut refused = false;
        for _ in 0..50 {
            if std::net::TcpStream::connect(addr).is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(refused, "the listening socket handed over is still open");
        assert!(
            !served.load(Ordering::SeqCst),
            "a refused handoff reached the proxy"
        );
    }
}
