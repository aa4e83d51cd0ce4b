//! Charges after the fact (docs/semantics.md, "Charges"): what each algorithm's debt
//! is, the `max-debt` cap, and invariants on random traces that mix tries, acquires
//! and charges.

use proptest::prelude::*;
use tollgate_core::algorithms::{FixedWindow, Gcra, LeakyBucket, SlidingLog, TokenBucket};
use tollgate_core::{Algorithm, CheckError, CheckMode, Decision, Op, Policy, Rate, RuleSet};

fn policy(spec: &str) -> Policy {
    spec.parse().unwrap_or_else(|e| panic!("{e}"))
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(300)
}

/// Charges `cost` at `t` and checks the decision's invariants.
fn charge(p: &Policy, s: &mut tollgate_core::PolicyState, t: u64, cost: u64) -> Decision {
    let d = p.charge(s, t, cost).unwrap();
    assert!(d.allowed, "a charge is always admitted");
    assert_eq!(d.retry_after_us.is_some(), d.remaining == 0, "{d:?}");
    d
}

#[test]
fn fixed_window_passes_the_limit_for_the_rest_of_the_window() {
    let p = policy("fixed-window:limit=10000,window=1m");
    let mut s = p.init(0);
    assert!(p.check(&mut s, 0, 1, Op::Try).unwrap().allowed);
    let d = charge(&p, &mut s, 10_000_000, 12_000);
    assert_eq!((d.remaining, d.retry_after_us), (0, Some(50_000_000)));
    // In debt: even a unit request is rejected until the window ends.
    let r = p.check(&mut s, 59_999_999, 1, Op::Try).unwrap();
    assert!(!r.allowed);
    assert_eq!(r.retry_after_us, Some(1));
    assert!(p.check(&mut s, 60_000_000, 1, Op::Try).unwrap().allowed);
}

#[test]
fn gcra_moves_the_tat_into_the_future_and_pays_it_back_at_the_rate() {
    // 10/s, burst 5: T = 100 ms. A charge of 8 at 0 leaves the TAT at 800 ms, 300 ms
    // past the burst: 3 units of debt, paid back by 400 ms (when a unit fits).
    let p = policy("gcra:rate=10/s,burst=5");
    let mut s = p.init(0);
    let d = charge(&p, &mut s, 0, 8);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after_us, Some(400_000));
    assert_eq!(d.reset_after_us, 800_000);
    assert!(!p.check(&mut s, 399_999, 1, Op::Try).unwrap().allowed);
    assert!(p.check(&mut s, 400_000, 1, Op::Try).unwrap().allowed);
}

#[test]
fn token_and_leaky_buckets_go_negative_and_past_the_capacity() {
    for spec in [
        "token-bucket:rate=10/s,capacity=5",
        "leaky-bucket:rate=10/s,capacity=5",
    ] {
        let p = policy(spec);
        let mut s = p.init(0);
        let d = charge(&p, &mut s, 0, 8);
        assert_eq!(d.retry_after_us, Some(400_000), "{spec}");
        assert!(!p.check(&mut s, 399_999, 1, Op::Try).unwrap().allowed);
        assert!(p.check(&mut s, 400_000, 1, Op::Try).unwrap().allowed);
    }
}

#[test]
fn sliding_log_entries_leave_at_their_own_time() {
    let p = policy("sliding-log:limit=5,window=1s");
    let mut s = p.init(0);
    assert!(p.check(&mut s, 0, 3, Op::Try).unwrap().allowed);
    let d = charge(&p, &mut s, 500_000, 4);
    // 7 units in the window: the 3 at 0 leave at 1 s, leaving 4 (room for 1).
    assert_eq!(d.retry_after_us, Some(500_000));
    assert!(!p.check(&mut s, 999_999, 1, Op::Try).unwrap().allowed);
    let a = p.check(&mut s, 1_000_000, 1, Op::Try).unwrap();
    assert!(a.allowed);
    assert_eq!(a.remaining, 0);
}

