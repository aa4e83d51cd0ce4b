//! envoyproxy/ratelimit's wire forms over the decision service: the RLS v3 protobuf
//! messages (gRPC's `ShouldRateLimit`) and their proto3 JSON mapping (`POST
//! /json`). Protocol types stay here: conversions in, [`should_rate_limit`], conversions
//! out; both transports answer through it, so they answer alike.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code as PbCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use serde::Deserialize;
use tollgate::headers::push_decimal;
use tollgate::Op;

use crate::descriptors::Unit;
use crate::{
    Api, CheckResult, Code, DecisionService, DescriptorRequest, DescriptorStatus as ServiceStatus,
    RequestError,
};

/// A rate-limit request as both Envoy wire forms carry it, read into the service's
/// terms: the domain, the descriptors (strings moved, not copied) and the request's
/// hits (its `hits_addend`; unset or 0 means 1).
#[derive(Debug)]
pub struct EnvoyRequest {
    /// The domain.
    pub domain: String,
    /// The descriptors, each with its own `hits_addend`, `limit` override and
    /// `is_negative_hits`.
    pub descriptors: Vec<DescriptorRequest>,
    /// The request's hits.
    pub hits: u64,
}

impl From<RateLimitRequest> for EnvoyRequest {
    fn from(req: RateLimitRequest) -> Self {
        EnvoyRequest {
            domain: req.domain,
            descriptors: req
                .descriptors
                .into_iter()
                .map(descriptor_request)
                .collect(),
            hits: u64::from(req.hits_addend.max(1)),
        }
    }
}

