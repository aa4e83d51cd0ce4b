//! envoyproxy/ratelimit's metric names (`service.envoy_metrics`): its statistics, as
//! it names them in statsd (`ratelimit.service.rate_limit.DOMAIN.KEY.total_hits`,
//! `ratelimit_server.ShouldRateLimit.total_requests`, ...), made from tollgate's own
//! counters at each scrape and turned into Prometheus metrics by a statsd mapping
//! ([`StatsdMapping`]), as its Prometheus sink turns them, so that dashboards and
//! alerts written for it keep working.
//!
//! Which statistics, and when they count:
//! - per descriptor (`ratelimit.service.rate_limit.KEY.STAT`): `total_hits`,
//!   `within_limit`, `near_limit`, `over_limit`, `shadow_mode`, the same counts as
//!   `tollgate_rate_limit_hits_total`; `KEY` is envoyproxy/ratelimit's dotted key
//!   (`domain.key_value.key2`), with `:` and `|` made `_`, and the dots of an IPv4
//!   address in it too;
//! - `ratelimit.service.config_load_success` and `config_load_error`: rule loads (at
//!   start, reloads, xDS versions);
//! - `ratelimit.service.global_shadow_mode`;
//! - `ratelimit.service.call.should_rate_limit.redis_error` (a `ShouldRateLimit`
//!   answered UNAVAILABLE: the store failed) and `service_error` (any other error);
//! - `ratelimit_server.METHOD.total_requests` and `.response_time` (in whole
//!   milliseconds, as it times them) for the unary gRPC methods, `ShouldRateLimit`
//!   and `Check`.
//!
//! A counter is exported once it is above zero, as its sink exports a statistic once
//! it has moved. OpenMetrics requires a counter's samples to end in `_total`, which
//! would rename them; these keep their names and are typed `unknown` (Prometheus
//! stores them untyped; `rate()` reads them alike).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use regex::Regex;

use crate::service::calls::Method;
use crate::service::rule_stats::RuleStats;
use crate::service::statsd_mapping::{Mapped, Observer, StatKind, StatsdMapping};

/// The built-in mapping: envoyproxy/ratelimit's, used when no file is named.
pub const DEFAULT_MAPPING: &str = include_str!("../../assets/envoy-statsd-mapping.yaml");

/// The unary methods envoyproxy/ratelimit's server times, with their index in
/// [`Method::ALL`].
const TIMED: [Method; 2] = [Method::ShouldRateLimit, Method::HealthCheck];

/// envoyproxy/ratelimit's statistics over tollgate's counters.
#[derive(Debug)]
pub struct EnvoyMetrics {
    mapping: StatsdMapping,
    /// Each rule's (or value's, under `detailed_metric`) counters, by its key.
    rules: Mutex<HashMap<String, RuleStats>>,
    load_success: AtomicU64,
    load_error: AtomicU64,
    redis_error: AtomicU64,
    service_error: AtomicU64,
    /// Per [`TIMED`] method: its calls and their times.
    calls: [MethodCalls; 2],
    ipv4: Regex,
}

/// One method's calls and their times, as its mapping exports them.
#[derive(Debug)]
struct MethodCalls {
    total: AtomicU64,
    /// What `ratelimit_server.METHOD.response_time` maps to (`None`: dropped).
    time: Option<Mapped>,
    /// Observations per bucket of the mapping's histogram (not cumulative; the last
    /// one past every bound), and their count and sum in whole ms.
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_ms: AtomicU64,
}

impl EnvoyMetrics {
    /// The statistics, named through `mapping`.
    pub fn new(mapping: StatsdMapping) -> EnvoyMetrics {
        let calls = TIMED.map(|method| {
            let stat = format!("ratelimit_server.{}.response_time", method.name());
            let time = mapping.map(&stat, StatKind::Observer);
            let bounds = match &time {
                Some(Mapped {
                    observer: Observer::Histogram(b),
                    ..
                }) => b.len(),
                _ => 0,
            };
            MethodCalls {
                total: AtomicU64::new(0),
                time,
                buckets: (0..=bounds).map(|_| AtomicU64::new(0)).collect(),
                count: AtomicU64::new(0),
                sum_ms: AtomicU64::new(0),
            }
        });
        EnvoyMetrics {
            mapping,
            rules: Mutex::new(HashMap::new()),
            load_success: AtomicU64::new(0),
            load_error: AtomicU64::new(0),
            redis_error: AtomicU64::new(0),
            service_error: AtomicU64::new(0),
            calls,
            ipv4: Regex::new(r"\d+\.\d+\.\d+\.\d+").expect("a valid pattern"),
        }
    }

    /// Keeps the counters of the descriptor whose dotted key is `key`.
    pub fn rule(&self, key: &str, stats: &RuleStats) {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        if !rules.contains_key(key) {
            rules.insert(key.to_string(), stats.clone());
        }
    }

    /// Counts a rule load.
    pub fn load(&self, ok: bool) {
        let counter = if ok {
            &self.load_success
        } else {
            &self.load_error
        };
        counter.fetch_add(1, Relaxed);
    }

