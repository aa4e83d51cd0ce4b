//! `tollgate bench rlqs`: a fleet of simulated Envoys on a rate limit quota service
//! (RLQS), offering requests that each Envoy admits or denies by its own assignment,
//! with no call per request; and [`QuotaClient`], the simulated Envoy (the tests'
//! too).
//!
//! A simulated Envoy for the rate limit quota service (RLQS), behaving as Envoy's
//! `rate_limit_quota` filter documents: one bidirectional stream to the server; the
//! first report of a bucket subscribes it; usage (allowed, denied, time elapsed) is
//! reported every reporting interval; an assignment is enforced locally — a token
//! bucket that starts full and refills continuously, `DENY_ALL`, `ALLOW_ALL` — until its
//! time to live ends (counted from its arrival; Envoy reads the time to live and the
//! fill interval in whole seconds, and so does this client); the same strategy again only extends
//! an unexpired assignment, another replaces it (a new bucket); without an assignment,
//! or once it has expired, requests are denied (`no_assignment_behavior` and
//! `expired_assignment_behavior` as `DENY_ALL`); an `AbandonAction` forgets the
//! bucket (the next request subscribes again).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One bucket's state in the filter.
#[derive(Debug, Default)]
struct Bucket {
    /// The strategy in force and when it expires.
    active: Option<(Strategy, Instant)>,
    /// Tokens of the token bucket, as a fraction.
    tokens: f64,
    at: Option<Instant>,
    allowed: u64,
    denied: u64,
}

impl Bucket {
    fn apply(&mut self, strategy: Strategy, ttl: Duration, now: Instant) {
        match &mut self.active {
            Some((s, expires)) if *s == strategy && now < *expires => *expires = now + ttl,
            _ => {
                if let Strategy::TokenBucket(tb) = &strategy {
                    self.tokens = f64::from(tb.max_tokens);
                    self.at = Some(now);
                }
                self.active = Some((strategy, now + ttl));
            }
        }
    }

    fn admit(&mut self, now: Instant) -> bool {
        let ok = match &self.active {
            Some((strategy, expires)) if now < *expires => match strategy {
                Strategy::BlanketRule(r) => *r == BlanketRule::AllowAll as i32,
                Strategy::TokenBucket(tb) => {
                    // Envoy reads the fill interval in whole seconds (0: no bound).
                    let fill = tb.fill_interval.map_or(1.0, |d| d.seconds as f64);
                    let per_fill = f64::from(tb.tokens_per_fill.map_or(1, |v| v.value));
                    let elapsed = self.at.map_or(0.0, |at| (now - at).as_secs_f64());
                    self.tokens =
                        (self.tokens + elapsed * per_fill / fill).min(f64::from(tb.max_tokens));
                    self.at = Some(now);
                    if self.tokens >= 1.0 {
                        self.tokens -= 1.0;
                        true
                    } else {
                        false
                    }
                }
                Strategy::RequestsPerTimeUnit(_) => false,
            },
            _ => false,
        };
        if ok {
            self.allowed += 1;
        } else {
            self.denied += 1;
        }
        ok
    }
}

/// The bucket ids of `--bucket pattern` for `--buckets n`: `{i}` in a value is the
/// bucket's number.
fn bucket_ids(pattern: &str, n: usize) -> anyhow::Result<Vec<Key>> {
    let pairs = (pattern.split(','))
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() && !v.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => anyhow::bail!(
                "--bucket {pattern}: '{pair}': expected key=value pairs separated by commas, \
                 e.g. tenant=t{{i}},api=chat"
            ),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if n > 1 && !pairs.iter().any(|(_, v)| v.contains("{i}")) {
        anyhow::bail!("--bucket {pattern}: with --buckets {n}, a value must hold {{i}} (the bucket's number), else every bucket is the same");
    }
    Ok((0..n)
        .map(|i| {
            let id = pairs
                .iter()
                .map(|(k, v)| (k.clone(), v.replace("{i}", &i.to_string())));
            let mut id: Key = id.collect();
            id.sort();
            id
        })
        .collect())
}

