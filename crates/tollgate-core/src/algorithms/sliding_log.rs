//! Sliding log: exact, one timestamp per admitted unit of cost.

use std::collections::VecDeque;

use crate::algorithm::{schedule_algorithm, Schedule};
use std::fmt;

use crate::params::{share_count, Params, Res, Spec};
use crate::units::fmt_duration;

/// At most `limit` cost in any window `(t - window, t]`, exactly.
///
/// Memory grows with the limit (one entry per distinct admission instant, each
/// carrying its cost), so prefer it for small limits where exactness matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    window: u64,
}

/// One key's log: `(timestamp us, cost)` entries, oldest first, plus their total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingLogState {
    /// Admissions, oldest first; timestamps are non-decreasing.
    pub entries: VecDeque<(u64, u64)>,
    /// The sum of the entries' costs.
    pub total: u64,
}

impl SlidingLog {
    /// `limit` (>= 1) per sliding `window_us` (>= 1).
    pub fn new(limit: u64, window_us: u64) -> Result<Self, String> {
        super::check_limit_window(limit, window_us)?;
        Ok(SlidingLog {
            limit,
            window: window_us,
        })
    }

    /// The limit per window.
    pub fn limit_per_window(&self) -> u64 {
        self.limit
    }

    /// The window length in us.
    pub fn window_us(&self) -> u64 {
        self.window
    }

    /// Whether an entry at `ts` still counts at `at`.
    fn counts(&self, ts: u64, at: u64) -> bool {
        ts.saturating_add(self.window) > at
    }

    /// The entries that count at `at`, oldest first.
    fn in_window<'a>(
        &self,
        s: &'a SlidingLogState,
        at: u64,
    ) -> impl Iterator<Item = (u64, u64)> + 'a {
        let skip = s.entries.partition_point(|&(ts, _)| !self.counts(ts, at));
        s.entries.range(skip..).copied()
    }

    fn sum_at(&self, s: &SlidingLogState, at: u64) -> u64 {
        match s.entries.front() {
            Some(&(ts, _)) if self.counts(ts, at) => s.total,
            None => 0,
            _ => self.in_window(s, at).map(|(_, c)| c).sum(),
        }
    }

    fn give_back(&self, s: &mut SlidingLogState, now: u64, mut cost: u64) {
        while cost > 0 {
            let Some(back) = s.entries.back_mut() else {
                break;
            };
            if !self.counts(back.0, now) {
                break;
            }
            let take = cost.min(back.1);
            back.1 -= take;
            s.total -= take;
            cost -= take;
            if back.1 == 0 {
                s.entries.pop_back();
            }
        }
    }
}

impl Schedule for SlidingLog {
    type State = SlidingLogState;
    fn window(&self) -> u64 {
        SlidingLog::window_us(self)
    }

    fn fresh(&self) -> SlidingLogState {
        SlidingLogState::default()
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn last_active(&self, s: &SlidingLogState) -> u64 {
        s.entries.back().map_or(0, |&(ts, _)| ts)
    }

    fn expire(&self, s: &mut SlidingLogState, now: u64) {
        while let Some(&(ts, c)) = s.entries.front() {
            if self.counts(ts, now) {
                break;
            }
            s.entries.pop_front();
            s.total -= c;
        }
    }

    fn earliest(&self, s: &SlidingLogState, now: u64, cost: u64) -> u64 {
        // Never ahead of an earlier admission (a reservation may lie in the future).
        let at = s.entries.back().map_or(now, |&(ts, _)| ts.max(now));
        let sum = self.sum_at(s, at);
        if sum + cost <= self.limit {
            return at;
        }
        let must_leave = sum + cost - self.limit;
        let mut left = 0;
        for (ts, c) in self.in_window(s, at) {
            left += c;
            if left >= must_leave {
                return ts.saturating_add(self.window);
            }
        }
        unreachable!("cost <= limit, so the whole window leaving always makes room")
    }

    fn admit(&self, s: &mut SlidingLogState, now: u64, at: u64, cost: u64) {
        // Expire as of the arrival, not the admission: entries that leave the window
        // before a reservation still count until then (a refund may cancel it).
        self.expire(s, now);
        match s.entries.back_mut() {
            Some(back) if back.0 == at => back.1 += cost,
            _ => s.entries.push_back((at, cost)),
        }
        s.total += cost;
    }

    /// The window may hold `debt` units past the limit.
    fn room(&self, s: &SlidingLogState, at: u64, debt: u64) -> u64 {
        (self.limit + debt).saturating_sub(self.sum_at(s, at))
    }

    /// Entries stay in time order: never before the newest (a reservation).
    fn charge_at(&self, s: &SlidingLogState, now: u64) -> u64 {
        s.entries.back().map_or(now, |&(ts, _)| ts.max(now))
    }

    fn remaining(&self, s: &SlidingLogState, now: u64) -> u64 {
        match s.entries.back() {
            Some(&(ts, _)) if ts > now => 0,
            _ => self.limit.saturating_sub(self.sum_at(s, now)),
        }
    }

    fn reset_after(&self, s: &SlidingLogState, now: u64) -> u64 {
        s.entries.back().map_or(0, |&(ts, _)| {
            ts.saturating_add(self.window).saturating_sub(now)
        })
    }
}

schedule_algorithm!(SlidingLog, SlidingLogState);

impl Spec for SlidingLog {
    const PARAMS: &'static [&'static str] = &["limit", "window"];

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let (limit, window) = (p.count("limit", "100")?, p.window()?);
        Ok(Some(p.build(SlidingLog::new(limit, window))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, window) = (self.limit_per_window(), fmt_duration(self.window_us()));
        write!(f, "sliding-log:limit={limit},window={window}")
    }

    fn share(&self, n: u64) -> Res<Self> {
        SlidingLog::new(share_count(self.limit_per_window(), n), self.window_us())
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        Some(self.limit.saturating_mul(w.div_ceil(self.window)))
    }

    /// Timestamps keep their meaning under any window.
    fn carry_over(&self, _: &Self, state: SlidingLogState, _: u64) -> Option<SlidingLogState> {
        Some(state)
    }
}
