//! Egress (#41), the server's end of the sandbox's way out: the runner accepts the code's
//! connections on its loopback listener and relays each as a numbered stream over its
//! stdin/stdout channel (frames `N` out, `net` messages in, see
//! [`protocol::encode_net`]); here each stream becomes an in-memory duplex served by the
//! run's [`EgressRun`] (the egress proxy, in the run's scope).
//!
//! Flow control: each direction of a stream has a window of [`WINDOW`] bytes. The runner
//! sends a stream's bytes only while it has credit, which this side grants back as it
//! hands them to the proxy; this side sends only while it has the runner's credit, granted
//! as the runner writes them to the code's socket. So one download can neither fill the
//! stdin pipe and stall the other streams nor grow either side's memory past a window per
//! stream, and the proxy reads upstream only as fast as the code reads. A runner that
//! sends past its window has its stream closed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::egress_socket::too_many;
use super::engine::live::{FrameHook, Hook, Reply};
use super::protocol::{encode_net, Frame, NetOp};
use super::BackendError;
use crate::job::{EgressChannel, EgressRun};

/// Bytes of one stream in flight each way, unacknowledged.
pub const WINDOW: usize = 256 << 10;

/// Largest `data` message this side sends (the runner reads as much at once).
const CHUNK: usize = 64 << 10;

/// Egress's hook for one run (or one cell): `N` frames go to the streams, every other
/// frame to `inner` (code mode's tools, or the answer that none are there).
pub(crate) fn hook(run: Arc<dyn EgressRun>, inner: Hook) -> Hook {
    let (tx, rx) = mpsc::unbounded_channel();
    Some(Arc::new(Relay {
        run,
        inner,
        to_runner: tx,
        from_streams: Mutex::new(Some(rx)),
        streams: Arc::new(Mutex::new(HashMap::new())),
        refused: Mutex::default(),
        cancel: CancellationToken::new(),
    }))
}

struct Relay {
    run: Arc<dyn EgressRun>,
    inner: Hook,
    to_runner: mpsc::UnboundedSender<Vec<u8>>,
    from_streams: Mutex<Option<mpsc::UnboundedReceiver<Vec<u8>>>>,
    streams: Arc<Mutex<HashMap<u32, Stream>>>,
    /// Streams answered [`too_many`]: what the runner still sends for them is dropped
    /// until it closes them.
    refused: Mutex<std::collections::HashSet<u32>>,
    /// Ends every stream when the conversation ends (the hook is dropped).
    cancel: CancellationToken,
}

/// One stream's state on this side.
struct Stream {
    /// Bytes from the code to the proxy (`None`: the code's end is closed).
    to_proxy: mpsc::UnboundedSender<Option<Vec<u8>>>,
    /// Bytes received from the runner not yet handed to the proxy.
    unacked: Arc<AtomicUsize>,
    /// The runner's credit for this side's sends.
    credit: Arc<Semaphore>,
    cancel: CancellationToken,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl FrameHook for Relay {
    fn frame(&self, frame: Frame) -> Result<Reply, BackendError> {
        let Frame::Net { stream, op, data } = frame else {
            return match &self.inner {
                Some(h) => h.frame(frame),
                None => Err(BackendError::Runner(format!(
                    "the runner sent a frame this conversation does not take: {frame:?}"
                ))),
            };
        };
        self.net(stream, op, data);
        Ok(Box::pin(async { None }))
    }

    /// The direct channel beside the relay: the run's connections on a socket in the
    /// sandbox's own directory, for as long as the conversation (see
    /// [`super::egress_socket`]). Without it the runner relays every connection here.
    fn listen(&self, dir: &std::path::Path) -> Option<Box<dyn Send>> {
        match super::egress_socket::listen(self.run.clone(), dir) {
            Ok(l) => Some(Box::new(l)),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot listen on the sandbox's egress socket; its connections come over the runner's relay");
                None
            }
        }
    }

    fn outgoing(&self) -> Option<futures::stream::BoxStream<'static, Vec<u8>>> {
        let rx = self.from_streams.lock().expect("relay lock").take()?;
        let inner = self.inner.as_ref().and_then(|h| h.outgoing());
        let ours =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) })
                .boxed();
        Some(match inner {
            Some(i) => futures::stream::select(ours, i).boxed(),
            None => ours,
        })
    }
}