/// A bucket id as the simulated filter keys it: its pairs in order.
type Key = Vec<(String, String)>;

/// The filter's buckets, shared by the request path and the stream's reader.
type Buckets = Arc<Mutex<HashMap<Key, Bucket>>>;

/// A simulated Envoy with one stream to an RLQS server.
pub struct QuotaClient {
    buckets: Buckets,
    reports: mpsc::UnboundedSender<RateLimitQuotaUsageReports>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Assignments received, in all.
    pub received: Arc<AtomicU64>,
    /// Why the stream ended, once it has (`None` while it runs).
    ended: Arc<Mutex<Option<String>>>,
}

fn key(bucket: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut k: Vec<(String, String)> = bucket
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    k.sort();
    k
}

/// The stream's reader: sends what `outbound` yields, applies each assignment that
/// comes back to its bucket (counted in `received`), forgets abandoned buckets, and
/// says in `ended` why the stream ended.
async fn read_assignments(
    mut client: RateLimitQuotaServiceClient<tonic::transport::Channel>,
    outbound: impl futures_util::Stream<Item = RateLimitQuotaUsageReports> + Send + 'static,
    buckets: Buckets,
    received: Arc<AtomicU64>,
    ended: Arc<Mutex<Option<String>>>,
) {
    let end = |why: String| *ended.lock().unwrap() = Some(why);
    let mut inbound = match client.stream_rate_limit_quotas(outbound).await {
        Ok(response) => response.into_inner(),
        Err(status) => return end(status.to_string()),
    };
    loop {
        let actions = match inbound.message().await {
            Ok(Some(RateLimitQuotaResponse { bucket_action })) => bucket_action,
            Ok(None) => return end("the server ended the stream".into()),
            Err(status) => return end(status.to_string()),
        };
        let now = Instant::now();
        let mut buckets = buckets.lock().unwrap();
        for a in actions {
            let Some(id) = a.bucket_id else { continue };
            let mut k: Vec<(String, String)> = id.bucket.into_iter().collect();
            k.sort();
            match a.bucket_action {
                Some(Action::QuotaAssignmentAction(q)) => {
                    // Envoy counts the time to live in whole seconds.
                    let ttl = q
                        .assignment_time_to_live
                        .map_or(Duration::MAX / 4, |d| Duration::from_secs(d.seconds as u64));
                    let strategy = q
                        .rate_limit_strategy
                        .and_then(|s| s.strategy)
                        .unwrap_or(Strategy::BlanketRule(BlanketRule::AllowAll as i32));
                    received.fetch_add(1, Ordering::Relaxed);
                    buckets.entry(k).or_default().apply(strategy, ttl, now);
                }
                Some(Action::AbandonAction(_)) => {
                    buckets.remove(&k);
                }
                None => {}
            }
        }
    }
}

/// The reporter: every `interval`, each bucket's usage since the last report (the
/// first report names `domain`), until the stream is gone.
async fn report_usage(
    buckets: Buckets,
    reports: mpsc::UnboundedSender<RateLimitQuotaUsageReports>,
    domain: String,
    interval: Duration,
) {
    let mut last = Instant::now();
    let mut first = true;
    loop {
        tokio::time::sleep(interval).await;
        let now = Instant::now();
        let elapsed = now - last;
        last = now;
        let usages: Vec<BucketQuotaUsage> = {
            let mut buckets = buckets.lock().unwrap();
            buckets
                .iter_mut()
                .map(|(k, bucket)| {
                    let usage = BucketQuotaUsage {
                        bucket_id: Some(bucket_id(k)),
                        time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                            seconds: elapsed.as_secs() as i64,
                            nanos: elapsed.subsec_nanos() as i32,
                        }),
                        num_requests_allowed: bucket.allowed,
                        num_requests_denied: bucket.denied,
                    };
                    (bucket.allowed, bucket.denied) = (0, 0);
                    usage
                })
                .collect()
        };
        if usages.is_empty() {
            continue;
        }
        let domain = if first { domain.clone() } else { String::new() };
        first = false;
        let report = RateLimitQuotaUsageReports {
            domain,
            bucket_quota_usages: usages,
        };
        if reports.send(report).is_err() {
            return;
        }
    }
}

