//! An axum server behind an adaptive concurrency limit: the limit follows the
//! handler's capacity (here a simulated one: 8 requests at a time at 20 ms; more
//! share the time), `x-priority: critical|normal|sheddable` sets each request's
//! priority, and callers (`x-api-key`) share the limit fairly.
//!
//! cargo run -p tollgate --features tower --example adaptive
//! then, e.g. with wrk or hey: 64 connections of sheddable work beside a few critical
//! ones, and watch http://127.0.0.1:3000/stats. (`-- --check` serves on a free port,
//! loads it for 2 s itself and exits: what `scripts/test.sh` runs.)

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
    let limiter_stats = limiter.clone();
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
    // `--check` (what the test command runs): serve on a free port, send 32 clients'
    // worth of requests for 2 s (4x the capacity), check that every one was answered
    // (200, or 503 when shed) and that the limit moved, and exit.
    let check = std::env::args().any(|a| a == "--check");
    let addr = if check {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3000"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!("listening on http://{local}");
    let server = axum::serve(listener, app);
    if !check {
        server.await?;
        return Ok(());
    }
    tokio::spawn(async move { server.await });
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    let clients = (0..32).map(|_| {
        let client = client.clone();
        tokio::spawn(async move {
            let (mut ok, mut shed) = (0u32, 0u32);
            while tokio::time::Instant::now() < until {
                let uri: http::Uri = format!("http://{local}/").parse().unwrap();
                match client.get(uri).await.map(|r| r.status().as_u16()) {
                    Ok(200) => ok += 1,
                    Ok(503) => shed += 1,
                    other => panic!("unexpected answer {other:?}"),
                }
            }
            (ok, shed)
        })
    });
    let (mut ok, mut shed) = (0, 0);
    for c in clients.collect::<Vec<_>>() {
        let (o, s) = c.await?;
        (ok, shed) = (ok + o, shed + s);
    }
    let stats = limiter_stats.stats();
    println!(
        "{ok} served, {shed} shed; limit {} (started at 4)",
        stats.limit
    );
    assert!(ok > 0 && stats.windows > 0, "{stats:?}");
    Ok(())
}
