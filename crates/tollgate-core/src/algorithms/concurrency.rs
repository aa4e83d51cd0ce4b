//! Concurrency limiter: permits held while work runs.

use crate::algorithm::{check_cost, fits, Algorithm, CheckMode};
use crate::decision::{CheckError, Decision};
use std::fmt;

use crate::params::{share_count, Params, Res, Spec};

/// Admits iff `in_flight + c <= limit`. A permit is held until it is released: by
/// [`Algorithm::refund`] (what an RAII guard does on drop), or, when the hold time is
/// known in advance (replay, simulation), at the end of it ([`Concurrency::check_hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    limit: u64,
}

/// One key's permits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConcurrencyState {
    /// Permits held with no known release time.
    pub open: u64,
    /// Permits with a known release time `(release us, cost)`.
    pub timed: Vec<(u64, u64)>,
    /// The last admission instant (acquire reservations keep FIFO order).
    pub last_admit: u64,
}

impl Concurrency {
    /// At most `limit` (>= 1) permits held at once.
    pub fn new(limit: u64) -> Result<Self, String> {
        if limit == 0 {
            return Err("limit must be at least 1".into());
        }
        Ok(Concurrency { limit })
    }

    fn in_flight(&self, s: &ConcurrencyState, at: u64) -> u64 {
        s.open
            + s.timed
                .iter()
                .filter(|&&(r, _)| r > at)
                .map(|&(_, c)| c)
                .sum::<u64>()
    }

    /// The earliest instant >= `from` at which `cost` permits are free, if known.
    fn earliest(&self, s: &ConcurrencyState, from: u64, cost: u64) -> Option<u64> {
        let held = self.in_flight(s, from);
        if held + cost <= self.limit {
            return Some(from);
        }
        let mut must_free = held + cost - self.limit;
        let mut releases: Vec<_> = s
            .timed
            .iter()
            .filter(|&&(r, _)| r > from)
            .copied()
            .collect();
        releases.sort_unstable();
        for (r, c) in releases {
            must_free = must_free.saturating_sub(c);
            if must_free == 0 {
                return Some(r);
            }
        }
        None
    }

    /// Like [`Algorithm::check`], but an admitted request holds its permits for exactly
    /// `hold_us` from its admission (released automatically), as replay traces do.
    pub fn check_hold(
        &self,
        s: &mut ConcurrencyState,
        now: u64,
        cost: u64,
        hold_us: Option<u64>,
        mode: CheckMode,
    ) -> Result<Decision, CheckError> {
        check_cost(cost, self.limit)?;
        s.timed.retain(|&(r, _)| r > now);
        let at = self.earliest(s, now.max(s.last_admit), cost);
        match at {
            Some(at) if fits(at - now, mode) => {
                match hold_us {
                    Some(hold) => s.timed.push((at.saturating_add(hold), cost)),
                    None => s.open += cost,
                }
                s.last_admit = at;
                Ok(Decision::admitted(
                    self.limit,
                    self.remaining_at(s, now),
                    self.reset_at(s, now),
                    at - now,
                ))
            }
            _ => Ok(Decision::rejected(
                self.limit,
                self.remaining_at(s, now),
                self.reset_at(s, now),
                at.map(|at| at - now),
            )),
        }
    }

    fn remaining_at(&self, s: &ConcurrencyState, now: u64) -> u64 {
        if s.last_admit > now {
            return 0;
        }
        self.limit.saturating_sub(self.in_flight(s, now))
    }

    fn reset_at(&self, s: &ConcurrencyState, now: u64) -> u64 {
        s.timed
            .iter()
            .map(|&(r, _)| r.saturating_sub(now))
            .max()
            .unwrap_or(0)
    }
}

impl Algorithm for Concurrency {
    type State = ConcurrencyState;

    fn init(&self, _now: u64) -> ConcurrencyState {
        ConcurrencyState::default()
    }

    fn check(
        &self,
        s: &mut ConcurrencyState,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<Decision, CheckError> {
        self.check_hold(s, now, cost, None, mode)
    }

    /// Releases `cost` permits held with no known release time.
    fn charge(&self, _: &mut ConcurrencyState, _: u64, _: u64, _: u64) -> Result<u64, CheckError> {
        Err(CheckError::NotChargeable {
            algorithm: "concurrency",
            what: "work in flight",
        })
    }

    fn refund(&self, s: &mut ConcurrencyState, _now: u64, cost: u64) {
        s.open -= cost.min(s.open);
    }

    fn limit(&self) -> u64 {
        self.limit
    }

    /// No time: permits are held for the work, not for a window.
    fn window_us(&self) -> u64 {
        0
    }

    fn debt_cap(&self, _: u64) -> u64 {
        0
    }

    /// No permit held.
    fn idle(&self, s: &ConcurrencyState, now: u64) -> bool {
        s.open == 0 && s.timed.iter().all(|&(r, _)| r <= now)
    }

    fn remaining(&self, s: &ConcurrencyState, now: u64) -> u64 {
        self.remaining_at(s, now)
    }

    fn reset_after(&self, s: &ConcurrencyState, now: u64) -> u64 {
        self.reset_at(s, now)
    }

    fn last_active(&self, s: &ConcurrencyState) -> u64 {
        s.last_admit
    }
}

impl Spec for Concurrency {
    const PARAMS: &'static [&'static str] = &["limit"];
    const CHARGEABLE: bool = false;

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        Ok(Some(p.build(Concurrency::new(p.count("limit", "10")?))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "concurrency:limit={}", Algorithm::limit(self))
    }

    fn share(&self, n: u64) -> Res<Self> {
        Concurrency::new(share_count(Algorithm::limit(self), n))
    }

    fn envelope(&self, _: u64) -> Option<u64> {
        None
    }

    /// Held permits stay held.
    fn carry_over(&self, _: &Self, state: ConcurrencyState, _: u64) -> Option<ConcurrencyState> {
        Some(state)
    }
}