fn bucket_id(key: &[(String, String)]) -> BucketId {
    BucketId {
        bucket: key.iter().cloned().collect(),
    }
}

impl QuotaClient {
    /// Opens a stream to the RLQS server at `addr` (gRPC) for `domain`; reports on
    /// every bucket it has seen every `interval`.
    pub async fn connect(
        addr: SocketAddr,
        domain: &str,
        interval: Duration,
    ) -> Result<QuotaClient, tonic::transport::Error> {
        let client = RateLimitQuotaServiceClient::connect(format!("http://{addr}")).await?;
        let (reports, rx) = mpsc::unbounded_channel::<RateLimitQuotaUsageReports>();
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let buckets: Buckets = Arc::default();
        let received = Arc::new(AtomicU64::new(0));
        let ended: Arc<Mutex<Option<String>>> = Arc::default();
        let reader = tokio::spawn(read_assignments(
            client,
            outbound,
            buckets.clone(),
            received.clone(),
            ended.clone(),
        ));
        let reporter = tokio::spawn(report_usage(
            buckets.clone(),
            reports.clone(),
            domain.to_string(),
            interval,
        ));
        Ok(QuotaClient {
            buckets,
            reports,
            tasks: vec![reader, reporter],
            received,
            ended,
        })
    }

    /// A request matched into `bucket`: allowed or denied by the assignment in force.
    /// The first request of a bucket subscribes it (reported at once, denied until an
    /// assignment arrives).
    pub fn try_admit(&self, domain: &str, bucket: &[(&str, &str)]) -> bool {
        let k = key(bucket);
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap();
        if !buckets.contains_key(&k) {
            let first = RateLimitQuotaUsageReports {
                domain: domain.to_string(),
                bucket_quota_usages: vec![BucketQuotaUsage {
                    bucket_id: Some(bucket_id(&k)),
                    // As Envoy: the time since the bucket was made, in whole seconds.
                    time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: 0,
                        nanos: 0,
                    }),
                    num_requests_allowed: 0,
                    num_requests_denied: 1,
                }],
            };
            let _ = self.reports.send(first);
        }
        buckets.entry(k).or_default().admit(now)
    }

    /// How many of its buckets are under a blanket rule now: `[ALLOW_ALL, DENY_ALL]`.
    pub fn blankets(&self) -> [usize; 2] {
        let now = Instant::now();
        let buckets = self.buckets.lock().unwrap();
        let mut n = [0, 0];
        for b in buckets.values() {
            if let Some((Strategy::BlanketRule(r), expires)) = &b.active {
                if now < *expires {
                    n[usize::from(*r != BlanketRule::AllowAll as i32)] += 1;
                }
            }
        }
        n
    }

    /// Why the stream ended (a status from the server, a broken connection), if it
    /// has.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap().clone()
    }

    /// Ends the stream (as an Envoy that goes away).
    pub fn close(self) {
        for t in self.tasks {
            t.abort();
        }
    }
}

