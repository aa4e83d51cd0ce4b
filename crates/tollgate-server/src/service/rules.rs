//! Rule files: Envoy ratelimit config documents (`domain` + nested `descriptors`),
//! loaded unchanged, with tollgate's `policies:` extension; and descriptor matching.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use tollgate::{KeyedLimiter, KeyedOptions, Policy, RuleSet};

/// A rule file or directory that does not load, naming the file, line and field.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The rule file that failed.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The YAML is malformed or a field is invalid; the message carries line and column.
    #[error("{path}: {message}")]
    Invalid {
        /// The file (or `<built-in>`).
        path: String,
        /// What is wrong, with its location.
        message: String,
    },
}

// --- The document, as written (Envoy's schema plus `policies`). ---

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    domain: String,
    #[serde(default)]
    descriptors: Vec<DescriptorDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorDoc {
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    rate_limit: Option<RateLimitDoc>,
    #[serde(default)]
    policies: Option<Vec<SpecDoc>>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted for compatibility (Envoy's per-descriptor metrics); no effect.
    #[serde(default)]
    #[allow(dead_code)]
    detailed_metric: bool,
    #[serde(default)]
    descriptors: Vec<DescriptorDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitDoc {
    #[serde(default)]
    unit: Option<Unit>,
    #[serde(default)]
    requests_per_unit: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<ReplacesDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesDoc {
    name: String,
}

/// Envoy's units: a clock-aligned fixed window of one unit (month = 30 days, year =
/// 365 days, as Envoy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// One second.
    #[serde(alias = "SECOND")]
    Second,
    /// One minute.
    #[serde(alias = "MINUTE")]
    Minute,
    /// One hour.
    #[serde(alias = "HOUR")]
    Hour,
    /// One day.
    #[serde(alias = "DAY")]
    Day,
    /// Seven days.
    #[serde(alias = "WEEK")]
    Week,
    /// 30 days.
    #[serde(alias = "MONTH")]
    Month,
    /// 365 days.
    #[serde(alias = "YEAR")]
    Year,
}

impl Unit {
    /// The window as a duration spec.
    pub fn window(self) -> &'static str {
        match self {
            Unit::Second => "1s",
            Unit::Minute => "1m",
            Unit::Hour => "1h",
            Unit::Day => "1d",
            Unit::Week => "7d",
            Unit::Month => "30d",
            Unit::Year => "365d",
        }
    }

    /// The name Envoy's API uses.
    pub fn envoy_name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }
}

/// A policy spec, parsed while the YAML is read so that its error carries a location.
#[derive(Debug)]
struct SpecDoc(Policy);

impl<'de> Deserialize<'de> for SpecDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<Policy>()
            .map(SpecDoc)
            .map_err(serde::de::Error::custom)
    }
}

// --- The loaded form. ---

/// A limit attached to a descriptor node: its rule set and the per-key limiter that
/// keeps its counters (one counter per distinct descriptor value).
#[derive(Debug)]
pub struct Limit {
    /// Where it was defined: `domain/key=value/key2`.
    pub path: String,
    /// Envoy's `rate_limit.name`, if given.
    pub name: Option<String>,
    /// Names of limits this one replaces when both apply.
    pub replaces: Vec<String>,
    /// Report, never reject.
    pub shadow: bool,
    /// `None` for `unlimited: true` and for `requests_per_unit: 0`.
    pub rules: Option<RuleSet>,
    /// The rule set's policies as specs (for responses, computed once).
    pub specs: Option<Vec<String>>,
    /// `requests_per_unit: 0` (Envoy's block list): every request is over the limit.
    pub deny: bool,
    /// Envoy's unit and requests per unit, when written that way (for Envoy's API).
    pub envoy: Option<(Unit, u64)>,
    /// The counters when they live in this process (memory store), one state per key.
    pub limiter: Option<KeyedLimiter<String>>,
    /// The counters when they live in Redis: made on first use, and kept with the
    /// limit across reloads that leave its definition unchanged.
    pub redis: std::sync::OnceLock<tollgate::AnyLimiter>,
}

impl Limit {
    /// Whether two limits are defined alike (so one's counters serve the other).
    pub fn same_definition(&self, other: &Limit) -> bool {
        self.path == other.path
            && self.name == other.name
            && self.replaces == other.replaces
            && self.shadow == other.shadow
            && self.rules == other.rules
            && self.envoy == other.envoy
            && self.deny == other.deny
    }
}

