//! `tollgate simulate`: generated (seeded) traffic through several policies on a
//! virtual clock; a summary table, JSON, CSV, and an SVG/PNG chart.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use serde::Serialize;
use tollgate::{Op, Policy, PolicyState};

/// A traffic pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// Evenly spaced at the rate.
    Steady,
    /// Bursts of `burst` at once, on average at the rate.
    Burst,
    /// Bursts of `burst` just before and just after each whole second (10 ms either
    /// side): the fixed window's worst case.
    Boundary,
    /// Poisson arrivals at the rate.
    Poisson,
    /// The rate swinging between 0 and twice the rate, period duration/2.
    Sine,
    /// The rate growing from 0 to twice the rate over the duration.
    Ramp,
    /// Arrivals from a replay trace (`t_us,key,cost`).
    Trace(PathBuf),
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "steady" => Pattern::Steady,
            "burst" => Pattern::Burst,
            "boundary" => Pattern::Boundary,
            "poisson" => Pattern::Poisson,
            "sine" => Pattern::Sine,
            "ramp" => Pattern::Ramp,
            _ => match s.strip_prefix("trace:") {
                Some(path) if !path.is_empty() => Pattern::Trace(PathBuf::from(path)),
                _ => {
                    return Err(format!(
                        "unknown pattern '{s}' (expected steady, burst, boundary, poisson, sine, ramp or trace:FILE)"
                    ))
                }
            },
        })
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The traffic.
    pub pattern: Pattern,
    /// Requests per second (average).
    pub rate: f64,
    /// Length, in us.
    pub duration_us: u64,
    /// Burst size for burst and boundary.
    pub burst: u64,
    /// Seed.
    pub seed: u64,
    /// Distinct keys the requests spread over.
    pub keys: u64,
    /// How long each admitted request holds a `concurrency` permit, us.
    pub hold_us: Option<u64>,
}

/// The most requests one simulation generates.
pub const MAX_REQUESTS: usize = 20_000_000;

/// One arrival: time (us), key, cost.
pub type Arrival = (u64, u64, u64);

/// splitmix64: a tiny, well-known seeded generator (reproducible on every platform).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The arrivals of a scenario, in time order.
pub fn traffic(s: &Scenario) -> anyhow::Result<Vec<Arrival>> {
    if let Pattern::Trace(path) = &s.pattern {
        return read_trace(path);
    }
    if !(s.rate > 0.0 && s.rate.is_finite()) {
        bail!("--rate must be a positive number of requests per second");
    }
    if s.keys == 0 {
        bail!("--keys must be at least 1");
    }
    if s.burst == 0 {
        bail!("--burst must be at least 1");
    }
    let mut rng = Rng(s.seed);
    let mut times: Vec<u64> = Vec::new();
    let d = s.duration_us as f64;
    let gap = 1e6 / s.rate;
    // Each request costs about 60 bytes per policy in memory: bound the traffic.
    let cap = MAX_REQUESTS;
    match s.pattern {
        Pattern::Steady => {
            let mut t = 0.0;
            while t < d && times.len() < cap {
                times.push(t as u64);
                t += gap;
            }
        }
        Pattern::Burst => {
            let every = gap * s.burst as f64;
            let mut t = 0.0;
            while t < d && times.len() < cap {
                times.extend(std::iter::repeat_n(t as u64, s.burst as usize));
                t += every;
            }
        }
        Pattern::Boundary => {
            let mut second = 1u64;
            while second * 1_000_000 < s.duration_us && times.len() < cap {
                let b = second * 1_000_000;
                times.extend(std::iter::repeat_n(b - 10_000, s.burst as usize));
                times.extend(std::iter::repeat_n(b + 10_000, s.burst as usize));
                second += 2;
            }
        }
        Pattern::Poisson => {
            let mut t = 0.0;
            loop {
                t += -gap * (1.0 - rng.unit()).ln();
                if t >= d || times.len() >= cap {
                    break;
                }
                times.push(t as u64);
            }
        }
        Pattern::Sine | Pattern::Ramp => {
            // Thinning: candidates at twice the rate, kept with probability r(t)/2r.
            let mut t = 0.0;
            let period = d / 2.0;
            loop {
                t += -(gap / 2.0) * (1.0 - rng.unit()).ln();
                if t >= d || times.len() >= cap {
                    break;
                }
                let share = match s.pattern {
                    Pattern::Sine => 0.5 * (1.0 + (2.0 * std::f64::consts::PI * t / period).sin()),
                    _ => t / d,
                };
                if rng.unit() < share {
                    times.push(t as u64);
                }
            }
        }
        Pattern::Trace(_) => unreachable!("handled above"),
    }
    times.sort_unstable();
    Ok(times
        .into_iter()
        .map(|t| (t, rng.next() % s.keys, 1))
        .collect())
}