impl Relay {
    fn net(&self, id: u32, op: NetOp, data: Vec<u8>) {
        let mut streams = self.streams.lock().expect("relay lock");
        let mut refused = self.refused.lock().expect("relay lock");
        if refused.contains(&id) {
            if op == NetOp::Close {
                refused.remove(&id);
            }
            return;
        }
        match op {
            NetOp::Open
                if streams.len() >= self.run.max_streams() && !streams.contains_key(&id) =>
            {
                tracing::debug!(stream = id, "a run's connection over the relay's bound");
                refused.insert(id);
                self.send(id, NetOp::Data, &too_many(self.run.max_streams()), 0);
                self.send(id, NetOp::Eof, &[], 0);
            }
            NetOp::Open => {
                streams.entry(id).or_insert_with(|| self.open(id));
            }
            NetOp::Data => {
                let Some(s) = streams.get(&id) else {
                    return self.send(id, NetOp::Close, &[], 0);
                };
                let over = s.unacked.fetch_add(data.len(), Ordering::SeqCst) + data.len() > WINDOW;
                if over || s.to_proxy.send(Some(data)).is_err() {
                    if over {
                        tracing::debug!(stream = id, "the runner overran a stream's window");
                    }
                    if let Some(s) = streams.remove(&id) {
                        s.cancel.cancel();
                    }
                }
            }
            NetOp::Eof => {
                if let Some(s) = streams.get(&id) {
                    let _ = s.to_proxy.send(None);
                }
            }
            NetOp::Close => {
                if let Some(s) = streams.remove(&id) {
                    s.cancel.cancel();
                }
            }
            NetOp::Credit => {
                let (Some(s), Ok(k)) = (streams.get(&id), <[u8; 4]>::try_from(&data[..])) else {
                    return;
                };
                let room = WINDOW.saturating_sub(s.credit.available_permits());
                s.credit
                    .add_permits((u32::from_be_bytes(k) as usize).min(room));
            }
        }
    }

    fn send(&self, id: u32, op: NetOp, data: &[u8], credit: u32) {
        let _ = self.to_runner.send(encode_net(id, op, data, credit));
    }

    /// Start stream `id`: the proxy over one end of a duplex, and the two pumps between
    /// the other end and the runner.
    fn open(&self, id: u32) -> Stream {
        let (ours, theirs) = tokio::io::duplex(WINDOW);
        let (mut read, mut write) = tokio::io::split(ours);
        let (to_proxy, mut from_code) = mpsc::unbounded_channel::<Option<Vec<u8>>>();
        let unacked = Arc::new(AtomicUsize::new(0));
        let credit = Arc::new(Semaphore::new(WINDOW));
        let cancel = self.cancel.child_token();
        let serve = self.run.serve(Box::new(theirs), EgressChannel::Relay);
        let tx = self.to_runner.clone();
        // Proxy -> runner, as the runner's credit allows.
        let down = {
            let (tx, credit) = (tx.clone(), credit.clone());
            async move {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let Ok(first) = credit.acquire().await else {
                        return;
                    };
                    first.forget();
                    let more = credit.available_permits().min(CHUNK - 1);
                    if let Ok(p) = credit.try_acquire_many(more as u32) {
                        p.forget();
                    }
                    let room = 1 + more;
                    let n: usize = read.read(&mut buf[..room]).await.unwrap_or_default();
                    if n < room {
                        credit.add_permits(room - n);
                    }
                    if n == 0 {
                        let _ = tx.send(encode_net(id, NetOp::Eof, &[], 0));
                        return;
                    }
                    if tx.send(encode_net(id, NetOp::Data, &buf[..n], 0)).is_err() {
                        return;
                    }
                }
            }
        };
        // Runner -> proxy, each chunk credited back once the proxy has it.
        let up = {
            let (tx, unacked) = (tx.clone(), unacked.clone());
            async move {
                while let Some(Some(chunk)) = from_code.recv().await {
                    if write.write_all(&chunk).await.is_err() {
                        break;
                    }
                    unacked.fetch_sub(chunk.len(), Ordering::SeqCst);
                    let _ = tx.send(encode_net(id, NetOp::Credit, &[], chunk.len() as u32));
                }
                let _ = write.shutdown().await;
                std::future::pending::<()>().await
            }
        };
        let streams = self.streams.clone();
        let stop = cancel.clone();
        tokio::spawn(
            async move {
                tokio::select! {
                    _ = async { tokio::join!(serve, down) } => {}
                    _ = up => {}
                    _ = stop.cancelled() => {}
                }
                streams.lock().expect("relay lock").remove(&id);
                let _ = tx.send(encode_net(id, NetOp::Close, &[], 0));
            }
            .boxed(),
        );
        Stream {
            to_proxy,
            unacked,
            credit,
            cancel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::stream::BoxStream;
    use std::time::Duration;

    /// A proxy that sends back what it gets.
    struct Echo;
    impl EgressRun for Echo {
        fn serve(
            &self,
            io: Box<dyn crate::job::EgressStream>,
            _: EgressChannel,
        ) -> futures::future::BoxFuture<'static, ()> {
            Box::pin(async move {
                let (mut r, mut w) = tokio::io::split(io);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            })
        }

        fn max_streams(&self) -> usize {
            64
        }
    }

    /// Hand the hook a frame `N` (its reply is always empty).
    fn give(h: &Arc<dyn FrameHook>, stream: u32, op: NetOp, data: &[u8]) {
        let frame = Frame::Net {
            stream,
            op,
            data: data.to_vec(),
        };
        assert!(h.frame(frame).unwrap().now_or_never().unwrap().is_none());
    }

