//! What the console shows, made from two expositions a second apart: totals as
//! `/metrics` has them, rates over the last second, percentiles of the last
//! second's decisions, and a bounded history for the charts.

use std::collections::HashMap;

use serde::Serialize;

use super::exposition::{latency, Latency, Reading, Sample};

/// The most rules whose history is kept (the rest show their figures, no chart).
pub const MAX_RULE_HISTORY: usize = 200;

/// The most points of a rule's history: its last five minutes.
pub const RULE_POINTS: usize = 300;

/// Decisions by outcome.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Outcomes {
    /// Admitted.
    pub allowed: f64,
    /// Rejected.
    pub rejected: f64,
    /// Over the limit, admitted by shadow mode.
    pub shadow_rejected: f64,
}

impl Outcomes {
    /// The decisions among `samples`, by outcome.
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> Outcomes {
        let mut o = Outcomes::default();
        for s in samples.filter(|s| s.name == "tollgate_decisions_total") {
            match s.label("outcome") {
                "allowed" => o.allowed += s.value,
                "rejected" => o.rejected += s.value,
                "shadow_rejected" => o.shadow_rejected += s.value,
                _ => {}
            }
        }
        o
    }

    fn per_second(now: Outcomes, before: Outcomes, seconds: f64) -> Outcomes {
        let rate = |a: f64, b: f64| ((a - b) / seconds).max(0.0);
        Outcomes {
            allowed: rate(now.allowed, before.allowed),
            rejected: rate(now.rejected, before.rejected),
            shadow_rejected: rate(now.shadow_rejected, before.shadow_rejected),
        }
    }
}

/// The server at a glance.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Overview {
    /// `tollgate_build_info`'s version and commit.
    pub version: String,
    /// The commit built.
    pub commit: String,
    /// Seconds since the process started.
    pub uptime_seconds: f64,
    /// `memory` or `redis`.
    pub store: String,
    /// Whether the Redis store fails now (`tollgate_redis_events{event="failing"}`).
    pub store_failing: bool,
    /// The Redis nodes failing now, by name
    /// (`tollgate_redis_node_events{event="failing"}`; a Cluster's other nodes decide).
    pub failing_nodes: Vec<String>,
    /// The Redis nodes known (`tollgate_redis_node_events`' `node`s).
    pub nodes: usize,
    /// Decisions since start, by outcome (`tollgate_decisions_total`).
    pub decisions: Outcomes,
    /// Decisions per second over the last second.
    pub per_second: Outcomes,
    /// Decision time percentiles over the last second, in ms (none without decisions).
    pub latency_ms: Option<Latency>,
    /// Rule reloads put in force, and refused (`tollgate_config_reloads_total`).
    pub reloads_ok: f64,
    /// Reloads refused.
    pub reloads_failed: f64,
    /// Whether the last reload was put in force.
    pub last_reload_ok: bool,
    /// Counters held in memory (`tollgate_keys`).
    pub keys: f64,
}

/// One rule's row.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleRow {
    /// What the rule is.
    #[serde(flatten)]
    pub info: RuleInfo,
    /// Decisions since start, by outcome.
    pub decisions: Outcomes,
    /// Over the last second.
    pub per_second: Outcomes,
    /// The share of the last second's hits that came past the near-limit ratio or
    /// over the limit (`near_limit` and `over_limit` over `total_hits`), 0 to 1: how
    /// near its limit it runs (a rule rejecting everything: 1).
    pub near_limit_share: f64,
    /// Keys held (memory store).
    pub keys: f64,
    /// Allowed and rejected per second, oldest first (as long as `history.time`).
    pub history: Option<RuleHistory>,
}

/// A rule's chart.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleHistory {
    /// Allowed per second.
    pub allowed: Vec<f64>,
    /// Rejected per second.
    pub rejected: Vec<f64>,
}

