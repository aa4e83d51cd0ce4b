//! The upstream connections of one proxy worker: HTTP/1.1 keep-alive connections per
//! upstream address, reused while idle for less than [`IDLE_TIMEOUT`] — hyper's
//! ([`UpstreamPool`], for what hyper serves) and the fast path's raw sockets
//! ([`StreamPool`]).
//!
//! Each worker thread has its own pools (as each nginx worker has its own `keepalive`
//! cache), so the lock below is never contended and a request costs no hashing: the
//! routes name a handful of upstreams, found by a scan. A hyper connection goes back
//! to the pool as soon as its response head has arrived; it takes a new request once
//! that response's body has been read (hyper says when: `is_ready`). A raw socket goes
//! back once its exchange is complete, and is taken only when no byte or close came on
//! it meanwhile.

use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::http::uri::Authority;
use axum::http::{Request, Response, Version};
use bytes::BytesMut;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::routes::UpstreamTls;

/// The most connections one worker keeps per upstream (idle, or finishing a response
/// body); beyond it a connection closes once its response has been read.
const MAX_KEPT: usize = 256;

/// How long a kept connection may wait for its next request before it is closed
/// (hyper-util's pooled client's default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How many readings of `https://` routes' TLS settings keep connections at once
/// (each route's current one, and a few a reload replaced).
const TLS_SETTINGS_KEPT: usize = 64;

/// Every this many connections kept, the connections to every upstream are swept
/// (an upstream a reload removed is never asked for again).
const SWEEP_EVERY: u32 = 1024;

/// A connection a [`ConnCache`] can keep: hyper's client half, or the fast path's
/// raw socket.
pub(super) trait Reusable {
    /// The upstream is known to have closed it.
    fn closed(&self) -> bool;
    /// It can take a new request now.
    fn ready(&self) -> bool;
}

impl Reusable for SendRequest<Body> {
    fn closed(&self) -> bool {
        self.is_closed()
    }

    fn ready(&self) -> bool {
        self.is_ready()
    }
}

/// A kept connection and when it was kept.
struct Kept<C> {
    conn: C,
    since: tokio::time::Instant,
}

impl<C: Reusable> Kept<C> {
    /// Still worth keeping at `now`: open, and not idle for too long.
    fn alive(&self, now: tokio::time::Instant) -> bool {
        !self.conn.closed() && now.duration_since(self.since) < IDLE_TIMEOUT
    }
}

/// Why an upstream request failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The connection was not established within `connect_timeout`.
    ConnectTimedOut,
    /// The upstream could not be reached (refused, unknown host, ...).
    Unreachable(std::io::Error),
    /// The exchange failed after connecting (the upstream closed the connection, the
    /// request body failed or stalled, ...).
    Exchange(hyper::Error),
}

/// One worker's hyper connections to its upstreams (HTTP/2 clients and what the
/// fast path hands to hyper).
pub(super) struct UpstreamPool {
    kept: ConnCache<SendRequest<Body>>,
    /// The connections to `https://` upstreams, by the TLS settings they were made
    /// with ([`UpstreamTls::id`]; the most recent [`TLS_SETTINGS_KEPT`]).
    kept_tls: Mutex<Vec<(u64, std::sync::Arc<HyperCache>)>>,
    connect_timeout: Duration,
}

/// Kept hyper client connections.
type HyperCache = ConnCache<SendRequest<Body>>;

/// One worker's kept connections per upstream.
pub(super) struct ConnCache<C> {
    kept: Mutex<KeptConns<C>>,
}

/// The kept connections per upstream, and how many were kept since the last sweep.
struct KeptConns<C> {
    by_upstream: Vec<(Authority, Vec<Kept<C>>)>,
    since_sweep: u32,
}

