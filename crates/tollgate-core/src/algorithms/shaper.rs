//! Shaper: the leaky bucket as a queue.

use std::collections::VecDeque;

use super::gcra::MAX_GCRA_SCALE;
use crate::algorithm::{check_cost, fits, Algorithm, CheckMode};
use crate::decision::{CheckError, Decision};
use crate::units::{div_ceil, sat, Rate};
use std::fmt;

use crate::params::{paced, share_rate, Params, Res, Spec};

/// Releases admitted requests one by one at `rate`: a request of cost `c` is scheduled
/// at `s = max(t, last_s + c*T)` and carries `wait = s - t`. A request that must wait
/// needs one of `queue` places; with all taken it is rejected under try. Under acquire
/// the queue bound does not apply (the caller chose to wait); `max-wait` does.
///
/// Never raises `InsufficientCapacity`: any cost is scheduled, later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shaper {
    rate: Rate,
    queue: u64,
    scale: u128,
    interval: u128,
}

/// One key's schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShaperState {
    /// When the last admitted request is released, in scaled ticks; `None` before
    /// the first.
    pub last: Option<u64>,
    /// Release times (us) of admitted requests still waiting, earliest first.
    pub pending: VecDeque<u64>,
}

impl Shaper {
    /// Release at `rate` with up to `queue` requests waiting.
    pub fn new(rate: Rate, queue: u64) -> Result<Self, String> {
        if rate.scale() > MAX_GCRA_SCALE {
            return Err(format!(
                "rate {rate} has an emission interval that is not a whole number of 1/{MAX_GCRA_SCALE} us; \
                 choose a rate whose interval is a whole number of microseconds"
            ));
        }
        Ok(Shaper {
            rate,
            queue,
            scale: rate.scale().into(),
            interval: rate.interval_ticks().into(),
        })
    }

    /// The release rate.
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The queue length.
    pub fn queue(&self) -> u64 {
        self.queue
    }

    fn schedule(&self, s: &ShaperState, now: u64, cost: u64) -> u128 {
        let now = u128::from(now) * self.scale;
        match s.last {
            None => now,
            Some(last) => now.max(u128::from(last) + u128::from(cost) * self.interval),
        }
    }

    fn release_us(&self, ticks: u128) -> u64 {
        sat(div_ceil(ticks, self.scale))
    }

    fn remaining_at(&self, s: &ShaperState, now: u64) -> u64 {
        let immediate = self.release_us(self.schedule(s, now, 1)) <= now;
        self.queue.saturating_sub(s.pending.len() as u64) + u64::from(immediate)
    }

    fn reset_at(&self, s: &ShaperState, now: u64) -> u64 {
        s.last.map_or(0, |last| {
            self.release_us(u128::from(last) + self.interval)
                .saturating_sub(now)
        })
    }
}

impl Algorithm for Shaper {
    type State = ShaperState;

    fn init(&self, _now: u64) -> ShaperState {
        ShaperState::default()
    }

    fn check(
        &self,
        s: &mut ShaperState,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<Decision, CheckError> {
        check_cost(cost, u64::MAX)?;
        while s.pending.front().is_some_and(|&r| r <= now) {
            s.pending.pop_front();
        }
        let at = self.schedule(s, now, cost);
        let release = self.release_us(at);
        let wait = release.saturating_sub(now);
        let queued = s.pending.len() as u64;
        let retry = match mode {
            CheckMode::Try if wait > 0 && queued >= self.queue => {
                // A place frees when enough earlier requests have been released, or
                // the request needs none once its own release time has come.
                let idx = (queued - self.queue) as usize;
                Some(s.pending.get(idx).map_or(wait, |&r| (r - now).min(wait)))
            }
            CheckMode::Acquire { max_wait_us } if !fits(wait, mode) => {
                Some(wait - max_wait_us.unwrap_or(wait))
            }
            _ => None,
        };
        if let Some(retry) = retry {
            return Ok(Decision::rejected(
                self.limit(),
                self.remaining_at(s, now),
                self.reset_at(s, now),
                Some(retry),
            ));
        }
        s.last = Some(sat(at));
        if wait > 0 {
            s.pending.push_back(release);
        }
        Ok(Decision::admitted(
            self.limit(),
            self.remaining_at(s, now),
            self.reset_at(s, now),
            wait,
        ))
    }

    /// A no-op: a scheduled request keeps its place, and moving the schedule back
    /// would let later requests overtake the pace.
    fn charge(&self, _: &mut ShaperState, _: u64, _: u64, _: u64) -> Result<u64, CheckError> {
        Err(CheckError::NotChargeable {
            algorithm: "shaper",
            what: "a release queue",
        })
    }

    fn refund(&self, _s: &mut ShaperState, _now: u64, _cost: u64) {}

    /// `queue + 1`: one request released at once, `queue` more waiting.
    fn limit(&self) -> u64 {
        self.queue.saturating_add(1)
    }

    /// Until a full queue has been released.
    fn window_us(&self) -> u64 {
        crate::units::time_for(self.queue.saturating_add(1), self.rate)
    }

    fn paces(&self) -> bool {
        true
    }

    fn debt_cap(&self, _: u64) -> u64 {
        0
    }

    /// Nothing queued and a unit request would be released at once. (A costlier
    /// request after such a pause is no longer spaced from the one before it.)
    fn idle(&self, s: &ShaperState, now: u64) -> bool {
        s.pending.back().is_none_or(|&r| r <= now) && self.reset_at(s, now) == 0
    }

    fn remaining(&self, s: &ShaperState, now: u64) -> u64 {
        self.remaining_at(s, now)
    }

    fn reset_after(&self, s: &ShaperState, now: u64) -> u64 {
        self.reset_at(s, now)
    }

    fn last_active(&self, s: &ShaperState) -> u64 {
        s.last.map_or(0, |last| self.release_us(u128::from(last)))
    }
}

impl Spec for Shaper {
    const PARAMS: &'static [&'static str] = &["rate", "queue"];
    const CHARGEABLE: bool = false;

    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let (rate, queue) = (p.rate()?, p.count("queue", "100")?);
        Ok(Some(p.build(Shaper::new(rate, queue))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shaper:rate={},queue={}", self.rate(), self.queue())
    }

    /// The queue may share down to 0.
    fn share(&self, n: u64) -> Res<Self> {
        Shaper::new(share_rate(self.rate(), n)?, self.queue() / n)
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        // By release time: one per interval, whatever the queue holds.
        Some(paced(self.rate, w))
    }

    /// The schedule stays while the rate is the same.
    fn carry_over(&self, old: &Self, state: ShaperState, _: u64) -> Option<ShaperState> {
        (old.rate() == self.rate()).then_some(state)
    }
}
