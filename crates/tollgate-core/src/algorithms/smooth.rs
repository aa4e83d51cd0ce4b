//! Guava's `SmoothRateLimiter`: `SmoothBursty` and `SmoothWarmingUp`, step for step.
//!
//! Guava computes in doubles and truncates waits with `(long)` casts; this module does
//! the same operations in the same order (Rust's `as i64` truncates and saturates like
//! Java's), so decisions match Guava's to the microsecond. Golden vectors produced by
//! the real Guava (`tools/guava-golden`) are replayed in the tests.

use crate::algorithm::{check_cost, Algorithm, CheckMode};
use crate::decision::{CheckError, Decision};
use crate::units::Rate;
use std::fmt;

use crate::params::{share_rate, Params, Res, Spec};
use crate::units::fmt_duration;

/// Which of Guava's two limiters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SmoothKind {
    /// `RateLimiter.create(rate)`: stored permits start at 0 and accumulate while idle,
    /// up to `max_burst` seconds' worth.
    Bursty {
        /// How long idle time may be saved up, in us (Guava: 1 s).
        max_burst_us: u64,
    },
    /// `RateLimiter.create(rate, warmup, unit)`: starts cold (stored permits full) and
    /// serves the stored permits slowly, ramping from `cold_factor` times the stable
    /// interval down to it over `warmup`.
    WarmingUp {
        /// The warm-up period in us.
        warmup_us: u64,
        /// The cold interval as a multiple of the stable interval (Guava: 3).
        cold_factor: f64,
    },
}

/// Guava's `SmoothRateLimiter` (see [`SmoothKind`]).
///
/// A request never waits for itself: it pays the *previous* reservation's debt. Try
/// (Guava's `tryAcquire(permits, 0, ..)`) admits iff `nextFree <= now`, at any cost;
/// acquire waits `max(nextFree - now, 0)` and moves `nextFree` by the cost's price.
#[derive(Debug, Clone, PartialEq)]
pub struct Smooth {
    rate: Rate,
    kind: SmoothKind,
    stable_interval: f64,
    max_permits: f64,
    threshold: f64,
    slope: f64,
    cool_down: f64,
    limit: u64,
}

/// One key's state, as Guava keeps it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SmoothState {
    /// `storedPermits`.
    pub stored: f64,
    /// `nextFreeTicketMicros`.
    pub next_free: u64,
}

/// Bound on the unit requests counted for `remaining` (only rates above 10^6/s, whose
/// interval Guava truncates to 0 us, reach it).
const COUNT_CAP: u64 = 100_000;

impl Smooth {
    /// A Guava limiter of `kind` at `rate`.
    pub fn new(rate: Rate, kind: SmoothKind) -> Result<Self, String> {
        let permits_per_second = rate.units_per_second();
        let stable_interval = 1_000_000f64 / permits_per_second;
        let mut smooth = Smooth {
            rate,
            kind,
            stable_interval,
            max_permits: 0.0,
            threshold: 0.0,
            slope: 0.0,
            cool_down: stable_interval,
            limit: 1,
        };
        match kind {
            SmoothKind::Bursty { max_burst_us } => {
                let max_burst_seconds = max_burst_us as f64 / 1e6;
                smooth.max_permits = max_burst_seconds * permits_per_second;
            }
            SmoothKind::WarmingUp {
                warmup_us,
                cold_factor,
            } => {
                if warmup_us == 0 {
                    return Err("warmup must be longer than 0".into());
                }
                if !(cold_factor.is_finite() && cold_factor >= 1.0) {
                    return Err(format!(
                        "cold-factor must be at least 1 (got {cold_factor})"
                    ));
                }
                let warmup = warmup_us as f64;
                let cold_interval = stable_interval * cold_factor;
                smooth.threshold = 0.5 * warmup / stable_interval;
                smooth.max_permits =
                    smooth.threshold + 2.0 * warmup / (stable_interval + cold_interval);
                smooth.slope =
                    (cold_interval - stable_interval) / (smooth.max_permits - smooth.threshold);
                smooth.cool_down = warmup / smooth.max_permits;
            }
        }
        let full = SmoothState {
            stored: smooth.max_permits,
            next_free: 0,
        };
        smooth.limit = smooth.admissible(&full, 0).max(1);
        Ok(smooth)
    }

    /// The stable rate (permits per second once warm).
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Which limiter.
    pub fn kind(&self) -> SmoothKind {
        self.kind
    }

    /// Guava's `maxPermits`.
    pub fn max_permits(&self) -> f64 {
        self.max_permits
    }

    /// Guava's derived doubles, in the order a Redis script takes them:
    /// `[stableIntervalMicros, maxPermits, thresholdPermits, slope, coolDownIntervalMicros]`
    /// (`threshold` and `slope` are 0 for bursty).
    pub fn guava_params(&self) -> [f64; 5] {
        [
            self.stable_interval,
            self.max_permits,
            self.threshold,
            self.slope,
            self.cool_down,
        ]
    }

    fn resync(&self, s: &mut SmoothState, now: u64) {
        if now > s.next_free {
            let new_permits = (now - s.next_free) as f64 / self.cool_down;
            s.stored = self.max_permits.min(s.stored + new_permits);
            s.next_free = now;
        }
    }

