//! [`AdaptiveConcurrencyLayer`]: an [`AdaptiveLimiter`] in front of a service. Each
//! request holds a permit until its response head arrives; the response's class
//! (success with its latency, dropped, ignored) moves the limit; shed requests get
//! `503 Service Unavailable` with `Retry-After`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use tollgate_core::{Clock, MonotonicClock};
use tower::{Layer, Service};

use crate::adaptive::{AdaptiveLimiter, AdaptivePermit, Request as Admission};

/// What a response says about the service's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseClass {
    /// Served: the time to the response head is a latency sample.
    Success,
    /// Overloaded (a 503, a 429 from upstream, a timeout): the limit comes down.
    Dropped,
    /// Says nothing about capacity (a client error).
    Ignored,
}

/// How a request is admitted: its priority and caller (for fair shares).
pub trait Prioritize<B>: Send + Sync + 'static {
    /// The admission request for `req`.
    fn admission(&self, req: &Request<B>) -> Admission;
}

impl<B, F> Prioritize<B> for F
where
    F: Fn(&Request<B>) -> Admission + Send + Sync + 'static,
{
    fn admission(&self, req: &Request<B>) -> Admission {
        self(req)
    }
}

/// Every request at normal priority, from no caller in particular (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NormalPriority;

impl<B> Prioritize<B> for NormalPriority {
    fn admission(&self, _: &Request<B>) -> Admission {
        Admission::default()
    }
}

/// How a response is classified.
pub trait Classify<B>: Send + Sync + 'static {
    /// The class of `res`.
    fn classify(&self, res: &Response<B>) -> ResponseClass;
}

impl<B, F> Classify<B> for F
where
    F: Fn(&Response<B>) -> ResponseClass + Send + Sync + 'static,
{
    fn classify(&self, res: &Response<B>) -> ResponseClass {
        self(res)
    }
}

/// The default classifier: 429, 502, 503 and 504 are dropped (the service or what
/// is behind it is overloaded or timing out), other 4xx are ignored (the client's
/// fault), everything else a success. An error from the inner service counts as
/// dropped (tower's timeouts are errors).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByStatus;

impl<B> Classify<B> for ByStatus {
    fn classify(&self, res: &Response<B>) -> ResponseClass {
        match res.status().as_u16() {
            429 | 502 | 503 | 504 => ResponseClass::Dropped,
            400..=499 => ResponseClass::Ignored,
            _ => ResponseClass::Success,
        }
    }
}

/// An adaptive concurrency limit in front of a service: it finds the service's
/// capacity from its response times and failures, queues by priority and sheds the
/// rest with `503` and `Retry-After` (docs/adaptive.md). Every clone of the layer and
/// of its services shares the one limiter.
///
/// ```
/// use tollgate::adaptive::{AdaptiveLimiter, Priority, Request};
/// use tollgate::tower::AdaptiveConcurrencyLayer;
///
/// let limiter = AdaptiveLimiter::fair("gradient:max=500".parse().unwrap());
/// let layer = AdaptiveConcurrencyLayer::new(limiter).prioritize(|req: &http::Request<()>| {
///     let priority = match req.headers().get("x-priority").and_then(|v| v.to_str().ok()) {
///         Some(p) => p.parse().unwrap_or_default(),
///         None => Priority::NORMAL,
///     };
///     let caller = req.headers().get("x-api-key").map(|v| v.as_bytes()).unwrap_or_default();
///     Request::new(priority).caller(caller)
/// });
/// # let _ = layer;
/// ```
pub struct AdaptiveConcurrencyLayer<C: Clock = MonotonicClock, P = NormalPriority, K = ByStatus> {
    limiter: AdaptiveLimiter<C>,
    prioritize: Arc<P>,
    classify: Arc<K>,
    max_wait: Option<Duration>,
}

