//! The proxy's side of the console: each route's requests by status, its upstream
//! latency and its adaptive limit, made from two readings of the proxy's `/metrics`
//! a second apart, with their history (proxy_pages.rs draws them).

use serde::Serialize;
use std::collections::HashMap;

use super::exposition::Sample;
use super::exposition::{latency, Latency, Reading};

/// One status a route answered: since start and over the last second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Status {
    /// The HTTP status.
    pub code: String,
    /// Since start (`tollgate_proxy_requests_total`).
    pub total: f64,
    /// Per second, over the last second.
    pub per_second: f64,
}

/// A route's adaptive limit now.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Adaptive {
    /// The limit.
    pub limit: f64,
    /// Requests holding a permit.
    pub in_flight: f64,
    /// Requests waiting for one.
    pub queued: f64,
    /// The unloaded latency the limit is measured against, ms.
    pub baseline_ms: Option<f64>,
    /// The last window's trimmed mean latency, ms.
    pub latency_ms: Option<f64>,
    /// Requests granted a permit since start.
    pub admitted: f64,
    /// Shed since start and per second, by priority class.
    pub shed_by_priority: Vec<Status>,
    /// Shed since start, by reason.
    pub shed_by_reason: Vec<(String, f64)>,
}

/// One route's row.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouteRow {
    /// Its name.
    pub route: String,
    /// Each status it answered.
    pub statuses: Vec<Status>,
    /// Requests per second, over the last second.
    pub per_second: f64,
    /// 429s per second (its limits).
    pub rejected_per_second: f64,
    /// 503s per second (shed, or its store failing closed).
    pub shed_per_second: f64,
    /// Upstream time percentiles over the last second.
    pub upstream_ms: Option<Latency>,
    /// Its adaptive limit, if it has one.
    pub adaptive: Option<Adaptive>,
    /// Its charts, oldest first, one point a second.
    pub history: RouteHistory,
}

/// A route's charts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouteHistory {
    /// Requests per second.
    pub requests: Vec<f64>,
    /// 429s and 503s per second.
    pub rejected: Vec<f64>,
    /// The adaptive limit.
    pub limit: Vec<f64>,
    /// In flight.
    pub in_flight: Vec<f64>,
    /// Queued.
    pub queued: Vec<f64>,
    /// The adaptive latency and its baseline, ms.
    pub latency_ms: Vec<f64>,
    /// The baseline, ms.
    pub baseline_ms: Vec<f64>,
    /// Upstream p99, ms.
    pub upstream_p99_ms: Vec<f64>,
}

impl RouteHistory {
    fn push(&mut self, r: &RouteRow, points: usize) {
        let a = r.adaptive.as_ref();
        let values = [
            (&mut self.requests, r.per_second),
            (
                &mut self.rejected,
                r.rejected_per_second + r.shed_per_second,
            ),
            (&mut self.limit, a.map_or(0.0, |a| a.limit)),
            (&mut self.in_flight, a.map_or(0.0, |a| a.in_flight)),
            (&mut self.queued, a.map_or(0.0, |a| a.queued)),
            (
                &mut self.latency_ms,
                a.and_then(|a| a.latency_ms).unwrap_or(0.0),
            ),
            (
                &mut self.baseline_ms,
                a.and_then(|a| a.baseline_ms).unwrap_or(0.0),
            ),
            (
                &mut self.upstream_p99_ms,
                r.upstream_ms.map_or(0.0, |l| l.p99),
            ),
        ];
        for (series, v) in values {
            if series.len() >= points {
                series.remove(0);
            }
            series.push(v);
        }
    }
}

/// Makes the routes' rows from each reading and the one before it.
pub struct RouteSampler {
    before: Option<Reading>,
    points: usize,
    history: HashMap<String, RouteHistory>,
}

fn route_of<'a>(s: &'a Sample, name: &str) -> Option<&'a str> {
    (s.name == name).then(|| s.label("route"))
}

impl RouteSampler {
    /// A sampler keeping `points` points of each route's history.
    pub fn new(points: usize) -> RouteSampler {
        RouteSampler {
            before: None,
            points: points.max(2),
            history: HashMap::new(),
        }
    }

