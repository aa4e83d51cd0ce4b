//! One behaviour suite for the one limiter interface: the same generic code, run
//! against the memory store and against real Redis (Functions, EVALSHA, Cluster),
//! through `AnyLimiter` as a server would hold it; and the tower layer over it.

use tollgate_testkit as testkit;

use testkit::{rt, RedisServers};
use tollgate::error::CheckError;
use tollgate::redis::{RedisCalls, RedisOptions, RedisStore};
use tollgate::{AnyLimiter, Error, Op, RateLimiter, RuleSet};

/// What every store must do alike (a slow rate, so that nothing refills mid-test).
async fn behaves(limiter: &impl RateLimiter, store: &str) {
    let key = format!("user-{store}");
    // Burst of 3, then a reject with a retry time of one interval (20 s).
    for left in [2, 1, 0] {
        let d = limiter.check(&key, 1).await.unwrap();
        assert!(d.allowed, "{store}");
        assert_eq!(d.remaining, left, "{store}");
    }
    let d = limiter.check(&key, 1).await.unwrap();
    assert!(!d.allowed, "{store}");
    let retry = d.retry_after_us.unwrap();
    assert!(
        retry > 19_000_000 && retry <= 20_000_000,
        "{store}: {retry}"
    );
    // Peek changes nothing; the rule decision names each policy.
    let p = limiter.peek(&key, 1).await.unwrap();
    assert!(
        !p.decision.allowed && p.policies.len() == 2,
        "{store}: {p:?}"
    );
    // A peek of cost 0 is the state as it stands: spent, yet admitted (it counts
    // nothing); a fresh key shows its whole burst.
    let p = limiter.peek(&key, 0).await.unwrap();
    assert!(
        p.decision.allowed && p.decision.remaining == 0,
        "{store}: {p:?}"
    );
    let fresh = limiter.peek(&format!("fresh-{store}"), 0).await.unwrap();
    assert_eq!(fresh.decision.remaining, 3, "{store}: {fresh:?}");
    // A refund gives a unit back.
    limiter.refund(&key, 1).await.unwrap();
    let d = limiter.check(&key, 1).await.unwrap();
    assert!(d.allowed && d.remaining == 0, "{store}: {d:?}");
    // Reset forgets the key.
    limiter.reset(&key).await.unwrap();
    assert_eq!(
        limiter.check(&key, 1).await.unwrap().remaining,
        2,
        "{store}"
    );
    // Acquire beyond max-wait rejects at once and reserves nothing.
    let _ = limiter.check(&key, 2).await.unwrap();
    let d = limiter.acquire(&key, 1).await.unwrap();
    assert!(!d.allowed, "{store}: max-wait is 1s, the wait 20s");
    let d = limiter.check_rules(&key, 1, Op::Try).await.unwrap();
    assert!(!d.decision.allowed, "{store}");
    // A cost no policy can ever admit is an error, the same everywhere.
    let e = limiter.check(&key, 4).await.unwrap_err();
    assert_eq!(
        e,
        Error::Check(CheckError::InsufficientCapacity {
            cost: 4,
            capacity: 3
        }),
        "{store}"
    );
    assert!(!e.is_transient());
    // A charge of work already done goes into debt on every policy: admitted,
    // nothing left, and a unit fits again once the debt is paid back.
    let tokens = format!("tokens-{store}");
    let c = limiter.charge(&tokens, 5).await.unwrap();
    assert!(
        c.decision.allowed && c.decision.remaining == 0,
        "{store}: {c:?}"
    );
    // GCRA 3/m, burst 3: 5 units put the TAT 100 s ahead; a unit fits at 60 s.
    let retry = c.decision.retry_after_us.unwrap();
    assert!(
        retry > 59_000_000 && retry <= 60_000_000,
        "{store}: {retry}"
    );
    assert_eq!(c.policies[1].remaining, 95, "{store}");
    assert!(!limiter.check(&tokens, 1).await.unwrap().allowed, "{store}");
    // A charge of 0 changes nothing; Envoy's counting counts a rejected hit.
    let zero = limiter.charge(&tokens, 0).await.unwrap();
    assert_eq!(zero.policies[1].remaining, 95, "{store}");
    let counted = limiter.check_rules(&tokens, 2, Op::Count).await.unwrap();
    assert!(!counted.decision.allowed, "{store}");
    assert_eq!(counted.policies[1].remaining, 93, "{store}: {counted:?}");
    // New rules: the key's state carries over (GCRA to GCRA).
    let wider = RuleSet::parse(&[
        "gcra:rate=3/m,burst=5,max-wait=1s",
        "fixed-window:limit=100,window=1h,align=first",
    ])
    .unwrap();
    limiter.set_rules(wider.clone()).unwrap();
    assert_eq!(limiter.rules(), wider);
    assert!(limiter.check(&key, 1).await.unwrap().allowed, "{store}");
}