/// One RLQS quota bucket.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BucketRow {
    /// Its domain.
    pub domain: String,
    /// Its id, `key=value,...`.
    pub bucket: String,
    /// Its rule's name, and what it divides: the budget's policy, or its blanket
    /// rule (from the rules in force).
    pub rule: String,
    /// The budget's policy, or `allow_all` / `deny_all`.
    pub budget: String,
    /// `tollgate_quota_bucket`'s figures by name: clients (or streams),
    /// demand_per_second, assigned_per_second, reserved_per_second.
    pub figures: Vec<(String, f64)>,
    /// Requests the reports counted, allowed and denied.
    pub reported_allowed: f64,
    /// Denied.
    pub reported_denied: f64,
}

/// The overview's charts, oldest first, one point a second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct History {
    /// When each point was read (seconds since the epoch).
    pub time: Vec<f64>,
    /// Allowed per second.
    pub allowed: Vec<f64>,
    /// Rejected per second (shadow-rejected included: they were over).
    pub rejected: Vec<f64>,
    /// p99 decision time, ms (0 without decisions).
    pub p99_ms: Vec<f64>,
}

/// The console's figures at one time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// When they were read (seconds since the epoch).
    pub time: f64,
    /// The server at a glance.
    pub overview: Overview,
    /// Every rule.
    pub rules: Vec<RuleRow>,
    /// Envoy's quota buckets.
    pub quota: Vec<BucketRow>,
    /// The overview's charts.
    pub history: History,
    /// The proxy's routes.
    pub routes: Vec<super::routes::RouteRow>,
    /// The keys used most and rejected most (serve), read once per reading.
    #[serde(skip)]
    pub top: (
        Vec<tollgate_service::top_keys::KeyCount>,
        Vec<tollgate_service::top_keys::KeyCount>,
    ),
}

/// What a rule is, beyond its figures (from the rules in force).
#[derive(Debug, Clone, Default, Serialize)]
pub struct RuleInfo {
    /// Its domain.
    pub domain: String,
    /// Its descriptor path (`tollgate_decisions_total`'s `rule` label).
    pub rule: String,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// Its policies (none: unlimited).
    pub policies: Vec<String>,
    /// The file it came from, or the xDS server and version.
    pub source: String,
    /// In shadow mode: over-limit requests are admitted and counted.
    pub shadow: bool,
    /// Unlimited: never counted.
    pub unlimited: bool,
    /// Banned (`requests_per_unit: 0`): every request refused.
    pub banned: bool,
}

/// Makes [`Figures`] from each reading and the one before it, keeping the history.
pub struct Sampler {
    before: Option<Reading>,
    routes: super::routes::RouteSampler,
    points: usize,
    history: History,
    rules: HashMap<(String, String), RuleHistory>,
}

impl Sampler {
    /// A sampler keeping `points` points of history (one a second).
    pub fn new(points: usize) -> Sampler {
        Sampler {
            before: None,
            routes: super::routes::RouteSampler::new(points),
            points: points.max(2),
            history: History::default(),
            rules: HashMap::new(),
        }
    }

    /// The figures of `now` (against the reading before it), for `rules` in force.
    pub fn next(&mut self, now: Reading, store: &str, rules: &[RuleInfo]) -> Figures {
        let before = self.before.take();
        let seconds = before.as_ref().map_or(0.0, |b| now.seconds - b.seconds);
        let all = |r: &Reading| Outcomes::of(r.samples.iter());
        let overview = overview(
            &now,
            before.as_ref(),
            store,
            rates(all(&now), before.as_ref().map(all), seconds),
            "tollgate",
        );
        let mut rows = rule_rows(&now, before.as_ref(), seconds, rules);
        self.remember(&overview, &mut rows, now.time);
        let quota = buckets(&now);
        let time = now.time;
        self.before = Some(now);
        Figures {
            time,
            overview,
            rules: rows,
            quota,
            history: self.history.clone(),
            ..Figures::default()
        }
    }

    /// The proxy's figures of `now`: its routes, and as its decisions their
    /// requests (allowed: answered by the upstream; rejected: 429 and 503).
    pub fn next_proxy(&mut self, now: Reading, store: &str) -> Figures {
        let routes = self.routes.next(&now);
        let outcomes = |total: &dyn Fn(&super::routes::Status) -> f64| {
            let (mut allowed, mut rejected) = (0.0, 0.0);
            for s in routes.iter().flat_map(|r| &r.statuses) {
                match s.code.as_str() {
                    "429" | "503" => rejected += total(s),
                    _ => allowed += total(s),
                }
            }
            Outcomes {
                allowed,
                rejected,
                shadow_rejected: 0.0,
            }
        };
        let mut overview = overview(
            &now,
            None,
            store,
            outcomes(&|s| s.per_second),
            "tollgate_proxy",
        );
        overview.decisions = outcomes(&|s| s.total);
        self.remember(&overview, &mut [], now.time);
        let time = now.time;
        self.routes.keep(now);
        Figures {
            time,
            overview,
            history: self.history.clone(),
            routes,
            ..Figures::default()
        }
    }

