//! The proxy's own answers: small problem+json bodies (RFC 9457), with `Retry-After`
//! on a rate-limit reject, or a reject in OpenAI's error shape for a route that fronts
//! an OpenAI-compatible API (`reject_format: openai`). An answer is a [`Problem`], sent
//! through hyper as a `Response` or written as bytes by the HTTP/1.1 fast path.

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One of the proxy's own answers: a status, a prepared problem+json body, maybe a
/// `Retry-After` and the route's rate-limit headers.
#[derive(Debug)]
pub(super) struct Problem {
    pub status: StatusCode,
    /// The body's media type: problem+json, or JSON for OpenAI's error object.
    pub content_type: &'static str,
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
        content_type: PROBLEM_JSON,
        body,
        retry_after_us,
        headers: HeaderMap::new(),
    }
}

/// The media type of the proxy's problem answers.
const PROBLEM_JSON: &str = "application/problem+json";

/// What an OpenAI-shaped reject says of the budget that refused it.
pub(super) struct OpenAiReject<'a> {
    /// `tokens` on a `cost:` route, else `requests` (the suffix of OpenAI's
    /// `x-ratelimit-*` headers).
    pub unit: &'static str,
    /// What refused, in words (`route llm: budget fixed-window:...`).
    pub what: &'a str,
    /// The binding policy's limit and what is left of it (`None` for `limit_conn`).
    pub budget: Option<(u64, u64)>,
    /// The units the request asked for.
    pub requested: u64,
    /// Until the request would pass, in us.
    pub retry_after_us: u64,
    /// Until the budget is whole again, in us.
    pub reset_after_us: u64,
}

/// A reject in OpenAI's error shape, so that its SDKs raise their rate-limit error
/// with a message that says what refused and when to come back, and their retries
/// wait that long: `{"error": {"message", "type", "param", "code"}}` (type and code
/// `rate_limit_exceeded`), `Retry-After` (whole seconds), `retry-after-ms`, and
/// OpenAI's `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
/// `x-ratelimit-reset-*` for the budget.
pub(super) fn openai_reject(status: StatusCode, r: &OpenAiReject) -> Problem {
    let mut message = format!("Rate limit reached for {}", r.what);
    if let Some((limit, remaining)) = r.budget {
        message += &format!(
            " on {}: limit {limit}, remaining {remaining}, requested {}",
            r.unit, r.requested
        );
    }
    message += &format!(
        ". Please try again in {}.",
        openai_duration(r.retry_after_us)
    );
    let body = serde_json::json!({"error": {
        "message": message,
        "type": "rate_limit_exceeded",
        "param": null,
        "code": "rate_limit_exceeded",
    }});
    let mut headers = HeaderMap::new();
    headers.insert(
        "retry-after-ms",
        HeaderValue::from(r.retry_after_us.div_ceil(1000)),
    );
    if let Some((limit, remaining)) = r.budget {
        openai_budget_headers(&mut headers, r.unit, (limit, remaining), r.reset_after_us);
    }
    Problem {
        status,
        content_type: "application/json",
        body: body.to_string().into(),
        retry_after_us: Some(r.retry_after_us),
        headers,
    }
}

/// OpenAI's `x-ratelimit-limit-UNIT`, `x-ratelimit-remaining-UNIT` and
/// `x-ratelimit-reset-UNIT` (`unit`: `tokens` or `requests`) for a budget's `limit`,
/// what is left of it, and when it is whole again.
pub(super) fn openai_budget_headers(
    headers: &mut HeaderMap,
    unit: &str,
    (limit, remaining): (u64, u64),
    reset_after_us: u64,
) {
    let [limit_name, remaining_name, reset_name] = if unit == "tokens" {
        [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ]
    } else {
        [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ]
    };
    let reset = openai_duration(reset_after_us);
    headers.insert(limit_name, HeaderValue::from(limit));
    headers.insert(remaining_name, HeaderValue::from(remaining));
    headers.insert(reset_name, HeaderValue::try_from(reset).expect("ASCII"));
}

/// A duration as OpenAI's headers and messages write one: `20ms`, `1.5s`, `6m0s`,
/// `1h2m3s` (milliseconds rounded up).
fn openai_duration(us: u64) -> String {
    let ms = us.div_ceil(1000);
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut secs = s.to_string();
    if frac > 0 {
        secs += format!(".{frac:03}").trim_end_matches('0');
    }
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

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
        out.extend_from_slice(b"\r\ncontent-type: ");
        out.extend_from_slice(self.content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
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
pub(super) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(tollgate::headers::Decimal::new(n).as_bytes());
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let retry_after = self.retry_after();
        let mut r = Response::new(Body::from(self.body));
        *r.status_mut() = self.status;
        let headers = r.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(self.content_type));
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

    #[test]
    fn an_openai_reject_says_what_refused_and_when_in_openais_shape() {
        let p = openai_reject(
            StatusCode::TOO_MANY_REQUESTS,
            &OpenAiReject {
                unit: "tokens",
                what: "route llm: fixed-window:limit=1000,window=1m",
                budget: Some((1000, 40)),
                requested: 300,
                retry_after_us: 1_500_000,
                reset_after_us: 61_000_001,
            },
        );
        let body: serde_json::Value = serde_json::from_slice(&p.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {
                "message": "Rate limit reached for route llm: fixed-window:limit=1000,window=1m \
                            on tokens: limit 1000, remaining 40, requested 300. \
                            Please try again in 1.5s.",
                "type": "rate_limit_exceeded", "param": null, "code": "rate_limit_exceeded"}})
        );
        let mut out = Vec::new();
        p.write(&mut out, b"-", false, false);
        let text = String::from_utf8(out).unwrap();
        for line in [
            "content-type: application/json\r\n",
            "retry-after: 2\r\n",
            "retry-after-ms: 1500\r\n",
            "x-ratelimit-limit-tokens: 1000\r\n",
            "x-ratelimit-remaining-tokens: 40\r\n",
            "x-ratelimit-reset-tokens: 1m1.001s\r\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        for (us, text) in [
            (1, "1ms"),
            (20_000, "20ms"),
            (1_000_000, "1s"),
            (1_500_000, "1.5s"),
            (360_000_000, "6m0s"),
            (3_723_000_000, "1h2m3s"),
        ] {
            assert_eq!(openai_duration(us), text);
        }
    }
}
