//! Prometheus metrics (text format at `GET /metrics`).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

/// The service's metrics.
pub struct Metrics {
    registry: Registry,
    decisions: Family<Labels, Counter>,
    /// The decision counters of each rule (domain, rule), so that counting a decision
    /// allocates nothing once a rule has been seen.
    /// (A rule's path starts with its domain, so the path alone is the key.)
    by_rule: std::sync::RwLock<std::collections::HashMap<String, [Counter; 3]>>,
    latency: Histogram,
    reloads: Family<Labels, Counter>,
    keys: Family<Labels, Gauge>,
    /// The Redis store's counters (monotonic sums over its limiters), by event.
    redis: Family<Labels, Gauge>,
}

/// A decision's outcome, as counted.
#[derive(Debug, Clone, Copy)]
#[repr(usize)]
pub enum Verdict {
    /// Admitted.
    Allowed,
    /// Rejected.
    Rejected,
    /// Rejected by a rule in shadow mode, so admitted.
    ShadowRejected,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("tollgate");
        let decisions = Family::<Labels, Counter>::default();
        registry.register(
            "decisions",
            "Decisions by domain, rule (descriptor path) and outcome",
            decisions.clone(),
        );
        let latency = Histogram::new(exponential_buckets(1e-6, 2.0, 20));
        registry.register(
            "decision_duration_seconds",
            "Time to decide one request (all its descriptors)",
            latency.clone(),
        );
        let reloads = Family::<Labels, Counter>::default();
        registry.register(
            "config_reloads",
            "Rule reloads by result (ok, failed)",
            reloads.clone(),
        );
        let keys = Family::<Labels, Gauge>::default();
        registry.register("keys", "Counters held, by domain and rule", keys.clone());
        let redis = Family::<Labels, Gauge>::default();
        registry.register(
            "redis_events",
            "Redis store events since start: decisions, errors (incl. timeouts), fallback_decisions (failure policy), negative_cache_hits, outages, recoveries; failing is 1 while Redis fails",
            redis.clone(),
        );
        Metrics {
            redis,
            registry,
            decisions,
            by_rule: Default::default(),
            latency,
            reloads,
            keys,
        }
    }
}

impl Metrics {
    /// Counts one descriptor's decision.
    pub fn decision(&self, domain: &str, rule: &str, outcome: Verdict) {
        let i = outcome as usize;
        if let Some(counters) = self
            .by_rule
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(rule)
        {
            counters[i].inc();
            return;
        }
        let counters = ["allowed", "rejected", "shadow_rejected"].map(|outcome| {
            self.decisions
                .get_or_create(&vec![
                    ("domain", domain.to_string()),
                    ("rule", rule.to_string()),
                    ("outcome", outcome.to_string()),
                ])
                .clone()
        });
        counters[i].inc();
        self.by_rule
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(rule.to_string(), counters);
    }

    /// Records how long a request took to decide.
    pub fn latency(&self, seconds: f64) {
        self.latency.observe(seconds);
    }

    /// Counts a reload.
    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.reloads
            .get_or_create(&vec![("result", result.to_string())])
            .inc();
    }

    /// Sets the number of counters a rule holds.
    pub fn keys(&self, domain: &str, rule: &str, n: usize) {
        self.keys
            .get_or_create(&vec![
                ("domain", domain.to_string()),
                ("rule", rule.to_string()),
            ])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets the Redis store's counters.
    pub fn redis(&self, s: &tollgate::redis::RedisStats) {
        let events = [
            ("decisions", s.redis_decisions),
            ("errors", s.redis_errors),
            ("fallback_decisions", s.fallback_decisions),
            ("negative_cache_hits", s.negative_cache_hits),
            ("outages", s.outages),
            ("recoveries", s.recoveries),
            ("failing", u64::from(s.failing)),
        ];
        self.redis_events(&events);
    }

    /// Lease counters of the leased limiters, as more `redis_events`.
    pub fn leases(&self, s: &tollgate::redis::LeaseStats) {
        let events = [
            ("leases_taken", s.leases_taken),
            ("lease_units_taken", s.units_taken),
            ("leases_returned", s.leases_returned),
            ("lease_units_unspent", s.units_returned),
            ("leases_expired", s.leases_expired),
            ("lease_local_decisions", s.local_decisions),
        ];
        self.redis_events(&events);
    }

    /// Sets `redis_events` for each `(event, count)`.
    fn redis_events(&self, events: &[(&str, u64)]) {
        for &(event, n) in events {
            self.redis
                .get_or_create(&vec![("event", event.to_string())])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