    /// Counts a gRPC call of `method` that ended with `code` after `seconds`.
    pub fn call(&self, method: Method, code: tonic::Code, seconds: Option<f64>) {
        if matches!(method, Method::ShouldRateLimit) && code != tonic::Code::Ok {
            let counter = match code {
                tonic::Code::Unavailable => &self.redis_error,
                _ => &self.service_error,
            };
            counter.fetch_add(1, Relaxed);
        }
        let Some(calls) = TIMED.iter().position(|m| *m as usize == method as usize) else {
            return;
        };
        let calls = &self.calls[calls];
        calls.total.fetch_add(1, Relaxed);
        let (Some(seconds), Some(time)) = (seconds, &calls.time) else {
            return;
        };
        // Whole milliseconds, as envoyproxy/ratelimit times a call.
        let ms = (seconds * 1e3) as u64;
        if let Observer::Histogram(bounds) = &time.observer {
            let value = ms as f64 * time.scale.unwrap_or(1.0);
            let i = bounds.partition_point(|b| *b < value);
            calls.buckets[i].fetch_add(1, Relaxed);
        }
        calls.count.fetch_add(1, Relaxed);
        calls.sum_ms.fetch_add(ms, Relaxed);
    }

    /// The statistics in OpenMetrics text (no `# EOF`), `global_shadow` being the
    /// global shadow mode's count.
    pub fn render(&self, global_shadow: u64) -> String {
        let mut counters: Vec<(String, u64)> = vec![
            (
                "ratelimit.service.config_load_success".into(),
                self.load_success.load(Relaxed),
            ),
            (
                "ratelimit.service.config_load_error".into(),
                self.load_error.load(Relaxed),
            ),
            ("ratelimit.service.global_shadow_mode".into(), global_shadow),
            (
                "ratelimit.service.call.should_rate_limit.redis_error".into(),
                self.redis_error.load(Relaxed),
            ),
            (
                "ratelimit.service.call.should_rate_limit.service_error".into(),
                self.service_error.load(Relaxed),
            ),
        ];
        for (method, calls) in TIMED.iter().zip(&self.calls) {
            let name = format!("ratelimit_server.{}.total_requests", method.name());
            counters.push((name, calls.total.load(Relaxed)));
        }
        let rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        for (key, stats) in rules.iter() {
            let key = self.sanitized(key);
            for (stat, value) in stats.hit_counts() {
                counters.push((format!("ratelimit.service.rate_limit.{key}.{stat}"), value));
            }
        }
        drop(rules);
        // Name -> (help, labels -> value), counters of one series added up.
        let mut families: BTreeMap<String, (Option<String>, Series)> = BTreeMap::new();
        for (stat, value) in counters.into_iter().filter(|(_, v)| *v > 0) {
            let Some(m) = self.mapping.map(&stat, StatKind::Counter) else {
                continue;
            };
            let family = families
                .entry(m.name)
                .or_insert_with(|| (m.help, BTreeMap::new()));
            *family.1.entry(m.labels).or_insert(0.0) += value as f64 * m.scale.unwrap_or(1.0);
        }
        let mut out = String::new();
        for (name, (help, series)) in &families {
            let help = help
                .as_deref()
                .unwrap_or("envoyproxy/ratelimit's statistic");
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} unknown");
            for (labels, value) in series {
                let _ = writeln!(out, "{name}{} {value}", label_text(labels, None));
            }
        }
        for calls in &self.calls {
            let (Some(time), count) = (&calls.time, calls.count.load(Relaxed)) else {
                continue;
            };
            if count > 0 {
                render_time(&mut out, time, calls, count);
            }
        }
        out
    }

    /// `key` as envoyproxy/ratelimit writes it into a statistic's name.
    fn sanitized(&self, key: &str) -> String {
        let key = key.replace([':', '|'], "_");
        self.ipv4
            .replace_all(&key, |c: &regex::Captures| c[0].replace('.', "_"))
            .into_owned()
    }
}

/// A metric's series: labels to value.
type Series = BTreeMap<Vec<(String, String)>, f64>;

/// A method's response times as the mapping says: a histogram or a summary.
fn render_time(out: &mut String, time: &Mapped, calls: &MethodCalls, count: u64) {
    let name = &time.name;
    let sum = calls.sum_ms.load(Relaxed) as f64 * time.scale.unwrap_or(1.0);
    let help = time
        .help
        .as_deref()
        .unwrap_or("envoyproxy/ratelimit's statistic");
    let labels = |le: Option<&str>| label_text(&time.labels, le);
    match &time.observer {
        Observer::Histogram(bounds) => {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            let mut cumulative = 0;
            for (i, bound) in bounds.iter().enumerate() {
                cumulative += calls.buckets[i].load(Relaxed);
                let le = format!("{bound:?}");
                let _ = writeln!(out, "{name}_bucket{} {cumulative}", labels(Some(&le)));
            }
            let _ = writeln!(out, "{name}_bucket{} {count}", labels(Some("+Inf")));
        }
        Observer::Summary => {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} summary");
        }
    }
    let _ = writeln!(
        out,
        "{name}_sum{} {sum}\n{name}_count{} {count}",
        labels(None),
        labels(None)
    );
}

/// `{k="v",...}` (with `le` last when given), or nothing without labels.
fn label_text(labels: &[(String, String)], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = (labels.iter())
        .map(|(k, v)| format!("{k}=\"{}\"", escape_value(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

fn escape_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
