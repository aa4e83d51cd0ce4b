//! Forwarding a request that passed its limits: the upstream URI, hop-by-hop
//! headers, `X-Forwarded-For` / `Forwarded`, the upstream timeout, and a response
//! body that holds the `limit_conn` permit until it ends.

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONNECTION, CONTENT_LENGTH, FORWARDED, HOST};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::adaptive::AdaptiveHold;
use super::ask_usage::Unasked;
use super::cost::{Metered, Outcome, Pending, Settle};
use super::keys;
use super::keys::HeaderSource;
use super::limits::{ConnPermit, Passed};
use super::problem::{problem, Problem};
use super::routes::{Route, RouteTable};
use super::upstream::{Failure, UpstreamPool};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The hop-by-hop headers (RFC 9110 §7.6.1, and the older `keep-alive` and
/// `proxy-connection`), lower-case.
static HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Sends `req` to `route`'s upstream and answers with its response plus the
/// rate-limit headers of `passed`; `Err`: the proxy's own answer (a bad path, a
/// stalled body, 502 / 504 problems when the upstream fails), the request body
/// perhaps left unread.
pub(super) async fn forward(
    upstreams: &UpstreamPool,
    table: &RouteTable,
    route: &Route,
    peer: &Peer,
    mut req: Request,
    mut passed: Passed,
) -> Result<Response, Response> {
    if to_upstream(&mut req, table, route, peer).is_none() {
        return Err(problem(StatusCode::BAD_REQUEST, "bad request path", None).into_response());
    }
    let mut adaptive = passed.adaptive.take();
    let mut pending = passed.pending.take();
    let answer = match tokio::time::timeout(
        table.upstream_timeout,
        upstreams.send(route.upstream(), route.upstream_tls(), req),
    )
    .await
    {
        Ok(Ok(resp)) => resp,
        Ok(Err(Failure::Exchange(e))) if tollgate_runtime::connections::is_body_timeout(&e) => {
            return Err(body_stalled().into_response());
        }
        Ok(Err(f)) => {
            return Err(upstream_failed(route, adaptive, pending, f.answer()).into_response())
        }
        Err(_) => {
            return Err(upstream_failed(route, adaptive, pending, TIMED_OUT).into_response());
        }
    };
    let (mut parts, body) = answer.into_parts();
    if let Some(hold) = &mut adaptive {
        hold.answered(parts.status);
    }
    strip_hop_by_hop(&mut parts.headers);
    // Under `cost:`, a usage in the headers settles now; one in the body when
    // the body ends (or the client goes away).
    let mut charge = None;
    let mut strip = None;
    if let Some(pending) = pending.take() {
        if let Some(outcome) = pending.cost().in_headers(&parts.headers) {
            pending.settle(outcome).await;
        } else {
            match pending.cost().meter(&parts.headers) {
                // A body already at its end (Content-Length: 0, 204, 304, a
                // HEAD) is never polled: it reports nothing.
                Some(meter) if !http_body::Body::is_end_stream(&body) => {
                    // The usage the proxy asked for is not its client's: taken out
                    // of the stream (whose length then changes).
                    if pending.usage_asked && meter.is_event_stream() {
                        strip = Some(Unasked::new(pending.cost().max_body));
                        parts.headers.remove(CONTENT_LENGTH);
                    }
                    charge = Some(Metered::new(pending, meter))
                }
                _ => pending.settle(Outcome::Missing).await,
            }
        }
    }
    parts.headers.extend(passed.headers);
    let mut permit = passed.permit;
    if http_body::Body::is_end_stream(&body) {
        // A body already at its end is never polled (hyper writes the head
        // alone): the permit goes back now, before the answer leaves.
        if let Some(ConnPermit::Redis(p)) = permit.take() {
            if let Err(e) = p.release().await {
                // It expires with its lease.
                tracing::debug!("limit_conn permit not released: {e}");
            }
        }
    }
    // limit_conn's and the adaptive limit's permits are held until the
    // response body has been sent, as nginx counts a connection until the
    // request is finished.
    let body = Held {
        body,
        permit,
        _adaptive: adaptive,
        charge,
        strip,
        settling: None,
        last: None,
        done: None,
    };
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// An upstream that did not answer within `upstream_timeout`.
pub(super) const TIMED_OUT: (StatusCode, &str) = (StatusCode::GATEWAY_TIMEOUT, "timed out");

/// An upstream that failed or answered with something other than HTTP.
pub(super) const UNREACHABLE: (StatusCode, &str) = (StatusCode::BAD_GATEWAY, "unreachable");

impl Failure {
    /// The status and words a client is answered with when this failure ends its
    /// request before the upstream answered.
    pub fn answer(&self) -> (StatusCode, &'static str) {
        match self {
            Failure::ConnectTimedOut => (StatusCode::GATEWAY_TIMEOUT, "timed out (connect)"),
            Failure::Unreachable(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                (StatusCode::GATEWAY_TIMEOUT, "timed out (connect)")
            }
            _ => UNREACHABLE,
        }
    }
}

/// The answer to a request whose upstream failed to answer. The upstream is
/// overloaded as far as the adaptive limit can tell; the request did no work, so its
/// admission under `cost:` goes back.
pub(super) fn upstream_failed(
    route: &Route,
    adaptive: Option<AdaptiveHold>,
    pending: Option<Pending>,
    (status, what): (StatusCode, &str),
) -> Problem {
    if let Some(hold) = adaptive {
        hold.failed();
    }
    if let Some(p) = pending {
        p.give_back();
    }
    problem(status, &format!("upstream {} {what}", route.name), None)
}

/// The answer to a request whose body stalled.
pub(super) fn body_stalled() -> Problem {
    problem(
        StatusCode::REQUEST_TIMEOUT,
        "the request body stalled longer than connections.body_timeout",
        None,
    )
}

/// The client connection a request came on, with its address written as the
/// forwarding headers carry it (formatted once per connection, not per request).
#[derive(Clone)]
pub(super) struct Peer {
    pub addr: SocketAddr,
    /// The peer's IP: `X-Forwarded-For` from a peer that is not a trusted proxy.
    ip: HeaderValue,
    /// `for=` the peer's IP: `Forwarded` when the client is the peer.
    forwarded: HeaderValue,
    /// It came over TLS: `Forwarded` says `proto=https`.
    tls: bool,
}

impl Peer {
    /// The connection from `addr`, over TLS or not.
    pub fn new(addr: SocketAddr, tls: bool) -> Self {
        let ip = addr.ip();
        Peer {
            addr,
            ip: text_value(ip.to_string()),
            forwarded: text_value(forwarded_for(ip, tls)),
            tls,
        }
    }
}

/// `Forwarded`'s element for this hop: `for=` (RFC 7239: an IPv6 address is bracketed
/// and quoted), and `proto=https` when the client spoke TLS to the proxy.
fn forwarded_for(ip: IpAddr, tls: bool) -> String {
    let proto = if tls { ";proto=https" } else { "" };
    match ip {
        IpAddr::V4(v4) => format!("for={v4}{proto}"),
        IpAddr::V6(v6) => format!("for=\"[{v6}]\"{proto}"),
    }
}

/// A header value of text made here (an address): always valid.
fn text_value(text: String) -> HeaderValue {
    HeaderValue::try_from(text).expect("an address is a valid header value")
}

/// Rewrites `req` for the upstream: its URI, no hop-by-hop headers, the client in
/// `X-Forwarded-For` (appended only to a trusted peer's) and `Forwarded`. `None`: the
/// path cannot be joined to the upstream's.
fn to_upstream(req: &mut Request, table: &RouteTable, route: &Route, peer: &Peer) -> Option<()> {
    if !req.headers().contains_key(HOST) {
        // An HTTP/2 client names the host in its URI (`:authority`), an HTTP/1.0 one
        // maybe nowhere: the upstream gets that, else its own address.
        let host = (req.uri().authority())
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| route.upstream_host().clone());
        req.headers_mut().insert(HOST, host);
    }
    *req.uri_mut() = route.upstream_path(req.uri())?;
    strip_hop_by_hop(req.headers_mut());
    let Forwarding {
        xff,
        forwarded,
        append,
        proto,
    } = forwarding(table, peer, req.headers());
    let headers = req.headers_mut();
    headers.insert(&X_FORWARDED_FOR, xff);
    if let Some(proto) = proto {
        headers.insert(&X_FORWARDED_PROTO, proto);
    }
    if append {
        headers.append(FORWARDED, forwarded);
    } else {
        headers.insert(FORWARDED, forwarded);
    }
    Some(())
}

/// The forwarding headers a request goes upstream with.
pub(super) struct Forwarding {
    /// `X-Forwarded-For`, replacing the request's.
    pub xff: HeaderValue,
    /// The `Forwarded` element of this hop.
    pub forwarded: HeaderValue,
    /// Whether `forwarded` follows the request's own `Forwarded` (a trusted peer's),
    /// or replaces it.
    pub append: bool,
    /// `X-Forwarded-Proto` to write (`https` when the client spoke TLS to the proxy,
    /// else `http`), replacing the request's; `None`: a trusted peer's is kept.
    pub proto: Option<HeaderValue>,
}

/// `X-Forwarded-Proto` for a client connection.
fn proto_of(peer: &Peer) -> HeaderValue {
    HeaderValue::from_static(if peer.tls { "https" } else { "http" })
}

/// The forwarding headers of a request from `peer` with `headers`: only a trusted
/// proxy's `X-Forwarded-For` is kept, and so only then may the client differ from the
/// peer. What a peer that is not a trusted proxy says of earlier hops is not passed
/// on: both headers start from it.
pub(super) fn forwarding(
    table: &RouteTable,
    peer: &Peer,
    headers: &(impl HeaderSource + ?Sized),
) -> Forwarding {
    let ip = peer.addr.ip();
    if !table.trusted.iter().any(|n| n.contains(&ip)) {
        // What an untrusted client says of its scheme is not passed on.
        return Forwarding {
            xff: peer.ip.clone(),
            forwarded: peer.forwarded.clone(),
            append: false,
            proto: Some(proto_of(peer)),
        };
    }
    let client = keys::client_ip(&table.trusted, ip, headers);
    let xff = match headers.first("x-forwarded-for") {
        Some(prev) => text_value(format!("{prev}, {ip}")),
        None => peer.ip.clone(),
    };
    let forwarded = if client == ip {
        peer.forwarded.clone()
    } else {
        text_value(forwarded_for(client, peer.tls))
    };
    // A trusted proxy's word on the scheme stands; without one, this hop's.
    let proto = headers
        .first("x-forwarded-proto")
        .is_none()
        .then(|| proto_of(peer));
    Forwarding {
        xff,
        forwarded,
        append: true,
        proto,
    }
}

/// Whether the header `name` (any case) is hop-by-hop.
pub(super) fn is_hop_by_hop_name(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

/// Whether a header named in `Connection` stays all the same: `Host` and the framing
/// headers are the proxy's to decide on, never a client's or an upstream's to take
/// away from the next hop.
pub(super) fn kept_when_named(name: &[u8]) -> bool {
    [&b"host"[..], b"content-length", b"transfer-encoding"]
        .iter()
        .any(|k| k.eq_ignore_ascii_case(name))
}

/// Whether `name` is a hop-by-hop header.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    is_hop_by_hop_name(name.as_str())
}

/// Removes the hop-by-hop headers and those `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names, no lookups.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|n| !kept_when_named(n.as_bytes()))
        .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    for h in named {
        headers.remove(h);
    }
}

