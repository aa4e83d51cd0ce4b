//! What measures an adaptive limit end to end, as real processes:
//! `tollgate bench upstream`, a modelled service whose service time grows with its
//! requests in flight past a capacity, and `tollgate bench closed-loop`, clients that
//! send, wait for the answer, and send again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use tollgate::clock::{Clock, MonotonicClock};

use tollgate_offline::overload::{parse_schedule, Schedule};
use tollgate_offline::traffic::Rng;

#[derive(Debug, Parser)]
/// `tollgate bench upstream` arguments.
pub struct UpstreamArgs {
    /// The listen address.
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: SocketAddr,
    /// Requests served at full speed at once; past it every request slows down.
    #[arg(long, default_value_t = 8)]
    pub capacity: u32,
    /// The service time of a request at or below the capacity (e.g. 20ms).
    #[arg(long, default_value = "20ms", value_parser = tollgate_runtime::config::duration_arg)]
    pub service: Duration,
    /// Capacity changes after the start, e.g. `5s=4,10s=8`.
    #[arg(long, value_parser = parse_schedule)]
    pub schedule: Option<Schedule>,
    /// How much each request's service time varies either way, a fraction from 0 to
    /// 0.9 (0.2: +-20 %, uniformly), as a real service's does.
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,
    /// Answer `{"usage":{"total_tokens":N}}` (JSON) instead of `ok`: what a `cost:`
    /// route reads. A request whose JSON body says `"stream": true` is answered as
    /// OpenAI streams: server-sent events, the usage in a last event of its own (and
    /// `"usage":null` in the others) only when the body asks
    /// (`stream_options.include_usage`).
    #[arg(long)]
    pub usage: Option<u64>,
}

