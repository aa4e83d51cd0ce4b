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
///
/// The TSC's rate is measured once, in a fraction of a millisecond, when the process
/// starts; on a busy machine that measurement can be off by several hundred parts per
/// million (a 1 s wait over 0.4 ms early, half a minute a day). So the clock checks
/// itself against the OS monotonic clock about once a second and slews its rate (by at
/// most 1 %) to follow it: it never jumps and never goes backwards, and its error stays
/// within microseconds of the OS clock.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    source: Source,
    epoch_ns_at_origin: u64,
}

#[derive(Debug, Clone)]
enum Source {
    Tsc(Arc<SlewedTsc>),
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
            Source::Tsc(Arc::new(SlewedTsc::new()))
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
            Source::Tsc(tsc) => tsc.now_ns(),
            Source::Os { origin } => u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX),
        };
        self.epoch_ns_at_origin.saturating_add(elapsed)
    }
}

/// How often the TSC clock checks itself against the OS clock (in its own ns).
const SLEW_PERIOD_NS: u64 = 1_000_000_000;
/// A check whose two TSC reads around the OS clock's read are further apart than this
/// (the thread was preempted in between) is skipped: it would measure the preemption.
const SLEW_READ_WINDOW_NS: u64 = 20_000;
/// Slopes are fixed point: `SLOPE_ONE` is a rate of exactly 1.
const SLOPE_SHIFT: u32 = 32;
const SLOPE_ONE: u64 = 1 << SLOPE_SHIFT;

/// One linear piece of the clock: from `base_q` (quanta's ns) on, the clock reads
/// `base_ns + (q - base_q) * slope`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    base_q: u64,
    base_ns: u64,
    slope: u64,
}

impl Piece {
    #[inline]
    fn at(&self, q: u64) -> u64 {
        let dq = q.saturating_sub(self.base_q) as u128;
        self.base_ns + ((dq * self.slope as u128) >> SLOPE_SHIFT) as u64
    }

    /// The next piece, starting at `q` where this one reads `self.at(q)`, whose slope
    /// makes the clock meet the true time one period later: `truth_q` is a true time
    /// (ns since origin) measured at quanta time `truth_at`, and `rate` the true ns per
    /// quanta ns over the whole run so far (fixed point). Continuous at `q`; the slope
    /// stays within 1 % of the true rate, so a large error is paid back over time.
    fn next(&self, q: u64, truth_q: u64, truth_at: u64) -> Piece {
        let rate = if truth_at == 0 {
            SLOPE_ONE
        } else {
            ((truth_q as u128) << SLOPE_SHIFT).div_ceil(truth_at as u128) as u64
        };
        let here = self.at(q);
        // The true time at q, extrapolated from the measurement at truth_at.
        let truth_here =
            truth_q as i128 + (((q as i128 - truth_at as i128) * rate as i128) >> SLOPE_SHIFT);
        let error = here as i128 - truth_here; // positive: the clock is ahead
        let period = SLEW_PERIOD_NS as i128;
        let slope = rate as i128 - (error << SLOPE_SHIFT) / period;
        let (low, high) = (rate as i128 * 99 / 100, rate as i128 * 101 / 100);
        Piece {
            base_q: q,
            base_ns: here,
            slope: slope.clamp(low.max(1), high) as u64,
        }
    }
}

/// The TSC (through quanta) with its rate slewed to follow the OS monotonic clock.
/// The current [`Piece`] is read under a sequence lock: readers never block and retry
/// only while a check (once a second) writes a new piece.
#[derive(Debug)]
struct SlewedTsc {
    counter: quanta::Clock,
    origin_raw: u64,
    origin: std::time::Instant,
    /// Odd while a new piece is written.
    seq: AtomicU64,
    base_q: AtomicU64,
    base_ns: AtomicU64,
    slope: AtomicU64,
}

impl SlewedTsc {
    #[allow(clippy::disallowed_methods)] // the one place that reads the system clocks
    fn new() -> SlewedTsc {
        let counter = quanta::Clock::new();
        let origin_raw = counter.raw();
        SlewedTsc {
            counter,
            origin_raw,
            origin: std::time::Instant::now(),
            seq: AtomicU64::new(0),
            base_q: AtomicU64::new(0),
            base_ns: AtomicU64::new(0),
            slope: AtomicU64::new(SLOPE_ONE),
        }
    }