fn read_trace(path: &Path) -> anyhow::Result<Vec<Arrival>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    let mut sink = std::io::sink();
    // Reuse replay's validation by replaying through an always-admitting policy.
    let policy: Policy = "concurrency:limit=1099511627776".parse().expect("valid");
    crate::offline::replay::replay(&policy, Op::Try, file, &mut sink)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut reader = csv::Reader::from_path(path)?;
    let mut keys: HashMap<String, u64> = HashMap::new();
    for row in reader.records() {
        let row = row?;
        let t: u64 = row.get(0).unwrap_or("0").trim().parse()?;
        let next = keys.len() as u64;
        let key = *keys
            .entry(row.get(1).unwrap_or("").trim().to_string())
            .or_insert(next);
        let cost: u64 = row.get(2).unwrap_or("1").trim().parse()?;
        out.push((t, key, cost));
    }
    Ok(out)
}

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
        over_limit: worst > policy.limit()
            && matches!(
                policy.name(),
                "fixed-window" | "sliding-log" | "sliding-window"
            ),
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

/// The summary table, coloured when `color`.
pub fn table(summaries: &[Summary], color: bool) -> String {
    let paint = |code: &str, s: String| {
        if color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s
        }
    };
    let w = summaries
        .iter()
        .map(|s| s.policy.len())
        .max()
        .unwrap_or(6)
        .max(6);
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
            tollgate::fmt_duration(s.window_us),
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

/// Whether to colour: stdout is a terminal and NO_COLOR is not set.
pub fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
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

/// Progress on stderr for long runs, only when stderr is a terminal.
pub fn progress_printer(total: usize, label: String) -> impl FnMut(usize) {
    let show = std::io::stderr().is_terminal() && total > 2_000_000;
    move |done| {
        if show {
            eprint!("\r{label}: {:>3}%", done * 100 / total.max(1));
            let _ = std::io::stderr().flush();
        }
    }
}

#[derive(Debug, Parser)]
/// `tollgate simulate` arguments.
pub struct SimulateArgs {
    /// steady, burst, boundary, poisson, sine, ramp or trace:FILE.
    #[arg(long, default_value = "poisson")]
    pub pattern: Pattern,
    /// Average requests per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long (virtual time).
    #[arg(long, default_value = "10s", value_parser = crate::config::duration_arg)]
    pub duration: std::time::Duration,
    /// Burst size (burst and boundary patterns).
    #[arg(long, default_value_t = 100)]
    pub burst: u64,
    /// Seed of the traffic generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Distinct keys the requests spread over.
    #[arg(long, default_value_t = 1)]
    pub keys: u64,
    /// How long each admitted request holds its `concurrency` permits (e.g. 100ms).
    #[arg(long, value_parser = crate::config::duration_arg)]
    pub hold: Option<std::time::Duration>,
    /// A policy spec; repeat to compare several.
    #[arg(long = "policy", required = true)]
    pub policies: Vec<String>,
    /// Write a chart (.svg or .png).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write every decision as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Print the summaries as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `tollgate simulate`: the traffic through every policy, then the table (or JSON), the
/// CSV and the chart asked for.
pub fn command(args: SimulateArgs) -> anyhow::Result<()> {
    let policies = args
        .policies
        .iter()
        .map(|p| Policy::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let scenario = Scenario {
        pattern: args.pattern,
        rate: args.rate,
        duration_us: u64::try_from(args.duration.as_micros()).unwrap_or(u64::MAX),
        burst: args.burst,
        seed: args.seed,
        keys: args.keys,
        hold_us: args
            .hold
            .map(|h| u64::try_from(h.as_micros()).unwrap_or(u64::MAX)),
    };
    let arrivals = traffic(&scenario)?;
    let duration_us = arrivals
        .last()
        .map_or(scenario.duration_us, |a| a.0.max(scenario.duration_us));
    let runs: Vec<_> = policies
        .iter()
        .map(|p| {
            let mut progress = progress_printer(arrivals.len(), p.to_string());
            let (fates, summary) = run(p, &arrivals, scenario.hold_us, &mut progress);
            (summary, fates)
        })
        .collect();
    if let Some(path) = &args.csv {
        write_csv(path, &runs)?;
    }
    if let Some(path) = &args.out {
        let title = format!(
            "{} traffic, {} req/s avg, {} s, seed {}",
            match &scenario.pattern {
                Pattern::Trace(p) => p.display().to_string(),
                p => format!("{p:?}").to_lowercase(),
            },
            scenario.rate,
            duration_us as f64 / 1e6,
            scenario.seed
        );
        crate::offline::chart::draw(path, &title, &runs, duration_us)?;
    }
    let summaries: Vec<_> = runs.into_iter().map(|(s, _)| s).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summaries)?);
    } else {
        print!("{}", table(&summaries, use_color()));
    }
    Ok(())
}
