//! The proxy's metrics (`proxy.metrics: ADDR`, `GET /metrics`, Prometheus text): each
//! route's adaptive limit, and what its `cost:` charged, read at scrape time; the
//! build and the process ([`tollgate_runtime::process_metrics`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::routes::RouteTable;
use tollgate_runtime::store_metrics::{
    redis_events_of, set_events, set_node_events, RedisCalls, NODE_EVENTS_HELP, STORE_EVENTS_HELP,
    STORE_NODE_EVENTS_HELP,
};
use tollgate_runtime::tls_refusals::RefusalMetrics;

type Labels = Vec<(&'static str, String)>;

/// What the proxy's metrics say besides its routes: its listeners' certificates and
/// its Redis store's calls.
pub(super) struct About {
    /// The TLS listeners, by name (`proxy`, `metrics`).
    pub listeners: Vec<(&'static str, tollgate_runtime::tls::ServerTls)>,
    /// The Redis store the routes count in, if any.
    pub redis: Option<tollgate::redis::RedisStore>,
    /// The configuration's reloads.
    pub reloads: Arc<Reloads>,
}

impl About {
    /// The listeners' TLS by name (those without TLS are left out), the Redis store,
    /// the reloads.
    pub fn new(
        listeners: [(&'static str, Option<tollgate_runtime::tls::ServerTls>); 2],
        redis: Option<&tollgate::redis::RedisStore>,
        reloads: Arc<Reloads>,
    ) -> About {
        About {
            listeners: (listeners.into_iter())
                .filter_map(|(name, tls)| Some((name, tls?)))
                .collect(),
            redis: redis.cloned(),
            reloads,
        }
    }
}

/// The configuration's reloads (SIGHUP or a changed file), counted by the thread that
/// reloads and read at each scrape.
#[derive(Debug)]
pub(super) struct Reloads {
    ok: AtomicU64,
    failed: AtomicU64,
    /// Whether the last one was put in force (true until one fails).
    last_ok: AtomicBool,
}

impl Default for Reloads {
    fn default() -> Self {
        Reloads {
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            last_ok: AtomicBool::new(true),
        }
    }
}

impl Reloads {
    /// Counts a reload: put in force (`ok`) or rejected.
    pub fn count(&self, ok: bool) {
        let n = if ok { &self.ok } else { &self.failed };
        n.fetch_add(1, Relaxed);
        self.last_ok.store(ok, Relaxed);
    }
}

/// The metrics text for the routes in `table`.
pub(super) fn render(table: &RouteTable, about: &About) -> String {
    let mut root = Registry::default();
    let upstream_times = (table.routes().iter())
        .map(|route| (route.name.clone(), route.stats.upstream_times()))
        .collect();
    root.register_collector(Box::new(UpstreamTimes(upstream_times)));
    if let Some(store) = &about.redis {
        register_redis(&mut root, table, store);
    }
    let registry = register_listeners(&mut root, about);
    RouteFamilies::of(table).register(registry);
    AdaptiveFamilies::of(table).register(registry);
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &root);
    out
}

type Gauges = Family<Labels, Gauge>;
type Counters = Family<Labels, Counter>;
type F64Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

/// The Redis store's calls and events, summed over the routes in force.
fn register_redis(root: &mut Registry, table: &RouteTable, store: &tollgate::redis::RedisStore) {
    let calls = RedisCalls::of(vec![("main", store.call_stats())]);
    root.register_collector(Box::new(calls));
    let mut stats = table.retired.clone();
    for route in table.routes() {
        route.limits.add_redis_stats(&mut stats);
    }
    let (events, counts) = (Gauges::default(), Counters::default());
    set_events(&events, &counts, &redis_events_of(&stats.redis));
    root.register(
        "tollgate_redis_events",
        "The Redis store's events, summed over the routes in force: failing is 1 while Redis fails; decisions, errors (incl. timeouts), fallback_decisions (failure policy), negative_cache_hits, outages, recoveries since they were made (deprecated here: read tollgate_redis_store_events_total)",
        events,
    );
    root.register("tollgate_redis_store_events", STORE_EVENTS_HELP, counts);
    let (nodes, node_counts) = (Gauges::default(), Counters::default());
    set_node_events(&nodes, &node_counts, &stats.nodes);
    root.register("tollgate_redis_node_events", NODE_EVENTS_HELP, nodes);
    let help = STORE_NODE_EVENTS_HELP;
    root.register("tollgate_redis_store_node_events", help, node_counts);
}

/// The listeners' certificates and refused handshakes, and the configuration's reloads.
/// Returns the registry of the proxy's own families (`tollgate_proxy_*`).
fn register_listeners<'r>(root: &'r mut Registry, about: &About) -> &'r mut Registry {
    let refusals = (about.listeners.iter()).map(|(name, tls)| (*name, tls.refusals()));
    let family = RefusalMetrics::new("tollgate_proxy", refusals.collect());
    root.register_collector(Box::new(family));
    let registry = tollgate_runtime::process_metrics::register(root, "tollgate_proxy");
    let days = F64Gauges::default();
    for (listener, tls) in &about.listeners {
        let labels = vec![("listener", listener.to_string())];
        days.get_or_create(&labels)
            .set(tollgate_runtime::tls::days_left(tls.not_after()));
    }
    registry.register(
        "tls_certificate_expiry_days",
        "Days until each TLS listener's certificate expires (negative once it has), by listener",
        days,
    );
    let reloads = Counters::default();
    for (result, n) in [("ok", &about.reloads.ok), ("failed", &about.reloads.failed)] {
        let labels = vec![("result", result.to_string())];
        reloads.get_or_create(&labels).inc_by(n.load(Relaxed));
    }
    registry.register(
        "config_reloads",
        "Configuration reloads (SIGHUP or a changed file), by result (ok, failed)",
        reloads,
    );
    let last_ok = Gauge::<i64>::default();
    last_ok.set(i64::from(about.reloads.last_ok.load(Relaxed)));
    registry.register(
        "config_last_reload_successful",
        "1 while the last configuration reload was put in force (or none was tried), 0 after one was rejected",
        last_ok,
    );
    registry
}

/// Each route's answers and, under `cost:`, its usage.
#[derive(Default)]
struct RouteFamilies {
    requests: Counters,
    used: Counters,
    responses: Counters,
}

impl RouteFamilies {
    fn of(table: &RouteTable) -> Self {
        let f = RouteFamilies::default();
        for route in table.routes() {
            // The usual answers are there from the start at 0, so that a share of them
            // (429s among all) has a series before the first one.
            for code in [200, 429, 503] {
                let labels = vec![("route", route.name.clone()), ("code", code.to_string())];
                let _ = f.requests.get_or_create(&labels);
            }
            for (code, n) in route.stats.codes() {
                let labels = vec![("route", route.name.clone()), ("code", code.to_string())];
                f.requests.get_or_create(&labels).inc_by(n);
            }
            if let Some(cost) = &route.limits.cost {
                let r = vec![("route", route.name.clone())];
                f.used.get_or_create(&r).inc_by(cost.used.load(Relaxed));
                for (outcome, n) in super::cost::OUTCOMES.iter().zip(&cost.outcomes) {
                    let mut l = r.clone();
                    l.push(("outcome", outcome.to_string()));
                    f.responses.get_or_create(&l).inc_by(n.load(Relaxed));
                }
            }
        }
        f
    }

    fn register(self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Requests a route matched, by the status answered (the upstream's, or the proxy's own: 429 and 503 from the route's limits, 502 and 504 for the upstream)",
            self.requests,
        );
        registry.register(
            "cost_usage_units",
            "Units the requests of cost: routes used: the usage reported, or what the request reserved (max-debt may forgive part of a charge)",
            self.used,
        );
        registry.register(
            "cost_responses",
            "Responses under cost:, by how their usage was found (missing and invalid are charged what the request reserved)",
            self.responses,
        );
    }
}

/// The adaptive limits of the routes that have one.
#[derive(Default)]
struct AdaptiveFamilies {
    limit: Gauges,
    in_flight: Gauges,
    queued: Gauges,
    baseline: F64Gauges,
    latency: F64Gauges,
    delay: F64Gauges,
    admitted: Counters,
    shed: Counters,
    shed_by_priority: Counters,
}

impl AdaptiveFamilies {
    fn of(table: &RouteTable) -> Self {
        let f = AdaptiveFamilies::default();
        for route in table.routes() {
            let Some(adaptive) = &route.adaptive else {
                continue;
            };
            let s = adaptive.stats();
            let r = || vec![("route", route.name.clone())];
            let with = |k: &'static str, v: &str| {
                let mut l = r();
                l.push((k, v.to_string()));
                l
            };
            f.limit.get_or_create(&r()).set(i64::from(s.limit));
            f.in_flight.get_or_create(&r()).set(i64::from(s.in_flight));
            f.queued.get_or_create(&r()).set(i64::from(s.queued));
            let seconds = |us: Option<u64>| us.map_or(f64::NAN, |us| us as f64 / 1e6);
            f.baseline.get_or_create(&r()).set(seconds(s.baseline_us));
            f.latency.get_or_create(&r()).set(seconds(s.last_mean_us));
            f.delay.get_or_create(&r()).set(seconds(s.queue_delay_us));
            f.admitted.get_or_create(&r()).inc_by(s.admitted);
            let reasons = [
                ("busy", s.shed.busy),
                ("queue_full", s.shed.queue_full),
                ("queue_delay", s.shed.queue_delay),
                ("max_wait", s.shed.max_wait),
                ("outranked", s.shed.outranked),
            ];
            for (reason, n) in reasons {
                f.shed.get_or_create(&with("reason", reason)).inc_by(n);
            }
            for (class, n) in ["sheddable", "normal", "critical"]
                .iter()
                .zip(s.shed_by_class)
            {
                (f.shed_by_priority.get_or_create(&with("priority", class))).inc_by(n);
            }
        }
        f
    }

    fn register(self, registry: &mut Registry) {
        registry.register(
            "adaptive_limit",
            "The route's adaptive concurrency limit now",
            self.limit,
        );
        registry.register(
            "adaptive_in_flight",
            "Requests holding a permit now",
            self.in_flight,
        );
        registry.register(
            "adaptive_queued",
            "Requests waiting for a permit now",
            self.queued,
        );
        registry.register(
            "adaptive_baseline_seconds",
            "The unloaded latency the limit is measured against",
            self.baseline,
        );
        registry.register(
            "adaptive_latency_seconds",
            "The trimmed mean latency of the last window",
            self.latency,
        );
        registry.register(
            "adaptive_queue_delay_seconds",
            "The queueing-delay target now",
            self.delay,
        );
        registry.register(
            "adaptive_admitted",
            "Requests granted a permit",
            self.admitted,
        );
        registry.register("adaptive_shed", "Requests shed, by reason", self.shed);
        registry.register(
            "adaptive_shed_by_priority",
            "Requests shed, by priority class",
            self.shed_by_priority,
        );
    }
}

