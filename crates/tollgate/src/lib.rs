//! # tollgate
//!
//! Rate limiting for Rust services: every classic algorithm with exact, documented
//! semantics (see [`tollgate_core`], re-exported here), as
//!
//! * [`Limiter`]: one shared limit (GCRA lock-free on one `AtomicU64`);
//! * [`KeyedLimiter`]: one limit per key, for millions of keys in bounded memory
//!   (GCRA on plain keys: no lock, one compare-and-swap);
//! * [`ConcurrencyLimiter`] and [`KeyedConcurrencyLimiter`]: permits held while work
//!   runs, released on drop;
//! * [`adaptive::AdaptiveLimiter`]: a concurrency limit that finds the service's
//!   capacity from the latency its permits report, with priorities (low-value work
//!   shed first) and fair shares among callers;
//! * [`Paced`]: any `Stream` paced to a policy, with backpressure;
//! * `tower::RateLimitLayer` (feature `tower`): per-key limits for http services,
//!   429 with `Retry-After` and `RateLimit` headers, or wait;
//! * `redis::RedisLimiter` (feature `redis`): the same decisions kept in Redis or
//!   Redis Cluster, so that many instances share one limit;
//! * [`RateLimiter`]: the one async interface over every store (memory, Redis), and
//!   [`AnyLimiter`], a limiter whose store is chosen at run time;
//!
//! each for a single [`Policy`] or an all-or-nothing [`RuleSet`], with try
//! (`check`), wait (`acquire().await`, `acquire_blocking`), `peek`, `refund`, `reset`
//! and run-time reconfiguration.
//!
//! ```
//! use tollgate::{Clock, ManualClock, Op, Policy};
//!
//! let clock = ManualClock::new();
//! let policy: Policy = "token-bucket:rate=5/s,capacity=2".parse()?;
//! let mut state = policy.init(clock.now_us());
//! assert!(policy.check(&mut state, clock.now_us(), 2, Op::Try)?.allowed);
//! let d = policy.check(&mut state, clock.now_us(), 1, Op::Try)?;
//! assert!(!d.allowed);
//! assert_eq!(d.retry_after(), Some(std::time::Duration::from_millis(200)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
// Unsafe code lives in the keyed fast path only (tat_table.rs, the flat key table; reader_gate.rs,
// its reader gate; keyed.rs, the shard that pairs them) and every block says why it is
// sound.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod adaptive;
/// The guide: recipes (per-IP limits in axum, a rule set per user, the same through
/// Redis, pacing a worker, burst or pacing) and the reference of every limiter — the
/// text of `docs/library.md`, whose examples run as this module's doctests.
#[cfg(all(feature = "axum", feature = "redis"))]
#[doc = include_str!("../../../docs/library.md")]
pub mod guide {}
mod clock;
mod concurrency;
mod config;
mod error;
pub mod headers;
mod keyed;
mod limiter;
mod rate_limiter;
mod reader_gate;
#[cfg(feature = "redis")]
pub mod redis;
mod stream;
mod tat_table;
#[cfg(feature = "tower")]
pub mod tower;
mod wait;

pub use clock::TokioClock;
pub use concurrency::{
    ConcurrencyError, ConcurrencyLimiter, ConcurrencyPermit, KeyedConcurrencyLimiter,
    KeyedConcurrencyPermit,
};
pub use error::Error;
pub use keyed::{KeyedLimiter, KeyedOptions, KeyedStats, OnFull};
pub use limiter::Limiter;
pub use rate_limiter::{AnyLimiter, RateLimiter};
pub use stream::{Paced, TooCostly};
pub use tollgate_core::*;
pub use wait::RefundOnDrop;
