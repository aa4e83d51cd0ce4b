//! Command-line interface.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tollgate::{Op, Policy};

/// tollgate: rate limiting with exact, documented semantics.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a request trace (CSV `t_us,key,cost[,op][,hold_us]`) through a policy on a
    /// virtual clock and print one decision per request
    /// (`t_us,key,cost,allowed,remaining,wait_us`).
    Replay(ReplayArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OpArg {
    Try,
    Acquire,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StoreArg {
    Memory,
}

#[derive(Debug, Parser)]
struct ReplayArgs {
    /// The policy spec, e.g. 'gcra:rate=10/s,burst=5'.
    #[arg(long)]
    policy: String,
    /// What each request does when the trace has no `op` column: try (reject) or
    /// acquire (wait up to the policy's max-wait).
    #[arg(long, value_enum, default_value = "try")]
    op: OpArg,
    /// Where state is kept (the Redis store arrives with Redis support).
    #[arg(long, value_enum, default_value = "memory")]
    store: StoreArg,
    /// Read the trace from this file instead of standard input.
    #[arg(long, short)]
    input: Option<PathBuf>,
    /// Write decisions to this file instead of standard output. The file appears only
    /// when the whole trace replayed without error.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(args) => replay(args),
    }
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let policy = Policy::parse(&args.policy)?;
    let StoreArg::Memory = args.store;
    let op = match args.op {
        OpArg::Try => Op::Try,
        OpArg::Acquire => Op::Acquire,
    };
    let input: Box<dyn io::Read> = match &args.input {
        Some(path) => Box::new(BufReader::new(
            File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(io::stdin().lock()),
    };
    match &args.output {
        Some(path) => {
            // Write beside the target and rename, so a failed replay leaves no half file.
            let tmp = path.with_extension("partial");
            let file =
                File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
            let result = crate::replay::replay(&policy, op, input, BufWriter::new(file));
            if let Err(e) = result {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.into());
            }
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            let stdout = io::stdout().lock();
            crate::replay::replay(
                &policy,
                op,
                input,
                BufWriter::with_capacity(1 << 16, stdout),
            )?;
        }
    }
    io::stdout().flush()?;
    Ok(())
}
