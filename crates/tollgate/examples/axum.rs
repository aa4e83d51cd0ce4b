//! An axum server limited per client IP (10 requests per second, bursts of 5), and
//! per API key when one is sent.
//!
//! cargo run -p tollgate --features tower --example axum
//! then: for i in $(seq 8); do curl -si http://127.0.0.1:3000/ | head -1; done

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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
