//! Random operation sequences (try, acquire, peek, refund, reset, time steps) through
//! every algorithm, checking their invariants after each step:
//! - `remaining` is exact: exactly that many unit tries are admitted at once, then a
//!   reject;
//! - a peek changes nothing and says what a try would;
//! - the window algorithms never admit more than `limit` in a window (without
//!   refunds, which give units back);
//! - GCRA, token bucket and leaky bucket with equal parameters decide alike.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tollgate_core::{Op, Policy, PolicyState};

#[derive(Debug, Arbitrary)]
struct Case {
    algorithm: u8,
    a: u8,
    b: u8,
    scale: u8,
    max_wait: Option<u16>,
    steps: Vec<Step>,
}

#[derive(Debug, Arbitrary)]
enum Step {
    Try { gap: u16, cost: u8 },
    Acquire { gap: u16, cost: u8 },
    Peek { cost: u8 },
    Refund { cost: u8 },
    Reset,
}

const RATES: [&str; 6] = ["3/s", "7/m", "10/s", "5/250ms", "6/7ms", "1000/s"];
const WINDOWS: [&str; 4] = ["10ms", "1s", "250ms", "7ms"];

fn spec(c: &Case) -> String {
    let n = u64::from(c.a % 6) + 1;
    let rate = RATES[usize::from(c.b) % RATES.len()];
    let window = WINDOWS[usize::from(c.b) % WINDOWS.len()];
    let base = match c.algorithm % 12 {
        0 => format!("fixed-window:limit={n},window={window}"),
        1 => format!("fixed-window:limit={n},window={window},align=first"),
        2 => format!("sliding-log:limit={n},window={window}"),
        3 => format!(
            "sliding-window:limit={n},window=300ms,buckets={}",
            c.b % 5 + 1
        ),
        4 => format!("sliding-window:limit={n},window={window},mode=weighted"),
        5 => format!("gcra:rate={rate},burst={n}"),
        6 => format!("smooth-bursty:rate={rate}"),
        7 => format!(
            "smooth-warmup:rate={},warmup=2s",
            ["1/s", "10/s", "3/s"][usize::from(c.b) % 3]
        ),
        8 => format!(
            "limit-req:rate={},burst={}{}",
            ["1/s", "10/s", "30/m", "3/s", "7/m"][usize::from(c.b) % 5],
            n - 1,
            [
                ",nodelay".to_string(),
                String::new(),
                format!(",delay={}", (n - 1).min(1))
            ][usize::from(c.a >> 4) % 3]
        ),
        9 => format!(
            "shaper:rate={},queue={}",
            ["10/s", "3/s", "5/250ms"][usize::from(c.b) % 3],
            c.a % 4
        ),
        10 => format!("token-bucket:rate={rate},capacity={n}"),
        _ => format!("leaky-bucket:rate={rate},capacity={n}"),
    };
    match c.max_wait {
        Some(w) => format!("{base},max-wait={}us", u64::from(w) * 100),
        None => base,
    }
}

/// What one run decided: (time, cost, admitted at) per try or acquire.
type Decided = Vec<(u64, u64, Option<u64>)>;

fn run(policy: &Policy, c: &Case) -> Decided {
    let scale = u64::from(c.scale % 4) * 333 + 1;
    let mut state: PolicyState = policy.init(0);
    let mut t = 0u64;
    let mut decided = Vec::new();
    for step in &c.steps {
        let (gap, cost, op) = match *step {
            Step::Try { gap, cost } => (gap, cost, Some(Op::Try)),
            Step::Acquire { gap, cost } => (gap, cost, Some(Op::Acquire)),
            Step::Peek { cost } => (0, cost, None),
            Step::Refund { cost } => {
                policy.refund(&mut state, t, u64::from(cost % 4) + 1);
                continue;
            }
            Step::Reset => {
                policy.reset(&mut state, t);
                continue;
            }
        };
        t += u64::from(gap) * scale;
        let cost = u64::from(cost % 4) + 1;
        let Some(op) = op else {
            let before = state.clone();
            let peeked = policy.peek(&state, t, cost);
            assert_eq!(state, before, "{policy}: a peek changed the state");
            let tried = policy.check(&mut state.clone(), t, cost, Op::Try);
            assert_eq!(
                peeked.ok(),
                tried.ok(),
                "{policy}: a peek at {t} is not what a try gets"
            );
            continue;
        };
        let Ok(d) = policy.check(&mut state, t, cost, op) else {
            decided.push((t, cost, None));
            continue;
        };
        decided.push((t, cost, d.allowed.then_some(t + d.wait_us)));
        assert_eq!(
            policy.remaining(&state, t),
            d.remaining,
            "{policy}: remaining disagrees"
        );
        let mut probe = state.clone();
        for i in 0..d.remaining.min(64) {
            let next = policy.check(&mut probe, t, 1, Op::Try).unwrap();
            assert!(
                next.allowed,
                "{policy} at {t}: remaining {} but unit #{} rejected",
                d.remaining,
                i + 1
            );
        }
        if d.remaining <= 64 {
            let next = policy.check(&mut probe, t, 1, Op::Try).unwrap();
            assert!(
                !next.allowed,
                "{policy} at {t}: remaining {} but one more admitted",
                d.remaining
            );
        }
    }
    decided
}

fuzz_target!(|c: Case| {
    let spec = spec(&c);
    let policy: Policy = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    let decided = run(&policy, &c);
    let refunds = c
        .steps
        .iter()
        .any(|s| matches!(s, Step::Refund { .. } | Step::Reset));
    if !refunds && spec.starts_with("sliding-log") {
        let limit = policy.limit();
        let window = policy.window_us();
        let admitted: Vec<(u64, u64)> = decided
            .iter()
            .filter_map(|&(_, c, at)| at.map(|at| (at, c)))
            .collect();
        for &(end, _) in &admitted {
            let inside: u64 = admitted
                .iter()
                .filter(|&&(u, _)| u + window > end && u <= end)
                .map(|&(_, c)| c)
                .sum();
            assert!(
                inside <= limit,
                "{spec}: {inside} admitted in the window ending {end}"
            );
        }
    }
    if !refunds && spec.starts_with("fixed-window") && !spec.contains("align=first") {
        let (limit, window) = (policy.limit(), policy.window_us());
        let mut per = std::collections::HashMap::new();
        for &(_, c, at) in &decided {
            if let Some(at) = at {
                *per.entry(at / window).or_insert(0) += c;
            }
        }
        assert!(per.values().all(|&n| n <= limit), "{spec}: {per:?}");
    }
    // The three rate algorithms agree for equal parameters.
    if c.algorithm % 12 == 5 || c.algorithm % 12 == 10 || c.algorithm % 12 == 11 {
        let (rest, _) = spec.split_once(",max-wait").unwrap_or((&spec, ""));
        let tail = &spec[rest.len()..];
        let (rate, n) = (
            RATES[usize::from(c.b) % RATES.len()],
            u64::from(c.a % 6) + 1,
        );
        let specs = [
            format!("gcra:rate={rate},burst={n}{tail}"),
            format!("token-bucket:rate={rate},capacity={n}{tail}"),
            format!("leaky-bucket:rate={rate},capacity={n}{tail}"),
        ];
        let runs: Vec<Decided> = specs.iter().map(|s| run(&s.parse().unwrap(), &c)).collect();
        assert_eq!(runs[0], runs[1], "{} vs {}", specs[0], specs[1]);
        assert_eq!(runs[0], runs[2], "{} vs {}", specs[0], specs[2]);
    }
});