impl<C: Clock, P, K> Clone for AdaptiveConcurrencyLayer<C, P, K> {
    fn clone(&self) -> Self {
        AdaptiveConcurrencyLayer {
            limiter: self.limiter.clone(),
            prioritize: self.prioritize.clone(),
            classify: self.classify.clone(),
            max_wait: self.max_wait,
        }
    }
}

impl<C: Clock> AdaptiveConcurrencyLayer<C> {
    /// Limits with `limiter`: every request at normal priority, responses classified
    /// [`ByStatus`], waits bounded by the limiter's queueing-delay target only.
    pub fn new(limiter: AdaptiveLimiter<C>) -> Self {
        AdaptiveConcurrencyLayer {
            limiter,
            prioritize: Arc::new(NormalPriority),
            classify: Arc::new(ByStatus),
            max_wait: None,
        }
    }
}

impl<C: Clock, P, K> AdaptiveConcurrencyLayer<C, P, K> {
    /// Priority and caller per request.
    pub fn prioritize<P2>(self, prioritize: P2) -> AdaptiveConcurrencyLayer<C, P2, K> {
        AdaptiveConcurrencyLayer {
            limiter: self.limiter,
            prioritize: Arc::new(prioritize),
            classify: self.classify,
            max_wait: self.max_wait,
        }
    }

    /// The class of each response.
    pub fn classify<K2>(self, classify: K2) -> AdaptiveConcurrencyLayer<C, P, K2> {
        AdaptiveConcurrencyLayer {
            limiter: self.limiter,
            prioritize: self.prioritize,
            classify: Arc::new(classify),
            max_wait: self.max_wait,
        }
    }

    /// The longest a request waits for a permit, besides the queueing-delay target.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The limiter (for its stats).
    pub fn limiter(&self) -> &AdaptiveLimiter<C> {
        &self.limiter
    }
}

impl<S, C: Clock, P, K> Layer<S> for AdaptiveConcurrencyLayer<C, P, K> {
    type Service = AdaptiveConcurrency<S, C, P, K>;

    fn layer(&self, inner: S) -> Self::Service {
        AdaptiveConcurrency {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service made by [`AdaptiveConcurrencyLayer`]. `Clone`; clones share the limit.
pub struct AdaptiveConcurrency<S, C: Clock = MonotonicClock, P = NormalPriority, K = ByStatus> {
    inner: S,
    layer: AdaptiveConcurrencyLayer<C, P, K>,
}

impl<S: Clone, C: Clock, P, K> Clone for AdaptiveConcurrency<S, C, P, K> {
    fn clone(&self) -> Self {
        AdaptiveConcurrency {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, C, P, K, ReqBody, ResBody> Service<Request<ReqBody>> for AdaptiveConcurrency<S, C, P, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    C: Clock + 'static,
    P: Prioritize<ReqBody>,
    K: Classify<ResBody>,
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
        let mut inner = super::take_ready(&mut self.inner);
        let admission = self.layer.prioritize.admission(&req);
        let (limiter, classify, max_wait) = (
            self.layer.limiter.clone(),
            self.layer.classify.clone(),
            self.layer.max_wait,
        );
        Box::pin(async move {
            let permit = match limiter.acquire_with(admission, max_wait).await {
                Ok(permit) => permit,
                Err(_) => return Ok(shed()),
            };
            match inner.call(req).await {
                Ok(response) => {
                    report(permit, classify.classify(&response));
                    Ok(response)
                }
                Err(e) => {
                    permit.dropped();
                    Err(e)
                }
            }
        })
    }
}

fn report<C: Clock>(permit: AdaptivePermit<C>, class: ResponseClass) {
    match class {
        ResponseClass::Success => permit.success(),
        ResponseClass::Dropped => permit.dropped(),
        ResponseClass::Ignored => permit.ignore(),
    }
}

/// A 503 with `Retry-After`: one second, the header's smallest unit (a shed
/// request may well pass sooner; clients with backoff find out).
fn shed<B: Default>() -> Response<B> {
    let mut response = super::unavailable();
    response
        .headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
