//! One policy over a traffic: what happened to each request ([`Fate`]), the totals
//! ([`Summary`]), and the table and CSV that report them.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use tollgate::policy::{densest_window, PolicyState};
use tollgate::{Op, Policy};

use super::traffic::Arrival;

/// One request's fate under one policy.
#[derive(Debug, Clone, Copy)]
pub struct Fate {
    /// Arrival, us.
    pub t: u64,
    /// Key index.
    pub key: u64,
    /// Its cost (units).
    pub cost: u64,
    /// Admitted.
    pub allowed: bool,
    /// Wait (acquire, delay, schedule), us.
    pub wait: u64,
}

/// A share of a policy's promise used: what the densest window of a length admitted
/// against the envelope there.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Share {
    /// admitted / envelope.
    pub ratio: f64,
    /// The window length, us.
    pub window_us: u64,
    /// Units the densest window of that length admitted, for one key.
    pub admitted: u64,
    /// The envelope at that length.
    pub envelope: u64,
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
    /// The most units admitted (by admission time) in any window of the policy's own
    /// length, for one key: the burst a user of the policy sees.
    pub worst_window: u64,
    /// That window's length, us.
    pub window_us: u64,
    /// Where it starts, us.
    pub worst_window_start_us: u64,
    /// The policy's headline limit.
    pub limit: u64,
    /// What the policy promises in a window of its own length, in units for the
    /// run's largest cost ([`Policy::envelope_for`]; `None` for `concurrency`).
    pub envelope: Option<u64>,
    /// Whether the worst window held more than the limit of a window algorithm (whose
    /// limit is a count per window) while keeping its promise: a fixed window's
    /// boundary burst, stated as what it is.
    pub over_headline: bool,
    /// The largest share of its promise the policy used, over window lengths from
    /// 1 us to the whole run: admitted / envelope in the densest window of each
    /// length, for one key. 1 = all it promises; above 1 = a broken promise, which
    /// must never happen.
    pub envelope_ratio: Option<f64>,
    /// The window length of that largest share, us.
    pub envelope_ratio_window_us: Option<u64>,
    /// What that window admitted.
    pub envelope_ratio_admitted: Option<u64>,
    /// The envelope at that length.
    pub envelope_ratio_envelope: Option<u64>,
    /// The largest share of its promise used over windows from the policy's own
    /// length up (to the run's): how much of its rate it gave, where the largest
    /// share over every length is 1 as soon as a burst of 1 admits one request.
    pub promise_used: Option<Share>,
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
            cost,
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
    let mut by_key: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for f in fates.iter().filter(|f| f.allowed) {
        by_key
            .entry(f.key)
            .or_default()
            .push((f.t + f.wait, f.cost));
    }
    for times in by_key.values_mut() {
        times.sort_unstable();
    }
    let (worst, worst_start) = densest(&by_key, window);
    // The promise, judged at every length from an instant to the whole run: the
    // largest share anywhere (above 1 would be a broken promise), and the largest
    // over lengths from the policy's own up (what it used of its rate; shorter
    // windows hold one request of a burst of 1 and say 1.00 of nothing).
    let end = fates.iter().map(|f| f.t + f.wait).max().unwrap_or(0) + 1;
    let max_cost = fates.iter().map(|f| f.cost).max().unwrap_or(1);
    let (mut best, mut used): (Option<Share>, Option<Share>) = (None, None);
    for w in window_lengths(window, end) {
        let Some(envelope) = policy.envelope_for(w, max_cost).filter(|&e| e > 0) else {
            continue;
        };
        let (n, _) = densest(&by_key, w);
        let share = Share {
            ratio: n as f64 / envelope as f64,
            window_us: w,
            admitted: n,
            envelope,
        };
        // Ties go to the longer window: "all of it over 5 s" says more than "at an
        // instant".
        if best.is_none_or(|b| share.ratio >= b.ratio) {
            best = Some(share);
        }
        if w >= window.min(end) && used.is_none_or(|u| share.ratio >= u.ratio) {
            used = Some(share);
        }
    }
    let mut waits: Vec<u64> = fates
        .iter()
        .filter(|f| f.allowed && f.wait > 0)
        .map(|f| f.wait)
        .collect();
    waits.sort_unstable();
    let admitted = fates.iter().filter(|f| f.allowed).count() as u64;
    let envelope = policy.envelope_for(window, max_cost);
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
        envelope,
        over_headline: worst > policy.limit() && counts_per_window(policy),
        envelope_ratio: best.map(|b| b.ratio),
        envelope_ratio_window_us: best.map(|b| b.window_us),
        envelope_ratio_admitted: best.map(|b| b.admitted),
        envelope_ratio_envelope: best.map(|b| b.envelope),
        promise_used: used,
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

