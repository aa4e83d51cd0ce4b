//! The console's "try a policy" page: up to three policies through generated
//! traffic on a virtual clock, with `tollgate simulate`'s engine and chart (the
//! policy's envelope drawn), within bounds that keep one run to a fraction of a
//! second of CPU.

use std::fmt::Write;

use tollgate::Policy;

use super::pages::{esc, url_encode};
use tollgate_offline::run::{run, Summary};
use tollgate_offline::traffic::{traffic, Pattern, Scenario};

/// Policies compared at once.
pub const SLOTS: usize = 3;
/// The most requests one try generates.
pub const MAX_REQUESTS: f64 = 100_000.0;
/// The longest run, seconds.
pub const MAX_SECONDS: f64 = 600.0;

/// Each algorithm the page offers, with parameters to start from.
pub const ALGORITHMS: [(&str, &str); 10] = [
    ("gcra", "rate=10/s,burst=20"),
    ("token-bucket", "rate=10/s,capacity=20"),
    ("leaky-bucket", "rate=10/s,capacity=20"),
    ("fixed-window", "limit=100,window=10s"),
    ("sliding-log", "limit=100,window=10s"),
    ("sliding-window", "limit=100,window=10s"),
    ("smooth-bursty", "rate=10/s"),
    ("smooth-warmup", "rate=10/s,warmup=5s"),
    ("limit-req", "rate=10/s,burst=5,nodelay"),
    ("shaper", "rate=10/s,queue=20"),
];

/// The traffic shapes offered (a trace file and closed-loop clients are the CLI's).
pub const PATTERNS: [&str; 6] = ["poisson", "steady", "burst", "boundary", "sine", "ramp"];

/// The form as submitted (every field as text, shown back as typed).
#[derive(Debug, Clone, Default)]
pub struct Form {
    /// Each slot's algorithm and parameters.
    pub slots: [(String, String); SLOTS],
    /// The traffic pattern.
    pub pattern: String,
    /// Requests per second.
    pub rate: String,
    /// Seconds.
    pub duration: String,
    /// Burst size (burst and boundary).
    pub burst: String,
    /// Keys.
    pub keys: String,
}

/// A validated try: the policies and the traffic.
#[derive(Debug, Clone)]
pub struct Try {
    policies: Vec<Policy>,
    scenario: Scenario,
}

impl Form {
    /// The form from query pairs; fields missing take the page's defaults.
    pub fn from_pairs(pairs: &[(String, String)]) -> Form {
        let get = |name: &str, default: &str| {
            (pairs.iter().find(|(k, _)| k == name)).map_or(default.to_string(), |(_, v)| v.clone())
        };
        let defaults = [
            ("gcra", "rate=10/s,burst=20"),
            ("fixed-window", "limit=100,window=10s"),
            ("", ""),
        ];
        let slots = std::array::from_fn(|i| {
            (
                get(&format!("algorithm{}", i + 1), defaults[i].0),
                get(&format!("params{}", i + 1), defaults[i].1),
            )
        });
        Form {
            slots,
            pattern: get("pattern", "burst"),
            rate: get("rate", "10"),
            duration: get("duration", "30"),
            burst: get("burst", "40"),
            keys: get("keys", "1"),
        }
    }

