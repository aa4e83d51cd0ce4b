//! The tower layer in a real axum server on port 0, driven by a real HTTP client.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::clock::{Clock, MonotonicClock};
use tollgate::tower::{OnLimit, RateLimitLayer};
use tollgate::{KeyedLimiter, Policy};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<bytes::Bytes>>;

/// Starts the app on 127.0.0.1:0; returns its base URL. The server task ends with
/// the test's runtime.
async fn serve(spec: &str, on_limit: OnLimit) -> String {
    let limiter: KeyedLimiter<String> = KeyedLimiter::new(spec.parse::<Policy>().unwrap());
    let layer = RateLimitLayer::new(limiter, |req: &axum::extract::Request| {
        req.headers()
            .get("x-user")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .on_limit(on_limit);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    format!("{}/", spawn_app(app).await)
}

/// Serves `app` on 127.0.0.1:0 (without connect info); returns `http://ADDR`. The
/// server task ends with the test's runtime.
async fn spawn_app(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A client that opens a new connection for every request.
fn client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http()
}

async fn get_as(client: &HttpClient, url: &str, user: Option<&str>) -> http::Response<String> {
    let mut req = http::Request::get(url);
    if let Some(u) = user {
        req = req.header("x-user", u);
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap();
    http::Response::from_parts(parts, body)
}

#[tokio::test]
async fn rejects_with_429_and_headers_and_shares_the_limit_across_connections() {
    let url = serve("gcra:rate=1/m,burst=2", OnLimit::Reject).await;
    let c = client();
    let first = get_as(&c, &url, Some("alice")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["ratelimit-policy"], "\"default\";q=2;w=120");
    assert_eq!(first.headers()["ratelimit"], "\"default\";r=1;t=60");
    // A new connection (and a new service clone in axum): the same limit.
    assert_eq!(get_as(&client(), &url, Some("alice")).await.status(), 200);
    let third = get_as(&client(), &url, Some("alice")).await;
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "60");
    assert_eq!(third.headers()["ratelimit"], "\"default\";r=0;t=120");
    assert_eq!(third.headers()["content-type"], "application/problem+json");
    assert_eq!(
        third.body(),
        r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"rate limit exceeded","retry_after_s":60}"#
    );
    // Other keys are not affected; a request without a key is refused (400).
    assert_eq!(get_as(&c, &url, Some("bob")).await.status(), 200);
    for _ in 0..3 {
        assert_eq!(get_as(&c, &url, None).await.status(), 400);
    }
}

#[tokio::test]
async fn wait_mode_delays_instead_of_rejecting() {
    let url = serve("gcra:rate=20/s,burst=1,max-wait=1s", OnLimit::Wait).await;
    let clock = MonotonicClock::new();
    let start = clock.now_us();
    let c = client();
    let (a, b, d) = tokio::join!(
        get_as(&c, &url, Some("carol")),
        get_as(&c, &url, Some("carol")),
        get_as(&c, &url, Some("carol"))
    );
    assert!([a.status(), b.status(), d.status()]
        .iter()
        .all(|s| *s == 200));
    let elapsed = Duration::from_micros(clock.now_us() - start);
    assert!(
        elapsed >= Duration::from_millis(95),
        "three requests at 20/s took {elapsed:?}"
    );

    // Past max-wait, wait mode rejects too.
    let url = serve("gcra:rate=1/m,burst=1,max-wait=100ms", OnLimit::Wait).await;
    assert_eq!(get_as(&c, &url, Some("dave")).await.status(), 200);
    assert_eq!(get_as(&c, &url, Some("dave")).await.status(), 429);
}

#[tokio::test]
async fn non_http_services_get_an_error() {
    use tollgate::tower::{ErrorLayer, RateLimited};
    use tower::{service_fn, Layer, Service, ServiceExt};

    let limiter: KeyedLimiter<u32> =
        KeyedLimiter::new("fixed-window:limit=2,window=1m".parse::<Policy>().unwrap());
    let layer = ErrorLayer::new(limiter, |req: &(u32, &'static str)| Some(req.0));
    let echo =
        service_fn(
            |req: (u32, &'static str)| async move { Ok::<_, std::convert::Infallible>(req.1) },
        );
    let mut svc = layer.layer(echo);
    assert_eq!(
        svc.ready().await.unwrap().call((1, "a")).await.unwrap(),
        "a"
    );
    let mut other_clone = svc.clone();
    assert_eq!(
        other_clone
            .ready()
            .await
            .unwrap()
            .call((1, "b"))
            .await
            .unwrap(),
        "b"
    );
    let err = svc.ready().await.unwrap().call((1, "c")).await.unwrap_err();
    let limited = err
        .downcast_ref::<RateLimited>()
        .expect("a RateLimited error");
    assert!(limited
        .retry_after_us
        .is_some_and(|r| r > 0 && r <= 60_000_000));
    assert_eq!(
        svc.ready().await.unwrap().call((2, "d")).await.unwrap(),
        "d"
    );
}

/// The key of the budget tests: the `x-user` header.
fn user(req: &axum::extract::Request) -> Option<String> {
    req.headers()
        .get("x-user")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

/// Budgets known after the work: the handler reports the tokens its completion used
/// (the `Usage` extension, or a header read by a closure), and the layer charges them,
/// past the budget if need be; the key is refused until the window pays it back.
#[tokio::test]
async fn charges_what_the_response_reports_and_refuses_while_in_debt() {
    use axum::response::IntoResponse;
    use tollgate::tower::Usage;
    let tokens: KeyedLimiter<String> = KeyedLimiter::new(
        "fixed-window:limit=1000,window=1h,align=first"
            .parse::<Policy>()
            .unwrap(),
    );
    let completion = |used: u64| async move {
        let mut response = "completion".into_response();
        response.extensions_mut().insert(Usage(used));
        response
    };
    let by_header = |req: &http::Response<axum::body::Body>| {
        req.headers()
            .get("x-usage-total-tokens")?
            .to_str()
            .ok()?
            .parse()
            .ok()
    };
    let app = Router::new()
        .route("/small", get(move || completion(300)))
        .route("/big", get(move || completion(900)))
        .route("/failed", get(move || completion(0)))
        .layer(
            RateLimitLayer::new(tokens.clone(), user).charge_with(Usage::of::<axum::body::Body>),
        );
    let header_app = Router::new()
        .route(
            "/",
            get(|| async { ([("x-usage-total-tokens", "1500")], "done") }),
        )
        .layer(RateLimitLayer::new(tokens.clone(), user).charge_with(by_header));
    let mut urls = Vec::new();
    for app in [app, header_app] {
        urls.push(spawn_app(app).await);
    }
    let c = client();
    let first = get_as(&c, &format!("{}/small", urls[0]), Some("ada")).await;
    assert_eq!(first.status(), 200);
    assert_eq!(tokens.peek("ada", 0).unwrap().decision.remaining, 700);
    // A failed call reports 0: its admission unit is given back.
    get_as(&c, &format!("{}/failed", urls[0]), Some("ada")).await;
    assert_eq!(tokens.peek("ada", 0).unwrap().decision.remaining, 700);
    // 900 of the 700 left: served (admission needs one unit), charged into debt,
    // and the response already shows nothing left.
    let big = get_as(&c, &format!("{}/big", urls[0]), Some("ada")).await;
    assert_eq!(big.status(), 200);
    assert!(big.headers()["ratelimit"].to_str().unwrap().contains("r=0"));
    let refused = get_as(&c, &format!("{}/small", urls[0]), Some("ada")).await;
    assert_eq!(refused.status(), 429);
    // A closure over a response header: 1500 tokens for a fresh key, 500 past 1000.
    assert_eq!(get_as(&c, &urls[1], Some("bob")).await.status(), 200);
    assert_eq!(get_as(&c, &urls[1], Some("bob")).await.status(), 429);
}

/// Requests that reserve their declared bound at admission (`reserve`) cannot,
/// together, spend past the budget while they are all in flight: 20 at once of one
/// key, each declaring 300 tokens of a 1,000-token budget, held in the handler until
/// every one has been admitted or refused. Three fit; each then used 250, and what
/// they did not use comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_bounds_cap_requests_in_flight_and_settle_with_the_usage() {
    use axum::response::IntoResponse;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tollgate::tower::Usage;
    let tokens: KeyedLimiter<String> = KeyedLimiter::new(
        "token-bucket:rate=1000/d,capacity=1000"
            .parse::<Policy>()
            .unwrap(),
    );
    let declared = |req: &axum::extract::Request| -> u64 {
        let bound = req
            .headers()
            .get("x-max-tokens")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        bound.unwrap_or(1)
    };
    let entered = Arc::new(AtomicUsize::new(0));
    let (open, gate) = tokio::sync::watch::channel(false);
    let handler = {
        let entered = entered.clone();
        move || {
            let (entered, mut gate) = (entered.clone(), gate.clone());
            async move {
                entered.fetch_add(1, Ordering::SeqCst);
                gate.wait_for(|open| *open).await.unwrap();
                let mut response = "completion".into_response();
                response.extensions_mut().insert(Usage(250));
                response
            }
        }
    };
    let layer = RateLimitLayer::new(tokens.clone(), user)
        .reserve(declared)
        .charge_with(Usage::of::<axum::body::Body>);
    let url = spawn_app(Router::new().route("/", get(handler)).layer(layer)).await;
    let refused = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let (url, refused) = (url.clone(), refused.clone());
            tokio::spawn(async move {
                let req = http::Request::get(&url)
                    .header("x-user", "ada")
                    .header("x-max-tokens", "300")
                    .body(Empty::new())
                    .unwrap();
                let status = client().request(req).await.unwrap().status();
                if status == 429 {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                status
            })
        })
        .collect();
    // Every request admitted (held in the handler) or refused, before any answers.
    let all_in = async {
        while entered.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst) < 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(20), all_in)
        .await
        .unwrap();
    assert_eq!(
        entered.load(Ordering::SeqCst),
        3,
        "admitted while in flight"
    );
    open.send(true).unwrap();
    for call in calls {
        call.await.unwrap();
    }
    // 3 x 250 used; the 3 x 50 reserved beyond it given back (from a spawned task).
    let settled = async {
        while tokens.peek("ada", 0).unwrap().decision.remaining != 250 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), settled)
        .await
        .unwrap();
    // Using more than declared: 100 reserved, 250 used, the 150 beyond charged.
    let req = http::Request::get(&url)
        .header("x-user", "ada")
        .header("x-max-tokens", "100")
        .body(Empty::new())
        .unwrap();
    let over = client().request(req).await.unwrap();
    assert_eq!(over.status(), 200);
    assert_eq!(tokens.peek("ada", 0).unwrap().decision.remaining, 0);
}

/// A key closure that finds nothing (here the peer address, with axum served
/// without connect info: a setup mistake) is refused by default (400, a problem
/// body), as the server's fault with `ServerError` (500), and passed unlimited only
/// with `PassThrough`; every such request is counted.
#[tokio::test]
async fn requests_without_a_key_are_refused_unless_passing_is_asked_for() {
    use tollgate::tower::MissingKey;
    let peer = |req: &axum::extract::Request| {
        req.extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip())
    };
    let mut urls = Vec::new();
    let mut layers = Vec::new();
    for missing in [
        None,
        Some(MissingKey::ServerError),
        Some(MissingKey::PassThrough),
    ] {
        let limiter: KeyedLimiter<std::net::IpAddr> =
            KeyedLimiter::new("gcra:rate=1/m,burst=1".parse::<Policy>().unwrap());
        let layer = RateLimitLayer::new(limiter, peer);
        let layer = match missing {
            Some(m) => layer.on_missing_key(m),
            None => layer,
        };
        layers.push(layer.clone());
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        // Served without `into_make_service_with_connect_info`: no peer address.
        urls.push(format!("{}/", spawn_app(app).await));
    }
    let c = client();
    for _ in 0..3 {
        let refused = get_as(&c, &urls[0], None).await;
        assert_eq!(refused.status(), 400);
        assert_eq!(
            refused.headers()["content-type"],
            "application/problem+json"
        );
        assert!(
            refused.body().contains("no rate-limit key"),
            "{}",
            refused.body()
        );
        assert_eq!(get_as(&c, &urls[1], None).await.status(), 500);
        assert_eq!(get_as(&c, &urls[2], None).await.status(), 200);
    }
    for layer in &layers {
        assert_eq!(layer.unkeyed(), 3);
    }
}

