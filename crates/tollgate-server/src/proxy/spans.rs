//! A proxied request's trace spans, on either serving path: a server span from the
//! route's match to the response (its parent read from the client's `traceparent` or
//! B3 headers), a client span for the upstream call, and the context the upstream
//! receives in place of the client's (its parent is the upstream call's span; when
//! the trace is not sampled, the client's sampling decision is passed on).

use std::sync::Arc;

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use super::keys::HeaderSource;
use super::routes::Route;
use crate::traces::{Outgoing, Span, Tracing, TRACE_HEADERS};

/// The spans of one request.
pub(super) struct RequestSpan {
    tracing: Arc<Tracing>,
    /// The client's context (its baggage, and the parent of `span`).
    parent: Context,
    /// The request's span (held apart from a context: most are not sampled, and need
    /// none built).
    span: Span,
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

impl RequestSpan {
    /// The span of a request `route` matched.
    pub fn start(
        tracing: &Arc<Tracing>,
        headers: &(impl HeaderSource + ?Sized),
        method: &str,
        path: &str,
        route: &Route,
    ) -> RequestSpan {
        let parent = tracing.parent_from(headers.names(), &Carrier(headers));
        let span = tracing.span(&parent, SpanKind::Server, || {
            let attributes = vec![
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("url.path", path.to_string()),
                KeyValue::new("http.route", route.name.clone()),
            ];
            (format!("{method} {}", route.name).into(), attributes)
        });
        RequestSpan {
            tracing: tracing.clone(),
            parent,
            span,
            upstream: None,
            status: None,
        }
    }

    /// The route's limits refused the request with `status`.
    pub fn refused(mut self, status: u16) {
        let span = &mut self.span;
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
        let span = &mut self.span;
        if span.is_recording() {
            span.set_attribute(KeyValue::new("tollgate.outcome", "OK"));
            let cx = (self.parent).with_remote_span_context(span.span_context().clone());
            self.upstream = Some(self.tracing.child_span(&cx, "upstream", SpanKind::Client));
        }
        match &mut self.upstream {
            Some(call) => {
                call.set_attribute(KeyValue::new(
                    "server.address",
                    route.upstream().host().to_string(),
                ));
                if let Some(port) = route.upstream().port_u16() {
                    call.set_attribute(KeyValue::new("server.port", i64::from(port)));
                }
                (self.tracing).inject(&self.parent, call.span_context())
            }
            None => (self.tracing).inject(&self.parent, span.span_context()),
        }
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
        let span = &mut self.span;
        if !span.is_recording() {
            return;
        }
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
