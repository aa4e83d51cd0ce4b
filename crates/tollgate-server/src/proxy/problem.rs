//! The proxy's own answers: small problem+json bodies (RFC 9457), with `Retry-After`
//! on a rate-limit reject. An answer is a [`Problem`], sent through hyper as a
//! `Response` or written as bytes by the HTTP/1.1 fast path.

use std::io::Write;

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One of the proxy's own answers: a status, a prepared problem+json body, maybe a
/// `Retry-After` and the route's rate-limit headers.
pub(super) struct Problem {
    pub status: StatusCode,
    pub body: bytes::Bytes,
    /// `Retry-After` in whole seconds, rounded up.
    pub retry_after_us: Option<u64>,
    /// More headers (the rate-limit headers of a reject).
    pub headers: HeaderMap,
}

/// A problem+json answer with `detail`.
pub(super) fn problem(status: StatusCode, detail: &str, retry_after_us: Option<u64>) -> Problem {
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

/// An answer of a prepared problem+json `body`, with `Retry-After` when
/// `retry_after_us` is given.
pub(super) fn problem_response(
    status: StatusCode,
    body: bytes::Bytes,
    retry_after_us: Option<u64>,
) -> Problem {
    Problem {
        status,
        body,
        retry_after_us,
        headers: HeaderMap::new(),
    }
}

const PROBLEM_JSON: &str = "application/problem+json";

impl Problem {
    fn retry_after(&self) -> Option<u64> {
        self.retry_after_us.map(|us| us.div_ceil(1_000_000))
    }

    /// Writes the answer as an HTTP/1.1 message (`close`: it ends the connection;
    /// `head_only`: to a HEAD request, without the body).
    pub fn write(&self, out: &mut Vec<u8>, date: &[u8], close: bool, head_only: bool) {
        let reason = self.status.canonical_reason().unwrap_or("");
        let _ = write!(out, "HTTP/1.1 {} {reason}\r\n", self.status.as_u16());
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(date);
        let _ = write!(out, "\r\ncontent-type: {PROBLEM_JSON}\r\n");
        if let Some(s) = self.retry_after() {
            let _ = write!(out, "retry-after: {s}\r\n");
        }
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        let _ = write!(out, "content-length: {}\r\n\r\n", self.body.len());
        if !head_only {
            out.extend_from_slice(&self.body);
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let retry_after = self.retry_after();
        let mut r = Response::new(Body::from(self.body));
        *r.status_mut() = self.status;
        let headers = r.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(s) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(s));
        }
        headers.extend(self.headers);
        r
    }
}

/// 503 when the Redis store failed and its failure policy is `error`.
pub(super) fn store_unavailable(e: &dyn std::fmt::Display) -> Problem {
    // The limiter logs the outage itself, once; this is per request.
    tracing::debug!(error = %e, "tollgate proxy: rate-limit store unavailable");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate limit store unavailable",
        None,
    )
}
