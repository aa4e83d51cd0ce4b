//! Sliding window counters: K sub-window buckets, or the weighted two-window estimate.

use crate::algorithm::{schedule_algorithm, Schedule};
use crate::units::{idiv, sat};
use std::fmt;

use crate::params::{share_count, windows_touched, Params, Res, Spec};
use crate::units::fmt_duration;

/// The most buckets a sliding window may have (each key keeps one counter per bucket).
pub const MAX_BUCKETS: u64 = 3600;

/// At most `limit` cost in the `K` clock-aligned buckets (each `window/K` long) ending
/// with the bucket that holds `t`.
///
/// Exact at bucket granularity: never more than `limit` in any K consecutive buckets.
/// A true sliding window `(t - window, t]` reaches up to one bucket further back, so it
/// can see `limit` plus part of what the oldest bucket held; more buckets, less slack
/// (K = 1 is a fixed window). For an exact bound use `sliding-log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u64,
    window: u64,
    buckets: u64,
    width: u64,
}

/// One key's buckets: `counts[b % K]` holds bucket `b` for `b` in `(newest-K, newest]`.
/// Empty until the first admission. `newest` after now holds a reservation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Index (time / width) of the newest bucket written.
    pub newest: u64,
    /// The sum of `counts`.
    pub total: u64,
    /// One counter per bucket, as a ring.
    pub counts: Box<[u64]>,
}

impl SlidingWindow {
    /// `limit` (>= 1) per `window_us`, kept in `buckets` (1..=3600) buckets; the window
    /// must be a whole multiple of `buckets` microseconds.
    pub fn new(limit: u64, window_us: u64, buckets: u64) -> Result<Self, String> {
        if limit == 0 {
            return Err("limit must be at least 1".into());
        }
        if !(1..=MAX_BUCKETS).contains(&buckets) {
            return Err(format!("buckets must be between 1 and {MAX_BUCKETS}"));
        }
        if window_us == 0 || window_us % buckets != 0 {
            return Err(format!(
                "window ({window_us}us) must be a positive whole multiple of buckets ({buckets}) microseconds"
            ));
        }
        Ok(SlidingWindow {
            limit,
            window: window_us,
            buckets,
            width: window_us / buckets,
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

    /// The number of buckets.
    pub fn buckets(&self) -> u64 {
        self.buckets
    }

    fn last_active_of(&self, s: &SlidingWindowState) -> u64 {
        s.newest.saturating_mul(self.width)
    }

    fn slot(&self, b: u64) -> usize {
        (b % self.buckets) as usize
    }

    /// Buckets of the window that ends with bucket `end`, oldest first, with counts.
    fn window_buckets<'a>(
        &'a self,
        s: &'a SlidingWindowState,
        end: u64,
    ) -> impl Iterator<Item = (u64, u64)> + 'a {
        let first = (end + 1)
            .saturating_sub(self.buckets)
            .max((s.newest + 1).saturating_sub(self.buckets));
        let last = end.min(s.newest);
        let live = !s.counts.is_empty();
        (first..=last)
            .filter(move |_| live)
            .map(move |b| (b, s.counts[self.slot(b)]))
    }

    /// The sum over the window ending with bucket `end` (>= newest): the running
    /// total less the buckets that have left by then.
    fn sum(&self, s: &SlidingWindowState, end: u64) -> u64 {
        if s.counts.is_empty() || end >= s.newest + self.buckets {
            return 0;
        }
        let first_kept = (end + 1).saturating_sub(self.buckets);
        let first_held = (s.newest + 1).saturating_sub(self.buckets);
        let gone: u64 = (first_held..first_kept)
            .map(|b| s.counts[self.slot(b)])
            .sum();
        s.total - gone
    }

    fn give_back(&self, s: &mut SlidingWindowState, now: u64, mut cost: u64) {
        if s.counts.is_empty() {
            return;
        }
        let oldest = (now / self.width + 1).saturating_sub(self.buckets);
        let mut b = s.newest;
        while cost > 0 && b >= oldest && b + self.buckets > s.newest {
            let slot = self.slot(b);
            let take = cost.min(s.counts[slot]);
            s.counts[slot] -= take;
            s.total -= take;
            cost -= take;
            if b == 0 {
                break;
            }
            b -= 1;
        }
    }
}

impl Schedule for SlidingWindow {
    type State = SlidingWindowState;
    fn window(&self) -> u64 {
        SlidingWindow::window_us(self)
    }

