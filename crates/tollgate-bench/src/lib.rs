//! tollgate's load generators, over the `tollgate` library, the runtime and the
//! offline tools' traffic (never a server's parts):
//! `tollgate bench http|grpc|redis`: a load generator against a running service (or
//! the Redis store's script), and
//! `tollgate bench ceiling`: a server that answers 200 to everything (the HTTP stack's
//! ceiling on this machine, for comparison in the same run).

#![forbid(unsafe_code)]

pub mod adaptive;
pub mod anchor;
pub mod rlqs;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use tollgate::clock::{Clock, MonotonicClock};

/// What to load.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// `host:port` of the service (HTTP or gRPC listener).
    pub target: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Distinct descriptor values.
    pub keys: u64,
    /// How long.
    pub duration: Duration,
    /// Total requests per second to aim for (`None`: as fast as possible).
    pub rate: Option<u64>,
    /// The domain and descriptor key to use.
    pub domain: String,
    /// The descriptor key; values are `k0`..`k{keys-1}`.
    pub key: String,
    /// For Redis: the policy and the number of connections.
    pub redis: Option<RedisLoad>,
    /// gRPC over TLS: the CA that signs the server's certificate (PEM), and a client
    /// certificate and key for mutual TLS.
    pub tls: Option<ClientTls>,
}

/// How `bench grpc` reaches a listener over TLS.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The server's CA (PEM).
    pub ca: std::path::PathBuf,
    /// A client certificate and its key (PEM), for mutual TLS.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The name the server's certificate must carry (default: the target's host).
    pub server_name: Option<String>,
}

/// What `tollgate bench redis` loads.
#[derive(Debug, Clone)]
pub struct RedisLoad {
    /// The policy (or rule set) checked.
    pub rules: tollgate::RuleSet,
    /// Connections the callers share (each pipelines its callers' commands).
    pub connections: usize,
    /// The most checks per call (1: no batching).
    pub batch: usize,
    /// How the decision code is called.
    pub calls: tollgate::redis::RedisCalls,
    /// Decide through leased slices (hot keys) instead of one call per check.
    pub lease: Option<tollgate::redis::LeaseOptions>,
    /// TLS settings for a `rediss://` URL.
    pub tls: Option<tollgate::redis::RedisTls>,
    /// Count as Envoy does (`Op::Count`: hits charged whatever the answer) instead of
    /// trying.
    pub count: bool,
    /// Lone checks sent at once as calls of their own (`RedisOptions::direct_calls`).
    pub direct_calls: usize,
    /// Keep a rule set that qualifies as window counters
    /// (`RedisLimiterOptions::window_counters`).
    pub window_counters: bool,
}

/// Totals of a run.
#[derive(Debug)]
pub struct Totals {
    /// Requests completed per second.
    pub per_second: f64,
    /// Median latency, us.
    pub p50_us: u64,
    /// 99th percentile latency, us.
    pub p99_us: u64,
    /// Transport failures and unexpected statuses.
    pub errors: u64,
    /// What was counted: `req/s` or `checks/s`.
    pub unit: &'static str,
}

impl std::fmt::Display for Totals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:.0} p50_us: {} p99_us: {} errors: {}",
            self.unit, self.per_second, self.p50_us, self.p99_us, self.errors
        )
    }
}

/// The protocol to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `POST /v1/check` over HTTP/1.1 keep-alive.
    Http,
    /// `ShouldRateLimit` over HTTP/2.
    Grpc,
    /// Envoy's `POST /json` (the same body as `/v1/check`) over HTTP/1.1 keep-alive.
    Json,
    /// The Redis store's decision script, through the `RateLimiter` check of a `RedisLimiter`.
    Redis,
}

type RlsClient = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>;
type HttpClient = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

/// How one caller reaches the target.
enum Caller {
    Http(HttpClient),
    Json(HttpClient),
    Grpc(RlsClient),
    /// A limiter, and the operation each call makes.
    Redis(tollgate::AnyLimiter, tollgate::Op),
}

