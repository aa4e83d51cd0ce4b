//! [`Answers`]: how a rate-limited service answers what its layer refuses, in its
//! protocol's words: [`Http`] (status codes, a problem body) or [`Grpc`] (gRPC
//! statuses, the retry delay in `google.rpc.RetryInfo`; feature `tonic`).

use http::{HeaderMap, Response, StatusCode};
use tollgate_core::{RuleDecision, RuleSet};

use crate::headers::{insert_all, HeaderStyle, RateLimitHeaders};

/// How [`RateLimitLayer`](super::RateLimitLayer)'s services answer a request they do
/// not pass on, for responses with body `B`.
pub trait Answers<B>: Send + Sync + 'static {
    /// How a request without a key, and one the layer cannot limit, are refused (as
    /// the log says it).
    const REFUSALS: (&'static str, &'static str);
    /// Over the limit: when to come back is in the decision (with the layer's
    /// `Retry-After` and RateLimit fields as headers).
    fn over_limit(decision: &RuleDecision, rules: &RuleSet) -> Response<B>;
    /// A request without a key (`server_fault: false`), or one the layer cannot
    /// limit as it is set up (a key that must be there, a rule set that holds
    /// permits).
    fn refused(server_fault: bool) -> Response<B>;
    /// The limiter's store cannot answer (Redis down, no failure policy).
    fn unavailable() -> Response<B>;
}

/// HTTP answers (the default): `429 Too Many Requests` with `Retry-After`, the
/// RateLimit fields and a problem body; `400` for a request without a key (`500`
/// for the layer's own fault); `503` with `Retry-After: 1` and a problem body when
/// the store cannot answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Http;

impl<B: Default + From<String>> Answers<B> for Http {
    const REFUSALS: (&'static str, &'static str) = ("400", "500");

    fn over_limit(decision: &RuleDecision, rules: &RuleSet) -> Response<B> {
        too_many(decision, rules)
    }

    fn refused(server_fault: bool) -> Response<B> {
        http_refusal(server_fault)
    }

    fn unavailable() -> Response<B> {
        store_unavailable()
    }
}

/// `503` with `Retry-After: 1` and a problem body: the store could not answer.
pub(super) fn store_unavailable<B: From<String>>() -> Response<B> {
    // The store's own recovery is probed every 500 ms (Redis): a second is when
    // asking again makes sense.
    let detail = "the rate limit's store cannot answer";
    let mut response = super::problem(http::StatusCode::SERVICE_UNAVAILABLE, detail, "");
    let one = http::HeaderValue::from_static("1");
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, one);
    response
}

/// gRPC answers, for tonic services (`Server::builder().layer(..)`) and any gRPC
/// server on tower: over the limit `RESOURCE_EXHAUSTED` with the retry delay as
/// `google.rpc.RetryInfo` in the status details and as `retry-after` metadata
/// (seconds, rounded up; with the RateLimit fields), a request without a key
/// `UNAUTHENTICATED` (the key is the caller's identity: an API key in the metadata,
/// the peer; the layer's own fault `INTERNAL`), a store that cannot answer
/// `UNAVAILABLE`. Each is a trailers-only response, as gRPC servers send an error.
#[cfg(feature = "tonic")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc;

#[cfg(feature = "tonic")]
impl<B: Default> Answers<B> for Grpc {
    const REFUSALS: (&'static str, &'static str) = ("UNAUTHENTICATED", "INTERNAL");

    fn over_limit(decision: &RuleDecision, rules: &RuleSet) -> Response<B> {
        use tonic_types::{ErrorDetails, StatusExt};
        let retry = decision
            .decision
            .retry_after_us
            .map(std::time::Duration::from_micros);
        let message = match retry {
            Some(d) => format!("rate limit exceeded: retry in {:.3} s", d.as_secs_f64()),
            None => "rate limit exceeded".to_string(),
        };
        let details = ErrorDetails::with_retry_info(retry);
        let status =
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, message, details);
        let mut response = status.into_http();
        rate_limit_headers(response.headers_mut(), decision, rules);
        response
    }

    fn refused(server_fault: bool) -> Response<B> {
        let status = match server_fault {
            false => tonic::Status::unauthenticated("the request has no rate-limit key"),
            true => {
                tonic::Status::internal("the rate limit is not set up to apply to this request")
            }
        };
        status.into_http()
    }

    fn unavailable() -> Response<B> {
        tonic::Status::unavailable("the rate limit's store cannot answer").into_http()
    }
}

/// The answer to a request without a key ([`MissingKey`](super::MissingKey)): a problem document
/// saying so (400); also the 500 of a rule set the layer cannot apply.
pub(super) fn http_refusal<B: From<String>>(server_fault: bool) -> Response<B> {
    no_key(match server_fault {
        false => StatusCode::BAD_REQUEST,
        true => StatusCode::INTERNAL_SERVER_ERROR,
    })
}

/// The problem document of [`http_refusal`] (`status`: 400 or 500).
fn no_key<B: From<String>>(status: StatusCode) -> Response<B> {
    let detail = if status == StatusCode::BAD_REQUEST {
        "the request has no rate-limit key"
    } else {
        "the rate limit is not set up to apply to this request"
    };
    super::problem(status, detail, "")
}

/// A 429 with `Retry-After` and the RateLimit headers ([`crate::headers`]), its body
/// a problem document saying when to come back.
pub(super) fn too_many<B: From<String>>(decision: &RuleDecision, rules: &RuleSet) -> Response<B> {
    let retry = match decision.decision.retry_after_us {
        Some(us) => format!(r#","retry_after_s":{}"#, us.div_ceil(1_000_000)),
        None => String::new(),
    };
    let mut response = super::problem(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded", &retry);
    rate_limit_headers(response.headers_mut(), decision, rules);
    response
}

/// The layer's headers ([`crate::headers`]; its limit is called `default`): the IETF
/// fields, and `Retry-After` on a reject.
pub(super) fn rate_limit_headers(headers: &mut HeaderMap, d: &RuleDecision, rules: &RuleSet) {
    let h = RateLimitHeaders::new("default", rules, d);
    insert_all(headers, h.fields(HeaderStyle::Ietf, true));
}
