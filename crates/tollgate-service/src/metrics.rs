//! Prometheus metrics (text format at `GET /metrics`).

use prometheus_client::encoding::text::encode;

use crate::calls::{CallCode, Method, HTTP_ROUTES};
use crate::envoy_metrics::EnvoyMetrics;
pub use crate::rule_stats::{Hits, RuleStats, Verdict};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tollgate_runtime::store_metrics::{
    redis_events_of, set_events, set_node_events, Labels, RedisCalls, NODE_EVENTS_HELP,
    STORE_EVENTS_HELP, STORE_NODE_EVENTS_HELP,
};

/// The service's metrics.
pub struct Metrics {
    registry: Registry,
    decisions: Family<Labels, Counter>,
    hits: Family<Labels, Counter>,
    global_shadow: Counter,
    /// Envoy's `NEAR_LIMIT_RATIO`: hits past this share of a limit are near it.
    near_limit_ratio: f32,
    latency: Histogram,
    reloads: Family<Labels, Counter>,
    /// Whether the last reload was put in force.
    last_reload_ok: Gauge,
    keys: Family<Labels, Gauge>,
    /// The Redis store's counters (monotonic sums over its limiters), by event.
    redis: Family<Labels, Gauge>,
    redis_nodes: Family<Labels, Gauge>,
    /// The counts among them, as counters (`..._total`).
    redis_counts: Family<Labels, Counter>,
    redis_node_counts: Family<Labels, Counter>,
    /// `serve`'s workers: connections, moves onto each, by worker.
    worker_connections: Family<Labels, Gauge>,
    worker_moves: Family<Labels, Gauge>,
    worker_tried: Family<Labels, Gauge>,
    worker_sent_back: Family<Labels, Gauge>,
    /// Each worker's busy share of the last balancing period.
    worker_busy: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Each RLQS quota bucket's standing, by domain, bucket and figure.
    quota: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The requests each bucket's reports to this server counted, by outcome.
    quota_reported: Family<Labels, Counter>,
    /// RLQS streams open.
    quota_streams: Gauge,
    certificate_days: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The xDS client's figures, by event.
    xds: Family<Labels, Gauge>,
    xds_counts: Family<Labels, Counter>,
    /// Calls by API, method and code.
    calls: Family<CallLabels, Counter>,
    /// Each gRPC method's series ([`Method`] order, then unknown methods), and each
    /// HTTP route's ([`HTTP_ROUTES`] order, then other paths), resolved once: a call
    /// counts with an atomic add, not a look-up by labels.
    grpc_series: Vec<MethodSeries>,
    http_series: Vec<MethodSeries>,
    /// Each rule's policies: their headline limits, and the time those refer to.
    rule_limit: Family<Labels, Gauge>,
    rule_window: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// envoyproxy/ratelimit's names too, when asked for.
    envoy: Option<EnvoyMetrics>,
    /// The Redis stores' calls, as last read.
    redis_calls: std::sync::Arc<RedisCalls>,
    /// Held by a scrape from setting its figures to encoding them.
    scraping: std::sync::Mutex<()>,
}

/// A call's API and method.
type MethodLabels = [(&'static str, &'static str); 2];

/// One API method's series: its usual codes' counters and its durations.
struct MethodSeries {
    labels: MethodLabels,
    usual: Vec<(CallCode, Counter)>,
    duration: Histogram,
}

impl MethodSeries {
    fn new(
        calls: &Family<CallLabels, Counter>,
        durations: &Family<MethodLabels, Histogram, fn() -> Histogram>,
        labels: MethodLabels,
        usual: &[CallCode],
    ) -> MethodSeries {
        MethodSeries {
            labels,
            usual: (usual.iter())
                .map(|&code| {
                    (
                        code,
                        calls.get_or_create(&(labels, [("code", code)])).clone(),
                    )
                })
                .collect(),
            duration: durations.get_or_create(&labels).clone(),
        }
    }