/// Response headers to add: `(name, value)`.
pub type Headers = Vec<(std::borrow::Cow<'static, str>, String)>;

/// Decides an Envoy request as envoyproxy/ratelimit does (the request's and each
/// descriptor's `hits_addend`, 0: look without counting; `limit` overrides;
/// `is_negative_hits`), with the response headers `service.headers` asks for: what
/// both wire forms answer from.
pub async fn decide(
    service: &DecisionService,
    req: &EnvoyRequest,
) -> Result<(CheckResult, Headers), RequestError> {
    let result = service
        .check(Api::Envoy, &req.domain, &req.descriptors, req.hits, Op::Try)
        .await?;
    let headers = crate::headers::response_headers(&service.answers().headers, &result, false);
    Ok((result, headers))
}

/// Decides a `RateLimitRequest` (gRPC's `ShouldRateLimit`), see [`decide`].
pub async fn should_rate_limit(
    service: &DecisionService,
    req: RateLimitRequest,
) -> Result<RateLimitResponse, RequestError> {
    let (result, headers) = decide(service, &req.into()).await?;
    Ok(RateLimitResponse {
        overall_code: pb_code(result.overall),
        statuses: result.statuses.iter().map(descriptor_status).collect(),
        response_headers_to_add: headers
            .into_iter()
            .map(|(key, value)| HeaderValue {
                key: key.into_owned(),
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

/// A descriptor's status as Envoy reads it, before either wire form: the limit in
/// Envoy's terms (its unit, or the policy's headline limit with an unknown unit),
/// remaining and time to reset (whole seconds for a limit in Envoy's units, as
/// envoyproxy/ratelimit computes it; to the microsecond for tollgate's policies).
struct EnvoyStatus<'a> {
    code: Code,
    /// Name, requests per unit, unit.
    limit: Option<(&'a str, u32, PbUnit)>,
    remaining: u32,
    reset_after_us: Option<u64>,
}

fn envoy_status(s: &ServiceStatus) -> EnvoyStatus<'_> {
    let mut status = EnvoyStatus {
        code: s.code,
        limit: None,
        remaining: 0,
        reset_after_us: None,
    };
    if s.limit
        .as_ref()
        .is_some_and(|l| l.rules.is_none() && !l.deny)
    {
        // Unlimited: OK with the most remaining there is, as Envoy's service.
        status.remaining = u32::MAX;
    }
    if let (Some(limit), Some(view)) = (&s.limit, s.envoy_view()) {
        let unit = view.unit.map_or(PbUnit::Unknown, pb_unit);
        let per_unit = u32::try_from(view.per_unit).unwrap_or(u32::MAX);
        status.limit = Some((limit.name.as_deref().unwrap_or(""), per_unit, unit));
        status.remaining = u32::try_from(view.remaining).unwrap_or(u32::MAX);
        status.reset_after_us = Some(view.reset_after_us);
    }
    status
}

/// A descriptor's status in protobuf.
fn descriptor_status(s: &ServiceStatus) -> DescriptorStatus {
    let e = envoy_status(s);
    DescriptorStatus {
        code: pb_code(e.code),
        current_limit: e.limit.map(|(name, requests_per_unit, unit)| RateLimit {
            name: name.to_string(),
            requests_per_unit,
            unit: unit as i32,
        }),
        limit_remaining: e.remaining,
        duration_until_reset: e.reset_after_us.map(duration),
        ..Default::default()
    }
}

// --- The proto3 JSON mapping, for `POST /json`. ---

/// An Envoy request from the proto3 JSON form of a `RateLimitRequest`, as
/// `protojson` reads it (field names in lowerCamelCase or as in the proto, 64-bit
/// integers as numbers or strings, enums by name or number, `null` for a default; an
/// unknown field is an error naming it), read straight into the service's terms.
pub fn request_from_json(body: &[u8]) -> Result<EnvoyRequest, String> {
    let req: JsonRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let hits = u32::try_from(req.hits_addend.unwrap_or(0))
        .map_err(|_| "hitsAddend: more than a uint32".to_string())?;
    let descriptors = (req.descriptors.unwrap_or_default().into_iter())
        .map(|d| {
            let limit_override = match d.limit {
                Some(l) => {
                    let n = u32::try_from(l.requests_per_unit.unwrap_or(0))
                        .map_err(|_| "limit.requestsPerUnit: more than a uint32")?;
                    unit_of(l.unit.unwrap_or(0)).map(|unit| (unit, u64::from(n)))
                }
                None => None,
            };
            Ok(DescriptorRequest {
                entries: (d.entries.unwrap_or_default().into_iter())
                    .map(|e| (e.key.unwrap_or_default(), e.value.unwrap_or_default()))
                    .collect(),
                hits: d.hits_addend,
                give_back: d.is_negative_hits.unwrap_or(false),
                limit_override,
            })
        })
        .collect::<Result<_, &str>>()?;
    Ok(EnvoyRequest {
        domain: req.domain.unwrap_or_default(),
        descriptors,
        hits: u64::from(hits.max(1)),
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

/// The `RateLimitResponse` of `result` in proto3 JSON, as `protojson` writes it
/// (lowerCamelCase names in the proto's order, enums by name, durations as
/// `"1.500s"`, fields at their default value — 0, "", UNKNOWN, empty lists — left
/// out), written straight from the result.
pub fn response_json(result: &CheckResult, headers: &Headers) -> String {
    let mut out = String::with_capacity(48 + 112 * result.statuses.len());
    out.push_str(r#"{"overallCode":""#);
    out.push_str(result.overall.name());
    out.push('"');
    if !result.statuses.is_empty() {
        out.push_str(r#","statuses":["#);
        for (i, s) in result.statuses.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            status_json(&envoy_status(s), &mut out);
        }
        out.push(']');
    }
    if !headers.is_empty() {
        out.push_str(r#","responseHeadersToAdd":["#);
        for (i, (key, value)) in headers.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(r#"{"key":"#);
            json_string(key, &mut out);
            out.push_str(r#","value":"#);
            json_string(value, &mut out);
            out.push('}');
        }
        out.push(']');
    }
    out.push('}');
    out
}

fn status_json(s: &EnvoyStatus, out: &mut String) {
    out.push_str(r#"{"code":""#);
    out.push_str(s.code.name());
    out.push('"');
    if let Some((name, per_unit, unit)) = s.limit {
        out.push_str(r#","currentLimit":{"#);
        let mut sep = "";
        if !name.is_empty() {
            out.push_str(r#""name":"#);
            json_string(name, out);
            sep = ",";
        }
        if per_unit != 0 {
            out.push_str(sep);
            out.push_str(r#""requestsPerUnit":"#);
            push_decimal(out, per_unit.into());
            sep = ",";
        }
        if unit != PbUnit::Unknown {
            out.push_str(sep);
            out.push_str(r#""unit":""#);
            out.push_str(unit.as_str_name());
            out.push('"');
        }
        out.push('}');
    }
    if s.remaining != 0 {
        out.push_str(r#","limitRemaining":"#);
        push_decimal(out, s.remaining.into());
    }
    if let Some(us) = s.reset_after_us {
        out.push_str(r#","durationUntilReset":""#);
        duration_text(us, out);
        out.push('"');
    }
    out.push('}');
}

/// A JSON string literal of `s`, escaped as serde_json escapes (`\"`, `\\`, the
/// short escapes of `\b \f \n \r \t`, `\u00XX` for the other control characters;
/// everything else as it is).
fn json_string(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    let mut rest = s;
    while let Some(i) = rest
        .bytes()
        .position(|b| b == b'"' || b == b'\\' || b < 0x20)
    {
        // Every byte escaped is ASCII, so `i` is on a char boundary.
        out.push_str(&rest[..i]);
        let b = rest.as_bytes()[i];
        out.push('\\');
        match b {
            b'"' | b'\\' => out.push(char::from(b)),
            b'\n' => out.push('n'),
            b'\r' => out.push('r'),
            b'\t' => out.push('t'),
            0x08 => out.push('b'),
            0x0c => out.push('f'),
            _ => {
                out.push_str("u00");
                out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
                out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
            }
        }
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

/// A `google.protobuf.Duration` of `us` microseconds as protojson writes it: seconds
/// with 0, 3, 6 or 9 fractional digits, then `s`.
fn duration_text(us: u64, out: &mut String) {
    push_decimal(out, us / 1_000_000);
    let nanos = (us % 1_000_000) * 1000;
    let digits = match nanos {
        0 => 0,
        n if n % 1_000_000 == 0 => 3,
        n if n % 1_000 == 0 => 6,
        _ => 9,
    };
    if digits > 0 {
        out.push('.');
        // The fraction's leading digits, zero-padded to nine and cut to `digits`.
        let fraction = nanos / 10u64.pow(9 - digits) + 10u64.pow(digits);
        let at = out.len();
        push_decimal(out, fraction);
        out.remove(at); // the 1 that kept the leading zeros
    }
    out.push('s');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(write: impl FnOnce(&mut String)) -> String {
        let mut out = String::new();
        write(&mut out);
        out
    }

    #[test]
    fn durations_are_written_as_protojson_writes_them() {
        let text = |us| written(|out| duration_text(us, out));
        assert_eq!(text(60_000_000), "60s");
        assert_eq!(text(0), "0s");
        assert_eq!(text(59_500_000), "59.500s");
        assert_eq!(text(1_050_000), "1.050s");
        assert_eq!(text(250), "0.000250s");
        assert_eq!(text(1_000_001), "1.000001s");
        assert_eq!(text(u64::MAX), "18446744073709.551615s");
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let strings = [
            "",
            "plain",
            "q\"uote",
            "back\\slash",
            "\n\r\t\u{8}\u{c}",
            "\u{0}\u{1f}\u{7f}",
            "é ☃ 😀",
            "a\u{1}é\"z",
        ];
        for s in strings {
            assert_eq!(
                written(|out| json_string(s, out)),
                serde_json::to_string(s).unwrap()
            );
        }
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
        assert_eq!((r.domain.as_str(), r.hits), ("d", 3));
        let d = &r.descriptors[0];
        assert_eq!(d.hits, Some(0));
        assert_eq!(d.limit_override, Some((Unit::Minute, 7)));
        assert_eq!(r.descriptors[1].entries[0].1, "");
        assert_eq!(r.descriptors[1].limit_override, Some((Unit::Hour, 2)));
        let e = request_from_json(br#"{"domain":"d","descriptor":[]}"#).unwrap_err();
        assert!(e.contains("descriptor"), "{e}");
        let e = request_from_json(br#"{"domain":"d","hitsAddend":"lots"}"#).unwrap_err();
        assert!(e.contains("lots"), "{e}");
    }
}
