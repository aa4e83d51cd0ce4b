//! Time sources. Algorithms never read the system time themselves: they are handed
//! `now` in microseconds by whoever owns a [`Clock`].
//!
//! This is the only module allowed to call `Instant::now()` / `SystemTime::now()`
//! (enforced by `.clippy.toml`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A monotonic time source, in nanoseconds since the clock's origin.
///
/// Implementations must never go backwards: a wall-clock jump must neither release
/// nor block traffic.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now_ns(&self) -> u64;

    /// Microseconds since this clock's origin: the unit every algorithm works in.
    #[inline]
    fn now_us(&self) -> u64 {
        self.now_ns() / 1_000
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// The default clock: monotonic, anchored at the Unix epoch.
///
/// It reads the wall clock once, when it is created, and from then on only advances
/// with a monotonic counter: the CPU's invariant TSC through the `quanta` crate (as
/// governor's default clock), or, with `TOLLGATE_CLOCK=os` in the environment when the
/// clock is created, the OS monotonic clock (`std::time::Instant`; slower to read, but
/// what tools such as libfaketime can control). So clock-aligned windows
/// (`fixed-window` with `align=clock`, `sliding-window`) start on wall-clock multiples
/// of their length — a `1m` window starts on the minute, as Envoy's ratelimit does —
/// while a later wall-clock jump changes nothing.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    source: Source,
    epoch_ns_at_origin: u64,
}

#[derive(Debug, Clone)]
enum Source {
    Tsc { counter: quanta::Clock, origin: u64 },
    Os { origin: std::time::Instant },
}

impl MonotonicClock {
    /// A clock anchored at the current wall-clock time.
    #[allow(clippy::disallowed_methods)] // the one place that reads the system clocks
    pub fn new() -> Self {
        let source = if std::env::var_os("TOLLGATE_CLOCK").is_some_and(|v| v == "os") {
            Source::Os {
                origin: std::time::Instant::now(),
            }
        } else {
            let counter = quanta::Clock::new();
            let origin = counter.raw();
            Source::Tsc { counter, origin }
        };
        let epoch_ns_at_origin = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        MonotonicClock {
            source,
            epoch_ns_at_origin,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        let elapsed = match &self.source {
            Source::Tsc { counter, origin } => counter.delta_as_nanos(*origin, counter.raw()),
            Source::Os { origin } => u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX),
        };
        self.epoch_ns_at_origin.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to: for tests, replay and simulation.
///
/// ```
/// use tollgate_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(clock.now_us(), 5_000);
/// clock.set_us(1_000_000);
/// assert_eq!(clock.now_ns(), 1_000_000_000);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock {
    ns: AtomicU64,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (saturating at `u64::MAX` ns).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |ns| {
                Some(ns.saturating_add(by))
            });
    }

    /// Sets the clock to `us` microseconds. Setting it backwards is allowed (tests of
    /// misbehaving clocks); the algorithms treat an earlier `now` as "no time passed".
    pub fn set_us(&self, us: u64) {
        self.ns.store(us.saturating_mul(1_000), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_is_anchored_at_the_epoch_and_never_goes_back() {
        let c = MonotonicClock::new();
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(b >= a);
        // Later than 2020-01-01 in microseconds.
        assert!(c.now_us() > 1_577_836_800_000_000);
    }

    #[test]
    fn manual_clock_saturates() {
        let c = ManualClock::new();
        c.set_us(u64::MAX);
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now_ns(), u64::MAX);
    }
}
