//! `traces:` in the main config, and the OpenTelemetry environment variables
//! (`OTEL_*`) read over it: what [`TraceSettings`] the server traces with, or none.
//! Pure: the environment is a lookup function, so every rule is tested without
//! touching the process's.
//!
//! Traces are off unless asked for: `traces.enabled: true`, or (with `enabled` not
//! given) an OTLP endpoint or `OTEL_TRACES_EXPORTER=otlp` in the environment, as an
//! OpenTelemetry SDK exports once it is pointed somewhere. `OTEL_SDK_DISABLED=true`
//! and `OTEL_TRACES_EXPORTER=none` turn them off whatever else says. A variable that
//! is set wins over the file, as in every OpenTelemetry SDK. A value that cannot be
//! read is an error naming the variable (or the setting); variables of other signals
//! (`OTEL_METRICS_*`, `OTEL_LOGS_*`) are not read.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    /// OTLP over gRPC (port 4317 by convention).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP, protobuf bodies (port 4318; the default, as
    /// envoyproxy/ratelimit's).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
    /// OTLP over HTTP, JSON bodies.
    #[serde(rename = "http/json")]
    HttpJson,
}

impl Protocol {
    /// Each protocol by the name it is configured with.
    const NAMES: [(&'static str, Protocol); 3] = [
        ("grpc", Protocol::Grpc),
        ("http/protobuf", Protocol::HttpProtobuf),
        ("http/json", Protocol::HttpJson),
    ];

    /// The name it is configured with (`http/protobuf`).
    pub fn name(self) -> &'static str {
        named(&Self::NAMES, self)
    }

    fn parse(name: &str, value: &str) -> anyhow::Result<Protocol> {
        parse_named(&Self::NAMES, name, value, "an OTLP protocol")
    }
}

