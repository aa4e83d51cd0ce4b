//! [`Policy`]: any algorithm plus the options every policy has, behind one type, as
//! parsed from a spec. Stores and servers hold `Policy` + [`PolicyState`].

use crate::algorithm::{Algorithm, CheckMode};
use crate::algorithms::*;
use crate::decision::{CheckError, Decision};
use crate::kind::AlgorithmKind;
use crate::units::MAX_TIME_US;

/// What a check does: try (reject), acquire (wait, bounded by the policy's
/// `max-wait`), charge work already done, or count as Envoy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Op {
    /// Admit now or reject.
    #[default]
    Try,
    /// Wait for the earliest admissible instant, up to the policy's `max-wait`.
    Acquire,
    /// Consume the cost unconditionally, even into debt (see [`Policy::charge`]):
    /// always admitted.
    Charge,
    /// Charge the cost whatever the answer, and answer as a try would have
    /// (envoyproxy/ratelimit's counting, see [`Policy::count`]).
    Count,
}

impl Op {
    /// Whether the op consumes its cost whatever the verdict (charge, count).
    pub fn charges(self) -> bool {
        matches!(self, Op::Charge | Op::Count)
    }
}

/// The algorithm of a [`Policy`], with its parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Algo {
    /// `fixed-window`: a count per window.
    FixedWindow(FixedWindow),
    /// `sliding-log`: a timestamp per admitted unit.
    SlidingLog(SlidingLog),
    /// `sliding-window` with `buckets=K`: K sub-window counters.
    SlidingWindow(SlidingWindow),
    /// `sliding-window` with `mode=weighted`: two window counters, the previous one weighted by overlap.
    SlidingWindowWeighted(SlidingWindowWeighted),
    /// `leaky-bucket`: a level that drains continuously (the meter).
    LeakyBucket(LeakyBucket),
    /// `gcra`: a theoretical arrival time.
    Gcra(Gcra),
    /// `token-bucket`: tokens that refill continuously.
    TokenBucket(TokenBucket),
    /// `smooth-bursty`: Guava's SmoothBursty.
    SmoothBursty(Smooth),
    /// `smooth-warmup`: Guava's SmoothWarmingUp.
    SmoothWarmup(Smooth),
    /// `limit-req`: nginx's excess in milli-requests.
    LimitReq(LimitReq),
    /// `shaper`: a release schedule.
    Shaper(Shaper),
    /// `concurrency`: permits in flight.
    Concurrency(Concurrency),
}

impl Algo {
    /// Which algorithm this is (its row of the algorithm table).
    pub fn kind(&self) -> AlgorithmKind {
        match self {
            Algo::FixedWindow(_) => AlgorithmKind::FixedWindow,
            Algo::SlidingLog(_) => AlgorithmKind::SlidingLog,
            Algo::SlidingWindow(_) => AlgorithmKind::SlidingWindow,
            Algo::SlidingWindowWeighted(_) => AlgorithmKind::SlidingWindowWeighted,
            Algo::LeakyBucket(_) => AlgorithmKind::LeakyBucket,
            Algo::Gcra(_) => AlgorithmKind::Gcra,
            Algo::TokenBucket(_) => AlgorithmKind::TokenBucket,
            Algo::SmoothBursty(_) => AlgorithmKind::SmoothBursty,
            Algo::SmoothWarmup(_) => AlgorithmKind::SmoothWarmup,
            Algo::LimitReq(_) => AlgorithmKind::LimitReq,
            Algo::Shaper(_) => AlgorithmKind::Shaper,
            Algo::Concurrency(_) => AlgorithmKind::Concurrency,
        }
    }
}

