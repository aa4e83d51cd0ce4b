//! Accepting and serving client connections within the `connections:` bounds, for
//! `serve` (HTTP and gRPC) and the proxy alike.
//!
//! A rate limiter sees hostile traffic first, and the cheapest attacks on a server are
//! not requests but connections: thousands held idle, headers or bodies sent a byte a
//! second (slowloris), responses never read. Each is bounded here:
//!
//! - at most [`Connections::max`] connections per listener: past it, accepting waits for
//!   one to close (new clients wait in the kernel's backlog, as nginx's
//!   `worker_connections`);
//! - HTTP/1 headers (and a keep-alive connection's wait for its next request) within
//!   `header_timeout` (hyper's header read timeout); a new connection's first bytes
//!   (before hyper knows whether it speaks HTTP/1 or HTTP/2) within the same bound
//!   ([`Bounded`], armed where the connection is served);
//! - a request body within `body_timeout` ([`BodyTimeout`]);
//! - a response write that stalls longer than `send_timeout` closes the connection
//!   ([`Bounded`]).
//!
//! What it costs: one semaphore permit per connection and one branch per read and
//! write; a timer is armed only while a write is stalled or a first read awaited.
//!
//! Where connections run: [`serve_accepted`] accepts on the caller's runtime and hands
//! each connection to the [`Workers`] (single-threaded runtimes, one per CPU by
//! default; [`crate::workers`] says which serves which); on stop it asks every
//! connection to drain ([`Drain`]) and waits for them up to [`DRAIN_GRACE`].

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt;

use crate::config::Connections;
use crate::tls::{Acceptor, ServerTls};
use crate::tls_refusals::Reason;
use crate::workers::{WorkerStream, Workers};

/// How long a stopping server lets open requests finish (the longest `/v1/acquire`
/// wait) before it closes their connections.
pub const DRAIN_GRACE: Duration = Duration::from_secs(30);

/// The connection slots of one listener (shared by the proxy's worker threads): at
/// most [`Connections::max`] connections are open at once.
#[derive(Clone)]
pub struct Slots {
    permits: Arc<Semaphore>,
    bounds: Connections,
}

impl Slots {
    /// Slots for `bounds.max` connections.
    pub fn new(bounds: Connections) -> Slots {
        Slots {
            permits: Arc::new(Semaphore::new(bounds.max.clamp(1, Semaphore::MAX_PERMITS))),
            bounds,
        }
    }

    /// The bounds these slots enforce.
    pub fn bounds(&self) -> &Connections {
        &self.bounds
    }

