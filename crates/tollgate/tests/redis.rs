//! The Redis store against real redis-server processes (a standalone server and a
//! 3-master Cluster).

#[path = "support/redis_server.rs"]
mod redis_server;

use redis_server::RedisServers;
use tollgate::redis::{RedisLimiter, RedisStore};
use tollgate::{Op, RuleSet};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn gcra_burst_then_reject_with_redis_time() {
    let servers = RedisServers::standalone();
    rt().block_on(async {
        let store = RedisStore::connect(&servers.url()).await.unwrap();
        let limiter = RedisLimiter::new(
            store,
            "t",
            RuleSet::parse(&["gcra:rate=1/m,burst=3"]).unwrap(),
        )
        .unwrap();
        for i in 0..3 {
            let d = limiter.check("k", 1).await.unwrap();
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 2 - i);
        }
        let d = limiter.check("k", 1).await.unwrap();
        assert!(!d.allowed);
        let retry = d.retry_after_us.unwrap();
        // The fourth fits one interval (60 s) after the burst.
        assert!(retry > 59_000_000 && retry <= 60_000_000, "{retry}");
        // Another key is untouched.
        assert!(limiter.check("other", 1).await.unwrap().allowed);
        let _ = Op::Try;
    });
}

/// How long each child of `four_processes_share_one_global_limit` hammers.
const HAMMER_MS: u64 = 2500;

/// Run as a child process by `four_processes_share_one_global_limit` (a no-op in a
/// normal test run): hammers two keys for the given time and prints what it was
/// admitted.
#[test]
fn hammer_child_process() {
    let Ok(url) = std::env::var("TOLLGATE_HAMMER_URL") else {
        return;
    };
    let ms = HAMMER_MS;
    let (exact, paced) = rt().block_on(async {
        // Four processes of a debug build on two cores: allow slow answers.
        let opts = tollgate::redis::RedisOptions {
            timeout: std::time::Duration::from_secs(5),
            ..Default::default()
        };
        let store = RedisStore::connect_with(&url, opts).await.unwrap();
        let window = RedisLimiter::new(
            store.clone(),
            "global",
            RuleSet::parse(&["fixed-window:limit=500,window=1h"]).unwrap(),
        )
        .unwrap();
        let gcra = RedisLimiter::new(
            store,
            "global",
            RuleSet::parse(&["gcra:rate=100/s,burst=10"]).unwrap(),
        )
        .unwrap();
        let clock = tollgate::MonotonicClock::new();
        let end = tollgate::Clock::now_us(&clock) + ms * 1000;
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (window, gcra) = (window.clone(), gcra.clone());
            let clock = clock.clone();
            tasks.push(tokio::spawn(async move {
                let (mut a, mut b) = (0u64, 0u64);
                while tollgate::Clock::now_us(&clock) < end {
                    a += u64::from(window.check("one-key", 1).await.unwrap().allowed);
                    b += u64::from(gcra.check("paced-key", 1).await.unwrap().allowed);
                }
                (a, b)
            }));
        }
        let mut sum = (0, 0);
        for t in tasks {
            let (a, b) = t.await.unwrap();
            sum = (sum.0 + a, sum.1 + b);
        }
        sum
    });
    println!("ADMITTED {exact} {paced}");
}

#[test]
fn four_processes_share_one_global_limit() {
    let servers = RedisServers::standalone();
    let ms = HAMMER_MS;
    let clock = tollgate::MonotonicClock::new();
    let started = tollgate::Clock::now_us(&clock);
    let reports = redis_server::run_children(
        "hammer_child_process",
        4,
        "TOLLGATE_HAMMER_URL",
        &servers.url(),
        "ADMITTED",
    );
    let reported = reports.len();
    let exact: i64 = reports.iter().map(|v| v[0]).sum();
    let paced: i64 = reports.iter().map(|v| v[1]).sum();
    let elapsed_s = (tollgate::Clock::now_us(&clock) - started) as f64 / 1e6;
    assert_eq!(reported, 4);
    // Every process hammered far past 500: exactly 500 got through in the hour window.
    assert_eq!(exact, 500);
    // GCRA 100/s with burst 10: never more than burst + rate * elapsed, all processes
    // together (and, as they hammered throughout, not far below it).
    let bound = 10.0 + 100.0 * elapsed_s;
    assert!((paced as f64) <= bound, "{paced} admitted > {bound}");
    assert!(
        paced as f64 >= 100.0 * (ms as f64 / 1e3) * 0.8,
        "only {paced} admitted"
    );
}

#[test]
fn negative_cache_rejects_locally_until_the_retry_time() {
    let servers = RedisServers::standalone();
    rt().block_on(async {
        let store = RedisStore::connect(&servers.url()).await.unwrap();
        let opts = tollgate::redis::RedisLimiterOptions {
            negative_cache: true,
            ..Default::default()
        };
        let rules = RuleSet::parse(&["gcra:rate=5/s,burst=1"]).unwrap();
        let limiter = RedisLimiter::with_options(store, "neg", rules, opts).unwrap();
        assert!(limiter.check("k", 1).await.unwrap().allowed);
        let first = limiter.check("k", 1).await.unwrap();
        assert!(!first.allowed);
        let before = limiter.stats();
        let cached = limiter.check("k", 1).await.unwrap();
        assert!(!cached.allowed);
        assert!(cached.retry_after_us.unwrap() <= first.retry_after_us.unwrap());
        let after = limiter.stats();
        assert_eq!(after.negative_cache_hits, before.negative_cache_hits + 1);
        assert_eq!(
            after.redis_decisions, before.redis_decisions,
            "no round trip"
        );
        // Once the retry time has passed, Redis decides (and admits) again.
        tokio::time::sleep(std::time::Duration::from_micros(
            first.retry_after_us.unwrap() + 5_000,
        ))
        .await;
        assert!(limiter.check("k", 1).await.unwrap().allowed);
        assert_eq!(limiter.stats().redis_decisions, after.redis_decisions + 1);
    });
}
