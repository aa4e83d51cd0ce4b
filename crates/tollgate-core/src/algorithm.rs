//! The interface every algorithm implements, and the shared try/acquire logic of the
//! algorithms whose decision is "the earliest instant at which the request fits".

use crate::decision::{CheckError, Decision};

/// What a check asks of an algorithm's state machine: a try, or an acquire bounded by
/// a wait. A caller asks a [`Policy`](crate::Policy) for an [`Op`](crate::Op) (try,
/// acquire, charge, Envoy's count); the policy turns it into this mode, with its own
/// `max-wait` ([`Policy::mode`](crate::Policy::mode)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckMode {
    /// Admit now or reject. Never waits, except that `limit-req`'s delay and
    /// `shaper`'s schedule are part of their decision (carried in `Decision::wait`).
    Try,
    /// Reserve the earliest admissible instant at or after now, behind every earlier
    /// reservation of the same key (FIFO). If the wait would exceed `max_wait_us`, the
    /// request is rejected at once and reserves nothing. `None`: unbounded.
    Acquire {
        /// The longest acceptable wait, in microseconds.
        max_wait_us: Option<u64>,
    },
}

/// A rate-limiting algorithm: a deterministic state machine over time.
///
/// `Self` holds the (immutable, validated) parameters; `State` is one key's state.
/// Every method takes `now` in microseconds of the caller's clock, below
/// [`crate::MAX_TIME_US`]. A `now` earlier than a previous one is treated as "no time
/// passed", never as time travel.
pub trait Algorithm {
    /// One key's state.
    type State: Clone + std::fmt::Debug + Send + Sync;

    /// The state of a key created at `now`.
    fn init(&self, now: u64) -> Self::State;

    /// Decides a request of `cost` (>= 1) arriving at `now`, applying it if admitted.
    fn check(
        &self,
        state: &mut Self::State,
        now: u64,
        cost: u64,
        mode: CheckMode,
    ) -> Result<Decision, CheckError>;

    /// The decision a `CheckMode::Try` request would get now, changing nothing.
    fn peek(&self, state: &Self::State, now: u64, cost: u64) -> Result<Decision, CheckError> {
        self.check(&mut state.clone(), now, cost, CheckMode::Try)
    }

    /// Gives back `cost` units admitted earlier (e.g. the downstream call failed).
    /// Never fills beyond full capacity; a no-op on a fully replenished state.
    fn refund(&self, state: &mut Self::State, now: u64, cost: u64);

    /// Charges `cost` units of work already done, unconditionally: no limit test, so
    /// the state may go into debt (past the limit), but never more than `max_debt`
    /// units past empty (nor more than [`crate::MAX_DEBT_US`] of refill). Returns the
    /// units charged: `cost`, or fewer where the cap binds. A cost of 0 changes
    /// nothing. `shaper` and `concurrency` refuse ([`CheckError::NotChargeable`]): a
    /// charge has no meaning for a queue or a permit.
    fn charge(
        &self,
        state: &mut Self::State,
        now: u64,
        cost: u64,
        max_debt: u64,
    ) -> Result<u64, CheckError>;

    /// The debt a charge may leave, in units, under a `max_debt` of `max_debt`: that,
    /// bounded by [`crate::MAX_COUNT`] and by [`crate::MAX_DEBT_US`] of refill (what
    /// [`Algorithm::charge`] applies; the Redis scripts receive it ready-made).
    fn debt_cap(&self, max_debt: u64) -> u64 {
        max_debt.min(crate::MAX_COUNT)
    }

    /// The headline limit reported in every [`Decision::limit`].
    fn limit(&self) -> u64;

    /// The time the headline limit refers to, in us: the window of the window
    /// algorithms; for the others, how long an empty state takes to refill
    /// completely (GCRA's `burst * T`, a bucket's `capacity * T`, Guava's max-burst or
    /// warm-up); 0 for `concurrency`. `RateLimit-Policy`'s `w`.
    fn window_us(&self) -> u64;

    /// Whether an admitted try may carry a `wait` the caller must sleep before the
    /// work (`shaper`; `limit-req` delaying some excess).
    fn paces(&self) -> bool {
        false
    }

