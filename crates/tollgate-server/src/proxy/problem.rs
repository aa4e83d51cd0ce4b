//! The proxy's own responses: small problem+json bodies (RFC 9457), with
//! `Retry-After` on a rate-limit reject.

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;

/// A problem+json response with `detail`.
pub(super) fn problem(status: StatusCode, detail: &str, retry_after_us: Option<u64>) -> Response {
    problem_response(status, problem_body(status, detail), retry_after_us)
}

/// The problem+json body for `status` and `detail` (built once per route for rejects).
pub(super) fn problem_body(status: StatusCode, detail: &str) -> bytes::Bytes {
    serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string()
    .into()
}

/// A response of a prepared problem+json `body`, with `Retry-After` in whole seconds
/// (rounded up) when `retry_after_us` is given.
pub(super) fn problem_response(
    status: StatusCode,
    body: bytes::Bytes,
    retry_after_us: Option<u64>,
) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    let headers = r.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(us) = retry_after_us {
        headers.insert(RETRY_AFTER, HeaderValue::from(us.div_ceil(1_000_000)));
    }
    r
}

/// 503 when the Redis store failed and its failure policy is `error`.
pub(super) fn store_unavailable(e: &dyn std::fmt::Display) -> Response {
    // The limiter logs the outage itself, once; this is per request.
    tracing::debug!(error = %e, "tollgate proxy: rate-limit store unavailable");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate limit store unavailable",
        None,
    )
}
