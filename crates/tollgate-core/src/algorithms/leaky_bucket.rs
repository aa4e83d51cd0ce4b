//! Leaky bucket as a meter: the level drains continuously; a request adds `cost`.

use super::token_bucket::{bucket_units, ceil_us, clamp_i64};
use crate::algorithm::{debt_units, exact_units, schedule_algorithm, Schedule};
use crate::units::{div, sat, Rate};
use std::fmt;

use crate::params::{paced, share_count, share_rate, Params, Res, Spec};
use crate::units::time_for;

/// A leaky bucket (meter) of `capacity` draining at `rate`, continuously: fractions
/// of a unit are kept (in units of `1/interval_ticks`), never truncated away. A request
/// is admitted iff `level + cost <= capacity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakyBucket {
    rate: Rate,
    capacity: u64,
    per_unit: i128,
    per_us: i128,
    cap: i128,
}

/// One key's leaky bucket: `level` scaled units at time `last` (us). Above capacity
/// while a reservation made by `acquire` is still in the future of `last`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeakyBucketState {
    /// The level, in scaled units, at `last`.
    pub level: i64,
    /// When `level` was measured, in us.
    pub last: u64,
}

impl LeakyBucket {
    /// A bucket of `capacity` (>= 1) draining at `rate`.
    pub fn new(rate: Rate, capacity: u64) -> Result<Self, String> {
        let (per_unit, per_us, cap) = bucket_units(rate, capacity)?;
        Ok(LeakyBucket {
            rate,
            capacity,
            per_unit,
            per_us,
            cap,
        })
    }

    /// The drain rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The capacity in units of cost: the highest level the meter admits up to.
    pub fn capacity_units(&self) -> u64 {
        self.capacity
    }

    fn level_at(&self, s: &LeakyBucketState, at: u64) -> i128 {
        let level = i128::from(s.level);
        if at >= s.last {
            (level - i128::from(at - s.last) * self.per_us).max(0)
        } else {
            level + i128::from(s.last - at) * self.per_us
        }
    }

    fn give_back(&self, s: &mut LeakyBucketState, now: u64, cost: u64) {
        let level = self.level_at(s, now) - i128::from(cost) * self.per_unit;
        *s = LeakyBucketState {
            level: clamp_i64(level.max(0)),
            last: now,
        };
    }
}

impl Schedule for LeakyBucket {
    type State = LeakyBucketState;
    fn window(&self) -> u64 {
        time_for(self.capacity_units(), self.rate())
    }

    fn fresh(&self) -> LeakyBucketState {
        LeakyBucketState::default()
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn last_active(&self, s: &LeakyBucketState) -> u64 {
        s.last
    }

    fn earliest(&self, s: &LeakyBucketState, now: u64, cost: u64) -> u64 {
        let over = self.level_at(s, now) + i128::from(cost) * self.per_unit - self.cap;
        now.saturating_add(ceil_us(over, self.per_us))
    }

    /// A reservation's drain from arrival to admission is never floored at empty (see
    /// `TokenBucket`): reservations never drift.
    fn admit(&self, s: &mut LeakyBucketState, now: u64, at: u64, cost: u64) {
        let level = self.level_at(s, now) - i128::from(at - now) * self.per_us
            + i128::from(cost) * self.per_unit;
        *s = LeakyBucketState {
            level: clamp_i64(level),
            last: at,
        };
    }

    fn remaining(&self, s: &LeakyBucketState, now: u64) -> u64 {
        sat(div(
            (self.cap - self.level_at(s, now)).max(0) as u128,
            self.per_unit as u128,
        ))
    }

    fn debt_cap(&self, max_debt: u64) -> u64 {
        debt_units(max_debt, self.per_unit as u128, self.per_us as u128)
            .min(exact_units(self.per_unit as u128))
    }

    /// The level may pass the capacity by `debt`.
    fn room(&self, s: &LeakyBucketState, at: u64, debt: u64) -> u64 {
        let room = self.cap + i128::from(debt) * self.per_unit - self.level_at(s, at);
        sat(div(room.max(0) as u128, self.per_unit as u128))
    }

    fn reset_after(&self, s: &LeakyBucketState, now: u64) -> u64 {
        ceil_us(self.level_at(s, now), self.per_us)
    }
}

schedule_algorithm!(LeakyBucket, LeakyBucketState);

impl Spec for LeakyBucket {
    const PARAMS: &'static [&'static str] = &["rate", "capacity"];

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let rate = p.rate()?;
        let capacity = p.count_or("capacity", rate.count)?;
        Ok(Some(p.build(LeakyBucket::new(rate, capacity))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (rate, capacity) = (self.rate(), self.capacity_units());
        write!(f, "leaky-bucket:rate={rate},capacity={capacity}")
    }

    fn share(&self, n: u64) -> Res<Self> {
        LeakyBucket::new(
            share_rate(self.rate(), n)?,
            share_count(self.capacity_units(), n),
        )
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        Some(match paced(self.rate, w) {
            0 => 0,
            n => (self.capacity - 1).saturating_add(n),
        })
    }

    /// The level stays while the rate is the same.
    fn carry_over(&self, old: &Self, state: LeakyBucketState, _: u64) -> Option<LeakyBucketState> {
        (old.rate() == self.rate()).then_some(state)
    }
}