impl Caller {
    /// One check of descriptor value `value`; whether it got an answer.
    async fn call(&mut self, spec: &LoadSpec, value: &str) -> bool {
        match self {
            Caller::Http(client) => http_call(client, spec, "/v1/check", value).await,
            Caller::Json(client) => http_call(client, spec, "/json", value).await,
            Caller::Grpc(client) => grpc_call(client, spec, value).await,
            Caller::Redis(limiter, op) => {
                tollgate::RateLimiter::check_rules(limiter, value, 1, *op)
                    .await
                    .is_ok()
            }
        }
    }
}

/// tonic's TLS settings for `tls`.
fn client_tls(tls: &ClientTls) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: cannot read it: {e}", p.display()))
    };
    let mut config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(read(&tls.ca)?));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(tonic::transport::Identity::from_pem(
            read(cert)?,
            read(key)?,
        ));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

/// Connections shared among the callers of a run.
struct Connections {
    http: HttpClient,
    /// One HTTP/2 connection per 8 callers: a single connection serializes on its one
    /// reader/writer task.
    grpc: Vec<tonic::transport::Channel>,
    /// Limiters, each on its own pipelined Redis connection.
    redis: Vec<tollgate::AnyLimiter>,
}

impl Connections {
    async fn open(protocol: Protocol, spec: &LoadSpec) -> anyhow::Result<Connections> {
        let mut grpc = Vec::new();
        if protocol == Protocol::Grpc {
            for _ in 0..spec.concurrency.div_ceil(8) {
                let scheme = if spec.tls.is_some() { "https" } else { "http" };
                let mut endpoint =
                    tonic::transport::Endpoint::from_shared(format!("{scheme}://{}", spec.target))?;
                if let Some(tls) = &spec.tls {
                    endpoint = endpoint.tls_config(client_tls(tls)?)?;
                }
                grpc.push(endpoint.connect().await?);
            }
        }
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_max_idle_per_host(spec.concurrency)
                .build_http::<Full<Bytes>>();
        let mut redis = Vec::new();
        if let (Protocol::Redis, Some(load)) = (protocol, &spec.redis) {
            for _ in 0..load.connections.max(1) {
                redis.push(redis_limiter(&spec.target, load).await?);
            }
        }
        anyhow::ensure!(
            protocol != Protocol::Redis || !redis.is_empty(),
            "a Redis load needs its rules (RedisLoad)"
        );
        Ok(Connections { http, grpc, redis })
    }

    /// Caller `w`'s way to the target.
    fn caller(&self, protocol: Protocol, spec: &LoadSpec, w: usize) -> Caller {
        match protocol {
            Protocol::Http => Caller::Http(self.http.clone()),
            Protocol::Json => Caller::Json(self.http.clone()),
            Protocol::Grpc => Caller::Grpc(RlsClient::new(self.grpc[w / 8].clone())),
            Protocol::Redis => {
                let op = match &spec.redis {
                    Some(load) if load.count => tollgate::Op::Count,
                    _ => tollgate::Op::Try,
                };
                Caller::Redis(self.redis[w % self.redis.len()].clone(), op)
            }
        }
    }
}

/// A limiter of `load`'s rules on a connection of its own, through the one limiter
/// interface, as serve and proxy use it.
async fn redis_limiter(url: &str, load: &RedisLoad) -> anyhow::Result<tollgate::AnyLimiter> {
    let options = tollgate::redis::RedisOptions {
        timeout: Duration::from_secs(2),
        batch: load.batch,
        direct_calls: load.direct_calls,
        calls: load.calls,
        tls: load.tls.clone(),
        ..Default::default()
    };
    let store = tollgate::redis::RedisStore::connect_with(url, options).await?;
    store.ping().await?;
    Ok(match &load.lease {
        None => {
            let opts = tollgate::redis::RedisLimiterOptions {
                window_counters: load.window_counters,
                ..Default::default()
            };
            let rules = load.rules.clone();
            let limiter = tollgate::redis::RedisLimiter::with_options(store, "bench", rules, opts)?;
            tollgate::AnyLimiter::Redis(limiter)
        }
        Some(opts) => tollgate::AnyLimiter::Leased(tollgate::redis::LeasedLimiter::new(
            store,
            "bench",
            load.rules.clone(),
            opts.clone(),
        )?),
    })
}

/// What every caller counts into.
#[derive(Clone, Default)]
struct Counters {
    done: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds")
}

