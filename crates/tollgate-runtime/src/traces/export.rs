//! Getting finished spans to the collector without ever holding a request: a bounded
//! queue that a finished span enters without waiting or waking anyone (a full queue
//! drops it, counted, with one warning a minute), and one task that sends the queue in
//! batches through the OTLP exporter, when a batch is full or at each tick, one export
//! at a time, each within its deadline. A collector
//! that is down or slow costs the decisions nothing: the queue fills and spans are
//! dropped.
//!
//! The OTLP/HTTP exporter sends through [`OtlpHttp`], an HTTP/1.1 client of its own
//! whose TLS is the project's ([`crate::tls::ClientTls`]); the gRPC one through a
//! tonic channel over the same TLS.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot};

use crate::tls::ClientTls;

/// What became of finished spans (read by `/metrics`).
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Sent to the collector, accepted.
    pub exported: AtomicU64,
    /// Dropped as the queue was full.
    pub dropped: AtomicU64,
    /// Sent, and the export failed (refused, unreachable, past its deadline).
    pub failed: AtomicU64,
}

/// The spans waiting to be sent, shared by the threads that finish them and the task
/// that sends them.
#[derive(Debug)]
struct Waiting {
    spans: std::sync::Mutex<Vec<SpanData>>,
    capacity: usize,
    batch: usize,
    /// Told when a batch is full (the task sleeps until then, or its tick): a span
    /// that does not fill one wakes no thread, which cost more than the span itself.
    full: tokio::sync::Notify,
}

impl Waiting {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<SpanData>> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The span processor: a finished sampled span goes into the queue, or is dropped.
#[derive(Debug, Clone)]
pub struct Queue {
    waiting: Arc<Waiting>,
    /// Asks the task to send everything now (and says when it has).
    flushes: mpsc::Sender<oneshot::Sender<()>>,
    stats: Arc<ExportStats>,
    warn: Arc<Warnings>,
}

impl Queue {
    /// A queue of `capacity` spans, sent by a task spawned now on the current Tokio
    /// runtime in batches of at most `batch`, at least every `delay`, each export
    /// within `timeout`.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        capacity: usize,
        batch: usize,
        delay: Duration,
        timeout: Duration,
    ) -> (Queue, Arc<ExportStats>) {
        let waiting = Arc::new(Waiting {
            spans: std::sync::Mutex::new(Vec::new()),
            capacity,
            batch: batch.max(1),
            full: tokio::sync::Notify::new(),
        });
        let (flushes, flush_rx) = mpsc::channel(4);
        let stats = Arc::new(ExportStats::default());
        let sender = Sender {
            exporter,
            batch: batch.max(1),
            timeout,
            stats: stats.clone(),
            warn: Warnings::default(),
        };
        tokio::spawn(sender.run(waiting.clone(), flush_rx, delay));
        let queue = Queue {
            waiting,
            flushes,
            stats: stats.clone(),
            warn: Arc::default(),
        };
        (queue, stats)
    }