/// A response body that holds the request's permits until it ends (or is dropped),
/// and under `cost:` reads it for the usage, settled when it ends. A `limit_conn`
/// permit is given back before the last frame goes (as the HTTP/1.1 fast path does):
/// a client that asks again at once, through this proxy or any other on that Redis,
/// never finds its finished request still counted.
struct Held {
    body: hyper::body::Incoming,
    permit: Option<ConnPermit>,
    _adaptive: Option<AdaptiveHold>,
    charge: Option<Metered>,
    /// The usage the proxy asked for, taken out of the stream (see `ask_usage`).
    strip: Option<Unasked>,
    /// The usage being charged and the permit being given back: the body ends when
    /// both have landed.
    settling: Option<Settle>,
    /// The body's last frame, sent once they have.
    last: Option<http_body::Frame<bytes::Bytes>>,
    /// The frame that said the event stream is done (`data: [DONE]`), sent once its
    /// usage, settled then, has landed.
    done: Option<http_body::Frame<bytes::Bytes>>,
}

impl Held {
    /// What the client gets of `data` once the usage the proxy asked for is out (and
    /// all that is left, `at_end` of the body), when it is taken out.
    fn stripped(&mut self, data: &[u8], at_end: bool) -> Option<bytes::Bytes> {
        let strip = self.strip.as_mut()?;
        let mut out = Vec::with_capacity(data.len());
        strip.feed(data, &mut out);
        if at_end {
            strip.finish(&mut out);
        }
        Some(out.into())
    }