#[derive(Debug, clap::Parser)]
/// `tollgate bench rlqs` arguments.
pub struct RlqsArgs {
    /// The service's gRPC listener: host:port (or http://host:port).
    #[arg(long)]
    pub target: String,
    /// Simulated Envoys (one stream each).
    #[arg(long, default_value_t = 50)]
    pub envoys: usize,
    /// Buckets each Envoy reports on (the same buckets for every Envoy), each made
    /// from `--bucket`.
    #[arg(long, default_value_t = 1)]
    pub buckets: usize,
    /// The bucket id: `key=value,...`, where `{i}` in a value is the bucket's
    /// number (0 .. buckets-1; needed with more than one bucket).
    #[arg(long, default_value = "name=b{i}")]
    pub bucket: String,
    /// Requests each Envoy offers per bucket per second.
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
    /// How often each Envoy reports its usage.
    #[arg(long, default_value = "1s", value_parser = tollgate_runtime::config::duration_arg)]
    pub report_interval: Duration,
    /// How long to offer requests (after every Envoy has connected).
    #[arg(long, default_value = "10s", value_parser = tollgate_runtime::config::duration_arg)]
    pub duration: Duration,
    /// How long at the start is not counted (while the first assignments arrive), before
    /// `--duration`.
    #[arg(long, default_value = "2s", value_parser = tollgate_runtime::config::duration_arg)]
    pub warmup: Duration,
    /// The domain reported.
    #[arg(long, default_value = "envoy")]
    pub domain: String,
}

/// Runs the fleet; prints `admitted/s: .. denied/s: .. assignments/s: .. envoys: ..
/// buckets: .. errors: ..` (admissions and denials counted after the warm-up; errors:
/// streams that ended before the run did, the first one's status on stderr), and on
/// stderr each second counted (`second 1: admitted .. denied ..`) and how many
/// buckets ended under a blanket rule (an `ALLOW_ALL` most often means that no rule
/// takes the bucket ids sent).
pub async fn fleet(args: RlqsArgs) -> anyhow::Result<()> {
    let clients = connect_all(&args).await?;
    let ids: Arc<Vec<Key>> = Arc::new(bucket_ids(&args.bucket, args.buckets)?);
    let start = Instant::now();
    let (warm, end) = (start + args.warmup, start + args.warmup + args.duration);
    let totals: Arc<Totals> = Arc::default();
    // Each Envoy offers its requests every STEP, spread over its buckets.
    const STEP: Duration = Duration::from_millis(10);
    let per_step = args.rate as f64 * STEP.as_secs_f64();
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let (ids, totals, domain) = (ids.clone(), totals.clone(), args.domain.clone());
        tasks.push(tokio::spawn(async move {
            let ids: Vec<Vec<(&str, &str)>> = (ids.iter())
                .map(|id| id.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
                .collect();
            let mut next = start + STEP.mul_f64(i as f64 / args.envoys as f64);
            let mut owed = 0.0;
            while next < end {
                tokio::time::sleep_until(next).await;
                owed += per_step;
                let n = owed as u64;
                owed -= n as f64;
                let (mut allowed, mut denied) = (0, 0);
                for _ in 0..n {
                    for id in &ids {
                        if client.try_admit(&domain, id) {
                            allowed += 1;
                        } else {
                            denied += 1;
                        }
                    }
                }
                if Instant::now() >= warm {
                    totals[0].fetch_add(allowed, Ordering::Relaxed);
                    totals[1].fetch_add(denied, Ordering::Relaxed);
                }
                next += STEP;
            }
            let received = client.received.load(Ordering::Relaxed);
            (received, client.ended(), client.blankets())
        }));
    }
    let progress = tokio::spawn(print_seconds(totals.clone(), warm, end));
    let (mut assignments, mut errors, mut first_error) = (0, 0, None);
    let mut blankets = [0, 0];
    for t in tasks {
        let (received, ended, blanket) = t.await?;
        assignments += received;
        blankets = [blankets[0] + blanket[0], blankets[1] + blanket[1]];
        if let Some(e) = ended {
            errors += 1;
            first_error.get_or_insert(e);
        }
    }
    let _ = progress.await;
    warn_blankets(blankets, args.envoys * args.buckets);
    if let Some(e) = &first_error {
        eprintln!("tollgate bench rlqs: {errors} streams ended early; the first: {e}");
    }
    let secs = args.duration.as_secs_f64();
    let total = |i: usize| totals[i].load(Ordering::Relaxed) as f64 / secs;
    println!(
        "admitted/s: {:.0} denied/s: {:.0} assignments/s: {:.0} envoys: {} buckets: {} errors: {}",
        total(0),
        total(1),
        assignments as f64 / (args.warmup + args.duration).as_secs_f64(),
        args.envoys,
        args.buckets,
        errors
    );
    Ok(())
}

