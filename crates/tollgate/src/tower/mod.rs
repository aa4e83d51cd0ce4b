//! tower layers for services (feature `tower`):
//!
//! * [`RateLimitLayer`] / [`ErrorLayer`]: one rate limit per key, shared by every
//!   clone of the service, rejecting with 429 (or an error) or waiting;
//! * [`AdaptiveConcurrencyLayer`]: an adaptive concurrency limit in front of a
//!   service, fed by its responses, shedding with 503 by priority.

mod adaptive;
mod rate_limit;

pub use adaptive::{
    AdaptiveConcurrency, AdaptiveConcurrencyLayer, ByStatus, Classify, NormalPriority, Prioritize,
    ResponseClass,
};
pub use rate_limit::{
    BoxError, ErrorLayer, ErrorService, LayerLimiter, OnLimit, RateLimit, RateLimitLayer,
    RateLimited, Shared,
};