#[derive(Debug)]
enum ValueMatch {
    Exact(String),
    Prefix(String),
}

#[derive(Debug)]
struct Node {
    key: String,
    value: Option<ValueMatch>,
    limit: Option<Arc<Limit>>,
    children: Vec<Node>,
}

/// All loaded rules, by domain.
#[derive(Debug, Default)]
pub struct DescriptorRules {
    domains: HashMap<String, Vec<Node>>,
    /// Where each domain came from (for errors and `/v1/config`).
    sources: HashMap<String, String>,
}

/// The example rule set compiled into the binary.
pub const BUILT_IN: &str = include_str!("../../config/example-rules.yaml");

impl DescriptorRules {
    /// Loads rule files: each path is a YAML file or a directory of them (`.yaml`,
    /// `.yml`, in name order). Two documents may not define the same domain.
    pub fn load(paths: &[PathBuf], options: KeyedOptions) -> Result<Self, RulesError> {
        let mut files = Vec::new();
        for path in paths {
            if path.is_dir() {
                let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|source| RulesError::Io {
                        path: path.clone(),
                        source,
                    })?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                    })
                    .collect();
                entries.sort();
                files.extend(entries);
            } else {
                files.push(path.clone());
            }
        }
        let mut rules = DescriptorRules::default();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| RulesError::Io {
                path: file.clone(),
                source,
            })?;
            rules.add(&text, &file.display().to_string(), options)?;
        }
        Ok(rules)
    }

    /// The built-in example rules.
    pub fn built_in(options: KeyedOptions) -> Self {
        let mut rules = DescriptorRules::default();
        rules
            .add(BUILT_IN, "<built-in>", options)
            .expect("the built-in rules are valid");
        rules
    }

    /// Adds one document's text, from `source` (a path, for errors).
    pub fn add(
        &mut self,
        text: &str,
        source: &str,
        options: KeyedOptions,
    ) -> Result<(), RulesError> {
        let invalid = |message: String| RulesError::Invalid {
            path: source.to_string(),
            message,
        };
        let doc: Document = serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if doc.domain.trim().is_empty() {
            return Err(invalid("domain: must not be empty".into()));
        }
        if let Some(other) = self.sources.get(&doc.domain) {
            return Err(invalid(format!(
                "domain '{}' is already defined in {other}",
                doc.domain
            )));
        }
        let nodes = doc
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(i, d)| build(d, &doc.domain, &format!("descriptors[{i}]"), options))
            .collect::<Result<Vec<_>, String>>()
            .map_err(invalid)?;
        self.sources.insert(doc.domain.clone(), source.to_string());
        self.domains.insert(doc.domain, nodes);
        Ok(())
    }

    /// The domains loaded, with their sources.
    pub fn domains(&self) -> impl Iterator<Item = (&str, &str)> {
        self.sources.iter().map(|(d, s)| (d.as_str(), s.as_str()))
    }

    /// Takes over the limits of `old` whose definition is unchanged (same descriptor
    /// path, policies, name, replaces, shadow mode), with their counters: a reload
    /// keeps the state of unchanged rules.
    pub fn adopt(&mut self, old: &DescriptorRules) {
        let mut previous: HashMap<String, Arc<Limit>> = HashMap::new();
        for domain in old.domains.keys() {
            for l in old.limits(domain) {
                previous.insert(l.path.clone(), l);
            }
        }
        fn walk(nodes: &mut [Node], previous: &HashMap<String, Arc<Limit>>) {
            for n in nodes {
                if let Some(limit) = &n.limit {
                    if let Some(old) = previous
                        .get(&limit.path)
                        .filter(|o| o.same_definition(limit))
                    {
                        n.limit = Some(old.clone());
                    }
                }
                walk(&mut n.children, previous);
            }
        }
        for nodes in self.domains.values_mut() {
            walk(nodes, &previous);
        }
    }

    /// Every limit of a domain, depth first.
    pub fn limits(&self, domain: &str) -> Vec<Arc<Limit>> {
        fn walk(nodes: &[Node], out: &mut Vec<Arc<Limit>>) {
            for n in nodes {
                out.extend(n.limit.clone());
                walk(&n.children, out);
            }
        }
        let mut out = Vec::new();
        if let Some(nodes) = self.domains.get(domain) {
            walk(nodes, &mut out);
        }
        out
    }

    /// The limit for a descriptor (its entries in order), as Envoy matches it: each
    /// entry must match a node at its depth (an exact value first, then a `*`
    /// wildcard, then a node without a value), and the limit is that of the node the
    /// last entry matches. Also returns the counter key: the domain and every
    /// entry's key and value.
    pub fn find(&self, domain: &str, entries: &[(String, String)]) -> Option<(Arc<Limit>, String)> {
        let mut nodes = self.domains.get(domain)?;
        let mut found = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = nodes
                .iter()
                .find(|n| n.key == *key && matches!(&n.value, Some(ValueMatch::Exact(v)) if v == value))
                .or_else(|| {
                    nodes.iter().find(|n| {
                        n.key == *key && matches!(&n.value, Some(ValueMatch::Prefix(p)) if value.starts_with(p.as_str()))
                    })
                })
                .or_else(|| nodes.iter().find(|n| n.key == *key && n.value.is_none()))?;
            if i == entries.len() - 1 {
                found = node.limit.clone();
            }
            nodes = &node.children;
        }
        Some((found?, counter_key(domain, entries)))
    }

    /// Whether a domain is loaded.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }
}

