//! nginx `limit_req`: the leaky bucket of `ngx_http_limit_req_module`, with its integer
//! accounting (milli-requests, a millisecond clock), burst, and delay.

use crate::algorithm::{check_cost, fits, Algorithm, CheckMode};
use crate::decision::{CheckError, Decision};
use crate::units::{div_ceil, idiv, sat, Rate};
use std::fmt;

use crate::params::{share_rate, Params, Res, Spec};

/// How `limit-req` treats admitted requests above the rate (nginx `delay=`/`nodelay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Delay {
    /// Delay every request in excess (nginx's default, `delay=0`).
    #[default]
    All,
    /// Admit the first `n` excess requests at once, delay the rest (`delay=n`).
    After(u64),
    /// Never delay (`nodelay`).
    Never,
}

/// nginx `limit_req` with `rate`, `burst` and `delay`, exactly:
///
/// * `rate_milli` = requests per second x 1000, truncated (`30/m` = 500);
/// * with `ms = now_ms - last_ms`: `excess = max(prev - rate_milli*ms/1000 + 1000, 0)`
///   (integer division, as nginx); reject if `excess > burst*1000` (state unchanged);
///   otherwise store `excess` and `last_ms = now_ms`;
/// * an admitted request with `excess > delay*1000` is delayed
///   `(excess - delay*1000) * 1000 / rate_milli` ms.
///
/// A new key's first request has excess 0. A cost `c` counts as `c` requests arriving
/// together: `excess = max(prev - drain, -1000) + c*1000` (for `c = 1` exactly nginx's
/// formula), so `c` can be at most `burst + 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitReq {
    rate: Rate,
    burst: u64,
    delay: Delay,
    rate_milli: i128,
    burst_milli: i128,
    delay_milli: i128,
}

/// One key's `limit_req` node: `excess` milli-requests at `last_ms`. `-1000` is the
/// state of a new (or fully drained) key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitReqState {
    /// The time of the last admitted request, in ms.
    pub last_ms: u64,
    /// Excess in milli-requests.
    pub excess: i64,
}

const FRESH: i64 = -1000;

impl LimitReq {
    /// `limit_req` at `rate` (at least 1 request per 1000 s, like nginx's `1r/m`
    /// granularity allows) with `burst` and `delay`.
    pub fn new(rate: Rate, burst: u64, delay: Delay) -> Result<Self, String> {
        let rate_milli = u128::from(rate.count) * 1_000_000_000 / u128::from(rate.period_us);
        if rate_milli == 0 {
            return Err(format!(
                "rate {rate} is below limit-req's resolution of 1 request per 1000s (nginx keeps the rate in milli-requests per second)"
            ));
        }
        if let Delay::After(n) = delay {
            if n > burst {
                return Err(format!("delay={n} is larger than burst={burst}"));
            }
        }
        Ok(LimitReq {
            rate,
            burst,
            delay,
            rate_milli: rate_milli as i128,
            burst_milli: i128::from(burst) * 1000,
            delay_milli: match delay {
                Delay::All => 0,
                Delay::After(n) => i128::from(n) * 1000,
                Delay::Never => i128::MAX,
            },
        })
    }

    /// The rate as written (nginx keeps it in milli-requests per second, see `rate_milli`).
    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// The burst: requests admitted beyond the rate before rejects start.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The delay mode.
    pub fn delay(&self) -> Delay {
        self.delay
    }

    /// The rate in milli-requests per second, as nginx keeps it.
    pub fn rate_milli(&self) -> u64 {
        self.rate_milli as u64
    }

    /// Excess at `ms` (>= last_ms) before adding a request, clamped at -1000.
    fn drained(&self, s: &LimitReqState, ms: u64) -> i128 {
        let elapsed = i128::from(ms.saturating_sub(s.last_ms));
        (i128::from(s.excess) - idiv(self.rate_milli * elapsed, 1000)).max(i128::from(FRESH))
    }

