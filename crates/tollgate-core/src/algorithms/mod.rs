//! The algorithms, one per file. Each is a set of validated parameters implementing
//! [`crate::Algorithm`] over its own small state type.

mod concurrency;
mod fixed_window;
mod gcra;
mod leaky_bucket;
mod limit_req;
mod shaper;
mod sliding_log;
mod sliding_window;
mod smooth;
mod token_bucket;

pub use concurrency::{Concurrency, ConcurrencyState};
pub use fixed_window::{Align, Debt, FixedWindow, FixedWindowState};
pub use gcra::{Gcra, GcraParams, GcraState, MAX_GCRA_SCALE};
pub use leaky_bucket::{LeakyBucket, LeakyBucketState};
pub use limit_req::{Delay, LimitReq, LimitReqState};
pub use shaper::{Shaper, ShaperState};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use sliding_window::{
    SlidingWindow, SlidingWindowState, SlidingWindowWeighted, WeightedState, MAX_BUCKETS,
};
pub use smooth::{Smooth, SmoothKind, SmoothState};
pub use token_bucket::{TokenBucket, TokenBucketState};

/// The validation every window-counting algorithm shares.
pub(crate) fn check_limit_window(limit: u64, window_us: u64) -> Result<(), String> {
    if limit == 0 {
        return Err("limit must be at least 1".into());
    }
    if window_us == 0 {
        return Err("window must be at least 1us".into());
    }
    Ok(())
}