    /// The messages for the runner that arrive within `wait`: (op, k, bytes).
    async fn drain(
        out: &mut BoxStream<'static, Vec<u8>>,
        wait: Duration,
    ) -> Vec<(String, u64, usize)> {
        let mut got = vec![];
        while let Ok(Some(m)) = tokio::time::timeout(wait, out.next()).await {
            let n = u32::from_be_bytes(m[..4].try_into().unwrap()) as usize;
            let v: serde_json::Value = serde_json::from_slice(&m[4..4 + n]).unwrap();
            assert_eq!(v["len"].as_u64().unwrap() as usize, m.len() - 4 - n);
            got.push((
                v["op"].as_str().unwrap().to_string(),
                v["k"].as_u64().unwrap(),
                m.len() - 4 - n,
            ));
        }
        got
    }

    fn sent(got: &[(String, u64, usize)]) -> usize {
        got.iter().filter(|g| g.0 == "data").map(|g| g.2).sum()
    }

    #[tokio::test]
    async fn a_stream_is_credited_and_sends_no_more_than_the_runners_window() {
        let h = hook(Arc::new(Echo), None).unwrap();
        let mut out = h.outgoing().unwrap();
        give(&h, 1, NetOp::Open, b"");
        let chunk = vec![7u8; CHUNK];
        for _ in 0..2 * WINDOW / CHUNK {
            give(&h, 1, NetOp::Data, &chunk);
            // Each chunk is credited back once the proxy has it.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let got = drain(&mut out, Duration::from_millis(300)).await;
        let credited: u64 = got.iter().filter(|g| g.0 == "credit").map(|g| g.1).sum();
        assert!(credited as usize >= WINDOW, "{credited}");
        // The echo has it all back, but only a window went to the runner.
        assert_eq!(sent(&got), WINDOW);
        give(&h, 1, NetOp::Credit, &(CHUNK as u32).to_be_bytes());
        let more = drain(&mut out, Duration::from_millis(300)).await;
        assert_eq!(sent(&more), CHUNK);
    }

    /// Streams the code never reads, each holding its windows: one over the run's bound
    /// is answered 429 here (the proxy never sees it), what follows for it is dropped
    /// until the runner closes it, and a stream closed makes room again.
    #[tokio::test]
    async fn a_run_holds_at_most_max_streams_and_one_more_is_told_why() {
        /// A proxy that never reads nor answers.
        struct Deaf;
        impl EgressRun for Deaf {
            fn serve(
                &self,
                io: Box<dyn crate::job::EgressStream>,
                _: EgressChannel,
            ) -> futures::future::BoxFuture<'static, ()> {
                Box::pin(async move {
                    let _io = io;
                    std::future::pending::<()>().await
                })
            }

            fn max_streams(&self) -> usize {
                64
            }
        }
        let h = hook(Arc::new(Deaf), None).unwrap();
        let mut out = h.outgoing().unwrap();
        for id in 0..64u32 {
            give(&h, id, NetOp::Open, b"");
        }
        assert!(drain(&mut out, Duration::from_millis(100)).await.is_empty());
        let over = 64u32;
        give(&h, over, NetOp::Open, b"");
        let got = drain(&mut out, Duration::from_millis(200)).await;
        let ops: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
        assert_eq!(ops, ["data", "eof"], "{got:?}");
        let text = String::from_utf8(too_many(64)).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 ") && text.contains("64 connections open"));
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        // The code's request bytes for it are dropped, not answered with a close.
        give(&h, over, NetOp::Data, b"CONNECT x:443 HTTP/1.1\r\n\r\n");
        assert!(drain(&mut out, Duration::from_millis(100)).await.is_empty());
        give(&h, over, NetOp::Close, b"");
        // One closed: room for the next.
        give(&h, 0, NetOp::Close, b"");
        give(&h, over + 1, NetOp::Open, b"");
        give(&h, over + 2, NetOp::Open, b"");
        let got = drain(&mut out, Duration::from_millis(200)).await;
        let mut ops: Vec<&str> = got.iter().map(|g| g.0.as_str()).collect();
        ops.sort();
        // The closed stream's own close, and the refusal of the second new one only.
        assert_eq!(ops, ["close", "data", "eof"], "{got:?}");
    }

    #[tokio::test]
    async fn a_runner_that_overruns_its_window_loses_the_stream() {
        let h = hook(Arc::new(Echo), None).unwrap();
        let mut out = h.outgoing().unwrap();
        give(&h, 3, NetOp::Open, b"");
        let big = vec![1u8; WINDOW + 1];
        give(&h, 3, NetOp::Data, &big);
        let got = drain(&mut out, Duration::from_millis(300)).await;
        assert!(got.iter().any(|g| g.0 == "close"), "{got:?}");
        // Bytes for a stream that is gone are answered with a close.
        give(&h, 3, NetOp::Data, b"x");
        let got = drain(&mut out, Duration::from_millis(300)).await;
        assert!(got.iter().any(|g| g.0 == "close"), "{got:?}");
    }
}
