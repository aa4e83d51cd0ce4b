//! The answer to every check.

use std::time::Duration;

/// The outcome of one check (try, acquire or peek) of one policy.
///
/// All durations are whole microseconds, measured from the request's arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted. A policy with `shadow=true` always admits; see
    /// [`Decision::shadow_rejected`].
    pub allowed: bool,
    /// The policy's headline limit: the most unit-cost requests an idle, fully
    /// replenished key admits at one instant (for `concurrency`, the permits; for
    /// `shaper`, the queue length).
    pub limit: u64,
    /// Unit-cost requests that would still be admitted right now, after this decision.
    pub remaining: u64,
    /// Time until the key's state is fully replenished (as if never used).
    pub reset_after: Duration,
    /// On a reject: the earliest time from now at which the same request could be
    /// admitted; `None` if no amount of waiting is known to help (e.g. a concurrency
    /// limit held by permits with no known release time).
    pub retry_after: Option<Duration>,
    /// Time from arrival to admission: the wait of an admitted `acquire`, the delay of
    /// `limit-req`, the schedule of `shaper`. Zero on a reject.
    pub wait: Duration,
    /// True when the policy rejected the request but runs in shadow mode, so
    /// `allowed` is true and nothing was consumed.
    pub shadow_rejected: bool,
}

impl Decision {
    /// An admitted request.
    pub fn admitted(limit: u64, remaining: u64, reset_after_us: u64, wait_us: u64) -> Self {
        Decision {
            allowed: true,
            limit,
            remaining,
            reset_after: Duration::from_micros(reset_after_us),
            retry_after: None,
            wait: Duration::from_micros(wait_us),
            shadow_rejected: false,
        }
    }

    /// A rejected request.
    pub fn rejected(
        limit: u64,
        remaining: u64,
        reset_after_us: u64,
        retry_after_us: Option<u64>,
    ) -> Self {
        Decision {
            allowed: false,
            limit,
            remaining,
            reset_after: Duration::from_micros(reset_after_us),
            retry_after: retry_after_us.map(Duration::from_micros),
            wait: Duration::ZERO,
            shadow_rejected: false,
        }
    }

    /// `wait` in whole microseconds.
    pub fn wait_us(&self) -> u64 {
        duration_us(self.wait)
    }

    /// `retry_after` in whole microseconds.
    pub fn retry_after_us(&self) -> Option<u64> {
        self.retry_after.map(duration_us)
    }

    /// `reset_after` in whole microseconds.
    pub fn reset_after_us(&self) -> u64 {
        duration_us(self.reset_after)
    }
}

fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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
}
