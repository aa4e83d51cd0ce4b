//! Rule files: Envoy ratelimit config documents (`domain` + nested `descriptors`),
//! loaded unchanged, with tollgate's `policies:` extension; and descriptor matching.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use tollgate::headers::PolicyHeader;
use tollgate::{AnyLimiter, Policy, RuleSet};
use tollgate_runtime::config::RejectedHits;

use crate::counters::Counters;

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
pub(crate) struct Document {
    pub(crate) domain: String,
    #[serde(default)]
    pub(crate) descriptors: Vec<DescriptorDoc>,
    /// Envoy rate limit quota buckets (RLQS) and their budgets.
    #[serde(default)]
    pub(crate) quota_buckets: Vec<QuotaBucketDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuotaBucketDoc {
    #[serde(default)]
    name: Option<String>,
    bucket: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    policy: Option<BudgetDoc>,
    #[serde(default)]
    blanket: Option<Blanket>,
    #[serde(default)]
    assignment_ttl: Option<TtlDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DescriptorDoc {
    pub(crate) key: String,
    #[serde(default)]
    pub(crate) value: Option<String>,
    #[serde(default)]
    pub(crate) rate_limit: Option<RateLimitDoc>,
    #[serde(default)]
    pub(crate) policies: Option<Vec<SpecDoc>>,
    #[serde(default)]
    pub(crate) shadow_mode: bool,
    #[serde(default)]
    pub(crate) quota_mode: bool,
    #[serde(default)]
    pub(crate) detailed_metric: bool,
    #[serde(default)]
    pub(crate) value_to_metric: bool,
    #[serde(default)]
    pub(crate) share_threshold: bool,
    /// tollgate's: whether a rejected request's hits count here (default: the
    /// service's `rejected_hits` for `rate_limit`, `not_counted` for `policies`).
    #[serde(default)]
    pub(crate) rejected_hits: Option<RejectedHits>,
    /// Envoy's per-descriptor metadata (returned in its dynamic metadata, which
    /// tollgate does not send): accepted so that such files load; no effect.
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) metadata: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    pub(crate) descriptors: Vec<DescriptorDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateLimitDoc {
    #[serde(default)]
    pub(crate) unit: Option<Unit>,
    #[serde(default)]
    pub(crate) requests_per_unit: Option<u64>,
    #[serde(default)]
    pub(crate) unlimited: bool,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) replaces: Vec<ReplacesDoc>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplacesDoc {
    pub(crate) name: String,
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

    /// The unit's length in microseconds.
    pub fn window_us(self) -> u64 {
        let seconds: u64 = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        };
        seconds * 1_000_000
    }

    /// Time from `now_us` (since the Unix epoch) to the end of its clock-aligned
    /// window of this unit.
    pub fn reset_after_us(self, now_us: u64) -> u64 {
        self.window_us() - now_us % self.window_us()
    }

    /// The unit that states `limit` per `window_us` (a policy's headline limit and
    /// the time it refers to) in Envoy's terms: the window's own unit when it is one,
    /// else the shortest unit in which the sustained rate `limit / window` is at least
    /// one, with the whole requests per unit it makes (at least 1). So
    /// `fixed-window:limit=1000,window=1h` is 1000 per HOUR and `gcra:rate=1/s,burst=2`
    /// (2 per 2 s) is 1 per SECOND. `None` for a limit with no time (`concurrency`).
    ///
    /// ```
    /// use tollgate_service::descriptors::Unit;
    /// assert_eq!(Unit::describing(1000, 3_600_000_000), Some((Unit::Hour, 1000)));
    /// assert_eq!(Unit::describing(2, 2_000_000), Some((Unit::Second, 1)));
    /// assert_eq!(Unit::describing(5, 10_000_000), Some((Unit::Minute, 30)));
    /// assert_eq!(Unit::describing(3, 0), None);
    /// ```
    pub fn describing(limit: u64, window_us: u64) -> Option<(Unit, u64)> {
        const ALL: [Unit; 7] = [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        if window_us == 0 {
            return None;
        }
        if let Some(u) = ALL.into_iter().find(|u| u.window_us() == window_us) {
            return Some((u, limit));
        }
        let per = |u: Unit| u128::from(limit) * u128::from(u.window_us()) / u128::from(window_us);
        let u = (ALL.into_iter().find(|&u| per(u) >= 1)).unwrap_or(Unit::Year);
        Some((u, u64::try_from(per(u)).unwrap_or(u64::MAX).max(1)))
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
pub(crate) struct SpecDoc(Policy);

impl<'de> Deserialize<'de> for SpecDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<Policy>()
            .map(SpecDoc)
            .map_err(serde::de::Error::custom)
    }
}

/// A quota bucket's budget: a policy spec that [`tollgate::quota::Budget::of`] takes,
/// checked while the YAML is read so that its error carries a location.
#[derive(Debug)]
struct BudgetDoc(Policy, tollgate::quota::Budget);

impl<'de> Deserialize<'de> for BudgetDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let SpecDoc(policy) = SpecDoc::deserialize(d)?;
        // Named here: the location serde gives is the rule's, not the field's.
        let budget = tollgate::quota::Budget::of(&policy)
            .map_err(|e| serde::de::Error::custom(format!("policy: {e}")))?;
        Ok(BudgetDoc(policy, budget))
    }
}

/// The longest `assignment_ttl` taken: a share handed out for longer is a share the
/// budget cannot take back for as long.
pub const MAX_ASSIGNMENT_TTL_US: u64 = 3_600_000_000;

/// An `assignment_ttl`: whole seconds from 1 s to 1 h (Envoy reads a time to live in
/// whole seconds), checked while the YAML is read.
#[derive(Debug)]
struct TtlDoc(u64);

impl<'de> Deserialize<'de> for TtlDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let ttl = String::deserialize(d)?;
        let us = tollgate::policy::parse_duration(&ttl).map_err(|e| {
            serde::de::Error::custom(format!(
                "assignment_ttl: {e}; a time to live is whole seconds from 1s to 1h"
            ))
        })?;
        if us % 1_000_000 != 0 || !(1_000_000..=MAX_ASSIGNMENT_TTL_US).contains(&us) {
            return Err(serde::de::Error::custom(format!(
                "assignment_ttl: {ttl}: expected whole seconds from 1s to 1h (Envoy reads a time to live in \
                 whole seconds)"
            )));
        }
        Ok(TtlDoc(us))
    }
}

