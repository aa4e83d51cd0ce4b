//! [`RateLimitLayer`] and [`ErrorLayer`]: one rate limit per key, shared by every
//! clone of the service, rejecting with 429 (or an error) or waiting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tollgate_core::Op;
use tower::{Layer, Service};

use std::marker::PhantomData;

#[cfg(feature = "tonic")]
use super::answers::Grpc;
use super::answers::{rate_limit_headers, Answers, Http};
use crate::wait::refund_detached;
use crate::RateLimiter;

/// The cost of a request read from its response, for budgets known only after the
/// work (tokens of a completion, bytes, rows): see [`RateLimitLayer::charge_with`].
/// Implemented by closures `Fn(&Response<B>) -> Option<u64>` and by [`NoCharge`].
pub trait ResponseCost<B>: Send + Sync + 'static {
    /// The units the request used, or `None` when the response does not say (the
    /// unit taken at admission stands).
    fn cost(&self, response: &Response<B>) -> Option<u64>;
}

impl<B, F> ResponseCost<B> for F
where
    F: Fn(&Response<B>) -> Option<u64> + Send + Sync + 'static,
{
    fn cost(&self, response: &Response<B>) -> Option<u64> {
        self(response)
    }
}

/// What a request reserves at admission, before the work: see
/// [`RateLimitLayer::reserve`]. Implemented by closures `Fn(&Request<B>) -> u64` and
/// by [`Unit`].
pub trait RequestCost<B>: Send + Sync + 'static {
    /// The units to take at admission (0 is taken as 1: an admission takes a unit).
    fn reserve(&self, request: &Request<B>) -> u64;
}

impl<B, F> RequestCost<B> for F
where
    F: Fn(&Request<B>) -> u64 + Send + Sync + 'static,
{
    fn reserve(&self, request: &Request<B>) -> u64 {
        self(request)
    }
}

/// One unit per request at admission (the layer's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unit;

impl<B> RequestCost<B> for Unit {
    fn reserve(&self, _: &Request<B>) -> u64 {
        1
    }
}

/// No charge after the response: every request costs the one unit of its admission
/// (the layer's default).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCharge;

impl<B> ResponseCost<B> for NoCharge {
    fn cost(&self, _: &Response<B>) -> Option<u64> {
        None
    }
}

/// A response extension a handler sets to say what its request used; read by
/// [`Usage::of`], e.g. `.charge_with(Usage::of)`.
///
/// ```
/// use tollgate::tower::Usage;
/// let mut response = http::Response::new(());
/// response.extensions_mut().insert(Usage(1234));
/// assert_eq!(Usage::of(&response), Some(1234));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage(pub u64);

impl Usage {
    /// The [`Usage`] extension of `response`, if the handler set one.
    pub fn of<B>(response: &Response<B>) -> Option<u64> {
        response.extensions().get::<Usage>().map(|u| u.0)
    }
}

/// What the layer does with a request whose key closure returns `None`. Every
/// choice counts the request ([`RateLimitLayer::unkeyed`]) and logs the first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Refuse it (the default): `400 Bad Request` with a problem body saying the
    /// request has no rate-limit key ([`ErrorLayer`]: the error [`NoKey`]). Leaving out
    /// a header must not be a way around the limit.
    #[default]
    Reject,
    /// Refuse it as the server's fault: `500 Internal Server Error` ([`ErrorLayer`]:
    /// [`NoKey`]), for a key that is always there unless the service is set up wrong
    /// (the peer address of `RateLimitLayer::per_peer_ip`, feature `axum`).
    ServerError,
    /// Pass it through, unlimited, as Envoy does for a request without a descriptor
    /// and nginx for an empty key: a choice to make on purpose (a limit only for
    /// requests that carry an API key, say).
    PassThrough,
}

/// The error [`ErrorLayer`]'s services return for a request without a key under
/// [`MissingKey::Reject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request has no rate-limit key (the layer's key closure returned None)")]
pub struct NoKey;

