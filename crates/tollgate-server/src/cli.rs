//! The command line: parsing (each command's arguments live beside its code) and
//! dispatch.

use clap::{Parser, Subcommand};

use crate::serve::{CheckConfigArgs, ServeArgs};
use tollgate_bench::BenchCommand;
use tollgate_offline::plot::PlotArgs;
use tollgate_offline::replay::ReplayArgs;
use tollgate_offline::simulate::SimulateArgs;
use tollgate_proxy::ProxyArgs;

/// What `tollgate --version` prints: the version and the commit the binary was built
/// from (`git rev-parse`, or `TOLLGATE_COMMIT` at build time; `unknown` without
/// either), read by this crate's build script: a new commit rebuilds the binary's
/// crate only.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TOLLGATE_COMMIT"),
    ")"
);

/// tollgate: rate limiting with exact, documented semantics.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version = VERSION,
    about
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The log lines' format on stderr: text (colours only on a terminal) or json (one
    /// object per line). `RUST_LOG` filters them.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "TOLLGATE_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: tollgate_runtime::logging::LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the rate-limit decision service: HTTP/JSON, Envoy's rate limit service and
    /// quota service (gRPC), on the memory store or Redis. With no rules it serves a
    /// built-in example rule set.
    Serve(ServeArgs),
    /// Run the limiting reverse proxy from the `proxy:` section of a config file.
    Proxy(ProxyArgs),
    /// Run generated traffic through policies on a virtual clock: a summary table,
    /// and optionally a chart (SVG/PNG), CSV decisions or JSON.
    Simulate(Box<SimulateArgs>),
    /// Load generators and reference servers for measuring a running service.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Validate a main config or rule file (or a directory of rule files) without
    /// starting anything.
    CheckConfig(CheckConfigArgs),
    /// Replay a request trace (CSV `t_us,key,cost[,op][,hold_us]`) through a policy on a
    /// virtual clock and print one decision per request
    /// (`t_us,key,cost,allowed,remaining,wait_us`).
    Replay(ReplayArgs),
    /// Chart a CSV of samples over time (first column x, the others series grouped by
    /// unit suffix), e.g. the soak script's memory and open files.
    Plot(PlotArgs),
}

impl Cli {
    /// The log format and filter: the flag (or `TOLLGATE_LOG_FORMAT`), unless `serve
    /// --envoy-env` finds Envoy's `LOG_FORMAT` / `LOG_LEVEL`.
    pub fn log_settings(&self) -> (tollgate_runtime::logging::LogFormat, Option<String>) {
        match &self.command {
            Command::Serve(args) if args.envoy_env => {
                let get = |name: &str| std::env::var(name).ok();
                let (format, level) = tollgate_runtime::config::envoy_env::log_settings(&get);
                (format.unwrap_or(self.log_format), level)
            }
            _ => (self.log_format, None),
        }
    }
}

/// The command line to parse: the process's own, or, for a binary invoked as
/// `ratelimit` (envoyproxy/ratelimit's image runs `/bin/ratelimit`), `tollgate serve
/// --envoy-env` with its arguments after, listening where envoyproxy/ratelimit does
/// unless `HOST`/`GRPC_HOST` say otherwise: on every interface, ports `PORT` (8080)
/// and `GRPC_PORT` (8081).
pub fn args() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str().map(str::to_string));
    if invoked.as_deref() != Some("ratelimit") {
        return args;
    }
    let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut serve: Vec<std::ffi::OsString> =
        vec!["tollgate".into(), "serve".into(), "--envoy-env".into()];
    for (flag, host, port, default) in [
        ("--http", "HOST", "PORT", "8080"),
        ("--grpc", "GRPC_HOST", "GRPC_PORT", "8081"),
    ] {
        if get(host).is_none() {
            let port = get(port).unwrap_or_else(|| default.into());
            serve.extend([flag.into(), format!("0.0.0.0:{port}").into()]);
        }
    }
    serve.extend(args.drain(1..));
    serve
}

/// Runs the command `cli` names.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(args) => tollgate_offline::replay::command(args),
        Command::Serve(args) => crate::serve::command(args),
        Command::Simulate(args) => tollgate_offline::simulate::command(*args),
        Command::Proxy(args) => tollgate_proxy::command(args, Some(proxy_console)),
        Command::Bench(cmd) => tollgate_bench::command(cmd),
        Command::CheckConfig(args) => crate::serve::check_config(args),
        Command::Plot(args) => tollgate_offline::plot::command(args),
    }
}

/// The console over a proxy, mounted on its metrics listener.
fn proxy_console(s: tollgate_proxy::ConsoleSource) -> axum::Router {
    let settings = tollgate_console::ConsoleSettings {
        path: s.config.path.clone(),
        history_points: (s.config.history / 1_000_000) as usize,
        top_keys: s.config.top_keys,
        admin_token: None,
        secure: s.secure,
    };
    let source = tollgate_console::ProxySource {
        exposition: s.exposition,
        store: s.store,
    };
    tollgate_console::Console::start(settings, tollgate_console::Source::Proxy(source)).router()
}