/// The name `kind` has in `names`.
fn named<K: PartialEq + Copy>(names: &[(&'static str, K)], kind: K) -> &'static str {
    (names.iter().find(|(_, k)| *k == kind)).map_or("", |(n, _)| n)
}

/// What `value` names in `names`, else an error naming setting `name` and the
/// names it takes.
fn parse_named<K: Copy>(
    names: &[(&'static str, K)],
    name: &str,
    value: &str,
    what: &str,
) -> anyhow::Result<K> {
    match names.iter().find(|(n, _)| *n == value) {
        Some((_, k)) => Ok(*k),
        None => {
            let all: Vec<&str> = names.iter().map(|(n, _)| *n).collect();
            bail!("{name}={value}: not {what} ({})", all.join(", "))
        }
    }
}

/// Which spans are kept (OpenTelemetry's sampler names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerKind {
    /// Every span.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// A fraction of traces, by trace id (`ratio`).
    #[serde(rename = "traceidratio")]
    TraceIdRatio,
    /// As the caller's trace was sampled; a new trace: every one (the default).
    ParentbasedAlwaysOn,
    /// As the caller's trace was sampled; a new trace: none.
    ParentbasedAlwaysOff,
    /// As the caller's trace was sampled; a new trace: a fraction (`ratio`).
    #[serde(rename = "parentbased_traceidratio")]
    ParentbasedTraceIdRatio,
}

impl SamplerKind {
    /// Each sampler by OpenTelemetry's name for it (`OTEL_TRACES_SAMPLER`).
    const NAMES: [(&'static str, SamplerKind); 6] = [
        ("always_on", SamplerKind::AlwaysOn),
        ("always_off", SamplerKind::AlwaysOff),
        ("traceidratio", SamplerKind::TraceIdRatio),
        ("parentbased_always_on", SamplerKind::ParentbasedAlwaysOn),
        ("parentbased_always_off", SamplerKind::ParentbasedAlwaysOff),
        (
            "parentbased_traceidratio",
            SamplerKind::ParentbasedTraceIdRatio,
        ),
    ];

    /// OpenTelemetry's name for it (`parentbased_always_on`).
    pub fn name(self) -> &'static str {
        named(&Self::NAMES, self)
    }

    /// Whether it keeps a fraction of traces (`ratio`).
    pub fn takes_ratio(self) -> bool {
        matches!(
            self,
            SamplerKind::TraceIdRatio | SamplerKind::ParentbasedTraceIdRatio
        )
    }

    fn parse(name: &str, value: &str) -> anyhow::Result<SamplerKind> {
        parse_named(&Self::NAMES, name, value, "a sampler")
    }
}

/// A trace context format, read from requests and written to the proxy's upstreams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Propagator {
    /// W3C Trace Context (`traceparent`, `tracestate`).
    Tracecontext,
    /// W3C Baggage (`baggage`).
    Baggage,
    /// B3 (Zipkin, Envoy): read from the single `b3` header or the `x-b3-*` ones,
    /// written as the single `b3` header.
    B3,
    /// B3 read as `b3`, and written as the `x-b3-*` headers (Envoy's own form).
    B3multi,
}

impl Propagator {
    fn parse_list(name: &str, value: &str) -> anyhow::Result<Vec<Propagator>> {
        let mut out = Vec::new();
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            out.push(match part {
                "tracecontext" => Propagator::Tracecontext,
                "baggage" => Propagator::Baggage,
                "b3" => Propagator::B3,
                "b3multi" => Propagator::B3multi,
                "none" => return Ok(Vec::new()),
                _ => bail!(
                    "{name}={value}: {part:?} is not a propagator tollgate has \
                     (tracecontext, baggage, b3, b3multi, none)"
                ),
            });
        }
        Ok(out)
    }
}

/// The trace context formats when none are named: both forms of B3 (what Envoy's
/// Zipkin tracer sends) and W3C, so a caller's trace is continued whichever it
/// speaks; W3C is listed last so that it wins when a request carries both.
pub const DEFAULT_PROPAGATORS: [Propagator; 3] = [
    Propagator::B3multi,
    Propagator::Baggage,
    Propagator::Tracecontext,
];

/// `traces:`. Every field is optional; the `OTEL_*` variables named beside each win
/// over it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracesConfig {
    /// Export spans (default: only when an `OTEL_*` variable points somewhere).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The collector: for HTTP, the base URL (`/v1/traces` is added; default
    /// `http://localhost:4318`); for gRPC, its URL (default `http://localhost:4317`).
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (`..._TRACES_ENDPOINT`: a full URL, used as is).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `grpc`, `http/protobuf` (default) or `http/json`. `OTEL_EXPORTER_OTLP_PROTOCOL`.
    #[serde(default)]
    pub protocol: Option<Protocol>,
    /// Headers sent with each export (an API key: never printed).
    /// `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,...`, values percent-encoded).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How long one export may take (default 10s). `OTEL_EXPORTER_OTLP_TIMEOUT` (ms).
    #[serde(default, deserialize_with = "super::duration_opt")]
    pub timeout: Option<u64>,
    /// The CA file an `https://` collector's certificate must chain to (default: the
    /// system's). `OTEL_EXPORTER_OTLP_CERTIFICATE`.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A client certificate and key for a collector that asks for one.
    /// `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE`, `OTEL_EXPORTER_OTLP_CLIENT_KEY`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// See `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// `service.name` of the spans (default `tollgate`). `OTEL_SERVICE_NAME`.
    #[serde(default)]
    pub service_name: Option<String>,
    /// More resource attributes (`service.namespace`, `service.instance.id`, ...).
    /// `OTEL_RESOURCE_ATTRIBUTES` adds to them.
    #[serde(default)]
    pub resource: BTreeMap<String, String>,
    /// Which spans are kept (default `parentbased_always_on`). `OTEL_TRACES_SAMPLER`.
    #[serde(default)]
    pub sampler: Option<SamplerKind>,
    /// The fraction of the ratio samplers, 0 to 1 (default 1).
    /// `OTEL_TRACES_SAMPLER_ARG`.
    #[serde(default)]
    pub ratio: Option<f64>,
    /// The trace context formats (default `b3multi`, `baggage`, `tracecontext`;
    /// when a request carries several, the last listed that finds one wins).
    /// `OTEL_PROPAGATORS`.
    #[serde(default)]
    pub propagators: Option<Vec<Propagator>>,
    /// The most finished spans waiting for export (default 2048); past it spans are
    /// dropped and counted. `OTEL_BSP_MAX_QUEUE_SIZE`.
    #[serde(default)]
    pub queue: Option<usize>,
    /// The most spans in one export (default 512). `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`.
    #[serde(default)]
    pub batch: Option<usize>,
    /// The longest a finished span waits before an export (default 5s).
    /// `OTEL_BSP_SCHEDULE_DELAY` (ms).
    #[serde(default, deserialize_with = "super::duration_opt")]
    pub delay: Option<u64>,
}

/// What the server traces with (all resolved).
#[derive(Clone, PartialEq)]
pub struct TraceSettings {
    /// The export URL: for HTTP the whole URL (`.../v1/traces`), for gRPC the server.
    pub endpoint: String,
    /// The transport.
    pub protocol: Protocol,
    /// Export headers (secret).
    pub headers: Vec<(String, String)>,
    /// One export's deadline.
    pub timeout: Duration,
    /// TLS files for an `https://` endpoint.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// `service.name` from the file (default `tollgate`); `OTEL_RESOURCE_ATTRIBUTES`
    /// may name it otherwise.
    pub service_name: String,
    /// `OTEL_SERVICE_NAME`, which wins over both.
    pub service_name_override: Option<String>,
    /// Resource attributes from the file (`OTEL_RESOURCE_ATTRIBUTES` is read by the
    /// SDK's detector).
    pub resource: Vec<(String, String)>,
    /// The sampler.
    pub sampler: SamplerKind,
    /// Its ratio, 0 to 1.
    pub ratio: f64,
    /// Context formats, read in this order (the last that finds a context wins) and
    /// all written.
    pub propagators: Vec<Propagator>,
    /// Export queue bound.
    pub queue: usize,
    /// Export batch bound.
    pub batch: usize,
    /// Longest wait before an export.
    pub delay: Duration,
}

/// Never prints the headers (they carry API keys).
impl std::fmt::Debug for TraceSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceSettings")
            .field("endpoint", &self.endpoint)
            .field("protocol", &self.protocol)
            .field("headers", &format!("{} (hidden)", self.headers.len()))
            .field("sampler", &self.sampler)
            .field("ratio", &self.ratio)
            .field("propagators", &self.propagators)
            .finish_non_exhaustive()
    }
}

