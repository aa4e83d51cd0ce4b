//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit`) over gRPC, wire compatible, served straight on hyper's HTTP/2
//! connections: the one unary call needs no routing, streaming codec or middleware
//! stack, and a call here costs what its bytes cost (see docs/performance.md). The
//! message conversions live in [`crate::envoy`].
//!
//! The gRPC rules kept (the "gRPC over HTTP/2" protocol): a message is a 5-byte prefix
//! (compressed flag, big-endian length) and its protobuf bytes; a response carries
//! `grpc-status` in its trailers, an error is a trailers-only response; an unknown
//! method is `UNIMPLEMENTED`, a content type other than `application/grpc*` is HTTP 415,
//! a compressed message `UNIMPLEMENTED` (only `identity` is accepted), a message that
//! is not one well-formed request `INTERNAL`, one over [`MAX_MESSAGE_BYTES`]
//! `RESOURCE_EXHAUSTED`, a body that does not arrive within `connections.body_timeout`
//! `DEADLINE_EXCEEDED`. A request the service refuses is `INVALID_ARGUMENT`, a store
//! that cannot answer `UNAVAILABLE`. A client's `grpc-timeout` is not timed here: a
//! client that gives up resets its stream, which drops the call.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaUsageReports;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use futures_util::FutureExt;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use prost::Message;
use tonic::Status;

use crate::calls::CallCode;
pub use crate::calls::Method;
use crate::spans;
use crate::{DecisionService, RequestError};
use tollgate_runtime::config::Connections;
use tollgate_runtime::connections::{self, BodyTimeout, Bounded, Drain, Slots, StallBody};
use tollgate_runtime::tls::ServerTls;
use tollgate_runtime::workers::{WorkerStream, Workers};

/// Envoy's rate limit call.
pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Envoy's rate limit quota stream (RLQS).
pub const QUOTA_PATH: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// The largest request message accepted (gRPC's usual default, 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Serves the gRPC API on `listener` within `slots`' bounds, on `workers`, until
/// `stop` resolves (see [`connections::serve_accepted`]); over TLS when `tls` is given.
pub async fn serve(
    listener: tokio::net::TcpListener,
    slots: Slots,
    service: Arc<DecisionService>,
    stop: impl Future<Output = ()>,
    workers: Option<&Workers>,
    tls: Option<ServerTls>,
) {
    let bounds = *slots.bounds();
    let handshake = Duration::from_micros(bounds.header_timeout);
    let serve_one = move |peer: SocketAddr| {
        let service = service.clone();
        let tls = tls.as_ref().map(ServerTls::acceptor);
        move |io: Bounded<WorkerStream>, drain| async move {
            match tls {
                None => connection(io, peer, service, bounds, drain).await,
                Some(tls) => {
                    if let Some(io) = connections::handshake_within(handshake, tls, io, peer).await
                    {
                        connection(io, peer, service, bounds, drain).await
                    }
                }
            }
        }
    };
    connections::serve_accepted(listener, slots, serve_one, stop, workers).await;
}

