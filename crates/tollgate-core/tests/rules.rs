//! Rule sets: several policies on one key, all-or-nothing.

use proptest::prelude::*;
use tollgate_core::{Op, Policy, RuleSet};

const S: u64 = 1_000_000;

#[test]
fn a_reject_by_one_policy_charges_none() {
    let rules =
        RuleSet::parse(&["fixed-window:limit=3,window=1m", "gcra:rate=1/s,burst=1"]).unwrap();
    let mut st = rules.init(0);
    assert!(
        rules
            .check(&mut st, 0, 1, Op::Try)
            .unwrap()
            .decision
            .allowed
    );
    for _ in 0..5 {
        let d = rules.check(&mut st, 0, 1, Op::Try).unwrap();
        assert!(!d.decision.allowed);
        assert_eq!(d.decision.retry_after_us, Some(S));
        assert_eq!(
            d.policies[0].remaining, 2,
            "the minute window is not charged"
        );
    }
    assert!(
        rules
            .check(&mut st, S, 1, Op::Try)
            .unwrap()
            .decision
            .allowed
    );
    assert!(
        rules
            .check(&mut st, 2 * S, 1, Op::Try)
            .unwrap()
            .decision
            .allowed
    );
    // Now the minute window binds: retry when it ends.
    let d = rules.check(&mut st, 3 * S, 1, Op::Try).unwrap();
    assert!(!d.decision.allowed);
    assert_eq!(d.binding, 0);
    assert_eq!(d.decision.retry_after_us, Some(57 * S));
}

#[test]
fn overall_decision_reports_the_binding_policy_and_the_largest_wait() {
    let rules =
        RuleSet::parse(&["limit-req:rate=10/s,burst=5", "limit-req:rate=2/s,burst=5"]).unwrap();
    let mut st = rules.init(0);
    let _ = rules.check(&mut st, 0, 1, Op::Try).unwrap();
    let d = rules.check(&mut st, 0, 1, Op::Try).unwrap();
    // excess 1000 in both: delays 100ms and 500ms; the overall wait is the larger.
    assert_eq!(d.policies[0].wait_us, 100_000);
    assert_eq!(d.policies[1].wait_us, 500_000);
    assert_eq!(d.decision.wait_us, 500_000);
    assert_eq!(d.decision.remaining, 4);
}

#[test]
fn acquire_charges_every_policy_at_the_common_instant() {
    let rules = RuleSet::parse(&["gcra:rate=10/s,burst=1", "gcra:rate=1/s,burst=1"]).unwrap();
    let mut st = rules.init(0);
    assert_eq!(
        rules
            .check(&mut st, 0, 1, Op::Acquire)
            .unwrap()
            .decision
            .wait_us,
        0
    );
    let d = rules.check(&mut st, 0, 1, Op::Acquire).unwrap();
    assert!(d.decision.allowed);
    assert_eq!(d.decision.wait_us, S);
    // The 10/s policy was charged at 1 s, not at its own earliest (100 ms).
    let d = rules.check(&mut st, 0, 1, Op::Acquire).unwrap();
    assert_eq!(d.decision.wait_us, 2 * S);
    assert_eq!(d.policies[0].wait_us, 2 * S);

    let bounded = RuleSet::parse(&[
        "gcra:rate=10/s,burst=1,max-wait=500ms",
        "gcra:rate=1/s,burst=1",
    ])
    .unwrap();
    let mut st = bounded.init(0);
    let _ = bounded.check(&mut st, 0, 1, Op::Acquire).unwrap();
    let d = bounded.check(&mut st, 0, 1, Op::Acquire).unwrap();
    assert!(
        !d.decision.allowed,
        "1 s exceeds the first policy's max-wait"
    );
    assert_eq!(d.decision.retry_after_us, Some(S));
    assert_eq!(
        st,
        {
            let mut fresh = bounded.init(0);
            let _ = bounded.check(&mut fresh, 0, 1, Op::Acquire).unwrap();
            fresh
        },
        "a rejected acquire reserves nothing"
    );
}