impl MissingKey {
    /// Whether a request without a key is refused, and if so whether as the
    /// server's fault: `None` to pass it through.
    pub(super) fn refuses(self) -> Option<bool> {
        match self {
            MissingKey::Reject => Some(false),
            MissingKey::ServerError => Some(true),
            MissingKey::PassThrough => None,
        }
    }
}

/// Requests without a key, shared by a layer and the services it makes.
#[derive(Debug, Default)]
pub(super) struct Unkeyed {
    count: std::sync::atomic::AtomicU64,
    warned: std::sync::atomic::AtomicBool,
}

impl Unkeyed {
    /// How many so far.
    pub(super) fn count(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Counts one; logs the first time (an error when such requests are refused),
    /// saying how they are refused: `refusals` as (no key, the server's fault), e.g.
    /// ("400", "500").
    pub(super) fn note(&self, missing: MissingKey, refusals: (&str, &str)) {
        use std::sync::atomic::Ordering;
        self.count.fetch_add(1, Ordering::Relaxed);
        if self.warned.swap(true, Ordering::Relaxed) {
            return;
        }
        match missing {
            MissingKey::ServerError => tracing::error!(
                "tollgate: a request had no rate-limit key (the layer's key closure returned None) \
                 and was refused with {}; with a peer-address key, serve axum with \
                 into_make_service_with_connect_info::<SocketAddr>()",
                refusals.1
            ),
            MissingKey::Reject => tracing::warn!(
                "tollgate: a request had no rate-limit key (the layer's key closure returned None) \
                 and was refused with {} (logged once); MissingKey::PassThrough lets such \
                 requests through unlimited",
                refusals.0
            ),
            MissingKey::PassThrough => tracing::warn!(
                "tollgate: a request had no rate-limit key (the layer's key closure returned None) \
                 and was not limited, as MissingKey::PassThrough asks (logged once)"
            ),
        }
    }
}

/// The client's IP address as axum saw the connection (the
/// `ConnectInfo<SocketAddr>` extension): the key of [`RateLimitLayer::per_peer_ip`].
/// `None` when the router is served without
/// `into_make_service_with_connect_info::<SocketAddr>()`. Behind a reverse proxy
/// every request comes from the proxy: key on the header it sets instead.
#[cfg(feature = "axum")]
pub fn peer_ip<B>(req: &Request<B>) -> Option<std::net::IpAddr> {
    let info = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()?;
    Some(info.0.ip())
}

/// The key function of [`RateLimitLayer::per_peer_ip`].
#[cfg(feature = "axum")]
pub type PeerIp = fn(&Request<axum::body::Body>) -> Option<std::net::IpAddr>;

#[cfg(feature = "axum")]
impl<L> RateLimitLayer<L, PeerIp> {
    /// Limits per client IP address ([`peer_ip`]) for axum, with a limiter keyed by
    /// `IpAddr` (e.g. `KeyedLimiter<IpAddr>`). Fails loudly when the address is
    /// missing — a router served without `into_make_service_with_connect_info` —
    /// answering `500` and logging why, rather than limiting nothing
    /// ([`MissingKey::ServerError`]).
    ///
    /// ```
    /// use std::net::{IpAddr, SocketAddr};
    /// use tollgate::tower::RateLimitLayer;
    /// use tollgate::{KeyedLimiter, Policy};
    ///
    /// let per_ip: KeyedLimiter<IpAddr> = KeyedLimiter::new("gcra:rate=10/s,burst=20".parse::<Policy>()?);
    /// let app: axum::Router = axum::Router::new()
    ///     .route("/", axum::routing::get(|| async { "hello" }))
    ///     .layer(RateLimitLayer::per_peer_ip(per_ip));
    /// // Served with the peer address, which the key needs:
    /// let _service = app.into_make_service_with_connect_info::<SocketAddr>();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn per_peer_ip(limiter: L) -> Self {
        RateLimitLayer::new(limiter, peer_ip::<axum::body::Body> as PeerIp)
            .on_missing_key(MissingKey::ServerError)
    }
}

