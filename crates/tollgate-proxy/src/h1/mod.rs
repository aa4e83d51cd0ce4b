//! The proxy's HTTP/1.1 fast path: a client connection served by one task that reads
//! each request head into the connection's buffer, decides on its parsed headers (no
//! header map is built), writes the upstream request head from the parsed slices,
//! streams the bodies (a chunked one decoded strictly and chunked again), and writes
//! the response head from the upstream's with its own framing headers, as nginx does.
//!
//! What it takes: HTTP/1.1 requests in origin form, on every route (under `cost:`
//! the response's usage is read from its head or its body as it passes, and the
//! body's last bytes wait for the charge). Anything else (HTTP/2 with prior
//! knowledge, HTTP/1.0, an absolute-form target, an `Upgrade`, an `Expect` other than
//! `100-continue`) is handed with the rest of the connection to hyper, from that
//! request on (see `server`), so every request gets the same answer either way.
//!
//! The upstream side keeps its own HTTP/1.1 connections per worker
//! ([`UpstreamPool`](crate::upstream::UpstreamPool)).
//! A kept connection the upstream closed while idle is found when it is taken (for a
//! request that cannot be sent twice) or when its answer is an immediate end (a
//! request without a body and of an idempotent method is then sent on the next).

mod body;
mod message;

pub(super) use self::message::has_token;

use std::mem::MaybeUninit;
use std::time::Duration;

use axum::http::uri::Authority;
use axum::http::StatusCode;
use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use self::body::BodyError;
use self::message::{BadHead, Framing, RequestHead, ResponseHead, MAX_HEAD, MAX_HEADERS};
use super::admission::admit;
use super::ask_usage::Unasked;
use super::cost::{Metered, Outcome, Pending};
use super::forwarding::{body_stalled, forwarding, upstream_failed, Peer, TIMED_OUT, UNREACHABLE};
use super::limits::{ConnPermit, Passed};
use super::observe::RequestObserver;
use super::problem::no_route;
use super::problem::{problem, Problem};
use super::routes::{Route, RouteTable};
use super::upstream::{Failure, Stream};
use super::worker::Proxy;
use tollgate_runtime::connections::Drain;

/// How long a connection closed with unread input is still read from (and what it
/// sends discarded), so that the client sees the answer before the close (nginx's
/// lingering close).
const LINGER: Duration = Duration::from_secs(2);

/// Serves `io` from `peer` until it closes, fails, or `drain` asks (between
/// requests). `Some`: a request the fast path does not take arrived; the connection
/// and what was read of it (from that request on) go to hyper.
pub(crate) async fn serve<C: Client>(
    proxy: &Proxy,
    peer: &Peer,
    mut io: C,
    drain: &mut Drain,
) -> Option<(C, Bytes)> {
    let mut conn = Conn {
        buf: BytesMut::with_capacity(4096),
        out: Vec::with_capacity(1024),
        up_head: Vec::with_capacity(1024),
        closing: false,
    };
    let header_timeout = Duration::from_micros(proxy.bounds.header_timeout);
    loop {
        let end = match read_head(&mut io, &mut conn.buf, header_timeout, drain).await {
            Ok(end) => end,
            Err(HeadWait::Ended) => return None,
            Err(HeadWait::TooLarge) => {
                let p = problem(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "the request head is too large",
                    None,
                );
                refuse(&mut io, &mut conn.out, &p, false).await;
                return None;
            }
        };
        // A server draining ends each connection after its answer, and says so.
        conn.closing = drain.is_requested();
        let next = loop {
            match conn.request(proxy, peer, &mut io, end).await {
                // Admission reads the body first (a `cost:` route reserving what the
                // request declares): the head is read again once it is all here.
                Next::ReadBody(want) => {
                    let stall = Duration::from_micros(proxy.bounds.body_timeout);
                    match read_at_least(&mut io, &mut conn.buf, want, stall).await {
                        Ok(()) => {}
                        // As a body that stalls on its way upstream is answered.
                        Err(BodyError::Stalled) => {
                            break refuse(&mut io, &mut conn.out, &body_stalled(), false).await;
                        }
                        Err(_) => break Next::Close,
                    }
                }
                next => break next,
            }
        };
        match next {
            Next::KeepAlive => {}
            Next::Close => {
                // A FIN after the last answer, not a reset that could lose it.
                let _ = io.shutdown().await;
                return None;
            }
            Next::Hyper => {
                let read = conn.buf.split().freeze();
                return Some((io, read));
            }
            Next::ReadBody(_) => unreachable!("read above"),
        }
    }
}