/// Admitted and denied, counted after the warm-up.
type Totals = [AtomicU64; 2];

/// Each second counted, on stderr: what the fleet admitted and denied in it.
async fn print_seconds(totals: Arc<Totals>, warm: Instant, end: Instant) {
    let (mut at, mut last) = (warm, [0, 0]);
    while at + Duration::from_secs(1) <= end {
        at += Duration::from_secs(1);
        tokio::time::sleep_until(at).await;
        let now = totals.each_ref().map(|t| t.load(Ordering::Relaxed));
        eprintln!(
            "tollgate bench rlqs: second {}: admitted {} denied {}",
            (at - warm).as_secs(),
            now[0] - last[0],
            now[1] - last[1]
        );
        last = now;
    }
}

/// Says how many of the `held` buckets ended under a blanket rule: a bucket no rule
/// takes is answered ALLOW_ALL, a run that measured nothing.
fn warn_blankets(blankets: [usize; 2], held: usize) {
    for (n, rule, why) in [
        (blankets[0], "ALLOW_ALL", "no quota_buckets rule of the domain takes those bucket ids (check --bucket and --domain), or an allow_all rule does: nothing limited them"),
        (blankets[1], "DENY_ALL", "a deny_all rule, or the store's on_error: fail-closed"),
    ] {
        if n > 0 {
            eprintln!("tollgate bench rlqs: {n} of {held} buckets (one per Envoy and bucket) ended under {rule}: {why}");
        }
    }
}

/// One connected [`QuotaClient`] per Envoy of the fleet.
async fn connect_all(args: &RlqsArgs) -> anyhow::Result<Vec<QuotaClient>> {
    let target = args.target.strip_prefix("http://").unwrap_or(&args.target);
    let addr: SocketAddr = match tokio::net::lookup_host(target).await {
        Ok(mut addrs) => addrs.next(),
        Err(e) => anyhow::bail!("--target {target}: expected host:port of the gRPC listener ({e})"),
    }
    .ok_or_else(|| anyhow::anyhow!("--target {target}: the name has no address"))?;
    if args.envoys == 0 || args.buckets == 0 {
        anyhow::bail!("--envoys and --buckets must be at least 1");
    }
    let mut clients = Vec::with_capacity(args.envoys);
    for _ in 0..args.envoys {
        let client = QuotaClient::connect(addr, &args.domain, args.report_interval).await;
        clients.push(client.map_err(|e| {
            // The innermost cause alone (tonic repeats its chain in each layer).
            let mut cause: &dyn std::error::Error = &e;
            while let Some(next) = cause.source() {
                cause = next;
            }
            anyhow::anyhow!("--target {target}: cannot connect to {addr}: {cause}")
        })?);
    }
    Ok(clients)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_ids_number_each_bucket_and_refuse_what_cannot_be_one() {
        let pairs = |id: &Key| {
            id.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
        };
        let ids = bucket_ids("tenant=t{i}, api=chat", 2).unwrap();
        assert_eq!(pairs(&ids[0]), ["api=chat", "tenant=t0"]);
        assert_eq!(pairs(&ids[1]), ["api=chat", "tenant=t1"]);
        assert_eq!(pairs(&bucket_ids("name=b{i}", 1).unwrap()[0]), ["name=b0"]);
        assert_eq!(pairs(&bucket_ids("name=x", 1).unwrap()[0]), ["name=x"]);
        for (pattern, n, says) in [
            ("name=x", 2, "a value must hold {i}"),
            ("tenant", 1, "'tenant': expected key=value pairs"),
            ("a=1,=2", 1, "'=2': expected key=value pairs"),
        ] {
            let e = bucket_ids(pattern, n).unwrap_err().to_string();
            assert!(e.contains(says), "{pattern}: {e}");
        }
    }
}