#[test]
fn sliding_windows_count_the_charge_in_the_bucket_of_its_time() {
    let p = policy("sliding-window:limit=10,window=1s,buckets=10");
    let mut s = p.init(0);
    let _ = charge(&p, &mut s, 50_000, 15);
    // The bucket [0, 100ms) holds 15: nothing fits until it leaves at 1 s.
    assert!(!p.check(&mut s, 999_999, 1, Op::Try).unwrap().allowed);
    assert!(p.check(&mut s, 1_000_000, 1, Op::Try).unwrap().allowed);

    let w = policy("sliding-window:limit=10,window=1s,mode=weighted");
    let mut s = w.init(0);
    let _ = charge(&w, &mut s, 0, 20);
    // At 1.5 s the estimate is 20 * 0.5 = 10: still no room; at 1.55 s it is 9.
    assert!(!w.check(&mut s, 1_500_000, 1, Op::Try).unwrap().allowed);
    assert!(w.check(&mut s, 1_550_000, 1, Op::Try).unwrap().allowed);
}

#[test]
fn limit_req_adds_to_the_excess_without_a_burst_test() {
    // 10 r/s = 10,000 milli-requests per second, burst 2: excess may reach 2000.
    let p = policy("limit-req:rate=10/s,burst=2,nodelay");
    let mut s = p.init(0);
    let d = charge(&p, &mut s, 0, 6);
    // excess = 6000 after a fresh key (-1000 + 6000 = 5000 over the first request's
    // 0): a unit fits once excess + 1000 <= 2000, after 400 ms of leak.
    assert_eq!(d.retry_after_us, Some(400_000));
    assert!(!p.check(&mut s, 399_000, 1, Op::Try).unwrap().allowed);
    assert!(p.check(&mut s, 400_000, 1, Op::Try).unwrap().allowed);
}

#[test]
fn smooth_reserves_stored_permits_first_then_moves_next_free() {
    let p = policy("smooth-bursty:rate=10/s");
    let mut s = p.init(0);
    // Idle for 1 s: 10 stored permits, then 5 fresh ones move nextFree by 500 ms.
    let d = charge(&p, &mut s, 1_000_000, 15);
    assert_eq!(d.retry_after_us, Some(500_000));
    assert!(!p.check(&mut s, 1_499_999, 1, Op::Try).unwrap().allowed);
    assert!(p.check(&mut s, 1_500_000, 1, Op::Try).unwrap().allowed);
}

#[test]
fn shaper_and_concurrency_refuse_a_charge_and_max_debt() {
    for spec in ["shaper:rate=10/s,queue=5", "concurrency:limit=3"] {
        let p = policy(spec);
        let mut s = p.init(0);
        let err = p.charge(&mut s, 0, 1).unwrap_err();
        assert!(matches!(err, CheckError::NotChargeable { .. }), "{err}");
        assert!(err.to_string().contains("cannot be charged"), "{err}");
        let bad = format!("{spec},max-debt=5").parse::<Policy>().unwrap_err();
        assert!(
            bad.to_string().contains("unknown parameter 'max-debt'"),
            "{bad}"
        );
    }
}

#[test]
fn max_debt_caps_a_huge_report_and_says_so() {
    let p = policy("gcra:rate=10/s,burst=5,max-debt=20");
    assert_eq!(p.to_string(), "gcra:rate=10/s,burst=5,max-debt=20");
    let mut s = p.init(0);
    let d = charge(&p, &mut s, 0, 1_000_000);
    assert!(d.capped);
    // 5 of burst + 20 of debt: a unit fits after 21 intervals.
    assert_eq!(d.retry_after_us, Some(2_100_000));
    // Already at the cap: a further charge adds nothing and is capped again.
    let again = charge(&p, &mut s, 0, 1);
    assert!(again.capped);
    assert_eq!(again.retry_after_us, Some(2_100_000));

    let w = policy("fixed-window:limit=100,window=1m,max-debt=0");
    let mut s = w.init(0);
    let d = charge(&w, &mut s, 0, 250);
    assert!(d.capped);
    assert!(!w.check(&mut s, 1, 1, Op::Try).unwrap().allowed);
    assert_eq!(d.retry_after_us, Some(60_000_000));
}

#[test]
fn without_max_debt_a_charge_is_still_bounded_to_representable_states() {
    for spec in [
        "gcra:rate=1/d,burst=1",
        "token-bucket:rate=3/s,capacity=2",
        "leaky-bucket:rate=1/h,capacity=1",
        "limit-req:rate=1/m",
        "smooth-warmup:rate=1/s,warmup=10s",
    ] {
        let p = policy(spec);
        let mut s = p.init(0);
        let d = charge(&p, &mut s, 0, tollgate_core::MAX_COUNT);
        assert!(d.capped, "{spec}");
        let retry = d.retry_after_us.unwrap();
        assert!(
            retry <= tollgate_core::MAX_DEBT_US + 86_400_000_000,
            "{spec}: {retry}"
        );
    }
}

