//! Rate-limit headers written by hand (feature `http`): a handler that decides itself
//! — here a costed check, one unit per item asked for, under `10/s AND 100/min` per API
//! key — and answers with the same `RateLimit-Policy`, `RateLimit` and `Retry-After`
//! headers the tower layer and the service send.
//!
//! cargo run -p tollgate --features http --example headers
//! then: curl -si -H 'x-api-key: a' 'http://127.0.0.1:3000/items?n=4'
//! (`-- --check` serves on a free port, spends the key's budget itself, checks the
//! headers, and exits: what `scripts/test.sh` runs.)

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use tollgate::headers::{insert_all, HeaderStyle, PolicyHeader, RateLimitHeaders};
use tollgate::{KeyedLimiter, Op, RuleSet};

#[derive(Clone)]
struct Limits {
    per_key: KeyedLimiter<String>,
    /// Made once: the `RateLimit-Policy` value and each policy's item name.
    policy: std::sync::Arc<PolicyHeader>,
}

async fn items(
    State(limits): State<Limits>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, u64>>,
) -> (StatusCode, HeaderMap, String) {
    let mut out = HeaderMap::new();
    let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) else {
        return (
            StatusCode::BAD_REQUEST,
            out,
            "x-api-key is required\n".into(),
        );
    };
    let n = query.get("n").copied().unwrap_or(1);
    match limits.per_key.check_rules(key, n, Op::Try) {
        Ok(d) => {
            let h = RateLimitHeaders::of(&limits.policy, &d);
            insert_all(&mut out, h.fields(HeaderStyle::Ietf, true));
            if d.decision.allowed {
                (StatusCode::OK, out, format!("{n} items\n"))
            } else {
                (StatusCode::TOO_MANY_REQUESTS, out, "slow down\n".into())
            }
        }
        // A cost that can never fit (n = 0, or more than 10 at once): not a retry.
        Err(e) => (StatusCode::BAD_REQUEST, out, format!("{e}\n")),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rules = RuleSet::parse(&[
        "gcra:rate=10/s,burst=10",
        "fixed-window:limit=100,window=1m",
    ])?;
    let limits = Limits {
        policy: std::sync::Arc::new(PolicyHeader::new("items", &rules)),
        per_key: KeyedLimiter::new(rules),
    };
    let app = Router::new().route("/items", get(items)).with_state(limits);
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
    let get = |n: u64| {
        let request = http::Request::get(format!("http://{local}/items?n={n}"))
            .header("x-api-key", "check")
            .body(http_body_util::Empty::new())
            .unwrap();
        client.request(request)
    };
    let header = |r: &http::Response<_>, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
    };
    let first = get(4).await?;
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some("\"items.0\";q=10;w=1, \"items.1\";q=100;w=60")
    );
    // Four of the ten a second spent: the per-second policy binds (r = 6 left).
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some("\"items.0\";r=6;t=1")
    );
    // Past the per-second budget: refused, Retry-After within the second. (Ten more
    // pass only if the machine took 400 ms to ask; then the next ten are refused.)
    let refused = loop {
        let answer = get(10).await?;
        if answer.status() != 200 {
            break answer;
        }
    };
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("1"));
    // More than the policy ever admits at once: a clear 400, not a retry.
    let never = get(11).await?;
    assert_eq!(never.status(), 400);
    println!(
        "200 with {:?}; 429 with retry-after {:?}",
        header(&first, "ratelimit"),
        header(&refused, "retry-after")
    );
    Ok(())
}