/// What the layer does with a request over the limit. In both modes, a request a
/// pacing policy admits with a wait (`shaper`, `limit-req` without `nodelay`) waits
/// it before the inner service is called: its schedule is part of the decision, so
/// nothing is forwarded before its turn.
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
/// path, or any compound): `None` is a request without a key, refused with `400` by
/// default (see [`MissingKey`]). The limiter is any [`RateLimiter`] for the key type:
/// a [`KeyedLimiter`](crate::KeyedLimiter) in memory (keys of any type), or an
/// [`AnyLimiter`](crate::AnyLimiter) or Redis limiter (`String` keys) shared by every
/// instance of the service. Every clone of the layer and of the services it makes
/// shares the one limiter, so the limit holds across connections (axum clones the
/// service per connection).
///
/// Admitted responses carry `RateLimit-Policy` and `RateLimit` headers (IETF httpapi
/// draft, structured fields, written by [`crate::headers`]; the layer's limit is called
/// `default`): `RateLimit-Policy: "default";q=LIMIT;w=WINDOW_S` (`"default.0"`,
/// `"default.1"`, ... for a rule set) and `RateLimit: "default";r=REMAINING;t=RESET_S`
/// for the binding policy; a rejected request gets `429 Too Many Requests` with
/// `Retry-After` and a small `application/problem+json` body (the response body type
/// makes it `From<String>`, as axum's and `Full<Bytes>` do). A store that cannot
/// answer (a transient [`Error`](crate::Error), e.g. Redis down with no failure policy) gets
/// `503 Service Unavailable` with `Retry-After: 1` and a problem body (where the
/// failure policy is set, with feature `redis`: `redis::RedisLimiterOptions`, given
/// to `RedisLimiter::with_options` or `AnyLimiter::redis_with`). The same layer
/// answers gRPC calls in gRPC's words with `RateLimitLayer::grpc` (feature `tonic`).
/// Links in these docs reach only the features a build enables; the published
/// documentation enables all.
///
/// A global limit (one for every request) is a key closure that always returns the
/// same key: `|_: &http::Request<B>| Some(())` with a `KeyedLimiter<()>`.
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
#[derive(Clone)]
pub struct RateLimitLayer<L, F, C = NoCharge, P = Http, R = Unit> {
    limiter: L,
    key: Arc<F>,
    on_limit: OnLimit,
    charge: Arc<C>,
    reserve: Arc<R>,
    missing: MissingKey,
    unkeyed: Arc<Unkeyed>,
    /// The order paced requests go on in (one per layer, shared by its services).
    turns: Arc<crate::wait::Turns>,
    answers: PhantomData<fn() -> P>,
}

impl<L, F> RateLimitLayer<L, F> {
    /// Limits with `limiter`, keyed by `key(&request)`.
    pub fn new(limiter: L, key: F) -> Self {
        RateLimitLayer {
            limiter,
            key: Arc::new(key),
            on_limit: OnLimit::Reject,
            charge: Arc::new(NoCharge),
            reserve: Arc::new(Unit),
            missing: MissingKey::Reject,
            unkeyed: Arc::default(),
            turns: Arc::default(),
            answers: PhantomData,
        }
    }
}

impl<L, F, C, R> RateLimitLayer<L, F, C, Http, R> {
    /// Answers in gRPC's words instead of HTTP's (see [`Grpc`]): for tonic services
    /// (`tonic::transport::Server::builder().layer(..)`), keyed by the request's
    /// metadata (its HTTP headers) or its peer.
    ///
    /// ```
    /// use tollgate::tower::RateLimitLayer;
    /// use tollgate::{KeyedLimiter, Policy};
    ///
    /// let limiter: KeyedLimiter<String> = KeyedLimiter::new("gcra:rate=100/s".parse::<Policy>().unwrap());
    /// // Over the limit: RESOURCE_EXHAUSTED with RetryInfo; no x-api-key: UNAUTHENTICATED.
    /// let layer = RateLimitLayer::new(limiter, |req: &http::Request<tonic::body::Body>| {
    ///     req.headers().get("x-api-key")?.to_str().ok().map(str::to_owned)
    /// })
    /// .grpc();
    /// # let _ = layer;
    /// ```
    #[cfg(feature = "tonic")]
    pub fn grpc(self) -> RateLimitLayer<L, F, C, Grpc, R> {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            on_limit: self.on_limit,
            charge: self.charge,
            reserve: self.reserve,
            missing: self.missing,
            unkeyed: self.unkeyed,
            turns: self.turns,
            answers: PhantomData,
        }
    }
}