    /// Unit requests a try would admit in a row at `now` (see [`Decision::remaining`]).
    fn remaining(&self, state: &Self::State, now: u64) -> u64;

    /// Time from `now` until the state is fully replenished.
    fn reset_after(&self, state: &Self::State, now: u64) -> u64;

    /// Whether the state is fully replenished at `now`, so that a store may drop it
    /// and start the key afresh later (see each algorithm for the fine print).
    fn idle(&self, state: &Self::State, now: u64) -> bool;

    /// When the key was last active, in us: the order of least-recently-used
    /// eviction. Read from the state's own timestamps, so it costs no memory.
    fn last_active(&self, state: &Self::State) -> u64;
}

/// The algorithms whose semantics are "admit at the earliest instant the request
/// fits": everything they decide follows from these five functions.
pub(crate) trait Schedule {
    type State;
    /// The state of a new key.
    fn fresh(&self) -> Self::State;
    /// The largest cost that can ever be admitted.
    fn capacity(&self) -> u64;
    /// The earliest instant >= `now` (and behind earlier reservations) at which a
    /// request of `cost` <= capacity fits.
    fn earliest(&self, s: &Self::State, now: u64, cost: u64) -> u64;
    /// Records a request of `cost` that arrived at `now` and is admitted at `at`
    /// (the result of `earliest`; later than `now` for a reservation).
    fn admit(&self, s: &mut Self::State, now: u64, at: u64, cost: u64);
    /// Unit requests that fit at `now`.
    fn remaining(&self, s: &Self::State, now: u64) -> u64;
    /// Time from `now` until the state is as good as new.
    fn reset_after(&self, s: &Self::State, now: u64) -> u64;
    /// When the key was last active (see [`Algorithm::last_active`]).
    fn last_active(&self, s: &Self::State) -> u64;
    /// Drops what can no longer matter at `now` (expired log entries). Optional.
    fn expire(&self, _s: &mut Self::State, _now: u64) {}
    /// Units a charge at `at` may add before the state is `debt` units past empty;
    /// `debt` is already [`Schedule::debt_cap`]ped.
    fn room(&self, s: &Self::State, at: u64, debt: u64) -> u64;
    /// See [`Algorithm::debt_cap`].
    fn debt_cap(&self, max_debt: u64) -> u64 {
        max_debt.min(crate::MAX_COUNT)
    }
    /// The instant a charge arriving at `now` is recorded at: `now`, or the latest
    /// instant the state already holds (a reservation), so that a charge never goes
    /// behind one.
    fn charge_at(&self, _s: &Self::State, now: u64) -> u64 {
        now
    }
    /// The headline limit.
    fn headline(&self) -> u64 {
        self.capacity()
    }
    /// The time the headline limit refers to ([`Algorithm::window_us`]).
    fn window(&self) -> u64;
}

/// Try and acquire for a [`Schedule`].
#[inline]
pub(crate) fn check_schedule<A: Schedule>(
    alg: &A,
    s: &mut A::State,
    now: u64,
    cost: u64,
    mode: CheckMode,
) -> Result<Decision, CheckError> {
    check_cost(cost, alg.capacity())?;
    alg.expire(s, now);
    let at = alg.earliest(s, now, cost).max(now);
    let wait = at - now;
    if fits(wait, mode) {
        alg.admit(s, now, at, cost);
        Ok(Decision::admitted(
            alg.headline(),
            alg.remaining(s, now),
            alg.reset_after(s, now),
            wait,
        ))
    } else {
        Ok(Decision::rejected(
            alg.headline(),
            alg.remaining(s, now),
            alg.reset_after(s, now),
            Some(wait),
        ))
    }
}

/// A charge for a [`Schedule`]: what fits before the debt cap, admitted at
/// [`Schedule::charge_at`] without a limit test.
#[inline]
pub(crate) fn charge_schedule<A: Schedule>(
    alg: &A,
    s: &mut A::State,
    now: u64,
    cost: u64,
    max_debt: u64,
) -> u64 {
    if cost == 0 {
        return 0;
    }
    alg.expire(s, now);
    let at = alg.charge_at(s, now).max(now);
    let charged = cost.min(alg.room(s, at, alg.debt_cap(max_debt)));
    if charged > 0 {
        alg.admit(s, now, at, charged);
    }
    charged
}