/// The environment as the OTel variables are read: unset and blank are the same.
struct Env<'a>(&'a dyn Fn(&str) -> Option<String>);

impl Env<'_> {
    fn var(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|v| !v.trim().is_empty())
    }

    /// The first of a signal's own variable and the general one that is set.
    fn either(&self, signal: &str, general: &str) -> Option<(String, String)> {
        (self.var(signal).map(|v| (signal.to_string(), v)))
            .or_else(|| self.var(general).map(|v| (general.to_string(), v)))
    }

    /// A signal's or the general path variable, else the file's.
    fn path(&self, signal: &str, general: &str, file: &Option<PathBuf>) -> Option<PathBuf> {
        (self.either(signal, general).map(|(_, v)| PathBuf::from(v))).or_else(|| file.clone())
    }

    /// A whole number above 0 from `name`, else the file's, else `default`.
    fn count(&self, name: &str, file: Option<usize>, default: usize) -> anyhow::Result<usize> {
        match self.var(name) {
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => bail!("{name}={v}: not a whole number above 0"),
            },
            None => Ok(file.unwrap_or(default)),
        }
    }
}

/// Milliseconds above 0, as the OTel variables give times.
fn ms(name: &str, v: &str) -> anyhow::Result<Duration> {
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => bail!("{name}={v}: not a whole number of milliseconds above 0"),
    }
}

/// Whether a URL carries credentials (`user:pass@`), which would be printed.
fn has_userinfo(url: &str) -> bool {
    url.split_once("://").is_some_and(|(_, rest)| {
        rest.split(['/', '?', '#'])
            .next()
            .is_some_and(|a| a.contains('@'))
    })
}

/// Where and how spans are sent: the endpoint, its protocol, headers and timeout.
type Export = (String, Protocol, Vec<(String, String)>, Duration);

/// The collector's CA file, and our certificate and key files.
type ExportTls = (Option<PathBuf>, Option<(PathBuf, PathBuf)>);