    /// Adds this second to the charts (the overview's, and the busiest rules').
    fn remember(&mut self, overview: &Overview, rows: &mut [RuleRow], time: f64) {
        let points = self.points;
        let h = &mut self.history;
        push(&mut h.time, time, points);
        push(&mut h.allowed, overview.per_second.allowed, points);
        push(
            &mut h.rejected,
            overview.per_second.rejected + overview.per_second.shadow_rejected,
            points,
        );
        push(
            &mut h.p99_ms,
            overview.latency_ms.map_or(0.0, |l| l.p99),
            points,
        );
        // A rule's chart is its last minutes at most (a page of many rules stays light).
        let points = points.min(RULE_POINTS);
        let len = h.time.len().min(points);
        // Rules that left the rules in force leave the history too.
        let live: std::collections::HashSet<(&str, &str)> = rows
            .iter()
            .map(|r| (r.info.domain.as_str(), r.info.rule.as_str()))
            .collect();
        self.rules
            .retain(|(d, r), _| live.contains(&(d.as_str(), r.as_str())));
        for row in rows.iter_mut() {
            let key = (row.info.domain.clone(), row.info.rule.clone());
            if !self.rules.contains_key(&key) && self.rules.len() >= MAX_RULE_HISTORY {
                continue;
            }
            let chart = self.rules.entry(key).or_default();
            // A rule new to the history starts with zeros, in step with the times.
            for series in [&mut chart.allowed, &mut chart.rejected] {
                while series.len() + 1 < len {
                    series.insert(0, 0.0);
                }
            }
            push(&mut chart.allowed, row.per_second.allowed, points);
            push(
                &mut chart.rejected,
                row.per_second.rejected + row.per_second.shadow_rejected,
                points,
            );
            row.history = Some(chart.clone());
        }
    }
}

/// Appends `value`, keeping the last `points`.
fn push(series: &mut Vec<f64>, value: f64, points: usize) {
    if series.len() >= points {
        series.drain(..=series.len() - points);
    }
    series.push(value);
}

/// Per second between two totals (`None` before the second reading).
fn rates(now: Outcomes, before: Option<Outcomes>, seconds: f64) -> Outcomes {
    match before {
        Some(b) if seconds > 0.0 => Outcomes::per_second(now, b, seconds),
        _ => Outcomes::default(),
    }
}

