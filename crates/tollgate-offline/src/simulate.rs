//! `tollgate simulate`: generated (seeded) traffic through several policies on a
//! virtual clock; a summary table, JSON, CSV, and an SVG/PNG chart.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Parser;
use tollgate::Policy;

use super::run::{run, table, write_csv};
use super::traffic::{traffic, Pattern, Scenario};

/// Whether to colour: stdout is a terminal and NO_COLOR is not set.
pub fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

#[derive(Debug, Parser)]
/// `tollgate simulate` arguments.
pub struct SimulateArgs {
    /// steady, burst, boundary, poisson, sine, ramp, trace:FILE, or closed-loop
    /// (clients against a modelled upstream, compared across --limit and --adaptive).
    #[arg(long, default_value = "poisson")]
    pub pattern: Pattern,
    /// Average requests per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// How long (virtual time).
    #[arg(long, default_value = "10s", value_parser = tollgate_runtime::config::duration_arg)]
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
    #[arg(long, value_parser = tollgate_runtime::config::duration_arg)]
    pub hold: Option<std::time::Duration>,
    /// A policy spec; repeat to compare several.
    #[arg(long = "policy", required_unless_present_any = ["limits", "adaptive"])]
    pub policies: Vec<String>,
    /// closed-loop: clients `COUNT[:PRIORITY[:CALLER]]` (repeat for several groups);
    /// default 32.
    #[arg(long = "clients")]
    pub clients: Vec<crate::overload::Group>,
    /// closed-loop: requests the upstream serves at full speed at once.
    #[arg(long, default_value_t = 8)]
    pub capacity: u32,
    /// closed-loop: service time at or below the capacity (each request's varies by
    /// up to --jitter either way, seeded by --seed).
    #[arg(long, default_value = "20ms", value_parser = tollgate_runtime::config::duration_arg)]
    pub service: std::time::Duration,
    /// closed-loop: how much each request's service time varies either way, a
    /// fraction from 0 to 0.9 (0.2: +-20 %, uniformly).
    #[arg(long, default_value_t = 0.1)]
    pub jitter: f64,
    /// closed-loop: capacity changes, e.g. `5s=4,10s=8`.
    #[arg(long, value_parser = crate::overload::parse_schedule)]
    pub schedule: Option<crate::overload::Schedule>,
    /// closed-loop: think time between an answer and the next request.
    #[arg(long, default_value = "0ms", value_parser = tollgate_runtime::config::duration_arg)]
    pub think: std::time::Duration,
    /// closed-loop: pause after a rejection.
    #[arg(long, default_value = "1ms", value_parser = tollgate_runtime::config::duration_arg)]
    pub pause: std::time::Duration,
    /// closed-loop: clients give up on a request after this long (it counts as
    /// dropped for the limit; the upstream keeps working on it); none by default.
    #[arg(long, value_parser = tollgate_runtime::config::duration_arg)]
    pub timeout: Option<std::time::Duration>,
    /// closed-loop: leave the first part out of the totals.
    #[arg(long, default_value = "2s", value_parser = tollgate_runtime::config::duration_arg)]
    pub settle: std::time::Duration,
    /// closed-loop: a static concurrency limit (N) or `none`; repeat to compare.
    #[arg(long = "limit")]
    pub limits: Vec<String>,
    /// closed-loop: an adaptive spec (`gradient`, `aimd:...`); repeat to compare.
    #[arg(long = "adaptive")]
    pub adaptive: Vec<String>,
    /// closed-loop: adaptive limits share among the groups' callers.
    #[arg(long)]
    pub fair: bool,
    /// Costs known after the work: each admitted request (one unit) is charged a
    /// usage drawn log-normal around MEDIAN (the logarithm's spread SIGMA, default
    /// 0.5), e.g. `--usage 800` tokens, into debt if need be.
    #[arg(long)]
    pub usage: Option<crate::usage::UsageDist>,
    /// With --usage: how long after its admission a request's usage is charged (the
    /// work's duration).
    #[arg(long, default_value = "0ms", value_parser = tollgate_runtime::config::duration_arg)]
    pub usage_after: std::time::Duration,
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
    if args.pattern == Pattern::ClosedLoop {
        return closed_loop(args);
    }
    if !args.limits.is_empty() || !args.adaptive.is_empty() {
        anyhow::bail!(
            "--limit and --adaptive compare concurrency limits under --pattern closed-loop"
        );
    }
    let policies = args
        .policies
        .iter()
        .map(|p| Policy::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    if args.duration < std::time::Duration::from_millis(1) {
        anyhow::bail!(
            "--duration {:?} is too short to simulate (at least 1ms)",
            args.duration
        );
    }
    // Found out before the run, not after it.
    if let Some(dir) = args.out.as_deref().and_then(std::path::Path::parent) {
        if !dir.as_os_str().is_empty() && !dir.is_dir() {
            anyhow::bail!("--out: no directory {}", dir.display());
        }
    }
    if args.hold.is_some() && !policies.iter().any(|p| p.name() == "concurrency") {
        eprintln!("tollgate simulate: --hold applies to concurrency policies only; none is given");
    }
    let scenario = Scenario {
        pattern: args.pattern.clone(),
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
    if arrivals.len() >= crate::traffic::MAX_REQUESTS {
        eprintln!(
            "tollgate simulate: traffic cut at {} requests (t = {:.1} s of {:.1} s): lower --rate or --duration",
            crate::traffic::MAX_REQUESTS,
            arrivals.last().map_or(0.0, |a| a.0 as f64 / 1e6),
            scenario.duration_us as f64 / 1e6
        );
    }
    let duration_us = arrivals
        .last()
        .map_or(scenario.duration_us, |a| a.0.max(scenario.duration_us));
    if let Some(dist) = args.usage {
        return usage(&args, &scenario, &policies, &arrivals, dist, duration_us);
    }
    let runs: Vec<_> = policies
        .iter()
        .map(|p| {
            let total = arrivals.len() as u64;
            let mut line = tollgate_runtime::progress::Progress::new(p.to_string(), Some(total));
            let mut progress =
                |done: usize| line.update(done as u64, || format!("{done} of {total} requests"));
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
        crate::chart::draw(path, &title, &runs, duration_us)?;
    }
    let summaries: Vec<_> = runs.into_iter().map(|(s, _)| s).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summaries)?);
    } else {
        print!("{}", table(&summaries, use_color()));
    }
    Ok(())
}

