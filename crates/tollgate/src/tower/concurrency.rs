//! [`ConcurrencyLimitLayer`]: at most `limit` requests in flight per key (tower's
//! `ConcurrencyLimitLayer`, per key, for http), each permit held until the response
//! body has been sent; the permits in memory or, shared by every process, in Redis
//! ([`PermitSource`]).

use std::future::Future;
use std::hash::Hash;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tower::{Layer, Service};

use crate::concurrency::{KeyedConcurrencyLimiter, KeyedConcurrencyPermit, PermitError};
use crate::tower::rate_limit::Unkeyed;
use crate::tower::{MissingKey, OnLimit};

/// Where [`ConcurrencyLimitLayer`] takes its permits: a [`KeyedConcurrencyLimiter`]
/// (one process; the default) or, with feature `redis`, a
/// [`RedisConcurrencyLimiter`](crate::redis::RedisConcurrencyLimiter) (every process
/// on the Redis shares the count; keys are `String`s; its failure policy decides
/// what a Redis outage does, and an error it returns is answered `503`).
pub trait PermitSource<K>: Clone + Send + Sync + 'static {
    /// A held permit: given back when dropped.
    type Permit: Send + 'static;

    /// One permit for `key`: now or an error (`wait` `None`), or waiting in the key's
    /// queue at most `wait`.
    fn take(
        &self,
        key: &K,
        wait: Option<Duration>,
    ) -> impl Future<Output = Result<Self::Permit, PermitError>> + Send;
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> PermitSource<K> for KeyedConcurrencyLimiter<K> {
    type Permit = KeyedConcurrencyPermit<K>;

    async fn take(&self, key: &K, wait: Option<Duration>) -> Result<Self::Permit, PermitError> {
        Ok(match wait {
            None => self.try_acquire(key, 1)?,
            Some(wait) => self.acquire(key, 1, wait).await?,
        })
    }
}

#[cfg(feature = "redis")]
impl PermitSource<String> for crate::redis::RedisConcurrencyLimiter {
    type Permit = crate::redis::RedisPermit;

    async fn take(
        &self,
        key: &String,
        wait: Option<Duration>,
    ) -> Result<Self::Permit, PermitError> {
        match wait {
            None => self.try_acquire(key, 1).await,
            Some(wait) => self.acquire(key, 1, wait).await,
        }
    }
}

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
/// [`ConcurrencyLimitLayer::with_permits`] takes the permits from elsewhere: a
/// [`RedisConcurrencyLimiter`](crate::redis::RedisConcurrencyLimiter) shares each
/// key's count with every process on the Redis.
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
pub struct ConcurrencyLimitLayer<K, F, L = KeyedConcurrencyLimiter<K>> {
    limiter: L,
    key: Arc<F>,
    on_limit: OnLimit,
    max_wait: Duration,
    missing: MissingKey,
    unkeyed: Arc<Unkeyed>,
    key_type: PhantomData<fn() -> K>,
}

/// Keys holding or awaiting permits at once, at most (each key is kept only while
/// it does).
const MAX_KEYS: usize = 1_000_000;

impl<K: Hash + Eq, F> ConcurrencyLimitLayer<K, F> {
    /// At most `limit` requests in flight per `key(&request)`, counted in memory.
    ///
    /// # Panics
    ///
    /// When `limit` is 0: no request could ever pass.
    pub fn new(limit: u32, key: F) -> Self {
        assert!(
            limit > 0,
            "ConcurrencyLimitLayer::new: a limit of 0 admits no request"
        );
        ConcurrencyLimitLayer::with_permits(KeyedConcurrencyLimiter::new(limit, MAX_KEYS), key)
    }
}