    fn fresh(&self) -> SlidingWindowState {
        SlidingWindowState::default()
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn last_active(&self, s: &Self::State) -> u64 {
        self.last_active_of(s)
    }

    fn earliest(&self, s: &SlidingWindowState, now: u64, cost: u64) -> u64 {
        let mut at = now;
        let mut end = now / self.width;
        if !s.counts.is_empty() && s.newest > end {
            end = s.newest;
            at = end * self.width;
        }
        let sum = self.sum(s, end);
        if sum + cost <= self.limit {
            return at;
        }
        let must_leave = sum + cost - self.limit;
        let mut left = 0;
        for (b, c) in self.window_buckets(s, end) {
            left += c;
            if left >= must_leave {
                return (b + self.buckets).saturating_mul(self.width);
            }
        }
        unreachable!("cost <= limit, so the whole window leaving always makes room")
    }

    fn admit(&self, s: &mut SlidingWindowState, _now: u64, at: u64, cost: u64) {
        let b = at / self.width;
        if s.counts.is_empty() {
            s.counts = vec![0; self.buckets as usize].into_boxed_slice();
            s.newest = b;
        }
        if b > s.newest {
            let stale = (b - s.newest).min(self.buckets);
            for k in 0..stale {
                let slot = self.slot(b - k);
                s.total -= s.counts[slot];
                s.counts[slot] = 0;
            }
            s.newest = b;
        }
        let slot = self.slot(b);
        s.counts[slot] += cost;
        s.total += cost;
    }

    /// The window may hold `debt` units past the limit.
    fn room(&self, s: &SlidingWindowState, at: u64, debt: u64) -> u64 {
        (self.limit + debt).saturating_sub(self.sum(s, at / self.width))
    }

    /// Never into a bucket before the newest (a reservation).
    fn charge_at(&self, s: &SlidingWindowState, now: u64) -> u64 {
        if !s.counts.is_empty() && s.newest > now / self.width {
            s.newest * self.width
        } else {
            now
        }
    }

    fn remaining(&self, s: &SlidingWindowState, now: u64) -> u64 {
        let end = now / self.width;
        if !s.counts.is_empty() && s.newest > end {
            return 0;
        }
        self.limit.saturating_sub(self.sum(s, end))
    }

    fn reset_after(&self, s: &SlidingWindowState, now: u64) -> u64 {
        let end = (now / self.width).max(s.newest);
        self.window_buckets(s, end)
            .filter(|&(_, c)| c > 0)
            .last()
            .map_or(0, |(b, _)| {
                (b + self.buckets)
                    .saturating_mul(self.width)
                    .saturating_sub(now)
            })
    }
}

schedule_algorithm!(SlidingWindow, SlidingWindowState);

/// The weighted sliding window (Cloudflare's estimate): clock-aligned windows, and
/// `estimate = prev * (window - elapsed) / window + curr`; admits iff
/// `estimate + c <= limit`, computed in integers (`prev*(window-elapsed) + (curr+c)*window
/// <= limit*window`), so there is no float drift.
///
/// Two counters per key whatever the window; an estimate, so it can admit more than
/// `limit` in some true sliding window when traffic is uneven within a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlidingWindowWeighted {
    limit: u64,
    window: u64,
}

/// One key's weighted window: counts of window `win` and of the one before it. A
/// `win` after now holds a reservation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeightedState {
    /// Index (time / window) of the current window.
    pub win: u64,
    /// Cost admitted in window `win - 1`.
    pub prev: u64,
    /// Cost admitted in window `win`.
    pub curr: u64,
}