/// Caller `w`: checks random keys (a seeded LCG) until told to stop, at most one per
/// `every` when paced; the latencies of answered checks.
async fn caller_loop(
    w: usize,
    mut caller: Caller,
    spec: LoadSpec,
    every: Option<Duration>,
    counters: Counters,
    clock: MonotonicClock,
) -> Histogram<u64> {
    let mut hist = histogram();
    let mut ticker = every.map(|every| {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut n = w as u64;
    while !counters.stop.load(Ordering::Relaxed) {
        if let Some(t) = ticker.as_mut() {
            t.tick().await;
        }
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let value = format!("k{}", (n >> 33) % spec.keys.max(1));
        let sent = clock.now_us();
        let ok = caller.call(&spec, &value).await;
        let latency = clock.now_us().saturating_sub(sent).max(1);
        if ok {
            let _ = hist.record(latency);
        } else {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        }
        counters.done.fetch_add(1, Ordering::Relaxed);
    }
    hist
}

/// Shows the time run, requests per second and errors on a progress line (stderr,
/// a terminal only) until `deadline`.
async fn report_until(deadline: u64, start: u64, clock: &MonotonicClock, counters: &Counters) {
    let mut line =
        tollgate_runtime::progress::Progress::new("tollgate bench", Some(deadline - start));
    let (mut last, mut last_at) = (0, start);
    while clock.now_us() < deadline {
        let left = Duration::from_micros(deadline.saturating_sub(clock.now_us()));
        tokio::time::sleep(Duration::from_millis(500).min(left)).await;
        let (now, done) = (clock.now_us(), counters.done.load(Ordering::Relaxed));
        let rate = (done - last) as f64 * 1e6 / now.saturating_sub(last_at).max(1) as f64;
        (last, last_at) = (done, now);
        line.update(now - start, || {
            let errors = counters.errors.load(Ordering::Relaxed);
            format!("{rate:.0} req/s, {errors} errors")
        });
    }
}

/// Runs the load; a progress line on stderr when it is a terminal.
pub async fn run(protocol: Protocol, spec: LoadSpec) -> anyhow::Result<Totals> {
    let clock = MonotonicClock::new();
    let counters = Counters::default();
    let connections = Connections::open(protocol, &spec).await?;
    let every = spec
        .rate
        .filter(|&r| r > 0)
        .map(|r| Duration::from_secs_f64(spec.concurrency as f64 / r as f64));
    let start = clock.now_us();
    let workers: Vec<_> = (0..spec.concurrency)
        .map(|w| {
            let caller = connections.caller(protocol, &spec, w);
            let (spec, counters, clock) = (spec.clone(), counters.clone(), clock.clone());
            tokio::spawn(caller_loop(w, caller, spec, every, counters, clock))
        })
        .collect();
    let deadline = start + u64::try_from(spec.duration.as_micros()).unwrap_or(u64::MAX);
    report_until(deadline, start, &clock, &counters).await;
    counters.stop.store(true, Ordering::Relaxed);
    let elapsed = (clock.now_us() - start) as f64 / 1e6;
    let mut all = histogram();
    for w in workers {
        all.add(w.await?)?;
    }
    let requests = counters.done.load(Ordering::Relaxed);
    eprintln!("{requests} requests in {elapsed:.1}s");
    Ok(Totals {
        per_second: requests as f64 / elapsed,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        errors: counters.errors.load(Ordering::Relaxed),
        unit: if protocol == Protocol::Redis {
            "checks/s"
        } else {
            "req/s"
        },
    })
}

async fn http_call(client: &HttpClient, spec: &LoadSpec, path: &str, value: &str) -> bool {
    let body = format!(
        r#"{{"domain":"{}","descriptors":[{{"entries":[{{"key":"{}","value":"{value}"}}]}}]}}"#,
        spec.domain, spec.key
    );
    let request = match http::Request::post(format!("http://{}{path}", spec.target))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
    {
        Ok(r) => r,
        Err(_) => return false,
    };
    match client.request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let drained = response.into_body().collect().await.is_ok();
            drained && (status == 200 || status == 429)
        }
        Err(_) => false,
    }
}

