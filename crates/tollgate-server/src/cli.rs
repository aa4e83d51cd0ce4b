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
    /// Run the rate-limit decision service (HTTP/JSON API) on the memory store. With no
    /// rules it serves a built-in example rule set.
    Serve(ServeArgs),
    /// Run the limiting reverse proxy from the `proxy:` section of a config file.
    Proxy(ProxyArgs),
    /// Run generated traffic through policies on a virtual clock: a summary table,
    /// and optionally a chart (SVG/PNG), CSV decisions or JSON.
    Simulate(SimulateArgs),
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
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OpArg {
    Try,
    Acquire,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StoreArg {
    Memory,
    Redis,
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
    /// Where state is kept: memory, or redis (the Redis scripts, with the trace time
    /// passed in: the decisions must be identical).
    #[arg(long, value_enum, default_value = "memory")]
    store: StoreArg,
    /// The Redis URL for --store redis (`redis://host:port/db` or
    /// `redis+cluster://host:port,host:port`).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis_url: String,
    /// Read the trace from this file instead of standard input.
    #[arg(long, short)]
    input: Option<PathBuf>,
    /// Write decisions to this file instead of standard output. The file appears only
    /// when the whole trace replayed without error.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(Debug, Parser)]
struct ServeArgs {
    /// The main configuration file (YAML).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A rule file or directory (Envoy ratelimit config documents); repeatable.
    /// Overrides the config file's `rules`.
    #[arg(long = "rules")]
    rules: Vec<PathBuf>,
    /// The HTTP listen address [default: 127.0.0.1:8080].
    #[arg(long)]
    http: Option<std::net::SocketAddr>,
    /// The Envoy RLS gRPC listen address [default: 127.0.0.1:8081].
    #[arg(long)]
    grpc: Option<std::net::SocketAddr>,
    /// Where counters live: memory, redis://host:port/db or
    /// redis+cluster://host:port,host:port. Overrides the config file's store.
    #[arg(long)]
    store: Option<String>,
}

#[derive(Debug, Parser)]
struct ProxyArgs {
    /// The main configuration file with a `proxy:` section.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The listen address [default: the config's, else 127.0.0.1:8000].
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Where counters live: memory, redis://host:port/db or
    /// redis+cluster://host:port,host:port (proxies on one Redis share their limits).
    /// Overrides the config file's store.
    #[arg(long)]
    store: Option<String>,
}

#[derive(Debug, Parser)]
struct SimulateArgs {
    /// steady, burst, boundary, poisson, sine, ramp or trace:FILE.
    #[arg(long, default_value = "poisson")]
    pattern: crate::simulate::Pattern,
    /// Average requests per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// How long (virtual time).
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    duration: std::time::Duration,
    /// Burst size (burst and boundary patterns).
    #[arg(long, default_value_t = 100)]
    burst: u64,
    /// Seed of the traffic generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Distinct keys the requests spread over.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// How long each admitted request holds its `concurrency` permits (e.g. 100ms).
    #[arg(long, value_parser = parse_duration_arg)]
    hold: Option<std::time::Duration>,
    /// A policy spec; repeat to compare several.
    #[arg(long = "policy", required = true)]
    policies: Vec<String>,
    /// Write a chart (.svg or .png).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write every decision as CSV.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Print the summaries as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Load a service's HTTP API (`POST /v1/check`, keep-alive).
    Http(LoadArgs),
    /// Load a service's Envoy RLS gRPC API (`ShouldRateLimit`).
    Grpc(LoadArgs),
    /// Drive the Redis store's decision script: K keys, N concurrent callers over a
    /// few pipelined connections. Ends with `checks/s: .. p50_us: .. p99_us: .. errors: ..`.
    Redis(RedisBenchArgs),
    /// Print the redis-benchmark arguments that run the same decision call as
    /// `bench redis` with batching off (`FCALL`; `EVALSHA` with --eval), for
    /// `redis-benchmark ... $(tollgate bench redis-call ...)`. Load the code first (one
    /// `bench redis` run does).
    RedisCall {
        /// The policy spec.
        #[arg(long)]
        policy: String,
        /// Print the `EVALSHA` form instead of `FCALL`.
        #[arg(long)]
        eval: bool,
    },
    /// Serve 200 to every request: the HTTP stack's ceiling, to compare against.
    Ceiling {
        /// The listen address.
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Debug, Parser)]
struct RedisBenchArgs {
    /// `redis://host:port` or `redis+cluster://host:port,host:port`.
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    redis_url: String,
    /// The policy spec checked (repeat for a rule set).
    #[arg(long, required = true)]
    policy: Vec<String>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Connections the callers share.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 10000)]
    keys: u64,
    /// How long to run (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    duration: std::time::Duration,
    /// The most checks per Redis call (automatic batching); 1 turns batching off.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// How the decision code is called: auto (Functions where Redis has them),
    /// functions, eval.
    #[arg(long, default_value = "auto", value_parser = parse_calls)]
    calls: tollgate::redis::RedisCalls,
    /// Decide through leased slices of each key's budget, spendable for this long
    /// (e.g. 50ms); the slice grows up to a quarter of the smallest limit.
    #[arg(long, value_parser = parse_duration_arg)]
    lease: Option<std::time::Duration>,
}