impl SlidingWindowWeighted {
    /// `limit` (>= 1) per `window_us` (>= 1).
    pub fn new(limit: u64, window_us: u64) -> Result<Self, String> {
        super::check_limit_window(limit, window_us)?;
        Ok(SlidingWindowWeighted {
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

    fn last_active_of(&self, s: &WeightedState) -> u64 {
        s.win.saturating_mul(self.window)
    }

    /// (prev, curr) as seen from window `w` >= `s.win`.
    fn counts_at(&self, s: &WeightedState, w: u64) -> (u64, u64) {
        if w == s.win {
            (s.prev, s.curr)
        } else if w == s.win.saturating_add(1) {
            (s.curr, 0)
        } else {
            (0, 0)
        }
    }

    /// `limit*window - prev*(window - elapsed) - curr*window`: the estimate's headroom,
    /// in units of 1/window.
    fn headroom(&self, s: &WeightedState, at: u64) -> i128 {
        let w = at / self.window;
        let (prev, curr) = self.counts_at(s, w);
        let elapsed = at - w * self.window;
        let window = i128::from(self.window);
        i128::from(self.limit) * window
            - i128::from(prev) * (window - i128::from(elapsed))
            - i128::from(curr) * window
    }

    fn give_back(&self, s: &mut WeightedState, now: u64, cost: u64) {
        if now / self.window <= s.win.saturating_add(1) {
            s.curr -= cost.min(s.curr);
        }
    }
}

impl Schedule for SlidingWindowWeighted {
    type State = WeightedState;
    fn window(&self) -> u64 {
        SlidingWindowWeighted::window_us(self)
    }

    fn fresh(&self) -> WeightedState {
        WeightedState::default()
    }

    fn capacity(&self) -> u64 {
        self.limit
    }

    fn last_active(&self, s: &Self::State) -> u64 {
        self.last_active_of(s)
    }

    fn earliest(&self, s: &WeightedState, now: u64, cost: u64) -> u64 {
        let window = i128::from(self.window);
        let mut at = now.max(s.win.saturating_mul(self.window));
        loop {
            let need = i128::from(cost) * window;
            if self.headroom(s, at) >= need {
                return at;
            }
            let w = at / self.window;
            let (prev, curr) = self.counts_at(s, w);
            let room = i128::from(self.limit) - i128::from(curr) - i128::from(cost);
            if room >= 0 && prev > 0 {
                // prev*(window - elapsed) <= room*window  <=>  elapsed >= window - floor(room*window/prev)
                let elapsed = window - idiv(room * window, i128::from(prev));
                if elapsed < window {
                    return w * self.window + elapsed as u64;
                }
            }
            match (w + 1).checked_mul(self.window) {
                Some(next) => at = next,
                // The end of time: nothing fits before it.
                None => return u64::MAX,
            }
        }
    }

    fn admit(&self, s: &mut WeightedState, _now: u64, at: u64, cost: u64) {
        let w = at / self.window;
        let (prev, curr) = self.counts_at(s, w);
        *s = WeightedState {
            win: w,
            prev,
            curr: curr + cost,
        };
    }

    /// The counts times the window stay below 2^52 (exact in the Redis scripts'
    /// doubles). Harmless: a previous window that full blocks the whole next one.
    fn debt_cap(&self, max_debt: u64) -> u64 {
        let most = (1u64 << 52) / self.window;
        max_debt
            .min(crate::MAX_COUNT)
            .min(most.saturating_sub(self.limit))
    }

    /// The estimate may pass the limit by `debt`.
    fn room(&self, s: &WeightedState, at: u64, debt: u64) -> u64 {
        // Floor division: a negative headroom takes a whole unit of debt.
        let room = i128::from(debt) + self.headroom(s, at).div_euclid(i128::from(self.window));
        sat(room.max(0) as u128)
    }

    /// Never into a window before the newest (a reservation).
    fn charge_at(&self, s: &WeightedState, now: u64) -> u64 {
        now.max(s.win.saturating_mul(self.window))
    }

    fn remaining(&self, s: &WeightedState, now: u64) -> u64 {
        if s.win > now / self.window {
            return 0;
        }
        sat(idiv(self.headroom(s, now).max(0), i128::from(self.window)) as u128)
    }

    fn reset_after(&self, s: &WeightedState, now: u64) -> u64 {
        let until = if s.curr > 0 {
            s.win.saturating_add(2)
        } else if s.prev > 0 {
            s.win.saturating_add(1)
        } else {
            return 0;
        };
        until.saturating_mul(self.window).saturating_sub(now)
    }
}

schedule_algorithm!(SlidingWindowWeighted, WeightedState);

impl Spec for SlidingWindow {
    const PARAMS: &'static [&'static str] = &["limit", "window", "buckets", "mode"];

    /// `buckets=K` (not with `mode`); without it, the weighted row's.
    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let Some(k) = p.value("buckets")? else {
            return Ok(None);
        };
        let (limit, window) = (p.count("limit", "100")?, p.window()?);
        if p.value("mode")?.is_some() {
            return Err("sliding-window: give either buckets=K or mode=weighted, not both".into());
        }
        let k = p.count_of("buckets", k)?;
        Ok(Some(p.build(SlidingWindow::new(limit, window, k))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, window) = (self.limit_per_window(), fmt_duration(self.window_us()));
        let k = self.buckets();
        write!(
            f,
            "sliding-window:limit={limit},window={window},buckets={k}"
        )
    }

    fn share(&self, n: u64) -> Res<Self> {
        let limit = share_count(self.limit_per_window(), n);
        SlidingWindow::new(limit, self.window_us(), self.buckets())
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        // Every K consecutive buckets hold at most `limit`.
        let touched = windows_touched(self.width, w);
        Some(self.limit.saturating_mul(touched.div_ceil(self.buckets)))
    }

    /// The counters stay while the buckets are the same.
    fn carry_over(
        &self,
        old: &Self,
        state: SlidingWindowState,
        _: u64,
    ) -> Option<SlidingWindowState> {
        (old.window_us() == self.window_us() && old.buckets() == self.buckets()).then_some(state)
    }
}

impl Spec for SlidingWindowWeighted {
    const PARAMS: &'static [&'static str] = SlidingWindow::PARAMS;

    /// `mode=weighted`, the default when `buckets` is absent.
    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let (limit, window) = (p.count("limit", "100")?, p.window()?);
        match p.value("mode")? {
            None | Some("weighted") => {}
            Some(v) => return Err(p.bad("mode", v, "expected weighted (or buckets=K instead)")),
        }
        Ok(Some(p.build(SlidingWindowWeighted::new(limit, window))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (limit, window) = (self.limit_per_window(), fmt_duration(self.window_us()));
        write!(
            f,
            "sliding-window:limit={limit},window={window},mode=weighted"
        )
    }

    fn share(&self, n: u64) -> Res<Self> {
        SlidingWindowWeighted::new(share_count(self.limit_per_window(), n), self.window_us())
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        // The current window's count alone stays within the limit: at most the fixed
        // window's bound.
        Some(self.limit.saturating_mul(windows_touched(self.window, w)))
    }

    /// The two counts stay while the window is the same.
    fn carry_over(&self, old: &Self, state: WeightedState, _: u64) -> Option<WeightedState> {
        (old.window_us() == self.window_us()).then_some(state)
    }
}