/// The most units of debt whose ticks (`per_unit` each) stay below 2^52: a state the
/// Redis scripts keep exactly in doubles, and far from i64's end in memory (rates
/// kept in fine ticks would otherwise reach both before MAX_DEBT_US of refill).
#[inline]
pub(crate) fn exact_units(per_unit: u128) -> u64 {
    u64::try_from((1u128 << 52) / per_unit.max(1)).unwrap_or(u64::MAX)
}

/// The debt cap of a rate-based algorithm in its own units: `max_debt`, but no more
/// units than [`crate::MAX_DEBT_US`] of refill at `per_unit` ticks per unit and
/// `per_us` ticks per microsecond.
#[inline]
pub(crate) fn debt_units(max_debt: u64, per_unit: u128, per_us: u128) -> u64 {
    let refill = u128::from(crate::MAX_DEBT_US) * per_us / per_unit;
    max_debt
        .min(crate::MAX_COUNT)
        .min(u64::try_from(refill).unwrap_or(u64::MAX))
}

/// Whether a request whose earliest admission is `wait` from now is admitted.
#[inline]
pub(crate) fn fits(wait: u64, mode: CheckMode) -> bool {
    match mode {
        CheckMode::Try => wait == 0,
        CheckMode::Acquire { max_wait_us } => max_wait_us.is_none_or(|m| wait <= m),
    }
}

#[inline]
pub(crate) fn check_cost(cost: u64, capacity: u64) -> Result<(), CheckError> {
    if cost == 0 {
        return Err(CheckError::ZeroCost);
    }
    if cost > capacity {
        return Err(CheckError::InsufficientCapacity { cost, capacity });
    }
    Ok(())
}

/// Implements [`Algorithm`] for a type that implements [`Schedule`].
macro_rules! schedule_algorithm {
    ($ty:ty, $state:ty) => {
        impl $crate::algorithm::Algorithm for $ty {
            type State = $state;
            #[inline]
            fn init(&self, _now: u64) -> Self::State {
                $crate::algorithm::Schedule::fresh(self)
            }
            #[inline]
            fn check(
                &self,
                state: &mut Self::State,
                now: u64,
                cost: u64,
                mode: $crate::algorithm::CheckMode,
            ) -> Result<$crate::decision::Decision, $crate::decision::CheckError> {
                $crate::algorithm::check_schedule(self, state, now, cost, mode)
            }
            fn charge(
                &self,
                state: &mut Self::State,
                now: u64,
                cost: u64,
                max_debt: u64,
            ) -> Result<u64, $crate::decision::CheckError> {
                Ok($crate::algorithm::charge_schedule(
                    self, state, now, cost, max_debt,
                ))
            }
            fn debt_cap(&self, max_debt: u64) -> u64 {
                $crate::algorithm::Schedule::debt_cap(self, max_debt)
            }
            fn refund(&self, state: &mut Self::State, now: u64, cost: u64) {
                self.give_back(state, now, cost)
            }
            fn limit(&self) -> u64 {
                $crate::algorithm::Schedule::headline(self)
            }
            fn window_us(&self) -> u64 {
                $crate::algorithm::Schedule::window(self)
            }
            fn remaining(&self, state: &Self::State, now: u64) -> u64 {
                $crate::algorithm::Schedule::remaining(self, state, now)
            }
            fn reset_after(&self, state: &Self::State, now: u64) -> u64 {
                $crate::algorithm::Schedule::reset_after(self, state, now)
            }
            fn idle(&self, state: &Self::State, now: u64) -> bool {
                $crate::algorithm::Schedule::reset_after(self, state, now) == 0
            }
            fn last_active(&self, state: &Self::State) -> u64 {
                $crate::algorithm::Schedule::last_active(self, state)
            }
        }
    };
}
pub(crate) use schedule_algorithm;