    /// Sends what is queued now, waiting at most `within`.
    pub async fn flush(&self, within: Duration) {
        let (done, waited) = oneshot::channel();
        let _ = tokio::time::timeout(within, async {
            if self.flushes.send(done).await.is_ok() {
                let _ = waited.await;
            }
        })
        .await;
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let mut spans = self.waiting.lock();
        if spans.len() >= self.waiting.capacity {
            drop(spans);
            let dropped = self.stats.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            self.warn.at_most_every_minute(|| {
                tracing::warn!(
                    dropped,
                    "traces: the export queue is full (the collector is slow or down): spans are dropped"
                )
            });
            return;
        }
        spans.push(span);
        let full = spans.len() == self.waiting.batch;
        drop(spans);
        if full {
            self.waiting.full.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// The task that exports.
struct Sender<E> {
    exporter: E,
    batch: usize,
    timeout: Duration,
    stats: Arc<ExportStats>,
    warn: Warnings,
}

impl<E: SpanExporter> Sender<E> {
    async fn run(
        mut self,
        waiting: Arc<Waiting>,
        mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
        delay: Duration,
    ) {
        let mut tick = tokio::time::interval(delay);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let done = tokio::select! {
                _ = waiting.full.notified() => None,
                _ = tick.tick() => None,
                flush = flushes.recv() => match flush {
                    Some(done) => Some(done),
                    None => break,
                },
            };
            // Everything queued, a batch at a time (one export at a time: while one
            // runs, the queue fills, and past its capacity spans are dropped).
            let mut spans = std::mem::take(&mut *waiting.lock());
            while !spans.is_empty() {
                self.export(&mut spans).await;
            }
            if let Some(done) = done {
                let _ = done.send(());
            }
        }
    }

    /// Exports the first batch of `spans`.
    async fn export(&mut self, spans: &mut Vec<SpanData>) {
        let batch: Vec<SpanData> = spans.drain(..spans.len().min(self.batch)).collect();
        let n = batch.len() as u64;
        let result = tokio::time::timeout(self.timeout, self.exporter.export(batch)).await;
        let error = match result {
            Ok(Ok(())) => {
                self.stats.exported.fetch_add(n, Ordering::Relaxed);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        let failed = self.stats.failed.fetch_add(n, Ordering::Relaxed) + n;
        self.warn.at_most_every_minute(|| {
            tracing::warn!(%error, failed, "traces: an export to the collector failed: its spans are lost")
        });
    }
}

/// One warning a minute at most, whichever thread asks.
#[derive(Debug)]
struct Warnings {
    since: tokio::time::Instant,
    /// When the next warning may be said, in ms since `since`.
    next_ms: AtomicU64,
}

impl Default for Warnings {
    fn default() -> Self {
        Warnings {
            since: tokio::time::Instant::now(),
            next_ms: AtomicU64::new(0),
        }
    }
}

impl Warnings {
    fn at_most_every_minute(&self, say: impl FnOnce()) {
        let now = self.since.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        if now >= next
            && (self.next_ms)
                .compare_exchange(next, now + 60_000, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            say();
        }
    }
}

/// The OTLP/HTTP exporter's client: one kept HTTP/1.1 connection to the collector
/// (plain, or TLS by [`ClientTls`]), made again when it fails; a response body is
/// read up to 4 MiB.
pub struct OtlpHttp {
    host: String,
    port: u16,
    authority: http::HeaderValue,
    tls: Option<(ClientTls, ServerName<'static>)>,
    conn: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl std::fmt::Debug for OtlpHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OtlpHttp({}:{})", self.host, self.port)
    }
}

impl OtlpHttp {
    /// A client for `url`'s host; `tls` for an `https://` URL.
    pub fn new(url: &http::Uri, tls: Option<ClientTls>) -> anyhow::Result<OtlpHttp> {
        let host = url.host().unwrap_or_default().trim_matches(['[', ']']);
        let https = url.scheme_str() == Some("https");
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match (https, tls) {
            (false, _) => None,
            (true, Some(tls)) => {
                let name = ServerName::try_from(host.to_string())
                    .map_err(|_| anyhow::anyhow!("{host}: not a DNS name or IP address"))?;
                Some((tls, name))
            }
            (true, None) => anyhow::bail!("an https:// endpoint without TLS settings"),
        };
        let authority = url.authority().map(|a| a.as_str()).unwrap_or(host);
        Ok(OtlpHttp {
            host: host.to_string(),
            port,
            authority: http::HeaderValue::from_str(authority)?,
            tls,
            conn: tokio::sync::Mutex::new(None),
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, HttpError> {
        match &self.tls {
            None => {
                let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
                tcp.set_nodelay(true)?;
                handshake(tcp).await
            }
            Some((tls, name)) => {
                handshake(tls.connect(name.clone(), &self.host, self.port).await?).await
            }
        }
    }
}

async fn handshake<S>(io: S) -> Result<SendRequest<Full<Bytes>>, HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

#[async_trait::async_trait]
impl HttpClient for OtlpHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let mut kept = self.conn.lock().await;
        let mut send = match kept.take() {
            Some(send) if !send.is_closed() => send,
            _ => self.connect().await?,
        };
        send.ready().await?;
        let (mut head, body) = request.into_parts();
        // Origin form on the wire, the authority in Host.
        head.uri = head
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()?;
        head.headers
            .insert(http::header::HOST, self.authority.clone());
        let response = send
            .send_request(http::Request::from_parts(head, Full::new(body)))
            .await?;
        let (head, body) = response.into_parts();
        let body = Limited::new(body, 4 << 20).collect().await?.to_bytes();
        *kept = Some(send);
        Ok(Response::from_parts(head, body))
    }
}
