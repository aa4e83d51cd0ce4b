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
//! [`RedisLimiter`] implements [`crate::RateLimiter`], the interface every store shares.
//!
//! The `concurrency` algorithm has a design of its own, [`RedisConcurrencyLimiter`]:
//! permits are leases that their holder renews and that expire when it dies.
//!
//! ```no_run
//! # async fn demo() -> Result<(), tollgate::redis::StoreError> {
//! use tollgate::redis::{RedisLimiter, RedisStore};
//! use tollgate::RuleSet;
//!
//! let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
//! let rules = RuleSet::parse(&["gcra:rate=10/s,burst=5", "fixed-window:limit=1000,window=1d"])
//!     .map_err(tollgate::redis::StoreError::Config)?;
//! let limiter = RedisLimiter::new(store, "api", rules)?;
//! let d = limiter.check("user-42", 1).await?;
//! println!("allowed: {}, remaining: {}", d.allowed, d.remaining);
//! # Ok(()) }
//! ```

mod batch;
mod call;
mod caller;
mod concurrency;
mod health;
mod lease;
mod limiter;
mod options;
mod script;
mod store;

pub use concurrency::{PermitError, RedisConcurrencyLimiter, RedisConcurrencyOptions, RedisPermit};
pub use health::{OnError, RedisStats};
pub use lease::{LeaseOptions, LeaseStats, LeasedLimiter};
pub use limiter::{RedisLimiter, RedisLimiterOptions};
pub use options::{CallStats, RedisCalls, RedisOptions};
pub use store::RedisStore;

use std::time::Duration;

/// The decision code as a Redis Functions library, as `FUNCTION LOAD` takes it (a
/// store loads it by itself when Redis lacks it; this is for loading it ahead).
pub fn function_library() -> &'static str {
    &script::library().source
}

/// Why a Redis-backed decision failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The request itself is invalid (cost 0, or more than the policy can ever admit).
    #[error(transparent)]
    Check(#[from] tollgate_core::CheckError),
    /// The policy or cost cannot be kept exactly by the Redis scripts.
    #[error("not supported by the Redis store: {0}")]
    Unsupported(String),
    /// A bad URL, prefix or limiter name.
    #[error("redis store configuration: {0}")]
    Config(String),
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer in time.
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
    /// Redis answered something the script never sends.
    #[error("redis: unexpected reply: {0}")]
    Protocol(String),
}

impl From<StoreError> for crate::LimitError {
    fn from(e: StoreError) -> Self {
        use crate::LimitError;
        match e {
            StoreError::Check(c) => LimitError::Check(c),
            StoreError::Unsupported(s) => LimitError::Unsupported(s),
            StoreError::Config(s) => LimitError::Config(s),
            e @ (StoreError::Redis(_) | StoreError::Timeout(_)) => {
                LimitError::Unavailable(e.to_string())
            }
            StoreError::Protocol(s) => LimitError::Store(s),
        }
    }
}

impl StoreError {
    /// Whether the failure is Redis's (unreachable, slow, failing): the kind a
    /// failure policy (fail open, fail closed, local limiter) applies to. Errors in
    /// the request or the configuration are not transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Redis(_) | StoreError::Timeout(_))
    }
}