/// Each route's upstream times: `tollgate_proxy_upstream_duration_seconds{route}`.
struct UpstreamTimes(Vec<(String, (u64, Vec<u64>))>);

impl std::fmt::Debug for UpstreamTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UpstreamTimes({} routes)", self.0.len())
    }
}

impl prometheus_client::collector::Collector for UpstreamTimes {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use super::route_stats::UPSTREAM_BOUNDS_US;
        use prometheus_client::encoding::NoLabelSet;
        use tollgate_runtime::store_metrics::buckets_of;
        let mut times = encoder.encode_descriptor(
            "tollgate_proxy_upstream_duration_seconds",
            "Time from sending a request upstream to its response head (or the proxy's 502 or 504), by route",
            None,
            prometheus_client::metrics::MetricType::Histogram,
        )?;
        for (route, (sum_us, counts)) in &self.0 {
            let buckets = buckets_of(&UPSTREAM_BOUNDS_US, counts, 1e6);
            times
                .encode_family(&[("route", route.as_str())])?
                .encode_histogram::<NoLabelSet>(
                    *sum_us as f64 / 1e6,
                    counts.iter().sum(),
                    &buckets,
                    None,
                )?;
        }
        Ok(())
    }
}

/// Serves `GET /metrics` on `listener` until the process ends.
pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    table: Arc<ArcSwap<RouteTable>>,
    slots: tollgate_runtime::connections::Slots,
    tls: Option<tollgate_runtime::tls::ServerTls>,
    about: Arc<About>,
    console: Option<axum::Router>,
) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let (table, about) = (table.clone(), about.clone());
            async move {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    render(&table.load(), &about),
                )
            }
        }),
    );
    let app = match console {
        Some(c) => app.merge(c),
        None => app,
    };
    let body = tollgate_runtime::connections::BodyTimeout::Whole(std::time::Duration::from_micros(
        slots.bounds().body_timeout,
    ));
    let stop = tollgate_runtime::lifecycle::shutdown_signal();
    tollgate_runtime::connections::serve_http(listener, slots, app, body, stop, None, tls).await;
}
