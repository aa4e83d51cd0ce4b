//! A statsd mapping file (the format of Prometheus's statsd_exporter, which
//! envoyproxy/ratelimit reads from `PROMETHEUS_MAPPER_YAML`): how a dotted statsd
//! name becomes a Prometheus name and labels. Pure: a parsed file and a lookup.
//!
//! Semantics, as statsd_exporter defines them:
//! - a `glob` match (the default) has one pattern component per dotted component of
//!   the name; `*` is a whole component and matches any one (an empty one too);
//! - a `regex` match is a regular expression found anywhere in the name (unanchored);
//! - every glob mapping is tried before any regex one; within each kind the first in
//!   the file that matches wins;
//! - `$1`, `${1}` in `name` and label values are the pattern's captures (for a regex,
//!   also `$name`); one that does not exist is empty;
//! - `match_metric_type` (`counter`, `gauge`, `observer`, or `timer`) restricts a
//!   mapping to one kind of stat; `action: drop` drops what it matches;
//! - a name no mapping matches is kept, every character outside `[a-zA-Z0-9_]` made
//!   `_`, without labels.
//!
//! Observers (timers) are exported as histograms with the mapping's buckets (else the
//! defaults', else Prometheus's usual `.005` to `10`), or, when the mapping asks for a
//! summary (or says nothing and neither do the defaults), as a summary of its sum and
//! count, without quantiles.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;

/// Prometheus's usual histogram buckets (its client libraries' `DefBuckets`).
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The kind of a statsd stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// A counter: deltas added up.
    Counter,
    /// A gauge: a value set.
    Gauge,
    /// A timer or histogram: observations.
    Observer,
}

/// How an observer is exported.
#[derive(Debug, Clone, PartialEq)]
pub enum Observer {
    /// A histogram with these upper bounds.
    Histogram(Vec<f64>),
    /// A summary of sum and count.
    Summary,
}

/// What a stat becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped {
    /// The Prometheus metric's name.
    pub name: String,
    /// Its labels, in the mapping's order of names (sorted).
    pub labels: Vec<(String, String)>,
    /// A factor every value is multiplied by (`scale`).
    pub scale: Option<f64>,
    /// How an observer is exported.
    pub observer: Observer,
    /// The metric's help text.
    pub help: Option<String>,
}

/// A parsed mapping file.
#[derive(Debug)]
pub struct StatsdMapping {
    globs: Vec<Mapping>,
    regexes: Vec<(Regex, Mapping)>,
    default_observer: Option<ObserverType>,
    default_buckets: Option<Vec<f64>>,
}