/// Rules that pace: a plain check is refused (it would read "allowed" and pace
/// nothing); the try through `check_rules` reports the wait to sleep.
async fn refuses_a_plain_check_of_pacing_rules(limiter: &impl RateLimiter, store: &str) {
    let key = format!("paced-{store}");
    let e = limiter.check(&key, 1).await.unwrap_err();
    assert!(matches!(e, Error::Paces(_)), "{store}: {e}");
    assert!(e.to_string().contains("use acquire"), "{store}: {e}");
    use tollgate::clock::Clock;
    let clock = tollgate::clock::MonotonicClock::new();
    let start = clock.now_us();
    let first = limiter
        .check_rules(&key, 1, Op::Try)
        .await
        .unwrap()
        .decision;
    let second = limiter
        .check_rules(&key, 1, Op::Try)
        .await
        .unwrap()
        .decision;
    let took = clock.now_us() - start;
    assert!(first.allowed && second.allowed, "{store}");
    // One interval (100 ms) after the first, less the time between the two decisions
    // (at most the two calls' time: a busy machine or Cluster takes milliseconds).
    assert_eq!(first.wait_us, 0, "{store}");
    assert!(
        second.wait_us <= 100_000 && second.wait_us + took >= 100_000,
        "{store}: {second:?} after {took} us"
    );
}

fn pacing() -> RuleSet {
    RuleSet::parse(&["shaper:rate=10/s,queue=5"]).unwrap()
}

fn rules() -> RuleSet {
    RuleSet::parse(&[
        "gcra:rate=3/m,burst=3,max-wait=1s",
        "fixed-window:limit=100,window=1h,align=first",
    ])
    .unwrap()
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn every_store_behaves_alike_behind_the_one_interface() {
    let single = RedisServers::standalone();
    let cluster = RedisServers::cluster();
    rt().block_on(async {
        behaves(&AnyLimiter::memory(rules()), "memory").await;
        refuses_a_plain_check_of_pacing_rules(&AnyLimiter::memory(pacing()), "memory").await;
        for (label, url, calls) in [
            ("functions", single.url(), RedisCalls::Functions),
            ("evalsha", single.url(), RedisCalls::Eval),
            ("cluster", cluster.url(), RedisCalls::Auto),
        ] {
            let opts = RedisOptions {
                calls,
                ..RedisOptions::default()
            };
            let store = RedisStore::connect_with(&url, opts).await.unwrap();
            let limiter = AnyLimiter::redis(store.clone(), label, rules()).unwrap();
            behaves(&limiter, label).await;
            let paced = AnyLimiter::redis(store, &format!("{label}-paced"), pacing()).unwrap();
            refuses_a_plain_check_of_pacing_rules(&paced, label).await;
        }
    });
}

#[test]
fn an_unreachable_redis_is_a_transient_error() {
    let port = testkit::free_port();
    rt().block_on(async {
        let opts = RedisOptions {
            timeout: std::time::Duration::from_millis(200),
            ..RedisOptions::default()
        };
        let url = format!("redis://127.0.0.1:{port}/");
        // Connecting now says so; a store that connects later decides by its failure
        // policy, here none: the error, transient.
        let e = RedisStore::connect_with(&url, opts.clone())
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        let store = RedisStore::connect_later(&url, opts).unwrap();
        let limiter = AnyLimiter::redis(store, "down", rules()).unwrap();
        let e = limiter.check("k", 1).await.unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    });
}

/// The tower layer over limits kept in Redis: a real axum server, a real client.
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn the_tower_layer_limits_through_redis_and_answers_503_while_redis_is_down() {
    use axum::routing::get;
    use http_body_util::Empty;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tollgate::tower::RateLimitLayer;

    let mut redis = RedisServers::standalone();
    rt().block_on(async {
        let opts = RedisOptions {
            timeout: std::time::Duration::from_millis(200),
            ..RedisOptions::default()
        };
        let store = RedisStore::connect_with(&redis.url(), opts).await.unwrap();
        let rules = RuleSet::parse(&["gcra:rate=1/m,burst=2"]).unwrap();
        let limiter = AnyLimiter::redis(store, "tower", rules).unwrap();
        let layer = RateLimitLayer::new(limiter, |req: &axum::extract::Request| {
            req.headers()
                .get("x-user")?
                .to_str()
                .ok()
                .map(str::to_owned)
        });
        let app = axum::Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client: Client<_, Empty<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let send = |user: &'static str| {
            let req = http::Request::get(&url)
                .header("x-user", user)
                .body(Empty::new())
                .unwrap();
            let f = client.request(req);
            async move { f.await.unwrap() }
        };
        let status = |user: &'static str| {
            let f = send(user);
            async move { f.await.status().as_u16() }
        };
        assert_eq!(
            [status("a").await, status("a").await, status("a").await],
            [200, 200, 429]
        );
        assert_eq!(status("b").await, 200);
        redis.stop(0);
        // The store down: 503, when to ask again, and why.
        let down = send("c").await;
        assert_eq!(down.status(), 503);
        assert_eq!(down.headers()["retry-after"], "1");
        let body = http_body_util::BodyExt::collect(down.into_body())
            .await
            .unwrap();
        let body = body.to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains("the rate limit's store cannot answer"),
            "{body}"
        );
    });
}