impl UpstreamPool {
    /// An empty pool whose new connections must connect within `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        UpstreamPool {
            kept: ConnCache::default(),
            kept_tls: Mutex::default(),
            connect_timeout,
        }
    }

    /// Sends `req` (origin-form URI, with its Host) to `upstream` on an idle
    /// connection, else a new one; answers with the response head (its body streams
    /// on).
    ///
    /// A request an idle connection could not take (the upstream closed it meanwhile)
    /// comes back unsent and goes to the next one, as hyper's pooled client retries.
    pub async fn send(
        &self,
        upstream: &Authority,
        tls: Option<&UpstreamTls>,
        mut req: Request<Body>,
    ) -> Result<Response<Incoming>, Failure> {
        if req.version() == Version::HTTP_2 {
            // From an HTTP/2 client: the upstream speaks HTTP/1.1.
            *req.version_mut() = Version::HTTP_11;
        }
        let tls_kept = tls.map(|t| self.tls_cache(t.id));
        let kept = tls_kept.as_deref().unwrap_or(&self.kept);
        while let Some(mut conn) = kept.idle(upstream) {
            match conn.try_send_request(req).await {
                Ok(response) => {
                    kept.keep(upstream, conn);
                    return Ok(response);
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(Failure::Exchange(e.into_error())),
                },
            }
        }
        let mut conn = match tls {
            None => self.connect(upstream).await?,
            Some(tls) => self.connect_tls(upstream, tls).await?,
        };
        let response = conn.send_request(req).await.map_err(Failure::Exchange)?;
        kept.keep(upstream, conn);
        Ok(response)
    }

    /// The kept connections made with the TLS settings `id`; the caches of the
    /// oldest settings go (their connections close) past [`TLS_SETTINGS_KEPT`].
    fn tls_cache(&self, id: u64) -> std::sync::Arc<HyperCache> {
        let mut caches = self.kept_tls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, c)) = caches.iter().find(|(i, _)| *i == id) {
            return c.clone();
        }
        if caches.len() >= TLS_SETTINGS_KEPT {
            let oldest = (0..caches.len()).min_by_key(|&i| caches[i].0).unwrap_or(0);
            caches.swap_remove(oldest);
        }
        let cache = std::sync::Arc::new(ConnCache::default());
        caches.push((id, cache.clone()));
        cache
    }

    /// A new connection to `upstream`, its HTTP/1.1 exchange driven by a task of this
    /// worker.
    async fn connect(&self, upstream: &Authority) -> Result<SendRequest<Body>, Failure> {
        let stream = connect(upstream, 80, self.connect_timeout).await?;
        handshake(stream).await
    }

    /// [`UpstreamPool::connect`] over TLS; the handshake is bounded by the connect
    /// timeout too, and its failure (a certificate that does not verify) is an
    /// unreachable upstream (502), logged at warn since it is a setting to fix.
    async fn connect_tls(
        &self,
        upstream: &Authority,
        tls: &UpstreamTls,
    ) -> Result<SendRequest<Body>, Failure> {
        // One budget for the TCP connection and the handshake.
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let stream = connect(upstream, 443, self.connect_timeout).await?;
        let connector = tokio_rustls::TlsConnector::from(tls.config.config());
        let handshake_tls = connector.connect(tls.server_name.clone(), stream);
        let stream = match tokio::time::timeout_at(deadline, handshake_tls).await {
            Err(_) => return Err(Failure::ConnectTimedOut),
            Ok(Err(e)) => {
                warn_tls_failed(upstream, &e);
                return Err(Failure::Unreachable(e));
            }
            Ok(Ok(s)) => s,
        };
        handshake(stream).await
    }
}

impl<C> Default for ConnCache<C> {
    fn default() -> Self {
        ConnCache {
            kept: Mutex::new(KeptConns {
                by_upstream: Vec::new(),
                since_sweep: 0,
            }),
        }
    }
}

impl<C: Reusable> ConnCache<C> {
    /// An idle connection to `upstream`, dropping those the upstream has closed or
    /// that waited too long.
    pub fn idle(&self, upstream: &Authority) -> Option<C> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let conns = &mut kept
            .by_upstream
            .iter_mut()
            .find(|(a, _)| same(a, upstream))?
            .1;
        let now = tokio::time::Instant::now();
        conns.retain(|k| k.alive(now));
        let ready = conns.iter().position(|k| k.conn.ready())?;
        Some(conns.swap_remove(ready).conn)
    }

    /// Keeps `conn` for the next request to `upstream` (it becomes ready once the
    /// response it carries has been read).
    pub fn keep(&self, upstream: &Authority, conn: C) {
        let now = tokio::time::Instant::now();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.since_sweep += 1;
        if kept.since_sweep >= SWEEP_EVERY {
            kept.since_sweep = 0;
            for (_, conns) in &mut kept.by_upstream {
                conns.retain(|k| k.alive(now));
            }
            kept.by_upstream.retain(|(_, conns)| !conns.is_empty());
        }
        let by_upstream = &mut kept.by_upstream;
        let conns = match by_upstream.iter().position(|(a, _)| same(a, upstream)) {
            Some(i) => &mut by_upstream[i].1,
            None => {
                by_upstream.push((upstream.clone(), Vec::new()));
                &mut by_upstream.last_mut().expect("just pushed").1
            }
        };
        if conns.len() < MAX_KEPT {
            conns.push(Kept { conn, since: now });
        }
    }
}