async fn grpc_call(client: &mut RlsClient, spec: &LoadSpec, value: &str) -> bool {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let request = RateLimitRequest {
        domain: spec.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: spec.key.clone(),
                value: value.to_string(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    client.should_rate_limit(request).await.is_ok()
}

/// A server answering 200 with a small body to every request: the ceiling of the
/// HTTP stack (tokio + hyper via axum) on this machine.
pub async fn ceiling(listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!(
        "tollgate bench ceiling: 200 to everything on http://{}",
        listener.local_addr()?
    );
    let app = axum::Router::new().fallback(|| async { "{\"overall_code\":\"OK\"}" });
    axum::serve(listener, app).await?;
    Ok(())
}

#[derive(Debug, Subcommand)]
/// `tollgate bench` subcommands.
pub enum BenchCommand {
    /// Load a service's HTTP API (`POST /v1/check`, keep-alive).
    Http(LoadArgs),
    /// Load a service's Envoy JSON endpoint (`POST /json`, keep-alive; the same body).
    Json(LoadArgs),
    /// Load a service's Envoy RLS gRPC API (`ShouldRateLimit`).
    Grpc(LoadArgs),
    /// Drive the Redis store's decision script: K keys, N concurrent callers over a
    /// few pipelined connections. Ends with `checks/s: .. p50_us: .. p99_us: .. errors: ..`.
    Redis(RedisBenchArgs),
    /// Print the redis-benchmark arguments that run the same decision call as
    /// `bench redis` with batching off (`FCALL`; `EVALSHA` with --eval; the tollgate
    /// module's `TOLLGATE.TRY` with --module), for
    /// `redis-benchmark ... $(tollgate bench redis-call ...)`. Load the code first (one
    /// `bench redis` run does).
    RedisCall {
        /// The policy spec.
        #[arg(long)]
        policy: String,
        /// Print the `EVALSHA` form instead of `FCALL`.
        #[arg(long, conflicts_with = "module")]
        eval: bool,
        /// Print the tollgate module's command instead of `FCALL` (an error for an
        /// algorithm the module does not decide).
        #[arg(long)]
        module: bool,
        /// The call of a charge (of 1) instead of a try.
        #[arg(long)]
        charge: bool,
    },
    /// Send to Redis what envoyproxy/ratelimit sends for one descriptor of a `unit`
    /// rule (`INCRBY` and `EXPIRE` on a key naming its window), pipelined, over many
    /// connections: the anchor tollgate's Redis cost is measured against. Ends with
    /// `requests/s: .. requests: .. errors: ..`.
    RatelimitRedis(crate::anchor::AnchorArgs),
    /// Serve a modelled upstream: `--capacity` requests at `--service` time each; past
    /// the capacity every request slows down (a shared processor), so latency grows
    /// with the requests in flight. For measuring adaptive limits.
    Upstream(crate::adaptive::UpstreamArgs),
    /// Closed-loop clients against a URL: each sends, waits for its answer (or a
    /// 429/503 and a pause), and sends again. Ends with
    /// `ok/s: .. shed/s: .. success: ..% p50_us: .. p99_us: .. errors: ..`.
    ClosedLoop(crate::adaptive::ClosedLoopArgs),
    /// A fleet of simulated Envoys on a service's rate limit quota stream (RLQS):
    /// each reports its usage and admits or denies by its own assignment. Ends with
    /// `admitted/s: .. denied/s: .. assignments/s: .. envoys: .. buckets: .. errors: ..`.
    Rlqs(crate::rlqs::RlqsArgs),
    /// Serve 200 to every request: the HTTP stack's ceiling, to compare against.
    Ceiling {
        /// The listen address.
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
    },
}

#[derive(Debug, Parser)]
/// `tollgate bench redis` arguments.
pub struct RedisBenchArgs {
    /// `redis://host:port`, `redis+cluster://host:port,host:port` or
    /// `redis+sentinel://host:port,host:port/master-name` (`rediss...` over TLS).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// For `rediss://`: the server's CA (PEM; default: the system's roots).
    #[arg(long)]
    pub redis_ca: Option<std::path::PathBuf>,
    /// For `rediss://`: a client certificate (PEM), for mutual TLS.
    #[arg(long, requires = "redis_key")]
    pub redis_cert: Option<std::path::PathBuf>,
    /// Its key (PEM).
    #[arg(long, requires = "redis_cert")]
    pub redis_key: Option<std::path::PathBuf>,
    /// The policy spec checked (repeat for a rule set).
    #[arg(long, required = true)]
    pub policy: Vec<String>,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Connections the callers share.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 10000)]
    pub keys: u64,
    /// How long to run (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = tollgate_runtime::config::duration_arg)]
    pub duration: std::time::Duration,
    /// The most checks per Redis call (automatic batching); 1 turns batching off.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// How the decision code is called: auto (the tollgate module where a node loaded
    /// it, else Functions where Redis has them, else EVALSHA), module, functions, eval.
    #[arg(long, default_value = "auto", value_parser = parse_calls)]
    pub calls: tollgate::redis::RedisCalls,
    /// Decide through leased slices of each key's budget, spendable for this long
    /// (e.g. 50ms); the slice grows up to a quarter of the smallest limit.
    #[arg(long, value_parser = tollgate_runtime::config::duration_arg)]
    pub lease: Option<std::time::Duration>,
    /// Count as Envoy does (hits charged whatever the answer, as envoyproxy/ratelimit's
    /// `INCRBY`) instead of trying.
    #[arg(long)]
    pub count: bool,
    /// With batching, lone checks sent at once as calls of their own (0 queues every
    /// check; `store.direct_calls`).
    #[arg(long, default_value_t = tollgate::redis::RedisOptions::default().direct_calls)]
    pub direct_calls: usize,
    /// Keep a rule set that is one clock-aligned `fixed-window` with `debt=forgive` as
    /// window counters (plain `INCRBY` and `PEXPIRE`), as `serve` does.
    #[arg(long, conflicts_with = "lease")]
    pub window_counters: bool,
}