/// `tollgate simulate --usage`: every policy charged usages after the fact; the table
/// (or JSON), and a chart of the first key's budget going into debt and back.
fn usage(
    args: &SimulateArgs,
    scenario: &Scenario,
    policies: &[Policy],
    arrivals: &[crate::traffic::Arrival],
    dist: crate::usage::UsageDist,
    duration_us: u64,
) -> anyhow::Result<()> {
    if args.csv.is_some() {
        anyhow::bail!("--csv writes decisions of runs without --usage");
    }
    let after_us = u64::try_from(args.usage_after.as_micros()).unwrap_or(u64::MAX);
    let runs = policies
        .iter()
        .map(|p| crate::usage::run(p, arrivals, dist, after_us, scenario.seed, duration_us))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(path) = &args.out {
        let panels: Vec<_> = runs
            .iter()
            .map(|r| crate::chart::Panel {
                y_desc: "units left (below 0: debt)".into(),
                series: vec![(
                    format!("{}: the first key's budget", r.summary.policy),
                    r.balance.clone(),
                )],
            })
            .collect();
        let title = format!(
            "usage after the fact: median {} units (spread {}), charged {} after admission; {} req/s {:?}",
            dist.median,
            dist.sigma,
            tollgate::policy::fmt_duration(after_us),
            scenario.rate,
            scenario.pattern
        )
        .to_lowercase();
        crate::chart::draw_samples(path, &title, "time (s)", &panels)?;
    }
    let summaries: Vec<_> = runs.into_iter().map(|r| r.summary).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summaries)?);
        return Ok(());
    }
    let w = crate::run::policy_column(summaries.iter().map(|s| s.policy.as_str()));
    println!(
        "{:<w$} {:>9} {:>9} {:>9} {:>13} {:>13} {:>10}",
        "policy", "offered", "admitted", "rejected", "used", "deepest debt", "exhausted"
    );
    for s in &summaries {
        println!(
            "{:<w$} {:>9} {:>9} {:>9} {:>13} {:>13} {:>9.1}%",
            s.policy,
            s.offered,
            s.admitted,
            s.rejected,
            s.used_units,
            s.deepest_debt,
            s.exhausted_share * 100.0
        );
    }
    Ok(())
}

/// `tollgate simulate --pattern closed-loop`: the clients through every limit, then
/// the table (or JSON) and the chart asked for.
fn closed_loop(args: SimulateArgs) -> anyhow::Result<()> {
    use crate::overload::{panels, simulate, table, Group, Model, SimulatedLimit};
    if !args.policies.is_empty() {
        anyhow::bail!(
            "closed-loop compares concurrency limits: --limit N|none and --adaptive SPEC, not --policy"
        );
    }
    let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let mut limits = args
        .limits
        .iter()
        .map(|l| match l.as_str() {
            "none" => Ok(SimulatedLimit::None),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .map(SimulatedLimit::Static)
                .ok_or_else(|| anyhow::anyhow!("--limit {n}: expected a number above 0 or none")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    for spec in &args.adaptive {
        limits.push(SimulatedLimit::Adaptive(spec.parse()?));
    }
    crate::overload::check_service(args.capacity, args.jitter)?;
    let model = Model {
        capacity: args.capacity,
        service_us: us(args.service).max(1),
        jitter: args.jitter,
        seed: args.seed,
        schedule: args
            .schedule
            .map(|s| s.0.into_iter().map(|(at, c)| (us(at), c)).collect())
            .unwrap_or_default(),
        think_us: us(args.think),
        pause_us: us(args.pause).max(1),
        timeout_us: args.timeout.map(us),
        duration_us: us(args.duration),
        settle_us: us(args.settle),
        groups: if args.clients.is_empty() {
            vec![Group {
                clients: 32,
                priority: Default::default(),
                caller: String::new(),
            }]
        } else {
            args.clients
        },
        fair: args.fair,
    };
    let runs: Vec<_> = limits.iter().map(|l| simulate(&model, l)).collect();
    if let Some(path) = &args.out {
        let clients: Vec<String> = model.groups.iter().map(|g| g.to_string()).collect();
        let mut title = format!(
            "closed loop: {} clients, capacity {} at {} ms +-{}%",
            clients.join(" + "),
            model.capacity,
            model.service_us as f64 / 1000.0,
            (model.jitter * 100.0).round(),
        );
        for (at, c) in &model.schedule {
            title += &format!(", {c} at {} s", *at as f64 / 1e6);
        }
        if let Some(t) = model.timeout_us {
            title += &format!(", clients time out at {} ms", t as f64 / 1000.0);
        }
        crate::chart::draw_samples(path, &title, "time (s)", &panels(&runs))?;
    }
    if args.json {
        let totals: Vec<_> = runs.iter().flat_map(|r| &r.groups).collect();
        println!("{}", serde_json::to_string_pretty(&totals)?);
    } else {
        print!("{}", table(&runs));
    }
    Ok(())
}
