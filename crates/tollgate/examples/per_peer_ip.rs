#![allow(clippy::disallowed_methods)] // an example times its own check with Instant, as users do
//! nginx's `limit_req zone=$binary_remote_addr rate=5r/s burst=10` in an axum
//! server (feature `axum`): one `limit-req` limit per client IP, a burst of 10 that is
//! delayed, not refused (each request waits its turn, 200 ms apart), and 429 past it.
//!
//! cargo run -p tollgate --features axum --example per_peer_ip
//! then: for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} %{time_total}\n' http://127.0.0.1:3000/ & done; wait
//! (`-- --check` serves on a free port, sends the twelve requests at once itself,
//! checks that none reached the handler before its turn, and exits: what
//! `scripts/test.sh` runs.)

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use tollgate::tower::RateLimitLayer;
use tollgate::{KeyedLimiter, Policy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_ip: KeyedLimiter<IpAddr> =
        KeyedLimiter::new("limit-req:rate=5/s,burst=10".parse::<Policy>()?);
    // When each request reached the handler (for `--check`).
    let reached: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let log = reached.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || async move {
                log.lock().unwrap().push(Instant::now());
                "hello\n"
            }),
        )
        // The key is the peer's address: serve with `into_make_service_with_connect_info`
        // (without it every request is answered 500, and the log says why).
        .layer(RateLimitLayer::per_peer_ip(per_ip));
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
    let sent = Instant::now();
    let requests = (0..12).map(|_| {
        let client = client.clone();
        tokio::spawn(async move {
            let response = client.get(format!("http://{local}/").parse()?).await?;
            Ok::<u16, Box<dyn std::error::Error + Send + Sync>>(response.status().as_u16())
        })
    });
    let mut statuses = Vec::new();
    for r in futures::future::join_all(requests.collect::<Vec<_>>()).await {
        statuses.push(r?.map_err(|e| e.to_string())?);
    }
    statuses.sort_unstable();
    let reached = reached.lock().unwrap().clone();
    let at: Vec<u128> = reached.iter().map(|t| (*t - sent).as_millis()).collect();
    println!("statuses: {statuses:?}; reached the handler at {at:?} ms");
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert_eq!(admitted, reached.len());
    assert!(admitted >= 11, "the burst of 10 is delayed, not refused");
    // The k-th admitted request is released no earlier than 200 ms x k after the
    // first was sent (nginx's excess, leaking at 5 a second; 1 ms of its rounding).
    for (k, t) in reached.iter().enumerate() {
        let turn = Duration::from_millis(200 * k as u64).saturating_sub(Duration::from_millis(1));
        assert!(
            *t - sent >= turn,
            "request {k} reached the handler before its turn: {at:?}"
        );
    }
    Ok(())
}
