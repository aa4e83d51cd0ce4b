//! What `serve`'s calls and decisions write on their trace spans: a server span per
//! decision call (gRPC `ShouldRateLimit`, `POST /json`, `/v1/check|acquire|charge`,
//! the admin calls) with the RPC or HTTP attributes of OpenTelemetry's conventions,
//! the decision's own attributes (`tollgate.*`), and a span per RLQS usage report.

use opentelemetry::trace::{SpanKind, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use crate::calls::Method;
use crate::CheckResult;
use tollgate_runtime::traces::Tracing;

/// The gRPC service of `ShouldRateLimit`.
const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The gRPC service of `StreamRateLimitQuotas`.
const RLQS: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// The span of a gRPC call (health checks are not traced).
pub fn grpc_call(tracing: &Tracing, headers: &http::HeaderMap, method: Method) -> Option<Context> {
    match method {
        Method::ShouldRateLimit => tracing.call_span(headers, || {
            let name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
            (name.into(), rpc(RLS, "ShouldRateLimit"))
        }),
        // A stream is not one span: each report is, under the Envoy's context.
        Method::StreamRateLimitQuotas => Some(tracing.parent(headers)),
        Method::HealthCheck => None,
    }
}

/// The RPC attributes of OpenTelemetry's conventions.
fn rpc(service: &'static str, method: &'static str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", service),
        KeyValue::new("rpc.method", method),
    ]
}

/// Ends a gRPC call's span with its status.
pub fn end_grpc(cx: &Context, code: tonic::Code, message: Option<&str>) {
    let error =
        (code != tonic::Code::Ok).then(|| message.unwrap_or(code.description()).to_string());
    let code = KeyValue::new("rpc.grpc.status_code", code as i64);
    tollgate_runtime::traces::end(cx, Some(code), error);
}

/// The HTTP routes traced: the decisions and the admin calls.
const TRACED_ROUTES: [&str; 6] = [
    "/v1/check",
    "/v1/acquire",
    "/v1/charge",
    "/v1/reset",
    "/v1/reload",
    "/json",
];

/// The span of an HTTP call, when its route is traced.
pub fn http_call(tracing: &Tracing, request: &http::Request<axum::body::Body>) -> Option<Context> {
    let path = request.uri().path();
    let route: &'static str = TRACED_ROUTES.iter().find(|r| **r == path)?;
    let method = request.method();
    tracing.call_span(request.headers(), || {
        let attributes = vec![
            KeyValue::new("http.request.method", method.as_str().to_string()),
            KeyValue::new("http.route", route),
            KeyValue::new("url.path", route),
        ];
        (format!("{method} {route}").into(), attributes)
    })
}

/// Ends an HTTP call's span with its status (an error from 500 up).
pub fn end_http(cx: &Context, status: u16) {
    let (code, error) = tollgate_runtime::traces::http_answer(status);
    tollgate_runtime::traces::end(cx, Some(code), error);
}

/// A span for one RLQS usage report of the stream whose Envoy sent `parent`.
pub fn quota_report(tracing: &Tracing, parent: &Context, buckets: usize) -> Context {
    let span = tracing.span(parent, SpanKind::Server, || {
        let mut attributes = rpc(RLQS, "StreamRateLimitQuotas");
        attributes.push(KeyValue::new("tollgate.quota.reports", buckets as i64));
        ("RLQS usage report".into(), attributes)
    });
    parent.with_span(span)
}

/// Ends a report's span, with the stream's error if the report ended it.
pub fn end_quota_report(cx: &Context, error: Option<&tonic::Status>) {
    tollgate_runtime::traces::end(cx, None, error.map(|e| e.message().to_string()));
}

/// Writes the decision on the current span, if it is recording: the domain, the
/// outcome, the store, and the binding rule (the one that rejected with the
/// longest wait, or the admitting one with the least left) with its policies.
pub fn record_decision(domain: &str, result: &CheckResult, store: &'static str) {
    Context::map_current(|cx| {
        let span = cx.span();
        if !span.is_recording() {
            return;
        }
        let mut attributes = vec![
            KeyValue::new("tollgate.domain", domain.to_string()),
            KeyValue::new("tollgate.outcome", result.overall.name()),
            KeyValue::new("tollgate.store", store),
            KeyValue::new("tollgate.descriptors", result.statuses.len() as i64),
        ];
        if let Some((limit, decided)) = result.binding() {
            let d = &decided.decision;
            let rule = limit.name.clone().unwrap_or_else(|| limit.path.clone());
            attributes.push(KeyValue::new("tollgate.rule", rule));
            if let Some(specs) = &limit.specs {
                attributes.push(KeyValue::new("tollgate.policy", specs.join(" AND ")));
            }
            let remaining = d.remaining.min(i64::MAX as u64) as i64;
            attributes.push(KeyValue::new("tollgate.remaining", remaining));
            if let Some(retry) = d.retry_after_us {
                let retry = retry.min(i64::MAX as u64) as i64;
                attributes.push(KeyValue::new("tollgate.retry_after_us", retry));
            }
        }
        if result.statuses.iter().any(|s| s.shadow_rejected) {
            attributes.push(KeyValue::new("tollgate.shadow_rejected", true));
        }
        span.set_attributes(attributes);
    });
}