// --- The loaded form. ---

/// The time to live of a blanket answer (a `blanket:` rule's default
/// `assignment_ttl`, and the `ALLOW_ALL` of a bucket no rule takes): renewed at each
/// report, and replaced at once when its rule changes, so it need not be short.
pub const BLANKET_TTL_US: u64 = 60_000_000;

/// A `quota_buckets` rule: the Envoy quota buckets it takes (by their bucket ids, as
/// the filter's `bucket_id_builder` makes them: every key named, each value exact or a
/// `*` pattern) and what their Envoys are told: a budget each of those buckets divides
/// among the Envoys that report on it (each distinct bucket id is a budget of its
/// own), or a blanket rule.
#[derive(Debug)]
pub struct QuotaRule {
    /// `name`, else the bucket id pattern (`key=value,key=value`).
    pub name: String,
    keys: Vec<(String, ValueMatch)>,
    /// What its buckets' Envoys are told.
    pub strategy: QuotaStrategy,
    /// How it is divided (for a blanket rule, only the time to live is read).
    pub settings: tollgate::quota::QuotaSettings,
}

/// What a quota rule tells the Envoys of its buckets.
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaStrategy {
    /// `policy:` a budget divided among them by demand.
    Budget {
        /// The budget's policy, as written.
        policy: Policy,
        /// What it allows, as the division reads it.
        budget: tollgate::quota::Budget,
    },
    /// `blanket:` every request allowed, or every request denied, by each Envoy
    /// (nothing divided, nothing kept in the store).
    Blanket(Blanket),
}

impl std::fmt::Display for QuotaStrategy {
    /// The policy spec, or `allow_all` / `deny_all`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuotaStrategy::Budget { policy, .. } => policy.fmt(f),
            QuotaStrategy::Blanket(b) => f.write_str(b.name()),
        }
    }
}

/// A quota rule's `blanket:` the same answer to every Envoy, as the protocol's
/// blanket rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blanket {
    /// `allow_all` (or Envoy's `ALLOW_ALL`): not limited (e.g. a bucket a later
    /// wildcard rule would take).
    AllowAll,
    /// `deny_all` (or `DENY_ALL`): every request denied, as the Envoy filter's deny
    /// response says.
    DenyAll,
}

impl<'de> Deserialize<'de> for Blanket {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "allow_all" | "ALLOW_ALL" => Ok(Blanket::AllowAll),
            "deny_all" | "DENY_ALL" => Ok(Blanket::DenyAll),
            _ => Err(serde::de::Error::custom(format!(
                "blanket: '{s}': expected allow_all or deny_all (or Envoy's ALLOW_ALL, DENY_ALL)"
            ))),
        }
    }
}

impl Blanket {
    /// As written in the rules.
    pub fn name(self) -> &'static str {
        match self {
            Blanket::AllowAll => "allow_all",
            Blanket::DenyAll => "deny_all",
        }
    }
}

impl QuotaRule {
    fn build(doc: QuotaBucketDoc, at: &str) -> Result<QuotaRule, String> {
        if doc.bucket.is_empty() {
            return Err(format!(
                "{at}.bucket: expected at least one key: value pair (the bucket id's keys, as the Envoy filter's bucket_id_builder makes them)"
            ));
        }
        if let Some((k, _)) = doc
            .bucket
            .iter()
            .find(|(k, v)| k.is_empty() || v.is_empty())
        {
            return Err(format!(
                "{at}.bucket: '{k}': keys and values must not be empty (use \"*\" for any value)"
            ));
        }
        let strategy = match (doc.policy, doc.blanket) {
            (Some(BudgetDoc(policy, budget)), None) => QuotaStrategy::Budget { policy, budget },
            (None, Some(blanket)) => QuotaStrategy::Blanket(blanket),
            // Checked here, not while the YAML is read: serde would locate the error
            // at the list, not at the rule.
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{at}: policy and blanket cannot both be set: a rule divides a budget or is a blanket rule"
                ))
            }
            (None, None) => {
                return Err(format!(
                    "{at}: expected policy (the budget its buckets divide, e.g. \"token-bucket:rate=1000/s\") \
                     or blanket (allow_all or deny_all)"
                ))
            }
        };
        let mut settings = tollgate::quota::QuotaSettings::default();
        if let QuotaStrategy::Blanket(_) = strategy {
            settings.ttl_us = BLANKET_TTL_US;
        }
        if let Some(TtlDoc(us)) = doc.assignment_ttl {
            settings.ttl_us = us;
        }
        let pattern = bucket_text(doc.bucket.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        Ok(QuotaRule {
            name: doc.name.unwrap_or(pattern),
            keys: (doc.bucket.into_iter())
                .map(|(k, v)| (k, ValueMatch::new(v)))
                .collect(),
            strategy,
            settings,
        })
    }

    /// The bucket ids it takes: `key=value,...`, keys in sorted order (values exact
    /// or `*` patterns).
    pub fn pattern(&self) -> String {
        bucket_text(self.keys.iter().map(|(k, m)| (k.as_str(), m.text())))
    }

    /// Whether the bucket `id` is one of this rule's: the same keys, each value
    /// matching.
    pub fn takes(&self, id: &std::collections::BTreeMap<String, String>) -> bool {
        id.len() == self.keys.len()
            && self.keys.iter().zip(id).all(|((k, m), (ik, iv))| {
                k == ik
                    && match m {
                        ValueMatch::Exact(v) => v == iv,
                        ValueMatch::Wildcard { parts, .. } => wildcard_fits(parts, iv),
                    }
            })
    }

    /// Whether this rule takes every bucket `later` would (so `later`, after it,
    /// would never be used): the same keys, each of its values the same as
    /// `later`'s, or a pattern that fits `later`'s value, exact or pattern. (A
    /// pattern fits another's text only if it fits every value that one takes: its
    /// literal parts hold no `*`, so they match only literal text there, and each of
    /// its `*` takes whatever the other's stands for.)
    fn covers(&self, later: &QuotaRule) -> bool {
        self.keys.len() == later.keys.len()
            && self.keys.iter().zip(&later.keys).all(|((k, m), (lk, lm))| {
                k == lk
                    && (m.text() == lm.text()
                        || matches!(m, ValueMatch::Wildcard { parts, .. } if wildcard_fits(parts, lm.text())))
            })
    }
}