#[test]
fn a_single_policy_rule_set_is_the_policy() {
    let p: Policy = "sliding-log:limit=3,window=1s".parse().unwrap();
    let rules = RuleSet::new(vec![p.clone()]).unwrap();
    let (mut a, mut b) = (p.init(0), rules.init(0));
    for t in [0, 0, 0, 0, 500_000, S, S + 1] {
        assert_eq!(
            p.check(&mut a, t, 1, Op::Try).unwrap(),
            rules.check(&mut b, t, 1, Op::Try).unwrap().decision
        );
    }
    assert!(RuleSet::new(vec![]).is_err());
    assert!(RuleSet::parse(&["gcra:rate=1/s", "nope"])
        .unwrap_err()
        .to_string()
        .contains("unknown algorithm 'nope'"));
}

proptest! {
    /// A rule set of exact windows never exceeds any of its policies' bounds.
    #[test]
    fn rule_sets_respect_every_bound(
        trace in prop::collection::vec((0..300_000u64, 1..3u64, any::<bool>()), 1..200),
    ) {
        let rules = RuleSet::parse(&["sliding-log:limit=3,window=1s", "sliding-log:limit=5,window=3s"]).unwrap();
        let mut st = rules.init(0);
        let mut t = 0;
        let mut admitted = Vec::new();
        for (gap, cost, acquire) in trace {
            t += gap;
            let op = if acquire { Op::Acquire } else { Op::Try };
            let d = rules.check(&mut st, t, cost, op).unwrap().decision;
            if d.allowed {
                admitted.push((t + d.wait_us, cost));
            }
        }
        admitted.sort();
        for &(end, _) in &admitted {
            for (limit, window) in [(3, S), (5, 3 * S)] {
                let n: u64 = admitted.iter().filter(|&&(u, _)| u <= end && u + window > end).map(|&(_, c)| c).sum();
                prop_assert!(n <= limit, "{n} > {limit} in the {window}us window ending {end}");
            }
        }
    }
}

/// A peek of cost 0 looks at the state as it stands (Envoy's `hits_addend: 0`):
/// admitted, counting nothing, with the remaining count of now — the limit on a fresh
/// key, what is left after use, 0 (still admitted) when spent — for every algorithm the
/// memory and Redis stores share, and for a rule set.
#[test]
fn a_peek_of_cost_zero_reports_the_state_as_it_stands() {
    use tollgate_core::{Op, RuleSet};
    for spec in [
        "gcra:rate=3/m,burst=3",
        "token-bucket:rate=3/m,capacity=3",
        "leaky-bucket:rate=3/m,capacity=3",
        "fixed-window:limit=3,window=1m",
        "sliding-log:limit=3,window=1m",
        "sliding-window:limit=3,window=1m,buckets=6",
    ] {
        let rules = RuleSet::parse(&[spec, "fixed-window:limit=100,window=1h"]).unwrap();
        let mut states = rules.init(0);
        let look = |states: &[tollgate_core::PolicyState]| rules.peek(states, 1_000, 0).unwrap();
        let fresh = look(&states);
        assert!(fresh.decision.allowed, "{spec}");
        assert_eq!(fresh.decision.remaining, 3, "{spec}: fresh");
        assert_eq!(fresh.policies[1].remaining, 100, "{spec}");
        let _ = rules.check(&mut states, 1_000, 2, Op::Try).unwrap();
        let before = states.clone();
        let used = look(&states);
        assert_eq!(used.decision.remaining, 1, "{spec}: 2 of 3 used");
        assert_eq!(used.policies[1].remaining, 98, "{spec}");
        assert_eq!(states, before, "{spec}: a look changed the state");
        let _ = rules.check(&mut states, 1_000, 1, Op::Try).unwrap();
        let spent = look(&states);
        assert!(spent.decision.allowed && spent.decision.retry_after_us.is_none());
        assert_eq!(spent.decision.remaining, 0, "{spec}: spent");
        // It agrees with what a unit try reports after admitting: one more than that.
        let mut copy = rules.init(0);
        let admitted = rules.check(&mut copy, 1_000, 1, Op::Try).unwrap();
        assert_eq!(
            admitted.decision.remaining + 1,
            fresh.decision.remaining,
            "{spec}"
        );
    }
}