fn parse_calls(s: &str) -> Result<tollgate::redis::RedisCalls, String> {
    use tollgate::redis::RedisCalls;
    match s {
        "auto" => Ok(RedisCalls::Auto),
        "module" => Ok(RedisCalls::Module),
        "functions" => Ok(RedisCalls::Functions),
        "eval" => Ok(RedisCalls::Eval),
        _ => Err(format!("{s:?}: expected auto, module, functions or eval")),
    }
}

#[derive(Debug, Parser)]
/// `tollgate bench http|grpc` arguments.
pub struct LoadArgs {
    /// The service's address: host:port (or http://host:port) of its HTTP or gRPC
    /// listener.
    #[arg(long)]
    pub target: String,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Distinct descriptor values (keys).
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// How long to run (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = tollgate_runtime::config::duration_arg)]
    pub duration: std::time::Duration,
    /// Total requests per second to aim for (default: as fast as possible).
    #[arg(long)]
    pub rate: Option<u64>,
    /// The domain to ask about.
    #[arg(long, default_value = "example")]
    pub domain: String,
    /// The descriptor key; its values are k0..k{keys-1}.
    #[arg(long, default_value = "api_key")]
    pub key: String,
    /// `bench grpc` over TLS: the CA of the server's certificate (PEM).
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    /// With --ca: a client certificate (PEM), for mutual TLS.
    #[arg(long, requires_all = ["ca", "key_file"])]
    pub cert: Option<std::path::PathBuf>,
    /// Its key (PEM).
    #[arg(long = "key-file", requires = "cert")]
    pub key_file: Option<std::path::PathBuf>,
    /// With --ca: the name the server's certificate must carry (default: the host of
    /// --target).
    #[arg(long, requires = "ca")]
    pub server_name: Option<String>,
}

/// Prints `bench redis-call`'s words: the unbatched call of `policy` as `calls` sends
/// it, quoted for the shell (the bench scripts evaluate them).
async fn redis_call(
    policy: &str,
    calls: tollgate::redis::RedisCalls,
    charge: bool,
) -> anyhow::Result<()> {
    let rules = tollgate::RuleSet::parse(&[policy]).map_err(anyhow::Error::msg)?;
    // Only the call's words are printed: nothing connects.
    let store = tollgate::redis::RedisStore::connect_later(
        "redis://127.0.0.1:1/",
        tollgate::redis::RedisOptions::default(),
    )?;
    let limiter = tollgate::redis::RedisLimiter::new(store, "bench", rules)?;
    let call = (limiter.script_call("k__rand_int__", 1, calls, charge))
        .ok_or_else(|| anyhow::anyhow!("the tollgate module does not decide {policy}"))?;
    let words: Vec<String> = (call.into_iter())
        .map(|a| {
            if a.is_empty() || a.contains(' ') {
                format!("'{a}'")
            } else {
                a
            }
        })
        .collect();
    println!("{}", words.join(" "));
    Ok(())
}

