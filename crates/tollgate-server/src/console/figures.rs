//! What the console shows, made from two expositions a second apart: totals as
//! `/metrics` has them, rates over the last second, percentiles of the last
//! second's decisions, and a bounded history for the charts.

use std::collections::HashMap;

use serde::Serialize;

use super::exposition::{latency, Latency, Reading, Sample};

/// The most rules whose history is kept (the rest show their figures, no chart).
pub const MAX_RULE_HISTORY: usize = 200;

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
    fn of(r: &Reading, keep: impl Fn(&Sample) -> bool) -> Outcomes {
        let by = |outcome: &str| {
            r.sum("tollgate_decisions_total", |s| {
                s.label("outcome") == outcome && keep(s)
            })
        };
        Outcomes {
            allowed: by("allowed"),
            rejected: by("rejected"),
            shadow_rejected: by("shadow_rejected"),
        }
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
    /// The share of the last second's admitted hits that came past the near-limit
    /// ratio (`near_limit` over `within_limit`), 0 to 1: how near its limit it runs.
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
        let seconds = before.as_ref().map_or(0.0, |b| now.time - b.time);
        let rate_base = |r: &Reading, keep: &dyn Fn(&Sample) -> bool| match &before {
            Some(b) if seconds > 0.0 => {
                Outcomes::per_second(Outcomes::of(r, keep), Outcomes::of(b, keep), seconds)
            }
            _ => Outcomes::default(),
        };
        let overview = overview(
            &now,
            before.as_ref(),
            store,
            rate_base(&now, &|_| true),
            "tollgate",
        );
        let mut rows: Vec<RuleRow> = rules
            .iter()
            .map(|info| {
                let this =
                    |s: &Sample| s.label("domain") == info.domain && s.label("rule") == info.rule;
                let hits = |r: &Reading, stat: &str| {
                    r.sum("tollgate_rate_limit_hits_total", |s| {
                        this(s) && s.label("stat") == stat
                    })
                };
                let near = match &before {
                    Some(b) => {
                        let within = hits(&now, "within_limit") - hits(b, "within_limit");
                        let near = hits(&now, "near_limit") - hits(b, "near_limit");
                        if within > 0.0 {
                            (near / within).clamp(0.0, 1.0)
                        } else {
                            0.0
                        }
                    }
                    None => 0.0,
                };
                RuleRow {
                    info: info.clone(),
                    decisions: Outcomes::of(&now, this),
                    per_second: rate_base(&now, &this),
                    near_limit_share: near,
                    keys: now.sum("tollgate_keys", this),
                    history: None,
                }
            })
            .collect();
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
            routes: Vec::new(),
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
        let full = self.history.time.len() >= self.points;
        let h = &mut self.history;
        push(&mut h.time, time, full);
        push(&mut h.allowed, overview.per_second.allowed, full);
        push(
            &mut h.rejected,
            overview.per_second.rejected + overview.per_second.shadow_rejected,
            full,
        );
        push(
            &mut h.p99_ms,
            overview.latency_ms.map_or(0.0, |l| l.p99),
            full,
        );
        let len = h.time.len();
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
            push(&mut chart.allowed, row.per_second.allowed, full);
            push(
                &mut chart.rejected,
                row.per_second.rejected + row.per_second.shadow_rejected,
                full,
            );
            row.history = Some(chart.clone());
        }
    }
}

fn push(series: &mut Vec<f64>, value: f64, full: bool) {
    if full && !series.is_empty() {
        series.remove(0);
    }
    series.push(value);
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
        decisions: Outcomes::of(now, |_| true),
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
            samples: parse(text),
        }
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
