//! An axum server limited per client IP (10 requests per second, bursts of 5), and
//! per API key when one is sent.
//!
//! cargo run -p tollgate --features tower --example axum
//! then: for i in $(seq 8); do curl -si http://127.0.0.1:3000/ | head -1; done
//! (`-- --check` serves on a free port, sends the eight requests itself and exits:
//! what `scripts/test.sh` runs.)

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use tollgate::tower::{OnLimit, RateLimitLayer};
use tollgate::{KeyedLimiter, Policy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter: KeyedLimiter<String> =
        KeyedLimiter::new("gcra:rate=10/s,burst=5".parse::<Policy>()?);
    let layer = RateLimitLayer::new(limiter, |req: &axum::extract::Request| {
        // The API key if there is one, else the peer's IP.
        if let Some(key) = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) {
            return Some(format!("key:{key}"));
        }
        let peer = req.extensions().get::<ConnectInfo<SocketAddr>>()?;
        Some(format!("ip:{}", peer.0.ip()))
    })
    .on_limit(OnLimit::Reject);
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    // `--check` (what the test command runs): serve on a free port, send eight
    // requests from one address, check that the burst of 5 passed and the rest were
    // refused with Retry-After, and exit.
    let check = std::env::args().any(|a| a == "--check");
    let addr = if check {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    if !check {
        server.await?;
        return Ok(());
    }
    tokio::spawn(async move { server.await });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let response = client.get(format!("http://{local}/").parse()?).await?;
        if response.status() == 429 {
            assert!(response.headers().contains_key("retry-after"));
        }
        statuses.push(response.status().as_u16());
    }
    println!("statuses: {statuses:?}");
    assert_eq!(&statuses[..5], [200; 5], "the burst of 5 passes");
    assert!(
        statuses[5..].contains(&429),
        "past the burst, 429: {statuses:?}"
    );
    Ok(())
}