    fn record(&self, calls: &Family<CallLabels, Counter>, code: CallCode, seconds: Option<f64>) {
        match self.usual.iter().find(|(usual, _)| *usual == code) {
            Some((_, counter)) => counter.inc(),
            None => calls.get_or_create(&(self.labels, [("code", code)])).inc(),
        };
        if let Some(seconds) = seconds {
            self.duration.observe(seconds);
        }
    }
}
/// A call's API, method and code.
type CallLabels = (MethodLabels, [(&'static str, CallCode); 1]);

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(0.8)
    }
}

impl Metrics {
    /// The metrics, with hits past `near_limit_ratio` (0 to 1) of a limit counted as
    /// near it.
    pub fn new(near_limit_ratio: f32) -> Self {
        let calls = Family::<CallLabels, Counter>::default();
        let call_duration =
            Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-6, 2.0, 24))
            });
        let grpc_series = (Method::ALL.iter().map(|m| m.name()).chain(["unknown"]))
            .map(|method| {
                let ok = [CallCode::Grpc(tonic::Code::Ok)];
                MethodSeries::new(
                    &calls,
                    &call_duration,
                    [("api", "grpc"), ("method", method)],
                    &ok,
                )
            })
            .collect();
        let http_series = (HTTP_ROUTES.iter().copied().chain(["other"]))
            .map(|route| {
                let usual = [CallCode::Http(200), CallCode::Http(429)];
                MethodSeries::new(
                    &calls,
                    &call_duration,
                    [("api", "http"), ("method", route)],
                    &usual,
                )
            })
            .collect();
        let mut m = Metrics {
            registry: Registry::default(),
            decisions: Family::default(),
            hits: Family::default(),
            global_shadow: Counter::default(),
            near_limit_ratio,
            latency: Histogram::new(exponential_buckets(1e-6, 2.0, 20)),
            reloads: Family::default(),
            last_reload_ok: Gauge::default(),
            keys: Family::default(),
            redis: Family::default(),
            redis_nodes: Family::default(),
            redis_counts: Family::default(),
            redis_node_counts: Family::default(),
            worker_connections: Family::default(),
            worker_moves: Family::default(),
            worker_tried: Family::default(),
            worker_sent_back: Family::default(),
            worker_busy: Family::default(),
            quota: Family::default(),
            quota_reported: Family::default(),
            quota_streams: Gauge::default(),
            certificate_days: Family::default(),
            xds: Family::default(),
            xds_counts: Family::default(),
            calls,
            grpc_series,
            http_series,
            rule_limit: Family::default(),
            rule_window: Family::default(),
            envoy: None,
            redis_calls: std::sync::Arc::new(RedisCalls::default()),
            scraping: std::sync::Mutex::new(()),
        };
        m.last_reload_ok.set(1);
        // At 0 from the start, so that `increase()` sees the first failure.
        for result in ["ok", "failed"] {
            let _ = m
                .reloads
                .get_or_create(&vec![("result", result.to_string())]);
        }
        let mut root = std::mem::take(&mut m.registry);
        let registry = tollgate_runtime::process_metrics::register(&mut root, "tollgate");
        m.register_decisions(registry);
        m.register_redis_and_workers(registry);
        m.register_quota(registry);
        m.register_listeners_and_xds(registry);
        m.register_calls_and_rules(registry, &call_duration);
        root.register_collector(Box::new(m.redis_calls.clone()));
        m.registry = root;
        m
    }

    /// Decisions, their hits and time, reloads and the counters held.
    fn register_decisions(&self, registry: &mut Registry) {
        registry.register(
            "decisions",
            "Decisions by domain, rule (descriptor path) and outcome",
            self.decisions.clone(),
        );
        registry.register(
            "rate_limit_hits",
            "Hits by domain, rule and stat, as envoyproxy/ratelimit's per-descriptor statistics: total_hits, within_limit, near_limit (admitted past the near-limit ratio), over_limit, shadow_mode (over the limit, admitted by shadow mode)",
            self.hits.clone(),
        );
        registry.register(
            "global_shadow_mode",
            "Requests over the limit answered OK by the global shadow mode",
            self.global_shadow.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time to decide one request (all its descriptors)",
            self.latency.clone(),
        );
        registry.register(
            "config_reloads",
            "Rule reloads by result (ok, failed)",
            self.reloads.clone(),
        );
        registry.register(
            "config_last_reload_successful",
            "1 while the last rule reload was put in force (or none was tried), 0 after one was rejected",
            self.last_reload_ok.clone(),
        );
        registry.register(
            "keys",
            "Counters held, by domain and rule",
            self.keys.clone(),
        );
    }

    /// The Redis store's events, overall and by node, and `serve`'s workers.
    fn register_redis_and_workers(&self, registry: &mut Registry) {
        registry.register(
            "redis_events",
            "Redis store events: failing is 1 while Redis fails; tls_insecure is 1 when a Redis connection skips certificate checks (an insecure_* switch); since start (deprecated here: read tollgate_redis_store_events_total): decisions, errors (incl. timeouts), fallback_decisions (failure policy), negative_cache_hits, outages, recoveries, quota_store_errors (RLQS bucket changes that failed), quota_late_assignments (RLQS assignments not sent: decided too long ago), and the lease counts",
            self.redis.clone(),
        );
        registry.register(
            "redis_store_events",
            STORE_EVENTS_HELP,
            self.redis_counts.clone(),
        );
        registry.register(
            "redis_node_events",
            NODE_EVENTS_HELP,
            self.redis_nodes.clone(),
        );
        let node_counts = self.redis_node_counts.clone();
        registry.register(
            "redis_store_node_events",
            STORE_NODE_EVENTS_HELP,
            node_counts,
        );
        registry.register(
            "worker_connections",
            "Connections each serve worker holds now",
            self.worker_connections.clone(),
        );
        registry.register(
            "worker_moves_in",
            "Connections moved onto each worker since start (listen.balance: pack)",
            self.worker_moves.clone(),
        );
        registry.register(
            "worker_spreads_tried",
            "Spreads that woke each worker on trial since start (listen.balance: pack)",
            self.worker_tried.clone(),
        );
        registry.register(
            "worker_spreads_sent_back",
            "Spreads that woke each worker and went back since start, its cores taken (listen.balance: pack)",
            self.worker_sent_back.clone(),
        );
        registry.register(
            "worker_busy_ratio",
            "Each worker's busy share of the last 100 ms",
            self.worker_busy.clone(),
        );
    }

    /// The RLQS quota buckets and streams.
    fn register_quota(&self, registry: &mut Registry) {
        registry.register(
            "quota_bucket",
            "Each RLQS quota bucket: clients (Envoys reporting or holding a share), \
             demand_per_second, assigned_per_second and reserved_per_second (of every \
             server sharing it); for a blanket rule's bucket, streams (this server's \
             streams reporting on it)",
            self.quota.clone(),
        );
        registry.register(
            "quota_reported_requests",
            "Requests the reports on each RLQS quota bucket to this server counted, by \
             outcome (allowed, denied), since the bucket was made here",
            self.quota_reported.clone(),
        );
        registry.register(
            "quota_streams",
            "RLQS streams open",
            self.quota_streams.clone(),
        );
    }

    /// The listeners' certificates and the xDS client.
    fn register_listeners_and_xds(&self, registry: &mut Registry) {
        registry.register(
            "tls_certificate_expiry_days",
            "Days until each TLS listener's certificate expires (negative once it has), by listener",
            self.certificate_days.clone(),
        );
        registry.register(
            "xds_events",
            "The xDS client (rules from an xDS server), by event: stream_up is 1 while \
             its stream is open; streams_opened, versions_acked and versions_nacked count \
             since start (deprecated here: read tollgate_xds_stream_events_total)",
            self.xds.clone(),
        );
        registry.register(
            "xds_stream_events",
            "The xDS client's counts, by event: streams_opened, versions_acked, versions_nacked",
            self.xds_counts.clone(),
        );
    }

    /// Calls by API, method and code, and each rule's limits.
    fn register_calls_and_rules(
        &self,
        registry: &mut Registry,
        call_duration: &Family<MethodLabels, Histogram, fn() -> Histogram>,
    ) {
        registry.register(
            "requests",
            "Calls answered, by API (grpc, http), method (the gRPC method's name, the \
             HTTP route) and code (the gRPC status's name, the HTTP status)",
            self.calls.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from a call's request to its answer, by API and method (RLQS streams, \
             which last as long as their Envoy, are not timed)",
            call_duration.clone(),
        );
        registry.register(
            "rule_limit",
            "Each rule's limit (per policy: the headline limit of its spec), by domain, \
             rule and policy; divide by tollgate_rule_window_seconds for a rate",
            self.rule_limit.clone(),
        );
        registry.register(
            "rule_window_seconds",
            "The time each rule's limit refers to: the window, or how long an empty \
             bucket takes to refill",
            self.rule_window.clone(),
        );
    }
}

