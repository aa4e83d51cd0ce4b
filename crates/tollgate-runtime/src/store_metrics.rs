//! The Redis store's figures as `serve` and the proxy export them: its counters summed
//! over limiters ([`StoreStats`]), its calls' times and batch sizes ([`RedisCalls`]),
//! its events, and the histogram buckets they are written with.

use std::sync::atomic::Ordering;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tollgate::AnyLimiter;

/// The labels of a metric family: `(name, value)` pairs.
pub type Labels = Vec<(&'static str, String)>;

/// The counters of Redis and leased limiters, summed (for the metrics).
#[derive(Debug, Clone, Default)]
pub struct StoreStats {
    /// Decisions, errors, fallbacks, negative-cache hits, outages.
    pub redis: tollgate::redis::RedisStats,
    /// The same by Redis node (`host:port`; one for a single node).
    pub nodes: std::collections::BTreeMap<std::sync::Arc<str>, tollgate::redis::RedisStats>,
    /// Leases taken and returned, local decisions.
    pub leases: tollgate::redis::LeaseStats,
}

impl StoreStats {
    /// Adds `limiter`'s counters (none for a memory limiter).
    pub fn add(&mut self, limiter: &AnyLimiter) {
        match limiter {
            AnyLimiter::Redis(r) => self.add_redis(r.stats(), r.node_stats()),
            AnyLimiter::Leased(l) => {
                self.leases += l.stats();
                self.add_redis(l.redis_stats(), l.node_stats());
            }
            AnyLimiter::Memory(_) => {}
        }
    }

    /// Adds the counts of a limiter that is going away (a reload replaced it): kept
    /// in the totals, but never failing any more (it makes no more calls).
    pub fn retire(&mut self, limiter: &AnyLimiter) {
        self.add(limiter);
        self.retired();
    }

    /// Marks what was added as retired: counts that stay, of callers that make no
    /// more calls (so nothing of it is failing now).
    pub fn retired(&mut self) {
        self.redis.failing = false;
        self.nodes.values_mut().for_each(|s| s.failing = false);
    }

    /// Adds the counters of something that calls Redis (a limiter, a concurrency
    /// limiter): summed, and by node.
    pub fn add_redis(
        &mut self,
        sum: tollgate::redis::RedisStats,
        by_node: Vec<(std::sync::Arc<str>, tollgate::redis::RedisStats)>,
    ) {
        self.redis += sum;
        self.add_nodes(by_node);
    }

    /// Adds counters by node only (the quota buckets', which have counters of their
    /// own in the sum).
    pub fn add_nodes(&mut self, by_node: Vec<(std::sync::Arc<str>, tollgate::redis::RedisStats)>) {
        for (node, stats) in by_node {
            *self.nodes.entry(node).or_default() += stats;
        }
    }
}

/// The help of `tollgate_redis_node_events` (`serve`'s and the proxy's).
pub const NODE_EVENTS_HELP: &str = "tollgate_redis_events by Redis node (host:port; a single node's is its URL, password hidden), over every limit and the quota buckets: failing is 1 while that node fails (for a Cluster, its keys get the failure policy, the other nodes' decide as usual); decisions (calls answered), errors, fallback_decisions, outages, recoveries (deprecated here: read tollgate_redis_store_node_events_total)";

/// Sets a `node`- and `event`-labelled gauge family to each node's events
/// (`tollgate_redis_node_events`, `serve`'s and the proxy's), and its counts in
/// `counts` (`tollgate_redis_store_node_events_total`).
pub fn set_node_events(
    family: &Family<Labels, Gauge>,
    counts: &Family<Labels, Counter>,
    nodes: &std::collections::BTreeMap<std::sync::Arc<str>, tollgate::redis::RedisStats>,
) {
    for (node, stats) in nodes {
        for (event, n) in redis_events_of(stats) {
            if event == "negative_cache_hits" {
                continue; // kept per limit, not per node
            }
            let labels = vec![("node", node.to_string()), ("event", event.to_string())];
            set_both(family, counts, &labels, event, n);
        }
    }
}

/// The help of `tollgate_redis_store_events_total` (`serve`'s and the proxy's).
pub const STORE_EVENTS_HELP: &str = "The Redis store's counts of tollgate_redis_events as counters, by event: decisions, errors (incl. timeouts), fallback_decisions (failure policy), negative_cache_hits, outages, recoveries (serve: leases and quota buckets too); the states (failing, tls_insecure) stay in tollgate_redis_events";

/// The help of `tollgate_redis_store_node_events_total` (`serve`'s and the proxy's).
pub const STORE_NODE_EVENTS_HELP: &str = "The counts of tollgate_redis_node_events as counters, by Redis node and event; the state (failing) stays in tollgate_redis_node_events";

/// The Redis stores' calls (`store`: `main` or `per_second`), read from the stores
/// before each scrape and encoded as histograms of their times and batch sizes
/// (`serve`'s and the proxy's).
#[derive(Debug, Default)]
pub struct RedisCalls(std::sync::Mutex<Vec<(&'static str, tollgate::redis::CallStats)>>);

impl RedisCalls {
    /// The calls of `stores`: `(store, its call_stats())`.
    pub fn of(stores: Vec<(&'static str, tollgate::redis::CallStats)>) -> RedisCalls {
        RedisCalls(std::sync::Mutex::new(stores))
    }

    /// Replaces the calls with `stores`' as read now (before a scrape).
    pub fn set(&self, stores: Vec<(&'static str, tollgate::redis::CallStats)>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = stores;
    }
}

/// The Redis store's health and counts as `tollgate_redis_events{event}` names them
/// (`serve`'s and the proxy's).
pub fn redis_events_of(s: &tollgate::redis::RedisStats) -> [(&'static str, u64); 7] {
    [
        ("decisions", s.redis_decisions),
        ("errors", s.redis_errors),
        ("fallback_decisions", s.fallback_decisions),
        ("negative_cache_hits", s.negative_cache_hits),
        ("outages", s.outages),
        ("recoveries", s.recoveries),
        ("failing", u64::from(s.failing)),
    ]
}

/// The events that say how things stand now (1 or 0), not how many times something
/// happened: gauges only.
const STATES: [&str; 3] = ["failing", "tls_insecure", "stream_up"];

/// Sets an `event`-labelled gauge family to each `(event, value)` (`serve`'s and the
/// proxy's `tollgate_redis_events`, `serve`'s `tollgate_xds_events`), and each count
/// (every event but a state) in `counts`, the counter family to read with `rate()`
/// (`..._total`; the gauge's counts stay for what was written against them).
pub fn set_events(
    family: &Family<Labels, Gauge>,
    counts: &Family<Labels, Counter>,
    events: &[(&str, u64)],
) {
    for &(event, n) in events {
        let labels = vec![("event", event.to_string())];
        set_both(family, counts, &labels, event, n);
    }
}

/// Sets the gauge of `labels` to `n`, and the counter too unless `event` is a state.
fn set_both(
    family: &Family<Labels, Gauge>,
    counts: &Family<Labels, Counter>,
    labels: &Labels,
    event: &str,
    n: u64,
) {
    (family.get_or_create(labels)).set(i64::try_from(n).unwrap_or(i64::MAX));
    if !STATES.contains(&event) {
        // A count read from the limiters as it stands (never decreasing while they
        // live).
        (counts.get_or_create(labels))
            .inner()
            .store(n, Ordering::Relaxed);
    }
}

/// A histogram's buckets for an encoder: each bound (in units of which `per_unit`
/// make one, e.g. µs for seconds: 1e6), then +Inf, with the count in each.
pub fn buckets_of(bounds: &[u64], counts: &[u64], per_unit: f64) -> Vec<(f64, u64)> {
    // Divided, not multiplied: 250 / 1e6 prints 0.00025, 250 * 1e-6 does not.
    (bounds.iter().map(|b| *b as f64 / per_unit))
        .chain([f64::INFINITY])
        .zip(counts.iter().copied())
        .collect()
}

impl prometheus_client::collector::Collector for RedisCalls {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::NoLabelSet;
        use prometheus_client::metrics::MetricType;
        use tollgate::redis::{CallKind, BATCH_BOUNDS, CALL_BOUNDS_US};
        let stores = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if stores.is_empty() {
            return Ok(());
        }
        let mut times = encoder.encode_descriptor(
            "tollgate_redis_call_duration_seconds",
            "Time from sending a call to Redis to its answer (or error, or timeout), by store and kind (decide, lease, other)",
            None,
            MetricType::Histogram,
        )?;
        for (store, stats) in &stores {
            for kind in CallKind::ALL {
                let t = &stats.kinds[kind as usize];
                let labels = [("store", *store), ("kind", kind.name())];
                times
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(
                        t.sum_us as f64 / 1e6,
                        // What the buckets hold, so that count and buckets agree.
                        t.buckets.iter().sum(),
                        &buckets_of(&CALL_BOUNDS_US, &t.buckets, 1e6),
                        None,
                    )?;
            }
        }
        let mut errors = encoder.encode_descriptor(
            "tollgate_redis_call_errors",
            "Calls to Redis that failed (an error, or no answer within the timeout), by store and kind",
            None,
            MetricType::Counter,
        )?;
        for (store, stats) in &stores {
            for kind in CallKind::ALL {
                let labels = [("store", *store), ("kind", kind.name())];
                let n = stats.kinds[kind as usize].errors;
                (errors.encode_family(&labels)?).encode_counter::<NoLabelSet, _, u64>(&n, None)?;
            }
        }
        let mut batches = encoder.encode_descriptor(
            "tollgate_redis_batch_checks",
            "Checks each decision call to Redis carried (batching), by store",
            None,
            MetricType::Histogram,
        )?;
        for (store, stats) in &stores {
            let labels = [("store", *store)];
            batches
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(
                    stats.checks as f64,
                    stats.batches.iter().sum(),
                    &buckets_of(&BATCH_BOUNDS, &stats.batches, 1.0),
                    None,
                )?;
        }
        let mut paths = encoder.encode_descriptor(
            "tollgate_redis_decision_calls",
            "Decision calls Redis answered, by store and the code that decided them (module: the tollgate module; functions: the Functions library; eval: EVALSHA)",
            None,
            MetricType::Counter,
        )?;
        for (store, stats) in &stores {
            for (path, n) in tollgate::redis::CallStats::PATHS.iter().zip(stats.paths) {
                let labels = [("store", *store), ("path", *path)];
                (paths.encode_family(&labels)?).encode_counter::<NoLabelSet, _, u64>(&n, None)?;
            }
        }
        Ok(())
    }
}