impl<K, F, L> ConcurrencyLimitLayer<K, F, L> {
    /// Requests in flight per `key(&request)`, each holding a permit of `permits`
    /// (see [`PermitSource`]).
    ///
    /// ```
    /// # #[cfg(feature = "redis")]
    /// # async fn demo(store: tollgate::redis::RedisStore) -> Result<(), tollgate::Error> {
    /// use tollgate::redis::RedisConcurrencyLimiter;
    /// use tollgate::tower::ConcurrencyLimitLayer;
    ///
    /// // At most 4 exports at once per tenant, over every replica of the service.
    /// let exports = RedisConcurrencyLimiter::new(store, "exports", 4)?;
    /// let layer = ConcurrencyLimitLayer::with_permits(exports, |req: &http::Request<axum::body::Body>| {
    ///     req.headers().get("x-tenant")?.to_str().ok().map(str::to_owned)
    /// });
    /// let app: axum::Router = axum::Router::new()
    ///     .route("/export", axum::routing::post(|| async { "done" }))
    ///     .layer(layer);
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_permits(permits: L, key: F) -> Self {
        ConcurrencyLimitLayer {
            limiter: permits,
            key: Arc::new(key),
            on_limit: OnLimit::Reject,
            max_wait: Duration::from_secs(30),
            missing: MissingKey::Reject,
            unkeyed: Arc::default(),
            key_type: PhantomData,
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

impl<S, K, F, L: Clone> Layer<S> for ConcurrencyLimitLayer<K, F, L> {
    type Service = ConcurrencyLimit<S, K, F, L>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
            max_wait: self.max_wait,
            missing: self.missing,
            unkeyed: self.unkeyed.clone(),
            key_type: PhantomData,
        }
    }
}

/// The service made by [`ConcurrencyLimitLayer`]. `Clone`; clones share the count.
pub struct ConcurrencyLimit<S, K, F, L = KeyedConcurrencyLimiter<K>> {
    inner: S,
    limiter: L,
    key: Arc<F>,
    on_limit: OnLimit,
    max_wait: Duration,
    missing: MissingKey,
    unkeyed: Arc<Unkeyed>,
    key_type: PhantomData<fn() -> K>,
}

impl<S: Clone, K, F, L: Clone> Clone for ConcurrencyLimit<S, K, F, L> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
            max_wait: self.max_wait,
            missing: self.missing,
            unkeyed: self.unkeyed.clone(),
            key_type: PhantomData,
        }
    }
}

impl<S, K, F, L, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S, K, F, L>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    K: Send + Sync + 'static,
    F: Fn(&Request<ReqBody>) -> Option<K> + Send + Sync + 'static,
    L: PermitSource<K>,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<HeldBody<ResBody, L::Permit>>;
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
            let wait = match on_limit {
                OnLimit::Reject => None,
                OnLimit::Wait => Some(max_wait),
            };
            let permit = match limiter.take(&key, wait).await {
                Ok(permit) => permit,
                Err(e) => return Ok(refused(e)),
            };
            let response = inner.call(req).await?;
            Ok(response.map(|body| HeldBody {
                body,
                permit: Some(permit),
            }))
        })
    }
}

/// The 429 of a key at its limit (or a limiter full of keys); the 503, with
/// `Retry-After: 1`, of a store that could not answer.
fn refused<B: From<String>, P>(e: PermitError) -> Response<HeldBody<B, P>> {
    let response = match e {
        PermitError::Denied(e) => super::problem(StatusCode::TOO_MANY_REQUESTS, &e.to_string(), ""),
        PermitError::Store(_) => super::answers::store_unavailable(),
    };
    response.map(|body| HeldBody { body, permit: None })
}

/// A response body holding its request's permit (`P`) until the body ends (or is
/// dropped).
pub struct HeldBody<B, P> {
    body: B,
    permit: Option<P>,
}

// The permit is never pinned: the body is Unpin when its inner body is.
impl<B: Unpin, P> Unpin for HeldBody<B, P> {}

impl<B: http_body::Body + Unpin, P> http_body::Body for HeldBody<B, P> {
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
