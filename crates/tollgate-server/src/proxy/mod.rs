//! `tollgate proxy`: a limiting reverse proxy (nginx `limit_req` / `limit_conn`
//! semantics) configured by the `proxy:` section of the main config.

mod keys;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use arc_swap::ArcSwap;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use clap::Parser;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use ipnet::IpNet;
use tollgate::redis::{
    PermitError, RedisConcurrencyLimiter, RedisConcurrencyOptions, RedisPermit, RedisStore,
};
use tollgate::{
    AnyLimiter, ConcurrencyError, KeyedConcurrencyLimiter, KeyedConcurrencyPermit, KeyedLimiter,
    KeyedOptions, Op, RateLimiter, RuleDecision, RuleSet,
};

use crate::config::proxy::{HeaderStyle, MatchConfig, ProxyConfig, RouteConfig};
use keys::KeyPart;

/// Counters in Redis: the connection and the `store:` settings (failure policy, ...).
type RedisBackend = (RedisStore, crate::config::store::StoreConfig);

struct Limits {
    /// "default", or the tier's name (shown as the RateLimit policy name).
    name: String,
    /// The route's rate counters, in memory or in Redis.
    counter: AnyLimiter,
    /// Their rules (for the headers).
    rules: RuleSet,
}

/// Where a route's `limit_conn` permits live.
enum Conns {
    Memory(KeyedConcurrencyLimiter<String>),
    Redis(RedisConcurrencyLimiter),
}