/// `per_peer_ip` limits each client address, served with connect info; served without
/// it, every request is refused (500), not passed unlimited.
#[tokio::test]
async fn per_peer_ip_limits_each_client_and_fails_loudly_without_the_address() {
    let limiter = || KeyedLimiter::new("gcra:rate=1/m,burst=2".parse::<Policy>().unwrap());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::per_peer_ip(limiter()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.unwrap() });
    let url = format!("http://{addr}/");
    let c = client();
    let statuses: Vec<u16> = futures::future::join_all((0..3).map(|_| get_as(&c, &url, None)))
        .await
        .iter()
        .map(|r| r.status().as_u16())
        .collect();
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, [200, 200, 429], "{statuses:?}");

    let layer = RateLimitLayer::per_peer_ip(limiter());
    let bare = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.clone());
    let url = format!("{}/", spawn_app(bare).await);
    assert_eq!(get_as(&c, &url, None).await.status(), 500);
    assert_eq!(layer.unkeyed(), 1);
}

/// Serves `layer` over a handler that counts the requests in flight (and the most at
/// once) and sleeps `hold`; returns the base URL and the most in flight.
async fn counted<L>(
    layer: L,
    hold: Duration,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicU32>)
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<axum::extract::Request> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Response:
        axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Error:
        Into<std::convert::Infallible> + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
{
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let now = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let (n, m) = (now.clone(), most.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let (n, m) = (n.clone(), m.clone());
                async move {
                    let held = n.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(held, Ordering::SeqCst);
                    tokio::time::sleep(hold).await;
                    n.fetch_sub(1, Ordering::SeqCst);
                    "ok"
                }
            }),
        )
        .layer(layer);
    (format!("{}/", spawn_app(app).await), most)
}

