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

use crate::calls::Method;
use crate::rule_stats::RuleStats;
use crate::statsd_mapping::{Mapped, Observer, StatKind, StatsdMapping};

/// The built-in mapping: envoyproxy/ratelimit's, used when no file is named.
pub const DEFAULT_MAPPING: &str = include_str!("../assets/envoy-statsd-mapping.yaml");

/// The built-in mapping, its response time in milliseconds when `response_time_ms`
/// (envoyproxy/ratelimit's `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` drops the
/// mapping's `scale` the same way).
pub fn default_mapping(response_time_ms: bool) -> StatsdMapping {
    let text = if response_time_ms {
        DEFAULT_MAPPING.replace("    scale: 0.001\n", "")
    } else {
        DEFAULT_MAPPING.to_string()
    };
    StatsdMapping::parse(&text).expect("the built-in mapping parses")
}

/// The unary methods envoyproxy/ratelimit's server times (and [`EnvoyMetrics`]'
/// `calls` in this order).
const TIMED: [Method; 2] = [Method::ShouldRateLimit, Method::HealthCheck];

/// envoyproxy/ratelimit's statistics over tollgate's counters.
#[derive(Debug)]
pub struct EnvoyMetrics {
    mapping: StatsdMapping,
    /// Each rule's (or value's, under `detailed_metric`) counters, by its key and
    /// tollgate's name for it (two rules may share a key: their hits add up).
    rules: Mutex<HashMap<(String, String), RuleStats>>,
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
    /// one past every bound; a summary's only one), and their sum in whole ms.
    buckets: Vec<AtomicU64>,
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
            ipv4: Regex::new(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")
                .expect("a valid pattern"),
        }
    }

    /// Keeps the counters of the rule `rule` (tollgate's path) whose dotted key is
    /// `key`.
    pub fn rule(&self, key: &str, rule: &str, stats: &RuleStats) {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        (rules.entry((key.to_string(), rule.to_string()))).or_insert_with(|| stats.clone());
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
        // A client that gave up (Envoy's timeout) is not an error of the service:
        // envoyproxy/ratelimit's handler runs on and counts none.
        let failed = !matches!(code, tonic::Code::Ok | tonic::Code::Cancelled);
        if matches!(method, Method::ShouldRateLimit) && failed {
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
        // A summary has one bucket: its count.
        let i = match &time.observer {
            Observer::Histogram(bounds) => {
                let value = ms as f64 * time.scale.unwrap_or(1.0);
                bounds.partition_point(|b| *b < value)
            }
            Observer::Summary => 0,
        };
        calls.buckets[i].fetch_add(1, Relaxed);
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
        for ((key, _), stats) in rules.iter() {
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
            write_header(&mut out, name, help.as_deref(), "unknown");
            for (labels, value) in series {
                let _ = writeln!(out, "{name}{} {value}", label_text(labels, None));
            }
        }
        // The timed methods, one family per mapped name (both methods map to one);
        // a name a counter took already is left out (one family, one type).
        let mut timed: BTreeMap<&str, Vec<(&Mapped, &MethodCalls)>> = BTreeMap::new();
        for calls in &self.calls {
            if let Some(time) = &calls.time {
                if !families.contains_key(&time.name) {
                    timed.entry(&time.name).or_default().push((time, calls));
                }
            }
        }
        for (name, methods) in timed {
            let first = methods[0].0;
            let kind = match first.observer {
                Observer::Histogram(_) => "histogram",
                Observer::Summary => "summary",
            };
            write_header(&mut out, name, first.help.as_deref(), kind);
            for (time, calls) in methods {
                if time.observer == first.observer {
                    render_time(&mut out, time, calls);
                }
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

/// A family's `# HELP` and `# TYPE` lines.
fn write_header(out: &mut String, name: &str, help: Option<&str>, kind: &str) {
    let help = help.unwrap_or("envoyproxy/ratelimit's statistic");
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A method's response-time series as the mapping says (a histogram or a summary),
/// its count being what its buckets hold, so that they agree within one scrape.
fn render_time(out: &mut String, time: &Mapped, calls: &MethodCalls) {
    let name = &time.name;
    let sum = calls.sum_ms.load(Relaxed) as f64 * time.scale.unwrap_or(1.0);
    let labels = |le: Option<&str>| label_text(&time.labels, le);
    let counts: Vec<u64> = calls.buckets.iter().map(|b| b.load(Relaxed)).collect();
    let count: u64 = counts.iter().sum();
    if count == 0 {
        return;
    }
    if let Observer::Histogram(bounds) = &time.observer {
        let mut cumulative = 0;
        for (bound, n) in bounds.iter().zip(&counts) {
            cumulative += n;
            let le = format!("{bound:?}");
            let _ = writeln!(out, "{name}_bucket{} {cumulative}", labels(Some(&le)));
        }
        let _ = writeln!(out, "{name}_bucket{} {count}", labels(Some("+Inf")));
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
