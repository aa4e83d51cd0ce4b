//! Token bucket: starts full, refills continuously, a request takes `cost` tokens.

use crate::algorithm::{debt_units, exact_units, schedule_algorithm, Schedule};
use crate::units::{div, div_ceil, sat, Rate};
use std::fmt;

use crate::params::{paced, share_count, share_rate, Params, Res, Spec};
use crate::units::time_for;

/// A token bucket of `capacity` tokens refilled at `rate`, continuously: fractions of
/// a token are kept (in units of `1/interval_ticks` token), never truncated away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    rate: Rate,
    capacity: u64,
    /// Scaled units per token.
    per_token: i128,
    /// Scaled units refilled per microsecond.
    per_us: i128,
    cap: i128,
}

/// One key's token bucket: `tokens` scaled units at time `last` (us). Negative while
/// a reservation made by `acquire` is still in the future of `last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketState {
    /// Tokens, in scaled units, at `last`.
    pub tokens: i64,
    /// When `tokens` was measured, in us.
    pub last: u64,
}

impl TokenBucket {
    /// A bucket of `capacity` (>= 1) tokens refilled at `rate`.
    pub fn new(rate: Rate, capacity: u64) -> Result<Self, String> {
        let (per_token, per_us, cap) = bucket_units(rate, capacity)?;
        Ok(TokenBucket {
            rate,
            capacity,
            per_token,
            per_us,
            cap,
        })
    }

    /// The refill rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The capacity in tokens.
    pub fn capacity_tokens(&self) -> u64 {
        self.capacity
    }

    fn level_at(&self, s: &TokenBucketState, at: u64) -> i128 {
        let tokens = i128::from(s.tokens);
        if at >= s.last {
            self.cap.min(tokens + i128::from(at - s.last) * self.per_us)
        } else {
            tokens - i128::from(s.last - at) * self.per_us
        }
    }

    fn give_back(&self, s: &mut TokenBucketState, now: u64, cost: u64) {
        let level = self.level_at(s, now) + i128::from(cost) * self.per_token;
        *s = TokenBucketState {
            tokens: clamp_i64(level.min(self.cap)),
            last: now,
        };
    }
}

/// Scaled units of a bucket: (units per token, units per us, capacity in units).
pub(crate) fn bucket_units(rate: Rate, capacity: u64) -> Result<(i128, i128, i128), String> {
    if capacity == 0 {
        return Err("capacity must be at least 1".into());
    }
    let per_token = i128::from(rate.interval_ticks());
    let cap = i128::from(capacity) * per_token;
    if cap > 1 << 62 {
        return Err(format!(
            "capacity {capacity} at rate {rate} spans too long a time"
        ));
    }
    Ok((per_token, rate.scale().into(), cap))
}

pub(crate) fn clamp_i64(x: i128) -> i64 {
    i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX })
}

/// `ceil(a / b)` for a >= 0, b > 0, as u64 microseconds.
pub(crate) fn ceil_us(a: i128, b: i128) -> u64 {
    if a <= 0 {
        0
    } else {
        sat(div_ceil(a as u128, b as u128))
    }
}

impl Schedule for TokenBucket {
    type State = TokenBucketState;
    fn window(&self) -> u64 {
        time_for(self.capacity_tokens(), self.rate())
    }

    fn fresh(&self) -> TokenBucketState {
        TokenBucketState {
            tokens: clamp_i64(self.cap),
            last: 0,
        }
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn last_active(&self, s: &TokenBucketState) -> u64 {
        s.last
    }

    fn earliest(&self, s: &TokenBucketState, now: u64, cost: u64) -> u64 {
        let need = i128::from(cost) * self.per_token;
        now.saturating_add(ceil_us(need - self.level_at(s, now), self.per_us))
    }

    /// A reservation's refill from arrival to admission is never capped: the bucket
    /// reached `cost` tokens within the last microsecond before `at`, and the fraction
    /// of a microsecond's refill past that instant is kept, so reservations never drift.
    fn admit(&self, s: &mut TokenBucketState, now: u64, at: u64, cost: u64) {
        let level = self.level_at(s, now) + i128::from(at - now) * self.per_us
            - i128::from(cost) * self.per_token;
        *s = TokenBucketState {
            tokens: clamp_i64(level),
            last: at,
        };
    }

    fn remaining(&self, s: &TokenBucketState, now: u64) -> u64 {
        sat(div(
            self.level_at(s, now).max(0) as u128,
            self.per_token as u128,
        ))
    }

    fn debt_cap(&self, max_debt: u64) -> u64 {
        debt_units(max_debt, self.per_token as u128, self.per_us as u128)
            .min(exact_units(self.per_token as u128))
    }

    /// Tokens may go `debt` below zero.
    fn room(&self, s: &TokenBucketState, at: u64, debt: u64) -> u64 {
        let room = self.level_at(s, at) + i128::from(debt) * self.per_token;
        sat(div(room.max(0) as u128, self.per_token as u128))
    }

    fn reset_after(&self, s: &TokenBucketState, now: u64) -> u64 {
        ceil_us(self.cap - self.level_at(s, now), self.per_us)
    }
}

schedule_algorithm!(TokenBucket, TokenBucketState);

impl Spec for TokenBucket {
    const PARAMS: &'static [&'static str] = &["rate", "capacity"];

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let rate = p.rate()?;
        let capacity = p.count_or("capacity", rate.count)?;
        Ok(Some(p.build(TokenBucket::new(rate, capacity))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (rate, capacity) = (self.rate(), self.capacity_tokens());
        write!(f, "token-bucket:rate={rate},capacity={capacity}")
    }

    fn share(&self, n: u64) -> Res<Self> {
        TokenBucket::new(
            share_rate(self.rate(), n)?,
            share_count(self.capacity_tokens(), n),
        )
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        Some(match paced(self.rate, w) {
            0 => 0,
            n => (self.capacity - 1).saturating_add(n),
        })
    }

    /// The tokens stay while the rate is the same.
    fn carry_over(&self, old: &Self, state: TokenBucketState, _: u64) -> Option<TokenBucketState> {
        (old.rate() == self.rate()).then_some(state)
    }
}
