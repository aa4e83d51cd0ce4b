//! The same limiting code on every store: memory, Redis, and Redis with leased quotas.
//!
//! ```text
//! cargo run -p tollgate --all-features --example stores                 # memory only
//! cargo run -p tollgate --all-features --example stores -- redis://127.0.0.1:6379/
//! ```
//!
//! With a Redis URL it runs the same burst on the Redis store (Functions, batching)
//! and on the leased store, and prints what each admitted. `scripts/test.sh` runs it
//! against the Redis it starts.

use tollgate::redis::{LeaseOptions, LeasedLimiter, RedisStore};
use tollgate::{AnyLimiter, RateLimiter, RuleSet};

/// The application's code: it knows only the interface.
async fn burst(limiter: &impl RateLimiter, user: &str) -> Result<u32, tollgate::Error> {
    let mut admitted = 0;
    for _ in 0..10 {
        if limiter.check(user, 1).await?.allowed {
            admitted += 1;
        }
    }
    Ok(admitted)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rules = RuleSet::parse(&["gcra:rate=5/m,burst=4", "fixed-window:limit=100,window=1h"])?;
    let user = format!("user-{}", std::process::id());
    let mut stores = vec![("memory", AnyLimiter::memory(rules.clone()))];
    if let Some(url) = std::env::args().nth(1) {
        let store = RedisStore::connect(&url).await?;
        stores.push((
            "redis",
            AnyLimiter::redis(store.clone(), "example", rules.clone())?,
        ));
        let leased = LeasedLimiter::new(store, "example-leased", rules, LeaseOptions::default())?;
        stores.push(("redis, leased", AnyLimiter::Leased(leased)));
    }
    for (name, limiter) in &stores {
        let admitted = burst(limiter, &user).await?;
        println!("{name}: {admitted} of 10 admitted (burst 4)");
        assert_eq!(admitted, 4, "every store decides alike");
    }
    Ok(())
}
