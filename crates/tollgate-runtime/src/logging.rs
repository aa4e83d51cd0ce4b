//! Where the binary's log lines go and how they look: stderr, filtered by `RUST_LOG`
//! (default: tollgate's own events from `info`, other crates' from `warn`), as text
//! (colours only when stderr is a terminal, so a log file holds no escape codes) or as
//! one JSON object per line (`--log-format json`, or `TOLLGATE_LOG_FORMAT=json`) for a
//! log pipeline.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The log lines' format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields.message`, and
    /// the event's other fields.
    Json,
}

/// Installs the process's logger. Call once, before any event. `RUST_LOG` filters;
/// without it, `default_filter` (or tollgate's own events from `info`).
pub fn init(format: LogFormat, default_filter: Option<&str>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(default_filter.unwrap_or("warn,tollgate=info,tollgate_server=info"))
    });
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_ansi(false).init(),
    }
}
