//! One policy over a traffic: what happened to each request ([`Fate`]), the totals
//! ([`Summary`]), and the table and CSV that report them.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use tollgate::policy::PolicyState;
use tollgate::{Op, Policy};

use super::traffic::Arrival;

/// One request's fate under one policy.
#[derive(Debug, Clone, Copy)]
pub struct Fate {
    /// Arrival, us.
    pub t: u64,
    /// Key index.
    pub key: u64,
    /// Admitted.
    pub allowed: bool,
    /// Wait (acquire, delay, schedule), us.
    pub wait: u64,
}

/// A policy's totals.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The policy spec.
    pub policy: String,
    /// Requests offered.
    pub offered: u64,
    /// Admitted.
    pub admitted: u64,
    /// Rejected.
    pub rejected: u64,
    /// Admitted after a wait.
    pub delayed: u64,
    /// The largest count admitted (by admission time) in any window of the policy's
    /// length, for one key.
    pub worst_window: u64,
    /// That window's length, us.
    pub window_us: u64,
    /// Where it starts, us.
    pub worst_window_start_us: u64,
    /// The policy's headline limit.
    pub limit: u64,
    /// Whether the worst window broke the limit a window algorithm promises (rate
    /// algorithms promise `limit` at one instant plus their rate over time, so a
    /// window may legitimately hold more).
    pub over_limit: bool,
    /// Mean wait of delayed requests, us.
    pub mean_wait_us: u64,
    /// 99th percentile wait of delayed requests, us.
    pub p99_wait_us: u64,
}

/// Runs `arrivals` through `policy` (one state per key, created at 0); admitted
/// requests hold `concurrency` permits for `hold_us` (none: until the end).
pub fn run(
    policy: &Policy,
    arrivals: &[Arrival],
    hold_us: Option<u64>,
    progress: &mut dyn FnMut(usize),
) -> (Vec<Fate>, Summary) {
    let mut states: HashMap<u64, PolicyState> = HashMap::new();
    let mut fates = Vec::with_capacity(arrivals.len());
    for (i, &(t, key, cost)) in arrivals.iter().enumerate() {
        if i % 65_536 == 0 {
            progress(i);
        }
        let state = states.entry(key).or_insert_with(|| policy.init(0));
        let (allowed, wait) = match policy.check_hold(state, t, cost, hold_us, Op::Try) {
            Ok(d) => (d.allowed && !d.shadow_rejected, d.wait_us),
            Err(_) => (false, 0),
        };
        fates.push(Fate {
            t,
            key,
            allowed,
            wait,
        });
    }
    let summary = summarize(policy, &fates);
    (fates, summary)
}

fn summarize(policy: &Policy, fates: &[Fate]) -> Summary {
    let window = match policy.window_us() {
        0 => 1_000_000,
        w => w,
    };
    // Keys in order, so that ties between equally bad windows resolve the same way on
    // every run.
    let mut by_key: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for f in fates.iter().filter(|f| f.allowed) {
        by_key.entry(f.key).or_default().push(f.t + f.wait);
    }
    let (mut worst, mut worst_start) = (0u64, 0u64);
    for times in by_key.values_mut() {
        times.sort_unstable();
        let mut lo = 0;
        for hi in 0..times.len() {
            while times[hi] - times[lo] >= window {
                lo += 1;
            }
            let n = (hi - lo + 1) as u64;
            if n > worst {
                worst = n;
                worst_start = times[lo];
            }
        }
    }
    let mut waits: Vec<u64> = fates
        .iter()
        .filter(|f| f.allowed && f.wait > 0)
        .map(|f| f.wait)
        .collect();
    waits.sort_unstable();
    let admitted = fates.iter().filter(|f| f.allowed).count() as u64;
    Summary {
        policy: policy.to_string(),
        offered: fates.len() as u64,
        admitted,
        rejected: fates.len() as u64 - admitted,
        delayed: waits.len() as u64,
        worst_window: worst,
        window_us: window,
        worst_window_start_us: worst_start,
        limit: policy.limit(),
        over_limit: worst > policy.limit() && per_window(policy),
        mean_wait_us: if waits.is_empty() {
            0
        } else {
            waits.iter().sum::<u64>() / waits.len() as u64
        },
        p99_wait_us: waits
            .get((waits.len() * 99 / 100).min(waits.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0),
    }
}

/// The width of a table's policy column: the longest spec, at least the header's.
pub fn policy_column<'a>(policies: impl Iterator<Item = &'a str>) -> usize {
    policies.map(str::len).max().unwrap_or(6).max(6)
}

/// The summary table, coloured when `color`.
pub fn table(summaries: &[Summary], color: bool) -> String {
    let paint = |code: &str, s: String| {
        if color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s
        }
    };
    let w = policy_column(summaries.iter().map(|s| s.policy.as_str()));
    let mut out = format!(
        "{:<w$} {:>9} {:>9} {:>9} {:>8}  {:<34} {:>10} {:>10}\n",
        "policy",
        "offered",
        "admitted",
        "rejected",
        "delayed",
        "worst window",
        "mean wait",
        "p99 wait"
    );
    for s in summaries {
        let worst = format!(
            "{} in {} vs limit {}",
            s.worst_window,
            tollgate::policy::fmt_duration(s.window_us),
            s.limit
        );
        let worst = format!("{worst:<34}");
        let worst = if s.over_limit {
            paint("31", worst)
        } else {
            paint("32", worst)
        };
        // Colour codes take no room on screen: pad the plain text, then paint.
        out.push_str(&format!(
            "{:<w$} {:>9} {} {} {:>8}  {} {:>10} {:>10}\n",
            s.policy,
            s.offered,
            paint("32", format!("{:>9}", s.admitted)),
            paint("31", format!("{:>9}", s.rejected)),
            s.delayed,
            worst,
            format!("{:.1}ms", s.mean_wait_us as f64 / 1000.0),
            format!("{:.1}ms", s.p99_wait_us as f64 / 1000.0),
        ));
    }
    out
}

/// Writes every decision as CSV: `policy,t_us,key,allowed,wait_us`.
pub fn write_csv(path: &Path, runs: &[(Summary, Vec<Fate>)]) -> anyhow::Result<()> {
    let mut w =
        csv::Writer::from_path(path).with_context(|| format!("cannot write {}", path.display()))?;
    w.write_record(["policy", "t_us", "key", "allowed", "wait_us"])?;
    for (s, fates) in runs {
        for f in fates {
            w.write_record([
                s.policy.as_str(),
                &f.t.to_string(),
                &f.key.to_string(),
                if f.allowed { "1" } else { "0" },
                &f.wait.to_string(),
            ])?;
        }
    }
    w.flush()?;
    Ok(())
}

/// Whether `policy` states its limit per window of a length (the window algorithms),
/// so a window holding more is over it.
fn per_window(policy: &Policy) -> bool {
    use tollgate::policy::AlgorithmKind::*;
    matches!(
        policy.algorithm().kind(),
        FixedWindow | SlidingLog | SlidingWindow | SlidingWindowWeighted
    )
}