/// The answer to a request head that cannot be served.
fn bad_head(bad: BadHead) -> Problem {
    let (status, detail) = match bad {
        BadHead::Malformed(what) => (StatusCode::BAD_REQUEST, what),
        BadHead::Coding => (
            StatusCode::NOT_IMPLEMENTED,
            "only the chunked transfer coding is taken",
        ),
    };
    problem(status, detail, None)
}

/// Under `cost:`, the body admission reads (a request that may state its bound: one
/// with a length up to `cost.max_body`, not waiting for `100 Continue`), from `buf`
/// after the head's `end`; `Err(want)`: read until `buf` holds `want` bytes first.
fn body_for_admission<'b>(
    buf: &'b [u8],
    end: usize,
    route: &Route,
    framing: Framing,
    head: &RequestHead,
) -> Result<Option<&'b [u8]>, usize> {
    match (route.limits.reads_body(), framing) {
        (Some(max), Framing::Length(n)) if n > 0 && n <= max as u64 && !head.continue_expected => {
            let want = end + n as usize;
            match buf.get(end..want) {
                Some(body) => Ok(Some(body)),
                None => Err(want),
            }
        }
        _ => Ok(None),
    }
}

/// Reads until `buf` holds `want` bytes, each read within `stall`: `Stalled` when
/// one does not come in time, `Read` when the client closes or fails first.
async fn read_at_least(
    io: &mut impl Client,
    buf: &mut BytesMut,
    want: usize,
    stall: Duration,
) -> Result<(), BodyError> {
    while buf.len() < want {
        buf.reserve(want - buf.len());
        match tokio::time::timeout(stall, io.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            Ok(Ok(_)) => return Err(BodyError::Read(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(Err(e)) => return Err(BodyError::Read(e)),
            Err(_) => return Err(BodyError::Stalled),
        }
    }
    Ok(())
}

/// A client connection (a socket bounded in time by `connections:`; a pipe in
/// fuzzing).
pub(crate) trait Client: AsyncRead + AsyncWrite + Unpin {}

impl<C: AsyncRead + AsyncWrite + Unpin> Client for C {}

/// A connection's buffers, kept across its requests.
struct Conn {
    /// What was read from the client and not yet used.
    buf: BytesMut,
    /// What is written to the client next.
    out: Vec<u8>,
    /// The upstream request head.
    up_head: Vec<u8>,
    /// The connection ends after this request's answer.
    closing: bool,
}

/// What a connection does after a request.
enum Next {
    KeepAlive,
    Close,
    /// The request goes to hyper, with the rest of the connection.
    Hyper,
    /// Admission needs the request's body: read until the buffer holds this many
    /// bytes, then serve the request again.
    ReadBody(usize),
}

/// Why no request head came.
enum HeadWait {
    /// The client closed, failed, was silent past the header timeout, or the server
    /// is draining.
    Ended,
    /// The head outgrew [`MAX_HEAD`].
    TooLarge,
}

/// Reads until `buf` holds a whole head, within `limit` (the wait for a kept-alive
/// connection's next request included); returns the head's length. A drain ends an
/// idle wait.
async fn read_head(
    io: &mut impl Client,
    buf: &mut BytesMut,
    limit: Duration,
    drain: &mut Drain,
) -> Result<usize, HeadWait> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut scanned = 0;
    loop {
        // Empty lines before a request line are ignored (RFC 9112 §2.2).
        while let Some(n) = message::empty_line(buf) {
            buf.advance(n);
            scanned = 0;
        }
        if let Some(end) = message::head_end(buf, scanned) {
            return Ok(end);
        }
        // The next scan starts where this one could not find the end.
        scanned = buf.len().saturating_sub(3);
        if buf.len() >= MAX_HEAD {
            return Err(HeadWait::TooLarge);
        }
        buf.reserve(4096);
        let idle = buf.is_empty();
        let read = tokio::time::timeout_at(deadline, io.read_buf(buf));
        let read = if idle {
            tokio::select! {
                read = read => read,
                () = drain.requested() => return Err(HeadWait::Ended),
            }
        } else {
            read.await
        };
        match read {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(HeadWait::Ended),
        }
    }
}

impl Conn {
    /// Serves the request whose head is `buf[..end]`.
    async fn request(
        &mut self,
        proxy: &Proxy,
        peer: &Peer,
        io: &mut impl Client,
        end: usize,
    ) -> Next {
        // Not initialised: httparse writes those it fills (3 KB less to clear per
        // request).
        let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        match req.parse_with_uninit_headers(&self.buf[..end], &mut headers) {
            Ok(httparse::Status::Complete(_)) => {}
            Err(httparse::Error::Version) => return Next::Hyper,
            Err(httparse::Error::TooManyHeaders) => {
                let p = problem(
                    StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    "too many request headers",
                    None,
                );
                return refuse(io, &mut self.out, &p, false).await;
            }
            _ => {
                let p = problem(StatusCode::BAD_REQUEST, "malformed request head", None);
                return refuse(io, &mut self.out, &p, false).await;
            }
        }
        let (Some(method), Some(target)) = (req.method, req.path) else {
            return Next::Hyper;
        };
        // A fragment is not part of what is asked for (hyper drops it too).
        let target = memchr::memchr(b'#', target.as_bytes()).map_or(target, |f| &target[..f]);
        if req.version != Some(1) || !target.starts_with('/') {
            return Next::Hyper;
        }
        let to_head = method == "HEAD";
        let head = match RequestHead::of(req.headers) {
            Ok(head) if head.unusual => return Next::Hyper,
            Ok(head) => head,
            Err(bad) => return refuse(io, &mut self.out, &bad_head(bad), to_head).await,
        };
        let framing = head.framing();
        // The answer instead of forwarding: the connection goes on only when no
        // request body is left unread.
        let instead = head.has_body() || head.close || self.closing;
        let table = proxy.table.load_full();
        let path = memchr::memchr(b'?', target.as_bytes()).map_or(target, |q| &target[..q]);
        let Some(route) = table.route_for(head.host, path) else {
            return self.answer(io, end, &no_route(), instead, to_head).await;
        };
        if route.upstream_tls().is_some() {
            // Its raw upstream sockets are plaintext: hyper's pool speaks TLS.
            return Next::Hyper;
        }
        let body = match body_for_admission(&self.buf, end, route, framing, &head) {
            Ok(body) => body,
            Err(want) => return Next::ReadBody(want),
        };
        let mut observed =
            RequestObserver::start(proxy.tracing.as_ref(), &*req.headers, method, path, route);
        let mut passed = match admit(&table, route, peer, path, req.headers, body).await {
            Ok(passed) => passed,
            Err(answer) => {
                observed.refused(answer.status.as_u16());
                return self.answer(io, end, &answer, instead, to_head).await;
            }
        };
        let (asked, sent_framing) = asked_body(route, (path, body), &mut passed, framing);
        let trace = observed.upstream();
        write_upstream_head(
            &mut self.up_head,
            (&table, route, peer),
            (method, target),
            &req,
            (&head, sent_framing),
            trace.as_ref(),
        );
        let request = Request {
            framing: sent_framing,
            to_head,
            close: head.close || self.closing,
            expect_continue: head.continue_expected,
            // Sent again on a second connection when the first was closed unseen.
            has_body: head.has_body(),
            resendable: !head.has_body() && idempotent(method),
            observed,
        };
        let route = route.clone();
        self.buf.advance(end);
        if let (Some(asked), Framing::Length(n)) = (asked, framing) {
            replace_body(&mut self.buf, n, &asked);
        }
        self.exchange(proxy, &table, &route, io, request, passed)
            .await
    }

    /// Writes `answer` instead of forwarding the request whose head is
    /// `buf[..end]`; `close` ends the connection.
    async fn answer(
        &mut self,
        io: &mut impl Client,
        end: usize,
        answer: &Problem,
        close: bool,
        to_head: bool,
    ) -> Next {
        self.buf.advance(end);
        self.reply(io, answer, close, to_head).await
    }

    /// Sends the request upstream and its response back to the client, with the
    /// rate-limit headers of `passed`, whose permits are held until the response
    /// body has been sent.
    async fn exchange(
        &mut self,
        proxy: &Proxy,
        table: &RouteTable,
        route: &Route,
        io: &mut impl Client,
        mut req: Request,
        mut passed: Passed,
    ) -> Next {
        let sent = tokio::time::timeout(
            table.upstream_timeout,
            self.send(proxy, route.upstream(), io, &req),
        )
        .await;
        let (mut up, head_len, body_sent) = match sent {
            Ok(Ok(sent)) => sent,
            Ok(Err(Sent::Client(e))) => return self.body_failed(io, &mut req, passed, e).await,
            failed => {
                let failure = match failed {
                    Ok(Err(Sent::Connect(f))) => f.answer(),
                    Err(_) => TIMED_OUT,
                    _ => UNREACHABLE,
                };
                return self
                    .upstream_failure(io, route, &mut req, passed, failure)
                    .await;
            }
        };
        let mut headers = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let Some((resp, code, mut head)) =
            parse_response_head(&up.buf[..head_len], &mut headers, req.to_head)
        else {
            return self
                .upstream_failure(io, route, &mut req, passed, UNREACHABLE)
                .await;
        };
        req.observed.upstream_answered(Ok(code));
        let mut adaptive = passed.adaptive.take();
        if let (Some(hold), Ok(status)) = (&mut adaptive, StatusCode::from_u16(code)) {
            hold.answered(status);
        }
        let (mut metering, mut strip) = match passed.pending.take() {
            Some(pending) => start_metering(pending, resp.headers, &head).await,
            None => (None, None),
        };
        let framing = head.framing;
        if strip.is_some() && framing != Framing::UntilClose {
            // The usage taken out changes the body's length: it goes chunked.
            (head.framing, head.length) = (Framing::Chunked, None);
        }
        // A request body the upstream answered before reading all of: the client's
        // connection cannot go on.
        let keep_client = !req.close && head.framing != Framing::UntilClose && body_sent;
        let out = &mut self.out;
        let reason = resp.reason.unwrap_or("");
        write_response_head(
            out,
            (code, reason),
            resp.headers,
            &head,
            &passed,
            keep_client,
        );
        up.buf.advance(head_len);
        // A limit_conn permit goes back before the client has the whole response:
        // released after it, a client that asks again at once (through this proxy, or
        // another on the same Redis) could find its own finished request still counted.
        let holds_permit = passed.permit.is_some();
        let from = (&mut up.io, &mut up.buf);
        let charged = (metering.as_mut(), strip.as_mut());
        let mut passed_on = pass_response(framing, from, io, out, charged, holds_permit).await;
        // The end of the response waits for its charge (cut short, the body settles
        // as disconnected when `metering` drops) and for its permit's release.
        if passed_on.is_ok() && (metering.is_some() || holds_permit) {
            passed_on = end_response(io, out, metering, passed.permit.take()).await;
        }
        // The adaptive limit's permit (and a limit_conn permit of a response cut
        // short) ends with the response.
        drop((passed, adaptive));
        if let Err(e) = passed_on {
            tracing::debug!("response body cut short: {e:?}");
            return Next::Close;
        }
        if head.reusable && up.buf.is_empty() {
            proxy.conns.keep(route.upstream(), up);
        }
        if keep_client {
            Next::KeepAlive
        } else {
            Next::Close
        }
    }

    /// Answers for a request body that failed on its way upstream (the connection
    /// closes after it); nothing when the client went away mid-body.
    async fn body_failed(
        &mut self,
        io: &mut impl Client,
        req: &mut Request,
        passed: Passed,
        e: BodyError,
    ) -> Next {
        // The permits go back before the answer (and a close's linger).
        drop(passed);
        let answer = match e {
            BodyError::Stalled => body_stalled(),
            BodyError::BadChunk => problem(StatusCode::BAD_REQUEST, "malformed chunked body", None),
            // The client went away mid-body.
            BodyError::Read(_) | BodyError::Write => return Next::Close,
        };
        req.observed.answered(answer.status.as_u16());
        self.reply(io, &answer, true, req.to_head).await
    }

    /// Answers for an upstream that failed before its response (`failure`): the
    /// limits' permits go back, the adaptive limit and the charge learn of it.
    async fn upstream_failure(
        &mut self,
        io: &mut impl Client,
        route: &Route,
        req: &mut Request,
        mut passed: Passed,
        failure: (StatusCode, &str),
    ) -> Next {
        // The connection goes on only when the request body was not left half read.
        let close = req.close || req.has_body;
        let (adaptive, pending) = (passed.adaptive.take(), passed.pending.take());
        drop(passed);
        let answer = upstream_failed(route, adaptive, pending, failure);
        req.observed.upstream_answered(Err(answer.status.as_u16()));
        self.reply(io, &answer, close, req.to_head).await
    }

    /// Writes one of the proxy's own answers (`to_head`: to a HEAD request); `close`
    /// ends the connection after it (see [`refuse`]).
    async fn reply(
        &mut self,
        io: &mut impl Client,
        answer: &Problem,
        close: bool,
        to_head: bool,
    ) -> Next {
        if close {
            return refuse(io, &mut self.out, answer, to_head).await;
        }
        self.out.clear();
        message::with_date(|d| answer.write(&mut self.out, d, false, to_head));
        match io.write_all(&self.out).await {
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Close,
        }
    }

    /// Writes the request (head, then body from the client) to a connection to
    /// `upstream` and reads the response head; returns the connection and the head's
    /// length in its buffer.
    async fn send(
        &mut self,
        proxy: &Proxy,
        upstream: &Authority,
        io: &mut impl Client,
        req: &Request,
    ) -> Result<(Stream, usize, bool), Sent> {
        loop {
            let (mut up, reused) = proxy.conns.get(upstream).await.map_err(Sent::Connect)?;
            let mut body_sent = true;
            if !req.has_body {
                if up.io.write_all(&self.up_head).await.is_err() {
                    if reused && req.resendable {
                        continue;
                    }
                    return Err(Sent::Upstream);
                }
            } else {
                // Sent even when some of the body is already here (RFC 9110 §10.1.1
                // allows either): whether it is depends on how reads fall.
                if req.expect_continue {
                    io.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                        .await
                        .map_err(|_| Sent::Client(BodyError::Write))?;
                }
                let stall = Duration::from_micros(proxy.bounds.body_timeout);
                let sent = body::pass(
                    req.framing,
                    io,
                    &mut self.buf,
                    &mut up.io,
                    &mut self.up_head,
                    Some(stall),
                )
                .await;
                match sent {
                    Ok(()) => {}
                    // The upstream stopped reading: maybe it answered early (413, 401).
                    Err(BodyError::Write) => body_sent = false,
                    Err(e) => return Err(Sent::Client(e)),
                }
            }
            match response_head(&mut up).await {
                Ok(end) => return Ok((up, end, body_sent)),
                Err(ResponseWait::Nothing) if reused && req.resendable => continue,
                Err(_) => return Err(Sent::Upstream),
            }
        }
    }
}

/// The upstream request head: the request line with the upstream's path prefix,
/// the headers that pass this hop, Host when the client sent none, the
/// forwarding headers and the body's framing.
fn write_upstream_head(
    out: &mut Vec<u8>,
    (table, route, peer): (&RouteTable, &Route, &Peer),
    (method, target): (&str, &str),
    req: &httparse::Request<'_, '_>,
    (head, framing): (&RequestHead<'_>, Framing),
    trace: Option<&tollgate_runtime::traces::Outgoing>,
) {
    out.clear();
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(route.upstream_prefix().as_bytes());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let fwd = forwarding(table, peer, req.headers);
    // The proxy writes these itself (the framing, the forwarding headers); a
    // 100-continue is answered here.
    let skip: &[&str] = if fwd.append {
        &[
            "x-forwarded-for",
            "expect",
            "content-length",
            "transfer-encoding",
        ]
    } else {
        &[
            "x-forwarded-for",
            "forwarded",
            "x-forwarded-proto",
            "expect",
            "content-length",
            "transfer-encoding",
        ]
    };
    let named = message::connection_named(req.headers);
    for h in req.headers.iter() {
        // With traces on, the proxy's trace context replaces the client's.
        if message::passes(h.name, &named, skip) && !trace.is_some_and(|t| t.replaces(h.name)) {
            message::header(out, h.name.as_bytes(), h.value);
        }
    }
    for (name, value) in trace.iter().flat_map(|t| &t.headers) {
        message::header(out, name.as_bytes(), value.as_bytes());
    }
    if head.host.is_none() {
        message::header(out, b"host", route.upstream_host().as_bytes());
    }
    message::header(out, b"x-forwarded-for", fwd.xff.as_bytes());
    message::header(out, b"forwarded", fwd.forwarded.as_bytes());
    if let Some(proto) = &fwd.proto {
        message::header(out, b"x-forwarded-proto", proto.as_bytes());
    }
    message::framing_header(out, framing);
    out.extend_from_slice(b"\r\n");
}

/// What the fast path keeps of a request once its head is let go.
struct Request {
    framing: Framing,
    has_body: bool,
    to_head: bool,
    close: bool,
    expect_continue: bool,
    resendable: bool,
    /// Its answer and upstream time as counted, its trace spans (ended as it is
    /// dropped).
    observed: RequestObserver,
}

/// Why a request did not get its response head.
enum Sent {
    /// No connection to the upstream.
    Connect(Failure),
    /// The client's body did not come.
    Client(BodyError),
    /// The upstream closed, failed, or sent something other than a response head.
    Upstream,
}

/// Why no response head came.
enum ResponseWait {
    /// The connection ended before any byte of a response.
    Nothing,
    /// It failed, or what came is not a response head.
    Broken,
}

/// Reads the response head into `up`'s buffer, passing over interim (1xx) responses;
/// returns its length.
async fn response_head(up: &mut Stream) -> Result<usize, ResponseWait> {
    up.buf.clear();
    loop {
        if let Some(end) = message::head_end(&up.buf, 0) {
            // "HTTP/1.1 1xx": an interim response, not forwarded (a 100 Continue is
            // the proxy's to send).
            if up.buf.get(9) == Some(&b'1') && up.buf.starts_with(b"HTTP/1.") {
                up.buf.advance(end);
                continue;
            }
            return Ok(end);
        }
        if up.buf.len() >= MAX_HEAD {
            return Err(ResponseWait::Broken);
        }
        let nothing = up.buf.is_empty();
        match body::fill(&mut up.io, &mut up.buf, None).await {
            Ok(()) => {}
            Err(_) if nothing => return Err(ResponseWait::Nothing),
            Err(_) => return Err(ResponseWait::Broken),
        }
    }
}

/// Writes `answer` and closes the connection, reading (and discarding) what the
/// client still sends for up to [`LINGER`], so that the answer is not lost to a
/// reset.
async fn refuse(io: &mut impl Client, out: &mut Vec<u8>, answer: &Problem, to_head: bool) -> Next {
    out.clear();
    message::with_date(|d| answer.write(out, d, true, to_head));
    if io.write_all(out).await.is_ok() && io.shutdown().await.is_ok() {
        // What the client still sends is read into `out`, not into an array on this
        // future: every request's future holds this one's space.
        out.resize(4096, 0);
        let linger = async {
            while let Ok(n) = io.read(out).await {
                if n == 0 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, linger).await;
    }
    Next::Close
}

/// The upstream's response head in `buf`, its status and what it says of the
/// response (to a HEAD request when `to_head`); `None` when it is not one a proxy
/// can pass on.
fn parse_response_head<'h, 'b>(
    buf: &'b [u8],
    headers: &'h mut [MaybeUninit<httparse::Header<'b>>; MAX_HEADERS],
    to_head: bool,
) -> Option<(httparse::Response<'h, 'b>, u16, ResponseHead)> {
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, headers);
    match (parsed, resp.code, resp.version) {
        (Ok(httparse::Status::Complete(_)), Some(code), Some(version)) => {
            let head = ResponseHead::of(code, version, resp.headers, to_head)?;
            Some((resp, code, head))
        }
        _ => None,
    }
}

/// An OpenAI stream that does not ask for its usage goes upstream asking (see
/// `ask_for_usage`) when admission made it a request to charge: the body sent in
/// place of `body` (of `framing`), and its framing; its response is then marked for
/// the usage to be taken out.
fn asked_body(
    route: &Route,
    (path, body): (&str, Option<&[u8]>),
    passed: &mut Passed,
    framing: Framing,
) -> (Option<Vec<u8>>, Framing) {
    let Some(pending) = passed.pending.as_mut() else {
        return (None, framing);
    };
    match body.and_then(|b| route.limits.ask_for_usage(path, b)) {
        Some(asked) => {
            pending.usage_asked = true;
            let length = Framing::Length(asked.len() as u64);
            (Some(asked), length)
        }
        _ => (None, framing),
    }
}

/// Replaces the first `n` bytes of `buf` (a body admission read whole) with `with`.
fn replace_body(buf: &mut BytesMut, n: u64, with: &[u8]) {
    let rest = buf.split_off(n as usize);
    buf.clear();
    buf.extend_from_slice(with);
    buf.unsplit(rest);
}

/// Whether a request of `method` may be sent again (without a body) on a second
/// connection when the first was closed unseen.
fn idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// Passes a response body of `framing` on to the client: metered when it is charged,
/// edited when its usage is to be taken out, its end held (in `out`) while a charge
/// or a `limit_conn` permit is pending.
async fn pass_response(
    framing: Framing,
    from: (&mut tokio::net::TcpStream, &mut BytesMut),
    io: &mut impl Client,
    out: &mut Vec<u8>,
    charged: (Option<&mut Metered>, Option<&mut Unasked>),
    holds_permit: bool,
) -> Result<(), BodyError> {
    match charged {
        (Some(metered), Some(strip)) => {
            body::pass_stripped(framing, from, io, out, None, (Some(metered), strip)).await
        }
        (metered, _) => {
            let end = match (metered, holds_permit) {
                (Some(metered), _) => body::End::Metered(metered),
                (None, true) => body::End::Hold,
                (None, false) => body::End::Send,
            };
            body::pass_metered(framing, from.0, from.1, io, out, None, end).await
        }
    }
}

/// Under `cost:`, a usage in the response's headers settles now; one in its body is
/// metered as the body passes (settled as it ends, or when the client goes away).
/// With it, the filter that takes out the usage the proxy asked for (see `ask_usage`).
async fn start_metering(
    pending: Pending,
    headers: &[httparse::Header<'_>],
    head: &ResponseHead,
) -> (Option<Metered>, Option<Unasked>) {
    let body = !matches!(head.framing, Framing::Empty | Framing::Length(0));
    match pending.cost().in_headers(headers) {
        Some(outcome) => pending.settle(outcome).await,
        None => match pending.cost().meter(headers) {
            Some(meter) if body => {
                // The usage the proxy asked for is not its client's (see `ask_usage`).
                let strip = (pending.usage_asked && meter.is_event_stream())
                    .then(|| Unasked::new(pending.cost().max_body));
                return (Some(Metered::new(pending, meter)), strip);
            }
            _ => pending.settle(Outcome::Missing).await,
        },
    }
    (None, None)
}

/// Writes the response's head for the client into `out`: the upstream's status and
/// headers less the hop-by-hop ones, the route's rate-limit headers (in place of the
/// upstream's of the same name), a `Date` if it had none, and the framing.
fn write_response_head(
    out: &mut Vec<u8>,
    (code, reason): (u16, &str),
    headers: &[httparse::Header<'_>],
    head: &ResponseHead,
    passed: &Passed,
    keep_client: bool,
) {
    out.clear();
    message::status_line(out, code, reason);
    let named = message::connection_named(headers);
    let ours = |name: &str| (passed.headers.keys()).any(|k| k.as_str().eq_ignore_ascii_case(name));
    for h in headers.iter() {
        if message::passes(h.name, &named, &message::FRAMING) && !ours(h.name) {
            message::header(out, h.name.as_bytes(), h.value);
        }
    }
    if !head.dated {
        message::with_date(|d| message::header(out, b"date", d));
    }
    for (name, value) in &passed.headers {
        message::header(out, name.as_str().as_bytes(), value.as_bytes());
    }
    head.write_framing(out, code);
    if !keep_client {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The end of a response held back for its charge and its `limit_conn` permit:
/// settles `metering`, releases `permit`, then sends what is left of `out`.
async fn end_response(
    io: &mut impl Client,
    out: &[u8],
    metering: Option<Metered>,
    permit: Option<ConnPermit>,
) -> Result<(), BodyError> {
    if let Some(metered) = metering {
        metered.finish().await;
    }
    match permit {
        Some(ConnPermit::Redis(permit)) => {
            if let Err(e) = permit.release().await {
                // It expires with its lease.
                tracing::debug!("limit_conn permit not released: {e}");
            }
        }
        // A permit in memory goes back as it drops.
        memory => drop(memory),
    }
    if !out.is_empty() && io.write_all(out).await.is_err() {
        return Err(BodyError::Write);
    }
    Ok(())
}