/// One HTTP/2 connection: each call is answered in the connection's own task as its
/// request arrives (no task per call) when it can be answered at once, as a decision
/// on the memory store can; a call that must wait (for the rest of its body, for
/// Redis) goes on in a task of its own. The answers of a round of reads leave in one
/// write.
async fn connection<I>(
    io: I,
    peer: SocketAddr,
    service: Arc<DecisionService>,
    bounds: Connections,
    mut drain: Drain,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // hyper's HTTP/2 server settings: 1 MiB windows, 16 KiB header lists.
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 20)
        .max_header_list_size(16 << 10)
        .max_send_buffer_size(400 << 10)
        .max_concurrent_streams(bounds.max_streams);
    let mut conn = match builder.handshake::<_, Bytes>(io).await {
        Ok(conn) => conn,
        Err(e) => return tracing::debug!("gRPC connection from {peer}: no HTTP/2: {e}"),
    };
    let body_timeout = BodyTimeout::Whole(Duration::from_micros(bounds.body_timeout));
    let mut draining = false;
    let mut arrived = Vec::new();
    loop {
        let next = tokio::select! {
            biased;
            next = conn.accept() => next,
            () = drain.requested(), if !draining => {
                conn.graceful_shutdown();
                draining = true;
                continue;
            }
        };
        // Every call whose request is already read, then their answers: the next poll
        // of the connection writes them out together.
        let mut next = Poll::Ready(next);
        let ended = loop {
            match next {
                // Routed as it arrives: the head is not kept (nor moved with the call).
                Poll::Ready(Some(Ok((req, respond)))) => {
                    let (head, body) = req.into_parts();
                    let content_type = head.headers.get(http::header::CONTENT_TYPE);
                    let method = route(head.uri.path(), content_type);
                    let span = match (service.tracing(), &method) {
                        (Some(t), Ok(m)) => spans::grpc_call(t, &head.headers, *m),
                        _ => None,
                    };
                    arrived.push((method, span, body, respond));
                }
                Poll::Ready(Some(Err(e))) => break Some(Some(e)),
                Poll::Ready(None) => break Some(None),
                Poll::Pending => break None,
            }
            next = std::future::poll_fn(|cx| Poll::Ready(conn.poll_accept(cx))).await;
        };
        for (method, span, body, respond) in arrived.drain(..) {
            if let Ok(Method::StreamRateLimitQuotas) = method {
                // A stream lives as long as its Envoy: no body timeout.
                tokio::spawn(quota_stream(service.clone(), body, respond, span));
                continue;
            }
            let body = StallBody::new(H2Body(body), body_timeout);
            let mut call = Box::pin(stream(service.clone(), method, body, respond, span));
            if (&mut call).now_or_never().is_none() {
                tokio::spawn(call);
            }
        }
        match ended {
            None => {}
            Some(None) => return,
            Some(Some(e)) => return tracing::debug!("gRPC connection from {peer} ended: {e}"),
        }
    }
}

/// One call on its HTTP/2 stream, answered there; a client that resets the stream
/// (it gave up) drops the call. `span`: the call's trace span, when sampled.
async fn stream(
    service: Arc<DecisionService>,
    method: Result<Method, Refusal>,
    body: StallBody<H2Body>,
    mut respond: h2::server::SendResponse<Bytes>,
    span: Option<opentelemetry::Context>,
) {
    use futures_util::future::Either;
    use opentelemetry::context::FutureExt;
    let started = service.now_ns();
    let served = method.as_ref().ok().copied();
    let call = async {
        match method {
            // Refused from its head: the body is not read.
            Err(refusal) => Reply::from(refusal),
            Ok(method) => answer(&service, method, read_body(body).await).await,
        }
    };
    let call = match &span {
        Some(cx) => Either::Left(call.with_context(cx.clone())),
        None => Either::Right(call),
    };
    let reply = tokio::select! {
        biased;
        reply = call => reply,
        _ = std::future::poll_fn(|cx| respond.poll_reset(cx)) => {
            if let Some(cx) = &span {
                spans::end_grpc(cx, tonic::Code::Cancelled, Some("the client reset the stream"));
            }
            let code = CallCode::Grpc(tonic::Code::Cancelled);
            return service.metrics().grpc_call(served, code, None);
        }
    };
    let code = match &reply {
        Reply::Message(_) => CallCode::Grpc(tonic::Code::Ok),
        Reply::Status(status) => CallCode::Grpc(status.code()),
        Reply::UnsupportedMediaType => CallCode::Http(415),
    };
    if let Some(cx) = &span {
        match &reply {
            Reply::Status(status) => spans::end_grpc(cx, status.code(), Some(status.message())),
            _ => spans::end_grpc(cx, tonic::Code::Ok, None),
        }
    }
    let seconds = service.now_ns().saturating_sub(started) as f64 / 1e9;
    service.metrics().grpc_call(served, code, Some(seconds));
    let (head, message) = match reply {
        Reply::Message(message) => {
            let mut head = Response::new(());
            head.headers_mut().insert(http::header::CONTENT_TYPE, GRPC);
            (head, Some(message))
        }
        Reply::Status(status) => (status.into_http::<()>(), None),
        Reply::UnsupportedMediaType => {
            let mut head = Response::new(());
            *head.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
            (head, None)
        }
    };
    let Ok(mut send) = respond.send_response(head, message.is_none()) else {
        return; // the client is gone
    };
    if let Some(message) = message {
        let _ = send.send_data(message, false);
        let _ = send.send_trailers(ok_trailers());
    }
}

