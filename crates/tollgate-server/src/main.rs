//! The `tollgate` binary: the allocator, the command line, logging, then the command
//! (`tollgate_server::cli`); each command lives in its own module of the library.

use std::process::ExitCode;

// A server allocates small buffers per request from several threads; glibc's malloc
// measured ~14% of serve's CPU on Redis (perf), mimalloc less than half of that.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    tollgate_runtime::process_metrics::set_commit(env!("TOLLGATE_COMMIT"));
    let cli = <tollgate_server::cli::Cli as clap::Parser>::parse_from(tollgate_server::cli::args());
    // Events (reloads, Redis outages and recoveries, lost leases) to stderr.
    let (format, level) = cli.log_settings();
    tollgate_runtime::logging::init(format, level.as_deref());
    match tollgate_server::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The one line a failed command ends with, plain for a person or a script.
            eprintln!("tollgate: {e:#}");
            ExitCode::from(2)
        }
    }
}
