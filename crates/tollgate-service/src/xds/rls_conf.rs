//! The rule messages an xDS server sends: envoyproxy/ratelimit's
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` (its `rls_conf.proto`), and their
//! translation into the rule documents files hold, so that both go through one
//! validation.

use crate::descriptors::{DescriptorDoc, Document, RateLimitDoc, ReplacesDoc, Unit};

/// The resource type an ADS stream asks for.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// One domain's rules, as a rule file's document.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitConfig {
    /// The resource's name (unique in a version).
    #[prost(string, tag = "1")]
    pub name: String,
    /// The domain.
    #[prost(string, tag = "2")]
    pub domain: String,
    /// Its descriptors.
    #[prost(message, repeated, tag = "3")]
    pub descriptors: Vec<RateLimitDescriptor>,
}

/// A descriptor: a key, an optional value, a limit, nested descriptors.
///
/// Field 8 (`metadata`, a `google.protobuf.Struct`) is left undecoded: Envoy returns
/// it in dynamic metadata, which tollgate does not send (files accept and ignore it
/// the same way).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The descriptor key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value (empty: any value).
    #[prost(string, tag = "2")]
    pub value: String,
    /// The limit, if any.
    #[prost(message, optional, tag = "3")]
    pub rate_limit: Option<RateLimitPolicy>,
    /// Nested descriptors.
    #[prost(message, repeated, tag = "4")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Decide, report, but never reject.
    #[prost(bool, tag = "5")]
    pub shadow_mode: bool,
    /// Statistics per value.
    #[prost(bool, tag = "6")]
    pub detailed_metric: bool,
    /// Over the limit is reported but not enforced when global quota mode is on.
    #[prost(bool, tag = "7")]
    pub quota_mode: bool,
}

/// A limit: requests per unit, or unlimited.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitPolicy {
    /// The unit (`RateLimitUnit`).
    #[prost(enumeration = "RateLimitUnit", tag = "1")]
    pub unit: i32,
    /// Requests per unit.
    #[prost(uint32, tag = "2")]
    pub requests_per_unit: u32,
    /// No limit (and no counting).
    #[prost(bool, tag = "3")]
    pub unlimited: bool,
    /// The limit's name (for `replaces`).
    #[prost(string, tag = "4")]
    pub name: String,
    /// The limits this one replaces.
    #[prost(message, repeated, tag = "5")]
    pub replaces: Vec<RateLimitReplace>,
}

/// A limit replaced, by name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitReplace {
    /// The name.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `RateLimitUnit`, numbered as in the proto (WEEK came last, as 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RateLimitUnit {
    /// Not set.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// 30 days.
    Month = 5,
    /// 365 days.
    Year = 6,
    /// 7 days.
    Week = 7,
}

impl RateLimitConfig {
    /// The document a rule file with the same rules would hold. Proto defaults are
    /// absences: an empty value or name is none, `UNKNOWN` is no unit, and
    /// `requests_per_unit` 0 beside `unlimited` is none (so the document validates as
    /// the YAML would).
    pub(crate) fn into_document(self) -> Result<Document, String> {
        Ok(Document {
            domain: self.domain,
            descriptors: descriptors(self.descriptors, "descriptors")?,
            quota_buckets: Vec::new(),
        })
    }
}

fn descriptors(list: Vec<RateLimitDescriptor>, at: &str) -> Result<Vec<DescriptorDoc>, String> {
    let mut out = Vec::with_capacity(list.len());
    for (i, d) in list.into_iter().enumerate() {
        let at = format!("{at}[{i}]");
        let rate_limit = d.rate_limit.map(|p| policy(p, &at)).transpose()?;
        out.push(DescriptorDoc {
            key: d.key,
            value: Some(d.value).filter(|v| !v.is_empty()),
            rate_limit,
            policies: None,
            shadow_mode: d.shadow_mode,
            quota_mode: d.quota_mode,
            detailed_metric: d.detailed_metric,
            value_to_metric: false,
            share_threshold: false,
            rejected_hits: None,
            metadata: None,
            descriptors: descriptors(d.descriptors, &format!("{at}.descriptors"))?,
        });
    }
    Ok(out)
}

fn policy(p: RateLimitPolicy, at: &str) -> Result<RateLimitDoc, String> {
    let unit = match RateLimitUnit::try_from(p.unit) {
        Ok(RateLimitUnit::Unknown) => None,
        Ok(RateLimitUnit::Second) => Some(Unit::Second),
        Ok(RateLimitUnit::Minute) => Some(Unit::Minute),
        Ok(RateLimitUnit::Hour) => Some(Unit::Hour),
        Ok(RateLimitUnit::Day) => Some(Unit::Day),
        Ok(RateLimitUnit::Week) => Some(Unit::Week),
        Ok(RateLimitUnit::Month) => Some(Unit::Month),
        Ok(RateLimitUnit::Year) => Some(Unit::Year),
        Err(_) => {
            return Err(format!(
                "{at}.rate_limit.unit: {} is no RateLimitUnit",
                p.unit
            ))
        }
    };
    // A 0 is the proto's "unset" beside `unlimited` or no unit; otherwise a count
    // (0 is Envoy's block list).
    let unset = p.requests_per_unit == 0 && (p.unlimited || unit.is_none());
    let requests_per_unit = (!unset).then_some(u64::from(p.requests_per_unit));
    Ok(RateLimitDoc {
        unit,
        requests_per_unit,
        unlimited: p.unlimited,
        name: Some(p.name).filter(|n| !n.is_empty()),
        replaces: (p.replaces.into_iter())
            .map(|r| ReplacesDoc { name: r.name })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::Counters;
    use crate::descriptors::DescriptorRules;

    fn limit(unit: RateLimitUnit, n: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: n,
            ..Default::default()
        })
    }

    fn rules(config: RateLimitConfig) -> Result<DescriptorRules, String> {
        let mut rules = DescriptorRules::default();
        let doc = config.into_document()?;
        (rules.add_document(doc, "xds", &Counters::default())).map_err(|e| e.to_string())?;
        Ok(rules)
    }

    #[test]
    fn a_config_loads_as_the_same_yaml_would() {
        let config = RateLimitConfig {
            name: "one".into(),
            domain: "d".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    key: "k".into(),
                    value: "v".into(),
                    rate_limit: limit(RateLimitUnit::Week, 7),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "free".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unlimited: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                RateLimitDescriptor {
                    key: "blocked".into(),
                    rate_limit: limit(RateLimitUnit::Second, 0),
                    shadow_mode: true,
                    ..Default::default()
                },
            ],
        };
        let from_xds = rules(config).unwrap().dump();
        let mut from_yaml = DescriptorRules::default();
        let yaml = "domain: d\ndescriptors:\n\
          - {key: k, value: v, rate_limit: {unit: week, requests_per_unit: 7}}\n\
          - {key: free, rate_limit: {unlimited: true}}\n\
          - {key: blocked, shadow_mode: true, rate_limit: {unit: second, requests_per_unit: 0}}\n";
        from_yaml.add(yaml, "f", &Counters::default()).unwrap();
        assert_eq!(from_xds, from_yaml.dump());
    }

    #[test]
    fn a_limit_without_unit_is_refused_by_name() {
        let config = RateLimitConfig {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "inner".into(),
                    rate_limit: limit(RateLimitUnit::Unknown, 5),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = rules(config).unwrap_err();
        assert!(
            e.contains("descriptors[0].descriptors[0].rate_limit.unit: missing"),
            "{e}"
        );
        let bad_unit = RateLimitConfig {
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: 42,
                    requests_per_unit: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = rules(bad_unit).unwrap_err();
        assert!(e.contains("descriptors[0].rate_limit.unit: 42"), "{e}");
    }
}
