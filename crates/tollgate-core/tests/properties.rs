//! Invariants on random traces (proptest).

use proptest::prelude::*;
use tollgate_core::{densest_window, CheckError, Decision, Op, Policy};

/// 400 cases per property unless PROPTEST_CASES says otherwise (soak runs).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(400)
}

/// A request: time since the previous one (us), cost, and try/acquire.
type Trace = Vec<(u64, u64, bool)>;

fn trace(max_gap: u64, max_cost: u64, len: usize) -> impl Strategy<Value = Trace> {
    prop::collection::vec((0..max_gap, 1..=max_cost, any::<bool>()), 1..len)
}

fn policy(spec: &str) -> Policy {
    spec.parse().unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a trace; returns (arrival, decision) for each request that was decidable.
fn run(p: &Policy, trace: &Trace, ops: bool) -> Vec<(u64, u64, Result<Decision, CheckError>)> {
    let mut s = p.init(0);
    let mut t = 0;
    trace
        .iter()
        .map(|&(gap, cost, acquire)| {
            t += gap;
            let op = if ops && acquire { Op::Acquire } else { Op::Try };
            (t, cost, p.check(&mut s, t, cost, op))
        })
        .collect()
}

/// Rates whose intervals are and are not whole microseconds.
const RATES: &[&str] = &[
    "3/s",
    "7/m",
    "10/s",
    "5/250ms",
    "1000/s",
    "6/7ms",
    "3000000/s",
    "1/h",
];

fn rate() -> impl Strategy<Value = &'static str> {
    prop::sample::select(RATES)
}