/// A bucket id, or a rule's pattern of them, as written in the config dump and the
/// metrics: `key=value,...`.
pub fn bucket_text<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    pairs
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A limit attached to a descriptor node: its rule set and the per-key limiter that
/// keeps its counters (one counter per distinct descriptor value).
#[derive(Debug)]
pub struct DescriptorLimit {
    /// Where it was defined: `domain/key=value/key2`.
    pub path: String,
    /// The same in envoyproxy/ratelimit's form (its statistics and config dump
    /// name descriptors so): `domain.key_value.key2`.
    pub full_key: String,
    /// Envoy's `rate_limit.name`, if given.
    pub name: Option<String>,
    /// Names of limits this one replaces when both apply.
    pub replaces: Vec<String>,
    /// Report, never reject.
    pub shadow: bool,
    /// Envoy's `quota_mode`: an over-limit here fails the request only when every
    /// quota-mode descriptor of the request is over its limit.
    pub quota_mode: bool,
    /// Envoy's `detailed_metric`: statistics per request value, not per rule.
    pub detailed_metric: bool,
    /// Whether a rejected request's hits count, as the descriptor says (`None`: the
    /// default, see [`DescriptorLimit::counts_rejected`]).
    pub rejected_hits: Option<RejectedHits>,
    /// `None` for `unlimited: true` and for `requests_per_unit: 0`.
    pub rules: Option<RuleSet>,
    /// The rule set's policies as specs (for responses, computed once).
    pub specs: Option<Vec<String>>,
    /// What its rate-limit headers say whatever the decision (computed once), named
    /// after the limit (`default` when unnamed).
    pub policy_header: Option<PolicyHeader>,
    /// `requests_per_unit: 0` (Envoy's block list): every request is over the limit.
    pub deny: bool,
    /// Envoy's unit and requests per unit, when written that way (for Envoy's API).
    pub envoy: Option<(Unit, u64)>,
    /// Its counters, one state per key, on the store the rules were loaded for
    /// (`None` when it counts nothing); kept across reloads that leave its
    /// definition unchanged.
    pub limiter: Option<AnyLimiter>,
    /// Its statistics, attached by the service on first use.
    pub stats: std::sync::OnceLock<crate::rule_stats::RuleStats>,
}

impl DescriptorLimit {
    /// Whether a rejected request's hits count here: as the descriptor says, else
    /// `default` for Envoy's `rate_limit` (and a request's own limit override), and
    /// not for tollgate's `policies` (all-or-nothing).
    pub fn counts_rejected(&self, default: RejectedHits) -> bool {
        let chosen = self.rejected_hits.unwrap_or(if self.envoy.is_some() {
            default
        } else {
            RejectedHits::NotCounted
        });
        chosen == RejectedHits::Counted
    }

    /// Whether two limits are defined alike (so one's counters serve the other).
    pub fn same_definition(&self, other: &DescriptorLimit) -> bool {
        self.path == other.path
            && self.name == other.name
            && self.replaces == other.replaces
            && self.shadow == other.shadow
            && self.quota_mode == other.quota_mode
            && self.detailed_metric == other.detailed_metric
            && self.rejected_hits == other.rejected_hits
            && self.rules == other.rules
            && self.envoy == other.envoy
            && self.deny == other.deny
    }
}

/// How a rule's `value` matches a request value: exactly, or as a pattern in which
/// each `*` stands for any run of characters (Envoy's wildcards: `files/*`,
/// `user_*_admin`).
#[derive(Debug)]
enum ValueMatch {
    Exact(String),
    /// The pattern as written and its literal parts between the `*`s.
    Wildcard {
        pattern: String,
        parts: Vec<String>,
    },
}

impl ValueMatch {
    fn new(v: String) -> ValueMatch {
        if v.contains('*') {
            let parts = v.split('*').map(str::to_string).collect();
            ValueMatch::Wildcard { pattern: v, parts }
        } else {
            ValueMatch::Exact(v)
        }
    }

    fn text(&self) -> &str {
        match self {
            ValueMatch::Exact(v) | ValueMatch::Wildcard { pattern: v, .. } => v,
        }
    }
}