impl TracesConfig {
    /// The settings to trace with, or `None` when traces are off; `get` reads the
    /// environment.
    pub fn resolve(
        &self,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Option<TraceSettings>> {
        let env = Env(get);
        if !self.wanted(&env)? {
            return Ok(None);
        }
        let (endpoint, protocol, headers, timeout) = self.export(&env)?;
        let (ca_file, identity) = self.export_tls(&env)?;
        let sampler = match env.var("OTEL_TRACES_SAMPLER") {
            Some(v) => SamplerKind::parse("OTEL_TRACES_SAMPLER", &v)?,
            None => self.sampler.unwrap_or(SamplerKind::ParentbasedAlwaysOn),
        };
        let ratio = match env.var("OTEL_TRACES_SAMPLER_ARG") {
            Some(v) => (v.trim().parse::<f64>().ok())
                .with_context(|| format!("OTEL_TRACES_SAMPLER_ARG={v}: not a number"))?,
            None => self.ratio.unwrap_or(1.0),
        };
        if !(0.0..=1.0).contains(&ratio) {
            bail!("traces: the sampling ratio {ratio} is not between 0 and 1 (ratio, OTEL_TRACES_SAMPLER_ARG)");
        }
        let propagators = match env.var("OTEL_PROPAGATORS") {
            Some(v) => Propagator::parse_list("OTEL_PROPAGATORS", &v)?,
            None => (self.propagators.clone()).unwrap_or_else(|| DEFAULT_PROPAGATORS.to_vec()),
        };
        let (queue, batch, delay) = self.batching(&env)?;
        Ok(Some(TraceSettings {
            endpoint,
            protocol,
            headers,
            timeout,
            ca_file,
            identity,
            service_name: (self.service_name.clone()).unwrap_or_else(|| "tollgate".into()),
            service_name_override: env.var("OTEL_SERVICE_NAME"),
            resource: self.resource.clone().into_iter().collect(),
            sampler,
            ratio,
            propagators,
            queue,
            batch,
            delay,
        }))
    }

    /// Whether traces are on: not `OTEL_SDK_DISABLED`, and asked for (`enabled`,
    /// `OTEL_TRACES_EXPORTER=otlp`, or an endpoint variable set).
    fn wanted(&self, env: &Env) -> anyhow::Result<bool> {
        // The specification: only "true" disables; any other value is false, said.
        let disabled = match env.var("OTEL_SDK_DISABLED") {
            Some(v) if v.trim().eq_ignore_ascii_case("true") => true,
            Some(v) if v.trim().eq_ignore_ascii_case("false") => false,
            Some(v) => {
                tracing::warn!("OTEL_SDK_DISABLED={v}: not true or false, taken as false");
                false
            }
            None => false,
        };
        let exporter = match env.var("OTEL_TRACES_EXPORTER").as_deref() {
            None => None,
            Some("otlp") => Some(true),
            Some("none") => Some(false),
            Some(other) => bail!(
                "OTEL_TRACES_EXPORTER={other}: tollgate exports traces by OTLP only (otlp, none)"
            ),
        };
        let endpoint_var = env.either(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        );
        let wanted = match (self.enabled, exporter) {
            (_, Some(false)) => false,
            (Some(enabled), _) => enabled,
            (None, Some(true)) => true,
            (None, None) => endpoint_var.is_some(),
        };
        Ok(!disabled && wanted)
    }

    /// Where and how spans are sent (the variables before the file).
    fn export(&self, env: &Env) -> anyhow::Result<Export> {
        let endpoint_var = env.either(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        );
        let protocol = match env.either(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) {
            Some((name, v)) => Protocol::parse(&name, &v)?,
            None => self.protocol.unwrap_or(Protocol::HttpProtobuf),
        };
        // Credentials in a URL would be printed (the banner, errors): refused, unprinted.
        match &endpoint_var {
            Some((name, url)) if has_userinfo(url) => bail!(
                "{name}: credentials in the URL are not taken (they would be printed): send them as OTEL_EXPORTER_OTLP_HEADERS"
            ),
            None if self.endpoint.as_deref().is_some_and(has_userinfo) => bail!(
                "traces.endpoint: credentials in the URL are not taken (they would be printed): send them in traces.headers"
            ),
            _ => {}
        }
        let endpoint = match endpoint_var {
            Some((name, url)) => {
                let signal = name.contains("TRACES");
                endpoint_url(&url, protocol, signal).with_context(|| format!("{name}={url}"))?
            }
            None => {
                let url = self.endpoint.clone().unwrap_or_else(|| match protocol {
                    Protocol::Grpc => "http://localhost:4317".into(),
                    _ => "http://localhost:4318".into(),
                });
                endpoint_url(&url, protocol, false)
                    .with_context(|| format!("traces.endpoint: {url}"))?
            }
        };
        let headers = match env.either(
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ) {
            // The value is not repeated in the error: it holds secrets.
            Some((name, v)) => parse_headers(&v).with_context(|| name.clone())?,
            None => self.headers.clone().into_iter().collect(),
        };
        let timeout = match env.either(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ) {
            Some((name, v)) => ms(&name, &v)?,
            None => Duration::from_micros(self.timeout.unwrap_or(10_000_000)),
        };
        if let Some((name, v)) = env.either(
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ) {
            if v != "none" {
                bail!("{name}={v}: tollgate sends traces uncompressed (none)");
            }
        }
        Ok((endpoint, protocol, headers, timeout))
    }

    /// The collector's CA and our client certificate, when given.
    fn export_tls(&self, env: &Env) -> anyhow::Result<ExportTls> {
        let ca_file = env.path(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            &self.ca_file,
        );
        let cert = env.path(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            &self.cert_file,
        );
        let key = env.path(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
            &self.key_file,
        );
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => bail!(
                "traces: a client certificate needs both its certificate and its key \
                 (cert_file and key_file, or OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and \
                 OTEL_EXPORTER_OTLP_CLIENT_KEY)"
            ),
        };
        Ok((ca_file, identity))
    }

