//! The exporter: ended spans go into a bounded queue (a full queue drops the span and counts
//! it, so a call never waits for telemetry); a background task sends them in batches, as
//! OTLP/HTTP JSON, each send bounded by the export timeout. A batch that could not be sent
//! (refused, timed out, the collector down) is dropped and counted too: nothing retries, so
//! a collector that is slow or gone costs a bounded queue and one send at a time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use tokio::sync::mpsc;

use super::otlp;
use super::record::Finished;
use crate::config::traces::TraceConfig;

/// The most spans one request carries.
pub const BATCH_SIZE: usize = 512;

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What the queue carries: a span, or a request to send what is gathered now.
#[derive(Debug)]
enum Message {
    Span(Finished),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// What the exporter did, for `/metrics`.
#[derive(Debug, Default)]
pub struct Counts {
    /// Spans the collector accepted.
    pub exported: AtomicU64,
    /// Spans dropped: the queue was full, or their batch could not be sent.
    pub dropped: AtomicU64,
    /// Sends that failed (an error status, a timeout, no connection).
    pub failed_sends: AtomicU64,
}

/// The sending end; its task ends once every [`Exporter`] handle is gone and the queue is
/// sent.
#[derive(Debug)]
pub struct Exporter {
    tx: mpsc::Sender<Message>,
    counts: Arc<Counts>,
    endpoint: String,
}

impl Exporter {
    /// Start the background sender of `cfg` (on the current tokio runtime); `None` when no
    /// endpoint is configured: traces are off.
    pub fn start(cfg: &TraceConfig) -> Option<Arc<Exporter>> {
        let endpoint = cfg.endpoint.clone()?;
        let (tx, rx) = mpsc::channel(cfg.queue_size.max(1));
        let counts = Arc::new(Counts::default());
        let sender = Sender {
            cfg: cfg.clone(),
            endpoint: endpoint.clone(),
            client: client(),
            counts: counts.clone(),
        };
        tokio::spawn(sender.run(rx));
        Some(Arc::new(Exporter {
            tx,
            counts,
            endpoint,
        }))
    }

    /// Queue `span`, or drop and count it when the queue is full. Never waits.
    pub fn send(&self, span: Finished) {
        if self.tx.try_send(Message::Span(span)).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Send what is queued now, waiting at most `within` (a server's last spans before it
    /// exits; the export timeout still bounds the send).
    pub async fn flush(&self, within: Duration) {
        let (done, sent) = tokio::sync::oneshot::channel();
        let _ = tokio::time::timeout(within, async {
            if self.tx.send(Message::Flush(done)).await.is_ok() {
                let _ = sent.await;
            }
        })
        .await;
    }

    /// The counters.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Where spans go.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

struct Sender {
    cfg: TraceConfig,
    endpoint: String,
    client: HttpClient,
    counts: Arc<Counts>,
}

impl Sender {
    async fn run(self, mut rx: mpsc::Receiver<Message>) {
        let mut closed = false;
        while !closed {
            let mut flushed = None;
            let mut batch = match rx.recv().await {
                None => break,
                Some(Message::Span(s)) => vec![s],
                Some(Message::Flush(done)) => {
                    let _ = done.send(());
                    continue;
                }
            };
            let until = tokio::time::Instant::now() + self.cfg.schedule_delay;
            while batch.len() < BATCH_SIZE {
                tokio::select! {
                    m = rx.recv() => match m {
                        Some(Message::Span(s)) => batch.push(s),
                        Some(Message::Flush(done)) => { flushed = Some(done); break }
                        None => { closed = true; break }
                    },
                    _ = tokio::time::sleep_until(until) => break,
                }
            }
            self.send(batch).await;
            if let Some(done) = flushed {
                let _ = done.send(());
            }
        }
    }

    /// Send one batch within the export timeout; counted either way.
    async fn send(&self, batch: Vec<Finished>) {
        let n = batch.len() as u64;
        let body = otlp::encode(&self.cfg.service_name, &batch);
        let sent = tokio::time::timeout(self.cfg.timeout, self.post(body)).await;
        let problem = match sent {
            Ok(Ok(())) => {
                self.counts.exported.fetch_add(n, Ordering::Relaxed);
                return;
            }
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {} ms", self.cfg.timeout.as_millis()),
        };
        self.counts.dropped.fetch_add(n, Ordering::Relaxed);
        let failures = self.counts.failed_sends.fetch_add(1, Ordering::Relaxed);
        // Logged the first time and then every hundredth: a collector that is gone must
        // not fill the log.
        if failures.is_multiple_of(100) {
            tracing::warn!(endpoint = %self.endpoint, spans = n, error = %problem, "traces: a batch of spans could not be exported and was dropped");
        }
    }

    async fn post(&self, body: Vec<u8>) -> Result<(), String> {
        let mut request = hyper::Request::post(&self.endpoint)
            .header(hyper::header::CONTENT_TYPE, "application/json");
        for (k, v) in &self.cfg.headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let answer = self
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = answer.status();
        // The answer's body (a partial success at most) is not read further.
        drop(answer);
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {status}"))
        }
    }
}

/// HTTPS (rustls on ring, the system's roots) or plain HTTP.
fn client() -> HttpClient {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let https = match hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_native_roots(provider.clone())
    {
        Ok(b) => b,
        Err(_) => hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        ),
    }
    .https_or_http()
    .enable_http1()
    .build();
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(https)
}