    /// The policies and traffic, or what is wrong, naming the field.
    pub fn scenario(&self) -> Result<Try, String> {
        let mut policies = Vec::new();
        for (i, (algorithm, params)) in self.slots.iter().enumerate() {
            if algorithm.trim().is_empty() {
                continue;
            }
            let spec = format!("{}:{}", algorithm.trim(), params.trim());
            let policy =
                Policy::parse(&spec).map_err(|e| format!("Policy {}: {spec}: {e}", i + 1))?;
            if policy.name() == "concurrency" {
                return Err(format!("Policy {}: concurrency has no rate to chart; try it with tollgate simulate --hold", i + 1));
            }
            policies.push(policy);
        }
        if policies.is_empty() {
            return Err("Choose at least one algorithm.".into());
        }
        let pattern = match self.pattern.as_str() {
            p if PATTERNS.contains(&p) => p.parse::<Pattern>()?,
            p => {
                return Err(format!(
                    "Traffic: unknown pattern {p:?} (one of {})",
                    PATTERNS.join(", ")
                ))
            }
        };
        let number = |name: &str, text: &str, max: f64| -> Result<f64, String> {
            let n: f64 = text
                .trim()
                .parse()
                .map_err(|_| format!("{name}: {text:?} is not a number"))?;
            if !(n > 0.0 && n.is_finite()) || n > max {
                return Err(format!(
                    "{name}: {text} is out of range (above 0, at most {max})"
                ));
            }
            Ok(n)
        };
        let rate = number("Rate", &self.rate, 100_000.0)?;
        let seconds = number("Duration", &self.duration, MAX_SECONDS)?;
        let burst = number("Burst", &self.burst, 10_000.0)? as u64;
        let keys = number("Keys", &self.keys, 1_000.0)? as u64;
        // What the pattern will generate on average, bounded before it is: a boundary
        // pattern sends its bursts whatever the rate. (A random pattern may draw a few
        // more: the generated trace is bounded again at twice the most.)
        let requests = match pattern {
            Pattern::Boundary => burst as f64 * seconds.ceil(),
            Pattern::Burst => rate * seconds + burst as f64,
            _ => rate * seconds,
        };
        if requests > MAX_REQUESTS {
            let what = match pattern {
                Pattern::Boundary => "Burst x duration",
                _ => "Rate x duration",
            };
            return Err(format!(
                "{what}: {} requests; a try runs at most {MAX_REQUESTS} (tollgate simulate runs more)",
                requests as u64
            ));
        }
        Ok(Try {
            policies,
            scenario: Scenario {
                pattern,
                rate,
                duration_us: (seconds * 1e6) as u64,
                burst,
                seed: 1,
                keys,
                hold_us: None,
            },
        })
    }
}

/// Runs a try: each policy's summary, and the chart (SVG).
pub fn simulate(t: &Try) -> Result<(Vec<Summary>, String), String> {
    let arrivals = traffic(&t.scenario).map_err(|e| e.to_string())?;
    if arrivals.len() as f64 > 2.0 * MAX_REQUESTS {
        return Err(format!("{} requests: more than a try runs", arrivals.len()));
    }
    let duration_us = arrivals
        .last()
        .map_or(t.scenario.duration_us, |a| a.0.max(t.scenario.duration_us));
    let runs: Vec<_> = (t.policies.iter())
        .map(|p| {
            let (fates, summary) = run(p, &arrivals, None, &mut |_| {});
            (summary, fates)
        })
        .collect();
    let title = format!(
        "{:?} traffic, {} req/s avg, {} s",
        t.scenario.pattern,
        t.scenario.rate,
        duration_us as f64 / 1e6
    )
    .to_lowercase();
    let svg =
        tollgate_offline::chart::draw_svg(&title, &runs, duration_us).map_err(|e| e.to_string())?;
    Ok((runs.into_iter().map(|(s, _)| s).collect(), svg))
}

/// The form, filled as submitted.
pub fn form_html(base: &str, f: &Form) -> String {
    let mut slots = String::new();
    for (i, (algorithm, params)) in f.slots.iter().enumerate() {
        let n = i + 1;
        let mut options = String::from("<option value=\"\">(none)</option>");
        for (name, _) in ALGORITHMS {
            let selected = if name == algorithm { " selected" } else { "" };
            let _ = write!(
                options,
                "<option value=\"{name}\"{selected}>{name}</option>"
            );
        }
        let _ = write!(
            slots,
            "<fieldset><legend>Policy {n}</legend><label for=\"algorithm{n}\">Algorithm</label><select id=\"algorithm{n}\" name=\"algorithm{n}\">{options}</select>\
<label for=\"params{n}\">Parameters</label><input id=\"params{n}\" name=\"params{n}\" value=\"{}\" size=\"32\"></fieldset>",
            esc(params)
        );
    }
    let mut patterns = String::new();
    for p in PATTERNS {
        let selected = if p == f.pattern { " selected" } else { "" };
        let _ = write!(patterns, "<option value=\"{p}\"{selected}>{p}</option>");
    }
    let mut examples = String::new();
    for (name, params) in ALGORITHMS {
        let _ = write!(
            examples,
            "<li><code>{name}</code>: <code>{params}</code></li>"
        );
    }
    format!(
        "<form method=\"get\" action=\"{}/try#result\" id=\"try\"><div class=\"slots\">{slots}</div>\
<fieldset><legend>Traffic</legend><label for=\"pattern\">Pattern</label><select id=\"pattern\" name=\"pattern\">{patterns}</select>\
<label for=\"rate\">Requests/s</label><input id=\"rate\" name=\"rate\" value=\"{}\" size=\"8\" inputmode=\"decimal\">\
<label for=\"duration\">Seconds</label><input id=\"duration\" name=\"duration\" value=\"{}\" size=\"6\" inputmode=\"decimal\">\
<label for=\"burst\">Burst</label><input id=\"burst\" name=\"burst\" value=\"{}\" size=\"6\" inputmode=\"numeric\">\
<label for=\"keys\">Keys</label><input id=\"keys\" name=\"keys\" value=\"{}\" size=\"4\" inputmode=\"numeric\"></fieldset>\
<button type=\"submit\">Simulate</button></form>\
<details><summary>Parameters of each algorithm</summary><ul>{examples}</ul><p>Rates are <code>N/s</code>, <code>N/m</code>, <code>N/h</code>; windows <code>10s</code>, <code>1m</code>. The same syntax as rule files and <code>tollgate simulate --policy</code>.</p></details>",
        esc(base),
        esc(&f.rate),
        esc(&f.duration),
        esc(&f.burst),
        esc(&f.keys)
    )
}