/// Specs of every algorithm, with small parameters so traces hit the limits.
fn any_spec() -> impl Strategy<Value = String> {
    let w = prop::sample::select(&["10ms", "1s", "250ms", "7ms"][..]);
    prop_oneof![
        (1..6u64, w.clone(), any::<bool>()).prop_map(|(l, w, f)| format!(
            "fixed-window:limit={l},window={w}{}",
            if f { ",align=first" } else { "" }
        )),
        (1..6u64, w.clone()).prop_map(|(l, w)| format!("sliding-log:limit={l},window={w}")),
        (1..6u64, prop::sample::select(&[1u64, 100, 3][..]), 1..6u64).prop_map(
            |(l, w, k)| format!("sliding-window:limit={l},window={}ms,buckets={k}", w * k)
        ),
        (1..6u64, w)
            .prop_map(|(l, w)| format!("sliding-window:limit={l},window={w},mode=weighted")),
        (rate(), 1..6u64).prop_map(|(r, c)| format!("leaky-bucket:rate={r},capacity={c}")),
        (rate(), 1..6u64).prop_map(|(r, c)| format!("token-bucket:rate={r},capacity={c}")),
        (rate(), 1..6u64).prop_map(|(r, b)| format!("gcra:rate={r},burst={b}")),
        prop::sample::select(&["1/s", "10/s", "5/250ms", "3/s"][..])
            .prop_map(|r| format!("smooth-bursty:rate={r}")),
        prop::sample::select(&["1/s", "10/s", "3/s"][..])
            .prop_map(|r| format!("smooth-warmup:rate={r},warmup=2s")),
        (
            prop::sample::select(&["1/s", "10/s", "30/m", "3/s", "7/m"][..]),
            0..5u64,
            0..3u8
        )
            .prop_map(|(r, b, d)| format!(
                "limit-req:rate={r},burst={b}{}",
                match d {
                    0 => String::new(),
                    1 => ",nodelay".into(),
                    _ => format!(",delay={}", b / 2),
                }
            )),
        (
            prop::sample::select(&["10/s", "3/s", "5/250ms"][..]),
            0..4u64
        )
            .prop_map(|(r, q)| format!("shaper:rate={r},queue={q}")),
        (1..5u64).prop_map(|l| format!("concurrency:limit={l}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// The sliding log never admits more than `limit` cost in any window
    /// (t - window, t], with try and with acquire (admission = arrival + wait); the
    /// bucketed sliding window never more than `limit` in any K consecutive buckets.
    #[test]
    fn sliding_windows_never_exceed_the_limit(
        limit in 1..6u64,
        window in prop::sample::select(&[10_000u64, 1_000_000, 7_000][..]),
        log in any::<bool>(),
        buckets in 1..6u64,
        trace in trace(4_000, 3, 200),
    ) {
        // Bucket width: window/1000 us, so traces span many buckets.
        let width = window / 1000;
        let spec = if log {
            format!("sliding-log:limit={limit},window={window}us")
        } else {
            format!("sliding-window:limit={limit},window={}us,buckets={buckets}", width * buckets)
        };
        let p = policy(&spec);
        let mut admitted: Vec<(u64, u64)> = run(&p, &trace, true)
            .into_iter()
            .filter_map(|(t, c, d)| d.ok().filter(|d| d.allowed).map(|d| (t + d.wait_us, c)))
            .collect();
        admitted.sort();
        for &(t, _) in &admitted {
            let counts = |u: u64| if log { u + window > t && u <= t } else { u / width + buckets > t / width && u / width <= t / width };
            let in_window: u64 = admitted.iter().filter(|&&(u, _)| counts(u)).map(|&(_, c)| c).sum();
            prop_assert!(in_window <= limit, "{spec}: {in_window} in the window ending {t}");
        }
    }

    /// Fixed windows never admit more than `limit` in one window.
    #[test]
    fn fixed_window_never_exceeds_the_limit_per_window(limit in 1..6u64, trace in trace(300_000, 3, 200)) {
        let p = policy(&format!("fixed-window:limit={limit},window=1s"));
        let mut per_window = std::collections::HashMap::new();
        for (t, c, d) in run(&p, &trace, true) {
            if let Ok(d) = d.filter_allowed() {
                *per_window.entry((t + d.wait_us) / 1_000_000).or_insert(0) += c;
            }
        }
        prop_assert!(per_window.values().all(|&n| n <= limit), "{per_window:?}");
    }

    /// GCRA, token bucket and leaky bucket with equal parameters make identical
    /// decisions, for try and acquire, on awkward rates.
    #[test]
    fn gcra_token_bucket_and_leaky_bucket_agree(
        r in rate(),
        burst in 1..6u64,
        max_wait in prop::option::of(0..2_000_000u64),
        trace in trace(500_000, 6, 120),
    ) {
        let mw = max_wait.map(|w| format!(",max-wait={w}us")).unwrap_or_default();
        let g = run(&policy(&format!("gcra:rate={r},burst={burst}{mw}")), &trace, true);
        let tb = run(&policy(&format!("token-bucket:rate={r},capacity={burst}{mw}")), &trace, true);
        let lb = run(&policy(&format!("leaky-bucket:rate={r},capacity={burst}{mw}")), &trace, true);
        prop_assert_eq!(&g, &tb);
        prop_assert_eq!(&g, &lb);
    }

    /// `remaining` is exact: right after any decision, exactly `remaining` more unit
    /// tries are admitted at the same instant, and the next one is rejected.
    #[test]
    fn remaining_is_exact(spec in any_spec(), trace in trace(400_000, 3, 40)) {
        let p = policy(&spec);
        let mut s = p.init(0);
        let mut t = 0;
        for &(gap, cost, acquire) in &trace {
            t += gap;
            let op = if acquire { Op::Acquire } else { Op::Try };
            let Ok(d) = p.check(&mut s, t, cost, op) else { continue };
            prop_assert_eq!(p.remaining(&s, t), d.remaining, "{}: Policy::remaining disagrees", spec);
            prop_assert_eq!(p.reset_after(&s, t), d.reset_after_us, "{}: Policy::reset_after disagrees", spec);
            let mut probe = s.clone();
            for i in 0..d.remaining {
                let next = p.check(&mut probe, t, 1, Op::Try).unwrap();
                prop_assert!(next.allowed, "{spec} at {t}: remaining {} but unit #{} rejected", d.remaining, i + 1);
            }
            let next = p.check(&mut probe, t, 1, Op::Try).unwrap();
            prop_assert!(!next.allowed, "{spec} at {t}: remaining {} but one more admitted", d.remaining);
        }
    }

    /// An admitted acquire never waits longer than max-wait, and acquires of one key
    /// are admitted in arrival order (FIFO).
    #[test]
    fn acquire_respects_max_wait_and_fifo(
        spec in any_spec(),
        max_wait in 0..3_000_000u64,
        trace in trace(300_000, 3, 60),
    ) {
        if spec.starts_with("concurrency") {
            // Open permits have no known release time: covered by the unit tests.
            return Ok(());
        }
        // limit-req's admission is followed by its delay, which may shrink as excess drains.
        let fifo = !spec.starts_with("limit-req");
        let p = policy(&format!("{spec},max-wait={max_wait}us"));
        let mut s = p.init(0);
        let mut t = 0;
        let mut last_admission = 0;
        for &(gap, cost, _) in &trace {
            t += gap;
            let Ok(d) = p.check(&mut s, t, cost, Op::Acquire) else { continue };
            if d.allowed {
                prop_assert!(d.wait_us <= max_wait, "{spec}: waited {} > {max_wait}", d.wait_us);
                let admission = t + d.wait_us;
                prop_assert!(!fifo || admission >= last_admission, "{spec}: admitted at {admission} before an earlier request's {last_admission}");
                last_admission = admission;
            } else {
                prop_assert!(d.retry_after().is_some());
            }
        }
    }

    /// A try that is rejected with retry_after r is admitted when retried at exactly
    /// t + r (with nothing else in between), and not at t + r - 1.
    #[test]
    fn retry_after_is_exact(spec in any_spec(), trace in trace(400_000, 3, 40)) {
        if spec.starts_with("smooth") || spec.starts_with("concurrency") {
            // Smooth limiters admit any cost once nextFree has passed (covered by the
            // Guava golden vectors); open permits have no known release time.
            return Ok(());
        }
        let p = policy(&spec);
        let mut s = p.init(0);
        let mut t = 0;
        for &(gap, cost, _) in &trace {
            t += gap;
            let Ok(d) = p.check(&mut s, t, cost, Op::Try) else { continue };
            if let (false, Some(r)) = (d.allowed, d.retry_after_us) {
                prop_assert!(r > 0);
                prop_assert!(p.peek(&s, t + r, cost).unwrap().allowed, "{spec}: not admitted at t+retry_after ({t}+{r})");
                if !spec.starts_with("limit-req") {
                    prop_assert!(!p.peek(&s, t + r - 1, cost).unwrap().allowed, "{spec}: admitted before t+retry_after");
                }
            }
        }
    }

    /// A policy prints back as a spec that parses to the same policy.
    #[test]
    fn specs_round_trip(spec in any_spec(), mw in prop::option::of(0..100_000u64), shadow in any::<bool>()) {
        let mut full = spec;
        if let Some(w) = mw { full.push_str(&format!(",max-wait={w}ms")); }
        if shadow { full.push_str(",shadow=true"); }
        let chargeable = !full.starts_with("shaper") && !full.starts_with("concurrency");
        if chargeable && mw.is_some_and(|w| w % 2 == 0) { full.push_str(",max-debt=7"); }
        let p = policy(&full);
        let printed = p.to_string();
        prop_assert_eq!(policy(&printed), p, "{} printed as {}", full, printed);
    }
}

trait FilterAllowed {
    fn filter_allowed(self) -> Result<Decision, ()>;
}

impl FilterAllowed for Result<Decision, CheckError> {
    fn filter_allowed(self) -> Result<Decision, ()> {
        self.ok().filter(|d| d.allowed).ok_or(())
    }
}

/// Extreme parameters for every algorithm: the largest counts and durations a spec
/// accepts, and the smallest.
fn extreme_spec() -> impl Strategy<Value = String> {
    let count = prop::sample::select(&[1u64, 2, 1 << 40][..]);
    let dur = prop::sample::select(&["1us", "1125899906842624us", "3us"][..]);
    let rate = prop::sample::select(
        &[
            "1/1us",
            "1099511627776/1us",
            "1/1125899906842624us",
            "1099511627776/d",
            "4096/1us",
        ][..],
    );
    prop_oneof![
        (count.clone(), dur.clone())
            .prop_map(|(l, w)| format!("fixed-window:limit={l},window={w}")),
        (count.clone(), dur.clone())
            .prop_map(|(l, w)| format!("fixed-window:limit={l},window={w},align=first")),
        (count.clone(), dur.clone()).prop_map(|(l, w)| format!("sliding-log:limit={l},window={w}")),
        (count.clone(), dur.clone())
            .prop_map(|(l, w)| format!("sliding-window:limit={l},window={w}")),
        count
            .clone()
            .prop_map(|l| format!("sliding-window:limit={l},window=1125899906842624us,buckets=2")),
        (rate.clone(), count.clone())
            .prop_map(|(r, c)| format!("leaky-bucket:rate={r},capacity={c}")),
        (rate.clone(), count.clone())
            .prop_map(|(r, c)| format!("token-bucket:rate={r},capacity={c}")),
        (rate.clone(), count.clone()).prop_map(|(r, c)| format!("gcra:rate={r},burst={c}")),
        (rate.clone(), dur.clone())
            .prop_map(|(r, b)| format!("smooth-bursty:rate={r},max-burst={b}")),
        (rate.clone(), dur.clone()).prop_map(|(r, w)| format!("smooth-warmup:rate={r},warmup={w}")),
        (rate.clone(), count.clone()).prop_map(|(r, b)| format!("limit-req:rate={r},burst={b}")),
        (rate.clone(), count.clone()).prop_map(|(r, q)| format!("shaper:rate={r},queue={q}")),
        count.prop_map(|l| format!("concurrency:limit={l}")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Huge costs, rates, durations and times never panic or wrap (tests build with
    /// overflow checks on): every call returns a decision or an error.
    #[test]
    fn extremes_never_panic(
        spec in extreme_spec(),
        steps in prop::collection::vec(
            (prop::sample::select(&[0u64, 1, 999, 1 << 32, 1 << 52, u64::MAX / 2, u64::MAX][..]),
             prop::sample::select(&[1u64, 2, 1 << 40, u64::MAX][..]),
             0..5u8),
            1..20),
    ) {
        // Specs the parser rejects (e.g. GCRA's exact-tick bound) are fine: skip them.
        let Ok(p) = spec.parse::<Policy>() else { return Ok(()) };
        let mut s = p.init(0);
        let mut t = 0u64;
        for (gap, cost, what) in steps {
            t = t.saturating_add(gap);
            match what {
                0 => { let _ = p.check(&mut s, t, cost, Op::Try); }
                1 => { let _ = p.check(&mut s, t, cost, Op::Acquire); }
                2 => { let _ = p.peek(&s, t, cost); }
                3 => { let _ = p.charge(&mut s, t, cost); }
                _ => p.refund(&mut s, t, cost),
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// The lock-free hot path (`Gcra::decide` on a bare word) is the same arithmetic as
    /// the general `Algorithm::check`.
    #[test]
    fn gcra_fast_path_equals_check(
        r in rate(),
        burst in 1..6u64,
        max_wait in prop::option::of(0..2_000_000u64),
        trace in trace(500_000, 6, 80),
    ) {
        use tollgate_core::algorithms::{Gcra, GcraState};
        use tollgate_core::{Algorithm, CheckMode, Rate};
        let g = Gcra::new(Rate::parse(r).unwrap(), burst).unwrap();
        let (mut word, mut state, mut t) = (0u64, GcraState::default(), 0u64);
        for (gap, cost, acquire) in trace {
            t += gap;
            let mode = if acquire { CheckMode::Acquire { max_wait_us: max_wait } } else { CheckMode::Try };
            let fast = g.decide(word, t, cost, mode);
            let slow = g.check(&mut state, t, cost, mode);
            prop_assert_eq!(fast.map(|(_, d)| d), slow);
            if let Ok((w, _)) = fast { word = w; }
            prop_assert_eq!(word, state.tat);
        }
    }
}

/// The admissions `(arrival + wait, cost)` of a trace with tries and acquires (gaps a
/// tenth as long when `dense`, so bursts meet the limit), in trace order, and its
/// largest cost.
fn admissions(p: &Policy, trace: Trace, dense: bool) -> (Vec<(u64, u64)>, u64) {
    let trace: Trace = trace
        .into_iter()
        .map(|(gap, cost, acq)| (if dense { gap / 10 } else { gap }, cost, acq))
        .collect();
    let max_cost = trace.iter().map(|r| r.1).max().unwrap_or(1);
    let admitted = run(p, &trace, true)
        .into_iter()
        .filter_map(|(t, cost, d)| match d {
            Ok(d) if d.allowed => Some((t + d.wait_us, cost)),
            _ => None,
        })
        .collect();
    (admitted, max_cost)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Every algorithm keeps its promise: on random traffic (tries and acquires,
    /// bursts and gaps), the units admitted in any window of length w, by admission
    /// time (arrival + wait), never exceed `Policy::envelope(w)`, for window lengths
    /// around the policy's own (its window, its interval, nginx's millisecond) and
    /// random ones, with costs of 1 to 3 (`envelope_for`: Guava's and the shaper's
    /// admit a larger request at once).
    #[test]
    fn no_window_holds_more_than_the_envelope(
        spec in prop_oneof![
            4 => any_spec(),
            // Guava's at rates whose interval is not whole microseconds.
            1 => prop::sample::select(&["3000/s", "7/ms", "999/s"][..]).prop_map(|r| format!("smooth-bursty:rate={r}")),
            1 => prop::sample::select(&["3000/s", "7/ms"][..]).prop_map(|r| format!("smooth-warmup:rate={r},warmup=10ms")),
        ],
        trace in trace(60_000, 3, 300),
        dense in any::<bool>(),
        extra in prop::collection::vec(1..5_000_000u64, 4),
    ) {
        let p = policy(&spec);
        prop_assume!(p.envelope(1).is_some());
        let (mut admitted, max_cost) = admissions(&p, trace, dense);
        admitted.sort_unstable();
        let own = p.window_us().max(1);
        let mut lengths = vec![1, 2, 999, 1000, 1001, 1999, 2001, own - 1, own, own + 1, 2 * own, 3 * own + 7];
        lengths.extend(extra);
        for w in lengths.into_iter().filter(|&w| w > 0) {
            let envelope = p.envelope_for(w, max_cost).unwrap();
            let seen = densest_window(&admitted, w).0;
            prop_assert!(seen <= envelope, "{spec}: {seen} units in a window of {w} us, envelope {envelope}");
        }
    }
}

#[test]
fn envelopes_are_the_documented_ones() {
    let env = |spec: &str, w: u64| policy(spec).envelope(w).unwrap();
    // GCRA: burst + rate x w, less the unit the burst already counts.
    assert_eq!(env("gcra:rate=150/s,burst=50", 333_334), 100);
    assert_eq!(env("gcra:rate=150/s,burst=50", 1), 50);
    assert_eq!(env("token-bucket:rate=10/s,capacity=5", 1_000_000), 14);
    // Fixed window: twice the limit across one boundary, once within one instant.
    assert_eq!(env("fixed-window:limit=150,window=1s", 1_000_000), 300);
    assert_eq!(env("fixed-window:limit=150,window=1s", 1), 150);
    assert_eq!(env("fixed-window:limit=150,window=1s", 1_000_002), 450);
    // Sliding log: exactly the limit per window length.
    assert_eq!(env("sliding-log:limit=150,window=1s", 1_000_000), 150);
    assert_eq!(env("sliding-log:limit=150,window=1s", 1_000_001), 300);
    // Guava: stored permits plus the rate (the first pays forward).
    assert_eq!(env("smooth-bursty:rate=10/s", 1), 11);
    assert_eq!(env("smooth-warmup:rate=150/s,warmup=5s", 5_000_000), 751);
    // nginx: burst + 1 at once, then the leak per millisecond spanned.
    assert_eq!(env("limit-req:rate=10/s,burst=5,nodelay", 1), 6);
    assert_eq!(env("limit-req:rate=10/s,burst=5,nodelay", 1_000_000), 16);
    assert_eq!(env("shaper:rate=10/s,queue=5", 1_000_000), 10);
    assert_eq!(policy("concurrency:limit=3").envelope(1_000_000), None);
    // Guava's interval truncates to 0 us above a million a second: no promise.
    assert_eq!(policy("smooth-bursty:rate=2000000/s").envelope(1), None);
}

/// The length a spec names: its window, else its rate's period.
fn named_length(spec: &str) -> u64 {
    let value = |key: &str| {
        spec.split([':', ','])
            .find_map(|kv| kv.strip_prefix(key))
            .map(str::to_owned)
    };
    match (value("window="), value("rate=")) {
        (Some(w), _) => tollgate_core::parse_duration(&w).unwrap(),
        (None, Some(r)) => tollgate_core::Rate::parse(&r).unwrap().period_us,
        _ => unreachable!("{spec} names no length"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// `margin=m` keeps a policy's promise where the work lands: admissions of the
    /// policy with the margin, each delivered up to `m` later (random lateness, and
    /// the extremes), never put more units into a window of the length the spec
    /// names (or two or three of them) than the policy without the margin admits
    /// into it.
    #[test]
    fn a_margin_keeps_the_envelope_where_work_arrives(
        spec in any_spec().prop_filter("rates and sliding windows", |s| {
            !s.starts_with("fixed-window") && !s.starts_with("concurrency")
        }),
        margin in prop::sample::select(&[1u64, 300, 999, 1_000, 3_000, 20_001][..]),
        trace in trace(60_000, 3, 300),
        dense in any::<bool>(),
        lateness in prop::collection::vec(any::<u64>(), 300),
        pattern in 0..3u8,
    ) {
        let widened = Policy::parse(&format!("{spec},margin={margin}us"));
        // A bucketed window plus the margin must still split into whole buckets.
        prop_assume!(widened.is_ok());
        let (p, widened) = (policy(&spec), widened.unwrap());
        prop_assume!(p.envelope(1).is_some());
        let (admitted, max_cost) = admissions(&widened, trace, dense);
        let mut arrived: Vec<(u64, u64)> = admitted
            .into_iter()
            .zip(&lateness)
            .map(|((at, cost), late)| {
                let late = match pattern {
                    0 => late % (margin + 1),
                    1 => margin * (late % 2), // each on time or as late as allowed
                    _ => 0,
                };
                (at + late, cost)
            })
            .collect();
        arrived.sort_unstable();
        let named = named_length(&spec);
        for w in [named, 2 * named, 3 * named] {
            let envelope = p.envelope_for(w, max_cost).unwrap();
            let seen = densest_window(&arrived, w).0;
            prop_assert!(
                seen <= envelope,
                "{spec},margin={margin}us: {seen} units arrived in a window of {w} us, \
                 the policy without the margin admits {envelope}"
            );
        }
    }
}

#[test]
fn a_margin_is_the_wider_policy_and_says_where_it_cannot_help() {
    assert_eq!(
        policy("gcra:rate=5/s,burst=1,margin=10ms").to_string(),
        "gcra:rate=5/1010ms,burst=1"
    );
    assert_eq!(
        policy("sliding-log:limit=5,window=1s,margin=20ms"),
        policy("sliding-log:limit=5,window=1020ms")
    );
    assert_eq!(
        policy("smooth-warmup:rate=10/s,warmup=2s,margin=0us"),
        policy("smooth-warmup:rate=10/s,warmup=2s")
    );
    let err = |spec: &str| Policy::parse(spec).unwrap_err().to_string();
    assert!(
        err("fixed-window:limit=5,window=1s,margin=10ms").contains("use sliding-log:"),
        "{}",
        err("fixed-window:limit=5,window=1s,margin=10ms")
    );
    assert!(err("concurrency:limit=5,margin=10ms").contains("unknown parameter 'margin'"));
    assert!(err("gcra:rate=5/s,margin=soon").contains("bad value 'soon' for 'margin'"));
}

#[test]
fn a_margin_that_breaks_a_parameter_is_named_in_the_error() {
    let err = Policy::parse("sliding-window:limit=5,window=1s,buckets=10,margin=1us")
        .unwrap_err()
        .to_string();
    assert!(err.contains("margin=1us is part of it"), "{err}");
}
