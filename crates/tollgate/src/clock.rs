//! Clocks: every limiter decides with the time of a [`Clock`] —
//! [`MonotonicClock`] (the default), [`ManualClock`] (tests move it by hand) and
//! [`TokioClock`], which follows tokio's time, so that tests under
//! `tokio::time::pause()` move the limiter's clock and its sleeps together.

pub use tollgate_core::{Clock, ManualClock, MonotonicClock};

/// Monotonic time from `tokio::time::Instant`, anchored at the Unix epoch like
/// [`tollgate_core::MonotonicClock`]. Under `tokio::time::pause()` it advances only
/// when tokio's time does (auto-advance included), which makes waiting deterministic.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    origin_ns: u64,
}

impl TokioClock {
    /// A clock starting at the current wall-clock time.
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
            origin_ns: tollgate_core::MonotonicClock::new().now_ns(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ns(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.origin_ns.saturating_add(elapsed)
    }
}