/// A pacing policy is paced in the default (reject) mode too: a shaper at 5/s lets
/// 20 sequential requests through one every 200 ms (3.8 s at least), never early.
#[tokio::test]
#[allow(clippy::disallowed_methods)] // times a real server
async fn a_shaper_paces_sequential_requests_in_reject_mode() {
    let url = serve("shaper:rate=5/s,queue=20", OnLimit::Reject).await;
    let c = client();
    let t = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(get_as(&c, &url, Some("paced")).await.status(), 200);
    }
    assert!(
        t.elapsed() >= Duration::from_millis(3_750),
        "{:?}",
        t.elapsed()
    );
}

/// `limit-req` with a burst and no `nodelay` delays as nginx does: at 1/s with burst
/// 3, five requests at once are answered at 0, 1, 2 and 3 s, the fifth refused (in
/// wait mode it waits its turn too: 4 s).
#[tokio::test]
#[allow(clippy::disallowed_methods)] // times a real server
async fn limit_req_with_a_burst_delays_the_excess_as_nginx_does() {
    for mode in [OnLimit::Reject, OnLimit::Wait] {
        let url = serve("limit-req:rate=1/s,burst=3", mode).await;
        let c = client();
        let t = std::time::Instant::now();
        let answers = futures::future::join_all((0..5).map(|_| {
            let (c, url) = (c.clone(), url.clone());
            async move {
                let r = get_as(&c, &url, Some("burst")).await;
                (r.status().as_u16(), t.elapsed())
            }
        }))
        .await;
        let mut ok: Vec<Duration> = answers.iter().filter(|a| a.0 == 200).map(|a| a.1).collect();
        ok.sort();
        let admitted = if mode == OnLimit::Reject { 4 } else { 5 };
        assert_eq!(ok.len(), admitted, "{mode:?}: {answers:?}");
        assert_eq!(
            answers.iter().filter(|a| a.0 == 429).count(),
            5 - admitted,
            "{answers:?}"
        );
        // Each held for its turn: the k-th admitted at least k - 1 seconds after the
        // first (less however far apart the five arrived).
        for (k, at) in ok.iter().enumerate().skip(1) {
            assert!(
                *at >= Duration::from_millis(1000 * k as u64 - 300),
                "{mode:?}: {ok:?}"
            );
        }
    }
}

