//! A tower layer for http services (feature `tower`): one limit per key, shared by
//! every clone of the service, rejecting with 429 or waiting.

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use tollgate_core::{Clock, Op, RuleDecision, RuleSet};
use tower::{Layer, Service};

use crate::{KeyedError, KeyedLimiter};

/// What the layer does with a request over the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLimit {
    /// Answer `429 Too Many Requests` with `Retry-After`, `RateLimit-Policy` and
    /// `RateLimit` headers, without calling the inner service.
    #[default]
    Reject,
    /// Wait for the request's turn (FIFO per key, up to the policy's `max-wait`; past
    /// it, reject as above), then call the inner service.
    Wait,
}

/// Limits requests per key, the key extracted by a closure (peer IP, a header, the
/// path, or any compound): `None` means "not limited". Every clone of the layer and
/// of the services it makes shares one [`KeyedLimiter`], so the limit holds across
/// connections (axum clones the service per connection).
///
/// Admitted responses carry `RateLimit-Policy` and `RateLimit` headers (IETF httpapi
/// draft, structured fields): `RateLimit-Policy: "p0";q=LIMIT;w=WINDOW_S` per policy
/// and `RateLimit: "pN";r=REMAINING;t=RESET_S` for the binding one.
///
/// ```
/// use tollgate::tower::{OnLimit, RateLimitLayer};
/// use tollgate::{KeyedLimiter, Policy};
///
/// let limiter: KeyedLimiter<String> = KeyedLimiter::new("gcra:rate=10/s,burst=20".parse::<Policy>().unwrap());
/// let layer = RateLimitLayer::new(limiter, |req: &http::Request<()>| {
///     req.headers().get("x-api-key")?.to_str().ok().map(str::to_owned)
/// })
/// .on_limit(OnLimit::Reject);
/// # let _ = layer;
/// ```
pub struct RateLimitLayer<K, F, C: Clock> {
    limiter: KeyedLimiter<K, C>,
    key: Arc<F>,
    on_limit: OnLimit,
}

impl<K, F, C: Clock> Clone for RateLimitLayer<K, F, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
        }
    }
}

impl<K, F, C: Clock> RateLimitLayer<K, F, C> {
    /// Limits with `limiter`, keyed by `key(&request)`.
    pub fn new(limiter: KeyedLimiter<K, C>, key: F) -> Self {
        RateLimitLayer {
            limiter,
            key: Arc::new(key),
            on_limit: OnLimit::Reject,
        }
    }

    /// Rejects (the default) or waits.
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }
}

impl<S, K, F, C: Clock> Layer<S> for RateLimitLayer<K, F, C> {
    type Service = RateLimit<S, K, F, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
        }
    }
}

/// The service made by [`RateLimitLayer`]. `Clone`; clones share the limit.
pub struct RateLimit<S, K, F, C: Clock> {
    inner: S,
    limiter: KeyedLimiter<K, C>,
    key: Arc<F>,
    on_limit: OnLimit,
}

impl<S: Clone, K, F, C: Clock> Clone for RateLimit<S, K, F, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
        }
    }
}

impl<S, K, F, C, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, K, F, C>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    F: Fn(&Request<ReqBody>) -> Option<K> + Send + Sync + 'static,
    C: Clock + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // The service polled ready is the one to call; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(key) = (self.key)(&req) else {
            return Box::pin(inner.call(req));
        };
        let limiter = self.limiter.clone();
        let on_limit = self.on_limit;
        Box::pin(async move {
            let op = match on_limit {
                OnLimit::Reject => Op::Try,
                OnLimit::Wait => Op::Acquire,
            };
            let decision = match limiter.check_rules(&key, 1, op) {
                Ok(d) => d,
                // A full limiter refusing new keys, or a policy that never admits a
                // unit: over the limit either way.
                Err(KeyedError::TooManyKeys { .. }) | Err(KeyedError::Check(_)) => {
                    return Ok(too_many(None, &limiter.rules()));
                }
            };
            if !decision.decision.allowed {
                return Ok(too_many(Some(&decision), &limiter.rules()));
            }
            if op == Op::Acquire && decision.decision.wait_us > 0 {
                let refund = crate::wait::RefundOnDrop::new(|| limiter.refund(&key, 1));
                crate::wait::sleep_or_refund(decision.decision.wait(), refund).await;
            }
            let mut response = inner.call(req).await?;
            rate_limit_headers(response.headers_mut(), &decision, &limiter.rules());
            Ok(response)
        })
    }
}