/// The result: the chart (drawn by `chart.svg` from the same query) and the table.
pub fn result_html(base: &str, pairs: &[(String, String)], summaries: &[Summary]) -> String {
    let query: Vec<String> = (pairs.iter())
        .map(|(k, v)| format!("{}={}", url_encode(k), url_encode(v)))
        .collect();
    // The same text as the page's query, so that the chart is the run just made.
    let mut rows = String::new();
    for s in summaries {
        let _ = write!(
            rows,
            "<tr><th scope=\"row\"><code>{}</code></th><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&s.policy),
            s.offered,
            s.admitted,
            s.rejected,
            s.delayed,
            s.worst_window,
            s.envelope.map_or("–".to_string(), |e| e.to_string()),
            s.envelope_ratio.map_or("–".to_string(), |r| format!("{r:.2}")),
        );
    }
    format!(
        "<section id=\"result\" aria-labelledby=\"result-h\"><h2 id=\"result-h\">What it would do</h2>\
<img src=\"{}/try/chart.svg?{}\" alt=\"offered, admitted and rejected per second for each policy, against its envelope\" width=\"1200\" class=\"wide\">\
<table><thead><tr><th scope=\"col\">Policy</th><th scope=\"col\">Offered</th><th scope=\"col\">Admitted</th><th scope=\"col\">Rejected</th><th scope=\"col\">Delayed</th><th scope=\"col\">Densest window</th><th scope=\"col\">Envelope</th><th scope=\"col\">Share of promise used</th></tr></thead><tbody>{rows}</tbody></table></section>",
        esc(base),
        esc(&query.join("&"))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> Form {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Form::from_pairs(&pairs)
    }

    #[test]
    fn every_offered_algorithm_parses_with_its_example() {
        for (name, params) in ALGORITHMS {
            Policy::parse(&format!("{name}:{params}")).unwrap();
        }
    }

    #[test]
    fn bad_input_names_its_field() {
        let cases = [
            (
                vec![("algorithm1", "gcra"), ("params1", "rate=banana")],
                "Policy 1",
            ),
            (vec![("algorithm1", "nope")], "Policy 1"),
            (vec![("pattern", "trace:/etc/passwd")], "Traffic"),
            (vec![("rate", "-3")], "Rate"),
            (vec![("duration", "1e9")], "Duration"),
            (
                vec![("rate", "100000"), ("duration", "600")],
                "Rate x duration",
            ),
            (
                vec![("pattern", "boundary"), ("burst", "10000"), ("rate", "1")],
                "Burst x duration",
            ),
            (vec![("burst", "100000")], "Burst"),
            (vec![("algorithm1", ""), ("algorithm2", "")], "at least one"),
        ];
        for (pairs, named) in cases {
            let e = form(&pairs).scenario().unwrap_err();
            assert!(e.contains(named), "{pairs:?}: {e}");
        }
        // The bound is the requests the pattern makes: 160/s for 600 s is 96,000,
        // within a try; 170/s is 102,000, and the refusal says so.
        let steady = |rate| form(&[("pattern", "steady"), ("rate", rate), ("duration", "600")]);
        steady("160").scenario().unwrap();
        let e = steady("170").scenario().unwrap_err();
        assert!(e.contains("102000 requests"), "{e}");
    }

    #[test]
    fn a_try_draws_the_envelope_of_each_policy() {
        let t = form(&[
            ("algorithm3", "sliding-log"),
            ("params3", "limit=100,window=10s"),
        ])
        .scenario()
        .unwrap();
        let (summaries, svg) = simulate(&t).unwrap();
        assert_eq!(summaries.len(), 3);
        assert!(
            svg.starts_with("<svg") || svg.starts_with("<?xml"),
            "{}",
            &svg[..60]
        );
        assert_eq!(svg.matches("promise: the most it may admit").count(), 3);
    }
}