    /// Accepts the next connection once a slot is free. Errors that concern one
    /// connection (reset before accept) are skipped; running out of file descriptors
    /// is logged and retried after a pause, as other connections close.
    pub async fn accept(&self, listener: &TcpListener) -> Accepted {
        let slot = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the slots' semaphore is never closed");
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    // A response goes out at once, not held back for the client's ACK
                    // of the one before (Nagle's algorithm adds up to a round trip to
                    // a request's latency; gRPC servers and nginx turn it off too).
                    let _ = stream.set_nodelay(true);
                    return Accepted {
                        stream,
                        slot,
                        peer,
                        send_timeout: Duration::from_micros(self.bounds.send_timeout),
                        first_read: Duration::from_micros(self.bounds.header_timeout),
                    };
                }
                Err(e) if per_connection(&e) => continue,
                Err(e) => {
                    tracing::error!("accept failed ({e}); retrying in 100ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// A connection accepted within its slot, not yet bounded in time.
pub struct Accepted {
    stream: TcpStream,
    slot: OwnedSemaphorePermit,
    peer: SocketAddr,
    send_timeout: Duration,
    first_read: Duration,
}

impl Accepted {
    /// Serves the connection with `serve` on one of `workers` (or here, without), its
    /// time bounds armed there: it must send its first bytes within `header_timeout`
    /// (before hyper knows whether it speaks HTTP/1 or HTTP/2, nothing else bounds
    /// that wait).
    fn serve_on<F>(
        self,
        workers: Option<&Workers>,
        serve: impl FnOnce(Bounded<WorkerStream>) -> F + Send + 'static,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let Accepted {
            stream,
            slot,
            peer,
            send_timeout,
            first_read,
        } = self;
        let start = move |stream| serve(Bounded::new(stream, slot, send_timeout, first_read));
        let Some(workers) = workers else {
            tokio::spawn(async move { start(WorkerStream::registered(stream)).await });
            return;
        };
        // A socket belongs to the runtime that registered it: it moves as a plain
        // socket and is registered again on the worker's.
        match stream.into_std() {
            Ok(stream) => workers.serve(stream, start),
            Err(e) => tracing::debug!("connection from {peer} lost on hand-off: {e}"),
        }
    }
}

fn per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A client connection that holds its slot until dropped, and fails a write stalled
/// longer than the send timeout and a first read that does not come in time.
pub struct Bounded<S> {
    inner: S,
    _slot: OwnedSemaphorePermit,
    send_timeout: Duration,
    /// Armed while a write is pending; fires the send timeout.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Armed until the first byte arrives.
    first_read: Option<Pin<Box<Sleep>>>,
}

impl<S> Bounded<S> {
    /// Reads fail with `TimedOut` unless the first byte arrives within `first_read`.
    fn new(
        inner: S,
        slot: OwnedSemaphorePermit,
        send_timeout: Duration,
        first_read: Duration,
    ) -> Self {
        Bounded {
            inner,
            _slot: slot,
            send_timeout,
            stalled: None,
            first_read: Some(Box::pin(tokio::time::sleep(first_read))),
        }
    }

    /// Reads fail with `TimedOut` unless a byte arrives within `limit` from now.
    fn expect_first_read(&mut self, limit: Duration) {
        self.first_read = Some(Box::pin(tokio::time::sleep(limit)));
    }

    /// Wraps one write attempt: pending arms the send timeout, progress disarms it.
    fn write_with<T>(
        &mut self,
        cx: &mut Context<'_>,
        attempt: impl FnOnce(Pin<&mut S>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>>
    where
        S: Unpin,
    {
        match attempt(Pin::new(&mut self.inner), cx) {
            Poll::Ready(r) => {
                self.stalled = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.send_timeout;
                let stalled = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match stalled.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client did not read its response within connections.send_timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    this.first_read = None;
                }
                Poll::Ready(r)
            }
            Poll::Pending => match this.first_read.as_mut().map(|s| s.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing within connections.header_timeout",
                ))),
                _ => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.write_with(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.write_with(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write_with(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write_with(cx, |s, cx| s.poll_shutdown(cx))
    }
}

/// How [`serve_http`] bounds a request body in time.
#[derive(Debug, Clone, Copy)]
pub enum BodyTimeout {
    /// The whole body within the bound, counted from the first wait for it (decision
    /// requests: small bodies; the headers before it have their own bound).
    Whole(Duration),
    /// At most the bound between two reads (the proxy: uploads of any size at a
    /// steady pace).
    BetweenReads(Duration),
}

/// A request body bounded in time by a [`BodyTimeout`]. The timer is armed only when
/// the body is not already there (a decision request usually arrives whole with its
/// headers), so the common request pays no timer: a timer per request cost 5% of
/// `serve`'s throughput.
pub struct StallBody<B> {
    body: B,
    limit: BodyTimeout,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> StallBody<B> {
    /// `body` bounded by `limit`.
    pub fn new(body: B, limit: BodyTimeout) -> Self {
        StallBody {
            body,
            limit,
            timer: None,
        }
    }
}

/// A request body that did not arrive within `connections.body_timeout`.
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(BodyTimedOut::MESSAGE)
    }
}

impl BodyTimedOut {
    /// What a client whose body timed out is told.
    pub const MESSAGE: &'static str =
        "the request body did not arrive within connections.body_timeout";
}

impl std::error::Error for BodyTimedOut {}

impl<B> http_body::Body for StallBody<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = bytes::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let BodyTimeout::BetweenReads(_) = this.limit {
                    this.timer = None;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let (BodyTimeout::Whole(limit) | BodyTimeout::BetweenReads(limit)) = this.limit;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Whether `error` (a body read's, anywhere in its chain) is a [`BodyTimeout`] firing.
pub fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut e = Some(error);
    while let Some(err) = e {
        if err.is::<BodyTimedOut>() {
            return true;
        }
        e = err.source();
    }
    false
}

/// Serves `app` (HTTP/1.1, and HTTP/2 with prior knowledge, at most `max_streams`
/// streams per connection) on `listener` within `slots`' bounds until `stop` resolves
/// (see [`serve_accepted`]). Its handlers do not ask who the peer is (no
/// `ConnectInfo`: an extension per request costs as much as a decision's headers).
pub async fn serve_http(
    listener: TcpListener,
    slots: Slots,
    app: Router,
    body: BodyTimeout,
    stop: impl Future<Output = ()>,
    workers: Option<&Workers>,
    tls: Option<ServerTls>,
) {
    let for_peer = move |_: SocketAddr| {
        let app = app.clone();
        move |req: Request<Body>| app.clone().oneshot(req)
    };
    serve_http_with(listener, slots, for_peer, body, stop, workers, tls).await;
}

/// [`serve_http`] with a handler made once per connection by `for_peer(peer)`, called
/// for each of its requests: no router and no per-request extension, for the proxy's
/// hot path.
pub async fn serve_http_with<M, H, F>(
    listener: TcpListener,
    slots: Slots,
    for_peer: M,
    body: BodyTimeout,
    stop: impl Future<Output = ()>,
    workers: Option<&Workers>,
    tls: Option<ServerTls>,
) where
    M: Fn(SocketAddr) -> H,
    H: Fn(Request<Body>) -> F + Send + 'static,
    F: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let hyper = HyperConns::new(slots.bounds(), body);
    let handshake = Duration::from_micros(slots.bounds().header_timeout);
    let serve_one = move |peer: SocketAddr| {
        let (hyper, handler) = (hyper.clone(), for_peer(peer));
        let tls = tls.as_ref().map(ServerTls::acceptor);
        move |io: Bounded<WorkerStream>, drain: Drain| async move {
            match tls {
                None => hyper.serve(io, peer, handler, drain).await,
                Some(tls) => {
                    if let Some(io) = handshake_within(handshake, tls, io, peer).await {
                        hyper.serve(io, peer, handler, drain).await
                    }
                }
            }
        }
    };
    serve_accepted(listener, slots, serve_one, stop, workers).await;
}

/// The TLS handshake of a connection from `peer`, within `limit` (the header
/// timeout: a client that starts one and stalls holds its slot no longer): `None`
/// when it fails (counted by reason, and logged at most once a second per listener:
/// a client's mistake, or a scanner's). The first
/// bytes of the protocol inside must then come within `limit` too: the ClientHello
/// satisfied the connection's first-read bound, and a client that completes the
/// handshake and goes silent would otherwise hold its slot for good.
pub async fn handshake_within(
    limit: Duration,
    tls: Acceptor,
    io: Bounded<WorkerStream>,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<Bounded<WorkerStream>>> {
    match tokio::time::timeout(limit, tls.tls.accept(io)).await {
        Ok(Ok(mut io)) => {
            io.get_mut().0.expect_first_read(limit);
            Some(io)
        }
        Ok(Err(e)) => {
            tls.refused(peer, Reason::of(&e), &e.to_string());
            None
        }
        Err(_) => {
            let detail = format!("not done within {limit:?}");
            tls.refused(peer, Reason::Timeout, &detail);
            None
        }
    }
}

/// hyper serving one connection (HTTP/1.1, and HTTP/2 with prior knowledge) within
/// the `connections:` bounds: header and body timeouts, HTTP/2 stream limit, drain.
#[derive(Clone)]
pub struct HyperConns {
    builder: Arc<Builder<TokioExecutor>>,
    body: BodyTimeout,
}

impl HyperConns {
    /// Connections bounded by `bounds`, request bodies by `body`.
    pub fn new(bounds: &Connections, body: BodyTimeout) -> Self {
        let mut builder = Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_micros(bounds.header_timeout));
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(bounds.max_streams);
        HyperConns {
            builder: Arc::new(builder),
            body,
        }
    }

    /// Serves the connection `io` from `peer`, each request with `handler`, until it
    /// ends or (gracefully) `drain` asks.
    pub async fn serve<I, H, F>(&self, io: I, peer: SocketAddr, handler: H, mut drain: Drain)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        H: Fn(Request<Body>) -> F + Send + 'static,
        F: Future<Output = Result<Response, Infallible>> + Send + 'static,
    {
        let body = self.body;
        let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
            handler(req.map(|b| Body::new(StallBody::new(b, body))))
        });
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), service);
        tokio::pin!(conn);
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            () = drain.requested() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        if let Err(e) = ended {
            tracing::debug!("connection from {peer} ended: {e}");
        }
    }
}

