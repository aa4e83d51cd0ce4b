//! GCRA, the generic cell rate algorithm, in its "virtual scheduling" form.

use crate::algorithm::{
    check_cost, debt_units, exact_units, fits, schedule_algorithm, Algorithm, CheckMode, Schedule,
};
use crate::decision::{CheckError, Decision};
use crate::units::{div, div_ceil, sat, Divisor, Rate};
use std::fmt;

use crate::params::{paced, share_count, share_rate, Params, Res, Spec};

/// The largest [`Rate::scale`] GCRA accepts: its state is one u64 of scaled time, and
/// an epoch-anchored clock (2^51 us in 2041) times 4096 stays below 2^64 until 2112.
pub const MAX_GCRA_SCALE: u64 = 4096;

/// GCRA with emission interval `T = period/rate` and burst tolerance `tau = burst*T`.
///
/// `new = max(tat, t) + c*T`; admitted iff `t >= new - tau`, then `tat = new`. An idle
/// key admits exactly `burst` unit requests at one instant (the `redis_rate` variant).
///
/// ```
/// use tollgate_core::{Algorithm, CheckMode, algorithms::Gcra, Rate};
/// let gcra = Gcra::new(Rate::parse("10/s").unwrap(), 5).unwrap();
/// let mut s = gcra.init(0);
/// let admitted = (0..6).filter(|_| gcra.check(&mut s, 0, 1, CheckMode::Try).unwrap().allowed).count();
/// assert_eq!(admitted, 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcra {
    rate: Rate,
    burst: u64,
    scale: u128,
    interval: u128,
    per_interval: Divisor,
    tau: u128,
}

/// One key's GCRA state: the theoretical arrival time, in scaled ticks
/// (`1/rate.scale()` us). Zero means idle since the clock's origin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcraState {
    /// Theoretical arrival time in scaled ticks.
    pub tat: u64,
}

impl Gcra {
    /// GCRA admitting `rate` with bursts of up to `burst` (>= 1) at one instant.
    pub fn new(rate: Rate, burst: u64) -> Result<Self, String> {
        if burst == 0 {
            return Err("burst must be at least 1".into());
        }
        if rate.scale() > MAX_GCRA_SCALE {
            return Err(format!(
                "rate {rate} has an emission interval of {:.4}us, which GCRA can only keep exactly \
                 in 1/{}us ticks (at most 1/{MAX_GCRA_SCALE}us); choose a rate whose interval is \
                 a whole number of microseconds (e.g. {}/s), or token-bucket, which has no such bound",
                rate.period_us as f64 / rate.count as f64,
                rate.scale(),
                (rate.units_per_second().round() as u64).max(1)
            ));
        }
        let tau = u128::from(burst) * u128::from(rate.interval_ticks());
        if tau > 1 << 62 {
            return Err(format!(
                "burst {burst} at rate {rate} spans too long a time"
            ));
        }
        Ok(Gcra {
            rate,
            burst,
            scale: rate.scale().into(),
            interval: rate.interval_ticks().into(),
            per_interval: Divisor::new(rate.interval_ticks()),
            tau,
        })
    }

    /// The sustained rate: one unit per `period/count`.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst: unit requests an idle key admits at one instant.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    #[inline]
    fn ticks(&self, us: u64) -> u128 {
        u128::from(us) * self.scale
    }

    /// One decision on a bare TAT word: the new word (unchanged on a reject) and the
    /// decision. The same arithmetic as [`Algorithm::check`]; for a whole-microsecond
    /// interval it runs [`GcraParams::decide`], the lock-free limiters' hot path.
    #[inline]
    pub fn decide(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<(u64, Decision), CheckError> {
        match self.params() {
            Some(p) => p.decide(tat, now, cost, mode),
            None => {
                let mut s = GcraState { tat };
                let d = self.check(&mut s, now, cost, mode)?;
                Ok((s.tat, d))
            }
        }
    }

    /// The parameters as plain words, for a whole-microsecond interval (`None`
    /// otherwise): what a lock-free limiter copies next to its state.
    pub fn params(&self) -> Option<GcraParams> {
        (self.scale == 1).then(|| GcraParams {
            interval: self.interval as u64,
            tau: self.tau as u64,
            burst: self.burst,
            inverse: self.per_interval.inverse().to_bits(),
        })
    }

    fn give_back(&self, s: &mut GcraState, now: u64, cost: u64) {
        let now = self.ticks(now);
        let tat = u128::from(s.tat);
        if tat > now {
            let back = u128::from(cost) * self.interval;
            s.tat = sat(tat.saturating_sub(back).max(now));
        }
    }
}

impl Schedule for Gcra {
    type State = GcraState;
    fn window(&self) -> u64 {
        crate::units::time_for(self.burst(), self.rate())
    }

    fn fresh(&self) -> GcraState {
        GcraState::default()
    }

    /// The TAT, which is at least the last admission's arrival.
    fn last_active(&self, s: &GcraState) -> u64 {
        sat(div(u128::from(s.tat), self.scale))
    }

    #[inline]
    fn capacity(&self) -> u64 {
        self.burst
    }

    #[inline]
    fn earliest(&self, s: &GcraState, now: u64, cost: u64) -> u64 {
        let new = u128::from(s.tat).max(self.ticks(now)) + u128::from(cost) * self.interval;
        sat(div_ceil(new.saturating_sub(self.tau), self.scale))
    }

    /// `tat = max(tat, t) + c*T` with `t` the arrival, not the (rounded-up) admission,
    /// so reservations never drift.
    #[inline]
    fn admit(&self, s: &mut GcraState, now: u64, _at: u64, cost: u64) {
        let new = u128::from(s.tat).max(self.ticks(now)) + u128::from(cost) * self.interval;
        s.tat = sat(new);
    }

