//! Forwarding a request that passed its limits: the upstream URI, hop-by-hop
//! headers, `X-Forwarded-For` / `Forwarded`, the upstream timeout, and a response
//! body that holds the `limit_conn` permit until it ends.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use super::adaptive::AdaptiveHold;
use super::cost::{Meter, Outcome, Pending, Settle};
use super::keys;
use super::limits::{ConnPermit, Passed};
use super::problem::problem;
use super::routes::{Route, RouteTable};

/// The upstream HTTP client of one worker thread (its own connection pool).
pub(super) type Upstream = Client<HttpConnector, Body>;

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Sends `req` to `route`'s upstream and answers with its response plus the
/// rate-limit headers of `passed`; 502 / 504 problems when the upstream fails.
pub(super) async fn forward(
    client: &Upstream,
    table: &RouteTable,
    route: &Route,
    peer: SocketAddr,
    mut req: Request,
    mut passed: Passed,
) -> Response {
    if to_upstream(&mut req, table, route, peer).is_err() {
        return problem(StatusCode::BAD_REQUEST, "bad request path", None);
    }
    let mut adaptive = passed.adaptive.take();
    let mut pending = passed.pending.take();
    // An upstream that fails to answer is overloaded as far as the adaptive limit
    // can tell; the request did no work, so its admission under `cost:` goes back.
    let failed = |adaptive: Option<AdaptiveHold>, pending: Option<Pending>, status, what: &str| {
        if let Some(hold) = adaptive {
            hold.failed();
        }
        if let Some(p) = pending {
            p.give_back();
        }
        problem(status, &format!("upstream {} {what}", route.name), None)
    };
    match tokio::time::timeout(table.upstream_timeout, client.request(req)).await {
        Ok(Ok(resp)) => {
            let (mut parts, body) = resp.into_parts();
            if let Some(hold) = &mut adaptive {
                hold.answered(parts.status);
            }
            strip_hop_by_hop(&mut parts.headers);
            // Under `cost:`, a usage in the headers settles now; one in the body when
            // the body ends (or the client goes away).
            let mut charge = None;
            if let Some(pending) = pending.take() {
                if let Some(outcome) = pending.cost().in_headers(&parts.headers) {
                    pending.settle(outcome).await;
                } else {
                    match pending.cost().meter(&parts.headers) {
                        // A body already at its end (Content-Length: 0, 204, 304, a
                        // HEAD) is never polled: it reports nothing.
                        Some(meter) if !http_body::Body::is_end_stream(&body) => {
                            charge = Some((pending, meter))
                        }
                        _ => pending.settle(Outcome::Missing).await,
                    }
                }
            }
            parts.headers.extend(passed.headers);
            // limit_conn's and the adaptive limit's permits are held until the
            // response body has been sent, as nginx counts a connection until the
            // request is finished.
            let body = Held {
                body,
                _permit: passed.permit,
                _adaptive: adaptive,
                charge,
                settling: None,
                last: None,
            };
            Response::from_parts(parts, Body::new(body))
        }
        Ok(Err(e)) if timed_out(&e) => failed(
            adaptive,
            pending,
            StatusCode::GATEWAY_TIMEOUT,
            "timed out (connect)",
        ),
        Ok(Err(e)) if crate::connections::is_body_timeout(&e) => problem(
            StatusCode::REQUEST_TIMEOUT,
            "the request body stalled longer than connections.body_timeout",
            None,
        ),
        Ok(Err(_)) => failed(adaptive, pending, StatusCode::BAD_GATEWAY, "unreachable"),
        Err(_) => failed(adaptive, pending, StatusCode::GATEWAY_TIMEOUT, "timed out"),
    }
}

/// Rewrites `req` for the upstream: its URI, no hop-by-hop headers, the client in
/// `X-Forwarded-For` (appended only to a trusted peer's) and `Forwarded`.
fn to_upstream(
    req: &mut Request,
    table: &RouteTable,
    route: &Route,
    peer: SocketAddr,
) -> Result<(), axum::http::uri::InvalidUri> {
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let base = route.upstream.to_string();
    let uri: Uri = format!("{}{}", base.trim_end_matches('/'), path_and_query).parse()?;
    *req.uri_mut() = uri;
    strip_hop_by_hop(req.headers_mut());
    let client_ip = keys::client_ip(&table.trusted, peer.ip(), req.headers()).to_string();
    let xff = match req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
    {
        Some(prev) if table.trusted.iter().any(|n| n.contains(&peer.ip())) => {
            format!("{prev}, {}", peer.ip())
        }
        _ => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        req.headers_mut().insert("x-forwarded-for", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("for={client_ip}")) {
        req.headers_mut().append("forwarded", v);
    }
    Ok(())
}

/// Removes the hop-by-hop headers and those `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
    for h in named {
        headers.remove(h);
    }
}

/// Whether an upstream request failed because connecting took too long.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// A response body that holds the request's permits until it ends (or is dropped),
/// and under `cost:` reads it for the usage, settled when it ends.
struct Held {
    body: hyper::body::Incoming,
    _permit: Option<ConnPermit>,
    _adaptive: Option<AdaptiveHold>,
    charge: Option<(Pending, Meter)>,
    /// The usage being charged: the body ends when it has landed.
    settling: Option<Settle>,
    /// The body's last frame, sent once the charge has landed.
    last: Option<http_body::Frame<bytes::Bytes>>,
}

impl Held {
    /// The body has ended: its usage starts to settle.
    fn ended(&mut self) {
        if let Some((pending, meter)) = self.charge.take() {
            self.settling = Some(pending.settle(meter.finish()));
        }
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
        if let Some(settling) = &mut self.settling {
            std::task::ready!(settling.as_mut().poll(cx));
            self.settling = None;
            return Poll::Ready(self.last.take().map(Ok));
        }
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if self.charge.is_none() {
            return polled;
        }
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some((_, meter)), Some(data)) = (&mut self.charge, frame.data_ref()) {
                    meter.feed(data);
                }
                if !self.body.is_end_stream() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                // The last frame waits for the charge: a client has the whole
                // response (e.g. its Content-Length) only once the charge has landed.
                self.last = Some(frame);
                self.ended();
                self.poll_frame(cx)
            }
            Poll::Ready(None) => {
                self.ended();
                self.poll_frame(cx)
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not while a usage is still to be read or charged.
        self.charge.is_none()
            && self.settling.is_none()
            && self.last.is_none()
            && self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Held {
    /// The client went away (or the upstream broke off) before the end: the usage
    /// seen so far, else the estimate.
    fn drop(&mut self) {
        if let Some((pending, meter)) = self.charge.take() {
            pending.settle_later(Outcome::Disconnected(meter.so_far()));
        }
        if let Some(settling) = self.settling.take() {
            super::cost::spawn(settling);
        }
    }
}