    /// The export queue: its size, the batch and the delay between exports.
    fn batching(&self, env: &Env) -> anyhow::Result<(usize, usize, Duration)> {
        let queue = env.count("OTEL_BSP_MAX_QUEUE_SIZE", self.queue, 2048)?;
        let batch = (env.count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", self.batch, 512)?).min(queue);
        if self.queue == Some(0) || self.batch == Some(0) {
            bail!("traces.queue and traces.batch: must be at least 1");
        }
        if self.timeout == Some(0) || self.delay == Some(0) {
            bail!("traces.timeout and traces.delay: must be longer than 0");
        }
        let delay = match env.var("OTEL_BSP_SCHEDULE_DELAY") {
            Some(v) => ms("OTEL_BSP_SCHEDULE_DELAY", &v)?,
            None => Duration::from_micros(self.delay.unwrap_or(5_000_000)),
        };
        Ok((queue, batch, delay))
    }
}

/// The URL spans are sent to: an HTTP base gets `/v1/traces` (a signal's own
/// variable is used as is, as the OTLP exporter specification says); gRPC takes the
/// server's URL.
fn endpoint_url(url: &str, protocol: Protocol, signal: bool) -> anyhow::Result<String> {
    let uri: http::Uri = url.parse().map_err(|e| anyhow::anyhow!("not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => bail!("the URL must start with http:// or https://"),
    }
    if uri.host().is_none() {
        bail!("the URL names no host");
    }
    if protocol == Protocol::Grpc || signal {
        return Ok(url.to_string());
    }
    Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
}

/// `key=value,key2=value2`, values percent-decoded (the OTLP exporter's form).
fn parse_headers(text: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (i, pair) in text.split(',').enumerate() {
        if pair.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = pair.split_once('=') else {
            bail!("entry {}: not key=value", i + 1);
        };
        let (k, v) = (k.trim(), percent_decode(v.trim()));
        let value = v.with_context(|| format!("entry {} ({k}): a bad %-escape", i + 1))?;
        if http::HeaderName::from_bytes(k.as_bytes()).is_err()
            || http::HeaderValue::from_str(&value).is_err()
        {
            bail!("entry {} ({k}): not a valid HTTP header", i + 1);
        }
        out.push((k.to_string(), value));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    fn file(yaml: &str) -> TracesConfig {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn off_unless_asked_for() {
        let none = TracesConfig::default();
        assert!(none.resolve(&env(&[])).unwrap().is_none());
        let on = none
            .resolve(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]))
            .unwrap()
            .unwrap();
        assert_eq!(on.endpoint, "http://c:4318/v1/traces");
        assert_eq!(on.protocol, Protocol::HttpProtobuf);
        assert_eq!(on.sampler, SamplerKind::ParentbasedAlwaysOn);
        assert!(none
            .resolve(&env(&[("OTEL_TRACES_EXPORTER", "otlp")]))
            .unwrap()
            .is_some());
        // An explicit `enabled: false` (what --envoy-env writes without
        // TRACING_ENABLED) is not turned on by an endpoint alone.
        let off = file("enabled: false");
        let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        assert!(off.resolve(&env(&endpoint)).unwrap().is_none());
        let on = file("enabled: true");
        assert!(on.resolve(&env(&[])).unwrap().is_some());
        for kill in [
            ("OTEL_SDK_DISABLED", "true"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ] {
            assert!(on.resolve(&env(&[kill])).unwrap().is_none(), "{kill:?}");
        }
    }

    #[test]
    fn variables_win_over_the_file_and_endpoints_follow_the_specification() {
        let f = file(
            "enabled: true\nendpoint: http://file:4318/\nservice_name: svc\nsampler: traceidratio\nratio: 0.5\nqueue: 10\nbatch: 50\n",
        );
        let s = f.resolve(&env(&[])).unwrap().unwrap();
        assert_eq!(s.endpoint, "http://file:4318/v1/traces");
        assert_eq!(
            (s.service_name.as_str(), s.ratio, s.queue, s.batch),
            ("svc", 0.5, 10, 10)
        );
        let s = f
            .resolve(&env(&[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://sig:1/custom"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
                ("OTEL_SERVICE_NAME", "envsvc"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
                ("OTEL_PROPAGATORS", "b3"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%3Db,x=y"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "250"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(s.endpoint, "https://sig:1/custom");
        assert_eq!(s.service_name, "svc");
        assert_eq!(s.service_name_override.as_deref(), Some("envsvc"));
        assert_eq!(
            (s.sampler, s.ratio),
            (SamplerKind::ParentbasedTraceIdRatio, 0.01)
        );
        assert_eq!(s.propagators, vec![Propagator::B3]);
        assert_eq!(
            s.headers,
            vec![("api-key".into(), "a=b".into()), ("x".into(), "y".into())]
        );
        assert_eq!(s.timeout, Duration::from_millis(250));
        let grpc = f
            .resolve(&env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]))
            .unwrap()
            .unwrap();
        assert_eq!(grpc.endpoint, "http://file:4318/");
        let grpc = TracesConfig::default()
            .resolve(&env(&[
                ("OTEL_TRACES_EXPORTER", "otlp"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(grpc.endpoint, "http://localhost:4317");
    }

    #[test]
    fn a_bad_value_names_its_variable_and_hides_secrets() {
        let on = file("enabled: true");
        for (name, value, says) in [
            ("OTEL_TRACES_SAMPLER", "sometimes", "not a sampler"),
            ("OTEL_TRACES_SAMPLER_ARG", "half", "not a number"),
            ("OTEL_TRACES_SAMPLER_ARG", "2", "between 0 and 1"),
            (
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                "thrift",
                "not an OTLP protocol",
            ),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318", "http://"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s", "milliseconds"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip", "uncompressed"),
            ("OTEL_PROPAGATORS", "tracecontext,jaeger", "jaeger"),
            ("OTEL_TRACES_EXPORTER", "zipkin", "OTLP only"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "above 0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "soon", "milliseconds"),
        ] {
            let e = format!("{:#}", on.resolve(&env(&[(name, value)])).unwrap_err());
            assert!(e.contains(name), "{name}: {e}");
            assert!(e.contains(says), "{name}: {e}");
        }
        let e = format!(
            "{:#}",
            on.resolve(&env(&[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%zzsecret"
            )]))
            .unwrap_err()
        );
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_HEADERS") && !e.contains("secret"),
            "{e}"
        );
        let s = on
            .resolve(&env(&[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=topsecret",
            )]))
            .unwrap()
            .unwrap();
        assert!(!format!("{s:?}").contains("topsecret"));
        let e = format!(
            "{:#}",
            on.resolve(&env(&[(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://u:s3cret@c:4318"
            )]))
            .unwrap_err()
        );
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && !e.contains("s3cret"),
            "{e}"
        );
        // Only "true" disables; another value is false (with a warning), as specified.
        assert!(on
            .resolve(&env(&[("OTEL_SDK_DISABLED", "1")]))
            .unwrap()
            .is_some());
        let e = serde_yaml_ng::from_str::<TracesConfig>("sampler: sometimes").unwrap_err();
        assert!(e.to_string().contains("sometimes"), "{e}");
    }
}