/// Whether two upstreams are one: their text compared as is (`Authority`'s `==`
/// ignores case, byte by byte, and cost more than the rest of the lookup).
fn same(a: &Authority, b: &Authority) -> bool {
    a.as_str() == b.as_str()
}

/// A failed TLS handshake with an upstream: a warning (a setting to fix) at most once
/// a minute per upstream and worker, the rest at debug, so that a wrong certificate
/// under load does not flood the log.
fn warn_tls_failed(upstream: &Authority, e: &std::io::Error) {
    thread_local! {
        static LAST: std::cell::RefCell<Vec<(String, tokio::time::Instant)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let now = tokio::time::Instant::now();
    let due = LAST.with(|last| {
        let mut last = last.borrow_mut();
        match last.iter_mut().find(|(u, _)| u == upstream.as_str()) {
            Some((_, t)) if now.duration_since(*t) < Duration::from_secs(60) => false,
            Some((_, t)) => {
                *t = now;
                true
            }
            None => {
                last.push((upstream.as_str().to_string(), now));
                true
            }
        }
    });
    if due {
        tracing::warn!("TLS to upstream {upstream} failed: {e} (repeats within a minute at debug)");
    } else {
        tracing::debug!("TLS to upstream {upstream} failed: {e}");
    }
}

/// hyper's HTTP/1.1 client on `stream`, its exchange driven by a task of this worker.
async fn handshake<S>(stream: S) -> Result<SendRequest<Body>, Failure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (conn, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(Failure::Exchange)?;
    tokio::spawn(async move {
        if let Err(e) = driver.await {
            tracing::debug!("upstream connection ended: {e}");
        }
    });
    Ok(conn)
}

/// A new TCP connection to `upstream` (port `default_port` when it names none),
/// within `timeout`.
pub(super) async fn connect(
    upstream: &Authority,
    default_port: u16,
    timeout: Duration,
) -> Result<tokio::net::TcpStream, Failure> {
    // An IPv6 literal is bracketed in a URL, not in an address lookup.
    let host = upstream
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = upstream.port_u16().unwrap_or(default_port);
    // A name is looked up (off this thread); an address literal is used as is.
    let connecting = tokio::net::TcpStream::connect((host, port));
    let stream = tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| Failure::ConnectTimedOut)?
        .map_err(Failure::Unreachable)?;
    // Requests are written whole: no reason to wait for an ACK (nginx's tcp_nodelay).
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// One worker's raw connections to its upstreams (the HTTP/1.1 fast path's).
pub(super) struct StreamPool {
    cache: ConnCache<Stream>,
    connect_timeout: Duration,
}

/// A connection to an upstream, with what was read from it.
pub(super) struct Stream {
    pub io: TcpStream,
    pub buf: BytesMut,
}

impl Reusable for Stream {
    // Kept only between whole exchanges: always ready; a close is found on use.
    fn closed(&self) -> bool {
        false
    }

    fn ready(&self) -> bool {
        true
    }
}

impl Stream {
    /// Whether the upstream has neither closed this idle connection nor sent on it,
    /// as far as the events seen so far tell.
    fn still_open(&self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.io.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

impl StreamPool {
    /// Keeps `conn` for the next request to `upstream` (its exchange is complete).
    pub fn keep(&self, upstream: &Authority, conn: Stream) {
        self.cache.keep(upstream, conn);
    }

    /// No connections yet; new ones connect within `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> Self {
        StreamPool {
            cache: ConnCache::default(),
            connect_timeout,
        }
    }

    /// A kept connection to `upstream` that was not seen closed, or sent on while
    /// idle (late bytes of an earlier answer must not become the next one's), else a
    /// new one; `true` when kept.
    pub async fn get(&self, upstream: &Authority) -> Result<(Stream, bool), Failure> {
        while let Some(conn) = self.cache.idle(upstream) {
            if conn.still_open() {
                return Ok((conn, true));
            }
        }
        let io = connect(upstream, 80, self.connect_timeout).await?;
        let buf = BytesMut::with_capacity(4096);
        Ok((Stream { io, buf }, false))
    }
}