    /// The rows of `now`, and the reading kept for the next.
    pub fn next(&mut self, now: &Reading) -> Vec<RouteRow> {
        let mut names: Vec<&str> = (now.samples.iter())
            .filter_map(|s| route_of(s, "tollgate_proxy_requests_total"))
            .collect();
        names.sort_unstable();
        names.dedup();
        let before = self.before.as_ref();
        let seconds = before.map_or(0.0, |b| now.seconds - b.seconds);
        let per_second = |name: &str, keep: &dyn Fn(&Sample) -> bool| -> f64 {
            let sum = |r: &Reading| {
                (r.samples.iter())
                    .filter(|s| s.name == name && keep(s))
                    .fold(0.0, |a, s| a + s.value)
            };
            match before {
                Some(b) if seconds > 0.0 => ((sum(now) - sum(b)) / seconds).max(0.0),
                _ => 0.0,
            }
        };
        let mut rows = Vec::new();
        for route in names {
            let this = |s: &Sample| s.label("route") == route;
            let mut statuses: Vec<Status> = (now.samples.iter())
                .filter(|s| route_of(s, "tollgate_proxy_requests_total") == Some(route))
                .map(|s| Status {
                    code: s.label("code").to_string(),
                    total: s.value,
                    per_second: per_second("tollgate_proxy_requests_total", &|x| {
                        this(x) && x.label("code") == s.label("code")
                    }),
                })
                .collect();
            statuses.sort_by(|a, b| a.code.cmp(&b.code));
            let code_rate = |code: &str| {
                statuses
                    .iter()
                    .find(|s| s.code == code)
                    .map_or(0.0, |s| s.per_second)
            };
            let upstream_ms = before.and_then(|b| {
                latency(
                    &only(now, route),
                    &only(b, route),
                    "tollgate_proxy_upstream_duration_seconds",
                )
            });
            let row = RouteRow {
                route: route.to_string(),
                per_second: statuses.iter().map(|s| s.per_second).sum(),
                rejected_per_second: code_rate("429"),
                shed_per_second: code_rate("503"),
                statuses,
                upstream_ms,
                adaptive: adaptive(now, route, &per_second),
                history: RouteHistory::default(),
            };
            rows.push(row);
        }
        let live: std::collections::HashSet<&str> = rows.iter().map(|r| r.route.as_str()).collect();
        self.history.retain(|k, _| live.contains(k.as_str()));
        for row in &mut rows {
            let h = self.history.entry(row.route.clone()).or_default();
            h.push(row, self.points);
            row.history = h.clone();
        }
        rows
    }

    /// Keeps `now` for the next rates.
    pub fn keep(&mut self, now: Reading) {
        self.before = Some(now);
    }
}

/// The samples of one route alone.
fn only(r: &Reading, route: &str) -> Reading {
    Reading {
        time: r.time,
        seconds: r.seconds,
        samples: (r.samples.iter())
            .filter(|s| s.label("route") == route)
            .cloned()
            .collect(),
    }
}

/// A series' rate over the last second: its name, and which of its samples count.
type RateOf<'a> = &'a dyn Fn(&str, &dyn Fn(&Sample) -> bool) -> f64;

fn adaptive(now: &Reading, route: &str, per_second: RateOf) -> Option<Adaptive> {
    let get = |name: &str| {
        (now.samples.iter())
            .find(|s| s.name == name && s.label("route") == route)
            .map(|s| s.value)
    };
    let limit = get("tollgate_proxy_adaptive_limit")?;
    let ms = |v: Option<f64>| v.filter(|v| v.is_finite()).map(|v| v * 1e3);
    let by = |name: &str, label: &str| -> Vec<(String, f64)> {
        (now.samples.iter())
            .filter(|s| s.name == name && s.label("route") == route)
            .map(|s| (s.label(label).to_string(), s.value))
            .collect()
    };
    let shed_by_priority = by("tollgate_proxy_adaptive_shed_by_priority_total", "priority")
        .into_iter()
        .map(|(class, total)| Status {
            per_second: per_second("tollgate_proxy_adaptive_shed_by_priority_total", &|s| {
                s.label("route") == route && s.label("priority") == class
            }),
            code: class,
            total,
        })
        .collect();
    Some(Adaptive {
        limit,
        in_flight: get("tollgate_proxy_adaptive_in_flight").unwrap_or(0.0),
        queued: get("tollgate_proxy_adaptive_queued").unwrap_or(0.0),
        baseline_ms: ms(get("tollgate_proxy_adaptive_baseline_seconds")),
        latency_ms: ms(get("tollgate_proxy_adaptive_latency_seconds")),
        admitted: get("tollgate_proxy_adaptive_admitted_total").unwrap_or(0.0),
        shed_by_priority,
        shed_by_reason: by("tollgate_proxy_adaptive_shed_total", "reason"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::exposition::parse;
    use super::*;

    #[test]
    fn a_routes_statuses_rates_and_adaptive_figures_come_from_its_series() {
        let text = |ok: u64, limited: u64, shed: u64| {
            format!(
                "tollgate_proxy_requests_total{{route=\"api\",code=\"200\"}} {ok}\n\
                 tollgate_proxy_requests_total{{route=\"api\",code=\"429\"}} {limited}\n\
                 tollgate_proxy_adaptive_limit{{route=\"api\"}} 12\n\
                 tollgate_proxy_adaptive_baseline_seconds{{route=\"api\"}} NaN\n\
                 tollgate_proxy_adaptive_shed_by_priority_total{{route=\"api\",priority=\"normal\"}} {shed}\n\
                 tollgate_proxy_requests_total{{route=\"web\",code=\"200\"}} 1\n"
            )
        };
        let mut s = RouteSampler::new(5);
        let first = Reading {
            time: 1.0,
            seconds: 1.0,
            samples: parse(&text(10, 0, 0)),
        };
        s.next(&first);
        s.keep(first);
        let second = Reading {
            time: 3.0,
            seconds: 3.0,
            samples: parse(&text(30, 4, 6)),
        };
        let rows = s.next(&second);
        assert_eq!(rows.len(), 2);
        let api = &rows[0];
        assert_eq!((api.per_second, api.rejected_per_second), (12.0, 2.0));
        let a = api.adaptive.as_ref().unwrap();
        assert_eq!((a.limit, a.baseline_ms), (12.0, None));
        assert_eq!(a.shed_by_priority[0].per_second, 3.0);
        assert!(rows[1].adaptive.is_none());
        assert_eq!(api.history.requests, vec![0.0, 12.0]);
    }
}
