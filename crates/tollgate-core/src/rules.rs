//! Rule sets: several policies on one key (100/s AND 5000/m AND 100000/d), admitted
//! all-or-nothing.

use crate::algorithm::CheckMode;
use crate::decision::{CheckError, Decision};
use crate::policy::{Op, Policy, PolicyState};
use crate::spec::SpecError;

/// Several policies on one key. A request is admitted only if every policy admits it;
/// a reject by any policy consumes nothing from the others (as nginx does with several
/// `limit_req` zones); the wait is the largest of the policies' waits.
///
/// ```
/// use tollgate_core::{Op, Policy, RuleSet};
/// let rules = RuleSet::parse(&["gcra:rate=10/s,burst=2", "fixed-window:limit=3,window=1m"]).unwrap();
/// let mut state = rules.init(0);
/// assert!(rules.check(&mut state, 0, 1, Op::Try).unwrap().decision.allowed);
/// assert!(rules.check(&mut state, 0, 1, Op::Try).unwrap().decision.allowed);
/// // The burst is spent: GCRA rejects, and the minute window is not charged for it.
/// let d = rules.check(&mut state, 0, 1, Op::Try).unwrap();
/// assert!(!d.decision.allowed);
/// assert_eq!(d.policies[1].remaining, 1);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RuleSet {
    policies: Vec<Policy>,
}

/// The decision of a rule set: the overall one, and each policy's.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "a RuleDecision says whether the request may proceed: read `decision.allowed`"]
pub struct RuleDecision {
    /// Overall: allowed iff every policy allows; `limit` and `remaining` of the binding
    /// policy; the largest `reset_after`, `retry_after` and `wait`.
    pub decision: Decision,
    /// Index of the binding policy: the one with the least `remaining` (among equals,
    /// the longest `retry_after`, then the latest `reset_after`).
    pub binding: usize,
    /// Each policy's decision, in order. On an overall reject, policies that would
    /// have admitted report their unchanged state.
    pub policies: Vec<Decision>,
}

impl From<Decision> for RuleDecision {
    /// The rule decision of a single policy (also what a caller reports for a decision
    /// made without the policies, e.g. a rule that denies everything).
    fn from(decision: Decision) -> Self {
        RuleDecision {
            decision,
            binding: 0,
            policies: vec![decision],
        }
    }
}

impl RuleSet {
    /// A rule set of `policies` (at least one).
    pub fn new(policies: Vec<Policy>) -> Result<Self, SpecError> {
        if policies.is_empty() {
            return Err(SpecError {
                spec: String::new(),
                message: "a rule set needs at least one policy".into(),
            });
        }
        Ok(RuleSet { policies })
    }

