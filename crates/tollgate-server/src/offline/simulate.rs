//! `tollgate simulate`: generated (seeded) traffic through several policies on a
//! virtual clock; a summary table, JSON, CSV, and an SVG/PNG chart.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::Parser;
use tollgate::Policy;

use super::run::{run, table, write_csv};
use super::traffic::{traffic, Pattern, Scenario};

/// Whether to colour: stdout is a terminal and NO_COLOR is not set.
pub fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
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
