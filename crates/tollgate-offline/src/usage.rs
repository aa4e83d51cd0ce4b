//! `tollgate simulate --usage`: budgets whose cost is known only after the work (the
//! tokens of LLM completions). Each request is admitted while its key has a unit
//! left, which it takes; its usage, drawn from a seeded log-normal distribution, is
//! charged `--usage-after` later (the work's duration) — into debt if need be. The
//! report says what was charged and how deep and how long the first key went into
//! debt; the chart draws that key's budget over time, below zero while in debt.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde::Serialize;
use tollgate::policy::PolicyState;
use tollgate::{Op, Policy};

use super::traffic::{Arrival, Rng};

/// `--usage MEDIAN[:SIGMA]`: usages log-normal around `median` (`sigma` the spread
/// of their logarithm, default 0.5), at least 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageDist {
    /// The median usage, in units.
    pub median: f64,
    /// The standard deviation of the usage's natural logarithm.
    pub sigma: f64,
}

impl std::str::FromStr for UsageDist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--usage '{s}': expected MEDIAN[:SIGMA], e.g. 800 or 800:0.7");
        let (m, sg) = s.split_once(':').unwrap_or((s, "0.5"));
        let median: f64 = m.trim().parse().map_err(|_| bad())?;
        let sigma: f64 = sg.trim().parse().map_err(|_| bad())?;
        if !((1.0..=1e9).contains(&median) && (0.0..=3.0).contains(&sigma)) {
            return Err(format!(
                "--usage '{s}': the median must be between 1 and 1e9 and the spread between 0 and 3"
            ));
        }
        Ok(UsageDist { median, sigma })
    }
}

impl UsageDist {
    /// One usage (Box-Muller on the seeded generator), between 1 and 100x the median.
    fn draw(&self, rng: &mut Rng) -> u64 {
        let (u1, u2) = (1.0 - rng.unit(), rng.unit());
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let x = self.median * (self.sigma * z).exp();
        (x.round().clamp(1.0, self.median * 100.0)) as u64
    }
}

/// One policy's totals under `--usage`.
#[derive(Debug, Clone, Serialize)]
pub struct UsageSummary {
    /// The policy spec.
    pub policy: String,
    /// Requests offered.
    pub offered: u64,
    /// Admitted (a unit left at arrival).
    pub admitted: u64,
    /// Rejected.
    pub rejected: u64,
    /// Units the admitted requests used (admissions plus usage; `max-debt` may forgive
    /// some of them).
    pub used_units: u64,
    /// The deepest the first key went into debt, in units past empty.
    pub deepest_debt: u64,
    /// The share of the run the first key spent with nothing left (spent or in debt).
    pub exhausted_share: f64,
}

/// A policy under `--usage`: the totals and the first key's budget over time
/// (seconds, units; negative while in debt).
pub struct UsageRun {
    /// The totals.
    pub summary: UsageSummary,
    /// The first key's budget, sampled 400 times over the run.
    pub balance: Vec<(f64, f64)>,
}

/// How many samples of the first key's budget a run takes.
const SAMPLES: u64 = 400;

/// Runs `arrivals` through `policy` with usages from `dist` charged `after_us` after
/// each admission (one state per key, created at 0).
pub fn run(
    policy: &Policy,
    arrivals: &[Arrival],
    dist: UsageDist,
    after_us: u64,
    seed: u64,
    duration_us: u64,
) -> anyhow::Result<UsageRun> {
    if let Err(e) = policy.chargeable() {
        anyhow::bail!("--usage: {policy}: {e}");
    }
    let offered = arrivals.len() as u64;
    let mut rng = Rng(seed ^ 0x005e_ed0f_0a6e);
    let mut states: HashMap<u64, PolicyState> = HashMap::new();
    // Charges to come: (time, order, key, units).
    let mut due: BinaryHeap<Reverse<(u64, u64, u64, u64)>> = BinaryHeap::new();
    let first_key = arrivals.first().map_or(0, |a| a.1);
    let step = (duration_us / SAMPLES).max(1);
    let mut next_sample = 0u64;
    let mut balance = Vec::with_capacity(SAMPLES as usize + 1);
    let (mut exhausted, mut deepest) = (0u64, 0u64);
    let (mut admitted, mut charged) = (0u64, 0u64);
    let mut order = 0u64;
    // Events in time order: due charges before an arrival at the same instant.
    let mut arrivals = arrivals.iter().peekable();
    loop {
        let next_charge = due.peek().map(|Reverse(c)| c.0);
        let next_arrival = arrivals.peek().map(|a| a.0);
        let t = match (next_charge, next_arrival) {
            (None, None) => break,
            (Some(c), Some(a)) => c.min(a),
            (Some(c), None) => c,
            (None, Some(a)) => a,
        };
        // Samples of the first key up to (not including) this instant.
        while next_sample < t.min(duration_us + 1) {
            let b = states
                .get(&first_key)
                .map_or(policy.limit() as f64, |s| budget(policy, s, next_sample));
            if b <= 0.0 {
                exhausted += 1;
                deepest = deepest.max((-b) as u64);
            }
            balance.push((next_sample as f64 / 1e6, b));
            next_sample += step;
        }
        if next_charge == Some(t) {
            let Some(Reverse((_, _, key, units))) = due.pop() else {
                break;
            };
            let state = states.entry(key).or_insert_with(|| policy.init(0));
            let _ = policy.charge(state, t, units)?;
            continue;
        }
        let Some(&(t, key, cost)) = arrivals.next() else {
            break;
        };
        let state = states.entry(key).or_insert_with(|| policy.init(0));
        let admit = matches!(policy.check(state, t, cost, Op::Try), Ok(d) if d.allowed && !d.shadow_rejected);
        if admit {
            admitted += 1;
            let usage = dist.draw(&mut rng);
            charged += usage.max(cost);
            if usage > cost {
                order += 1;
                due.push(Reverse((
                    t.saturating_add(after_us),
                    order,
                    key,
                    usage - cost,
                )));
            }
        }
    }
    Ok(UsageRun {
        summary: UsageSummary {
            policy: policy.to_string(),
            offered,
            admitted,
            rejected: offered - admitted,
            used_units: charged,
            deepest_debt: deepest,
            exhausted_share: exhausted as f64 / balance.len().max(1) as f64,
        },
        balance,
    })
}

/// A key's budget at `t`, in units: what a try would still admit, or while nothing
/// is left, minus the units past empty (how many units given back would leave one).
fn budget(policy: &Policy, state: &PolicyState, t: u64) -> f64 {
    let left = policy.remaining(state, t);
    if left > 0 {
        return left as f64;
    }
    let frees = |k: u64| {
        let mut s = state.clone();
        policy.refund(&mut s, t, k);
        policy.remaining(&s, t) > 0
    };
    // The fewest units given back that leave one: doubling, then halving.
    let mut hi = 1u64;
    while !frees(hi) {
        if hi >= tollgate::policy::MAX_COUNT * 4 {
            return -(hi as f64);
        }
        hi *= 2;
    }
    let mut lo = hi / 2;
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if frees(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    -((hi - 1) as f64)
}
