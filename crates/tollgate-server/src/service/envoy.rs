//! envoyproxy/ratelimit's wire forms over the decision service: the RLS v3 protobuf
//! messages (gRPC's `ShouldRateLimit`) and their proto3 JSON mapping (`POST
//! /json`). Protocol types stay here: conversions in, [`should_rate_limit`], conversions
//! out; both transports answer through it, so they answer alike.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt64Value};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tollgate::Op;

use crate::service::rules::Unit;
use crate::service::{
    Code, DecisionService, DescriptorRequest, DescriptorStatus as ServiceStatus, RequestError,
};

/// Decides a `RateLimitRequest` as envoyproxy/ratelimit does: the request's
/// `hits_addend` (unset or 0 means 1), each descriptor's own `hits_addend` (0: look
/// without counting) and `limit` override; the response headers as
/// `service.headers` says.
pub async fn should_rate_limit(
    service: &DecisionService,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, RequestError> {
    let descriptors: Vec<DescriptorRequest> = req
        .descriptors
        .into_iter()
        .map(descriptor_request)
        .collect();
    let hits = u64::from(req.hits_addend.max(1));
    let result = service
        .check(&req.domain, &descriptors, hits, Op::Try)
        .await?;
    let headers =
        crate::service::headers::response_headers(&service.answers().headers, &result, false);
    Ok(RateLimitResponse {
        overall_code: pb_code(result.overall),
        statuses: result.statuses.iter().map(descriptor_status).collect(),
        response_headers_to_add: headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key,
                value,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

fn unit_of(unit: i32) -> Option<Unit> {
    Some(match PbUnit::try_from(unit).ok()? {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => return None,
    })
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn duration(us: u64) -> PbDuration {
    PbDuration {
        seconds: (us / 1_000_000) as i64,
        nanos: ((us % 1_000_000) * 1000) as i32,
    }
}

/// A request's descriptor as the service takes it (its strings moved, not copied).
fn descriptor_request(d: RateLimitDescriptor) -> DescriptorRequest {
    DescriptorRequest {
        entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
        hits: d.hits_addend.map(|h| h.value),
        give_back: d.is_negative_hits,
        limit_override: d
            .limit
            .as_ref()
            .and_then(|l| Some((unit_of(l.unit)?, u64::from(l.requests_per_unit)))),
    }
}

fn pb_code(code: Code) -> i32 {
    let code = match code {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    };
    code as i32
}

/// A descriptor's status as Envoy reads it: the limit in Envoy's terms (its unit, or
/// the policy's headline limit with an unknown unit), remaining and time to reset
/// (whole seconds for a limit in Envoy's units, as envoyproxy/ratelimit computes it;
/// to the microsecond for tollgate's policies).
fn descriptor_status(s: &ServiceStatus) -> DescriptorStatus {
    let mut status = DescriptorStatus {
        code: pb_code(s.code),
        ..Default::default()
    };
    if s.limit
        .as_ref()
        .is_some_and(|l| l.rules.is_none() && !l.deny)
    {
        // Unlimited: OK with the most remaining there is, as Envoy's service.
        status.limit_remaining = u32::MAX;
    }
    if let (Some(limit), Some(view)) = (&s.limit, s.envoy_view()) {
        let unit = limit
            .envoy
            .map_or(PbUnit::Unknown, |(unit, _)| pb_unit(unit));
        status.current_limit = Some(RateLimit {
            name: limit.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(view.per_unit).unwrap_or(u32::MAX),
            unit: unit as i32,
        });
        status.limit_remaining = u32::try_from(view.remaining).unwrap_or(u32::MAX);
        status.duration_until_reset = Some(duration(view.reset_after_us));
    }
    status
}

// --- The proto3 JSON mapping, for `POST /json`. ---

/// A `RateLimitRequest` from its proto3 JSON form, as `protojson` reads it: field
/// names in lowerCamelCase or as in the proto, 64-bit integers as numbers or
/// strings, enums by name or number, `null` for a default; an unknown field is an
/// error naming it.
pub fn request_from_json(body: &[u8]) -> Result<RateLimitRequest, String> {
    let req: JsonRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    Ok(RateLimitRequest {
        domain: req.domain.unwrap_or_default(),
        hits_addend: u32::try_from(req.hits_addend.unwrap_or(0))
            .map_err(|_| "hitsAddend: more than a uint32".to_string())?,
        descriptors: (req.descriptors.unwrap_or_default().into_iter())
            .map(|d| {
                Ok(RateLimitDescriptor {
                    entries: (d.entries.unwrap_or_default().into_iter())
                        .map(|e| Entry {
                            key: e.key.unwrap_or_default(),
                            value: e.value.unwrap_or_default(),
                        })
                        .collect(),
                    limit: match d.limit {
                        Some(l) => Some(RateLimitOverride {
                            requests_per_unit: u32::try_from(l.requests_per_unit.unwrap_or(0))
                                .map_err(|_| "limit.requestsPerUnit: more than a uint32")?,
                            unit: l.unit.unwrap_or(0),
                        }),
                        None => None,
                    },
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: d.is_negative_hits.unwrap_or(false),
                })
            })
            .collect::<Result<_, &str>>()?,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    domain: Option<String>,
    descriptors: Option<Vec<JsonDescriptor>>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        with = "integer"
    )]
    hits_addend: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    entries: Option<Vec<JsonEntry>>,
    limit: Option<JsonOverride>,
    #[serde(
        default,
        alias = "hits_addend",
        rename = "hitsAddend",
        with = "integer"
    )]
    hits_addend: Option<u64>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: Option<String>,
    value: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(
        default,
        alias = "requests_per_unit",
        rename = "requestsPerUnit",
        with = "integer"
    )]
    requests_per_unit: Option<u64>,
    #[serde(default, with = "unit_enum")]
    unit: Option<i32>,
}

/// A proto3 JSON scalar that may come as a number or as text (integers as decimal
/// strings, enums by name), read with `from_text` for the text form.
fn number_or_text<'de, D, N>(
    d: D,
    from_text: impl FnOnce(&str) -> Option<N>,
    expected: &str,
) -> Result<Option<N>, D::Error>
where
    D: serde::Deserializer<'de>,
    N: Deserialize<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form<N> {
        Number(N),
        Text(String),
    }
    match Option::<Form<N>>::deserialize(d)? {
        None => Ok(None),
        Some(Form::Number(n)) => Ok(Some(n)),
        Some(Form::Text(s)) => from_text(&s)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("'{s}' is not {expected}"))),
    }
}

