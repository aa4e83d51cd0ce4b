//! What a limiter decides with: its rule set, and the GCRA fast path when the rule set
//! is a single GCRA policy with a whole-microsecond interval (whose whole state is one
//! u64, decided by plain 64-bit arithmetic).

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate_core::algorithms::GcraParams;
use tollgate_core::{AnyAlgorithm, CheckError, CheckMode, Decision, Op, RuleSet};

/// A limiter's current configuration.
#[derive(Debug)]
pub(crate) struct Config {
    pub rules: RuleSet,
    /// Set iff the rule set is one GCRA policy with a whole-microsecond interval.
    pub fast: Option<FastGcra>,
}

/// The GCRA fast path: parameters, max-wait and shadow mode, all plain words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FastGcra {
    pub params: GcraParams,
    pub max_wait_us: Option<u64>,
    pub shadow: bool,
    /// The policy's debt cap in units (`Policy::debt_cap`), for charges.
    pub debt: u64,
}

impl FastGcra {
    /// One decision on a bare TAT word: the new word (unchanged on a reject) and the
    /// decision, with max-wait and shadow mode applied.
    #[inline(always)]
    pub fn decide(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
        op: Op,
    ) -> Result<(u64, Decision), CheckError> {
        let mode = match op {
            Op::Try => CheckMode::Try,
            Op::Acquire => CheckMode::Acquire {
                max_wait_us: self.max_wait_us,
            },
            Op::Charge => return Ok(self.params.charge(tat, now, cost, self.debt)),
            Op::Count => return self.count(tat, now, cost),
        };
        let (new, d) = self.params.decide(tat, now, cost, mode)?;
        Ok((new, self.shadowed(d)))
    }

    fn shadowed(&self, mut d: Decision) -> Decision {
        if self.shadow && !d.allowed {
            d.allowed = true;
            d.shadow_rejected = true;
        }
        d
    }

    /// `Policy::count` on a bare TAT word: charged whatever the answer, answered as a
    /// try would have been (a look, for a cost of 0: rejected while past the limit).
    fn count(&self, tat: u64, now: u64, cost: u64) -> Result<(u64, Decision), CheckError> {
        let verdict = if cost == 0 {
            let mut d = self.params.status(tat, now);
            let less = self.refunded(tat, now.min(tollgate_core::MAX_TIME_US), 1);
            d.allowed = d.remaining > 0 || self.params.status(less, now).remaining > 0;
            self.shadowed(d)
        } else {
            match self.params.decide(tat, now, cost, CheckMode::Try) {
                Ok((_, d)) => self.shadowed(d),
                Err(CheckError::InsufficientCapacity { .. }) => {
                    self.shadowed(Decision::rejected(self.params.burst, 0, 0, None))
                }
                Err(e) => return Err(e),
            }
        };
        let (new, c) = self.params.charge(tat, now, cost, self.debt);
        Ok((new, Decision::counted(verdict, c)))
    }

    /// A peek on a bare TAT word: [`FastGcra::decide`] changing nothing, or for a cost
    /// of 0 the word as it stands (as `Policy::peek`).
    #[inline]
    pub fn peek(&self, tat: u64, now: u64, cost: u64) -> Result<(u64, Decision), CheckError> {
        if cost == 0 {
            return Ok((tat, self.params.status(tat, now)));
        }
        self.decide(tat, now, cost, Op::Try)
    }

    /// A try of one unit on a TAT word shared between threads, the admit bit only
    /// (shadow mode admits): none of a decision's arithmetic, a compare-and-swap loop.
    #[inline(always)]
    pub fn admit_word(&self, tat: &AtomicU64, now: u64) -> bool {
        let mut current = tat.load(Ordering::Acquire);
        loop {
            let Some(new) = self.params.admit_one(current, now) else {
                return self.shadow;
            };
            match tat.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// `tat` after giving back `cost` units at `now`: `max(tat - c*T, now)`, and
    /// unchanged when already replenished.
    #[inline]
    pub fn refunded(&self, tat: u64, now: u64, cost: u64) -> u64 {
        if tat <= now {
            return tat;
        }
        tat.saturating_sub(cost.saturating_mul(self.params.interval))
            .max(now)
    }
}

impl Config {
    pub fn new(rules: RuleSet) -> Self {
        let fast = match rules.policies() {
            [p] => match p.algorithm() {
                AnyAlgorithm::Gcra(g) => g.params().map(|params| FastGcra {
                    params,
                    max_wait_us: p.max_wait_us(),
                    shadow: p.shadow(),
                    debt: p.debt_cap(),
                }),
                _ => None,
            },
            _ => None,
        };
        Config { rules, fast }
    }
}
