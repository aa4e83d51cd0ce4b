//! A rate limit in front of a tonic gRPC service (feature `tonic`), keyed by the
//! caller's `x-api-key` metadata: two calls a minute per key, answered in gRPC's own
//! words. Over the limit: `RESOURCE_EXHAUSTED`, the delay before a call fits again in
//! `google.rpc.RetryInfo` (which gRPC clients and retry policies read) and in
//! `retry-after` metadata; no key: `UNAUTHENTICATED`; a store that cannot answer
//! (Redis down, no failure policy): `UNAVAILABLE`. The service is tonic's standard
//! health service (grpc.health.v1), so nothing needs generating.
//!
//! cargo run -p tollgate --features tonic,redis --example grpc
//! then, with grpcurl: grpcurl -plaintext -H 'x-api-key: k' 127.0.0.1:50051 grpc.health.v1.Health/Check
//! (`-- --check` serves on a free port, makes the calls with tonic's client, checks
//! each status, and exits: what `scripts/test.sh` runs.)

use std::time::Duration;

use tollgate::redis::{RedisOptions, RedisStore};
use tollgate::tower::RateLimitLayer;
use tollgate::{AnyLimiter, KeyedLimiter, Policy};
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;

/// The key of a call: its `x-api-key` metadata (`None`: refused, UNAUTHENTICATED).
fn api_key(req: &http::Request<tonic::body::Body>) -> Option<String> {
    req.headers()
        .get("x-api-key")?
        .to_str()
        .ok()
        .map(str::to_owned)
}

/// Serves the health service behind `limiter` on `listener`.
async fn serve(limiter: AnyLimiter, listener: tokio::net::TcpListener) {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    Server::builder()
        .layer(RateLimitLayer::new(limiter, api_key).grpc())
        .add_service(health)
        .serve_with_incoming(incoming)
        .await
        .expect("the server stops only with the process");
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_key = AnyLimiter::Memory(KeyedLimiter::new(
        "fixed-window:limit=2,window=1m".parse::<Policy>()?,
    ));
    let check = std::env::args().any(|a| a == "--check");
    let addr = if check {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:50051"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    println!("gRPC on {local}");
    if !check {
        serve(per_key, listener).await;
        return Ok(());
    }
    tokio::spawn(serve(per_key, listener));
    let mut client = HealthClient::new(
        Channel::from_shared(format!("http://{local}"))?
            .connect()
            .await?,
    );
    // Two calls of key "k" pass; the third is over the limit until the minute ends.
    for _ in 0..2 {
        client.check(call(Some("k"))).await?;
    }
    let over = client
        .check(call(Some("k")))
        .await
        .expect_err("the third call passed");
    assert_eq!(over.code(), Code::ResourceExhausted, "{over:?}");
    let retry = over.get_details_retry_info().and_then(|r| r.retry_delay);
    let retry = retry.expect("RetryInfo in the status details");
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(60),
        "{retry:?}"
    );
    let seconds: u64 = over
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()?
        .parse()?;
    assert_eq!(seconds, retry.as_secs_f64().ceil() as u64);
    println!(
        "third call: {:?} {:?}, retry in {retry:?} (retry-after: {seconds})",
        over.code(),
        over.message()
    );
    // Another key has its own limit; a call without a key is refused.
    client.check(call(Some("other"))).await?;
    let unkeyed = client
        .check(call(None))
        .await
        .expect_err("a call without a key passed");
    assert_eq!(unkeyed.code(), Code::Unauthenticated, "{unkeyed:?}");
    // A limit kept in a Redis that does not answer (nothing listens on the port).
    let gone = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("redis://{}/", gone.local_addr()?);
    drop(gone);
    let opts = RedisOptions {
        timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let store = RedisStore::connect_later(&url, opts)?;
    let in_redis = AnyLimiter::redis(store, "grpc", "gcra:rate=10/s".parse::<Policy>()?)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let redis_addr = listener.local_addr()?;
    tokio::spawn(serve(in_redis, listener));
    let mut client = HealthClient::new(
        Channel::from_shared(format!("http://{redis_addr}"))?
            .connect()
            .await?,
    );
    let down = client
        .check(call(Some("k")))
        .await
        .expect_err("a call passed a store that is down");
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    println!("ok: RESOURCE_EXHAUSTED with RetryInfo, UNAUTHENTICATED, UNAVAILABLE");
    Ok(())
}

/// A health check, with `key` as its `x-api-key` metadata.
fn call(key: Option<&str>) -> tonic::Request<HealthCheckRequest> {
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(key) = key {
        req.metadata_mut()
            .insert("x-api-key", key.parse().expect("an ASCII key"));
    }
    req
}