impl<L, F, C, P, R> RateLimitLayer<L, F, C, P, R> {
    /// Rejects (the default) or waits.
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.on_limit = on_limit;
        self
    }

    /// What to do with a request whose key closure returns `None` (default: refuse it
    /// with `400`; see [`MissingKey`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// Requests that had no key so far (passed through or refused, as
    /// [`RateLimitLayer::on_missing_key`] says), over every service the layer made.
    pub fn unkeyed(&self) -> u64 {
        self.unkeyed.count()
    }

    /// Charges each request what its response says it used (`cost(&response)`):
    /// budgets known only after the work, such as the tokens of an LLM completion.
    /// A request is admitted while the key has what it reserves left (one unit, or
    /// what [`RateLimitLayer::reserve`] says; taken at admission, it counts toward
    /// the cost); when the response comes, the rest is charged — into debt if need
    /// be (see [`Policy::charge`](tollgate_core::Policy::charge), bounded by each
    /// policy's `max-debt`), so the key is refused until the debt is paid back — a
    /// cost below the reservation gives the difference back, and `None` (the
    /// response does not say) keeps the reservation. The response's `RateLimit`
    /// header shows the key after the charge. Requests in flight at once are
    /// charged only when their responses come: with one unit each, any number of
    /// them pass before the first is charged; reserve their bounds to cap that.
    ///
    /// ```
    /// use tollgate::tower::{RateLimitLayer, Usage};
    /// use tollgate::{KeyedLimiter, Policy};
    ///
    /// // 10,000 tokens a minute per API key; the handler sets the Usage extension.
    /// let tokens: KeyedLimiter<String> =
    ///     KeyedLimiter::new("fixed-window:limit=10000,window=1m".parse::<Policy>().unwrap());
    /// let layer = RateLimitLayer::new(tokens, |req: &http::Request<()>| {
    ///     req.headers().get("x-api-key")?.to_str().ok().map(str::to_owned)
    /// })
    /// .charge_with(Usage::of::<String>);
    /// # let _ = layer;
    /// ```
    pub fn charge_with<C2>(self, cost: C2) -> RateLimitLayer<L, F, C2, P, R> {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            on_limit: self.on_limit,
            charge: Arc::new(cost),
            reserve: self.reserve,
            missing: self.missing,
            unkeyed: self.unkeyed,
            turns: self.turns,
            answers: PhantomData,
        }
    }

    /// Takes `reserve(&request)` units at admission instead of one (at least one):
    /// what a request states it may use, before the work (an LLM call's
    /// `max_tokens` plus its prompt, a download's size). A request is admitted only
    /// if its whole reservation fits, so requests of one key in flight at once can
    /// never together spend more than the budget plus what the last of them
    /// declared beyond it — where one unit each would let any number through
    /// before the first response is charged. With [`RateLimitLayer::charge_with`]
    /// the response settles it: what it used beyond the reservation is charged
    /// (into debt if need be), what it did not use is given back; without, the
    /// reservation is the cost. The bound holds as far as requests keep to what they
    /// declare (what they use beyond is charged after, into debt), and a request that
    /// declares nothing must reserve what one may use at most, not one unit. A
    /// request whose client goes away before its response keeps its whole
    /// reservation charged; one admitted by a Redis store's failure policy (fail-open)
    /// still has what it did not use given back to the store.
    ///
    /// ```
    /// use tollgate::tower::{RateLimitLayer, Usage};
    /// use tollgate::{KeyedLimiter, Policy};
    ///
    /// // 10,000 tokens a minute per API key; each request reserves its x-max-tokens,
    /// // and one that declares none the most a request may use (4,096 here).
    /// let tokens: KeyedLimiter<String> =
    ///     KeyedLimiter::new("token-bucket:rate=10000/m,capacity=10000".parse::<Policy>().unwrap());
    /// let declared = |req: &http::Request<()>| -> u64 {
    ///     let bound = req.headers().get("x-max-tokens").and_then(|v| v.to_str().ok()?.parse().ok());
    ///     bound.unwrap_or(4096)
    /// };
    /// let layer = RateLimitLayer::new(tokens, |req: &http::Request<()>| {
    ///     req.headers().get("x-api-key")?.to_str().ok().map(str::to_owned)
    /// })
    /// .reserve(declared)
    /// .charge_with(Usage::of::<String>);
    /// # let _ = layer;
    /// ```
    pub fn reserve<R2>(self, reserve: R2) -> RateLimitLayer<L, F, C, P, R2> {
        RateLimitLayer {
            limiter: self.limiter,
            key: self.key,
            on_limit: self.on_limit,
            charge: self.charge,
            reserve: Arc::new(reserve),
            missing: self.missing,
            unkeyed: self.unkeyed,
            turns: self.turns,
            answers: PhantomData,
        }
    }
}