    /// Parses each spec (see [`Policy::parse`]); the error names the first bad one.
    pub fn parse<S: AsRef<str>>(specs: &[S]) -> Result<Self, SpecError> {
        let policies = specs
            .iter()
            .map(|s| Policy::parse(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        RuleSet::new(policies)
    }

    /// The first policy that paces ([`Policy::paces`]), if any.
    pub fn pacing(&self) -> Option<&Policy> {
        self.policies.iter().find(|p| p.paces())
    }

    /// The first `concurrency` policy, if any: it counts permits held for the length
    /// of the work, which an answer alone cannot give back.
    pub fn holding(&self) -> Option<&Policy> {
        self.policies.iter().find(|p| p.name() == "concurrency")
    }

    /// The policies, in order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The states of a key created at `now`, one per policy.
    pub fn init(&self, now: u64) -> Vec<PolicyState> {
        self.policies.iter().map(|p| p.init(now)).collect()
    }

    /// Decides a request of `cost` at `now` against every policy and applies it to all
    /// of them, or to none. `states` holds one state per policy, in order (see
    /// [`RuleSet::init`]). Under acquire every policy is charged at the common
    /// admission instant (the latest of their earliest), and each policy's `max-wait`
    /// bounds the wait.
    pub fn check(
        &self,
        states: &mut [PolicyState],
        now: u64,
        cost: u64,
        op: Op,
    ) -> Result<RuleDecision, CheckError> {
        match op {
            Op::Charge => return self.charge(states, now, cost),
            Op::Count => return self.count(states, now, cost),
            Op::Try | Op::Acquire => {}
        }
        if let [policy] = self.policies.as_slice() {
            let d = policy.check(&mut states[0], now, cost, op)?;
            return Ok(RuleDecision {
                decision: d,
                binding: 0,
                policies: vec![d],
            });
        }
        let mut trial: Vec<PolicyState> = states.to_vec();
        let mut decisions = Vec::with_capacity(self.policies.len());
        let mut at = now;
        for (p, s) in self.policies.iter().zip(trial.iter_mut()) {
            let d = match op {
                Op::Try | Op::Charge | Op::Count => p.check(s, now, cost, Op::Try)?,
                Op::Acquire => {
                    // Where would this policy alone admit? (max-wait is checked below,
                    // against the common instant.)
                    let d = p.shadowed(p.check_mode(s, now, cost, UNBOUNDED)?);
                    if d.allowed && !d.shadow_rejected {
                        at = at.max(now + d.wait_us);
                    }
                    d
                }
            };
            decisions.push(d);
        }
        let rejected = decisions.iter().any(|d| !d.allowed);
        let too_long = op == Op::Acquire
            && self
                .policies
                .iter()
                .any(|p| p.max_wait_us().is_some_and(|m| at - now > m));
        if rejected || too_long {
            let retry = if rejected {
                decisions
                    .iter()
                    .filter(|d| !d.allowed)
                    .map(|d| d.retry_after_us)
                    .try_fold(0u64, |acc, r| r.map(|r| acc.max(r)))
            } else {
                Some(at - now)
            };
            // Nothing was charged: each policy reports its own verdict on its
            // unchanged state.
            let policies = self
                .policies
                .iter()
                .zip(states.iter())
                .zip(&decisions)
                .map(|((p, s), d)| Decision {
                    remaining: p.remaining(s, now),
                    reset_after_us: p.reset_after(s, now),
                    wait_us: 0,
                    ..*d
                })
                .collect();
            return Ok(self.combine(policies, false, retry));
        }
        if op == Op::Acquire {
            // Charge every policy at the common admission instant.
            trial = states.to_vec();
            decisions.clear();
            for (p, s) in self.policies.iter().zip(trial.iter_mut()) {
                let mut d = p.check_mode(s, at, cost, UNBOUNDED)?;
                d.wait_us += at - now;
                decisions.push(p.shadowed(d));
            }
        }
        states.clone_from_slice(&trial);
        Ok(self.combine(decisions, true, None))
    }

    /// Like [`RuleSet::check`], returning only the overall decision (and, for a single
    /// policy, allocating nothing).
    #[inline]
    pub fn decide(
        &self,
        states: &mut [PolicyState],
        now: u64,
        cost: u64,
        op: Op,
    ) -> Result<Decision, CheckError> {
        match self.policies.as_slice() {
            [policy] => policy.check(&mut states[0], now, cost, op),
            _ => Ok(self.check(states, now, cost, op)?.decision),
        }
    }

    /// Like [`RuleSet::peek`], returning only the overall decision.
    pub fn peek_decision(
        &self,
        states: &[PolicyState],
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        match self.policies.as_slice() {
            [policy] => policy.peek(&states[0], now, cost),
            _ => Ok(self.peek(states, now, cost)?.decision),
        }
    }

    /// The decision a try of `cost` would get now, changing nothing; a cost of 0 is
    /// each policy's [`Policy::status`] (admitted, counting nothing).
    pub fn peek(
        &self,
        states: &[PolicyState],
        now: u64,
        cost: u64,
    ) -> Result<RuleDecision, CheckError> {
        if cost == 0 {
            let policies = (self.policies.iter().zip(states))
                .map(|(p, s)| p.status(s, now))
                .collect();
            return Ok(self.combine(policies, true, None));
        }
        let mut copy = states.to_vec();
        self.check(&mut copy, now, cost, Op::Try)
    }

    /// Each policy's [`Policy::share`] for one of `n` instances.
    pub fn share(&self, n: u64) -> Result<RuleSet, String> {
        let policies = self
            .policies
            .iter()
            .map(|p| p.share(n))
            .collect::<Result<_, _>>()?;
        Ok(RuleSet { policies })
    }

    /// Charges `cost` units of work already done to every policy (see
    /// [`Policy::charge`]): always admitted; `remaining` is the binding policy's (0
    /// while any is in debt), `retry_after` the latest of the policies' (when a unit
    /// request fits every one again).
    pub fn charge(
        &self,
        states: &mut [PolicyState],
        now: u64,
        cost: u64,
    ) -> Result<RuleDecision, CheckError> {
        self.each(states, |p, s| p.charge(s, now, cost))
    }

    /// Envoy's counting on every policy (see [`Policy::count`]): each policy is
    /// charged whatever the others decide (envoyproxy/ratelimit increments every
    /// limit of a request); admitted iff every policy admits.
    pub fn count(
        &self,
        states: &mut [PolicyState],
        now: u64,
        cost: u64,
    ) -> Result<RuleDecision, CheckError> {
        self.each(states, |p, s| p.count(s, now, cost))
    }

    /// Applies `f` to every policy on its own (no all-or-nothing), then combines:
    /// allowed iff every policy allows, `retry_after` the latest of the policies'.
    fn each(
        &self,
        states: &mut [PolicyState],
        mut f: impl FnMut(&Policy, &mut PolicyState) -> Result<Decision, CheckError>,
    ) -> Result<RuleDecision, CheckError> {
        // Validate on copies first, so an error leaves every state as it was.
        let mut trial = states.to_vec();
        let decisions = (self.policies.iter().zip(trial.iter_mut()))
            .map(|(p, s)| f(p, s))
            .collect::<Result<Vec<_>, _>>()?;
        states.clone_from_slice(&trial);
        let allowed = decisions.iter().all(|d| d.allowed);
        let latest = decisions.iter().filter_map(|d| d.retry_after_us).max();
        let mut rd = self.combine(decisions, allowed, latest);
        rd.decision.retry_after_us = latest;
        Ok(rd)
    }

    /// Gives back `cost` units to every policy.
    pub fn refund(&self, states: &mut [PolicyState], now: u64, cost: u64) {
        for (p, s) in self.policies.iter().zip(states.iter_mut()) {
            p.refund(s, now, cost);
        }
    }

    /// Carries a key's states, kept under the `old` rule set, over to this one at
    /// `now`: each new policy takes the state of the first unused old policy of the
    /// same algorithm (see [`Policy::carry_over`]), or starts fresh.
    pub fn carry_over(
        &self,
        old: &RuleSet,
        states: Vec<PolicyState>,
        now: u64,
    ) -> Vec<PolicyState> {
        let mut old_states: Vec<Option<(&Policy, PolicyState)>> =
            old.policies.iter().zip(states).map(Some).collect();
        self.policies
            .iter()
            .map(|p| {
                let found = old_states
                    .iter_mut()
                    .find(|o| o.as_ref().is_some_and(|(op, _)| op.name() == p.name()))
                    .and_then(Option::take);
                match found {
                    Some((op, s)) => p.carry_over(op, s, now),
                    None => p.init(now),
                }
            })
            .collect()
    }

    /// Whether every policy's state is fully replenished.
    pub fn idle(&self, states: &[PolicyState], now: u64) -> bool {
        states.len() == self.policies.len()
            && self
                .policies
                .iter()
                .zip(states)
                .all(|(p, s)| p.idle(s, now))
    }

    /// The latest activity of any policy's state.
    pub fn last_active(&self, states: &[PolicyState]) -> u64 {
        self.policies
            .iter()
            .zip(states)
            .map(|(p, s)| p.last_active(s))
            .max()
            .unwrap_or(0)
    }

    fn combine(&self, policies: Vec<Decision>, allowed: bool, retry: Option<u64>) -> RuleDecision {
        // The fewest left; among equals, the one that binds longest (a rejecting
        // policy's retry, then the latest reset): so that the RateLimit header's `t`
        // agrees with Retry-After when several are exhausted.
        let binding = policies
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| {
                (
                    d.remaining,
                    std::cmp::Reverse(d.retry_after_us.unwrap_or(0)),
                    std::cmp::Reverse(d.reset_after_us),
                )
            })
            .map_or(0, |(i, _)| i);
        let b = policies[binding];
        let decision = Decision {
            allowed,
            limit: b.limit,
            remaining: b.remaining,
            reset_after_us: policies.iter().map(|d| d.reset_after_us).max().unwrap_or(0),
            retry_after_us: if allowed { None } else { retry },
            wait_us: if allowed {
                policies.iter().map(|d| d.wait_us).max().unwrap_or(0)
            } else {
                0
            },
            shadow_rejected: allowed && policies.iter().any(|d| d.shadow_rejected),
            capped: policies.iter().any(|d| d.capped),
        };
        RuleDecision {
            decision,
            binding,
            policies,
        }
    }
}

impl std::fmt::Display for RuleSet {
    /// The specs joined by ` AND `, each as [`Policy`]'s `Display` writes it (and
    /// parses back): `gcra:rate=10/s,burst=10 AND fixed-window:limit=500,window=1m`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.policies.iter().enumerate() {
            if i > 0 {
                f.write_str(" AND ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

const UNBOUNDED: CheckMode = CheckMode::Acquire { max_wait_us: None };

impl From<Policy> for RuleSet {
    fn from(policy: Policy) -> Self {
        RuleSet {
            policies: vec![policy],
        }
    }
}