#[test]
fn a_rule_set_charges_every_policy() {
    let rules =
        RuleSet::parse(&["gcra:rate=10/s,burst=5", "fixed-window:limit=100,window=1m"]).unwrap();
    let mut s = rules.init(0);
    let d = rules.charge(&mut s, 0, 8).unwrap();
    assert!(d.decision.allowed);
    assert_eq!(d.policies[1].remaining, 92);
    assert_eq!(d.decision.remaining, 0);
    assert_eq!(d.decision.retry_after_us, Some(400_000));
    // A policy that cannot be charged fails the whole charge and changes nothing.
    let bad = RuleSet::parse(&["gcra:rate=10/s,burst=5", "concurrency:limit=2"]).unwrap();
    let mut s = bad.init(0);
    let before = s.clone();
    assert!(bad.charge(&mut s, 0, 1).is_err());
    assert_eq!(s, before);
}

#[test]
fn envoy_counting_charges_a_rejected_hit() {
    // envoyproxy/ratelimit: INCRBY before the comparison.
    let p = policy("fixed-window:limit=10,window=1m");
    let mut s = p.init(0);
    assert!(p.count(&mut s, 0, 8).unwrap().allowed);
    let over = p.count(&mut s, 1, 5).unwrap();
    assert!(!over.allowed);
    assert_eq!(over.retry_after_us, Some(59_999_999));
    // 13 counted: a later look (hits_addend 0) still finds the key over its limit,
    // and a unit hit is rejected (and counted) too.
    assert_eq!(p.status(&s, 2).remaining, 0);
    assert!(p.over_limit(&s, 2));
    assert!(!p.count(&mut s, 2, 0).unwrap().allowed);
    assert!(!p.count(&mut s, 2, 1).unwrap().allowed);
    // At the limit, not past it: a look is still OK (envoyproxy's count > limit).
    let mut at = p.init(0);
    assert!(p.count(&mut at, 0, 10).unwrap().allowed);
    assert!(!p.over_limit(&at, 1));
    assert!(p.count(&mut at, 1, 0).unwrap().allowed);
    // All-or-nothing (tollgate's try) would have left room for 2.
    let mut t = p.init(0);
    let _ = p.check(&mut t, 0, 8, Op::Try).unwrap();
    assert!(!p.check(&mut t, 1, 5, Op::Try).unwrap().allowed);
    assert_eq!(p.status(&t, 2).remaining, 2);
}

/// A step of a mixed trace: gap (us), cost, and 0 try / 1 acquire / 2 charge.
type Trace = Vec<(u64, u64, u8)>;