/// proto3 JSON integers: a number or a decimal string.
mod integer {
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        super::number_or_text(d, |s| s.parse().ok(), "an unsigned integer")
    }
}

/// A `RateLimit.Unit` by name (`MINUTE`) or number.
mod unit_enum {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
        super::number_or_text(
            d,
            |s| Unit::from_str_name(s).map(|u| u as i32),
            "a unit (SECOND, MINUTE, HOUR, DAY, WEEK, MONTH, YEAR)",
        )
    }
}

/// A `RateLimitResponse` in proto3 JSON, as `protojson` writes it: lowerCamelCase
/// names, enums by name, durations as `"1.500s"`, and fields at their default value
/// (0, "", UNKNOWN, empty lists) left out.
pub fn response_to_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    put_enum(&mut out, "overallCode", code_name(r.overall_code));
    let statuses: Vec<Value> = r.statuses.iter().map(status_to_json).collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    let headers: Vec<Value> = (r.response_headers_to_add.iter())
        .map(|h| json!({ "key": h.key, "value": h.value }))
        .collect();
    if !headers.is_empty() {
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out)
}

fn status_to_json(s: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    put_enum(&mut out, "code", code_name(s.code));
    if let Some(l) = &s.current_limit {
        let mut limit = Map::new();
        if !l.name.is_empty() {
            limit.insert("name".into(), json!(l.name));
        }
        if l.requests_per_unit != 0 {
            limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
        }
        let unit = PbUnit::try_from(l.unit).unwrap_or(PbUnit::Unknown);
        put_enum(&mut limit, "unit", unit.as_str_name());
        out.insert("currentLimit".into(), Value::Object(limit));
    }
    if s.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(s.limit_remaining));
    }
    if let Some(d) = &s.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(duration_json(d)));
    }
    Value::Object(out)
}

fn code_name(code: i32) -> &'static str {
    PbCode::try_from(code)
        .unwrap_or(PbCode::Unknown)
        .as_str_name()
}

/// An enum field, left out at its zero value (`UNKNOWN`).
fn put_enum(out: &mut Map<String, Value>, field: &str, name: &'static str) {
    if name != "UNKNOWN" {
        out.insert(field.into(), json!(name));
    }
}

/// A `google.protobuf.Duration` as protojson writes it: seconds with 0, 3, 6 or 9
/// fractional digits, then `s`.
fn duration_json(d: &PbDuration) -> String {
    let nanos = d.nanos.unsigned_abs();
    match nanos {
        0 => format!("{}s", d.seconds),
        n if n % 1_000_000 == 0 => format!("{}.{:03}s", d.seconds, n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}.{:06}s", d.seconds, n / 1_000),
        n => format!("{}.{n:09}s", d.seconds),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_written_as_protojson_writes_them() {
        let d = |seconds, nanos| duration_json(&PbDuration { seconds, nanos });
        assert_eq!(d(60, 0), "60s");
        assert_eq!(d(59, 500_000_000), "59.500s");
        assert_eq!(d(0, 250_000), "0.000250s");
        assert_eq!(d(1, 7), "1.000000007s");
    }

    #[test]
    fn requests_are_read_in_either_field_spelling_with_integers_as_strings() {
        let r = request_from_json(
            br#"{"domain":"d","hits_addend":"3","descriptors":[
                {"entries":[{"key":"k","value":"v"}],"hitsAddend":0,
                 "limit":{"requests_per_unit":"7","unit":"MINUTE"}},
                {"entries":[{"key":"k"}],"limit":{"requestsPerUnit":2,"unit":3}}]}"#,
        )
        .unwrap();
        assert_eq!((r.domain.as_str(), r.hits_addend), ("d", 3));
        let d = &r.descriptors[0];
        assert_eq!(d.hits_addend, Some(UInt64Value { value: 0 }));
        assert_eq!(
            d.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
            Some((7, PbUnit::Minute as i32))
        );
        assert_eq!(r.descriptors[1].entries[0].value, "");
        assert_eq!(
            r.descriptors[1].limit.as_ref().map(|l| l.unit),
            Some(PbUnit::Hour as i32)
        );
        let e = request_from_json(br#"{"domain":"d","descriptor":[]}"#).unwrap_err();
        assert!(e.contains("descriptor"), "{e}");
        let e = request_from_json(br#"{"domain":"d","hitsAddend":"lots"}"#).unwrap_err();
        assert!(e.contains("lots"), "{e}");
    }
}
