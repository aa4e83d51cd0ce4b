//! [`Policy`]: any algorithm plus the options every policy has, behind one type, as
//! parsed from a spec. Stores and servers hold `Policy` + [`PolicyState`].

use crate::algorithm::CheckMode;
use crate::decision::{CheckError, Decision};
pub use crate::list::{AnyAlgorithm, PolicyState};
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
/// assert!(err.to_string().contains("unknown parameter 'brust' (expected one of: rate, burst, max-wait, shadow, max-debt, margin)"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    algo: AnyAlgorithm,
    max_wait_us: Option<u64>,
    shadow: bool,
    max_debt: Option<u64>,
}

impl Policy {
    pub(crate) fn from_parts(algo: AnyAlgorithm, max_wait_us: Option<u64>, shadow: bool) -> Self {
        Policy {
            algo,
            max_wait_us,
            shadow,
            max_debt: None,
        }
    }

    pub(crate) fn max_debt_set(mut self, max_debt: Option<u64>) -> Self {
        self.max_debt = max_debt;
        self
    }

    /// The most units a charge may put this policy past empty (`max-debt`; `None`:
    /// unbounded, as envoyproxy/ratelimit, up to [`crate::MAX_DEBT_US`] of refill).
    pub fn max_debt(&self) -> Option<u64> {
        self.max_debt
    }