fn trace(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Trace> {
    prop::collection::vec((0..max_gap, 1..=max_cost, 0..3u8), 1..60)
}

const RATES: &[&str] = &["3/s", "7/m", "10/s", "5/250ms", "6/7ms", "1000/s"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// GCRA, token bucket and leaky bucket keep agreeing, charges included.
    #[test]
    fn gcra_token_bucket_and_leaky_bucket_agree_with_charges(
        rate in prop::sample::select(RATES), burst in 1..6u64,
        trace in trace(400_000, 8), debt in prop::option::of(0..10u64),
    ) {
        let cap = debt.map_or(String::new(), |d| format!(",max-debt={d}"));
        let ps = [
            policy(&format!("gcra:rate={rate},burst={burst}{cap}")),
            policy(&format!("token-bucket:rate={rate},capacity={burst}{cap}")),
            policy(&format!("leaky-bucket:rate={rate},capacity={burst}{cap}")),
        ];
        let mut ss: Vec<_> = ps.iter().map(|p| p.init(0)).collect();
        let mut t = 0;
        for &(gap, cost, op) in &trace {
            t += gap;
            let ds: Vec<_> = ps.iter().zip(ss.iter_mut()).map(|(p, s)| match op {
                2 => p.charge(s, t, cost),
                1 => p.check(s, t, cost, Op::Acquire),
                _ => p.check(s, t, cost, Op::Try),
            }.map(|d| (d.allowed, d.remaining, d.retry_after_us, d.wait_us, d.capped))).collect();
            prop_assert_eq!(&ds[0], &ds[1], "token-bucket at t={} op {} cost {}", t, op, cost);
            prop_assert_eq!(&ds[0], &ds[2], "leaky-bucket at t={} op {} cost {}", t, op, cost);
        }
    }

    /// GCRA's envelope holds for every admitted try, counting charged units: the
    /// units admitted or charged in [s, t] are at most burst + rate*(t - s). A charge
    /// may pass it (that is the debt); a try never does.
    #[test]
    fn no_try_is_admitted_past_the_envelope_of_charged_and_admitted_units(
        rate in prop::sample::select(RATES), burst in 1..6u64, trace in trace(300_000, 8),
    ) {
        let r = Rate::parse(rate).unwrap();
        let g = Gcra::new(r, burst).unwrap();
        let tb = TokenBucket::new(r, burst).unwrap();
        let lb = LeakyBucket::new(r, burst).unwrap();
        let mut s = (g.init(0), tb.init(0), lb.init(0));
        let mut log: Vec<(u64, u64)> = Vec::new();
        let mut t = 0;
        for &(gap, cost, op) in &trace {
            t += gap;
            if op == 2 {
                let c = g.charge(&mut s.0, t, cost, u64::MAX).unwrap();
                prop_assert_eq!(tb.charge(&mut s.1, t, cost, u64::MAX).unwrap(), c);
                prop_assert_eq!(lb.charge(&mut s.2, t, cost, u64::MAX).unwrap(), c);
                log.push((t, c));
                continue;
            }
            let Ok(d) = g.check(&mut s.0, t, cost, CheckMode::Try) else { continue };
            prop_assert_eq!(tb.check(&mut s.1, t, cost, CheckMode::Try).unwrap().allowed, d.allowed);
            prop_assert_eq!(lb.check(&mut s.2, t, cost, CheckMode::Try).unwrap().allowed, d.allowed);
            if !d.allowed { continue }
            log.push((t, cost));
            let mut units = 0u128;
            for &(ts, c) in log.iter().rev() {
                units += u128::from(c);
                // units * period <= (t - ts) * count + burst * period
                let lhs = units * u128::from(r.period_us);
                let rhs = u128::from(t - ts) * u128::from(r.count) + u128::from(burst) * u128::from(r.period_us);
                prop_assert!(lhs <= rhs, "{} units in [{}, {}] past the envelope", units, ts, t);
            }
        }
    }

    /// Windows: no try is admitted while the units admitted or charged in its window,
    /// plus its cost, pass the limit; charges pass it by at most `max-debt`.
    #[test]
    fn windows_admit_no_try_past_the_limit_and_no_charge_past_max_debt(
        limit in 1..8u64, debt in 0..6u64, trace in trace(150_000, 6),
    ) {
        let w = 1_000_000;
        let fw = FixedWindow::new(limit, w, Default::default()).unwrap();
        let sl = SlidingLog::new(limit, w).unwrap();
        let mut fs = fw.init(0);
        let mut ls = sl.init(0);
        let mut fixed: Vec<(u64, u64)> = Vec::new();
        let mut sliding: Vec<(u64, u64)> = Vec::new();
        let mut t = 0;
        for &(gap, cost, op) in &trace {
            t += gap;
            let in_fixed = |log: &[(u64, u64)]| log.iter().filter(|(ts, _)| ts / w == t / w).map(|(_, c)| c).sum::<u64>();
            let in_sliding = |log: &[(u64, u64)]| log.iter().filter(|(ts, _)| ts + w > t).map(|(_, c)| c).sum::<u64>();
            if op == 2 {
                let c = fw.charge(&mut fs, t, cost, debt).unwrap();
                fixed.push((t, c));
                prop_assert!(in_fixed(&fixed) <= limit + debt);
                let c = sl.charge(&mut ls, t, cost, debt).unwrap();
                sliding.push((t, c));
                prop_assert!(in_sliding(&sliding) <= limit + debt);
                continue;
            }
            if cost > limit { continue }
            if fw.check(&mut fs, t, cost, CheckMode::Try).unwrap().allowed {
                prop_assert!(in_fixed(&fixed) + cost <= limit);
                fixed.push((t, cost));
            }
            if sl.check(&mut ls, t, cost, CheckMode::Try).unwrap().allowed {
                prop_assert!(in_sliding(&sliding) + cost <= limit);
                sliding.push((t, cost));
            }
        }
    }

    /// A charge of 0 changes nothing, for every chargeable algorithm.
    #[test]
    fn a_charge_of_zero_changes_nothing(spec in chargeable_spec(), trace in trace(300_000, 4)) {
        let p = policy(&spec);
        let mut s = p.init(0);
        let mut t = 0;
        for &(gap, cost, op) in &trace {
            t += gap;
            let before = s.clone();
            let d = p.charge(&mut s, t, 0).unwrap();
            prop_assert_eq!(&s, &before);
            prop_assert!(!d.capped);
            prop_assert_eq!(d.remaining, p.remaining(&s, t));
            let _ = match op {
                2 => p.charge(&mut s, t, cost),
                1 => p.check(&mut s, t, cost, Op::Acquire),
                _ => p.check(&mut s, t, cost, Op::Try),
            };
        }
    }

    /// Under any chargeable policy, a charge's `retry_after` is exact: a unit try is
    /// rejected just before it and admitted at it.
    #[test]
    fn a_charge_reports_when_a_unit_fits_again(spec in chargeable_spec(), trace in trace(300_000, 6)) {
        let p = policy(&spec);
        let mut s = p.init(0);
        let mut t = 0;
        for &(gap, cost, op) in &trace {
            t += gap;
            if op != 2 {
                let _ = p.check(&mut s, t, cost, Op::Try);
                continue;
            }
            let d = p.charge(&mut s, t, cost).unwrap();
            if let Some(r) = d.retry_after_us {
                prop_assert!(r > 0);
                let early = p.peek(&s, t + r - 1, 1).unwrap();
                prop_assert!(!early.allowed || early.wait_us > 0, "{} admits a unit at {} (retry {})", spec, t + r - 1, r);
                let on_time = p.peek(&s, t + r, 1).unwrap();
                prop_assert!(on_time.allowed, "{} rejects a unit at {} (retry {})", spec, t + r, r);
            }
        }
    }
}

fn chargeable_spec() -> impl Strategy<Value = String> {
    let w = prop::sample::select(&["10ms", "1s", "250ms", "7ms"][..]);
    let debt = prop::option::of(0..5u64)
        .prop_map(|d| d.map_or(String::new(), |d| format!(",max-debt={d}")));
    let alg = prop_oneof![
        (1..6u64, w.clone(), any::<bool>()).prop_map(|(l, w, f)| format!(
            "fixed-window:limit={l},window={w}{}",
            if f { ",align=first" } else { "" }
        )),
        (1..6u64, w.clone()).prop_map(|(l, w)| format!("sliding-log:limit={l},window={w}")),
        (1..6u64, 1..6u64).prop_map(|(l, k)| format!(
            "sliding-window:limit={l},window={}ms,buckets={k}",
            100 * k
        )),
        (1..6u64, w)
            .prop_map(|(l, w)| format!("sliding-window:limit={l},window={w},mode=weighted")),
        (prop::sample::select(RATES), 1..6u64)
            .prop_map(|(r, c)| format!("leaky-bucket:rate={r},capacity={c}")),
        (prop::sample::select(RATES), 1..6u64)
            .prop_map(|(r, c)| format!("token-bucket:rate={r},capacity={c}")),
        (prop::sample::select(RATES), 1..6u64)
            .prop_map(|(r, b)| format!("gcra:rate={r},burst={b}")),
        prop::sample::select(&["1/s", "10/s", "3/s"][..])
            .prop_map(|r| format!("smooth-bursty:rate={r}")),
        prop::sample::select(&["1/s", "10/s", "3/s"][..])
            .prop_map(|r| format!("smooth-warmup:rate={r},warmup=2s")),
        (
            prop::sample::select(&["1/s", "10/s", "30/m", "3/s"][..]),
            0..5u64,
            any::<bool>()
        )
            .prop_map(|(r, b, n)| format!(
                "limit-req:rate={r},burst={b}{}",
                if n { ",nodelay" } else { "" }
            )),
    ];
    (alg, debt).prop_map(|(a, d)| a + &d)
}