/// `concurrency:limit=N` in a rate-limit layer is refused (a check cannot give its
/// permits back), with a 500 saying so; `ConcurrencyLimitLayer` holds each permit
/// until the response ends: 10 concurrent requests never have more than 2 in flight,
/// and 20 sequential ones all pass (nothing is locked out).
#[tokio::test]
async fn concurrency_is_held_for_the_response_by_its_own_layer() {
    use tollgate::tower::ConcurrencyLimitLayer;
    let url = serve("concurrency:limit=2", OnLimit::Reject).await;
    let refused = get_as(&client(), &url, Some("c")).await;
    assert_eq!(refused.status(), 500);
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );

    for mode in [OnLimit::Reject, OnLimit::Wait] {
        let layer = ConcurrencyLimitLayer::new(2, user).on_limit(mode);
        let (url, most) = counted(layer.clone(), Duration::from_millis(100)).await;
        let c = client();
        let answers: Vec<u16> =
            futures::future::join_all((0..10).map(|_| get_as(&c, &url, Some("k"))))
                .await
                .iter()
                .map(|r| r.status().as_u16())
                .collect();
        assert!(
            most.load(std::sync::atomic::Ordering::SeqCst) <= 2,
            "{mode:?}"
        );
        let ok = answers.iter().filter(|&&s| s == 200).count();
        match mode {
            OnLimit::Wait => assert_eq!(ok, 10, "{answers:?}"),
            OnLimit::Reject => {
                assert!((2..10).contains(&ok), "{answers:?}");
                assert!(answers.iter().all(|&s| s == 200 || s == 429), "{answers:?}");
            }
        }
        for _ in 0..20 {
            assert_eq!(get_as(&c, &url, Some("k")).await.status(), 200, "{mode:?}");
        }
        // Without a key: refused (400) by default, and counted.
        assert_eq!(get_as(&c, &url, None).await.status(), 400);
        assert_eq!(layer.unkeyed(), 1);
    }
}

/// A rule set with both policies exhausted: `RateLimit`'s `t` is the binding
/// policy's — the one that binds longest — and agrees with `Retry-After`.
#[tokio::test]
async fn a_rule_set_s_headers_agree_with_retry_after() {
    let limiter: KeyedLimiter<String> = KeyedLimiter::new(
        tollgate::RuleSet::parse(&[
            "fixed-window:limit=1,window=1s,align=first",
            "fixed-window:limit=1,window=1h,align=first",
        ])
        .unwrap(),
    );
    let layer = RateLimitLayer::new(limiter, |req: &axum::extract::Request| {
        req.headers()
            .get("x-user")?
            .to_str()
            .ok()
            .map(str::to_owned)
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let url = format!("{}/", spawn_app(app).await);
    let c = client();
    assert_eq!(get_as(&c, &url, Some("u")).await.status(), 200);
    let r = get_as(&c, &url, Some("u")).await;
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let current = r.headers()["ratelimit"].to_str().unwrap();
    assert!(current.starts_with("\"default.1\";r=0;t="), "{current}");
    let t: u64 = current.rsplit("t=").next().unwrap().parse().unwrap();
    assert!(retry > 1 && t >= retry, "Retry-After {retry}, {current}");
}