/// Whether `value` fits a wildcard's parts: it starts with the first, ends with the
/// last, and holds the middle ones in order between them, without overlap.
fn wildcard_fits(parts: &[String], value: &str) -> bool {
    let (first, rest) = match parts.split_first() {
        Some(p) => p,
        None => return false,
    };
    let Some(mut tail) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return tail.is_empty();
    };
    let Some(inner) = tail.strip_suffix(last.as_str()) else {
        return false;
    };
    tail = inner;
    for part in middle {
        match tail.find(part.as_str()) {
            Some(i) => tail = &tail[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[derive(Debug)]
struct Node {
    key: String,
    value: Option<ValueMatch>,
    limit: Option<Arc<DescriptorLimit>>,
    /// Envoy's `value_to_metric`: statistics name the request's value at this level.
    value_to_metric: bool,
    /// Envoy's `share_threshold` (wildcards only): every value this wildcard matches
    /// counts against one counter.
    share_threshold: bool,
    children: Vec<Node>,
}

/// What a descriptor matched: its limit, the counter it counts on, and, when the
/// rule asks for statistics per value (`detailed_metric`, `value_to_metric`), the
/// name they are kept under (else the limit's path).
#[derive(Debug)]
pub struct Match {
    /// The limit that applies.
    pub limit: Arc<DescriptorLimit>,
    /// The counter key: the domain and every entry (a shared wildcard's entries by
    /// their pattern).
    pub counter: String,
    /// The statistics name when it differs from the limit's path: in tollgate's
    /// path form, and in envoyproxy/ratelimit's dotted form (its `full_key`).
    pub stat_name: Option<(String, String)>,
}

/// All loaded rules, by domain.
#[derive(Debug, Default)]
pub struct DescriptorRules {
    domains: HashMap<String, Vec<Node>>,
    /// Each domain's `quota_buckets`, in file order.
    quota: HashMap<String, Vec<Arc<QuotaRule>>>,
    /// Where each domain came from (for errors and `/v1/config`).
    sources: HashMap<String, String>,
    /// Envoy's `MERGE_DOMAIN_CONFIG`: documents naming a domain already loaded add
    /// their descriptors to it (a duplicate descriptor is still an error).
    merge_domains: bool,
}

/// The example rule set compiled into the binary.
pub const BUILT_IN: &str = include_str!("../config/example-rules.yaml");

impl DescriptorRules {
    /// Loads rule files: each path is a YAML file or a directory of them (`.yaml`,
    /// `.yml`, in name order). Two documents may not define the same domain unless
    /// `merge_domains` (then the second adds its descriptors to the first's).
    pub fn load(
        paths: &[PathBuf],
        counters: &Counters,
        merge_domains: bool,
    ) -> Result<Self, RulesError> {
        let mut files = Vec::new();
        for path in paths {
            if path.is_dir() {
                let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
                    .map_err(|source| RulesError::Io {
                        path: path.clone(),
                        source,
                    })?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    // Hidden files are no rules (an editor's, or a mounted volume's
                    // `..data` machinery), as envoyproxy/ratelimit's
                    // RUNTIME_IGNOREDOTFILES has it.
                    .filter(|p| {
                        matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
                            && !p
                                .file_name()
                                .and_then(|n| n.to_str())
                                .is_some_and(|n| n.starts_with('.'))
                    })
                    .collect();
                entries.sort();
                files.extend(entries);
            } else {
                files.push(path.clone());
            }
        }
        let mut rules = DescriptorRules::empty(merge_domains);
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| RulesError::Io {
                path: file.clone(),
                source,
            })?;
            rules.add(&text, &file.display().to_string(), counters)?;
        }
        Ok(rules)
    }

    /// No rules (what an xDS server's first version replaces); documents added later
    /// with a domain already loaded merge into it when `merge_domains`.
    pub fn empty(merge_domains: bool) -> Self {
        DescriptorRules {
            merge_domains,
            ..DescriptorRules::default()
        }
    }

    /// The built-in example rules (valid; a store that cannot keep one of their
    /// limits, e.g. leases for a sliding log, refuses them).
    pub fn built_in(counters: &Counters) -> Result<Self, RulesError> {
        let mut rules = DescriptorRules::default();
        rules.add(BUILT_IN, "<built-in>", counters)?;
        Ok(rules)
    }

    /// Adds one document's text, from `source` (a path, for errors).
    pub fn add(&mut self, text: &str, source: &str, counters: &Counters) -> Result<(), RulesError> {
        let invalid = |message: String| RulesError::Invalid {
            path: source.to_string(),
            message,
        };
        let doc: Document = serde_yaml_ng::from_str(text).map_err(|e| invalid(e.to_string()))?;
        self.add_document(doc, source, counters)
    }

    /// Adds one document, from `source` (a path or an xDS resource, for errors).
    pub(crate) fn add_document(
        &mut self,
        doc: Document,
        source: &str,
        counters: &Counters,
    ) -> Result<(), RulesError> {
        let invalid = |message: String| RulesError::Invalid {
            path: source.to_string(),
            message,
        };
        if doc.domain.trim().is_empty() {
            return Err(invalid("domain: must not be empty".into()));
        }
        let merging = match self.sources.get(&doc.domain) {
            Some(other) if !self.merge_domains => {
                return Err(invalid(format!(
                    "domain '{}' is already defined in {other}",
                    doc.domain
                )))
            }
            Some(_) => true,
            None => false,
        };
        let existing = self.domains.get(&doc.domain).filter(|_| merging);
        let mut added: Vec<Node> = Vec::with_capacity(doc.descriptors.len());
        for (i, d) in doc.descriptors.into_iter().enumerate() {
            let at = format!("descriptors[{i}]");
            let node = build(d, &doc.domain, &doc.domain, &at, counters).map_err(invalid)?;
            for siblings in existing.into_iter().chain([&added]) {
                refuse_duplicate(siblings, &node, &at).map_err(invalid)?;
            }
            added.push(node);
        }
        let mut quota = Vec::with_capacity(doc.quota_buckets.len());
        for (i, q) in doc.quota_buckets.into_iter().enumerate() {
            let at = format!("quota_buckets[{i}]");
            let rule = QuotaRule::build(q, &at).map_err(invalid)?;
            // The first rule that takes a bucket is used: one after a rule that takes
            // all its buckets is a mistake, not a rule.
            let earlier = (self.quota.get(&doc.domain).into_iter().flatten()).chain(&quota);
            if let Some(e) = earlier.into_iter().find(|e| e.covers(&rule)) {
                return Err(invalid(format!(
                    "{at}.bucket: never used: the earlier rule '{}' takes every bucket \
                     this one would (the first rule that takes a bucket is used)",
                    e.name
                )));
            }
            quota.push(Arc::new(rule));
        }
        self.quota
            .entry(doc.domain.clone())
            .or_default()
            .extend(quota);
        let mut nodes = self.domains.remove(&doc.domain).unwrap_or_default();
        nodes.extend(added);
        let source = match self.sources.get(&doc.domain) {
            Some(first) => format!("{first}, {source}"),
            None => source.to_string(),
        };
        self.sources.insert(doc.domain.clone(), source);
        self.domains.insert(doc.domain, nodes);
        Ok(())
    }

    /// The first `quota_buckets` rule of `domain` that takes the quota bucket `id`.
    pub fn quota_rule(
        &self,
        domain: &str,
        id: &std::collections::BTreeMap<String, String>,
    ) -> Option<&Arc<QuotaRule>> {
        self.quota.get(domain)?.iter().find(|r| r.takes(id))
    }

    /// Every `quota_buckets` rule, by domain.
    pub fn quota_rules(&self) -> impl Iterator<Item = (&str, &Arc<QuotaRule>)> {
        (self.quota.iter()).flat_map(|(d, rules)| rules.iter().map(move |r| (d.as_str(), r)))
    }

    /// The domains loaded, with their sources.
    pub fn domains(&self) -> impl Iterator<Item = (&str, &str)> {
        self.sources.iter().map(|(d, s)| (d.as_str(), s.as_str()))
    }

    /// Takes over the limits of `old` whose definition is unchanged (same descriptor
    /// path, policies, name, replaces, shadow mode), with their counters: a reload
    /// keeps the state of unchanged rules.
    pub fn adopt(&mut self, old: &DescriptorRules) {
        let mut previous: HashMap<String, Arc<DescriptorLimit>> = HashMap::new();
        for domain in old.domains.keys() {
            for l in old.limits(domain) {
                previous.insert(l.path.clone(), l);
            }
        }
        fn walk(nodes: &mut [Node], previous: &HashMap<String, Arc<DescriptorLimit>>) {
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

    /// Every limit of every domain.
    pub fn all_limits(&self) -> Vec<Arc<DescriptorLimit>> {
        (self.domains.keys()).flat_map(|d| self.limits(d)).collect()
    }

    /// The rules in force as envoyproxy/ratelimit's config dump (`/rlconfig`) prints
    /// them: one line per limit, `FULL_KEY: unit=UNIT requests_per_unit=N,
    /// shadow_mode: B, quota_mode: B` (a tollgate `policies:` limit shows its specs
    /// instead of unit and count), domains in name order, descriptors in file order.
    pub fn dump(&self) -> String {
        let mut domains: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        domains.sort_unstable();
        let mut out = String::new();
        for domain in domains {
            for l in self.limits(domain) {
                let counting = match (&l.envoy, &l.specs) {
                    (Some((unit, n)), _) => {
                        format!("unit={} requests_per_unit={n}", unit.envoy_name())
                    }
                    (None, Some(specs)) => format!("policies=[{}]", specs.join(", ")),
                    (None, None) => "unit=UNKNOWN requests_per_unit=0 unlimited".to_string(),
                };
                out.push_str(&format!(
                    "{}: {counting}, shadow_mode: {}, quota_mode: {}\n",
                    l.full_key, l.shadow, l.quota_mode
                ));
            }
        }
        out
    }

    /// Every limit of a domain, depth first.
    pub fn limits(&self, domain: &str) -> Vec<Arc<DescriptorLimit>> {
        fn walk(nodes: &[Node], out: &mut Vec<Arc<DescriptorLimit>>) {
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
    /// entry must match a node at its depth (an exact value first, then the first
    /// wildcard that fits, then a node without a value), and the limit is that of the
    /// node the last entry matches.
    pub fn find(&self, domain: &str, entries: &[(String, String)]) -> Option<Match> {
        let mut nodes = self.domains.get(domain)?;
        let mut matched: Vec<&Node> = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let node = nodes
                .iter()
                .find(|n| n.key == *key && matches!(&n.value, Some(ValueMatch::Exact(v)) if v == value))
                .or_else(|| {
                    nodes.iter().find(|n| {
                        n.key == *key && matches!(&n.value, Some(ValueMatch::Wildcard { parts, .. }) if wildcard_fits(parts, value))
                    })
                })
                .or_else(|| nodes.iter().find(|n| n.key == *key && n.value.is_none()))?;
            matched.push(node);
            nodes = &node.children;
        }
        let limit = matched.last()?.limit.clone()?;
        let shared = matched.iter().any(|n| n.share_threshold);
        let counter = if shared {
            let entries: Vec<(String, String)> = (entries.iter().zip(&matched))
                .map(|((k, v), n)| match (&n.value, n.share_threshold) {
                    (Some(m), true) => (k.clone(), m.text().to_string()),
                    _ => (k.clone(), v.clone()),
                })
                .collect();
            counter_key(domain, &entries)
        } else {
            counter_key(domain, entries)
        };
        let stat_name = (limit.detailed_metric || matched.iter().any(|n| n.value_to_metric))
            .then(|| stat_name(domain, entries, &matched, limit.detailed_metric));
        Some(Match {
            limit,
            counter,
            stat_name,
        })
    }

    /// Whether a domain is loaded.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }
}

/// The statistics name of a matched descriptor, as Envoy builds it: with
/// `detailed_metric`, every entry's request value; else each level's configured
/// value, or the request's value where that level has `value_to_metric`. A shared
/// wildcard is named by its pattern either way. In tollgate's path form
/// (`domain/key=value/...`) and in Envoy's dotted one (`domain.key_value...`, where
/// `detailed_metric` writes `key_` for an empty value).
fn stat_name(
    domain: &str,
    entries: &[(String, String)],
    matched: &[&Node],
    detailed: bool,
) -> (String, String) {
    let (mut name, mut envoy) = (domain.to_string(), domain.to_string());
    for ((key, value), node) in entries.iter().zip(matched) {
        let shown = match &node.value {
            Some(m) if node.share_threshold => Some(m.text()),
            _ if detailed || node.value_to_metric => Some(value.as_str()),
            Some(m) => Some(m.text()),
            None => None,
        };
        name.push('/');
        name.push_str(key);
        envoy.push('.');
        envoy.push_str(key);
        if let Some(v) = shown.filter(|v| !v.is_empty()) {
            name.push('=');
            name.push_str(v);
        }
        if let Some(v) = shown.filter(|v| detailed || !v.is_empty()) {
            envoy.push('_');
            envoy.push_str(v);
        }
    }
    (name, envoy)
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

/// A limit for a request's own override (Envoy's per-descriptor `limit`) in
/// `domain`: a clock-aligned fixed window of `n` per `unit`, with no name, shadow or
/// quota mode.
pub fn override_limit(
    domain: &str,
    unit: Unit,
    n: u64,
    counters: &Counters,
) -> Result<Arc<DescriptorLimit>, String> {
    let spec = envoy_window(n, unit);
    let policy: Policy = spec.parse().map_err(|e| format!("limit override: {e}"))?;
    limit_of(
        format!("{domain}/override/{n}/{}", unit.envoy_name()),
        Traits {
            full_key: format!("{domain}.override_{n}_{}", unit.envoy_name()),
            ..Traits::default()
        },
        Some(policy.into()),
        Some((unit, n)),
        counters,
    )
}

/// What a descriptor says about its limit besides how it counts.
#[derive(Debug, Default)]
struct Traits {
    /// Envoy's name for the descriptor: `domain.key_value.key2`.
    full_key: String,
    name: Option<String>,
    replaces: Vec<String>,
    shadow: bool,
    quota_mode: bool,
    detailed_metric: bool,
    rejected_hits: Option<RejectedHits>,
}

/// One descriptor of a rule file (`at` names it in errors) with its children; `path`
/// is its parent's descriptor path and `parent_key` its parent's key in Envoy's form.
fn build(
    d: DescriptorDoc,
    path: &str,
    parent_key: &str,
    at: &str,
    counters: &Counters,
) -> Result<Node, String> {
    if d.key.trim().is_empty() {
        return Err(format!("{at}.key: must not be empty"));
    }
    let (node_path, full_key) = match &d.value {
        Some(v) => (
            format!("{path}/{}={v}", d.key),
            format!("{parent_key}.{}_{v}", d.key),
        ),
        None => (
            format!("{path}/{}", d.key),
            format!("{parent_key}.{}", d.key),
        ),
    };
    if d.share_threshold && !d.value.as_deref().is_some_and(|v| v.contains('*')) {
        return Err(format!(
            "{at}.share_threshold: only for a wildcard value (one with '*')"
        ));
    }
    let mut traits = Traits {
        full_key: full_key.clone(),
        shadow: d.shadow_mode,
        quota_mode: d.quota_mode,
        detailed_metric: d.detailed_metric,
        rejected_hits: d.rejected_hits,
        ..Traits::default()
    };
    let limit = match (d.rate_limit, d.policies) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: give either rate_limit or policies, not both"
            ))
        }
        (None, None) if d.rejected_hits.is_some() => {
            return Err(format!(
                "{at}.rejected_hits: only for a descriptor with rate_limit or policies (it does not pass to children)"
            ))
        }
        (None, None) => None,
        (None, Some(specs)) => {
            if specs.is_empty() {
                return Err(format!("{at}.policies: needs at least one policy spec"));
            }
            let rules = RuleSet::new(specs.into_iter().map(|s| s.0).collect())
                .map_err(|e| format!("{at}.policies: {e}"))?;
            if d.rejected_hits == Some(RejectedHits::Counted) {
                for p in rules.policies() {
                    if let Err(e) = p.chargeable() {
                        return Err(format!("{at}.rejected_hits: counted needs policies that can be charged: {p}: {e}"));
                    }
                }
            }
            Some(
                limit_of(node_path.clone(), traits, Some(rules), None, counters)
                    .map_err(|e| format!("{at}.policies: {e}"))?,
            )
        }
        (Some(rl), None) => {
            traits.replaces = rl.replaces.iter().map(|r| r.name.clone()).collect();
            traits.name = rl.name.clone();
            Some(envoy_limit(rl, &node_path, traits, at, counters)?)
        }
    };
    let mut children: Vec<Node> = Vec::with_capacity(d.descriptors.len());
    for (i, c) in d.descriptors.into_iter().enumerate() {
        let at = format!("{at}.descriptors[{i}]");
        let child = build(c, &node_path, &full_key, &at, counters)?;
        refuse_duplicate(&children, &child, &at)?;
        children.push(child);
    }
    Ok(Node {
        key: d.key,
        value: d.value.map(ValueMatch::new),
        limit,
        value_to_metric: d.value_to_metric,
        share_threshold: d.share_threshold,
        children,
    })
}

/// Two descriptors of one list with the same key and value: Envoy refuses the file
/// (which one applies would be a guess).
fn refuse_duplicate(siblings: &[Node], node: &Node, at: &str) -> Result<(), String> {
    let value = |n: &Node| n.value.as_ref().map(|v| v.text().to_string());
    if siblings
        .iter()
        .any(|s| s.key == node.key && value(s) == value(node))
    {
        return Err(match value(node) {
            Some(v) => format!("{at}: duplicate descriptor key '{}' value '{v}'", node.key),
            None => format!("{at}: duplicate descriptor key '{}'", node.key),
        });
    }
    Ok(())
}

/// The policy of an Envoy limit of `n` per `unit`. envoyproxy/ratelimit's counters
/// start every window from 0 (a key per window): over-limit hits it counted are
/// forgiven when the window ends.
fn envoy_window(n: u64, unit: Unit) -> String {
    format!(
        "fixed-window:limit={n},window={},debt=forgive",
        unit.window()
    )
}

/// An Envoy `rate_limit`: `unlimited`, a block list (`requests_per_unit: 0`), or a
/// clock-aligned fixed window of one unit.
fn envoy_limit(
    rl: RateLimitDoc,
    node_path: &str,
    traits: Traits,
    at: &str,
    counters: &Counters,
) -> Result<Arc<DescriptorLimit>, String> {
    for (i, r) in rl.replaces.iter().enumerate() {
        if r.name.is_empty() {
            return Err(format!(
                "{at}.rate_limit.replaces[{i}].name: must not be empty"
            ));
        }
        if rl.name.as_ref() == Some(&r.name) {
            return Err(format!(
                "{at}.rate_limit.replaces[{i}]: a limit cannot replace itself ('{}')",
                r.name
            ));
        }
    }
    let path = node_path.to_string();
    if rl.unlimited {
        if rl.unit.is_some() || rl.requests_per_unit.is_some() {
            return Err(format!(
                "{at}.rate_limit: unlimited takes no unit or requests_per_unit"
            ));
        }
        return limit_of(path, traits, None, None, counters);
    }
    let unit = rl.unit.ok_or_else(|| {
        format!("{at}.rate_limit.unit: missing (second, minute, hour, day, week, month or year)")
    })?;
    let n = rl
        .requests_per_unit
        .ok_or_else(|| format!("{at}.rate_limit.requests_per_unit: missing"))?;
    if n == 0 {
        // Envoy's block list: nothing is ever admitted.
        let mut limit = limit_of(path, traits, None, Some((unit, 0)), counters)?;
        Arc::get_mut(&mut limit).expect("new").deny = true;
        return Ok(limit);
    }
    let spec = envoy_window(n, unit);
    let policy: Policy = spec
        .parse()
        .map_err(|e| format!("{at}.rate_limit.requests_per_unit: {e}"))?;
    limit_of(path, traits, Some(policy.into()), Some((unit, n)), counters)
        .map_err(|e| format!("{at}.rate_limit: {e}"))
}

fn limit_of(
    path: String,
    traits: Traits,
    rules: Option<RuleSet>,
    envoy: Option<(Unit, u64)>,
    counters: &Counters,
) -> Result<Arc<DescriptorLimit>, String> {
    let limiter = (rules.clone())
        .map(|r| counters.limiter(&path, r))
        .transpose()?;
    let name = traits.name.as_deref().unwrap_or("default");
    let policy_header = rules.as_ref().map(|r| PolicyHeader::new(name, r));
    Ok(Arc::new(DescriptorLimit {
        path,
        full_key: traits.full_key,
        name: traits.name,
        replaces: traits.replaces,
        shadow: traits.shadow,
        quota_mode: traits.quota_mode,
        detailed_metric: traits.detailed_metric,
        rejected_hits: traits.rejected_hits,
        specs: rules
            .as_ref()
            .map(|r| r.policies().iter().map(ToString::to_string).collect()),
        policy_header,
        rules,
        deny: false,
        envoy,
        limiter,
        stats: std::sync::OnceLock::new(),
    }))
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
        r.add(text, "test.yaml", &Counters::default())?;
        Ok(r)
    }

    #[test]
    fn a_quota_rule_is_a_budget_or_a_blanket_rule() {
        let rule =
            |body: &str| format!("domain: d\nquota_buckets:\n  - bucket: {{ t: x }}\n{body}");
        let bucket = [("t".into(), "x".into())].into();
        let r = rules(&rule("    blanket: deny_all\n    assignment_ttl: 30s\n")).unwrap();
        let q = r.quota_rule("d", &bucket).unwrap();
        assert_eq!(q.strategy, QuotaStrategy::Blanket(Blanket::DenyAll));
        assert_eq!(
            (q.strategy.to_string(), q.settings.ttl_us),
            ("deny_all".into(), 30_000_000)
        );
        let r = rules(&rule("    blanket: ALLOW_ALL\n")).unwrap();
        let q = r.quota_rule("d", &bucket).unwrap();
        assert_eq!(
            (q.strategy.to_string(), q.settings.ttl_us),
            ("allow_all".into(), BLANKET_TTL_US)
        );
        for (body, says) in [
            (
                "    blanket: deny_all\n    policy: \"gcra:rate=1/s\"\n",
                "quota_buckets[0]: policy and blanket cannot both be set",
            ),
            (
                "    name: n\n",
                "quota_buckets[0]: expected policy (the budget",
            ),
            (
                "    blanket: deny\n",
                "blanket: 'deny': expected allow_all or deny_all (or Envoy's ALLOW_ALL, DENY_ALL) at line 3",
            ),
        ] {
            let e = rules(&rule(body)).unwrap_err().to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
    }

    #[test]
    fn a_bad_quota_budget_or_time_to_live_is_refused_with_its_line() {
        let rule = |policy: &str, ttl: &str| {
            format!(
                "domain: d\nquota_buckets:\n  - bucket: {{ t: x }}\n    policy: \"{policy}\"\n    assignment_ttl: {ttl}\n"
            )
        };
        for (policy, ttl, says) in [
            (
                "concurrency:limit=5",
                "1s",
                "policy: a quota bucket's budget is",
            ),
            (
                "fixed-window:limit=1,window=1m",
                "1s",
                "policy: a window budget needs a limit of at least 2",
            ),
            (
                "gcra:rate=5/s,shadow=true",
                "1s",
                "policy: a quota bucket's budget takes no shadow",
            ),
            ("gcra:rate=5/s", "5", "whole seconds from 1s to 1h"),
            (
                "gcra:rate=5/s",
                "500ms",
                "assignment_ttl: 500ms: expected whole seconds",
            ),
            (
                "gcra:rate=5/s",
                "2h",
                "assignment_ttl: 2h: expected whole seconds",
            ),
        ] {
            let e = rules(&rule(policy, ttl)).unwrap_err().to_string();
            assert!(
                e.contains(says) && e.contains("at line 3"),
                "{policy} {ttl}: {e}"
            );
        }
        assert!(rules(&rule("sliding-log:limit=100,window=1m", "5s")).is_ok());
    }

    #[test]
    fn a_quota_rule_that_an_earlier_one_shadows_is_refused() {
        let two = |a: &str, b: &str| {
            format!(
                "domain: d\nquota_buckets:\n  - bucket: {{ {a} }}\n    policy: \"gcra:rate=1/s\"\n  - bucket: {{ {b} }}\n    policy: \"gcra:rate=2/s\"\n"
            )
        };
        for (a, b) in [
            ("t: x", "t: x"),
            ("t: \"*\"", "t: x"),
            ("t: \"a*\"", "t: ab"),
            ("t: \"a*\"", "t: \"a*\""),
            ("t: \"team-*\"", "t: \"team-red*\""),
            ("t: \"*-prod\"", "t: \"eu-*-prod\""),
            ("t: \"*\"", "t: \"*x*\""),
        ] {
            let e = rules(&two(a, b)).unwrap_err().to_string();
            assert!(
                e.contains("quota_buckets[1].bucket: never used"),
                "{a} / {b}: {e}"
            );
        }
        // More specific first, or other keys: both used.
        for (a, b) in [
            ("t: x", "t: \"*\""),
            ("t: x", "u: x"),
            ("t: \"a*\"", "t: b"),
            ("t: \"team-red*\"", "t: \"team-*\""),
            ("t: \"a*b\"", "t: \"a*\""),
            ("t: \"*a*\"", "t: \"*\""),
        ] {
            rules(&two(a, b)).unwrap();
        }
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
                .limit
                .path
                .clone()
        };
        assert_eq!(path_of("/login"), "d/path=/login");
        assert_eq!(path_of("/static/app.js"), "d/path=/static/*");
        assert_eq!(path_of("/other"), "d/path");
        assert!(r
            .find("d", &entries(&[("path", "/static/x")]))
            .unwrap()
            .limit
            .rules
            .is_none());
        // A nested limit needs the whole chain; the parent alone has none here.
        let Match { limit, counter, .. } = r
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
        // Counting rejected hits charges them: a queue or permits cannot take that.
        let e = rules("domain: d\ndescriptors:\n  - key: k\n    rejected_hits: counted\n    policies: ['shaper:rate=1/s,queue=2']\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rejected_hits: counted needs policies that can be charged")
                && e.contains("shaper cannot be charged"),
            "{e}"
        );
        let e = rules("domain: d\ndescriptors:\n  - key: k\n    rejected_hits: not_counted\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "descriptors[0].rejected_hits: only for a descriptor with rate_limit or policies"
            ),
            "{e}"
        );
        let mut r = rules("domain: d\ndescriptors: []\n").unwrap();
        let e = r
            .add(
                "domain: d\ndescriptors: []\n",
                "two.yaml",
                &Counters::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("domain 'd' is already defined in test.yaml"),
            "{e}"
        );
    }

    #[test]
    fn a_wildcard_star_stands_for_any_run_of_characters_anywhere_in_the_value() {
        let parts = |p: &str| p.split('*').map(str::to_string).collect::<Vec<_>>();
        assert!(wildcard_fits(&parts("files/*"), "files/a.pdf"));
        assert!(wildcard_fits(&parts("files/*"), "files/"));
        assert!(!wildcard_fits(&parts("files/*"), "file"));
        assert!(wildcard_fits(&parts("user_*_admin"), "user_42_admin"));
        assert!(wildcard_fits(&parts("user_*_admin"), "user__admin"));
        assert!(!wildcard_fits(&parts("user_*_admin"), "user_admin"));
        assert!(wildcard_fits(&parts("a*b*c"), "aXbYc"));
        assert!(wildcard_fits(&parts("a*b*c"), "abc"));
        assert!(!wildcard_fits(&parts("a*b*c"), "acb"));
        assert!(
            !wildcard_fits(&parts("ab*ba"), "aba"),
            "parts must not overlap"
        );
        assert!(wildcard_fits(&parts("*"), ""));
    }

    #[test]
    fn a_shared_wildcard_counts_every_value_on_one_counter_and_names_stats_by_pattern() {
        let r = rules(
            "domain: d
descriptors:
  - key: file
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: file
    value: docs/*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
",
        )
        .unwrap();
        let find = |k: &str, v: &str| r.find("d", &entries(&[(k, v)])).unwrap();
        assert_eq!(
            find("file", "files/a").counter,
            find("file", "files/b").counter
        );
        assert_eq!(
            find("file", "files/a").counter,
            counter_key("d", &entries(&[("file", "files/*")]))
        );
        assert_ne!(
            find("file", "docs/a").counter,
            find("file", "docs/b").counter
        );
        assert_eq!(find("file", "files/a").stat_name, None);
        assert_eq!(find("file", "docs/a").stat_name, None);
        assert_eq!(
            find("user", "u1").stat_name,
            Some(("d/user=u1".into(), "d.user_u1".into()))
        );
        assert_eq!(
            find("path", "/x").stat_name,
            Some(("d/path=/x".into(), "d.path_/x".into()))
        );
        let e =
            rules("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n")
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("share_threshold") && e.contains("wildcard"),
            "{e}"
        );
    }

    #[test]
    fn files_envoy_refuses_are_refused_with_the_place_named() {
        let refused = |text: &str, expect: &str| {
            let e = rules(text).unwrap_err().to_string();
            assert!(e.contains(expect), "{expect} not in: {e}");
        };
        refused(
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
            "descriptors[1]: duplicate descriptor key 'k'",
        );
        refused(
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - {key: a, value: b}\n      - {key: a, value: b}\n",
            "descriptors[0].descriptors[1]: duplicate descriptor key 'a' value 'b'",
        );
        refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
            "unlimited takes no unit",
        );
        refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n",
            "cannot replace itself",
        );
        refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n",
            "replaces[0].name: must not be empty",
        );
        refused(
            "domain: d\ndescriptors:\n  - key: ''\n",
            "descriptors[0].key: must not be empty",
        );
        refused(
            "domain: d\ndescriptors:\n  - key: k\n    colour: red\n",
            "colour",
        );
        // Envoy's own fields load (metadata has no effect here).
        rules("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    metadata: {a: {b: 1}}\n    rate_limit: {unit: second, requests_per_unit: 1}\n").unwrap();
    }

    #[test]
    fn documents_of_one_domain_merge_only_when_asked_and_duplicates_still_fail() {
        let one = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let two = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let mut merged = DescriptorRules {
            merge_domains: true,
            ..DescriptorRules::default()
        };
        merged.add(one, "one.yaml", &Counters::default()).unwrap();
        merged.add(two, "two.yaml", &Counters::default()).unwrap();
        assert!(merged.find("d", &entries(&[("a", "x")])).is_some());
        assert!(merged.find("d", &entries(&[("b", "x")])).is_some());
        assert_eq!(
            merged.domains().collect::<Vec<_>>(),
            vec![("d", "one.yaml, two.yaml")]
        );
        let e = merged
            .add(one, "three.yaml", &Counters::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("three.yaml") && e.contains("duplicate descriptor key 'a'"),
            "{e}"
        );
        // The failed document changed nothing.
        assert!(merged.find("d", &entries(&[("b", "x")])).is_some());
        let mut strict = rules(one).unwrap();
        let e = strict
            .add(two, "two.yaml", &Counters::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("already defined"), "{e}");
    }
}