impl<S, L: Clone, F, C, P, R> Layer<S> for RateLimitLayer<L, F, C, P, R> {
    type Service = RateLimit<S, L, F, C, P, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            on_limit: self.on_limit,
            charge: self.charge.clone(),
            reserve: self.reserve.clone(),
            missing: self.missing,
            unkeyed: self.unkeyed.clone(),
            turns: self.turns.clone(),
            answers: PhantomData,
        }
    }
}

/// The service made by [`RateLimitLayer`]. `Clone`; clones share the limit.
#[derive(Clone)]
pub struct RateLimit<S, L, F, C = NoCharge, P = Http, R = Unit> {
    inner: S,
    limiter: L,
    key: Arc<F>,
    on_limit: OnLimit,
    charge: Arc<C>,
    reserve: Arc<R>,
    missing: MissingKey,
    unkeyed: Arc<Unkeyed>,
    /// The order paced requests go on in (one per layer, shared by its services).
    turns: Arc<crate::wait::Turns>,
    answers: PhantomData<fn() -> P>,
}

impl<S, L, F, C, P, R, K, ReqBody, ResBody> Service<Request<ReqBody>>
    for RateLimit<S, L, F, C, P, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    L: RateLimiter<K> + Clone + 'static,
    K: Clone + Send + Sync + 'static,
    F: Fn(&Request<ReqBody>) -> Option<K> + Send + Sync + 'static,
    C: ResponseCost<ResBody>,
    P: Answers<ResBody>,
    R: RequestCost<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let mut inner = super::take_ready(&mut self.inner);
        let Some(key) = (self.key)(&req) else {
            self.unkeyed.note(self.missing, P::REFUSALS);
            return match self.missing.refuses().map(P::refused) {
                Some(refused) => Box::pin(async { Ok(refused) }),
                None => Box::pin(inner.call(req)),
            };
        };
        let limiter = self.limiter.clone();
        let on_limit = self.on_limit;
        let charge = self.charge.clone();
        let reserved = self.reserve.reserve(&req).max(1);
        let turns = self.turns.clone();
        Box::pin(async move {
            let op = match on_limit {
                OnLimit::Reject => Op::Try,
                OnLimit::Wait => Op::Acquire,
            };
            let rules = limiter.rules();
            if let Some(p) = rules.holding() {
                // Nothing would give its permits back: refused, loudly.
                tracing::error!(
                    "tollgate: {}; the request was answered 500",
                    crate::Error::HoldsPermits(p.to_string())
                );
                return Ok(P::refused(true));
            }
            let decision = match limiter.check_rules(&key, reserved, op).await {
                Ok(d) => d,
                Err(e) => match e.rejection() {
                    // A full limiter refusing new keys: over the limit.
                    Some(d) => return Ok(P::over_limit(&d.into(), &rules)),
                    None => return Ok(P::unavailable()),
                },
            };
            if !decision.decision.allowed {
                return Ok(P::over_limit(&decision, &rules));
            }
            // A pacing policy's schedule is part of its decision, whatever the mode.
            if decision.decision.wait_us > 0 {
                let refund =
                    crate::wait::RefundOnDrop::new(|| refund_detached(&limiter, &key, reserved));
                crate::wait::sleep_or_refund(&turns, decision.decision.wait(), refund).await;
            }
            let mut response = inner.call(req).await?;
            // What the admission reserved is part of the cost the response reports:
            // the difference is charged (into debt if need be) or given back.
            let shown = match charge.cost(&response) {
                Some(used) if used < reserved => {
                    refund_detached(&limiter, &key, reserved - used);
                    decision
                }
                Some(used) if used > reserved => {
                    match limiter.charge(&key, used - reserved).await {
                        Ok(after) => after,
                        // The store failed: the response stands, charged what it
                        // reserved.
                        Err(_) => decision,
                    }
                }
                _ => decision,
            };
            rate_limit_headers(response.headers_mut(), &shown, &rules);
            Ok(response)
        })
    }
}