    /// The algorithm and its parameters.
    pub fn algorithm(&self) -> &AnyAlgorithm {
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
        self.algo.init(now.min(MAX_TIME_US))
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
        self.algo.check(state, now, cost, mode)
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
        if let (AnyAlgorithm::Concurrency(a), PolicyState::Concurrency(s)) =
            (&self.algo, &mut *state)
        {
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

    /// Charges `cost` units of work already done (see [`crate::Algorithm::charge`]): no limit
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
        let charged = self.algo.charge(state, now, cost, max_debt)?;
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
        self.algo.paces()
    }

    /// Whether a charge means something for this policy: `Err(NotChargeable)` for
    /// `shaper` and `concurrency` (what every caller of [`Policy::charge`] checks
    /// before it accepts a configuration).
    pub fn chargeable(&self) -> Result<(), CheckError> {
        self.charge(&mut self.init(0), 0, 0).map(drop)
    }

    /// Whether a charge's debt stays until the policy's own rate has paid it back. Not
    /// so where time alone forgets it: a sliding window or log drops a charge once it
    /// leaves the window, however far past the limit it went, and a `fixed-window`
    /// with `debt=forgive` starts each window from 0. A budget of work done (LLM
    /// tokens) wants one that keeps its debt.
    ///
    /// ```
    /// use tollgate_core::Policy;
    /// let keeps = |s: &str| s.parse::<Policy>().unwrap().keeps_debt();
    /// assert!(keeps("token-bucket:rate=40000/m,capacity=40000"));
    /// assert!(keeps("fixed-window:limit=40000,window=1m"));
    /// assert!(!keeps("fixed-window:limit=40000,window=1m,debt=forgive"));
    /// assert!(!keeps("sliding-window:limit=40000,window=1m"));
    /// ```
    pub fn keeps_debt(&self) -> bool {
        match &self.algo {
            AnyAlgorithm::FixedWindow(a) => a.debt() == crate::algorithms::Debt::Carry,
            AnyAlgorithm::SlidingLog(_)
            | AnyAlgorithm::SlidingWindow(_)
            | AnyAlgorithm::SlidingWindowWeighted(_) => false,
            _ => true,
        }
    }

    /// The debt a charge may leave under this policy, in units: `max-debt` (unbounded
    /// when absent) within the algorithm's bounds (see [`crate::Algorithm::debt_cap`]).
    pub fn debt_cap(&self) -> u64 {
        self.algo.debt_cap(self.max_debt.unwrap_or(u64::MAX))
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
        self.algo.refund(state, now, cost)
    }

    /// Unit requests a try would admit in a row at `now`, changing nothing.
    pub fn remaining(&self, state: &PolicyState, now: u64) -> u64 {
        let now = now.min(MAX_TIME_US);
        (self.algo.remaining(state, now)).unwrap_or_else(|| self.limit())
    }

    /// Time from `now` until `state` is fully replenished, in us.
    pub fn reset_after(&self, state: &PolicyState, now: u64) -> u64 {
        let now = now.min(MAX_TIME_US);
        self.algo.reset_after(state, now).unwrap_or(0)
    }

    /// Whether `state` is fully replenished at `now` (a store may drop it).
    pub fn idle(&self, state: &PolicyState, now: u64) -> bool {
        let now = now.min(MAX_TIME_US);
        // A state of another algorithm decides nothing under this policy.
        self.algo.idle(state, now).unwrap_or(true)
    }

    /// When the key was last active, in us (for least-recently-used eviction).
    pub fn last_active(&self, state: &PolicyState) -> u64 {
        self.algo.last_active(state).unwrap_or(0)
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
        (self.algo.carry_over(&old.algo, state, now)).unwrap_or_else(|| self.init(now))
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
        let algo = self.algo.share(n)?;
        Ok(Policy::from_parts(algo, self.max_wait_us, self.shadow)
            .max_debt_set(self.max_debt.map(|d| crate::params::share_count(d, n))))
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
        self.algo.window_us()
    }

    /// The headline limit ([`Decision::limit`]).
    pub fn limit(&self) -> u64 {
        self.algo.limit()
    }

    /// What the policy promises: the most units it admits, by admission time
    /// (arrival plus any wait), in any window of `w_us` microseconds (`[t, t + w)`),
    /// from any state, for any tries and acquires (a charge or a refund may take a
    /// key past it); `None` for `concurrency`, which bounds the work in flight, not
    /// the rate, and for Guava's above a million a second, whose interval truncates
    /// to 0 us. Derived from each algorithm's semantics for unit
    /// requests (Guava's admit a larger request at once and pay it forward, the
    /// shaper releases it at once and spaces the next by its cost: up to its cost
    /// less one more), and reached by some traffic except
    /// where said (a property test holds every algorithm to it on random traffic):
    ///
    /// - `fixed-window`: `limit` times the windows `w` can touch, so up to twice the
    ///   limit across one boundary (`sliding-window` with `mode=weighted` is held to
    ///   the same bound, which its weighting keeps it a little under);
    /// - `sliding-log`: `limit` per started window length, `limit * ceil(w / window)`;
    /// - `sliding-window` with `buckets=K`: `limit` per K buckets `w` touches;
    /// - `gcra`, `token-bucket`, `leaky-bucket`: the burst plus one unit per interval
    ///   after the first, `burst - 1 + ceil(w * rate)`;
    /// - `smooth-bursty`: the stored permits plus one per interval (the first of
    ///   those pays forward); `smooth-warmup`: one per interval (its stored permits
    ///   are never cheaper than the stable rate); the interval truncated to whole us,
    ///   as Guava's arithmetic moves `nextFree`, so `ceil(w / floor(1s / rate))`;
    /// - `limit-req`: `burst + 1` at once plus the leak of the milliseconds `w` spans,
    ///   one more when it delays (a delay is whole ms, truncated, so a request may be
    ///   released up to 1 ms before its exact turn); reached with `nodelay`;
    /// - `shaper`: `ceil(w * rate)` by release time.
    ///
    /// Shadow mode is not considered (it admits everything and reports).
    ///
    /// ```
    /// use tollgate_core::Policy;
    /// let gcra: Policy = "gcra:rate=150/s,burst=50".parse()?;
    /// assert_eq!(gcra.envelope(333_334), Some(100)); // 50 + 50 in a third of a second
    /// let fw: Policy = "fixed-window:limit=150,window=1s".parse()?;
    /// assert_eq!(fw.envelope(1_000_000), Some(300)); // across a window boundary
    /// # Ok::<(), tollgate_core::SpecError>(())
    /// ```
    pub fn envelope(&self, w_us: u64) -> Option<u64> {
        self.algo.envelope(w_us)
    }

    /// [`Policy::envelope`] for requests of cost up to `max_cost`, in units: the
    /// same, except for Guava's and the shaper, which admit a larger request at once
    /// (paying it forward, or spacing the next by its cost) and so may hold up to
    /// `max_cost - 1` units more in a window.
    pub fn envelope_for(&self, w_us: u64, max_cost: u64) -> Option<u64> {
        use crate::AlgorithmKind::*;
        let e = self.envelope(w_us)?;
        Some(match self.algorithm().kind() {
            SmoothBursty | SmoothWarmup | Shaper if e > 0 => {
                e.saturating_add(max_cost.saturating_sub(1))
            }
            _ => e,
        })
    }
}

/// The most units admitted in any window `[x, x + w_us)`, and where the first such
/// window starts, over admissions `(time, units)` sorted by time: what
/// [`Policy::envelope`] bounds (`tollgate simulate` and the property tests measure
/// with it). A window of 0 us holds nothing.
///
/// ```
/// use tollgate_core::densest_window;
/// let admitted = [(0, 1), (400, 2), (900, 1), (1_500, 1)];
/// assert_eq!(densest_window(&admitted, 1_000), (4, 0));
/// assert_eq!(densest_window(&admitted, 400), (2, 400)); // 0 and 400 are 400 us apart
/// ```
pub fn densest_window(admitted: &[(u64, u64)], w_us: u64) -> (u64, u64) {
    if w_us == 0 {
        return (0, 0);
    }
    let (mut lo, mut units, mut best, mut start) = (0, 0u64, 0u64, 0u64);
    for hi in 0..admitted.len() {
        units += admitted[hi].1;
        while admitted[hi].0 - admitted[lo].0 >= w_us {
            units -= admitted[lo].1;
            lo += 1;
        }
        if units > best {
            best = units;
            start = admitted[lo].0;
        }
    }
    (best, start)
}
