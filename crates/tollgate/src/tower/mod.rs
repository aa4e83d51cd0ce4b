//! tower layers for services (feature `tower`):
//!
//! * [`RateLimitLayer`] / [`ErrorLayer`]: one rate limit per key, shared by every
//!   clone of the service, rejecting with 429 (or an error) or waiting, and charging
//!   what a response says it used ([`RateLimitLayer::charge_with`]); for gRPC
//!   services (tonic), `RateLimitLayer::grpc` answers with gRPC statuses
//!   (feature `tonic`);
//! * [`ConcurrencyLimitLayer`]: at most N requests in flight per key, each permit
//!   held until its response body has been sent;
//! * [`AdaptiveConcurrencyLayer`]: an adaptive concurrency limit in front of a
//!   service, fed by its responses, shedding with 503 by priority.

mod adaptive;
mod answers;
mod concurrency;
mod rate_limit;

pub use adaptive::{
    AdaptiveConcurrency, AdaptiveConcurrencyLayer, ByStatus, Classify, NormalPriority, Prioritize,
    ResponseClass,
};
#[cfg(feature = "tonic")]
pub use answers::Grpc;
pub use answers::{Answers, Http};
pub use concurrency::{ConcurrencyLimit, ConcurrencyLimitLayer, HeldBody, PermitSource};
#[cfg(feature = "axum")]
pub use rate_limit::{peer_ip, PeerIp};
pub use rate_limit::{
    BoxError, ErrorLayer, ErrorService, MissingKey, NoCharge, NoKey, OnLimit, RateLimit,
    RateLimitLayer, RateLimited, RequestCost, ResponseCost, Unit, Usage,
};

/// The service polled ready, to be called; a fresh clone is left in its place (the
/// tower idiom for services whose futures outlive `&mut self`).
fn take_ready<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}

/// An answer with a problem document (RFC 9457) for a body: `status`, its reason as
/// the title, `detail`, and `extra` JSON members (`,"retry_after_s":60`).
fn problem<B: From<String>>(
    status: http::StatusCode,
    detail: &str,
    extra: &str,
) -> http::Response<B> {
    let body = format!(
        r#"{{"type":"about:blank","title":"{}","status":{},"detail":"{detail}"{extra}}}"#,
        status.canonical_reason().unwrap_or(""),
        status.as_u16()
    );
    let mut response = http::Response::new(B::from(body));
    *response.status_mut() = status;
    let json = http::HeaderValue::from_static("application/problem+json");
    (response.headers_mut()).insert(http::header::CONTENT_TYPE, json);
    response
}

/// An empty 503: the request was shed (adaptive, which adds `Retry-After`).
fn unavailable<B: Default>() -> http::Response<B> {
    let mut response = http::Response::new(B::default());
    *response.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    response
}