impl Metrics {
    /// Exports what `collector` reads beside these.
    pub fn add_collector(&mut self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry.register_collector(collector);
    }

    /// Exports envoyproxy/ratelimit's names beside these (see [`EnvoyMetrics`]).
    pub fn set_envoy(&mut self, envoy: EnvoyMetrics) {
        self.envoy = Some(envoy);
    }

    /// The counters of a rule (or of one value of it), made on first use: the same
    /// labels always give the same counters, so a reloaded rule counts on.
    /// `envoy_key` is its name in envoyproxy/ratelimit's statistics.
    pub fn rule_stats(&self, domain: &str, rule: &str, envoy_key: &str) -> RuleStats {
        let stats = self.new_rule_stats(domain, rule);
        if let Some(envoy) = &self.envoy {
            envoy.rule(envoy_key, rule, &stats);
        }
        stats
    }

    fn new_rule_stats(&self, domain: &str, rule: &str) -> RuleStats {
        let counter = |family: &Family<Labels, Counter>, label: &'static str, value: &str| {
            family
                .get_or_create(&vec![
                    ("domain", domain.to_string()),
                    ("rule", rule.to_string()),
                    (label, value.to_string()),
                ])
                .clone()
        };
        let hits = |stat| counter(&self.hits, "stat", stat);
        RuleStats {
            decisions: ["allowed", "rejected", "shadow_rejected"]
                .map(|outcome| counter(&self.decisions, "outcome", outcome)),
            total_hits: hits("total_hits"),
            over_limit: hits("over_limit"),
            near_limit: hits("near_limit"),
            within_limit: hits("within_limit"),
            shadow_mode: hits("shadow_mode"),
        }
    }

    /// Counts one descriptor's decision on its rule's counters (see
    /// [`RuleStats::count`]).
    pub fn count(&self, stats: &RuleStats, h: Hits) {
        stats.count(h, self.near_limit_ratio);
    }

    /// Counts a request the global shadow mode answered OK.
    pub fn global_shadow_mode(&self) {
        self.global_shadow.inc();
    }

    /// Counts a gRPC call of `method` (`None`: one this server does not serve)
    /// answered with `code`, and its duration when it has one.
    pub fn grpc_call(&self, method: Option<Method>, code: CallCode, seconds: Option<f64>) {
        let i = method.map_or(self.grpc_series.len() - 1, |m| m as usize);
        self.grpc_series[i].record(&self.calls, code, seconds);
        if let (Some(envoy), Some(method), CallCode::Grpc(code)) = (&self.envoy, method, code) {
            envoy.call(method, code, seconds);
        }
    }

    /// Counts an HTTP call of the route at `route` in [`HTTP_ROUTES`] (`None`: a path no
    /// route matches) answered with `status`, and its duration.
    pub fn http_call(&self, route: Option<usize>, status: u16, seconds: f64) {
        let i = route.map_or(self.http_series.len() - 1, |r| {
            r.min(self.http_series.len() - 1)
        });
        self.http_series[i].record(&self.calls, CallCode::Http(status), Some(seconds));
    }

    /// Taken for one scrape, from setting the figures read at scrape time to encoding
    /// them: scrapes run one at a time.
    pub fn scrape(&self) -> std::sync::MutexGuard<'_, ()> {
        self.scraping.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the rules' limits: `(domain, rule, policies)` for each rule in force (the
    /// rules gone are dropped).
    pub fn rule_limits<'a>(
        &self,
        rules: impl IntoIterator<Item = (&'a str, &'a str, &'a [tollgate::Policy])>,
    ) {
        self.rule_limit.clear();
        self.rule_window.clear();
        for (domain, rule, policies) in rules {
            for policy in policies {
                let labels = vec![
                    ("domain", domain.to_string()),
                    ("rule", rule.to_string()),
                    ("policy", policy.to_string()),
                ];
                (self.rule_limit.get_or_create(&labels))
                    .set(i64::try_from(policy.limit()).unwrap_or(i64::MAX));
                (self.rule_window.get_or_create(&labels)).set(policy.window_us() as f64 / 1e6);
            }
        }
    }

    /// Records how long a request took to decide.
    pub fn latency(&self, seconds: f64) {
        self.latency.observe(seconds);
    }

    /// Counts a reload.
    pub fn reload(&self, ok: bool) {
        if let Some(envoy) = &self.envoy {
            envoy.load(ok);
        }
        self.last_reload_ok.set(i64::from(ok));
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

    /// Sets the Redis store's counters, and whether a connection to it skips
    /// certificate checks.
    pub fn redis(&self, s: &tollgate::redis::RedisStats, tls_insecure: bool) {
        self.redis_events(&redis_events_of(s));
        self.redis_events(&[("tls_insecure", u64::from(tls_insecure))]);
    }

    /// Sets the Redis store's counters by node.
    pub fn redis_nodes(
        &self,
        nodes: &std::collections::BTreeMap<std::sync::Arc<str>, tollgate::redis::RedisStats>,
    ) {
        set_node_events(&self.redis_nodes, &self.redis_node_counts, nodes);
    }

    /// Sets the Redis stores' calls: `(store, its call_stats())`.
    pub fn redis_calls(&self, stores: Vec<(&'static str, tollgate::redis::CallStats)>) {
        self.redis_calls.set(stores);
    }

    /// Sets the days left of `listener`'s certificate.
    pub fn certificate_days_left(&self, listener: &str, days: f64) {
        (self
            .certificate_days
            .get_or_create(&vec![("listener", listener.to_string())]))
        .set(days);
    }

    /// Sets the xDS client's figures: (event, value) pairs.
    pub fn xds(&self, events: &[(&str, u64)]) {
        set_events(&self.xds, &self.xds_counts, events);
    }

    /// Sets the workers' figures.
    pub fn workers(&self, stats: &[tollgate_runtime::workers::WorkerStat]) {
        for (i, w) in stats.iter().enumerate() {
            let label = vec![("worker", i.to_string())];
            (self.worker_connections.get_or_create(&label))
                .set(i64::try_from(w.connections).unwrap_or(i64::MAX));
            (self.worker_moves.get_or_create(&label))
                .set(i64::try_from(w.moved_in).unwrap_or(i64::MAX));
            (self.worker_tried.get_or_create(&label))
                .set(i64::try_from(w.tried).unwrap_or(i64::MAX));
            (self.worker_sent_back.get_or_create(&label))
                .set(i64::try_from(w.sent_back).unwrap_or(i64::MAX));
            self.worker_busy.get_or_create(&label).set(w.busy);
        }
    }

    /// Sets the RLQS figures: every bucket's (buckets gone are dropped) and the
    /// streams open. Each bucket is `(domain, bucket id, its named count (clients or
    /// streams), its named rates, the requests its reports counted: allowed, denied)`.
    pub fn quota<'a>(
        &self,
        buckets: impl IntoIterator<
            Item = (
                &'a str,
                &'a str,
                (&'static str, u64),
                &'a [(&'static str, f64)],
                [u64; 2],
            ),
        >,
        streams: usize,
    ) {
        self.quota.clear();
        self.quota_reported.clear();
        for (domain, bucket, (counted, count), rates, reported) in buckets {
            let labels = |name: &'static str, value: &str| {
                vec![
                    ("domain", domain.to_string()),
                    ("bucket", bucket.to_string()),
                    (name, value.to_string()),
                ]
            };
            let figures = std::iter::once((counted, count as f64)).chain(rates.iter().copied());
            for (figure, value) in figures {
                self.quota
                    .get_or_create(&labels("figure", figure))
                    .set(value);
            }
            for (outcome, n) in ["allowed", "denied"].into_iter().zip(reported) {
                self.quota_reported
                    .get_or_create(&labels("outcome", outcome))
                    .inc_by(n);
            }
        }
        self.quota_streams
            .set(i64::try_from(streams).unwrap_or(i64::MAX));
    }

    /// The quota buckets' store troubles, as more `redis_events`.
    pub fn quota_events(&self, events: &[(&'static str, u64)]) {
        self.redis_events(events);
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
        set_events(&self.redis, &self.redis_counts, events);
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        if let Some(envoy) = &self.envoy {
            // Before the end marker.
            let end = out.rfind("# EOF").unwrap_or(out.len());
            out.insert_str(end, &envoy.render(self.global_shadow.get()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule_stats::near_limit_hits;

    fn admitted(hits: u64, limit: u64, remaining: u64) -> Hits {
        Hits {
            hits,
            verdict: Verdict::Allowed,
            limit,
            remaining,
        }
    }

    #[test]
    fn each_grpc_method_indexes_its_own_series() {
        for (i, method) in Method::ALL.iter().enumerate() {
            assert_eq!(*method as usize, i);
        }
        let m = Metrics::new(0.8);
        m.grpc_call(
            Some(Method::HealthCheck),
            CallCode::Grpc(tonic::Code::Ok),
            Some(0.001),
        );
        m.grpc_call(
            None,
            CallCode::Grpc(tonic::Code::Unimplemented),
            Some(0.001),
        );
        let text = m.render();
        for line in [
            r#"tollgate_requests_total{api="grpc",method="Check",code="OK"} 1"#,
            r#"tollgate_requests_total{api="grpc",method="ShouldRateLimit",code="OK"} 0"#,
            r#"tollgate_requests_total{api="grpc",method="unknown",code="Unimplemented"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn near_limit_hits_are_those_past_the_threshold() {
        // limit 5, ratio 0.8: the threshold is 4, so the 5th hit is near the limit.
        assert_eq!(near_limit_hits(admitted(1, 5, 1), 0.8), 0);
        assert_eq!(near_limit_hits(admitted(1, 5, 0), 0.8), 1);
        // 3 hits taking the count from 2 to 5: the 5th only (the 4th is at the threshold).
        assert_eq!(near_limit_hits(admitted(3, 5, 0), 0.8), 1);
        // limit 10: threshold 8; 4 hits from 5 to 9: the 9th.
        assert_eq!(near_limit_hits(admitted(4, 10, 1), 0.8), 1);
        assert_eq!(near_limit_hits(admitted(0, 10, 0), 0.8), 0);
        assert_eq!(near_limit_hits(admitted(2, 10, 0), 0.5), 2);
    }

    #[test]
    fn hits_are_counted_by_stat_and_rejected_hits_are_all_over_the_limit() {
        let m = Metrics::new(0.8);
        let stats = m.rule_stats("d", "d/k", "d.k");
        m.count(&stats, admitted(4, 5, 1));
        m.count(&stats, admitted(1, 5, 0));
        m.count(
            &stats,
            Hits {
                hits: 2,
                verdict: Verdict::Rejected,
                limit: 5,
                remaining: 0,
            },
        );
        m.count(
            &stats,
            Hits {
                hits: 3,
                verdict: Verdict::ShadowRejected,
                limit: 5,
                remaining: 0,
            },
        );
        let text = m.render();
        let value = |stat: &str| {
            let prefix = format!(
                "tollgate_rate_limit_hits_total{{domain=\"d\",rule=\"d/k\",stat=\"{stat}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or_else(|| panic!("{stat} in {text}"))
                .to_string()
        };
        assert_eq!(value("total_hits"), "10");
        assert_eq!(value("within_limit"), "5");
        assert_eq!(value("near_limit"), "1");
        assert_eq!(value("over_limit"), "5");
        assert_eq!(value("shadow_mode"), "3");
    }
}
