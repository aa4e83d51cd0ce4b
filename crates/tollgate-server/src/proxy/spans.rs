//! A proxied request's trace spans, on either serving path: a server span from the
//! route's match to the response (its parent read from the client's `traceparent` or
//! B3 headers), a client span for the upstream call, and the context the upstream
//! receives in place of the client's (its parent is the upstream call's span; when
//! the trace is not sampled, the client's sampling decision is passed on).

use std::sync::Arc;

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use super::keys::HeaderSource;
use super::routes::Route;
use crate::traces::{Span, Tracing};

/// The spans of one request.
pub(super) struct RequestSpan {
    tracing: Arc<Tracing>,
    cx: Context,
    upstream: Option<Span>,
    status: Option<u16>,
}

/// Request headers as the propagators read them.
struct Carrier<'a, H: HeaderSource + ?Sized>(&'a H);

impl<H: HeaderSource + ?Sized> Extractor for Carrier<'_, H> {
    fn get(&self, key: &str) -> Option<&str> {
        // Only the propagators' own names are looked up (a `'static` name to read by).
        let name: &'static str = TRACE_HEADERS.iter().find(|n| **n == key)?;
        self.0.first(name)
    }

    fn keys(&self) -> Vec<&str> {
        Vec::new()
    }
}

/// The trace headers for the upstream, as the propagators write them.
#[derive(Default)]
pub(super) struct Outgoing(pub Vec<(&'static str, String)>);

impl Injector for Outgoing {
    fn set(&mut self, key: &str, value: String) {
        // The propagators' names are constants; an unknown one, or an empty value (no
        // `tracestate`), is not sent.
        if let Some(name) = TRACE_HEADERS.iter().find(|n| **n == key) {
            if !value.is_empty() {
                self.0.push((name, value));
            }
        }
    }
}

/// Every header a propagator reads or writes: the client's are not passed on when
/// traces are on (the proxy's context replaces them).
const TRACE_HEADERS: [&str; 9] = [
    "traceparent",
    "tracestate",
    "baggage",
    "b3",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
];

/// Whether a client header is one the proxy's trace context replaces.
pub(super) fn is_trace_header(name: &str) -> bool {
    TRACE_HEADERS.iter().any(|n| n.eq_ignore_ascii_case(name))
}

impl RequestSpan {
    /// The span of a request `route` matched.
    pub fn start(
        tracing: &Arc<Tracing>,
        headers: &(impl HeaderSource + ?Sized),
        method: &str,
        path: &str,
        route: &Route,
    ) -> RequestSpan {
        let parent = tracing.parent_from(&Carrier(headers));
        let attributes = vec![
            KeyValue::new("http.request.method", method.to_string()),
            KeyValue::new("url.path", path.to_string()),
            KeyValue::new("http.route", route.name.clone()),
        ];
        let name = format!("{method} {}", route.name);
        let cx = tracing.span(&parent, SpanKind::Server, name, attributes);
        RequestSpan {
            tracing: tracing.clone(),
            cx,
            upstream: None,
            status: None,
        }
    }

    /// The route's limits refused the request with `status`.
    pub fn refused(mut self, status: u16) {
        let span = self.cx.span();
        if span.is_recording() {
            let outcome = if status == 429 {
                "OVER_LIMIT"
            } else {
                "REFUSED"
            };
            span.set_attribute(KeyValue::new("tollgate.outcome", outcome));
        }
        self.status = Some(status);
    }

    /// The upstream call starts: its client span (when sampled), and the trace
    /// headers to send with it.
    pub fn upstream(&mut self, route: &Route) -> Outgoing {
        let span = self.cx.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new("tollgate.outcome", "OK"));
        }
        self.upstream = (self.tracing).child_span(&self.cx, "upstream", SpanKind::Client);
        let mut out = Outgoing::default();
        match &mut self.upstream {
            Some(call) => {
                call.set_attribute(KeyValue::new(
                    "server.address",
                    route.upstream().host().to_string(),
                ));
                if let Some(port) = route.upstream().port_u16() {
                    call.set_attribute(KeyValue::new("server.port", i64::from(port)));
                }
                let cx = self
                    .cx
                    .with_remote_span_context(call.span_context().clone());
                self.tracing.inject(&cx, &mut out);
            }
            None => self.tracing.inject(&self.cx, &mut out),
        }
        out
    }

    /// The upstream answered with `status`, or the proxy answers for it (`Err`: a
    /// 502 or 504 of its own).
    pub fn upstream_answered(&mut self, answer: Result<u16, u16>) {
        let status = match answer {
            Ok(s) | Err(s) => s,
        };
        if let Some(mut call) = self.upstream.take() {
            call.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if let Err(s) = answer {
                call.set_status(Status::error(format!("the proxy answered {s}")));
            }
            call.end();
        }
        self.status = Some(status);
    }

    /// The proxy answered the client with `status` (its own answer, after the call).
    pub fn answered(&mut self, status: u16) {
        self.status = Some(status);
    }
}

impl Drop for RequestSpan {
    /// Ends the spans with the status answered (none: the client went away).
    fn drop(&mut self) {
        if let Some(mut call) = self.upstream.take() {
            call.set_status(Status::error("no response"));
            call.end();
        }
        let span = self.cx.span();
        match self.status {
            Some(status) => {
                span.set_attribute(KeyValue::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
                if status >= 500 {
                    span.set_status(Status::error(format!("HTTP {status}")));
                }
            }
            None => span.set_status(Status::error("the client went away")),
        }
        span.end();
    }
}