/// The most units one key admitted in any window `[x, x + w)`, and where it starts,
/// over each key's admissions `(time, cost)` sorted by time (the first key wins a
/// tie).
fn densest(by_key: &std::collections::BTreeMap<u64, Vec<(u64, u64)>>, w: u64) -> (u64, u64) {
    by_key
        .values()
        .map(|admitted| densest_window(admitted, w))
        .fold((0, 0), |best, d| if d.0 > best.0 { d } else { best })
}

/// The window lengths a policy is judged at: an instant, 1-2-5 steps from 1 ms to
/// the run's length, and the policy's own window and its neighbours (where a
/// window's boundary effect peaks).
fn window_lengths(own: u64, run: u64) -> Vec<u64> {
    let mut lengths = vec![1, own.saturating_sub(1).max(1), own, own + 1, 2 * own, run];
    let mut step = 1_000u64;
    while step <= run {
        lengths.extend([step, 2 * step, 5 * step]);
        step *= 10;
    }
    // No longer than the run: a window past its end holds nothing more.
    lengths.retain(|&w| w <= run.max(1));
    lengths.sort_unstable();
    lengths.dedup();
    lengths
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
        "{:<w$} {:>9} {:>9} {:>9} {:>8}  {:<34} {:>16} {:>10} {:>10}\n",
        "policy",
        "offered",
        "admitted",
        "rejected",
        "delayed",
        "densest own window",
        "promise used",
        "mean wait",
        "p99 wait"
    );
    for s in summaries {
        let worst = format!(
            "{} in {} ({})",
            s.worst_window,
            human_duration(s.window_us),
            bound(s)
        );
        let worst = format!("{worst:<34}");
        // Yellow: over the headline limit, as the policy allows (a fixed window's
        // boundary); red is kept for a broken promise.
        let worst = if s.over_headline {
            paint("33", worst)
        } else {
            paint("32", worst)
        };
        let broken = s.envelope_ratio.is_some_and(|r| r > 1.0);
        let shown = if broken {
            s.envelope_ratio.zip(s.envelope_ratio_window_us)
        } else {
            s.promise_used.map(|u| (u.ratio, u.window_us))
        };
        let used = match shown {
            Some((r, w)) => format!("{r:.2} at {}", human_duration(w)),
            None => "-".to_string(),
        };
        let used = format!("{used:>16}");
        let used = if broken {
            paint("31", used)
        } else {
            paint("32", used)
        };
        // Colour codes take no room on screen: pad the plain text, then paint.
        out.push_str(&format!(
            "{:<w$} {:>9} {} {} {:>8}  {} {} {:>10} {:>10}\n",
            s.policy,
            s.offered,
            paint("32", format!("{:>9}", s.admitted)),
            paint("31", format!("{:>9}", s.rejected)),
            s.delayed,
            worst,
            used,
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

/// Whether `policy`'s headline limit is a count per window of its own length (the
/// window algorithms), so that a window holding more is worth pointing out; a rate
/// algorithm's headline is its burst, which any window longer than an instant passes.
fn counts_per_window(policy: &Policy) -> bool {
    use tollgate::policy::AlgorithmKind::*;
    matches!(
        policy.algorithm().kind(),
        FixedWindow | SlidingLog | SlidingWindow | SlidingWindowWeighted
    )
}

/// What a policy's densest window is held to, in words: a window algorithm's limit
/// and its promise, a rate algorithm's promise (its headline limit is a burst, not a
/// count per window), a concurrency limit's bound on work in flight.
pub fn bound(s: &Summary) -> String {
    let per_window = s
        .policy
        .parse::<Policy>()
        .is_ok_and(|p| counts_per_window(&p));
    match s.envelope {
        None => format!("limit {} in flight", s.limit),
        Some(e) if per_window => format!("limit {}, promise {e}", s.limit),
        Some(e) => format!("promise {e}"),
    }
}

/// A duration as people read it: whole units where it has them (`1s`, `250ms`), else
/// three significant figures (`333.3ms`, not `333334us`).
pub fn human_duration(us: u64) -> String {
    let whole = tollgate::policy::fmt_duration(us);
    if !whole.ends_with("us") || us < 1_000 {
        return whole;
    }
    if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else if us < 60_000_000 {
        format!("{:.2}s", us as f64 / 1e6)
    } else {
        format!("{:.1}m", us as f64 / 6e7)
    }
}