#[derive(Debug)]
struct Mapping {
    pattern: Vec<String>,
    name: String,
    labels: BTreeMap<String, String>,
    kind: Option<StatKind>,
    drop: bool,
    observer: Option<ObserverType>,
    buckets: Option<Vec<f64>>,
    scale: Option<f64>,
    help: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ObserverType {
    Histogram,
    Summary,
    #[serde(rename = "")]
    Unset,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    #[serde(default)]
    defaults: DefaultsYaml,
    #[serde(default)]
    mappings: Vec<MappingYaml>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsYaml {
    observer_type: Option<ObserverType>,
    timer_type: Option<ObserverType>,
    match_type: Option<String>,
    // Read for compatibility: this file's globs always follow the file's order.
    #[allow(dead_code)]
    glob_disable_ordering: Option<bool>,
    buckets: Option<Vec<f64>>,
    histogram_options: Option<HistogramOptions>,
    // Accepted and unused: series never expire here, summaries have no quantiles.
    #[allow(dead_code)]
    ttl: Option<serde_yaml_ng::Value>,
    #[allow(dead_code)]
    quantiles: Option<serde_yaml_ng::Value>,
    #[allow(dead_code)]
    summary_options: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Default, Deserialize)]
struct HistogramOptions {
    buckets: Option<Vec<f64>>,
    // Native histograms are not exported; accepted for compatibility.
    #[allow(dead_code)]
    native_histogram_bucket_factor: Option<f64>,
    #[allow(dead_code)]
    native_histogram_max_buckets: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MappingYaml {
    #[serde(rename = "match")]
    pattern: String,
    match_type: Option<String>,
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    match_metric_type: Option<String>,
    action: Option<String>,
    observer_type: Option<ObserverType>,
    timer_type: Option<ObserverType>,
    buckets: Option<Vec<f64>>,
    histogram_options: Option<HistogramOptions>,
    scale: Option<f64>,
    help: Option<String>,
    // Accepted and unused, as in the defaults.
    #[allow(dead_code)]
    ttl: Option<serde_yaml_ng::Value>,
    #[allow(dead_code)]
    quantiles: Option<serde_yaml_ng::Value>,
    #[allow(dead_code)]
    summary_options: Option<serde_yaml_ng::Value>,
    #[allow(dead_code)]
    honor_labels: Option<bool>,
}

/// Whether `s` is a valid label name (statsd_exporter's rule: two characters at least).
fn label_name_ok(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.len() >= 2
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `s` is a valid metric name template: letters, digits, `_` and `$N`.
fn name_template_ok(s: &str) -> bool {
    let plain: String = expand_glob(s, &[]);
    !s.is_empty()
        && !plain.starts_with(|c: char| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '{' || c == '}')
}

/// One mapping of the file, checked (`at` names it in errors); its pattern is the
/// caller's to compile.
fn mapping_entry(at: &str, m: MappingYaml) -> Result<Mapping, String> {
    let drop = match m.action.as_deref() {
        None | Some("map") => false,
        Some("drop") => true,
        Some(other) => return Err(format!("{at}: action {other:?}: map or drop")),
    };
    let name = match (m.name, drop) {
        (Some(n), _) => n,
        (None, true) => String::new(),
        (None, false) => return Err(format!("{at}: name: missing")),
    };
    if !drop && !name_template_ok(&name) {
        return Err(format!(
            "{at}: name {name:?}: letters, digits, _ and $N captures only, not starting with a digit"
        ));
    }
    let templates = std::iter::once(&name).chain(m.labels.values());
    if let Some(t) = templates.into_iter().find(|t| ambiguous_capture(t)) {
        return Err(format!(
            "{at}: {t:?}: a $N capture followed by a letter, digit or _ reads differently by glob and by regex: write ${{N}}"
        ));
    }
    if let Some(bad) = m.labels.keys().find(|k| !label_name_ok(k)) {
        return Err(format!(
            "{at}: label {bad:?}: a letter or _, then letters, digits or _ (two characters at least)"
        ));
    }
    let kind = match m.match_metric_type.as_deref() {
        None | Some("") => None,
        Some("counter") => Some(StatKind::Counter),
        Some("gauge") => Some(StatKind::Gauge),
        Some("observer" | "timer") => Some(StatKind::Observer),
        Some(other) => {
            return Err(format!(
                "{at}: match_metric_type {other:?}: counter, gauge or observer"
            ))
        }
    };
    if let Some(s) = m.scale.filter(|s| !s.is_finite()) {
        return Err(format!("{at}: scale {s}: not a number"));
    }
    let buckets = m.histogram_options.and_then(|h| h.buckets).or(m.buckets);
    if let Some(b) = &buckets {
        buckets_ok(b).map_err(|e| format!("{at}: {e}"))?;
    }
    let observer = m
        .observer_type
        .or(m.timer_type)
        .filter(|t| *t != ObserverType::Unset);
    Ok(Mapping {
        pattern: Vec::new(),
        name,
        labels: m.labels,
        kind,
        drop,
        observer,
        buckets,
        scale: m.scale,
        help: m.help,
    })
}

impl StatsdMapping {
    /// Parses a mapping file's text; an error names the mapping (by index and
    /// `match`) and what is wrong with it.
    pub fn parse(text: &str) -> Result<StatsdMapping, String> {
        let file: FileYaml = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
        let defaults = file.defaults;
        let default_match = defaults.match_type.clone().unwrap_or_else(|| "glob".into());
        let default_observer = defaults
            .observer_type
            .or(defaults.timer_type)
            .filter(|t| *t != ObserverType::Unset);
        let default_buckets = defaults
            .histogram_options
            .and_then(|h| h.buckets)
            .or(defaults.buckets);
        if let Some(b) = &default_buckets {
            buckets_ok(b).map_err(|e| format!("defaults: {e}"))?;
        }
        let mut mapping = StatsdMapping {
            globs: Vec::new(),
            regexes: Vec::new(),
            default_observer,
            default_buckets,
        };
        for (i, m) in file.mappings.into_iter().enumerate() {
            let at = format!("mappings[{i}] (match {:?})", m.pattern);
            let (pattern_text, match_type) = (m.pattern.clone(), m.match_type.clone());
            let entry = mapping_entry(&at, m)?;
            match match_type.as_deref().unwrap_or(&default_match) {
                "glob" | "" => {
                    let pattern: Vec<String> =
                        pattern_text.split('.').map(str::to_string).collect();
                    if pattern
                        .iter()
                        .any(|c| c.is_empty() || (c.contains('*') && c != "*"))
                    {
                        return Err(format!(
                            "{at}: not a glob: each dotted part is a name or a whole *"
                        ));
                    }
                    mapping.globs.push(Mapping { pattern, ..entry });
                }
                "regex" => {
                    let re = Regex::new(&pattern_text).map_err(|e| format!("{at}: {e}"))?;
                    mapping.regexes.push((re, entry));
                }
                other => return Err(format!("{at}: match_type {other:?}: glob or regex")),
            }
        }
        Ok(mapping)
    }

    /// What the stat `name` of `kind` becomes: `None` when a mapping drops it.
    pub fn map(&self, name: &str, kind: StatKind) -> Option<Mapped> {
        let fits = |m: &Mapping| m.kind.is_none_or(|k| k == kind);
        let parts: Vec<&str> = name.split('.').collect();
        for m in self.globs.iter().filter(|m| fits(m)) {
            if m.pattern.len() != parts.len() {
                continue;
            }
            let mut captures = Vec::new();
            let matched = m.pattern.iter().zip(&parts).all(|(p, part)| {
                if p == "*" {
                    captures.push(*part);
                    true
                } else {
                    p == part
                }
            });
            if matched {
                return self.mapped(m, |t| expand_glob(t, &captures));
            }
        }
        for (re, m) in self.regexes.iter().filter(|(_, m)| fits(m)) {
            if let Some(caps) = re.captures(name) {
                return self.mapped(m, |t| {
                    let mut out = String::new();
                    caps.expand(t, &mut out);
                    out
                });
            }
        }
        Some(Mapped {
            name: escape(name),
            labels: Vec::new(),
            scale: None,
            observer: self.observer(None, None),
            help: None,
        })
    }

    fn mapped(&self, m: &Mapping, expand: impl Fn(&str) -> String) -> Option<Mapped> {
        if m.drop {
            return None;
        }
        // Escaped as statsd_exporter escapes them: a capture may hold any character.
        let name = escape(&expand(&m.name));
        if name.is_empty() {
            return None;
        }
        Some(Mapped {
            name,
            labels: (m.labels.iter())
                .map(|(k, v)| (k.clone(), expand(v)))
                .collect(),
            scale: m.scale,
            observer: self.observer(m.observer, m.buckets.as_ref()),
            help: m.help.clone(),
        })
    }

    fn observer(&self, kind: Option<ObserverType>, buckets: Option<&Vec<f64>>) -> Observer {
        match kind.or(self.default_observer) {
            Some(ObserverType::Histogram) => Observer::Histogram(
                (buckets.or(self.default_buckets.as_ref()))
                    .cloned()
                    .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec()),
            ),
            _ => Observer::Summary,
        }
    }
}

/// Whether `template` has `$N` followed by a word character (`$1_x`): statsd_exporter
/// reads that as a capture named `1_x`, which is refused here for `${1}_x`.
fn ambiguous_capture(template: &str) -> bool {
    let b = template.as_bytes();
    (0..b.len()).any(|i| {
        b[i] == b'$' && b.get(i + 1).is_some_and(u8::is_ascii_digit) && {
            let end = (i + 1..b.len())
                .find(|&j| !b[j].is_ascii_digit())
                .unwrap_or(b.len());
            b.get(end)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
        }
    })
}

/// Whether `b` are bucket bounds: finite and increasing.
fn buckets_ok(b: &[f64]) -> Result<(), String> {
    let increasing = b.windows(2).all(|w| w[0] < w[1]);
    if b.is_empty() || !increasing || b.iter().any(|x| !x.is_finite()) {
        return Err("buckets: must be finite and increasing".into());
    }
    Ok(())
}

/// `template` with `$N` and `${N}` replaced by the glob's captures (1-based; one that
/// does not exist is empty).
fn expand_glob(template: &str, captures: &[&str]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (digits, skip) = match after.strip_prefix('{') {
            Some(inner) => match inner.find('}') {
                Some(end) => (&inner[..end], end + 2),
                None => ("", 0),
            },
            None => {
                let n = after.bytes().take_while(u8::is_ascii_digit).count();
                (&after[..n], n)
            }
        };
        match digits.parse::<usize>() {
            Ok(n) if skip > 0 => {
                out.push_str(
                    n.checked_sub(1)
                        .and_then(|i| captures.get(i))
                        .unwrap_or(&""),
                );
                rest = &after[skip..];
            }
            _ => {
                out.push('$');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A statsd name as a Prometheus name: every character outside `[a-zA-Z0-9_]` made
/// `_`, and `_` before a leading digit.
pub fn escape(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mappings envoyproxy/ratelimit and Envoy Gateway ship, in this project's
    /// own file (`assets/envoy-statsd-mapping.yaml`).
    fn envoy() -> StatsdMapping {
        StatsdMapping::parse(include_str!("../assets/envoy-statsd-mapping.yaml")).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The name and labels `stat` (a counter) maps to.
    fn named(m: &StatsdMapping, stat: &str) -> (String, Vec<(String, String)>) {
        let mapped = m.map(stat, StatKind::Counter).unwrap();
        (mapped.name, mapped.labels)
    }

    #[test]
    fn a_one_key_descriptor_maps_by_glob_and_a_longer_one_by_regex() {
        let m = envoy();
        let stat = "ratelimit.service.rate_limit.default.header_x-user-id_foo.total_hits";
        let one = [("domain", "default"), ("key1", "header_x-user-id_foo")];
        let name = "ratelimit_service_rate_limit_total_hits";
        assert_eq!(named(&m, stat), (name.into(), labels(&one)));
        // Three levels: the third and later are not labels.
        let stat = "ratelimit.service.rate_limit.d.k1_a.k2_b.k3.over_limit";
        let three = [("domain", "d"), ("key1", "k1_a"), ("key2", "k2_b")];
        let name = "ratelimit_service_rate_limit_over_limit";
        assert_eq!(named(&m, stat), (name.into(), labels(&three)));
    }

    #[test]
    fn server_stats_map_with_their_method_and_the_rest_are_escaped() {
        let m = envoy();
        let t = (m.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            StatKind::Observer,
        ))
        .unwrap();
        assert_eq!(t.name, "ratelimit_service_response_time_seconds");
        assert_eq!(t.labels, labels(&[("grpc_method", "ShouldRateLimit")]));
        assert_eq!(t.scale, Some(0.001));
        assert_eq!(t.observer, Observer::Histogram(DEFAULT_BUCKETS.to_vec()));
        let stat = "ratelimit.service.call.should_rate_limit.redis_error";
        let name = "ratelimit_service_should_rate_limit_error";
        assert_eq!(
            named(&m, stat),
            (name.into(), labels(&[("err_type", "redis_error")]))
        );
        // A counter mapping does not take a gauge of the same name.
        let g = m
            .map("ratelimit.service.config_load_success", StatKind::Gauge)
            .unwrap();
        assert_eq!(
            (g.name.as_str(), g.labels.len()),
            ("ratelimit_service_config_load_success", 0)
        );
        let stat = "ratelimit.service.rate_limit.d.domain_not_found";
        let name = "ratelimit_service_rate_limit_d_domain_not_found";
        assert_eq!(named(&m, stat), (name.into(), vec![]));
        assert_eq!(escape("ratelimit.go.heap-Alloc"), "ratelimit_go_heap_Alloc");
        assert_eq!(escape("9lives"), "_9lives");
    }

    #[test]
    fn globs_come_before_regexes_and_the_first_of_each_wins() {
        let m = StatsdMapping::parse(
            r#"
mappings:
  - match: 'a\.(.*)'
    match_type: regex
    name: "by_regex"
    labels: {rest: "$1"}
  - match: "a.*"
    name: "first_$1"
  - match: "a.b"
    name: "second"
  - match: "a.*.c"
    action: drop
  - match: "x.*.*"
    name: "x"
    labels: {one: "${1}", three: "$3"}
"#,
        )
        .unwrap();
        assert_eq!(m.map("a.b", StatKind::Counter).unwrap().name, "first_b");
        // Components: an empty one is one, and the count must match.
        assert_eq!(m.map("a.", StatKind::Counter).unwrap().name, "first_");
        let r = m.map("a.b.d.e", StatKind::Counter).unwrap();
        assert_eq!(
            (r.name.as_str(), r.labels),
            ("by_regex", labels(&[("rest", "b.d.e")]))
        );
        assert_eq!(m.map("a.b.c", StatKind::Counter), None);
        // A capture's characters are escaped in the name.
        assert_eq!(
            m.map("a.my-domain", StatKind::Counter).unwrap().name,
            "first_my_domain"
        );
        let x = m.map("x.p.q", StatKind::Gauge).unwrap();
        assert_eq!(x.labels, labels(&[("one", "p"), ("three", "")]));
        // Without a mapping's type or the defaults', an observer is a summary.
        assert_eq!(x.observer, Observer::Summary);
    }

    #[test]
    fn bad_mappings_are_refused_by_index_and_match() {
        for (yaml, expect) in [
            (
                "mappings: [{match: 'a.b*', name: x}]",
                "mappings[0] (match \"a.b*\"): not a glob",
            ),
            (
                "mappings: [{match: 'a', name: x}, {match: 'b'}]",
                "mappings[1] (match \"b\"): name: missing",
            ),
            ("mappings: [{match: 'a', name: '9x'}]", "name \"9x\""),
            (
                "mappings: [{match: 'a', name: x, labels: {a: v}}]",
                "label \"a\"",
            ),
            (
                "mappings: [{match: '(', match_type: regex, name: x}]",
                "mappings[0] (match \"(\")",
            ),
            (
                "mappings: [{match: 'a', name: x, match_metric_type: histo}]",
                "match_metric_type \"histo\"",
            ),
            (
                "mappings: [{match: 'a', name: x, buckets: [1, 0.5]}]",
                "buckets: must be finite and increasing",
            ),
            (
                "defaults: {buckets: [1, .nan]}\nmappings: []",
                "defaults: buckets: must be finite",
            ),
            ("mappings: [{match: 'a.*', name: 'x_$1_y'}]", "write ${N}"),
            (
                "mappings: [{match: 'a', name: x, colour: red}]",
                "unknown field `colour`",
            ),
        ] {
            let err = StatsdMapping::parse(yaml).unwrap_err();
            assert!(err.contains(expect), "{yaml}: {err}");
        }
    }
}
