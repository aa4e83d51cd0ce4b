//! The `tollgate` binary. Parsing and dispatch only; each command lives in its own
//! module.

mod bench;
mod chart;
mod cli;
mod grpc;
mod http;
mod metrics;
mod proxy;
mod reload;
mod replay;
mod rules;
mod serve;
mod service;
mod simulate;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = <cli::Cli as clap::Parser>::parse();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            ExitCode::from(2)
        }
    }
}