/// Serves the modelled upstream until the process ends: every request takes
/// `service x max(1, n / capacity)`, `n` the requests in flight as it arrives (a
/// processor shared by the requests in flight).
pub async fn upstream(args: UpstreamArgs) -> anyhow::Result<()> {
    tollgate_offline::overload::check_service(args.capacity, args.jitter)?;
    let capacity = Arc::new(AtomicU32::new(args.capacity));
    let in_flight = Arc::new(AtomicU32::new(0));
    if let Some(Schedule(schedule)) = args.schedule {
        let capacity = capacity.clone();
        tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for (at, c) in schedule {
                tokio::time::sleep_until(start + at).await;
                capacity.store(c, Ordering::SeqCst);
            }
        });
    }
    let (service, jitter) = (args.service, args.jitter);
    let body: &'static str = match args.usage {
        Some(n) => format!("{{\"usage\":{{\"total_tokens\":{n}}}}}").leak(),
        None => "ok\n",
    };
    let content_type = if args.usage.is_some() {
        "application/json"
    } else {
        "text/plain"
    };
    let usage = args.usage;
    let requests = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().fallback(move |request: axum::body::Bytes| {
        let (capacity, in_flight) = (capacity.clone(), in_flight.clone());
        let nth = requests.fetch_add(1, Ordering::Relaxed);
        async move {
            let n = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            let c = capacity.load(Ordering::SeqCst);
            let spread = 1.0 + jitter * (2.0 * Rng(nth).unit() - 1.0);
            tokio::time::sleep((service * n.max(c) / c).mul_f64(spread)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            match usage.and_then(|n| event_stream(&request, n)) {
                Some(events) => (
                    [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                    events,
                ),
                None => (
                    [(axum::http::header::CONTENT_TYPE, content_type)],
                    body.to_owned(),
                ),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    println!(
        "tollgate bench upstream: capacity {} at {:?} on http://{}",
        args.capacity,
        service,
        listener.local_addr()?
    );
    axum::serve(listener, app).await?;
    Ok(())
}

/// The events an OpenAI-compatible API streams for `request` (a JSON body with
/// `"stream": true`) that used `usage` tokens, if it is a stream.
fn event_stream(request: &[u8], usage: u64) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(request).ok()?;
    if json["stream"] != serde_json::Value::Bool(true) {
        return None;
    }
    let asked = json["stream_options"]["include_usage"] == serde_json::Value::Bool(true);
    let null = if asked { r#","usage":null"# } else { "" };
    let mut events = String::new();
    for word in ["Hello", " there"] {
        events.push_str(&format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{word}\"}}}}]{null}}}\n\n"
        ));
    }
    if asked {
        events.push_str(&format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"total_tokens\":{usage}}}}}\n\n"
        ));
    }
    events.push_str("data: [DONE]\n\n");
    Some(events)
}

#[derive(Debug, Parser)]
/// `tollgate bench closed-loop` arguments.
pub struct ClosedLoopArgs {
    /// The URL every client asks for (e.g. http://127.0.0.1:8000/api/).
    #[arg(long)]
    pub target: String,
    /// Clients, each with one request outstanding at a time.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// How long to run.
    #[arg(long, default_value = "10s", value_parser = tollgate_runtime::config::duration_arg)]
    pub duration: Duration,
    /// Leave the first part of the run out of the totals (the limit's ramp).
    #[arg(long, default_value = "1s", value_parser = tollgate_runtime::config::duration_arg)]
    pub settle: Duration,
    /// A header sent with every request (`NAME: VALUE`; repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// How long a client waits after a rejection (429/503) before it sends again.
    #[arg(long, default_value = "1ms", value_parser = tollgate_runtime::config::duration_arg)]
    pub pause: Duration,
    /// Print a line per interval (e.g. 1s); none by default.
    #[arg(long, value_parser = tollgate_runtime::config::duration_arg)]
    pub interval: Option<Duration>,
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    shed: AtomicU64,
    errors: AtomicU64,
}

/// What the clients measured: the totals after `settle`, and the current interval's.
struct Record {
    settle: u64,
    total: Tally,
    hist: Mutex<Histogram<u64>>,
    window: Tally,
    window_hist: Mutex<Histogram<u64>>,
}

impl Record {
    fn new(settle: u64) -> anyhow::Result<Record> {
        let hist = || Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map(Mutex::new);
        Ok(Record {
            settle,
            total: Tally::default(),
            hist: hist()?,
            window: Tally::default(),
            window_hist: hist()?,
        })
    }

    /// Counts one answer (`None`: no answer), sent at `sent` and received at `now`;
    /// whether the client should pause before it sends again.
    fn answer(&self, status: Option<http::StatusCode>, sent: u64, now: u64) -> bool {
        let counted = now >= self.settle;
        let tallies = [Some(&self.window), counted.then_some(&self.total)];
        let count = |which: fn(&Tally) -> &AtomicU64| {
            for t in tallies.iter().flatten() {
                which(t).fetch_add(1, Ordering::Relaxed);
            }
        };
        match status {
            Some(s) if s.is_success() => {
                let us = (now - sent).max(1);
                let _ = lock(&self.window_hist).record(us);
                if counted {
                    let _ = lock(&self.hist).record(us);
                }
                count(|t| &t.ok);
                false
            }
            Some(s) if s.as_u16() == 429 || s.as_u16() == 503 => {
                count(|t| &t.shed);
                true
            }
            _ => {
                count(|t| &t.errors);
                true
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `--header NAME: VALUE` arguments.
fn parse_headers(headers: &[String]) -> anyhow::Result<Vec<(http::HeaderName, http::HeaderValue)>> {
    headers
        .iter()
        .map(|h| {
            let (n, v) = h
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("--header {h:?}: expected NAME: VALUE"))?;
            Ok((
                http::HeaderName::from_bytes(n.trim().as_bytes())?,
                http::HeaderValue::from_str(v.trim())?,
            ))
        })
        .collect()
}

/// Runs the clients; prints the totals after `settle`:
/// `ok/s: .. shed/s: .. success: ..% p50_us: .. p99_us: .. errors: ..`.
pub async fn closed_loop(args: ClosedLoopArgs) -> anyhow::Result<()> {
    if args.clients == 0 {
        anyhow::bail!("--clients must be at least 1");
    }
    let uri: http::Uri = args
        .target
        .parse()
        .map_err(|e| anyhow::anyhow!("--target {}: {e}", args.target))?;
    if uri.scheme_str() != Some("http") {
        anyhow::bail!("--target {}: an http:// URL", args.target);
    }
    let headers = parse_headers(&args.headers)?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(args.clients)
        .build_http::<Empty<bytes::Bytes>>();
    let clock = MonotonicClock::new();
    let start = clock.now_us();
    let end = start + args.duration.as_micros() as u64;
    let record = Arc::new(Record::new(start + args.settle.as_micros() as u64)?);
    let clients: Vec<_> = (0..args.clients)
        .map(|_| {
            let (client, uri, headers, clock, record) = (
                client.clone(),
                uri.clone(),
                headers.clone(),
                clock.clone(),
                record.clone(),
            );
            let pause = args.pause;
            tokio::spawn(async move {
                while clock.now_us() < end {
                    let mut req = http::Request::get(uri.clone())
                        .body(Empty::new())
                        .expect("a valid request");
                    req.headers_mut().extend(headers.iter().cloned());
                    let sent = clock.now_us();
                    let status = match client.request(req).await {
                        Ok(res) => {
                            let status = res.status();
                            let _ = res.into_body().collect().await;
                            Some(status)
                        }
                        Err(_) => None,
                    };
                    if record.answer(status, sent, clock.now_us()) {
                        tokio::time::sleep(pause).await;
                    }
                }
            })
        })
        .collect();
    if let Some(every) = args.interval {
        report_intervals(&record, &clock, start, end, every).await;
    }
    for c in clients {
        c.await?;
    }
    let secs = (end.saturating_sub(record.settle)) as f64 / 1e6;
    let total = &record.total;
    let (ok, shed) = (
        total.ok.load(Ordering::Relaxed),
        total.shed.load(Ordering::Relaxed),
    );
    let h = lock(&record.hist);
    println!(
        "ok/s: {:.1} shed/s: {:.1} success: {:.2}% p50_us: {} p99_us: {} errors: {}",
        ok as f64 / secs,
        shed as f64 / secs,
        100.0 * ok as f64 / (ok + shed).max(1) as f64,
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        total.errors.load(Ordering::Relaxed)
    );
    Ok(())
}

/// Prints a line per interval `every` until `end`.
async fn report_intervals(
    record: &Record,
    clock: &MonotonicClock,
    start: u64,
    end: u64,
    every: Duration,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    while clock.now_us() < end {
        tick.tick().await;
        let secs = every.as_secs_f64();
        let ok = record.window.ok.swap(0, Ordering::Relaxed);
        let shed = record.window.shed.swap(0, Ordering::Relaxed);
        let mut h = lock(&record.window_hist);
        println!(
            "t={:.1}s ok/s: {:.0} shed/s: {:.0} p50_us: {} p99_us: {}",
            (clock.now_us() - start) as f64 / 1e6,
            ok as f64 / secs,
            shed as f64 / secs,
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99)
        );
        h.reset();
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// `tollgate` as far as `bench`: the binary's own command line is above this crate.
    #[derive(Debug, Parser)]
    #[command(name = "tollgate")]
    enum Cli {
        #[command(subcommand)]
        Bench(crate::BenchCommand),
    }

    #[test]
    fn the_adaptive_bench_commands_parse_every_argument() {
        let args = [
            "tollgate",
            "bench",
            "upstream",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "8",
            "--service",
            "20ms",
            "--schedule",
            "5s=4,10s=8",
        ];
        assert!(Cli::try_parse_from(args).is_ok());
        let bad = ["tollgate", "bench", "upstream", "--schedule", "5s=0"];
        let err = Cli::try_parse_from(bad).unwrap_err().to_string();
        assert!(err.contains("above 0"), "{err}");
        let args = [
            "tollgate",
            "bench",
            "closed-loop",
            "--target",
            "http://127.0.0.1:1/",
            "--clients",
            "4",
            "--duration",
            "1s",
            "--settle",
            "0s",
            "--header",
            "x-api-key: a",
            "--pause",
            "2ms",
            "--interval",
            "1s",
        ];
        assert!(Cli::try_parse_from(args).is_ok());
    }
}
