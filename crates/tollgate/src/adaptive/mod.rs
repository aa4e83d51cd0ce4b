//! Adaptive concurrency limits: a limit that finds the service's capacity from the
//! latency and failures its permits report, priorities that shed low-value work
//! first, and fair shares among callers. The semantics live in
//! [`tollgate_core::adaptive`] (re-exported here); this module adds the lock, the
//! wakers and the timers.

mod limiter;
mod permit;
mod state;

pub use limiter::AdaptiveLimiter;
pub use permit::AdaptivePermit;
pub use tollgate_core::adaptive::*;