/// One key's state under a [`Policy`].
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyState {
    /// The state of `fixed-window`: a count per window.
    FixedWindow(FixedWindowState),
    /// The state of `sliding-log`: a timestamp per admitted unit.
    SlidingLog(SlidingLogState),
    /// The state of `sliding-window` with `buckets=K`: K sub-window counters.
    SlidingWindow(SlidingWindowState),
    /// The state of `sliding-window` with `mode=weighted`: two window counters, the previous one weighted by overlap.
    SlidingWindowWeighted(WeightedState),
    /// The state of `leaky-bucket`: a level that drains continuously (the meter).
    LeakyBucket(LeakyBucketState),
    /// The state of `gcra`: a theoretical arrival time.
    Gcra(GcraState),
    /// The state of `token-bucket`: tokens that refill continuously.
    TokenBucket(TokenBucketState),
    /// The state of `smooth-bursty`: Guava's SmoothBursty.
    SmoothBursty(SmoothState),
    /// The state of `smooth-warmup`: Guava's SmoothWarmingUp.
    SmoothWarmup(SmoothState),
    /// The state of `limit-req`: nginx's excess in milli-requests.
    LimitReq(LimitReqState),
    /// The state of `shaper`: a release schedule.
    Shaper(ShaperState),
    /// The state of `concurrency`: permits in flight.
    Concurrency(ConcurrencyState),
}

/// Calls `$body` with `$a` bound to the algorithm and `$s` to its state, re-creating
/// the state if it belongs to another algorithm (a policy changed at run time).
macro_rules! dispatch {
    ($self:ident, $state:ident, $now:expr, |$a:ident, $s:ident| $body:expr) => {
        dispatch!(@arms $self, $state, $now, |$a, $s| $body;
            FixedWindow, SlidingLog, SlidingWindow, SlidingWindowWeighted, LeakyBucket, Gcra,
            TokenBucket, SmoothBursty, SmoothWarmup, LimitReq, Shaper, Concurrency)
    };
    (@arms $self:ident, $state:ident, $now:expr, |$a:ident, $s:ident| $body:expr; $($v:ident),*) => {
        match &$self.algo {
            $(Algo::$v($a) => {
                if !matches!($state, PolicyState::$v(_)) {
                    *$state = PolicyState::$v($a.init($now));
                }
                let PolicyState::$v($s) = $state else { unreachable!() };
                $body
            })*
        }
    };
}

/// Like `dispatch!` on a shared state; `$default` when the state belongs to another
/// algorithm.
macro_rules! dispatch_ref {
    ($self:ident, $state:ident, $default:expr, |$a:ident, $s:ident| $body:expr) => {
        dispatch_ref!(@arms $self, $state, $default, |$a, $s| $body;
            FixedWindow, SlidingLog, SlidingWindow, SlidingWindowWeighted, LeakyBucket, Gcra,
            TokenBucket, SmoothBursty, SmoothWarmup, LimitReq, Shaper, Concurrency)
    };
    (@arms $self:ident, $state:ident, $default:expr, |$a:ident, $s:ident| $body:expr; $($v:ident),*) => {
        match (&$self.algo, $state) {
            $((Algo::$v($a), PolicyState::$v($s)) => $body,)*
            _ => $default,
        }
    };
}

macro_rules! init_state {
    ($self:ident, $now:expr; $($v:ident),*) => {
        match &$self.algo { $(Algo::$v(a) => PolicyState::$v(a.init($now)),)* }
    };
}

/// A validated rate-limiting policy: an algorithm with its parameters, `max-wait` and
/// `shadow`. Parse one from a spec; print it back with `Display`.
///
/// ```
/// use tollgate_core::{Policy, Op};
/// let policy: Policy = "gcra:rate=10/s,burst=5".parse().unwrap();
/// assert_eq!(policy.to_string(), "gcra:rate=10/s,burst=5");
/// let mut state = policy.init(0);
/// let d = policy.check(&mut state, 0, 1, Op::Try).unwrap();
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 4);
///
/// let err = "gcra:rate=10/s,brust=5".parse::<Policy>().unwrap_err();
/// assert!(err.to_string().contains("unknown parameter 'brust' (expected one of: rate, burst, max-wait, shadow, max-debt)"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    algo: Algo,
    max_wait_us: Option<u64>,
    shadow: bool,
    max_debt: Option<u64>,
}

impl Policy {
    pub(crate) fn from_parts(algo: Algo, max_wait_us: Option<u64>, shadow: bool) -> Self {
        Policy {
            algo,
            max_wait_us,
            shadow,
            max_debt: None,
        }
    }

    pub(crate) fn with_max_debt(mut self, max_debt: Option<u64>) -> Self {
        self.max_debt = max_debt;
        self
    }