    #[inline]
    fn remaining(&self, s: &GcraState, now: u64) -> u64 {
        let now = self.ticks(now);
        let base = u128::from(s.tat).max(now);
        sat(self.per_interval.div((now + self.tau).saturating_sub(base)))
    }

    fn debt_cap(&self, max_debt: u64) -> u64 {
        debt_units(max_debt, self.interval, self.scale).min(exact_units(self.interval))
    }

    /// Up to `debt` units past the burst: the TAT may reach `now + tau + debt*T`.
    fn room(&self, s: &GcraState, now: u64, debt: u64) -> u64 {
        let now = self.ticks(now);
        let cap = now + self.tau + u128::from(debt) * self.interval;
        let base = u128::from(s.tat).max(now);
        sat(cap.saturating_sub(base) / self.interval)
    }

    #[inline]
    fn reset_after(&self, s: &GcraState, now: u64) -> u64 {
        sat(div_ceil(
            u128::from(s.tat).saturating_sub(self.ticks(now)),
            self.scale,
        ))
    }
}

schedule_algorithm!(Gcra, GcraState);

/// GCRA's parameters for a whole-microsecond interval, as four plain words (so that a
/// lock-free limiter can keep them in atomics beside its state and change them at run
/// time). Built by [`Gcra::params`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraParams {
    /// T, in us.
    pub interval: u64,
    /// tau = burst * T, in us.
    pub tau: u64,
    /// The burst: unit requests an idle key admits at one instant.
    pub burst: u64,
    /// `1/T` as f64 bits (fast exact division).
    pub inverse: u64,
}

impl GcraParams {
    /// A try of one unit on a bare TAT word, the admit bit only: the new word if
    /// admitted, `None` on a reject. The same decision as [`GcraParams::decide`] in
    /// [`CheckMode::Try`] with cost 1 (which always fits: the burst is at least 1), without
    /// the division that `remaining` costs.
    #[inline(always)]
    pub fn admit_one(&self, tat: u64, now: u64) -> Option<u64> {
        let now = now.min(crate::MAX_TIME_US);
        let new = tat.max(now) + self.interval;
        (new.saturating_sub(self.tau) <= now).then_some(new)
    }

    /// A bare TAT word as it stands at `now`, counting nothing (a peek of cost 0, see
    /// `Policy::status`).
    pub fn status(&self, tat: u64, now: u64) -> Decision {
        let now = now.min(crate::MAX_TIME_US);
        let base = tat.max(now);
        let per = Divisor::with_inverse(self.interval, f64::from_bits(self.inverse));
        let remaining = per.div_u64((now + self.tau).saturating_sub(base));
        Decision::admitted(self.burst, remaining, base - now, 0)
    }

    /// A charge on a bare TAT word (see [`Algorithm::charge`]), `debt` being the
    /// policy's [`crate::Policy::debt_cap`]: the new word and the decision
    /// [`crate::Policy::charge`] gives.
    pub fn charge(&self, tat: u64, now: u64, cost: u64, debt: u64) -> (u64, Decision) {
        let now = now.min(crate::MAX_TIME_US);
        let base = tat.max(now);
        // debt * interval <= MAX_DEBT_US (see debt_cap), so nothing overflows.
        let cap = now + self.tau + debt * self.interval;
        let charged = cost.min(cap.saturating_sub(base) / self.interval);
        let new = if charged > 0 {
            base + charged * self.interval
        } else {
            tat
        };
        let mut d = self.status(new, now);
        d.capped = charged < cost;
        if d.remaining == 0 {
            let after = new.max(now) + self.interval;
            d.retry_after_us = Some(after.saturating_sub(self.tau).saturating_sub(now));
        }
        (new, d)
    }

    /// One decision on a bare TAT word (see [`Gcra::decide`]).
    #[inline(always)]
    pub fn decide(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<(u64, Decision), CheckError> {
        check_cost(cost, self.burst)?;
        // interval, tau <= 2^62 and now <= 2^62, so none of these sums overflow.
        let now = now.min(crate::MAX_TIME_US);
        let base = tat.max(now);
        let new = base + cost * self.interval;
        let wait = new.saturating_sub(self.tau).saturating_sub(now);
        let per = Divisor::with_inverse(self.interval, f64::from_bits(self.inverse));
        if fits(wait, mode) {
            let remaining = per.div_u64((now + self.tau).saturating_sub(new));
            Ok((
                new,
                Decision::admitted(self.burst, remaining, new - now, wait),
            ))
        } else {
            let remaining = per.div_u64((now + self.tau).saturating_sub(base));
            Ok((
                tat,
                Decision::rejected(self.burst, remaining, base - now, Some(wait)),
            ))
        }
    }
}

impl Spec for Gcra {
    const PARAMS: &'static [&'static str] = &["rate", "burst"];

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let rate = p.rate()?;
        let burst = p.count_or("burst", rate.count)?;
        Ok(Some(p.build(Gcra::new(rate, burst))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "gcra:rate={},burst={}", self.rate(), self.burst())
    }

    fn share(&self, n: u64) -> Res<Self> {
        Gcra::new(share_rate(self.rate(), n)?, share_count(self.burst(), n))
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        Some(match paced(self.rate, w) {
            0 => 0,
            n => (self.burst - 1).saturating_add(n),
        })
    }

    /// The TAT, converted between tick units: a key keeps its debt.
    fn carry_over(&self, old: &Self, state: GcraState, _: u64) -> Option<GcraState> {
        let (os, ns) = (
            u128::from(old.rate().scale()),
            u128::from(self.rate().scale()),
        );
        let tat = u128::from(state.tat).div_ceil(os) * ns;
        Some(GcraState {
            tat: u64::try_from(tat).unwrap_or(u64::MAX),
        })
    }
}