/// A held `limit_conn` permit.
enum ConnPermit {
    Memory(#[allow(dead_code)] KeyedConcurrencyPermit<String>),
    Redis(#[allow(dead_code)] RedisPermit),
}

/// The Redis name of a route's counters: `proxy.ROUTE.PART` (no braces: they would
/// move the hash tag).
fn redis_name(route: &str, part: &str) -> String {
    format!("proxy.{route}.{part}").replace(['{', '}'], "_")
}

struct Route {
    /// As configured: a reload keeps a route (and its counters) whose config is equal.
    config: RouteConfig,
    name: String,
    matcher: MatchConfig,
    upstream: Uri,
    key: Vec<KeyPart>,
    default: Option<Limits>,
    tiers: Vec<(Vec<String>, Limits)>,
    conns: Option<Conns>,
    status: StatusCode,
    /// The problem+json body of a rate-limit reject, built once.
    reject_body: bytes::Bytes,
    headers: HeaderStyle,
    dry_run: bool,
}

/// The routes and their limiters: shared by every worker thread.
struct Shared {
    routes: Vec<Arc<Route>>,
    trusted: Vec<IpNet>,
    upstream_timeout: Duration,
}

/// One worker thread's view: the shared routes and its own upstream connection pool.
struct Proxy {
    shared: Arc<ArcSwap<Shared>>,
    client: Client<HttpConnector, Body>,
}

fn limits(
    (route, name): (&str, &str),
    specs: &[String],
    at: &str,
    options: KeyedOptions,
    redis: Option<&RedisBackend>,
) -> anyhow::Result<Option<Limits>> {
    if specs.is_empty() {
        return Ok(None);
    }
    let rules = RuleSet::parse(specs).map_err(|e| anyhow::anyhow!("{at}.policies: {e}"))?;
    let counter = match redis {
        None => AnyLimiter::Memory(KeyedLimiter::with_options(
            rules.clone(),
            options,
            tollgate::MonotonicClock::new(),
        )),
        Some((store, config)) => config
            .limiter(store, &redis_name(route, name), rules.clone())
            .map_err(|e| anyhow::anyhow!("{at}.policies (store redis): {e}"))?,
    };
    Ok(Some(Limits {
        name: name.to_string(),
        counter,
        rules,
    }))
}

fn conns(
    route: &str,
    limit: u32,
    options: KeyedOptions,
    redis: Option<&RedisBackend>,
) -> anyhow::Result<Conns> {
    let Some((store, config)) = redis else {
        return Ok(Conns::Memory(KeyedConcurrencyLimiter::new(
            limit,
            options.max_keys,
        )));
    };
    let rules = RuleSet::parse(&[format!("concurrency:limit={limit}")])
        .map_err(|e| anyhow::anyhow!("limit_conn: {e}"))?;
    let opts = RedisConcurrencyOptions {
        on_error: config.on_error(&rules)?,
        ..Default::default()
    };
    Ok(Conns::Redis(RedisConcurrencyLimiter::with_options(
        store.clone(),
        &redis_name(route, "conn"),
        limit,
        opts,
    )?))
}

impl Shared {
    /// Builds the routes; routes whose config equals one of `old`'s are taken over
    /// with their counters (a reload).
    fn new(
        config: ProxyConfig,
        options: KeyedOptions,
        old: Option<&Shared>,
        redis: Option<&RedisBackend>,
    ) -> anyhow::Result<Self> {
        if config.routes.is_empty() {
            anyhow::bail!("proxy.routes: at least one route is needed");
        }
        let routes = config
            .routes
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                if let Some(same) = old.and_then(|o| o.routes.iter().find(|x| x.config == r)) {
                    return Ok(same.clone());
                }
                let at = format!("proxy.routes[{i}]");
                let route_config = r.clone();
                let upstream: Uri = r
                    .upstream
                    .parse()
                    .ok()
                    .filter(|u: &Uri| u.scheme_str() == Some("http") && u.authority().is_some())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "{at}.upstream: '{}' is not an http://host:port URL",
                            r.upstream
                        )
                    })?;
                let status = StatusCode::from_u16(r.status)
                    .ok()
                    .filter(|s| s.is_client_error() || s.is_server_error())
                    .ok_or_else(|| {
                        anyhow::anyhow!("{at}.status: {} is not a 4xx or 5xx status", r.status)
                    })?;
                let tiers = r
                    .tiers
                    .iter()
                    .enumerate()
                    .map(|(t, tier)| {
                        let at = format!("{at}.tiers[{t}]");
                        let l = limits((&r.name, &tier.name), &tier.policies, &at, options, redis)?
                            .ok_or_else(|| {
                                anyhow::anyhow!("{at}.policies: needs at least one policy")
                            })?;
                        Ok((tier.values.clone(), l))
                    })
                    .collect::<anyhow::Result<_>>()?;
                Ok(Arc::new(Route {
                    config: route_config,
                    key: keys::parse(&r.key, &at)?,
                    default: limits((&r.name, "default"), &r.policies, &at, options, redis)?,
                    tiers,
                    conns: r
                        .limit_conn
                        .map(|n| conns(&r.name, n, options, redis))
                        .transpose()
                        .map_err(|e| anyhow::anyhow!("{at}.limit_conn: {e:#}"))?,
                    name: r.name,
                    matcher: r.matcher,
                    upstream,
                    status,
                    reject_body: problem_body(status, "rate limit exceeded"),
                    headers: r.headers,
                    dry_run: r.dry_run,
                }))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Shared {
            routes,
            trusted: config.trusted_proxies,
            upstream_timeout: Duration::from_micros(config.upstream_timeout.unwrap_or(30_000_000)),
        })
    }

    fn route(&self, req: &Request) -> Option<&Arc<Route>> {
        let path = req.uri().path();
        let host = req
            .headers()
            .get("host")
            .and_then(|h| h.to_str().ok())
            .map(|h| h.split(':').next().unwrap_or(h));
        self.routes.iter().find(|r| {
            r.matcher.path.as_deref().is_none_or(|p| p == path)
                && r.matcher
                    .path_prefix
                    .as_deref()
                    .is_none_or(|p| path.starts_with(p))
                && r.matcher.host.as_deref().is_none_or(|h| Some(h) == host)
        })
    }
}

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
    for h in named {
        headers.remove(h);
    }
}