    /// The most units a charge may put this policy past empty (`max-debt`; `None`:
    /// unbounded, as envoyproxy/ratelimit, up to [`crate::MAX_DEBT_US`] of refill).
    pub fn max_debt(&self) -> Option<u64> {
        self.max_debt
    }

    /// The algorithm and its parameters.
    pub fn algo(&self) -> &Algo {
        &self.algo
    }

    /// The algorithm's spec name (`gcra`, `limit-req`, ...).
    pub fn name(&self) -> &'static str {
        self.algo.kind().spec_name()
    }

    /// The longest `acquire` may wait, in us (`None`: unbounded).
    pub fn max_wait_us(&self) -> Option<u64> {
        self.max_wait_us
    }

    /// Whether the policy runs in shadow mode (decides and reports, never rejects).
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// The state of a key created at `now` (us).
    pub fn init(&self, now: u64) -> PolicyState {
        let now = now.min(MAX_TIME_US);
        init_state!(self, now; FixedWindow, SlidingLog, SlidingWindow, SlidingWindowWeighted,
            LeakyBucket, Gcra, TokenBucket, SmoothBursty, SmoothWarmup, LimitReq, Shaper, Concurrency)
    }

    /// The [`CheckMode`] an `op` means under this policy (acquire bounded by `max-wait`).
    #[inline]
    pub fn mode(&self, op: Op) -> CheckMode {
        match op {
            Op::Acquire => CheckMode::Acquire {
                max_wait_us: self.max_wait_us,
            },
            // A charge or count has no mode of its own; as a check it is a try.
            Op::Try | Op::Charge | Op::Count => CheckMode::Try,
        }
    }

    /// Applies shadow mode to a decision of this policy's algorithm: a reject becomes
    /// an admission flagged `shadow_rejected`.
    #[inline]
    pub fn shadowed(&self, mut d: Decision) -> Decision {
        if self.shadow && !d.allowed {
            d.allowed = true;
            d.shadow_rejected = true;
        }
        d
    }

    /// Decides a request of `cost` (>= 1) at `now` (us) and applies it if admitted;
    /// for [`Op::Charge`] and [`Op::Count`], see [`Policy::charge`] and
    /// [`Policy::count`] (a cost of 0 is allowed there).
    pub fn check(
        &self,
        state: &mut PolicyState,
        now: u64,
        cost: u64,
        op: Op,
    ) -> Result<Decision, CheckError> {
        match op {
            Op::Charge => return self.charge(state, now, cost),
            Op::Count => return self.count(state, now, cost),
            Op::Try | Op::Acquire => {}
        }
        let d = self.check_mode(state, now, cost, self.mode(op))?;
        Ok(self.shadowed(d))
    }

    /// The algorithm's own decision for `mode`, without this policy's `max-wait` and
    /// shadow mode: the building block of rule sets and stores.
    pub fn check_mode(
        &self,
        state: &mut PolicyState,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<Decision, CheckError> {
        let now = now.min(MAX_TIME_US);
        dispatch!(self, state, now, |a, s| a.check(s, now, cost, mode))
    }

    /// Like [`Policy::check`]; for `concurrency`, an admitted request holds its permits
    /// for `hold_us` and then releases them by itself. Other algorithms ignore `hold_us`.
    pub fn check_hold(
        &self,
        state: &mut PolicyState,
        now: u64,
        cost: u64,
        hold_us: Option<u64>,
        op: Op,
    ) -> Result<Decision, CheckError> {
        let now = now.min(MAX_TIME_US);
        if op.charges() {
            return self.check(state, now, cost, op);
        }
        if let (Algo::Concurrency(a), PolicyState::Concurrency(s)) = (&self.algo, &mut *state) {
            let d = a.check_hold(s, now, cost, hold_us, self.mode(op))?;
            return Ok(self.shadowed(d));
        }
        self.check(state, now, cost, op)
    }

    /// The decision a try of `cost` would get now, changing nothing. A cost of 0 is a
    /// look at the state as it stands (Envoy's `hits_addend: 0`): admitted, with the
    /// `remaining` and `reset_after` of now, as [`Policy::status`].
    pub fn peek(&self, state: &PolicyState, now: u64, cost: u64) -> Result<Decision, CheckError> {
        if cost == 0 {
            return Ok(self.status(state, now));
        }
        let mut copy = state.clone();
        self.check(&mut copy, now, cost, Op::Try)
    }

    /// The state as it stands at `now`, as a decision that counts nothing: admitted,
    /// `remaining` unit requests a try would admit in a row now, `reset_after` until
    /// the state is whole.
    pub fn status(&self, state: &PolicyState, now: u64) -> Decision {
        Decision::admitted(
            self.limit(),
            self.remaining(state, now),
            self.reset_after(state, now),
            0,
        )
    }

    /// Charges `cost` units of work already done (see [`Algorithm::charge`]): no limit
    /// test, so the state may go into debt, up to `max-debt`. The decision is always
    /// admitted; `remaining` is 0 while in debt, `retry_after` the time until a unit
    /// request fits again (absent when one fits now), `reset_after` until the state
    /// is whole; `capped` when `max-debt` cut the charge. A cost of 0 changes nothing.
    ///
    /// ```
    /// use tollgate_core::Policy;
    /// let p: Policy = "fixed-window:limit=10000,window=1m".parse().unwrap();
    /// let mut s = p.init(0);
    /// // A 12,000-token completion reported after the fact: 2,000 tokens of debt.
    /// let d = p.charge(&mut s, 5_000_000, 12_000).unwrap();
    /// assert!(d.allowed && !d.capped);
    /// assert_eq!(d.remaining, 0);
    /// assert_eq!(d.retry_after_us, Some(55_000_000)); // paid back when the window ends
    /// ```
    pub fn charge(
        &self,
        state: &mut PolicyState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        let now = now.min(MAX_TIME_US);
        let max_debt = self.max_debt.unwrap_or(u64::MAX);
        let charged = dispatch!(self, state, now, |a, s| a.charge(s, now, cost, max_debt))?;
        let mut d = self.status(state, now);
        d.capped = charged < cost;
        if d.remaining == 0 {
            let probe = self.check_mode(&mut state.clone(), now, 1, CheckMode::Try)?;
            d.retry_after_us = probe.retry_after_us.or(Some(probe.wait_us));
        }
        Ok(d)
    }

    /// Whether an admitted try may carry a `wait` the caller must sleep before the
    /// work: `shaper` (its release schedule) and `limit-req` delaying some excess
    /// (`delay` below `burst`; not `nodelay`). For such a policy a plain "is it
    /// allowed?" paces nothing, so the library's `check` refuses it and points to
    /// `acquire`.
    ///
    /// ```
    /// use tollgate_core::Policy;
    /// let paces = |s: &str| s.parse::<Policy>().unwrap().paces();
    /// assert!(paces("shaper:rate=5/s,queue=10"));
    /// assert!(paces("limit-req:rate=5/s,burst=10"));
    /// assert!(!paces("limit-req:rate=5/s,burst=10,nodelay"));
    /// assert!(!paces("limit-req:rate=5/s,burst=10,delay=10"));
    /// assert!(!paces("gcra:rate=5/s,burst=10"));
    /// ```
    pub fn paces(&self) -> bool {
        match &self.algo {
            Algo::Shaper(_) => true,
            Algo::LimitReq(a) => match a.delay() {
                crate::algorithms::Delay::All => a.burst() > 0,
                crate::algorithms::Delay::After(n) => n < a.burst(),
                crate::algorithms::Delay::Never => false,
            },
            _ => false,
        }
    }

    /// Whether a charge means something for this policy: `Err(NotChargeable)` for
    /// `shaper` and `concurrency` (what every caller of [`Policy::charge`] checks
    /// before it accepts a configuration).
    pub fn chargeable(&self) -> Result<(), CheckError> {
        self.charge(&mut self.init(0), 0, 0).map(drop)
    }

    /// The debt a charge may leave under this policy, in units: `max-debt` (unbounded
    /// when absent) within the algorithm's bounds (see [`Algorithm::debt_cap`]).
    pub fn debt_cap(&self) -> u64 {
        let max_debt = self.max_debt.unwrap_or(u64::MAX);
        match &self.algo {
            Algo::FixedWindow(a) => a.debt_cap(max_debt),
            Algo::SlidingLog(a) => a.debt_cap(max_debt),
            Algo::SlidingWindow(a) => a.debt_cap(max_debt),
            Algo::SlidingWindowWeighted(a) => a.debt_cap(max_debt),
            Algo::LeakyBucket(a) => a.debt_cap(max_debt),
            Algo::Gcra(a) => a.debt_cap(max_debt),
            Algo::TokenBucket(a) => a.debt_cap(max_debt),
            Algo::SmoothBursty(a) | Algo::SmoothWarmup(a) => a.debt_cap(max_debt),
            Algo::LimitReq(a) => a.debt_cap(max_debt),
            Algo::Shaper(_) | Algo::Concurrency(_) => 0,
        }
    }

    /// Envoy's counting (envoyproxy/ratelimit's `INCRBY` before the comparison): the
    /// `cost` is charged whatever the answer (a [`Policy::charge`], so `max-debt`
    /// applies), and the answer is the one a try would have had on the state before.
    /// A caller over the limit stays over it until the debt is paid back; a count of
    /// 0 (Envoy's `hits_addend: 0`) is rejected while the key is past its limit (see
    /// [`Policy::over_limit`]). A rejected count's `retry_after` is when a unit
    /// request fits again.
    pub fn count(
        &self,
        state: &mut PolicyState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        let verdict = if cost == 0 {
            let mut d = self.status(state, now);
            d.allowed = !self.over_limit(state, now);
            self.shadowed(d)
        } else {
            match self.peek(state, now, cost) {
                Err(CheckError::InsufficientCapacity { .. }) => {
                    self.shadowed(Decision::rejected(self.limit(), 0, 0, None))
                }
                other => other?,
            }
        };
        let c = self.charge(state, now, cost)?;
        Ok(Decision::counted(verdict, c))
    }

    /// Whether `state` is past the limit at `now` (in debt): not merely at it, but
    /// still with nothing left if one unit were given back. envoyproxy/ratelimit's
    /// "count > limit".
    pub fn over_limit(&self, state: &PolicyState, now: u64) -> bool {
        if self.remaining(state, now) > 0 {
            return false;
        }
        let mut less = state.clone();
        self.refund(&mut less, now, 1);
        self.remaining(&less, now) == 0
    }

    /// Gives back `cost` units admitted earlier; never beyond full capacity.
    pub fn refund(&self, state: &mut PolicyState, now: u64, cost: u64) {
        let now = now.min(MAX_TIME_US);
        dispatch!(self, state, now, |a, s| a.refund(s, now, cost))
    }

    /// Unit requests a try would admit in a row at `now`, changing nothing.
    pub fn remaining(&self, state: &PolicyState, now: u64) -> u64 {
        let now = now.min(MAX_TIME_US);
        dispatch_ref!(self, state, self.limit(), |a, s| a.remaining(s, now))
    }

    /// Time from `now` until `state` is fully replenished, in us.
    pub fn reset_after(&self, state: &PolicyState, now: u64) -> u64 {
        let now = now.min(MAX_TIME_US);
        dispatch_ref!(self, state, 0, |a, s| a.reset_after(s, now))
    }

    /// Whether `state` is fully replenished at `now` (a store may drop it).
    pub fn idle(&self, state: &PolicyState, now: u64) -> bool {
        let now = now.min(MAX_TIME_US);
        // A state of another algorithm decides nothing under this policy.
        dispatch_ref!(self, state, true, |a, s| a.idle(s, now))
    }

    /// When the key was last active, in us (for least-recently-used eviction).
    pub fn last_active(&self, state: &PolicyState) -> u64 {
        dispatch_ref!(self, state, 0, |a, s| a.last_active(s))
    }

    /// Carries a key's `state`, kept under the `old` policy, over to this policy at
    /// `now` (a policy changed at run time). What carries over:
    ///
    /// * GCRA to GCRA: the TAT (converted between tick units), so a key keeps its debt;
    /// * the same algorithm with the same time units (window, bucket width, or rate for
    ///   the buckets and the shaper): the state as is, e.g. a fixed window keeps its
    ///   count under a new limit;
    /// * `sliding-log`, `limit-req` and `concurrency`: always (timestamps, excess and
    ///   held permits keep their meaning);
    /// * smooth limiters: as Guava's `setRate` does (stored permits scaled to the new
    ///   maximum, the next free ticket kept);
    /// * anything else: a fresh state.
    pub fn carry_over(&self, old: &Policy, state: PolicyState, now: u64) -> PolicyState {
        let now = now.min(MAX_TIME_US);
        match (&old.algo, &self.algo, state) {
            (Algo::Gcra(o), Algo::Gcra(n), PolicyState::Gcra(s)) => {
                let (os, ns) = (u128::from(o.rate().scale()), u128::from(n.rate().scale()));
                let tat = u128::from(s.tat).div_ceil(os) * ns;
                PolicyState::Gcra(GcraState {
                    tat: u64::try_from(tat).unwrap_or(u64::MAX),
                })
            }
            (Algo::SlidingLog(_), Algo::SlidingLog(_), s @ PolicyState::SlidingLog(_))
            | (Algo::LimitReq(_), Algo::LimitReq(_), s @ PolicyState::LimitReq(_))
            | (Algo::Concurrency(_), Algo::Concurrency(_), s @ PolicyState::Concurrency(_)) => s,
            (Algo::FixedWindow(o), Algo::FixedWindow(n), s @ PolicyState::FixedWindow(_))
                if o.window_us() == n.window_us() && o.align() == n.align() =>
            {
                s
            }
            (Algo::SlidingWindow(o), Algo::SlidingWindow(n), s @ PolicyState::SlidingWindow(_))
                if o.window_us() == n.window_us() && o.buckets() == n.buckets() =>
            {
                s
            }
            (
                Algo::SlidingWindowWeighted(o),
                Algo::SlidingWindowWeighted(n),
                s @ PolicyState::SlidingWindowWeighted(_),
            ) if o.window_us() == n.window_us() => s,
            (Algo::TokenBucket(o), Algo::TokenBucket(n), s @ PolicyState::TokenBucket(_))
                if o.rate() == n.rate() =>
            {
                s
            }
            (Algo::LeakyBucket(o), Algo::LeakyBucket(n), s @ PolicyState::LeakyBucket(_))
                if o.rate() == n.rate() =>
            {
                s
            }
            (Algo::Shaper(o), Algo::Shaper(n), s @ PolicyState::Shaper(_))
                if o.rate() == n.rate() =>
            {
                s
            }
            (Algo::SmoothBursty(o), Algo::SmoothBursty(n), PolicyState::SmoothBursty(s)) => {
                PolicyState::SmoothBursty(n.carry_over(o, s, now))
            }
            (Algo::SmoothWarmup(o), Algo::SmoothWarmup(n), PolicyState::SmoothWarmup(s)) => {
                PolicyState::SmoothWarmup(n.carry_over(o, s, now))
            }
            _ => self.init(now),
        }
    }

    /// This policy's share for one of `n` instances that split a global limit: every
    /// rate divided by `n` exactly, every count (burst, capacity, limit, queue)
    /// divided by `n` rounded down (at least 1; `limit-req`'s burst and delay may be
    /// 0), so that `n` shares together never admit more than the whole.
    ///
    /// ```
    /// use tollgate_core::Policy;
    /// let p: Policy = "gcra:rate=100/s,burst=20".parse().unwrap();
    /// // 100 per 4 s is 25/s, kept as an exact fraction.
    /// assert_eq!(p.share(4).unwrap().to_string(), "gcra:rate=100/4s,burst=5");
    /// ```
    pub fn share(&self, n: u64) -> Result<Policy, String> {
        if n <= 1 {
            return Ok(self.clone());
        }
        let part = |x: u64| (x / n).max(1);
        let rate = |r: crate::Rate| {
            let period = r
                .period_us
                .checked_mul(n)
                .ok_or_else(|| format!("rate {r} divided by {n} is too slow"))?;
            crate::Rate::new(r.count, period)
        };
        let algo = match &self.algo {
            Algo::FixedWindow(a) => Algo::FixedWindow(FixedWindow::new(
                part(a.limit_per_window()),
                a.window_us(),
                a.align(),
            )?),
            Algo::SlidingLog(a) => {
                Algo::SlidingLog(SlidingLog::new(part(a.limit_per_window()), a.window_us())?)
            }
            Algo::SlidingWindow(a) => Algo::SlidingWindow(SlidingWindow::new(
                part(a.limit_per_window()),
                a.window_us(),
                a.buckets(),
            )?),
            Algo::SlidingWindowWeighted(a) => Algo::SlidingWindowWeighted(
                SlidingWindowWeighted::new(part(a.limit_per_window()), a.window_us())?,
            ),
            Algo::LeakyBucket(a) => {
                Algo::LeakyBucket(LeakyBucket::new(rate(a.rate())?, part(a.capacity_units()))?)
            }
            Algo::Gcra(a) => Algo::Gcra(Gcra::new(rate(a.rate())?, part(a.burst()))?),
            Algo::TokenBucket(a) => Algo::TokenBucket(TokenBucket::new(
                rate(a.rate())?,
                part(a.capacity_tokens()),
            )?),
            Algo::SmoothBursty(a) => Algo::SmoothBursty(Smooth::new(rate(a.rate())?, a.kind())?),
            Algo::SmoothWarmup(a) => Algo::SmoothWarmup(Smooth::new(rate(a.rate())?, a.kind())?),
            Algo::LimitReq(a) => {
                let delay = match a.delay() {
                    Delay::After(k) => Delay::After(k / n),
                    d => d,
                };
                Algo::LimitReq(LimitReq::new(rate(a.rate())?, a.burst() / n, delay)?)
            }
            Algo::Shaper(a) => Algo::Shaper(Shaper::new(rate(a.rate())?, a.queue() / n)?),
            Algo::Concurrency(a) => Algo::Concurrency(Concurrency::new(part(a.limit()))?),
        };
        Ok(Policy::from_parts(algo, self.max_wait_us, self.shadow)
            .with_max_debt(self.max_debt.map(part)))
    }

    /// Forgets a key's state: it becomes as new at `now`.
    pub fn reset(&self, state: &mut PolicyState, now: u64) {
        *state = self.init(now);
    }

    /// The time the headline limit refers to, in us: the window of window-based
    /// algorithms; for the others, how long an empty state takes to refill completely
    /// (GCRA's `burst * T`, a bucket's `capacity * T`, Guava's max-burst or warm-up).
    /// Zero for `concurrency`. Used for `RateLimit-Policy`'s `w`.
    pub fn window_us(&self) -> u64 {
        let per = |n: u64, r: crate::Rate| {
            (u128::from(n) * u128::from(r.period_us)).div_ceil(u128::from(r.count))
        };
        let us = match &self.algo {
            Algo::FixedWindow(a) => a.window_us().into(),
            Algo::SlidingLog(a) => a.window_us().into(),
            Algo::SlidingWindow(a) => a.window_us().into(),
            Algo::SlidingWindowWeighted(a) => a.window_us().into(),
            Algo::Gcra(a) => per(a.burst(), a.rate()),
            Algo::TokenBucket(a) => per(a.capacity_tokens(), a.rate()),
            Algo::LeakyBucket(a) => per(a.capacity_units(), a.rate()),
            Algo::SmoothBursty(a) | Algo::SmoothWarmup(a) => match a.kind() {
                SmoothKind::Bursty { max_burst_us } => max_burst_us.into(),
                SmoothKind::WarmingUp { warmup_us, .. } => warmup_us.into(),
            },
            Algo::LimitReq(a) => {
                (u128::from(a.burst() + 1) * 1_000_000_000).div_ceil(u128::from(a.rate_milli()))
            }
            Algo::Shaper(a) => per(a.queue() + 1, a.rate()),
            Algo::Concurrency(_) => 0,
        };
        u64::try_from(us).unwrap_or(u64::MAX)
    }

    /// The headline limit ([`Decision::limit`]).
    pub fn limit(&self) -> u64 {
        match &self.algo {
            Algo::FixedWindow(a) => a.limit(),
            Algo::SlidingLog(a) => a.limit(),
            Algo::SlidingWindow(a) => a.limit(),
            Algo::SlidingWindowWeighted(a) => a.limit(),
            Algo::LeakyBucket(a) => a.limit(),
            Algo::Gcra(a) => a.limit(),
            Algo::TokenBucket(a) => a.limit(),
            Algo::SmoothBursty(a) | Algo::SmoothWarmup(a) => a.limit(),
            Algo::LimitReq(a) => a.limit(),
            Algo::Shaper(a) => a.limit(),
            Algo::Concurrency(a) => a.limit(),
        }
    }
}