/// The error [`ErrorLayer`]'s services return for a request over the limit (the
/// core's [`Rejected`](tollgate_core::Rejected), as [`Decision::into_result`](tollgate_core::Decision::into_result) gives it).
pub type RateLimited = tollgate_core::Rejected;

/// The error type of [`ErrorLayer`]'s services: tower's usual boxed error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// [`RateLimitLayer`] for services that are not http: a request over the limit gets
/// the error [`RateLimited`] (boxed, as tower layers do) instead of a 429, or waits
/// with [`OnLimit::Wait`]; a store that cannot answer gets its [`Error`](crate::Error).
#[derive(Clone)]
pub struct ErrorLayer<L, F> {
    layer: RateLimitLayer<L, F>,
}

impl<L, F> ErrorLayer<L, F> {
    /// Limits with `limiter`, keyed by `key(&request)` (`None`: the error [`NoKey`],
    /// unless [`ErrorLayer::on_missing_key`] says to pass it through).
    pub fn new(limiter: L, key: F) -> Self {
        ErrorLayer {
            layer: RateLimitLayer::new(limiter, key),
        }
    }

    /// Rejects with an error (the default) or waits.
    pub fn on_limit(mut self, on_limit: OnLimit) -> Self {
        self.layer = self.layer.on_limit(on_limit);
        self
    }

    /// What to do with a request without a key (see [`MissingKey`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.layer = self.layer.on_missing_key(missing);
        self
    }
}

impl<S, L: Clone, F> Layer<S> for ErrorLayer<L, F> {
    type Service = ErrorService<S, L, F>;

    fn layer(&self, inner: S) -> Self::Service {
        ErrorService(self.layer.layer(inner))
    }
}

/// The service made by [`ErrorLayer`]. `Clone`; clones share the limit.
#[derive(Clone)]
pub struct ErrorService<S, L, F>(RateLimit<S, L, F>);

impl<S, L, F, K, Req> Service<Req> for ErrorService<S, L, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    L: RateLimiter<K> + Clone + 'static,
    K: Clone + Send + Sync + 'static,
    F: Fn(&Req) -> Option<K> + Send + Sync + 'static,
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
        let mut inner = super::take_ready(&mut svc.inner);
        let Some(key) = (svc.key)(&req) else {
            svc.unkeyed
                .note(svc.missing, ("the error NoKey", "the error NoKey"));
            if svc.missing != MissingKey::PassThrough {
                return Box::pin(async { Err(NoKey.into()) });
            }
            return Box::pin(async move { inner.call(req).await.map_err(Into::into) });
        };
        let (limiter, turns) = (svc.limiter.clone(), svc.turns.clone());
        let op = match svc.on_limit {
            OnLimit::Reject => Op::Try,
            OnLimit::Wait => Op::Acquire,
        };
        Box::pin(async move {
            if let Some(p) = limiter.rules().holding() {
                return Err(crate::Error::HoldsPermits(p.to_string()).into());
            }
            let d = limiter
                .check_rules(&key, 1, op)
                .await?
                .decision
                .into_result()?;
            if d.wait_us > 0 {
                let refund = crate::wait::RefundOnDrop::new(|| refund_detached(&limiter, &key, 1));
                crate::wait::sleep_or_refund(&turns, d.wait(), refund).await;
            }
            inner.call(req).await.map_err(Into::into)
        })
    }
}