    fn stored_permits_to_wait_time(&self, stored: f64, mut to_take: f64) -> i64 {
        match self.kind {
            SmoothKind::Bursty { .. } => 0,
            SmoothKind::WarmingUp { .. } => {
                let above = stored - self.threshold;
                let mut micros: i64 = 0;
                if above > 0.0 {
                    let take_above = above.min(to_take);
                    let length =
                        self.permits_to_time(above) + self.permits_to_time(above - take_above);
                    micros = (take_above * length / 2.0) as i64;
                    to_take -= take_above;
                }
                micros.saturating_add((self.stable_interval * to_take) as i64)
            }
        }
    }

    fn permits_to_time(&self, permits: f64) -> f64 {
        self.stable_interval + permits * self.slope
    }

    /// Guava's `reserveEarliestAvailable`: returns the moment the reservation is free.
    fn reserve(&self, s: &mut SmoothState, permits: u64, now: u64) -> u64 {
        self.resync(s, now);
        let moment = s.next_free;
        let required = permits as f64;
        let spend = required.min(s.stored);
        let fresh = required - spend;
        let wait = self
            .stored_permits_to_wait_time(s.stored, spend)
            .saturating_add((fresh * self.stable_interval) as i64);
        s.next_free = s.next_free.saturating_add(wait.max(0) as u64);
        s.stored -= spend;
        moment
    }

    /// Unit requests a try at `now` would admit in a row (capped at 100000).
    fn admissible(&self, s: &SmoothState, now: u64) -> u64 {
        let mut s = *s;
        let mut count = 0;
        while s.next_free <= now && count < COUNT_CAP {
            self.resync(&mut s, now);
            if matches!(self.kind, SmoothKind::Bursty { .. }) && s.stored >= 1.0 {
                // Stored permits cost no time in SmoothBursty: take them in one step.
                let whole = s.stored.floor();
                s.stored -= whole;
                count += (whole as u64).min(COUNT_CAP);
                continue;
            }
            self.reserve(&mut s, 1, now);
            count += 1;
        }
        count.min(COUNT_CAP)
    }

    fn reset_at(&self, s: &SmoothState, now: u64) -> u64 {
        let mut s = *s;
        let start = s.next_free.max(now);
        self.resync(&mut s, start);
        let refill = ((self.max_permits - s.stored).max(0.0) * self.cool_down).ceil();
        (start - now).saturating_add(refill as u64)
    }

    /// `us` is the wait of an admitted request, or the retry-after of a rejected one.
    fn decision(&self, s: &SmoothState, now: u64, allowed: bool, us: u64) -> Decision {
        let (remaining, reset) = (self.admissible(s, now), self.reset_at(s, now));
        if allowed {
            Decision::admitted(self.limit, remaining, reset, us)
        } else {
            Decision::rejected(self.limit, remaining, reset, Some(us))
        }
    }
}

impl Algorithm for Smooth {
    type State = SmoothState;

    /// Guava's state right after construction at `now`: no stored permits (bursty) or
    /// all of them (warming up), and the next free ticket now.
    fn init(&self, now: u64) -> SmoothState {
        SmoothState {
            stored: match self.kind {
                SmoothKind::Bursty { .. } => 0.0,
                SmoothKind::WarmingUp { .. } => self.max_permits,
            },
            next_free: now,
        }
    }

