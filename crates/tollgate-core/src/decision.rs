//! The answer to every check.

use std::time::Duration;

/// The outcome of one check (try, acquire or peek) of one policy.
///
/// Durations are whole microseconds from the request's arrival (the `_us` fields);
/// the methods without the suffix give them as [`Duration`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a Decision says whether the request may proceed: read `allowed` (and `wait`), or use `into_result`"]
pub struct Decision {
    /// Whether the request is admitted. A policy with `shadow=true` always admits; see
    /// [`Decision::shadow_rejected`].
    pub allowed: bool,
    /// True when the policy rejected the request but runs in shadow mode, so
    /// `allowed` is true and nothing was consumed.
    pub shadow_rejected: bool,
    /// The policy's headline limit: the most unit-cost requests an idle, fully
    /// replenished key admits at one instant (for `concurrency`, the permits; for
    /// `shaper`, the queue length plus one).
    pub limit: u64,
    /// Unit-cost requests that would still be admitted right now, after this decision.
    pub remaining: u64,
    /// Time until the key's state is fully replenished (as if never used).
    pub reset_after_us: u64,
    /// On a reject: the earliest time from now at which the same request could be
    /// admitted; `None` if no amount of waiting is known to help (e.g. a concurrency
    /// limit held by permits with no known release time).
    pub retry_after_us: Option<u64>,
    /// Time from arrival to admission: the wait of an admitted `acquire`, the delay of
    /// `limit-req`, the schedule of `shaper`. Zero on a reject.
    pub wait_us: u64,
    /// For a charge: fewer units than asked were charged — the policy's `max-debt`
    /// capped it, or, without one, the most a state counts (2^40 units, the exact
    /// range shared with the Redis scripts). Always false for other operations.
    pub capped: bool,
}

impl Decision {
    /// An admitted request.
    #[inline]
    pub fn admitted(limit: u64, remaining: u64, reset_after_us: u64, wait_us: u64) -> Self {
        Decision {
            allowed: true,
            shadow_rejected: false,
            limit,
            remaining,
            reset_after_us,
            retry_after_us: None,
            wait_us,
            capped: false,
        }
    }

    /// A rejected request.
    #[inline]
    pub fn rejected(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: Option<u64>,
    ) -> Self {
        Decision {
            allowed: false,
            shadow_rejected: false,
            limit,
            remaining,
            reset_after_us,
            retry_after_us,
            wait_us: 0,
            capped: false,
        }
    }

    /// Envoy's counting of a request: the `verdict` a try would have had, with the
    /// state after its `charge` (see `Policy::count`): `remaining` and `reset_after` of
    /// the charge, and on a reject the time until a unit request fits again.
    pub fn counted(verdict: Decision, charge: Decision) -> Self {
        Decision {
            remaining: charge.remaining,
            reset_after_us: charge.reset_after_us,
            retry_after_us: if verdict.allowed {
                None
            } else {
                charge.retry_after_us.or(Some(0))
            },
            capped: charge.capped,
            ..verdict
        }
    }

    /// The decision as a `Result`, for `?` and the `is_err()` habit of other limiters:
    /// `Ok` when admitted (a `shadow` reject included), else [`Rejected`] with the
    /// time to retry. An admission may still carry a `wait` (a `limit-req` delay, a
    /// `shaper` slot, an acquire): the request proceeds only after it.
    ///
    /// ```
    /// use tollgate_core::{Op, Policy};
    /// let p: Policy = "gcra:rate=1/s,burst=1".parse().unwrap();
    /// let mut s = p.init(0);
    /// assert!(p.check(&mut s, 0, 1, Op::Try).unwrap().into_result().is_ok());
    /// let e = p.check(&mut s, 0, 1, Op::Try).unwrap().into_result().unwrap_err();
    /// assert_eq!(e.retry_after_us, Some(1_000_000));
    /// assert_eq!(e.to_string(), "rate limited: retry after 1s");
    /// ```
    pub fn into_result(self) -> Result<Decision, Rejected> {
        if self.allowed {
            Ok(self)
        } else {
            Err(Rejected {
                retry_after_us: self.retry_after_us,
                decision: self,
            })
        }
    }

    /// `wait_us` as a [`Duration`].
    pub fn wait(&self) -> Duration {
        Duration::from_micros(self.wait_us)
    }

    /// `retry_after_us` as a [`Duration`].
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after_us.map(Duration::from_micros)
    }

    /// `reset_after_us` as a [`Duration`].
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }
}

/// A request over the limit, as an error ([`Decision::into_result`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rate limited: retry after {}", match .retry_after_us { Some(us) => format!("{:?}", std::time::Duration::from_micros(*us)), None => "an unknown time".into() })]
pub struct Rejected {
    /// When the same request could pass (`None`: not known to ever pass).
    pub retry_after_us: Option<u64>,
    /// The decision.
    pub decision: Decision,
}

impl Rejected {
    /// When the same request could pass, as a `Duration` (`None`: not known to ever
    /// pass): what a `Retry-After` says.
    ///
    /// ```
    /// use tollgate_core::{Op, Policy};
    /// let policy: Policy = "fixed-window:limit=1,window=1s".parse().unwrap();
    /// let mut state = policy.init(0);
    /// policy.check(&mut state, 0, 1, Op::Try).unwrap();
    /// let d = policy.check(&mut state, 250_000, 1, Op::Try).unwrap();
    /// let rejected = d.into_result().unwrap_err();
    /// assert_eq!(rejected.retry_after(), Some(std::time::Duration::from_millis(750)));
    /// ```
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after_us.map(std::time::Duration::from_micros)
    }
}

/// Why a check could not be decided at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The cost exceeds what the policy can ever admit at once, so no amount of waiting
    /// would let it through (governor's `InsufficientCapacity`).
    #[error("cost {cost} can never be admitted: this policy admits at most {capacity} at once")]
    InsufficientCapacity {
        /// The cost asked for.
        cost: u64,
        /// The largest cost the policy can ever admit.
        capacity: u64,
    },
    /// A cost of zero was asked for; use `peek` to look without consuming.
    #[error("cost must be at least 1 (use peek to look without consuming)")]
    ZeroCost,
    /// A charge was asked of an algorithm for which it has no meaning (`shaper`,
    /// `concurrency`: a queue or a permit, not a budget).
    #[error("{algorithm} cannot be charged after the fact: it limits {what}, not a budget of units (use a rate algorithm such as token-bucket or fixed-window)")]
    NotChargeable {
        /// The algorithm's spec name.
        algorithm: &'static str,
        /// What it limits instead.
        what: &'static str,
    },
}