    /// The first ms (>= last_ms) at which the drained excess is <= `target`.
    fn ms_when_drained_to(&self, s: &LimitReqState, target: i128) -> u64 {
        let over = i128::from(s.excess) - target;
        if over <= 0 {
            return s.last_ms;
        }
        // floor(rate*ms/1000) >= over  <=>  ms >= ceil(1000*over/rate)
        let ms = div_ceil(1000 * over as u128, self.rate_milli as u128);
        s.last_ms.saturating_add(sat(ms))
    }

    fn delay_ms(&self, excess: i128) -> u64 {
        if excess > self.delay_milli {
            sat(idiv((excess - self.delay_milli) * 1000, self.rate_milli) as u128)
        } else {
            0
        }
    }
}

impl Algorithm for LimitReq {
    type State = LimitReqState;

    fn init(&self, now: u64) -> LimitReqState {
        LimitReqState {
            last_ms: now / 1000,
            excess: FRESH,
        }
    }

    fn check(
        &self,
        s: &mut LimitReqState,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<Decision, CheckError> {
        check_cost(cost, self.burst + 1)?;
        let add = i128::from(cost) * 1000;
        // Never ahead of an earlier admission (acquire may have reserved a later ms).
        let mut ms = (now / 1000).max(s.last_ms);
        if self.drained(s, ms) + add > self.burst_milli {
            ms = self.ms_when_drained_to(s, self.burst_milli - add);
        }
        let at = if ms == now / 1000 {
            now
        } else {
            ms.saturating_mul(1000)
        };
        let excess = self.drained(s, ms) + add;
        let delay = self.delay_ms(excess) * 1000;
        let to_admit = at - now;
        let total = to_admit.saturating_add(delay);
        let admitted = match mode {
            CheckMode::Try => to_admit == 0,
            CheckMode::Acquire { .. } => fits(total, mode),
        };
        if admitted {
            *s = LimitReqState {
                last_ms: ms,
                excess: excess as i64,
            };
            Ok(Decision::admitted(
                self.limit(),
                self.remaining_at(s, now),
                self.reset_at(s, now),
                total,
            ))
        } else {
            Ok(Decision::rejected(
                self.limit(),
                self.remaining_at(s, now),
                self.reset_at(s, now),
                Some(to_admit.max(1)),
            ))
        }
    }

    /// `excess += cost*1000` after the leak, with no burst test, up to `max_debt`
    /// requests past the burst.
    fn charge(
        &self,
        s: &mut LimitReqState,
        now: u64,
        cost: u64,
        max_debt: u64,
    ) -> Result<u64, CheckError> {
        if cost == 0 {
            return Ok(0);
        }
        let ms = (now / 1000).max(s.last_ms);
        let excess = self.drained(s, ms);
        let cap = self.burst_milli + i128::from(self.debt_cap(max_debt)) * 1000;
        let room = ((cap - excess).max(0) / 1000) as u64;
        let charged = cost.min(room);
        if charged > 0 {
            *s = LimitReqState {
                last_ms: ms,
                excess: (excess + i128::from(charged) * 1000) as i64,
            };
        }
        Ok(charged)
    }

    /// `rate_milli` milli-requests per second: MAX_DEBT_US of it is
    /// `MAX_DEBT_US * rate_milli / 1e9` requests.
    fn debt_cap(&self, max_debt: u64) -> u64 {
        crate::algorithm::debt_units(max_debt, 1_000_000_000, self.rate_milli as u128)
    }

    fn refund(&self, s: &mut LimitReqState, now: u64, cost: u64) {
        let ms = (now / 1000).max(s.last_ms);
        let excess = (self.drained(s, ms) - i128::from(cost) * 1000).max(i128::from(FRESH));
        *s = LimitReqState {
            last_ms: ms,
            excess: excess as i64,
        };
    }

    /// `burst + 1`: an idle key admits its first request with excess 0, then `burst` more.
    fn limit(&self) -> u64 {
        self.burst + 1
    }

    /// Until `burst + 1` requests' excess has drained.
    fn window_us(&self) -> u64 {
        let excess = u128::from(self.burst + 1) * 1_000_000_000;
        sat(excess.div_ceil(u128::from(self.rate_milli())))
    }

    /// Excess past the `delay` threshold is delayed, unless `nodelay`.
    fn paces(&self) -> bool {
        match self.delay {
            Delay::All => self.burst > 0,
            Delay::After(n) => n < self.burst,
            Delay::Never => false,
        }
    }

    fn idle(&self, s: &LimitReqState, now: u64) -> bool {
        self.reset_at(s, now) == 0
    }

    fn remaining(&self, s: &LimitReqState, now: u64) -> u64 {
        self.remaining_at(s, now)
    }

    fn reset_after(&self, s: &LimitReqState, now: u64) -> u64 {
        self.reset_at(s, now)
    }

    fn last_active(&self, s: &LimitReqState) -> u64 {
        s.last_ms.saturating_mul(1000)
    }
}

impl LimitReq {
    fn remaining_at(&self, s: &LimitReqState, now: u64) -> u64 {
        let ms = now / 1000;
        if s.last_ms > ms {
            return 0;
        }
        let next = self.drained(s, ms) + 1000;
        if next > self.burst_milli {
            0
        } else {
            sat(((self.burst_milli - next) / 1000 + 1) as u128)
        }
    }