    fn check(
        &self,
        s: &mut SmoothState,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<Decision, CheckError> {
        check_cost(cost, u64::MAX)?;
        // tryAcquire(permits, timeout): canAcquire iff nextFree - timeout <= now.
        let timeout = match mode {
            CheckMode::Try => Some(0),
            CheckMode::Acquire { max_wait_us } => max_wait_us,
        };
        if let Some(t) = timeout.filter(|&t| s.next_free.saturating_sub(t) > now) {
            return Ok(self.decision(s, now, false, s.next_free - t - now));
        }
        let moment = self.reserve(s, cost, now);
        let wait = moment.saturating_sub(now);
        Ok(self.decision(s, now, true, wait))
    }

    /// Guava has no refund; tollgate's gives back debt first (moves `nextFree` back by
    /// the permits' stable price, not before now), then stores the rest, up to
    /// `maxPermits`.
    /// Guava's reserve without the wait: stored permits first, then `nextFree` moves
    /// forward, but never past `now + max_debt/rate` (nor [`crate::MAX_DEBT_US`]).
    fn charge(
        &self,
        s: &mut SmoothState,
        now: u64,
        cost: u64,
        max_debt: u64,
    ) -> Result<u64, CheckError> {
        if cost == 0 {
            return Ok(0);
        }
        let debt_us = (self.debt_cap(max_debt) as f64 * self.stable_interval)
            .min(crate::MAX_DEBT_US as f64) as u64;
        let cap = now.max(s.next_free).max(now + debt_us);
        self.reserve(s, cost, now);
        if s.next_free <= cap {
            return Ok(cost);
        }
        // The permits that would have moved nextFree past the cap are not charged.
        let over = ((s.next_free - cap) as f64 / self.stable_interval).ceil() as u64;
        s.next_free = cap;
        Ok(cost.saturating_sub(over))
    }

    fn refund(&self, s: &mut SmoothState, now: u64, cost: u64) {
        self.resync(s, now);
        let price = cost as f64 * self.stable_interval;
        let debt = s.next_free.saturating_sub(now);
        if debt > 0 {
            // `as u64` saturates, so `back` never exceeds the debt.
            let back = (price as u64).min(debt);
            s.next_free -= back;
            let left = (price - back as f64).max(0.0) / self.stable_interval;
            s.stored = self.max_permits.min(s.stored + left);
        } else {
            s.stored = self.max_permits.min(s.stored + cost as f64);
        }
    }

    /// The unit requests an idle, fully stored limiter admits at one instant
    /// (`floor(maxPermits) + 1` for bursty: the stored ones plus one paid forward).
    fn limit(&self) -> u64 {
        self.limit
    }

    fn window_us(&self) -> u64 {
        match self.kind {
            SmoothKind::Bursty { max_burst_us } => max_burst_us,
            SmoothKind::WarmingUp { warmup_us, .. } => warmup_us,
        }
    }

    /// All permits stored and no debt. A bursty key dropped then starts again with no
    /// stored permits, as a new Guava limiter does: stricter, never looser.
    fn idle(&self, s: &SmoothState, now: u64) -> bool {
        self.reset_at(s, now) == 0
    }

    fn remaining(&self, s: &SmoothState, now: u64) -> u64 {
        self.admissible(s, now)
    }

    fn reset_after(&self, s: &SmoothState, now: u64) -> u64 {
        self.reset_at(s, now)
    }

    fn last_active(&self, s: &SmoothState) -> u64 {
        s.next_free
    }
}

impl Spec for Smooth {
    const PARAMS: &'static [&'static str] = &["rate", "max-burst"];

    fn params(name: &str) -> &'static [&'static str] {
        match name {
            "smooth-warmup" => &["rate", "warmup", "cold-factor"],
            _ => Self::PARAMS,
        }
    }

    fn from_spec(name: &str, p: &Params) -> Res<Option<Self>> {
        let rate = p.rate()?;
        if name == "smooth-bursty" {
            let max_burst_us = match p.value("max-burst")? {
                Some(v) => p.duration_of("max-burst", v)?,
                None => 1_000_000,
            };
            let kind = SmoothKind::Bursty { max_burst_us };
            return Ok(Some(p.build(Smooth::new(rate, kind))?));
        }
        let warmup_us = p.duration("warmup", "10s")?;
        let cold_factor = match p.value("cold-factor")? {
            Some(v) => (v.parse::<f64>())
                .map_err(|_| p.bad("cold-factor", v, "expected a number such as 3 or 2.5"))?,
            None => 3.0,
        };
        let kind = SmoothKind::WarmingUp {
            warmup_us,
            cold_factor,
        };
        Ok(Some(p.build(Smooth::new(rate, kind))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind() {
            SmoothKind::Bursty { max_burst_us } => {
                write!(f, "smooth-bursty:rate={}", self.rate())?;
                if max_burst_us != 1_000_000 {
                    write!(f, ",max-burst={}", fmt_duration(max_burst_us))?;
                }
            }
            SmoothKind::WarmingUp {
                warmup_us,
                cold_factor,
            } => {
                let warmup = fmt_duration(warmup_us);
                write!(f, "smooth-warmup:rate={},warmup={warmup}", self.rate())?;
                if cold_factor != 3.0 {
                    write!(f, ",cold-factor={cold_factor}")?;
                }
            }
        }
        Ok(())
    }

    fn share(&self, n: u64) -> Res<Self> {
        Smooth::new(share_rate(self.rate(), n)?, self.kind())
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        if w == 0 {
            return Some(0);
        }
        // A permit moves `next_free` by its price truncated to whole us, so spaced
        // admissions are at least the truncated interval apart; above a million a
        // second that is 0 us and nothing bounds them (Guava's arithmetic).
        let spacing = self.stable_interval as u64;
        if spacing == 0 {
            return None;
        }
        let paced = w.div_ceil(spacing);
        Some(match self.kind {
            // Stored permits are free, and the first after them pays forward.
            SmoothKind::Bursty { .. } => (self.max_permits.ceil() as u64).saturating_add(paced),
            // Stored permits cost at least the stable interval each.
            SmoothKind::WarmingUp { .. } => paced,
        })
    }

    /// As Guava's `setRate`: stored permits scaled to the new maximum (bursty) or,
    /// from an empty maximum, full (warming up); the next free ticket kept.
    fn carry_over(&self, old: &Self, mut s: SmoothState, now: u64) -> Option<SmoothState> {
        old.resync(&mut s, now);
        s.stored = if old.max_permits == 0.0 {
            match self.kind {
                SmoothKind::Bursty { .. } => 0.0,
                SmoothKind::WarmingUp { .. } => self.max_permits,
            }
        } else {
            s.stored * self.max_permits / old.max_permits
        };
        Some(s)
    }
}