async fn handle(
    State(proxy): State<Arc<Proxy>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
) -> Response {
    let shared = proxy.shared.load_full();
    let Some(route) = shared.route(&req) else {
        return problem(StatusCode::NOT_FOUND, "no route matches this request", None);
    };
    let key = keys::key(
        &route.key,
        &shared.trusted,
        peer.ip(),
        req.uri().path(),
        req.headers(),
    );
    let mut headers_out = HeaderMap::new();
    let mut _permit: Option<ConnPermit> = None;
    if !key.is_empty() {
        let limits = route
            .tiers
            .iter()
            .find(|(values, _)| values.contains(&key))
            .map(|(_, l)| l)
            .or(route.default.as_ref());
        if let Some(l) = limits {
            let rd = match l.counter.check_rules(&key, 1, Op::Try).await {
                Ok(d) => d,
                // Redis failed under `on_error: error`: say so (a dry run forwards).
                Err(e) if e.is_transient() && route.dry_run => {
                    RuleDecision::from(tollgate::Decision::admitted(0, 0, 0, 0))
                }
                Err(e) if e.is_transient() => return store_unavailable(&e),
                // A full limiter refusing new keys.
                Err(_) => RuleDecision::from(tollgate::Decision::rejected(0, 0, 0, None)),
            };
            rate_headers(&mut headers_out, route.headers, &rd, l);
            let d = rd.decision;
            if !d.allowed && !route.dry_run {
                let mut r =
                    problem_response(route.status, route.reject_body.clone(), d.retry_after_us);
                r.headers_mut().extend(headers_out);
                return r;
            }
            if d.allowed && d.wait_us > 0 && !route.dry_run {
                // limit_req without nodelay: the request is held, not rejected.
                tokio::time::sleep(Duration::from_micros(d.wait_us)).await;
            }
        }
        let busy = || problem(route.status, "too many concurrent requests", None);
        match &route.conns {
            None => {}
            Some(Conns::Memory(conns)) => match conns.try_acquire(key.as_str(), 1) {
                Ok(p) => _permit = Some(ConnPermit::Memory(p)),
                Err(ConcurrencyError::Busy { .. }) | Err(ConcurrencyError::TooManyKeys { .. })
                    if !route.dry_run =>
                {
                    return busy();
                }
                Err(_) => {}
            },
            Some(Conns::Redis(conns)) => match conns.try_acquire(&key, 1).await {
                Ok(p) => _permit = Some(ConnPermit::Redis(p)),
                Err(_) if route.dry_run => {}
                Err(PermitError::Denied(_)) => return busy(),
                Err(PermitError::Store(e)) => return store_unavailable(&e),
            },
        }
    }
    // Forward.
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let base = route.upstream.to_string();
    let uri: Uri = match format!("{}{}", base.trim_end_matches('/'), path_and_query).parse() {
        Ok(u) => u,
        Err(_) => return problem(StatusCode::BAD_REQUEST, "bad request path", None),
    };
    *req.uri_mut() = uri;
    strip_hop_by_hop(req.headers_mut());
    let client_ip = keys::client_ip(&shared.trusted, peer.ip(), req.headers()).to_string();
    let xff = match req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
    {
        Some(prev) if shared.trusted.iter().any(|n| n.contains(&peer.ip())) => {
            format!("{prev}, {}", peer.ip())
        }
        _ => peer.ip().to_string(),
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        req.headers_mut().insert("x-forwarded-for", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("for={client_ip}")) {
        req.headers_mut().append("forwarded", v);
    }
    match tokio::time::timeout(shared.upstream_timeout, proxy.client.request(req)).await {
        Ok(Ok(resp)) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.extend(headers_out);
            // limit_conn's permit is held until the response body has been sent, as
            // nginx counts a connection until the request is finished.
            Response::from_parts(parts, Body::new(Held { body, _permit }))
        }
        Ok(Err(e)) if timed_out(&e) => problem(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("upstream {} timed out (connect)", route.name),
            None,
        ),
        Ok(Err(_)) => problem(
            StatusCode::BAD_GATEWAY,
            &format!("upstream {} unreachable", route.name),
            None,
        ),
        Err(_) => problem(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("upstream {} timed out", route.name),
            None,
        ),
    }
}