/// Each rule's row, its series found in one pass over the reading. A series whose
/// `rule` label names no rule (a rule's statistics per value, under `detailed_metric`
/// or `value_to_metric`) gets a row of its own: every series `/metrics` has is on
/// the page.
fn rule_rows(
    now: &Reading,
    before: Option<&Reading>,
    seconds: f64,
    rules: &[RuleInfo],
) -> Vec<RuleRow> {
    type Index<'a> = HashMap<(&'a str, &'a str), Vec<&'a Sample>>;
    fn group(r: &Reading) -> Index<'_> {
        let mut by: Index = HashMap::new();
        for s in &r.samples {
            let rule = s.label("rule");
            if !rule.is_empty() {
                by.entry((s.label("domain"), rule)).or_default().push(s);
            }
        }
        by
    }
    let (now_by, before_by) = (group(now), before.map(group));
    let mut infos: Vec<RuleInfo> = rules.to_vec();
    let known: std::collections::HashSet<(&str, &str)> = rules
        .iter()
        .map(|r| (r.domain.as_str(), r.rule.as_str()))
        .collect();
    let mut extra: Vec<(&str, &str)> = (now_by.iter())
        .filter(|(k, v)| {
            !known.contains(k) && v.iter().any(|s| s.name == "tollgate_decisions_total")
        })
        .map(|(k, _)| *k)
        .collect();
    extra.sort_unstable();
    infos.extend(extra.into_iter().map(|(domain, rule)| RuleInfo {
        domain: domain.to_string(),
        rule: rule.to_string(),
        source: "statistics per value (detailed_metric, value_to_metric)".into(),
        ..RuleInfo::default()
    }));
    let empty = Vec::new();
    infos
        .into_iter()
        .map(|info| {
            let key = (info.domain.as_str(), info.rule.as_str());
            let here = now_by.get(&key).unwrap_or(&empty);
            let there = before_by.as_ref().map(|b| b.get(&key).unwrap_or(&empty));
            let hits = |samples: &Vec<&Sample>, stat: &str| {
                (samples.iter())
                    .filter(|s| {
                        s.name == "tollgate_rate_limit_hits_total" && s.label("stat") == stat
                    })
                    .fold(0.0, |sum, s| sum + s.value)
            };
            let near = there.map_or(0.0, |b| {
                let delta = |stat: &str| hits(here, stat) - hits(b, stat);
                let total = delta("total_hits");
                if total > 0.0 {
                    ((delta("near_limit") + delta("over_limit")) / total).clamp(0.0, 1.0)
                } else {
                    0.0
                }
            });
            let decisions = Outcomes::of(here.iter().copied());
            RuleRow {
                decisions,
                per_second: rates(
                    decisions,
                    there.map(|b| Outcomes::of(b.iter().copied())),
                    seconds,
                ),
                near_limit_share: near,
                keys: (here.iter())
                    .filter(|s| s.name == "tollgate_keys")
                    .fold(0.0, |sum, s| sum + s.value),
                history: None,
                info,
            }
        })
        .collect()
}

/// The overview of a server whose own metrics start with `prefix` (`tollgate`,
/// `tollgate_proxy`).
fn overview(
    now: &Reading,
    before: Option<&Reading>,
    store: &str,
    per_second: Outcomes,
    prefix: &str,
) -> Overview {
    let start = now.one("process_start_time_seconds").unwrap_or(now.time);
    let reloads = |result: &str| {
        now.sum(&format!("{prefix}_config_reloads_total"), |s| {
            s.label("result") == result
        })
    };
    // Both servers name their build `tollgate_build_info`.
    let build = "tollgate_build_info";
    Overview {
        version: now.label_of(build, "version"),
        commit: now.label_of(build, "commit"),
        uptime_seconds: (now.time - start).max(0.0),
        store: store.to_string(),
        store_failing: now.sum("tollgate_redis_events", |s| s.label("event") == "failing") > 0.0,
        failing_nodes: (now.samples.iter())
            .filter(|s| s.name == "tollgate_redis_node_events" && s.label("event") == "failing")
            .filter(|s| s.value > 0.0)
            .map(|s| s.label("node").to_string())
            .collect(),
        nodes: (now.samples.iter())
            .filter(|s| s.name == "tollgate_redis_node_events" && s.label("event") == "failing")
            .count(),
        decisions: Outcomes::of(now.samples.iter()),
        per_second,
        latency_ms: before.and_then(|b| latency(now, b, "tollgate_decision_duration_seconds")),
        reloads_ok: reloads("ok"),
        reloads_failed: reloads("failed"),
        last_reload_ok: now.one(&format!("{prefix}_config_last_reload_successful")) != Some(0.0),
        keys: now.sum("tollgate_keys", |_| true),
    }
}

fn buckets(now: &Reading) -> Vec<BucketRow> {
    let mut rows: Vec<BucketRow> = Vec::new();
    let mut at: HashMap<(String, String), usize> = HashMap::new();
    for s in &now.samples {
        let quota = s.name == "tollgate_quota_bucket";
        if !quota && s.name != "tollgate_quota_reported_requests_total" {
            continue;
        }
        let key = (s.label("domain").to_string(), s.label("bucket").to_string());
        let i = *at.entry(key.clone()).or_insert_with(|| {
            rows.push(BucketRow {
                domain: key.0,
                bucket: key.1,
                ..BucketRow::default()
            });
            rows.len() - 1
        });
        let row = &mut rows[i];
        match (quota, s.label("outcome")) {
            (true, _) => row.figures.push((s.label("figure").to_string(), s.value)),
            (false, "allowed") => row.reported_allowed = s.value,
            (false, _) => row.reported_denied = s.value,
        }
    }
    rows.sort_by(|a, b| (&a.domain, &a.bucket).cmp(&(&b.domain, &b.bucket)));
    rows
}