/// The counter of a descriptor: its domain and every entry's key and value.
pub fn counter_key(domain: &str, entries: &[(String, String)]) -> String {
    let mut counter = String::with_capacity(64);
    counter.push_str(domain);
    for (k, v) in entries {
        counter.push('\u{1f}');
        counter.push_str(k);
        counter.push('=');
        counter.push_str(v);
    }
    counter
}

/// A limit for a request's own override (Envoy's per-descriptor `limit`): a
/// clock-aligned fixed window of `n` per `unit`.
pub fn override_limit(unit: Unit, n: u64, options: KeyedOptions) -> Result<Arc<Limit>, String> {
    let spec = format!("fixed-window:limit={n},window={}", unit.window());
    let policy: Policy = spec.parse().map_err(|e| format!("limit override: {e}"))?;
    Ok(limit_of(
        format!("override/{n}/{}", unit.envoy_name()),
        None,
        vec![],
        false,
        Some(policy.into()),
        Some((unit, n)),
        options,
    ))
}

/// One descriptor of a rule file (`at` names it in errors) with its children; `path`
/// is its parent's descriptor path.
fn build(d: DescriptorDoc, path: &str, at: &str, options: KeyedOptions) -> Result<Node, String> {
    if d.key.trim().is_empty() {
        return Err(format!("{at}.key: must not be empty"));
    }
    let node_path = match &d.value {
        Some(v) => format!("{path}/{}={v}", d.key),
        None => format!("{path}/{}", d.key),
    };
    let limit = match (d.rate_limit, d.policies) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: give either rate_limit or policies, not both"
            ))
        }
        (None, None) => None,
        (None, Some(specs)) => {
            if specs.is_empty() {
                return Err(format!("{at}.policies: needs at least one policy spec"));
            }
            let rules = RuleSet::new(specs.into_iter().map(|s| s.0).collect())
                .map_err(|e| format!("{at}.policies: {e}"))?;
            let limit = limit_of(
                node_path.clone(),
                None,
                vec![],
                d.shadow_mode,
                Some(rules),
                None,
                options,
            );
            Some(limit)
        }
        (Some(rl), None) => Some(envoy_limit(rl, &node_path, d.shadow_mode, at, options)?),
    };
    let children = d
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, c)| build(c, &node_path, &format!("{at}.descriptors[{i}]"), options))
        .collect::<Result<_, _>>()?;
    Ok(Node {
        key: d.key,
        value: d.value.map(value_match),
        limit,
        children,
    })
}