/// Whether an upstream request failed because connecting took too long.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The route's rate-limit headers in its style ([`tollgate::headers`], their one
/// writer; the limit is named after the tier, or `default`).
fn rate_headers(headers: &mut HeaderMap, style: HeaderStyle, d: &RuleDecision, l: &Limits) {
    let h = tollgate::headers::RateLimitHeaders::new(&l.name, &l.rules, d);
    let ietf = matches!(style, HeaderStyle::Ietf | HeaderStyle::Both).then(|| h.ietf());
    let legacy = matches!(style, HeaderStyle::Legacy | HeaderStyle::Both).then(|| h.legacy());
    let fields = ietf
        .into_iter()
        .flatten()
        .chain(legacy.into_iter().flatten());
    for (k, v) in fields {
        if let Ok(v) = HeaderValue::from_str(&v) {
            headers.insert(k, v);
        }
    }
}

/// A response body that holds a `limit_conn` permit until it ends (or is dropped).
struct Held {
    body: hyper::body::Incoming,
    _permit: Option<ConnPermit>,
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// 503 when the Redis store failed and its failure policy is `error`.
fn store_unavailable(e: &dyn std::fmt::Display) -> Response {
    // The limiter logs the outage itself, once; this is per request.
    tracing::debug!(error = %e, "tollgate proxy: rate-limit store unavailable");
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "rate limit store unavailable",
        None,
    )
}

/// A small problem+json response (RFC 9457).
fn problem(status: StatusCode, detail: &str, retry_after_us: Option<u64>) -> Response {
    problem_response(status, problem_body(status, detail), retry_after_us)
}

fn problem_body(status: StatusCode, detail: &str) -> bytes::Bytes {
    serde_json::json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string()
    .into()
}

fn problem_response(
    status: StatusCode,
    body: bytes::Bytes,
    retry_after_us: Option<u64>,
) -> Response {
    let mut r = (status, body).into_response();
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/problem+json"),
    );
    if let Some(us) = retry_after_us {
        r.headers_mut()
            .insert("retry-after", HeaderValue::from(us.div_ceil(1_000_000)));
    }
    r
}

/// Loads the `proxy:` section of a main config.
pub fn load(
    path: &std::path::Path,
) -> anyhow::Result<(ProxyConfig, KeyedOptions, crate::config::store::StoreConfig)> {
    let mut main = crate::config::MainConfig::load(path)?;
    let options = main.key_options();
    let proxy = main.proxy.take().ok_or_else(|| {
        anyhow::anyhow!(
            "{}: no proxy: section (listen, trusted_proxies, routes: [...])",
            path.display()
        )
    })?;
    Ok((proxy, options, main.store))
}