/// Runs a `tollgate bench` subcommand; prints its totals line.
pub fn command(cmd: BenchCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (protocol, args) = match cmd {
        BenchCommand::Ceiling { listen } => return runtime.block_on(ceiling(listen)),
        BenchCommand::Upstream(a) => return runtime.block_on(crate::adaptive::upstream(a)),
        BenchCommand::Rlqs(a) => return runtime.block_on(crate::rlqs::fleet(a)),
        BenchCommand::RatelimitRedis(a) => return runtime.block_on(crate::anchor::run(a)),
        BenchCommand::ClosedLoop(a) => return runtime.block_on(crate::adaptive::closed_loop(a)),
        BenchCommand::RedisCall {
            policy,
            eval,
            module,
            charge,
        } => {
            let calls = match (eval, module) {
                (true, _) => tollgate::redis::RedisCalls::Eval,
                (_, true) => tollgate::redis::RedisCalls::Module,
                _ => tollgate::redis::RedisCalls::Functions,
            };
            return runtime.block_on(redis_call(&policy, calls, charge));
        }
        BenchCommand::Redis(a) => {
            if a.concurrency == 0 {
                anyhow::bail!("--concurrency must be at least 1");
            }
            let rules = tollgate::RuleSet::parse(&a.policy).map_err(anyhow::Error::msg)?;
            let spec = LoadSpec {
                target: a.redis_url,
                concurrency: a.concurrency,
                keys: a.keys,
                duration: a.duration,
                rate: None,
                domain: String::new(),
                key: String::new(),
                redis: Some(RedisLoad {
                    rules,
                    connections: a.connections,
                    batch: a.batch,
                    calls: a.calls,
                    lease: a.lease.map(|duration| tollgate::redis::LeaseOptions {
                        duration,
                        ..Default::default()
                    }),
                    count: a.count,
                    direct_calls: a.direct_calls,
                    window_counters: a.window_counters,
                    tls: (a.redis_ca.is_some() || a.redis_cert.is_some()).then(|| {
                        tollgate::redis::RedisTls {
                            ca_file: a.redis_ca.clone(),
                            cert_file: a.redis_cert.clone(),
                            key_file: a.redis_key.clone(),
                            ..Default::default()
                        }
                    }),
                }),
                tls: None,
            };
            let totals = runtime.block_on(run(Protocol::Redis, spec))?;
            println!("{totals}");
            return Ok(());
        }
        BenchCommand::Http(a) => (Protocol::Http, a),
        BenchCommand::Json(a) => (Protocol::Json, a),
        BenchCommand::Grpc(a) => (Protocol::Grpc, a),
    };
    if args.concurrency == 0 {
        anyhow::bail!("--concurrency must be at least 1");
    }
    // `http://host:port` as the server's banner prints it, or `host:port`.
    let target = args.target.strip_prefix("http://").unwrap_or(&args.target);
    if target.contains("://") || target.contains('/') {
        anyhow::bail!(
            "--target {}: host:port (or http://host:port) of the listener",
            args.target
        );
    }
    let spec = LoadSpec {
        target: target.to_string(),
        concurrency: args.concurrency,
        keys: args.keys,
        duration: args.duration,
        rate: args.rate,
        domain: args.domain,
        key: args.key,
        redis: None,
        tls: args.ca.map(|ca| ClientTls {
            ca,
            identity: args.cert.zip(args.key_file),
            server_name: args.server_name,
        }),
    };
    if spec.tls.is_some() && protocol != Protocol::Grpc {
        anyhow::bail!("--ca: bench grpc only (drive HTTPS with wrk or curl)");
    }
    let totals = runtime.block_on(run(protocol, spec))?;
    println!("{totals}");
    Ok(())
}
