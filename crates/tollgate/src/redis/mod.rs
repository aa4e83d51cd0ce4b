//! The Redis store (feature `redis`): the same algorithms and the same decisions as the
//! memory store, kept in Redis or Redis Cluster so that many instances share one limit.
//!
//! Each decision is atomic in Redis: the decision code (`crates/tollgate/lua/*.lua`)
//! is loaded once per node as a Redis Functions library (Redis >= 7; `EVALSHA`
//! otherwise, see [`RedisCalls`]); it reads a key's states, decides against every
//! policy of its rule set, and writes them back with a time to live. Concurrent checks
//! are batched into one call per node (per Cluster slot), each still decided alone and
//! in order. Time comes from Redis `TIME`, so clients with skewed clocks agree. The
//! code returns the states it started from and the Rust core derives the full
//! [`Decision`](tollgate_core::Decision) from them, so the numbers a client sees
//! (remaining, reset, retry-after) come from the very code the memory store runs.
//! [`RedisLimiter`] implements [`crate::RateLimiter`], the interface every store shares
//! (import the trait to call its methods).
//!
//! The `concurrency` algorithm has a design of its own, [`RedisConcurrencyLimiter`]:
//! permits are leases that their holder renews and that expire when it dies.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tollgate::Error> {
//! use tollgate::redis::{RedisLimiter, RedisStore};
//! use tollgate::{RateLimiter, RuleSet};
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
//! let rules = RuleSet::parse(&["gcra:rate=10/s,burst=5", "fixed-window:limit=1000,window=1d"])?;
//! let limiter = RedisLimiter::new(store, "api", rules)?;
//! let d = limiter.check("user-42", 1).await?;
//! println!("allowed: {}, remaining: {}", d.allowed, d.remaining);
//! # Ok(()) }
//! ```

mod algorithms;
mod batch;
mod call;
mod concurrency;
mod connect;
mod connection;
mod counter;
mod credentials;
#[cfg(test)]
mod docs_tables;
mod health;
mod lease;
mod limiter;
mod module;
mod options;
mod per_node;
pub(crate) mod quota;
mod redis_time;
mod script;
mod sentinel;
mod store;
mod topology;

pub use concurrency::{PermitError, RedisConcurrencyLimiter, RedisConcurrencyOptions, RedisPermit};
pub use connect::redacted;
pub use health::{OnError, RedisStats};
pub use lease::{LeaseOptions, LeaseStats, LeasedLimiter};
pub use limiter::{RedisLimiter, RedisLimiterOptions};
pub use options::{
    CallKind, CallStats, CallTimes, Password, RedisCalls, RedisOptions, RedisTls, BATCH_BOUNDS,
    CALL_BOUNDS_US,
};
pub use store::RedisStore;

use std::time::Duration;

/// The decision code as a Redis Functions library, as `FUNCTION LOAD` takes it (a
/// store loads it by itself when Redis lacks it; this is for loading it ahead).
pub fn function_library() -> &'static str {
    &script::library().source
}

/// A Redis reply that is an error, or a connection that failed: the store is
/// unavailable (transient), as a failure policy sees it.
impl From<redis::RedisError> for crate::Error {
    fn from(e: redis::RedisError) -> Self {
        crate::Error::Unavailable(format!("redis: {e}"))
    }
}

/// Redis gave no answer within `limit`: unavailable (transient).
pub(crate) fn timeout(limit: Duration) -> crate::Error {
    crate::Error::Unavailable(format!("redis: no answer within {limit:?}"))
}