    /// Whether the end of the body waits for something (a charge, a permit).
    fn holds_end(&self) -> bool {
        self.charge.is_some() || self.permit.is_some()
    }

    /// The body has ended: its usage starts to settle and its permit to go back (one
    /// in memory at once, as it drops).
    fn ended(&mut self) {
        let settle = self.charge.take().map(Metered::finish);
        let permit = match self.permit.take() {
            Some(ConnPermit::Redis(p)) => Some(p),
            _ => None,
        };
        if settle.is_none() && permit.is_none() {
            return;
        }
        self.settling = Some(Box::pin(async move {
            if let Some(settle) = settle {
                settle.await;
            }
            if let Some(permit) = permit {
                if let Err(e) = permit.release().await {
                    // It expires with its lease.
                    tracing::debug!("limit_conn permit not released: {e}");
                }
            }
        }));
    }
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        use std::task::Poll;
        loop {
            if let Some(settling) = &mut self.settling {
                std::task::ready!(settling.as_mut().poll(cx));
                self.settling = None;
                if let Some(done) = self.done.take() {
                    return Poll::Ready(Some(Ok(done)));
                }
                return Poll::Ready(self.last.take().map(Ok));
            }
            let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
            if !self.holds_end() {
                return polled;
            }
            let frame = match polled {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(None) => {
                    // What is left of an event cut short goes as the last frame.
                    let rest = self.stripped(&[], true);
                    self.last = rest.filter(|r| !r.is_empty()).map(http_body::Frame::data);
                    self.ended();
                    continue;
                }
                other => return other,
            };
            let frame = match frame.into_data() {
                Ok(data) => {
                    if let Some(metered) = &mut self.charge {
                        metered.feed(&data);
                    }
                    let at_end = http_body::Body::is_end_stream(&self.body);
                    let frame = match self.stripped(&data, at_end) {
                        // A frame that held only what is taken out, or the start of
                        // an event: the next one.
                        Some(out) if out.is_empty() && !at_end => continue,
                        Some(out) => http_body::Frame::data(out),
                        None => http_body::Frame::data(data),
                    };
                    let charge = self.charge.as_mut();
                    if let Some(settle) = charge.and_then(Metered::settle_at_done) {
                        if !self.body.is_end_stream() {
                            self.settling = Some(settle);
                            self.done = Some(frame);
                            continue;
                        }
                        // Also the last frame: it waits for the permit's return too.
                        self.last = Some(frame);
                        self.ended();
                        let then = self.settling.take();
                        self.settling = Some(Box::pin(async move {
                            settle.await;
                            if let Some(then) = then {
                                then.await;
                            }
                        }));
                        continue;
                    }
                    frame
                }
                Err(trailers) => trailers,
            };
            if !self.body.is_end_stream() {
                return Poll::Ready(Some(Ok(frame)));
            }
            // The last frame waits for the charge: a client has the whole response
            // (e.g. its Content-Length) only once the charge has landed.
            self.last = Some(frame);
            self.ended();
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not while a usage is still to be read or charged, or a permit held.
        !self.holds_end()
            && self.settling.is_none()
            && self.last.is_none()
            && self.done.is_none()
            && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.strip {
            Some(_) => http_body::SizeHint::default(),
            None => self.body.size_hint(),
        }
    }
}

impl Drop for Held {
    /// A charge (or a permit's return) under way lands, whoever drops the body (a
    /// charge not yet under way settles as [`Metered`] says; a permit not yet going
    /// back goes when it drops).
    fn drop(&mut self) {
        if let Some(settling) = self.settling.take() {
            super::cost::spawn(settling);
        }
    }
}