fn parse_calls(s: &str) -> Result<tollgate::redis::RedisCalls, String> {
    use tollgate::redis::RedisCalls;
    match s {
        "auto" => Ok(RedisCalls::Auto),
        "functions" => Ok(RedisCalls::Functions),
        "eval" => Ok(RedisCalls::Eval),
        _ => Err(format!("{s:?}: expected auto, functions or eval")),
    }
}

#[derive(Debug, Parser)]
struct LoadArgs {
    /// The service's address (host:port of its HTTP or gRPC listener).
    #[arg(long)]
    target: String,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Distinct descriptor values (keys).
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// How long to run (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    duration: std::time::Duration,
    /// Total requests per second to aim for (default: as fast as possible).
    #[arg(long)]
    rate: Option<u64>,
    /// The domain to ask about.
    #[arg(long, default_value = "example")]
    domain: String,
    /// The descriptor key; its values are k0..k{keys-1}.
    #[arg(long, default_value = "api_key")]
    key: String,
}

fn parse_duration_arg(s: &str) -> Result<std::time::Duration, String> {
    tollgate::parse_duration(s).map(std::time::Duration::from_micros)
}

#[derive(Debug, Parser)]
struct CheckConfigArgs {
    /// Rule files or directories to validate.
    #[arg(long = "rules")]
    rules: Vec<PathBuf>,
    /// A main configuration file to validate (with the rule files it names).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(args) => replay(args),
        Command::Serve(args) => {
            let settings = crate::serve::Settings::resolve(
                args.config.as_deref(),
                &args.rules,
                args.http,
                args.grpc,
                args.store.as_deref(),
            )?;
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
                .block_on(crate::serve::serve(settings))
        }
        Command::Simulate(args) => simulate(args),
        Command::Proxy(args) => {
            let Some(path) = args.config else {
                anyhow::bail!(
                    "tollgate proxy needs --config FILE with a proxy: section, e.g.\n\
                     proxy:\n  listen: 127.0.0.1:8000\n  routes:\n    - name: api\n      match: {{ path_prefix: /api/ }}\n      upstream: http://127.0.0.1:9000\n      key: client_ip\n      policies: [\"limit-req:rate=10/s,burst=5,nodelay\"]"
                );
            };
            crate::proxy::run(&path, args.listen, args.store.as_deref())
        }
        Command::Bench(bench) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            let (protocol, args) = match bench {
                BenchCommand::Ceiling { listen } => {
                    return runtime.block_on(crate::bench::ceiling(listen))
                }
                BenchCommand::RedisCall { policy, eval } => {
                    let rules = tollgate::RuleSet::parse(&[policy]).map_err(anyhow::Error::msg)?;
                    return runtime.block_on(async {
                        let store =
                            tollgate::redis::RedisStore::connect("redis://127.0.0.1:1/").await?;
                        let limiter = tollgate::redis::RedisLimiter::new(store, "bench", rules)?;
                        let mut out = Vec::new();
                        let call = limiter.script_call("k__rand_int__", 1, eval);
                        // Shell words (the bench script evaluates them).
                        out.extend(call.into_iter().map(|a| {
                            if a.is_empty() || a.contains(' ') {
                                format!("'{a}'")
                            } else {
                                a
                            }
                        }));
                        println!("{}", out.join(" "));
                        Ok(())
                    });
                }
                BenchCommand::Redis(a) => {
                    if a.concurrency == 0 {
                        anyhow::bail!("--concurrency must be at least 1");
                    }
                    let rules = tollgate::RuleSet::parse(&a.policy).map_err(anyhow::Error::msg)?;
                    let spec = crate::bench::LoadSpec {
                        target: a.redis_url,
                        concurrency: a.concurrency,
                        keys: a.keys,
                        duration: a.duration,
                        rate: None,
                        domain: String::new(),
                        key: String::new(),
                        redis: Some(crate::bench::RedisLoad {
                            rules,
                            connections: a.connections,
                            batch: a.batch,
                            calls: a.calls,
                            lease: a.lease.map(|duration| tollgate::redis::LeaseOptions {
                                duration,
                                ..Default::default()
                            }),
                        }),
                    };
                    let totals =
                        runtime.block_on(crate::bench::run(crate::bench::Protocol::Redis, spec))?;
                    println!("{totals}");
                    return Ok(());
                }
                BenchCommand::Http(a) => (crate::bench::Protocol::Http, a),
                BenchCommand::Grpc(a) => (crate::bench::Protocol::Grpc, a),
            };
            if args.concurrency == 0 {
                anyhow::bail!("--concurrency must be at least 1");
            }
            let spec = crate::bench::LoadSpec {
                target: args.target,
                concurrency: args.concurrency,
                keys: args.keys,
                duration: args.duration,
                rate: args.rate,
                domain: args.domain,
                key: args.key,
                redis: None,
            };
            let totals = runtime.block_on(crate::bench::run(protocol, spec))?;
            println!("{totals}");
            Ok(())
        }
        Command::CheckConfig(args) => {
            if args.config.is_none() && args.rules.is_empty() {
                anyhow::bail!("check-config needs --config FILE and/or --rules PATH");
            }
            let settings = crate::serve::Settings::resolve(
                args.config.as_deref(),
                &args.rules,
                None,
                None,
                None,
            )?;
            let mut domains: Vec<_> = settings
                .rules
                .domains()
                .map(|(d, s)| format!("{d} ({s})"))
                .collect();
            domains.sort();
            println!("ok: {} domain(s): {}", domains.len(), domains.join(", "));
            Ok(())
        }
    }
}

fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    let policy = Policy::parse(&args.policy)?;
    let store = match args.store {
        StoreArg::Memory => crate::replay::ReplayStore::Memory,
        StoreArg::Redis => crate::replay::ReplayStore::Redis(args.redis_url.clone()),
    };
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
            let result = crate::replay::replay_on(&policy, op, &store, input, BufWriter::new(file));
            if let Err(e) = result {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.into());
            }
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            let stdout = io::stdout().lock();
            crate::replay::replay_on(
                &policy,
                op,
                &store,
                input,
                BufWriter::with_capacity(1 << 16, stdout),
            )?;
        }
    }
    io::stdout().flush()?;
    Ok(())
}

fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    use crate::simulate;
    let policies = args
        .policies
        .iter()
        .map(|p| Policy::parse(p))
        .collect::<Result<Vec<_>, _>>()?;
    let scenario = simulate::Scenario {
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
    let arrivals = simulate::traffic(&scenario)?;
    let duration_us = arrivals
        .last()
        .map_or(scenario.duration_us, |a| a.0.max(scenario.duration_us));
    let runs: Vec<_> = policies
        .iter()
        .map(|p| {
            let mut progress = simulate::progress_printer(arrivals.len(), p.to_string());
            let (fates, summary) = simulate::run(p, &arrivals, scenario.hold_us, &mut progress);
            (summary, fates)
        })
        .collect();
    if let Some(path) = &args.csv {
        simulate::write_csv(path, &runs)?;
    }
    if let Some(path) = &args.out {
        let title = format!(
            "{} traffic, {} req/s avg, {} s, seed {}",
            match &scenario.pattern {
                simulate::Pattern::Trace(p) => p.display().to_string(),
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
        print!("{}", simulate::table(&summaries, simulate::use_color()));
    }
    Ok(())
}
