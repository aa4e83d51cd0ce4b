//! # tollgate
//!
//! Rate limiting for Rust services: every classic algorithm with exact, documented
//! semantics, as
//!
//! * [`Limiter`]: one shared limit (GCRA lock-free on one `AtomicU64`);
//! * [`KeyedLimiter`]: one limit per key, for millions of keys in bounded memory
//!   (GCRA on plain keys: no lock, one compare-and-swap);
//! * [`RateLimiter`]: the one interface over every store (memory, Redis, Redis
//!   Cluster, leased Redis), and [`AnyLimiter`], a limiter whose store is chosen at
//!   run time;
//!
//! each for a single [`Policy`] (a spec such as `gcra:rate=10/s,burst=5`, or a typed
//! constructor such as `Policy::gcra(Rate::per_second(10)?, 5)?`) or an all-or-nothing
//! [`RuleSet`], answering with a [`Decision`] (`check`, `acquire`, `charge`, `peek`,
//! `refund`, `reset`, run-time reconfiguration) and failing with the one [`Error`].
//!
//! The root holds the types a user starts with; the rest is in modules:
//! [`concurrency`] (permits held while work runs), [`adaptive`] (a concurrency limit
//! that finds the service's capacity from its latency, with priorities and fair
//! shares), [`stream`] (a `Stream` paced to a policy), `tower` (feature `tower`: a
//! layer for http services), `redis` (feature `redis`: the same decisions kept in
//! Redis), [`headers`] (the rate-limit response headers), [`clock`], [`keyed`]
//! (bounds and counters of the keyed store), [`policy`] (the algorithms and the spec
//! language's units), [`error`], [`wait`]; `guide` (features `axum` and `redis`:
//! recipes, each a doctest).
//!
//! ```
//! use tollgate::{KeyedLimiter, Policy, Rate};
//!
//! let per_user: KeyedLimiter<String> = KeyedLimiter::new(Policy::gcra(Rate::per_second(5)?, 2)?);
//! assert!(per_user.check("ada", 1)?.allowed);
//! assert!(per_user.check("ada", 1)?.allowed);
//! let d = per_user.check("ada", 1)?;
//! assert!(!d.allowed);
//! assert!(d.retry_after() <= Some(std::time::Duration::from_millis(200))); // the next one
//! d.into_result().unwrap_err(); // or the rejection as an error
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]
// Unsafe code lives in the keyed fast path only (tat_table.rs, the flat key table; reader_gate.rs,
// its reader gate; keyed.rs, the shard that pairs them) and every block says why it is
// sound.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod adaptive;
pub mod clock;
pub mod concurrency;
pub mod error;
mod fast_gcra;
/// The guide: recipes (a gRPC service, per-IP limits in axum, a rule set per user,
/// the same through Redis, pacing a worker, burst or pacing) and the reference of every limiter — the
/// text of `docs/library.md`, whose examples run as this module's doctests.
#[cfg(all(feature = "axum", feature = "redis", feature = "tonic"))]
#[doc = include_str!("../../../docs/library.md")]
pub mod guide {}
pub mod headers;
pub mod keyed;
mod limiter;
pub mod policy;
pub mod quota;
mod rate_limiter;
mod reader_gate;
#[cfg(feature = "redis")]
pub mod redis;
pub mod stream;
mod tat_table;
#[cfg(feature = "tower")]
pub mod tower;
pub mod wait;

pub use error::Error;
pub use keyed::KeyedLimiter;
pub use limiter::Limiter;
pub use rate_limiter::{AnyLimiter, RateLimiter};
pub use tollgate_core::{Decision, Op, Policy, Rate, RuleDecision, RuleSet};
