//! A proxied request as the operator sees it, on either serving path: its answer
//! counted by status code and its upstream's time in the route's [`RouteStats`]
//! (always), and, with traces on, its spans: a server span from the route's match to
//! the response (its parent read from the client's `traceparent` or B3 headers), a
//! client span for the upstream call, and the context the upstream receives in place
//! of the client's (its parent is the upstream call's span; when the trace is not
//! sampled, the client's sampling decision is passed on).
//!
//! [`RouteStats`]: super::route_stats::RouteStats

use std::sync::Arc;

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use super::keys::HeaderSource;
use super::routes::Route;
use tollgate_runtime::traces::{Outgoing, Span, Tracing, TRACE_HEADERS};

/// One request of a route, from its match to its answer (counted as it drops).
pub(super) struct RequestObserver {
    route: Arc<Route>,
    /// The status answered (none: the client went away first).
    status: Option<u16>,
    /// When the request went upstream, until the upstream answered.
    sent: Option<tokio::time::Instant>,
    trace: Option<Trace>,
}

/// The spans of a request.
struct Trace {
    tracing: Arc<Tracing>,
    /// The client's context (its baggage, and the parent of `span`).
    parent: Context,
    /// The request's span (held apart from a context: most are not sampled, and need
    /// none built).
    span: Span,
    upstream: Option<Span>,
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

impl RequestObserver {
    /// A request `route` matched; its spans when `tracing`.
    pub fn start(
        tracing: Option<&Arc<Tracing>>,
        headers: &(impl HeaderSource + ?Sized),
        method: &str,
        path: &str,
        route: &Arc<Route>,
    ) -> RequestObserver {
        let trace = tracing.map(|tracing| {
            let parent = tracing.parent_from(headers.names(), &Carrier(headers));
            let span = tracing.span(&parent, SpanKind::Server, || {
                let attributes = vec![
                    KeyValue::new("http.request.method", method.to_string()),
                    KeyValue::new("url.path", path.to_string()),
                    KeyValue::new("http.route", route.name.clone()),
                ];
                (format!("{method} {}", route.name).into(), attributes)
            });
            Trace {
                tracing: tracing.clone(),
                parent,
                span,
                upstream: None,
            }
        });
        RequestObserver {
            route: route.clone(),
            status: None,
            sent: None,
            trace,
        }
    }

    /// The route's limits refused the request with `status`.
    pub fn refused(mut self, status: u16) {
        if let Some(t) = self.trace.as_mut().filter(|t| t.span.is_recording()) {
            let outcome = if status == 429 {
                "OVER_LIMIT"
            } else {
                "REFUSED"
            };
            t.span
                .set_attribute(KeyValue::new("tollgate.outcome", outcome));
        }
        self.status = Some(status);
    }

    /// The request goes upstream now: its client span starts (when sampled); the
    /// trace headers to send with it, with traces on.
    pub fn upstream(&mut self) -> Option<Outgoing> {
        self.sent = Some(tokio::time::Instant::now());
        let t = self.trace.as_mut()?;
        if t.span.is_recording() {
            t.span
                .set_attribute(KeyValue::new("tollgate.outcome", "OK"));
            let cx = (t.parent).with_remote_span_context(t.span.span_context().clone());
            let mut call = t.tracing.child_span(&cx, "upstream", SpanKind::Client);
            let upstream = self.route.upstream();
            call.set_attribute(KeyValue::new("server.address", upstream.host().to_string()));
            if let Some(port) = upstream.port_u16() {
                call.set_attribute(KeyValue::new("server.port", i64::from(port)));
            }
            t.upstream = Some(call);
        }
        let span = match &t.upstream {
            Some(call) => call.span_context(),
            None => t.span.span_context(),
        };
        Some(t.tracing.inject(&t.parent, span))
    }

    /// The upstream answered with `status`, or the proxy answers for it (`Err`: a
    /// 502 or 504 of its own).
    pub fn upstream_answered(&mut self, answer: Result<u16, u16>) {
        let status = match answer {
            Ok(s) | Err(s) => s,
        };
        if let Some(sent) = self.sent.take() {
            (self.route.stats).upstream(sent.elapsed().as_micros() as u64);
        }
        if let Some(mut call) = self.trace.as_mut().and_then(|t| t.upstream.take()) {
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

impl Drop for RequestObserver {
    /// Counts the answer, and ends the spans with it (none: the client went away).
    fn drop(&mut self) {
        if let Some(status) = self.status {
            self.route.stats.answered(status);
        }
        let Some(t) = &mut self.trace else {
            return;
        };
        if let Some(mut call) = t.upstream.take() {
            call.set_status(Status::error("no response"));
            call.end();
        }
        if !t.span.is_recording() {
            return;
        }
        match self.status {
            Some(status) => {
                let (code, error) = tollgate_runtime::traces::http_answer(status);
                t.span.set_attribute(code);
                if let Some(error) = error {
                    t.span.set_status(Status::error(error));
                }
            }
            None => t.span.set_status(Status::error("the client went away")),
        }
        t.span.end();
    }
}