/// A connection whose first bytes were already read (into `prefix`): reads give them
/// back first, so another server can take the connection over from its start.
pub struct Rewind<S> {
    prefix: bytes::Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    /// `inner`, as if `prefix` had not been read from it yet.
    pub fn new(prefix: bytes::Bytes, inner: S) -> Self {
        Rewind { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.prefix.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = self.prefix.len().min(buf.remaining());
        buf.put_slice(&self.prefix.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts connections on `listener` within `slots`' bounds and serves each with
/// `serve_one(peer)(connection, drain)`, on `workers` (else on this runtime), until
/// `stop` resolves; then stops accepting, asks every connection to drain (HTTP/2
/// clients are sent GOAWAY), lets open requests finish for up to [`DRAIN_GRACE`], and
/// returns.
pub async fn serve_accepted<M, F, Fut>(
    listener: TcpListener,
    slots: Slots,
    serve_one: M,
    stop: impl Future<Output = ()>,
    workers: Option<&Workers>,
) where
    M: Fn(SocketAddr) -> F,
    F: FnOnce(Bounded<WorkerStream>, Drain) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = slots.accept(&listener) => accepted,
            _ = &mut stop => break,
        };
        let (serve, drain) = (serve_one(accepted.peer), Drain(drain_rx.clone()));
        accepted.serve_on(workers, move |io| serve(io, drain));
    }
    drop((listener, drain_rx));
    let _ = drain_tx.send(true);
    // Every connection holds a receiver until it ends.
    let _ = tokio::time::timeout(DRAIN_GRACE, drain_tx.closed()).await;
}

/// A connection's view of its server stopping: [`Drain::requested`] resolves when the
/// server stops accepting; the server waits (up to [`DRAIN_GRACE`]) until every
/// connection's `Drain` is dropped.
pub struct Drain(tokio::sync::watch::Receiver<bool>);

impl Drain {
    /// A drain never asked for: a connection served outside a listener's loop.
    pub fn never() -> Drain {
        static NEVER: std::sync::OnceLock<tokio::sync::watch::Sender<bool>> =
            std::sync::OnceLock::new();
        Drain(
            NEVER
                .get_or_init(|| tokio::sync::watch::channel(false).0)
                .subscribe(),
        )
    }

    /// Whether the server has asked its connections to drain.
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the server asks its connections to drain.
    pub async fn requested(&mut self) {
        let _ = self.0.wait_for(|draining| *draining).await;
    }
}

/// Warns when the process may not open `max` connections: its open-file limit
/// (Linux: `/proc/self/limits`) is below `max` plus a margin for its own files.
pub fn warn_if_fd_limit_below(max: usize) {
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else {
        return;
    };
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    if let Some(soft) = soft {
        if soft < max + 64 {
            tracing::warn!(
                "the open-file limit ({soft}) is below connections.max ({max}) plus 64; \
                 raise it (ulimit -n) or lower connections.max"
            );
        }
    }
}
