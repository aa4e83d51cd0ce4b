//! An axum server behind an adaptive concurrency limit: the limit follows the
//! handler's capacity (here a simulated one: 8 requests at a time at 20 ms; more
//! share the time), `x-priority: critical|normal|sheddable` sets each request's
//! priority, and callers (`x-api-key`) share the limit fairly.
//!
//! cargo run -p tollgate --features tower --example adaptive
//! then, e.g. with wrk or hey: 64 connections of sheddable work beside a few critical
//! ones, and watch http://127.0.0.1:3000/stats.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tollgate::adaptive::{AdaptiveLimiter, Priority, Request};
use tollgate::tower::AdaptiveConcurrencyLayer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = AdaptiveLimiter::fair("gradient:max=200".parse()?);
    let layer = AdaptiveConcurrencyLayer::new(limiter.clone()).prioritize(
        |req: &axum::extract::Request| {
            let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
            let priority = header("x-priority")
                .and_then(|p| p.parse().ok())
                .unwrap_or(Priority::NORMAL);
            Request::new(priority).caller(header("x-api-key").unwrap_or(""))
        },
    );
    // The work: 20 ms each, up to 8 at once; beyond that every request slows down.
    let in_flight = Arc::new(AtomicU32::new(0));
    let work = move || {
        let in_flight = in_flight.clone();
        async move {
            let n = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(Duration::from_millis(20) * n.max(8) / 8).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            "done\n"
        }
    };
    let app = Router::new().route("/", get(work)).layer(layer).route(
        "/stats",
        get(move || {
            let limiter = limiter.clone();
            async move { format!("{:#?}\n", limiter.stats()) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