/// A 429 with `Retry-After` (whole seconds, rounded up) and the RateLimit headers.
fn too_many<B: Default>(decision: Option<&RuleDecision>, rules: &RuleSet) -> Response<B> {
    let mut response = Response::new(B::default());
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    if let Some(d) = decision {
        if let Some(retry) = d.decision.retry_after_us {
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(seconds(retry)));
        }
        rate_limit_headers(headers, d, rules);
    }
    response
}

fn rate_limit_headers(headers: &mut HeaderMap, d: &RuleDecision, rules: &RuleSet) {
    let policy = rules
        .policies()
        .iter()
        .enumerate()
        .map(|(i, p)| format!("\"p{i}\";q={};w={}", p.limit(), seconds(p.window_us())))
        .collect::<Vec<_>>()
        .join(", ");
    let current = format!(
        "\"p{}\";r={};t={}",
        d.binding,
        d.decision.remaining,
        seconds(d.decision.reset_after_us)
    );
    for (name, value) in [("ratelimit-policy", policy), ("ratelimit", current)] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
}

/// Microseconds as whole seconds, rounded up (a client must not retry early).
fn seconds(us: u64) -> u64 {
    us.div_ceil(1_000_000)
}

/// The error [`ErrorLayer`]'s services return for a request over the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rate limited: retry after {retry_after_us:?} us")]
pub struct RateLimited {
    /// When the same request could pass (`None`: not known to ever pass).
    pub retry_after_us: Option<u64>,
    /// The overall decision.
    pub decision: tollgate_core::Decision,
}

/// The error type of [`ErrorLayer`]'s services: tower's usual boxed error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// [`RateLimitLayer`] for services that are not http: a request over the limit gets
/// the error [`RateLimited`] (boxed, as tower layers do) instead of a 429, or waits
/// with [`OnLimit::Wait`].
pub struct ErrorLayer<K, F, C: Clock> {
    layer: RateLimitLayer<K, F, C>,
}

impl<K, F, C: Clock> Clone for ErrorLayer<K, F, C> {
    fn clone(&self) -> Self {
        ErrorLayer {
            layer: self.layer.clone(),
        }
    }
}

impl<K, F, C: Clock> ErrorLayer<K, F, C> {
    /// Limits with `limiter`, keyed by `key(&request)` (`None`: not limited).
    pub fn new(limiter: KeyedLimiter<K, C>, key: F) -> Self {
        ErrorLayer {
            layer: RateLimitLayer::new(limiter, key),
        }
    }

    /// Rejects with an error (the default) or waits.
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.layer = self.layer.on_limit(on_limit);
        self
    }
}

impl<S, K, F, C: Clock> Layer<S> for ErrorLayer<K, F, C> {
    type Service = ErrorService<S, K, F, C>;

    fn layer(&self, inner: S) -> Self::Service {
        ErrorService(self.layer.layer(inner))
    }
}

/// The service made by [`ErrorLayer`]. `Clone`; clones share the limit.
pub struct ErrorService<S, K, F, C: Clock>(RateLimit<S, K, F, C>);

impl<S: Clone, K, F, C: Clock> Clone for ErrorService<S, K, F, C> {
    fn clone(&self) -> Self {
        ErrorService(self.0.clone())
    }
}

impl<S, K, F, C, Req> Service<Req> for ErrorService<S, K, F, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    F: Fn(&Req) -> Option<K> + Send + Sync + 'static,
    C: Clock + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let svc = &mut self.0;
        let clone = svc.inner.clone();
        let mut inner = std::mem::replace(&mut svc.inner, clone);
        let Some(key) = (svc.key)(&req) else {
            return Box::pin(async move { inner.call(req).await.map_err(Into::into) });
        };
        let limiter = svc.limiter.clone();
        let op = match svc.on_limit {
            OnLimit::Reject => Op::Try,
            OnLimit::Wait => Op::Acquire,
        };
        Box::pin(async move {
            let d = limiter.check_rules(&key, 1, op)?.decision;
            if !d.allowed {
                return Err(RateLimited {
                    retry_after_us: d.retry_after_us,
                    decision: d,
                }
                .into());
            }
            if d.wait_us > 0 {
                let refund = crate::wait::RefundOnDrop::new(|| limiter.refund(&key, 1));
                crate::wait::sleep_or_refund(d.wait(), refund).await;
            }
            inner.call(req).await.map_err(Into::into)
        })
    }
}
