//! What a limiter decides with: its rule set, and the GCRA fast path when the rule set
//! is a single GCRA policy (whose whole state is one u64, updated lock-free).

use tollgate_core::algorithms::Gcra;
use tollgate_core::{Algo, CheckError, Decision, Op, Policy, RuleDecision, RuleSet};

/// A limiter's current configuration.
#[derive(Debug)]
pub(crate) struct Config {
    pub rules: RuleSet,
    /// Set iff the rule set is one GCRA policy.
    pub gcra: Option<(Gcra, Policy)>,
}

impl Config {
    pub fn new(rules: RuleSet) -> Self {
        let gcra = match rules.policies() {
            [p] => match p.algo() {
                Algo::Gcra(g) => Some((g.clone(), p.clone())),
                _ => None,
            },
            _ => None,
        };
        Config { rules, gcra }
    }
}

/// One GCRA decision on a TAT word: the new word (unchanged on a reject) and the
/// decision, with the policy's max-wait and shadow mode applied.
#[inline]
pub(crate) fn gcra_step(
    gcra: &Gcra,
    policy: &Policy,
    tat: u64,
    now: u64,
    cost: u64,
    op: Op,
) -> Result<(u64, Decision), CheckError> {
    let (tat, d) = gcra.decide(tat, now, cost, policy.mode(op))?;
    Ok((tat, policy.shadowed(d)))
}

/// A rule-set decision in the shape single-policy callers expect.
pub(crate) fn single(d: Decision) -> RuleDecision {
    RuleDecision {
        decision: d,
        binding: 0,
        policies: vec![d],
    }
}