/// An Envoy `rate_limit`: `unlimited`, a block list (`requests_per_unit: 0`), or a
/// clock-aligned fixed window of one unit.
fn envoy_limit(
    rl: RateLimitDoc,
    node_path: &str,
    shadow: bool,
    at: &str,
    options: KeyedOptions,
) -> Result<Arc<Limit>, String> {
    let replaces = rl.replaces.into_iter().map(|r| r.name).collect();
    let path = node_path.to_string();
    if rl.unlimited {
        return Ok(limit_of(
            path, rl.name, replaces, shadow, None, None, options,
        ));
    }
    let unit = rl.unit.ok_or_else(|| {
        format!("{at}.rate_limit.unit: missing (second, minute, hour, day, month or year)")
    })?;
    let n = rl
        .requests_per_unit
        .ok_or_else(|| format!("{at}.rate_limit.requests_per_unit: missing"))?;
    if n == 0 {
        // Envoy's block list: nothing is ever admitted.
        let mut limit = limit_of(
            path,
            rl.name,
            replaces,
            shadow,
            None,
            Some((unit, 0)),
            options,
        );
        Arc::get_mut(&mut limit).expect("new").deny = true;
        return Ok(limit);
    }
    let spec = format!("fixed-window:limit={n},window={}", unit.window());
    let policy: Policy = spec
        .parse()
        .map_err(|e| format!("{at}.rate_limit.requests_per_unit: {e}"))?;
    let rules = Some(policy.into());
    Ok(limit_of(
        path,
        rl.name,
        replaces,
        shadow,
        rules,
        Some((unit, n)),
        options,
    ))
}

/// A value to match: a trailing `*` makes it a prefix.
fn value_match(v: String) -> ValueMatch {
    match v.strip_suffix('*') {
        Some(prefix) => ValueMatch::Prefix(prefix.to_string()),
        None => ValueMatch::Exact(v),
    }
}

fn limit_of(
    path: String,
    name: Option<String>,
    replaces: Vec<String>,
    shadow: bool,
    rules: Option<RuleSet>,
    envoy: Option<(Unit, u64)>,
    options: KeyedOptions,
) -> Arc<Limit> {
    let limiter = rules
        .clone()
        .map(|r| KeyedLimiter::with_options(r, options, tollgate::MonotonicClock::new()));
    Arc::new(Limit {
        path,
        name,
        replaces,
        shadow,
        specs: rules
            .as_ref()
            .map(|r| r.policies().iter().map(ToString::to_string).collect()),
        rules,
        deny: false,
        envoy,
        limiter,
        redis: std::sync::OnceLock::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rules(text: &str) -> Result<DescriptorRules, RulesError> {
        let mut r = DescriptorRules::default();
        r.add(text, "test.yaml", KeyedOptions::default())?;
        Ok(r)
    }

    #[test]
    fn descriptors_match_exact_values_before_wildcards_before_any_value() {
        let r = rules(
            "domain: d
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /static/*
    rate_limit: {unlimited: true}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: user
        policies: ['gcra:rate=1/s,burst=2']
",
        )
        .unwrap();
        let path_of = |v: &str| {
            r.find("d", &entries(&[("path", v)]))
                .unwrap()
                .0
                .path
                .clone()
        };
        assert_eq!(path_of("/login"), "d/path=/login");
        assert_eq!(path_of("/static/app.js"), "d/path=/static/*");
        assert_eq!(path_of("/other"), "d/path");
        assert!(r
            .find("d", &entries(&[("path", "/static/x")]))
            .unwrap()
            .0
            .rules
            .is_none());
        // A nested limit needs the whole chain; the parent alone has none here.
        let (limit, counter) = r
            .find("d", &entries(&[("tenant", "t1"), ("user", "u1")]))
            .unwrap();
        assert_eq!(
            limit.specs.as_deref(),
            Some(&["gcra:rate=1/s,burst=2".to_string()][..])
        );
        assert_eq!(
            counter,
            counter_key("d", &entries(&[("tenant", "t1"), ("user", "u1")]))
        );
        assert!(r.find("d", &entries(&[("tenant", "t1")])).is_none());
        assert!(r.find("d", &entries(&[("user", "u1")])).is_none());
        assert!(r.find("other", &entries(&[("path", "/login")])).is_none());
    }

    #[test]
    fn bad_documents_are_refused_with_the_place_named() {
        let e = rules("domain: ''\ndescriptors: []\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("test.yaml: domain: must not be empty"), "{e}");
        let e = rules("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("test.yaml") && e.contains("fortnight"), "{e}");
        let e = rules("domain: d\ndescriptors:\n  - key: k\n    policies: ['gcra:rate=0/s']\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("test.yaml") && e.contains("rate"), "{e}");
        let mut r = rules("domain: d\ndescriptors: []\n").unwrap();
        let e = r
            .add(
                "domain: d\ndescriptors: []\n",
                "two.yaml",
                KeyedOptions::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("domain 'd' is already defined in test.yaml"),
            "{e}"
        );
    }
}