    /// Quanta's ns since the origin (the TSC at its start-up rate).
    #[inline]
    fn q(&self) -> u64 {
        self.counter
            .delta_as_nanos(self.origin_raw, self.counter.raw())
    }

    /// The current piece and the quanta time read within it.
    #[inline]
    fn read(&self) -> (Piece, u64) {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let piece = Piece {
                    base_q: self.base_q.load(Ordering::Relaxed),
                    base_ns: self.base_ns.load(Ordering::Relaxed),
                    slope: self.slope.load(Ordering::Relaxed),
                };
                let q = self.q();
                std::sync::atomic::fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == seq {
                    return (piece, q);
                }
            }
            std::hint::spin_loop();
        }
    }

    #[inline]
    fn now_ns(&self) -> u64 {
        let (piece, q) = self.read();
        if q >= piece.base_q + SLEW_PERIOD_NS {
            self.check();
        }
        piece.at(q)
    }

    /// Measures the true time and writes the piece that slews towards it, once the
    /// current piece is a period old (one writer at a time: the sequence is taken odd
    /// by compare-and-swap; the others, and a check whose reads were preempted, leave
    /// it to a later read).
    #[cold]
    fn check(&self) {
        let before = self.q();
        let truth = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let after = self.q();
        if after - before > SLEW_READ_WINDOW_NS {
            return;
        }
        let truth_at = before + (after - before) / 2;
        let seq = self.seq.load(Ordering::SeqCst);
        if seq & 1 == 1
            || (self.seq)
                .compare_exchange(seq, seq + 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return;
        }
        // Readers that see the odd sequence retry; the switch point is read after it,
        // so no reader has computed a time past it with the old piece.
        let piece = Piece {
            base_q: self.base_q.load(Ordering::SeqCst),
            base_ns: self.base_ns.load(Ordering::SeqCst),
            slope: self.slope.load(Ordering::SeqCst),
        };
        if after < piece.base_q + SLEW_PERIOD_NS {
            // Another reader's check came first.
            self.seq.store(seq + 2, Ordering::SeqCst);
            return;
        }
        let next = piece.next(self.q(), truth, truth_at);
        self.base_q.store(next.base_q, Ordering::SeqCst);
        self.base_ns.store(next.base_ns, Ordering::SeqCst);
        self.slope.store(next.slope, Ordering::SeqCst);
        self.seq.store(seq + 2, Ordering::SeqCst);
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

    /// A TSC whose start-up rate came out 500 ppm fast (or slow): checks once a
    /// second bring the clock within a microsecond of the true time, with no step and
    /// no step back.
    #[test]
    fn a_mismeasured_tsc_is_slewed_to_the_true_time() {
        for ppm in [500i64, -500, 5, 20_000] {
            // True ns at quanta time q.
            let truth = |q: u64| (q as i128 * 1_000_000 / (1_000_000 + ppm as i128)) as u64;
            let mut piece = Piece {
                base_q: 0,
                base_ns: 0,
                slope: SLOPE_ONE,
            };
            let mut last = 0u64;
            let mut errors = Vec::new();
            for period in 1..=60u64 {
                let start = period * SLEW_PERIOD_NS;
                // Reads through the period: never backwards.
                for step in 0..10 {
                    let q = start - SLEW_PERIOD_NS + step * SLEW_PERIOD_NS / 10;
                    let v = piece.at(q);
                    assert!(v >= last, "{ppm} ppm: back from {last} to {v}");
                    last = v;
                }
                let next = piece.next(start, truth(start), start);
                assert_eq!(next.at(start), piece.at(start), "continuous");
                piece = next;
                errors.push(piece.at(start) as i64 - truth(start) as i64);
            }
            let settled = errors[errors.len() - 10..]
                .iter()
                .map(|e| e.abs())
                .max()
                .unwrap();
            assert!(settled < 1_000, "{ppm} ppm: errors {errors:?}");
        }
    }

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