    fn reset_at(&self, s: &LimitReqState, now: u64) -> u64 {
        let ms = self.ms_when_drained_to(s, i128::from(FRESH));
        ms.saturating_mul(1000).saturating_sub(now)
    }
}

impl Spec for LimitReq {
    const PARAMS: &'static [&'static str] = &["rate", "burst", "nodelay", "delay"];

    /// nginx's burst, and `nodelay` or `delay=N`, not both.
    fn from_spec(_: &str, p: &Params) -> Res<Option<Self>> {
        let rate = p.rate()?;
        let burst = p.count_or("burst", 0)?;
        let delay = match (p.flag("nodelay")?, p.value("delay")?) {
            (true, Some(_)) => {
                return Err("limit-req: give either nodelay or delay=N, not both".into())
            }
            (true, None) => Delay::Never,
            (false, Some(v)) => match p.count_of("delay", v)? {
                0 => Delay::All,
                n => Delay::After(n),
            },
            (false, None) => Delay::All,
        };
        Ok(Some(p.build(LimitReq::new(rate, burst, delay))?))
    }

    fn fmt_spec(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limit-req:rate={}", self.rate())?;
        if self.burst() > 0 {
            write!(f, ",burst={}", self.burst())?;
        }
        match self.delay() {
            Delay::All => Ok(()),
            Delay::After(n) => write!(f, ",delay={n}"),
            Delay::Never => f.write_str(",nodelay"),
        }
    }

    /// Burst and delay may share down to 0.
    fn share(&self, n: u64) -> Res<Self> {
        let delay = match self.delay() {
            Delay::After(k) => Delay::After(k / n),
            d => d,
        };
        LimitReq::new(share_rate(self.rate(), n)?, self.burst() / n, delay)
    }

    fn envelope(&self, w: u64) -> Option<u64> {
        if w == 0 {
            return Some(0);
        }
        // `burst + 1` at one instant (the first from an excess of 0), then the leak
        // of the milliseconds the window spans on nginx's ms clock: `w` us can reach
        // across `ceil((w - 1) / 1000)` millisecond boundaries.
        let mut ms = (w - 1).div_ceil(1000);
        if self.delay != Delay::Never {
            // A delay is whole ms, truncated: a delayed request may be released up
            // to 1 ms before its exact turn, so a window can hold one ms more.
            ms += 1;
        }
        let leaked = (self.rate_milli as u128 * u128::from(ms)) / 1_000_000;
        Some((self.burst + 1).saturating_add(u64::try_from(leaked).unwrap_or(u64::MAX)))
    }

    /// The excess keeps its meaning under any rate.
    fn carry_over(&self, _: &Self, state: LimitReqState, _: u64) -> Option<LimitReqState> {
        Some(state)
    }
}
