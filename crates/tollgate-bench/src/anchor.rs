//! `tollgate bench ratelimit-redis`: the Redis traffic envoyproxy/ratelimit sends for
//! one descriptor of a rule of one `unit`, as the anchor that tollgate's Redis cost is
//! measured against (`scripts/bench-redis-serve.sh`).
//!
//! Per request, as envoyproxy/ratelimit's Redis cache does: `INCRBY` on the key
//! `<domain>_<key>_<value>_<window start, s>` (a new key every window, since the key
//! names its window) and `EXPIRE` of that key by the unit's length, both in one
//! pipeline. Each connection sends `--pipeline` requests per write (envoyproxy/ratelimit
//! sends one per write unless its implicit pipelining is turned on: more per write is
//! the cheaper case for Redis, so the anchor errs in envoyproxy/ratelimit's favour).
//!
//! With `--gcra-sha`, each request is instead one `EVALSHA` of the minimal GCRA script
//! (`scripts/lua/gcra-reference.lua`, loaded by the caller) on a random key, burst
//! 1000 at 1,000,000/s: the GCRA anchor, which `--rate` can pace as well.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use clap::Parser;
use tollgate::clock::{Clock, MonotonicClock};

/// `tollgate bench ratelimit-redis` arguments.
#[derive(Debug, Parser)]
pub struct AnchorArgs {
    /// The Redis (`redis://host:port`).
    #[arg(long, default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// Connections, each sending its pipelines one after another.
    #[arg(long, default_value_t = 50)]
    pub connections: usize,
    /// Requests (an `INCRBY` and an `EXPIRE` each) per pipeline.
    #[arg(long, default_value_t = 8)]
    pub pipeline: usize,
    /// Distinct descriptor values.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// The rule's unit in seconds (1: `unit: second`).
    #[arg(long, default_value_t = 1)]
    pub unit: u64,
    /// Requests a second in all, spread over the connections (default: as fast as
    /// Redis answers). Compare at the rate the service decided at: a Redis that idles
    /// between writes pays for waking up, which a saturated one does not.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Send the minimal GCRA script's call (`EVALSHA` of this SHA1, loaded already)
    /// instead of envoyproxy/ratelimit's two commands.
    #[arg(long)]
    pub gcra_sha: Option<String>,
    /// How long to run (e.g. 5s).
    #[arg(long, default_value = "5s", value_parser = tollgate_runtime::config::duration_arg)]
    pub duration: std::time::Duration,
}

/// Runs the anchor's traffic; prints `requests/s: .. requests: .. errors: ..` (the
/// requests of pipelines that failed).
pub async fn run(a: AnchorArgs) -> anyhow::Result<()> {
    if a.connections == 0 || a.pipeline == 0 || a.unit == 0 {
        anyhow::bail!("--connections, --pipeline and --unit must be at least 1");
    }
    // Each connection sends a pipeline every `every`, when paced.
    let every = match a.rate {
        Some(r) if r.is_finite() && r > 0.0 => Some(std::time::Duration::from_secs_f64(
            (a.connections * a.pipeline) as f64 / r,
        )),
        Some(r) => anyhow::bail!("--rate {r}: must be a positive number of requests a second"),
        None => None,
    };
    let client = redis::Client::open(a.redis_url.as_str())?;
    let stop = Arc::new(AtomicBool::new(false));
    let (done, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let clock = MonotonicClock::new();
    let started = clock.now_us();
    let mut tasks = Vec::new();
    for c in 0..a.connections {
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (stop, done, errors, clock) =
            (stop.clone(), done.clone(), errors.clone(), clock.clone());
        let (pipeline, keys, unit, gcra) = (a.pipeline, a.keys.max(1), a.unit, a.gcra_sha.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = c as u64;
            let mut ticker = every.map(|every| {
                let mut t = tokio::time::interval(every);
                t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                t
            });
            while !stop.load(Ordering::Relaxed) {
                if let Some(t) = ticker.as_mut() {
                    t.tick().await;
                }
                let window = clock.now_us() / 1_000_000 / unit * unit;
                let mut pipe = redis::pipe();
                for _ in 0..pipeline {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = (n >> 33) % keys;
                    if let Some(sha) = &gcra {
                        let key = format!("gcra_ref_k{k}");
                        let args = ["1000", "1000000", "1", "1"];
                        pipe.cmd("EVALSHA")
                            .arg(sha)
                            .arg(1)
                            .arg(key)
                            .arg(&args[..])
                            .ignore();
                        continue;
                    }
                    let key = format!("bench_key_k{k}_{window}");
                    pipe.cmd("INCRBY").arg(&key).arg(1).ignore();
                    pipe.cmd("EXPIRE").arg(&key).arg(unit).ignore();
                }
                match pipe.query_async::<()>(&mut conn).await {
                    Ok(()) => done.fetch_add(pipeline as u64, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(pipeline as u64, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(a.duration).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await?;
    }
    let secs = (clock.now_us() - started) as f64 / 1e6;
    let requests = done.load(Ordering::Relaxed);
    println!(
        "requests/s: {:.0} requests: {requests} errors: {}",
        requests as f64 / secs,
        errors.load(Ordering::Relaxed)
    );
    Ok(())
}