#[cfg(test)]
mod tests {
    use super::super::exposition::parse;
    use super::*;

    fn reading(time: f64, text: &str) -> Reading {
        Reading {
            time,
            seconds: time,
            samples: parse(text),
        }
    }

    #[test]
    fn a_rule_met_once_the_history_is_full_is_as_long_as_it_and_per_value_series_get_rows() {
        let mut sampler = Sampler::new(3);
        let info = |rule: &str| RuleInfo {
            domain: "d".into(),
            rule: rule.into(),
            ..RuleInfo::default()
        };
        let text = "tollgate_decisions_total{domain=\"d\",rule=\"d/k=v1\",outcome=\"allowed\"} 2\n";
        for t in 0..5 {
            sampler.next(reading(t as f64, text), "memory", &[info("d/a")]);
        }
        let f = sampler.next(reading(5.0, text), "memory", &[info("d/a"), info("d/b")]);
        assert_eq!(f.history.time.len(), 3);
        for row in &f.rules[..2] {
            assert_eq!(
                row.history.as_ref().unwrap().allowed.len(),
                3,
                "{}",
                row.info.rule
            );
        }
        // A rule's statistics per value: a row of its own, its figures /metrics'.
        assert_eq!(f.rules.len(), 3);
        assert_eq!(
            (f.rules[2].info.rule.as_str(), f.rules[2].decisions.allowed),
            ("d/k=v1", 2.0)
        );
    }

    #[test]
    fn percentiles_interpolate_within_the_last_seconds_buckets() {
        let before = reading(
            0.0,
            "h_bucket{le=\"0.001\"} 10\nh_bucket{le=\"0.002\"} 10\nh_bucket{le=\"+Inf\"} 10\n",
        );
        // 100 new: 50 at or below 1 ms, 50 in (1, 2] ms.
        let now = reading(
            1.0,
            "h_bucket{le=\"0.001\"} 60\nh_bucket{le=\"0.002\"} 110\nh_bucket{le=\"+Inf\"} 110\n",
        );
        let l = latency(&now, &before, "h").unwrap();
        assert!((l.p50 - 1.0).abs() < 1e-9, "{l:?}");
        assert!((l.p99 - 1.98).abs() < 1e-9, "{l:?}");
        assert!(latency(&now, &now, "h").is_none());
    }

    #[test]
    fn rates_come_from_the_difference_and_history_stays_bounded() {
        let mut sampler = Sampler::new(3);
        let info = RuleInfo {
            domain: "d".into(),
            rule: "d/k".into(),
            ..RuleInfo::default()
        };
        let text = |allowed: u64, rejected: u64| {
            format!("tollgate_decisions_total{{domain=\"d\",rule=\"d/k\",outcome=\"allowed\"}} {allowed}\ntollgate_decisions_total{{domain=\"d\",rule=\"d/k\",outcome=\"rejected\"}} {rejected}\n")
        };
        let f = sampler.next(
            reading(10.0, &text(5, 0)),
            "memory",
            std::slice::from_ref(&info),
        );
        assert_eq!(f.overview.decisions.allowed, 5.0);
        assert_eq!(f.overview.per_second, Outcomes::default());
        let f = sampler.next(
            reading(12.0, &text(25, 4)),
            "memory",
            std::slice::from_ref(&info),
        );
        assert_eq!(f.overview.per_second.allowed, 10.0);
        assert_eq!(f.rules[0].per_second.rejected, 2.0);
        for t in 13..20 {
            let f = sampler.next(
                reading(t as f64, &text(25, 4)),
                "memory",
                std::slice::from_ref(&info),
            );
            assert!(f.history.time.len() <= 3);
            assert_eq!(
                f.rules[0].history.as_ref().unwrap().allowed.len(),
                f.history.time.len()
            );
        }
    }
}
