//! [`ConcurrencyLimitLayer`]: at most `limit` requests in flight per key (tower's
//! `ConcurrencyLimitLayer`, per key, for http), each permit held until the response
//! body has been sent.

use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::concurrency::{ConcurrencyError, KeyedConcurrencyLimiter, KeyedConcurrencyPermit};
use crate::tower::rate_limit::Unkeyed;
use crate::tower::{MissingKey, OnLimit};

/// At most `limit` requests in flight per key, the key extracted by a closure (as
/// for [`RateLimitLayer`](super::RateLimitLayer); a request without a key is
/// refused with `400` unless [`ConcurrencyLimitLayer::on_missing_key`] says
/// otherwise). A permit is taken before the inner service is called and held until
/// the response body has been sent (or dropped: an error, a client gone, a
/// cancelled call all release it), so a key is never locked out. Over the limit:
/// `429 Too Many Requests` at once (the default), or, with [`OnLimit::Wait`], the
/// request waits for a permit, first come first served per key, at most
/// [`ConcurrencyLimitLayer::max_wait`] (default 30 s; then the 429). Every clone of
/// the layer and of its services shares the one count.
///
/// Named after tower's own `ConcurrencyLimitLayer`, which bounds a whole service
/// and holds its permit only until the response head: this one counts per key and
/// holds each permit until the body ends. To use both in one module, rename one on
/// import (`use tollgate::tower::ConcurrencyLimitLayer as PerKeyConcurrency;`).
///
/// ```
/// use tollgate::tower::ConcurrencyLimitLayer;
///
/// // At most 2 requests in flight per API key.
/// let layer = ConcurrencyLimitLayer::new(2, |req: &http::Request<axum::body::Body>| {
///     req.headers().get("x-api-key")?.to_str().ok().map(str::to_owned)
/// });
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "hello" }))
///     .layer(layer);
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimitLayer<K, F> {
    limiter: KeyedConcurrencyLimiter<K>,
    key: Arc<F>,
    on_limit: OnLimit,
    max_wait: Duration,
    missing: MissingKey,
    unkeyed: Arc<Unkeyed>,
}

/// Keys holding or awaiting permits at once, at most (each key is kept only while
/// it does).
const MAX_KEYS: usize = 1_000_000;

impl<K: Hash + Eq, F> ConcurrencyLimitLayer<K, F> {
    /// At most `limit` requests in flight per `key(&request)`.
    ///
    /// # Panics
    ///
    /// When `limit` is 0: no request could ever pass.
    pub fn new(limit: u32, key: F) -> Self {
        assert!(
            limit > 0,
            "ConcurrencyLimitLayer::new: a limit of 0 admits no request"
        );
        ConcurrencyLimitLayer {
            limiter: KeyedConcurrencyLimiter::new(limit, MAX_KEYS),
            key: Arc::new(key),
            on_limit: OnLimit::Reject,
            max_wait: Duration::from_secs(30),
            missing: MissingKey::Reject,
            unkeyed: Arc::default(),
        }
    }

    /// Refuses at once (the default) or waits for a permit.
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }

    /// The longest a request waits for a permit under [`OnLimit::Wait`].
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// What to do with a request whose key closure returns `None` (see
    /// [`MissingKey`]; default: refuse it with `400`).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// Requests that had no key so far (passed through or refused, as
    /// [`ConcurrencyLimitLayer::on_missing_key`] says), over every service the layer
    /// made.
    pub fn unkeyed(&self) -> u64 {
        self.unkeyed.count()
    }
}

impl<S, K, F> Layer<S> for ConcurrencyLimitLayer<K, F> {
    type Service = ConcurrencyLimit<S, K, F>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
            max_wait: self.max_wait,
            missing: self.missing,
            unkeyed: self.unkeyed.clone(),
        }
    }
}

/// The service made by [`ConcurrencyLimitLayer`]. `Clone`; clones share the count.
pub struct ConcurrencyLimit<S, K, F> {
    inner: S,
    limiter: KeyedConcurrencyLimiter<K>,
    key: Arc<F>,
    on_limit: OnLimit,
    max_wait: Duration,
    missing: MissingKey,
    unkeyed: Arc<Unkeyed>,
}

impl<S: Clone, K, F> Clone for ConcurrencyLimit<S, K, F> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
            max_wait: self.max_wait,
            missing: self.missing,
            unkeyed: self.unkeyed.clone(),
        }
    }
}

impl<S, K, F, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, K, F>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    F: Fn(&Request<ReqBody>) -> Option<K> + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<HeldBody<ResBody, K>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let mut inner = super::take_ready(&mut self.inner);
        let Some(key) = (self.key)(&req) else {
            self.unkeyed.note(
                self.missing,
                <super::Http as super::Answers<String>>::REFUSALS,
            );
            return match self.missing.refuses().map(super::answers::http_refusal) {
                Some(refused) => {
                    Box::pin(async { Ok(refused.map(|body| HeldBody { body, permit: None })) })
                }
                None => Box::pin(async move {
                    let response = inner.call(req).await?;
                    Ok(response.map(|body| HeldBody { body, permit: None }))
                }),
            };
        };
        let (limiter, on_limit, max_wait) = (self.limiter.clone(), self.on_limit, self.max_wait);
        Box::pin(async move {
            let permit = match on_limit {
                OnLimit::Reject => limiter.try_acquire(&key, 1),
                OnLimit::Wait => limiter.acquire(&key, 1, max_wait).await,
            };
            let permit = match permit {
                Ok(permit) => permit,
                Err(e) => return Ok(busy(e)),
            };
            let response = inner.call(req).await?;
            Ok(response.map(|body| HeldBody {
                body,
                permit: Some(permit),
            }))
        })
    }
}

/// The 429 of a key at its limit (or a limiter full of keys).
fn busy<B: From<String>, K: Hash + Eq>(e: ConcurrencyError) -> Response<HeldBody<B, K>> {
    let response = super::problem(StatusCode::TOO_MANY_REQUESTS, &e.to_string(), "");
    response.map(|body| HeldBody { body, permit: None })
}

/// A response body holding its request's permit until the body ends (or is
/// dropped).
pub struct HeldBody<B, K: Hash + Eq> {
    body: B,
    permit: Option<KeyedConcurrencyPermit<K>>,
}

// The permit is never pinned: the body is Unpin when its inner body is.
impl<B: Unpin, K: Hash + Eq> Unpin for HeldBody<B, K> {}

impl<B: http_body::Body + Unpin, K: Hash + Eq> http_body::Body for HeldBody<B, K> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || this.body.is_end_stream() {
            // The last frame is out: the work is done.
            this.permit = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
