//! The proxy's own answers: small problem+json bodies (RFC 9457), with `Retry-After`
//! on a rate-limit reject. An answer is a [`Problem`], sent through hyper as a
//! `Response` or written as bytes by the HTTP/1.1 fast path.

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

/// The media type of every answer.
const PROBLEM_JSON: &str = "application/problem+json";

impl Problem {
    fn retry_after(&self) -> Option<u64> {
        self.retry_after_us.map(|us| us.div_ceil(1_000_000))
    }

    /// Writes the answer as an HTTP/1.1 message (`close`: it ends the connection;
    /// `head_only`: to a HEAD request, without the body).
    pub fn write(&self, out: &mut Vec<u8>, date: &[u8], close: bool, head_only: bool) {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\ndate: ");
        out.extend_from_slice(date);
        out.extend_from_slice(b"\r\ncontent-type: application/problem+json\r\n");
        if let Some(s) = self.retry_after() {
            out.extend_from_slice(b"retry-after: ");
            push_decimal(out, s);
            out.extend_from_slice(b"\r\n");
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
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, self.body.len() as u64);
        out.extend_from_slice(b"\r\n\r\n");
        if !head_only {
            out.extend_from_slice(&self.body);
        }
    }
}

/// Writes `n` in decimal (without `fmt`, which costs more than the rest of an
/// answer).
pub(super) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
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

/// The answer to a request no route takes.
pub(super) fn no_route() -> Problem {
    problem(StatusCode::NOT_FOUND, "no route matches this request", None)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_written_as_hyper_would_send_it() {
        let mut p = problem(StatusCode::TOO_MANY_REQUESTS, "slow down", Some(1_500_001));
        p.headers
            .insert("ratelimit", HeaderValue::from_static("\"default\";r=0"));
        let mut out = Vec::new();
        p.write(&mut out, b"Thu, 01 Jan 1970 00:00:00 GMT", true, false);
        let text = String::from_utf8(out).unwrap();
        let body = String::from_utf8(p.body.to_vec()).unwrap();
        assert_eq!(
            text,
            format!(
                "HTTP/1.1 429 Too Many Requests\r\ndate: Thu, 01 Jan 1970 00:00:00 GMT\r\n\
                 content-type: application/problem+json\r\nretry-after: 2\r\n\
                 ratelimit: \"default\";r=0\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            )
        );
        let mut head = Vec::new();
        p.write(&mut head, b"-", false, true);
        assert!(head.ends_with(format!("content-length: {}\r\n\r\n", body.len()).as_bytes()));
        for n in [0, 7, 10, 99, 1234567890, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
    }
}