/// An HTTP/2 request body as an [`http_body::Body`], its flow-control window given
/// back as it is read.
struct H2Body(h2::RecvStream);

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let body = &mut self.0;
        match body.poll_data(cx) {
            Poll::Ready(Some(Ok(data))) => {
                let _ = body.flow_control().release_capacity(data.len());
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => body
                .poll_trailers(cx)
                .map(|t| t.transpose().map(|t| t.map(Frame::trailers))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// What a call is answered with.
#[derive(Debug)]
pub enum Reply {
    /// The framed response message; `grpc-status: 0` follows in the trailers.
    Message(Bytes),
    /// A gRPC error, sent as a trailers-only response.
    Status(Status),
    /// Not gRPC's content type: HTTP 415.
    UnsupportedMediaType,
}

impl From<Refusal> for Reply {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Status(status) => Reply::Status(status),
            Refusal::ContentType => Reply::UnsupportedMediaType,
        }
    }
}

/// Answers one gRPC call of `method` ([`route`] made it of the call's head) from its
/// request body (`framed`: the framed message, or why it could not be read): the
/// response message, or the gRPC error the call deserves. The one function that
/// answers a call, for the HTTP/2 loop, the tests and the fuzz target alike. Its
/// future holds the decision's state, not the request's head: it is moved into a box
/// per call (and a task when the call must wait), so it is kept small.
pub async fn answer(
    service: &DecisionService,
    method: Method,
    framed: Result<Bytes, Status>,
) -> Reply {
    match message_for(service, method, framed).await {
        Ok(message) => Reply::Message(message),
        Err(refusal) => refusal.into(),
    }
}

const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// Why a call is not answered with a message.
#[derive(Debug)]
pub enum Refusal {
    /// A gRPC error.
    Status(Status),
    /// Not gRPC's content type.
    ContentType,
}

impl From<Status> for Refusal {
    fn from(status: Status) -> Self {
        Refusal::Status(status)
    }
}

/// The method a call asks for, from its path and content type, or why it is refused
/// from its head alone: an unknown method, a content type that is not gRPC's.
pub fn route(path: &str, content_type: Option<&HeaderValue>) -> Result<Method, Refusal> {
    let method = match path {
        PATH => Method::ShouldRateLimit,
        HEALTH_CHECK => Method::HealthCheck,
        QUOTA_PATH => Method::StreamRateLimitQuotas,
        other => {
            return Err(Status::unimplemented(format!(
            "unknown method {other}: this server answers {PATH}, {QUOTA_PATH} and {HEALTH_CHECK}"
        ))
            .into())
        }
    };
    let grpc_content = content_type.is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc_content {
        Ok(method)
    } else {
        Err(Refusal::ContentType)
    }
}

/// The framed response message to a call's framed request, or why there is none.
async fn message_for(
    service: &DecisionService,
    method: Method,
    request: Result<Bytes, Status>,
) -> Result<Bytes, Refusal> {
    let message = unframe(request?)?;
    Ok(match method {
        Method::ShouldRateLimit => {
            let request = RateLimitRequest::decode(&message[..])
                .map_err(|e| Status::internal(format!("not a RateLimitRequest: {e}")))?;
            let response = crate::envoy::should_rate_limit(service, request)
                .await
                .map_err(|e| match e {
                    RequestError::Unavailable(m) => Status::unavailable(m),
                    e @ RequestError::NoRules => Status::unavailable(e.to_string()),
                    e => Status::invalid_argument(e.to_string()),
                })?;
            framed(&response)
        }
        Method::HealthCheck => framed(&health(service, message)?),
        Method::StreamRateLimitQuotas => {
            return Err(Status::unimplemented(format!("{QUOTA_PATH} is a stream")).into())
        }
    })
}

/// One RLQS stream (one Envoy): its usage reports go to their quota buckets as they
/// arrive, and what the buckets decide for it is sent as it is decided. The stream
/// ends when the Envoy ends it (`OK`), sends what is not a report (`INVALID_ARGUMENT`,
/// `RESOURCE_EXHAUSTED`, ...) or resets it; its shares free when they end.
async fn quota_stream(
    service: Arc<DecisionService>,
    mut body: h2::RecvStream,
    mut respond: h2::server::SendResponse<Bytes>,
    parent: Option<opentelemetry::Context>,
) {
    let (client, mut inbox) = service.quota().open();
    // The stream's shares are let go however it ends (an error, a panic, a reset).
    struct Closing(Arc<DecisionService>, u64);
    impl Drop for Closing {
        fn drop(&mut self) {
            self.0.quota().close(self.1);
        }
    }
    let _closing = Closing(service.clone(), client);
    let mut head = Response::new(());
    head.headers_mut().insert(http::header::CONTENT_TYPE, GRPC);
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let mut pending = BytesMut::new();
    let idle = Duration::from_micros(service.quota().limits.stream_idle);
    let mut silent_until = tokio::time::Instant::now() + idle;
    let status = loop {
        tokio::select! {
            // Answers first: one queued before the client's end still goes out.
            biased;
            response = inbox.recv() => match response {
                Some(response) => {
                    if let Err(status) = send_within_window(&mut send, framed(&response)).await {
                        break status;
                    }
                }
                None => break Status::resource_exhausted(format!(
                    "the client left {} assignments unread", crate::quota::MAX_QUEUED
                )),
            },
            data = body.data() => match data {
                None => break Status::ok(""),
                Some(Err(e)) => break Status::cancelled(format!("the stream broke: {e}")),
                Some(Ok(data)) => {
                    let _ = body.flow_control().release_capacity(data.len());
                    pending.extend_from_slice(&data);
                    let reported = next_messages(&mut pending).and_then(|messages| {
                        let any = !messages.is_empty();
                        messages.into_iter().try_for_each(|m| {
                            let reports = RateLimitQuotaUsageReports::decode(m).map_err(|e| {
                                Status::invalid_argument(format!("not a RateLimitQuotaUsageReports: {e}"))
                            })?;
                            let span = (service.tracing().zip(parent.as_ref()))
                                .map(|(t, p)| spans::quota_report(t, p, reports.bucket_quota_usages.len()));
                            let reported = service.quota().report(client, reports, &service.rules());
                            if let Some(cx) = &span {
                                spans::end_quota_report(cx, reported.as_ref().err());
                            }
                            reported
                        })?;
                        Ok(any)
                    });
                    match reported {
                        Err(status) => break status,
                        // Only a whole report counts as one: bytes trickled in do not.
                        Ok(true) => silent_until = tokio::time::Instant::now() + idle,
                        Ok(false) => {}
                    }
                }
            },
            _ = std::future::poll_fn(|cx| send.poll_reset(cx)) => break Status::cancelled("reset"),
            _ = tokio::time::sleep_until(silent_until) => break Status::deadline_exceeded(format!(
                "no report for {} (quota.stream_idle)", tollgate::policy::fmt_duration(idle.as_micros() as u64)
            )),
        }
    };
    // What was decided for it before its end still goes out.
    while let Ok(response) = inbox.try_recv() {
        if send_within_window(&mut send, framed(&response))
            .await
            .is_err()
        {
            break;
        }
    }
    let mut trailers = HeaderMap::new();
    let code = (status.code() as i32).to_string();
    trailers.insert(
        Status::GRPC_STATUS,
        HeaderValue::from_str(&code).expect("digits"),
    );
    if !status.message().is_empty() {
        if let Ok(message) = HeaderValue::from_str(&status.message().replace(['\r', '\n'], " ")) {
            trailers.insert("grpc-message", message);
        }
    }
    let _ = send.send_trailers(trailers);
    let code = CallCode::Grpc(status.code());
    (service.metrics()).grpc_call(Some(Method::StreamRateLimitQuotas), code, None);
}

/// How long an answer may wait for the client's HTTP/2 window.
const WINDOW_WAIT: Duration = Duration::from_secs(5);

/// Sends `data` once the client's flow-control window takes it (h2 would otherwise
/// buffer whatever a client that does not read is sent), within [`WINDOW_WAIT`].
async fn send_within_window(send: &mut h2::SendStream<Bytes>, data: Bytes) -> Result<(), Status> {
    // A large answer need not fit whole: room for a frame's worth bounds what h2
    // holds for a client that does not read to one answer.
    let len = data.len().min(16 * 1024);
    send.reserve_capacity(data.len());
    let granted = tokio::time::timeout(WINDOW_WAIT, async {
        while send.capacity() < len {
            match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(_)) => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    match granted {
        Ok(true) => send
            .send_data(data, false)
            .map_err(|_| Status::cancelled("the client is gone")),
        Ok(false) => Err(Status::cancelled("the client is gone")),
        Err(_) => Err(Status::resource_exhausted(
            "the client does not read its assignments",
        )),
    }
}

/// The whole messages at the start of a stream's `pending` bytes, taken off it.
fn next_messages(pending: &mut BytesMut) -> Result<Vec<Bytes>, Status> {
    let mut messages = Vec::new();
    while pending.len() >= 5 {
        let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
        match pending[0] {
            0 => {}
            1 => {
                return Err(Status::unimplemented(
                    "compressed messages are not accepted: send grpc-encoding identity",
                ))
            }
            flag => return Err(Status::internal(format!("message prefix flag {flag}"))),
        }
        if len > MAX_MESSAGE_BYTES {
            return Err(too_large(len));
        }
        if pending.len() < 5 + len {
            break;
        }
        pending.advance(5);
        messages.push(pending.split_to(len).freeze());
    }
    Ok(messages)
}

/// `message` as one gRPC message: the 5-byte prefix, then its bytes.
fn framed(message: &impl Message) -> Bytes {
    let len = message.encoded_len();
    // A Vec, not a BytesMut: prost writes a byte at a time, and a Vec's write is the
    // cheaper (a third of the encoding's instructions).
    let mut out = Vec::with_capacity(5 + len);
    out.put_u8(0);
    out.put_u32(u32::try_from(len).expect("a response is far below 4 GiB"));
    message
        .encode(&mut out)
        .expect("the buffer was sized by encoded_len");
    Bytes::from(out)
}

/// `grpc.health.v1.Health/Check`, as envoyproxy/ratelimit registers it: the server
/// (`""`) and `ratelimit` are SERVING, NOT_SERVING from the stop signal on (as
/// `/healthcheck`); any other service name is NOT_FOUND.
pub const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (status: 1 SERVING, 2 NOT_SERVING).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

fn health(service: &DecisionService, message: Bytes) -> Result<HealthCheckResponse, Status> {
    let request = HealthCheckRequest::decode(message)
        .map_err(|e| Status::internal(format!("not a HealthCheckRequest: {e}")))?;
    if !matches!(request.service.as_str(), "" | "ratelimit") {
        return Err(Status::not_found(format!(
            "unknown service '{}': this server reports '' and 'ratelimit'",
            request.service
        )));
    }
    let status = if service.health().is_ok() { 1 } else { 2 };
    Ok(HealthCheckResponse { status })
}

/// The whole request body, bounded by [`MAX_MESSAGE_BYTES`]. A body that arrives in one
/// frame (the usual small request) is kept as it is, not copied.
async fn read_body<B>(mut body: B) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    let mut first: Option<Bytes> = None;
    let mut more = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let e: axum::BoxError = e.into();
            if connections::is_body_timeout(e.as_ref()) {
                Status::deadline_exceeded(connections::BodyTimedOut::MESSAGE)
            } else {
                Status::cancelled(format!("the request body ended early: {e}"))
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // request trailers carry nothing for this call
        };
        let total = first.as_ref().map_or(0, Bytes::len) + more.len() + data.len();
        if total > 5 + MAX_MESSAGE_BYTES {
            return Err(too_large(total - 5));
        }
        match &first {
            None => first = Some(data),
            Some(f) => {
                if more.is_empty() {
                    more.extend_from_slice(f);
                }
                more.extend_from_slice(&data);
            }
        }
        if body.is_end_stream() {
            break; // no need to poll for the end (and for trailers) once more
        }
    }
    Ok(if more.is_empty() {
        first.unwrap_or_default()
    } else {
        more.freeze()
    })
}

fn too_large(len: usize) -> Status {
    Status::resource_exhausted(format!(
        "the request message is {len} bytes, over the largest accepted ({MAX_MESSAGE_BYTES})"
    ))
}

/// The one message in a unary call's body.
fn unframe(mut framed: Bytes) -> Result<Bytes, Status> {
    if framed.len() < 5 {
        return Err(Status::internal(if framed.is_empty() {
            "missing request message".to_string()
        } else {
            format!("a message prefix is 5 bytes; the body has {}", framed.len())
        }));
    }
    let compressed = framed.get_u8();
    let len = framed.get_u32() as usize;
    match compressed {
        0 => {}
        1 => {
            return Err(Status::unimplemented(
                "compressed messages are not accepted: send grpc-encoding identity",
            ))
        }
        flag => {
            return Err(Status::internal(format!(
                "message prefix flag {flag}: 0 (uncompressed) or 1 (compressed)"
            )))
        }
    }
    if len > MAX_MESSAGE_BYTES {
        return Err(too_large(len));
    }
    match framed.len().cmp(&len) {
        std::cmp::Ordering::Equal => Ok(framed),
        std::cmp::Ordering::Less => Err(Status::internal(format!(
            "the message prefix says {len} bytes; the body has {}",
            framed.len()
        ))),
        std::cmp::Ordering::Greater => Err(Status::internal(
            "more than one request message in a unary call",
        )),
    }
}

/// The trailers of an answered call: `grpc-status: 0`.
fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
    trailers
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Full;
    use tonic::Code;

    fn framed(flag: u8, message: &[u8]) -> Bytes {
        let mut b = vec![flag];
        b.extend_from_slice(&(message.len() as u32).to_be_bytes());
        b.extend_from_slice(message);
        Bytes::from(b)
    }

    fn service() -> Arc<DecisionService> {
        Arc::new(DecisionService::example())
    }

    /// A call as the HTTP/2 loop makes it: routed from its head, its body read (here
    /// from memory), answered.
    async fn call_with(path: &str, content_type: &str, body: Bytes) -> Reply {
        let content_type = HeaderValue::from_str(content_type).unwrap();
        match route(path, Some(&content_type)) {
            Err(refusal) => refusal.into(),
            Ok(method) => answer(&service(), method, read_body(Full::new(body)).await).await,
        }
    }

    #[tokio::test]
    async fn a_request_is_answered_with_a_message_then_status_0_in_the_trailers() {
        let request = RateLimitRequest {
            domain: "example".into(),
            descriptors: vec![Default::default()],
            hits_addend: 1,
        };
        let resp = call_with(
            PATH,
            "application/grpc",
            framed(0, &request.encode_to_vec()),
        )
        .await;
        let Reply::Message(body) = resp else {
            panic!("not answered: {resp:?}")
        };
        assert_eq!(ok_trailers()["grpc-status"], "0");
        let message = unframe(body).unwrap();
        let answer =
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(message)
                .unwrap();
        assert_eq!(answer.overall_code, 1, "{answer:?}");
    }

    #[tokio::test]
    async fn each_malformed_call_gets_its_own_grpc_error() {
        let ok = RateLimitRequest {
            domain: "example".into(),
            descriptors: vec![],
            hits_addend: 1,
        }
        .encode_to_vec();
        let cases: Vec<(&str, &str, Bytes, Code, &str)> = vec![
            (
                "/other.Service/Call",
                "application/grpc",
                framed(0, &ok),
                Code::Unimplemented,
                "unknown method",
            ),
            (
                PATH,
                "application/grpc",
                Bytes::new(),
                Code::Internal,
                "missing request message",
            ),
            (
                PATH,
                "application/grpc",
                Bytes::from_static(&[0, 0]),
                Code::Internal,
                "5 bytes",
            ),
            (
                PATH,
                "application/grpc",
                framed(1, &ok),
                Code::Unimplemented,
                "identity",
            ),
            (
                PATH,
                "application/grpc",
                framed(7, &ok),
                Code::Internal,
                "flag 7",
            ),
            (
                PATH,
                "application/grpc",
                framed(0, &ok).slice(..8),
                Code::Internal,
                "the body has 3",
            ),
            (
                PATH,
                "application/grpc+proto",
                [framed(0, &ok), framed(0, &ok)].concat().into(),
                Code::Internal,
                "more than one",
            ),
            (
                PATH,
                "application/grpc",
                framed(0, &[0xff, 0xff, 0xff]),
                Code::Internal,
                "not a RateLimitRequest",
            ),
            (
                PATH,
                "application/grpc",
                framed(0, &ok),
                Code::InvalidArgument,
                "descriptor",
            ),
        ];
        for (path, content_type, body, code, says) in cases {
            let Reply::Status(status) = call_with(path, content_type, body).await else {
                panic!("{says}: not refused")
            };
            assert_eq!(status.code(), code, "{says}: {status:?}");
            assert!(status.message().contains(says), "{status:?}");
        }
        let resp = call_with(PATH, "application/json", framed(0, &ok)).await;
        assert!(matches!(resp, Reply::UnsupportedMediaType), "{resp:?}");
    }

    #[tokio::test]
    async fn the_health_check_serves_until_the_server_drains() {
        let service = service();
        let ask = |name: &str| {
            let body = framed(
                0,
                &HealthCheckRequest {
                    service: name.into(),
                }
                .encode_to_vec(),
            );
            let service = service.clone();
            async move { answer(&service, Method::HealthCheck, Ok(body)).await }
        };
        let status = |resp: Reply| async move {
            match resp {
                Reply::Message(body) => Ok(HealthCheckResponse::decode(unframe(body).unwrap())
                    .unwrap()
                    .status),
                Reply::Status(status) => Err(status.code()),
                Reply::UnsupportedMediaType => panic!("415"),
            }
        };
        assert_eq!(status(ask("").await).await, Ok(1), "SERVING");
        assert_eq!(status(ask("ratelimit").await).await, Ok(1));
        assert_eq!(status(ask("other").await).await, Err(Code::NotFound));
        service.start_draining();
        assert_eq!(status(ask("").await).await, Ok(2), "NOT_SERVING");
        assert_eq!(status(ask("ratelimit").await).await, Ok(2));
    }

    /// Each call's future is moved into a box (and a task when it must wait): a Redis
    /// call's state or the request's head held in it made it 3 KiB, and copying it
    /// (then as hyper spawned a task per call) was a tenth of a decision's
    /// instructions.
    #[test]
    fn a_call_future_stays_small() {
        let service = service();
        let call = answer(&service, Method::ShouldRateLimit, Ok(Bytes::new()));
        let size = std::mem::size_of_val(&call);
        assert!(size <= 1024, "{size} bytes");
    }

    #[tokio::test]
    async fn a_message_over_the_bound_is_resource_exhausted_before_it_is_read() {
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&((MAX_MESSAGE_BYTES + 1) as u32).to_be_bytes());
        let resp = call_with(PATH, "application/grpc", Bytes::from(prefix)).await;
        let Reply::Status(status) = resp else {
            panic!("{resp:?}")
        };
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        let body = Bytes::from(vec![0u8; MAX_MESSAGE_BYTES + 6]);
        let resp = call_with(PATH, "application/grpc", body).await;
        let Reply::Status(status) = resp else {
            panic!("{resp:?}")
        };
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    }
}