/// Runs the proxy until SIGTERM or Ctrl-C: one single-threaded runtime per CPU, each
/// accepting on its own `SO_REUSEPORT` socket with its own upstream pool (as nginx's
/// workers), sharing the routes and their limiters.
pub fn run(
    path: &std::path::Path,
    listen: Option<SocketAddr>,
    store_flag: Option<&str>,
) -> anyhow::Result<()> {
    let (config, options, store) = load(path)?;
    let store = store.with_flag(store_flag)?;
    let connect_timeout = Duration::from_micros(config.connect_timeout.unwrap_or(5_000_000));
    let addr = listen
        .or(config.listen)
        .unwrap_or_else(|| "127.0.0.1:8000".parse().expect("valid"));
    // The Redis connection lives on a runtime of its own, alive as long as the proxy
    // (a Cluster connection's driver task runs there).
    let (redis_runtime, redis): (_, Option<RedisBackend>) = match store.kind {
        crate::config::store::StoreKind::Memory => (None, None),
        crate::config::store::StoreKind::Redis => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("tollgate-redis")
                .enable_all()
                .build()?;
            let connected = runtime.block_on(store.connect())?;
            (Some(runtime), Some((connected, store.clone())))
        }
    };
    let shared = Arc::new(ArcSwap::from_pointee(Shared::new(
        config,
        options,
        None,
        redis.as_ref(),
    )?));
    let reloader = {
        let (shared, path, redis) = (shared.clone(), path.to_path_buf(), redis.clone());
        std::thread::spawn(move || watch(&path, &shared, redis.as_ref()))
    };
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The first worker binds (resolving port 0) and reports the address.
    let (bound_tx, bound_rx) = std::sync::mpsc::channel::<anyhow::Result<SocketAddr>>();
    let mut threads = Vec::new();
    let spawn =
        |addr: SocketAddr, report: Option<std::sync::mpsc::Sender<anyhow::Result<SocketAddr>>>| {
            let shared = shared.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let listener = match bind(addr) {
                        Ok(l) => l,
                        Err(e) => {
                            if let Some(r) = &report {
                                let _ = r.send(Err(anyhow::anyhow!("{e:#}")));
                            }
                            return Err(e);
                        }
                    };
                    if let Some(r) = report {
                        let _ = r.send(Ok(listener.local_addr()?));
                    }
                    let proxy = Arc::new(Proxy {
                        shared,
                        client: Client::builder(hyper_util::rt::TokioExecutor::new()).build({
                            let mut connector = HttpConnector::new();
                            connector.set_connect_timeout(Some(connect_timeout));
                            connector
                        }),
                    });
                    let app = axum::Router::new().fallback(handle).with_state(proxy);
                    axum::serve(
                        listener,
                        app.into_make_service_with_connect_info::<SocketAddr>(),
                    )
                    .with_graceful_shutdown(crate::lifecycle::shutdown_signal())
                    .await?;
                    Ok(())
                })
            })
        };
    threads.push(spawn(addr, Some(bound_tx)));
    let bound = bound_rx
        .recv()
        .map_err(|_| anyhow::anyhow!("the proxy's first worker died"))??;
    for _ in 1..workers {
        threads.push(spawn(bound, None));
    }
    println!(
        "tollgate proxy: listening on http://{bound} ({} route(s), {workers} worker(s), {})",
        shared.load().routes.len(),
        store.describe()
    );
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a proxy worker panicked"))??;
    }
    drop(reloader); // it ends with the process
    drop(redis_runtime);
    Ok(())
}

/// Reloads the `proxy:` section on SIGHUP and when the file changes (checked every
/// second). A bad file is rejected with a logged error and the old routes stay;
/// unchanged routes keep their counters. The store stays the one the proxy started
/// with (a changed `store:` section takes a restart).
fn watch(path: &std::path::Path, shared: &ArcSwap<Shared>, redis: Option<&RedisBackend>) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let reload = |reason: &str| {
        let reloaded = load(path).and_then(|(config, options, _)| {
            Shared::new(config, options, Some(&shared.load()), redis)
        });
        match reloaded {
            Ok(new) => {
                shared.store(Arc::new(new));
                eprintln!("tollgate proxy: configuration reloaded ({reason})");
            }
            Err(e) => eprintln!(
                "tollgate proxy: reload rejected, the previous routes stay in force: {e:#}"
            ),
        }
    };
    runtime.block_on(crate::lifecycle::watch(
        vec![path.to_path_buf()],
        reload,
        std::future::pending::<()>(),
    ));
}

fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket
        .bind(addr)
        .with_context(|| format!("cannot listen on {addr}"))?;
    Ok(socket.listen(1024)?)
}

#[derive(Debug, Parser)]
/// `tollgate proxy` arguments.
pub struct ProxyArgs {
    /// The main configuration file with a `proxy:` section.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The listen address [default: the config's, else 127.0.0.1:8000].
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
    /// Where counters live: memory, redis://host:port/db or
    /// redis+cluster://host:port,host:port (proxies on one Redis share their limits).
    /// Overrides the config file's store.
    #[arg(long)]
    pub store: Option<String>,
}

/// `tollgate proxy`: needs a config file with a `proxy:` section.
pub fn command(args: ProxyArgs) -> anyhow::Result<()> {
    let Some(path) = args.config else {
        anyhow::bail!(
            "tollgate proxy needs --config FILE with a proxy: section, e.g.\n\
             proxy:\n  listen: 127.0.0.1:8000\n  routes:\n    - name: api\n      match: {{ path_prefix: /api/ }}\n      upstream: http://127.0.0.1:9000\n      key: client_ip\n      policies: [\"limit-req:rate=10/s,burst=5,nodelay\"]"
        );
    };
    run(&path, args.listen, args.store.as_deref())
}
