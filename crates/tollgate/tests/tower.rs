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
    // Other keys, and requests without a key, are not affected.
    assert_eq!(get_as(&c, &url, Some("bob")).await.status(), 200);
    for _ in 0..5 {
        assert_eq!(get_as(&c, &url, None).await.status(), 200);
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

/// Budgets known after the work: the handler reports the tokens its completion used
/// (the `Usage` extension, or a header read by a closure), and the layer charges them,
/// past the budget if need be; the key is refused until the window pays it back.
#[tokio::test]
async fn charges_what_the_response_reports_and_refuses_while_in_debt() {
    use axum::response::IntoResponse;
    use tollgate::tower::Usage;
    let tokens: KeyedLimiter<String> = KeyedLimiter::new(
        "fixed-window:limit=1000,window=1h"
            .parse::<Policy>()
            .unwrap(),
    );
    let key = |req: &axum::extract::Request| {
        req.headers()
            .get("x-user")?
            .to_str()
            .ok()
            .map(str::to_owned)
    };
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
        .layer(RateLimitLayer::new(tokens.clone(), key).charge_with(Usage::of::<axum::body::Body>));
    let header_app = Router::new()
        .route(
            "/",
            get(|| async { ([("x-usage-total-tokens", "1500")], "done") }),
        )
        .layer(RateLimitLayer::new(tokens.clone(), key).charge_with(by_header));
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

/// A key closure that finds nothing (here the peer address, with axum served
/// without connect info: a setup mistake) limits nothing: the layer counts those
/// requests, and with `MissingKey::Reject` refuses them instead of passing them.
#[tokio::test]
async fn requests_without_a_key_are_counted_or_refused() {
    use tollgate::tower::MissingKey;
    let peer = |req: &axum::extract::Request| {
        req.extensions()
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0.ip())
    };
    let mut urls = Vec::new();
    let mut layers = Vec::new();
    for missing in [MissingKey::PassThrough, MissingKey::Reject] {
        let limiter: KeyedLimiter<std::net::IpAddr> =
            KeyedLimiter::new("gcra:rate=1/m,burst=1".parse::<Policy>().unwrap());
        let layer = RateLimitLayer::new(limiter, peer).on_missing_key(missing);
        layers.push(layer.clone());
        let app = Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        // Served without `into_make_service_with_connect_info`: no peer address.
        urls.push(format!("{}/", spawn_app(app).await));
    }
    let c = client();
    for _ in 0..3 {
        assert_eq!(get_as(&c, &urls[0], None).await.status(), 200);
        assert_eq!(get_as(&c, &urls[1], None).await.status(), 500);
    }
    assert_eq!(layers[0].unkeyed(), 3);
    assert_eq!(layers[1].unkeyed(), 3);
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
