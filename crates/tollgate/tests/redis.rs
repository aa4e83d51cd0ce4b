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
