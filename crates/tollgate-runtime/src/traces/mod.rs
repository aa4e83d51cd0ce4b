//! OpenTelemetry traces: the tracer `serve` and the proxy start their spans with,
//! the trace context formats read from requests and written to upstreams, and the
//! export to an OTLP collector through a bounded queue ([`export`]).
//!
//! Off (no `traces:` and no `OTEL_*` endpoint) nothing here is built and a request
//! pays one branch. On, a request pays the context's extraction and the sampler;
//! only a sampled span records attributes and is exported.

pub mod export;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceId, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_propagator_b3::B3Encoding;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::trace::{
    IdGenerator as _, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider, SpanExporter as _,
};
use opentelemetry_sdk::Resource;

use crate::config::traces::{Propagator, Protocol, SamplerKind, TraceSettings};
use crate::tls::ClientTls;
use export::{ExportStats, OtlpHttp, Queue};

pub use opentelemetry_sdk::trace::Span;

/// The tracer of a running server.
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TextMapCompositePropagator,
    /// The formats written to upstreams.
    formats: Vec<Propagator>,
    queue: Queue,
    stats: Arc<ExportStats>,
    /// What the start banner says (no secrets).
    summary: String,
    /// The share of new traces (calls without a parent) the sampler keeps, when it
    /// decides them by trace id alone (`None`: it keeps them all).
    root_share: Option<f64>,
    /// Whether the sampler follows a caller's decision (the `parentbased_*` ones).
    follows_parent: bool,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tracing({})", self.summary)
    }
}

impl Tracing {
    /// Builds the exporter and tracer for `settings`, spawning the export task on
    /// the current Tokio runtime. Errors name the setting (a TLS file, the URL).
    pub fn start(settings: &TraceSettings) -> anyhow::Result<Tracing> {
        let s = settings;
        // What is added later wins: the file's (and the default name), then
        // OTEL_RESOURCE_ATTRIBUTES, then OTEL_SERVICE_NAME, as the specification orders.
        let mut resource = Resource::builder_empty()
            .with_service_name(s.service_name.clone())
            .with_attributes((s.resource.iter()).map(|(k, v)| KeyValue::new(k.clone(), v.clone())))
            .with_detector(Box::new(EnvResourceDetector::new()));
        if let Some(name) = &s.service_name_override {
            resource = resource.with_service_name(name.clone());
        }
        let resource = resource.build();
        let uri: http::Uri = s.endpoint.parse()?;
        let https = uri.scheme_str() == Some("https");
        let client_tls = |alpn: &[&[u8]]| -> anyhow::Result<Option<ClientTls>> {
            if !https {
                return Ok(None);
            }
            let identity = (s.identity.as_ref()).map(|(c, k)| (c.as_path(), k.as_path()));
            ClientTls::load("traces", s.ca_file.as_deref(), identity, alpn).map(Some)
        };
        let mut exporter = match s.protocol {
            Protocol::Grpc => {
                let mut metadata = http::HeaderMap::new();
                for (k, v) in &s.headers {
                    metadata.insert(http::HeaderName::from_bytes(k.as_bytes())?, v.parse()?);
                }
                let channel = grpc_channel(&uri, client_tls(&[b"h2"])?, s.timeout)?;
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_channel(channel)
                    .with_timeout(s.timeout)
                    .with_metadata(tonic::metadata::MetadataMap::from_headers(metadata))
                    .build()?
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                let client = OtlpHttp::new(&uri, client_tls(&[b"http/1.1"])?)?;
                let protocol = match s.protocol {
                    Protocol::HttpJson => opentelemetry_otlp::Protocol::HttpJson,
                    _ => opentelemetry_otlp::Protocol::HttpBinary,
                };
                opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(s.endpoint.clone())
                    .with_protocol(protocol)
                    .with_timeout(s.timeout)
                    .with_headers(s.headers.iter().cloned().collect())
                    .with_http_client(client)
                    .build()?
            }
        };
        exporter.set_resource(&resource);
        let (queue, stats) = Queue::start(exporter, s.queue, s.batch, s.delay, s.timeout);
        let (sdk_sampler, root_share, follows_parent) = sampler(s.sampler, s.ratio);
        let provider = SdkTracerProvider::builder()
            .with_id_generator(DrawnIds)
            .with_span_processor(queue.clone())
            .with_sampler(sdk_sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tollgate");
        let propagator = TextMapCompositePropagator::new(
            (s.propagators.iter()).map(|p| propagator(*p)).collect(),
        );
        let ratio = match s.sampler.takes_ratio() {
            true => format!(" {}", s.ratio),
            false => String::new(),
        };
        let summary = format!(
            "{} {}, sampler {}{ratio}, service {}",
            s.endpoint,
            s.protocol.name(),
            s.sampler.name(),
            (s.service_name_override.as_ref()).unwrap_or(&s.service_name)
        );
        Ok(Tracing {
            provider,
            tracer,
            propagator,
            formats: s.propagators.clone(),
            queue,
            stats,
            summary,
            root_share,
            follows_parent,
        })
    }

    /// Where spans go and how they are sampled, for the start banner.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// What became of finished spans.
    pub fn stats(&self) -> &Arc<ExportStats> {
        &self.stats
    }

    /// The caller's trace context in `headers` (HTTP headers or gRPC metadata); an
    /// empty context when there is none or it is malformed (the span then starts a
    /// new trace).
    pub fn parent(&self, headers: &http::HeaderMap) -> Context {
        self.parent_from(headers.keys().map(|k| k.as_str()), &Scan(headers))
    }

    /// The caller's context from headers named `names` that `headers` reads (the
    /// proxy's fast path parses them without a map). A request without any trace
    /// header is not searched further.
    pub fn parent_from<'a>(
        &self,
        mut names: impl Iterator<Item = &'a str>,
        headers: &dyn Extractor,
    ) -> Context {
        if !names.any(is_trace_header) {
            return Context::new();
        }
        self.propagator.extract(headers)
    }

    /// A span of `kind`, child of `parent` (not recording when the sampler left it
    /// out); `describe` gives its name and attributes, asked only when it records
    /// (most requests, under a ratio sampler, build neither).
    pub fn span(
        &self,
        parent: &Context,
        kind: SpanKind,
        describe: impl FnOnce() -> Description,
    ) -> Span {
        let mut span = (self.tracer.span_builder(UNNAMED))
            .with_kind(kind)
            .start_with_context(&self.tracer, parent);
        if span.is_recording() {
            let (name, attributes) = describe();
            span.update_name(name);
            span.set_attributes(attributes);
        }
        span
    }

    /// A server span for a call whose request carried `headers`: the context holding
    /// it, or `None` when the sampler left it out (nothing is recorded then).
    pub fn call_span(
        &self,
        headers: &http::HeaderMap,
        describe: impl FnOnce() -> Description,
    ) -> Option<Context> {
        let parent = self.parent(headers);
        // What the sampler would drop is dropped here, before a span is built: the
        // builder, the span and their context look-ups cost 1,300 instructions a call
        // (callgrind), for the 99% of calls that record nothing. A caller's unsampled
        // trace under a parent-based sampler (Envoy sampling 1%), or a new trace under
        // a ratio sampler, drawn by the sampler's own rule on a trace id made here.
        let has_parent = parent.has_active_span();
        if has_parent && self.follows_parent && !parent.span().span_context().is_sampled() {
            return None;
        }
        if let Some(share) = self.root_share.filter(|_| !has_parent) {
            let id = RandomIdGenerator::default().new_trace_id();
            if !kept(share, id) {
                return None;
            }
            // The span below takes this id (DrawnIds), so the sampler keeps it too.
            DRAWN.with(|d| d.set(Some(id)));
        }
        let span = self.span(&parent, SpanKind::Server, describe);
        span.is_recording().then(|| parent.with_span(span))
    }

    /// A child span of `parent`'s span (a client call: Redis, the upstream).
    pub fn child_span(&self, parent: &Context, name: &'static str, kind: SpanKind) -> Span {
        let builder = self.tracer.span_builder(name).with_kind(kind);
        builder.start_with_context(&self.tracer, parent)
    }

    /// A client span for a call to the store (Redis), child of the current context's
    /// span, or `None` when that is not recording.
    pub fn store_span(&self) -> Option<Span> {
        let mut span = Context::map_current(|cx| {
            (cx.span().is_recording()).then(|| self.child_span(cx, "redis", SpanKind::Client))
        })?;
        span.set_attribute(KeyValue::new("db.system.name", "redis"));
        Some(span)
    }

    /// The headers that carry the trace context of `span` (and `cx`'s baggage) to an
    /// upstream, in every configured format. W3C and B3 are written here, not by the
    /// propagators: theirs format each id through `format!`, which cost the proxy
    /// 4,000 instructions a request (callgrind).
    pub fn inject(&self, cx: &Context, span: &SpanContext) -> Outgoing {
        let mut out = Outgoing {
            headers: Vec::with_capacity(4),
            formats: self.formats.iter().fold(0, |m, p| m | group(*p)),
        };
        let sampled = span.is_sampled();
        // `TRACE-SPAN-F`: the ids in hex, then B3's sampled flag.
        let mut ids = [b'-'; 51];
        hex(&mut ids[..32], &span.trace_id().to_bytes());
        hex(&mut ids[33..49], &span.span_id().to_bytes());
        ids[50] = if sampled { b'1' } else { b'0' };
        let ids = std::str::from_utf8(&ids).expect("hex and dashes");
        let text = |s: &str| String::from(s);
        for p in &self.formats {
            match p {
                Propagator::Tracecontext => {
                    let mut parent = String::with_capacity(55);
                    parent.push_str("00-");
                    parent.push_str(&ids[..49]);
                    parent.push_str(if sampled { "-01" } else { "-00" });
                    out.headers.push(("traceparent", parent));
                    let state = span.trace_state().header();
                    if !state.is_empty() && http::HeaderValue::from_str(&state).is_ok() {
                        out.headers.push(("tracestate", state));
                    }
                }
                Propagator::B3 => out.headers.push(("b3", text(ids))),
                Propagator::B3multi => {
                    out.headers.push(("x-b3-traceid", text(&ids[..32])));
                    out.headers.push(("x-b3-spanid", text(&ids[33..49])));
                    out.headers.push(("x-b3-sampled", text(&ids[50..])));
                }
                Propagator::Baggage => BaggagePropagator::new().inject_context(cx, &mut out),
            }
        }
        out
    }

    /// Sends the spans still queued (at a server's end), waiting at most `within`.
    pub async fn flush(&self, within: Duration) {
        self.queue.flush(within).await;
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Every header a propagator reads or writes.
pub const TRACE_HEADERS: [&str; 9] = [
    "traceparent",
    "tracestate",
    "baggage",
    "b3",
    "x-b3-traceid",
    "x-b3-spanid",
    "x-b3-parentspanid",
    "x-b3-sampled",
    "x-b3-flags",
];

/// Whether `name` is one of [`TRACE_HEADERS`] (in any case).
pub fn is_trace_header(name: &str) -> bool {
    TRACE_HEADERS.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// A header map read by a scan of its few entries: cheaper than a look-up, which
/// parses and hashes each of the propagators' names.
struct Scan<'a>(&'a http::HeaderMap);

impl Extractor for Scan<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let (_, value) = self.0.iter().find(|(name, _)| name.as_str() == key)?;
        value.to_str().ok()
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// A span's name and attributes.
pub type Description = (Cow<'static, str>, Vec<KeyValue>);

/// The name a span starts with, replaced once the sampler keeps it.
const UNNAMED: &str = "span";

/// Writes `bytes` (an id) into `out` in lower-case hex, as W3C and B3 write ids.
fn hex(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// The trace headers for an upstream ([`Tracing::inject`]), which replace the
/// client's headers of the same formats (and only those).
#[derive(Debug, Default)]
pub struct Outgoing {
    /// The headers to send.
    pub headers: Vec<(&'static str, String)>,
    /// The formats written ([`group`] bits).
    formats: u8,
}

impl Outgoing {
    /// Whether the client's header `name` is replaced: it belongs to a format written.
    pub fn replaces(&self, name: &str) -> bool {
        let is = |n: &str| name.eq_ignore_ascii_case(n);
        let b3 = is("b3")
            || name
                .get(..5)
                .is_some_and(|p| p.eq_ignore_ascii_case("x-b3-"));
        let group = match () {
            _ if is("traceparent") || is("tracestate") => W3C,
            _ if is("baggage") => BAGGAGE,
            _ if b3 => B3,
            _ => 0,
        };
        self.formats & group != 0
    }
}

/// The header groups of the formats.
const W3C: u8 = 1;
const BAGGAGE: u8 = 2;
const B3: u8 = 4;

fn group(p: Propagator) -> u8 {
    match p {
        Propagator::Tracecontext => W3C,
        Propagator::Baggage => BAGGAGE,
        Propagator::B3 | Propagator::B3multi => B3,
    }
}

impl Injector for Outgoing {
    /// Only `baggage` comes this way (from its propagator). A value that is not a
    /// valid header value is not sent: the baggage propagator writes back what it
    /// percent-decoded, and a CR LF in it would split the upstream request.
    fn set(&mut self, key: &str, value: String) {
        if key == "baggage" && !value.is_empty() && http::HeaderValue::from_str(&value).is_ok() {
            self.headers.push(("baggage", value));
        }
    }
}

/// Ends a span from [`Tracing::store_span`], with the call's error if it failed.
pub fn end_store_span<E: std::fmt::Display>(span: Option<Span>, error: Option<&E>) {
    if let Some(mut span) = span {
        if let Some(e) = error {
            span.set_status(Status::error(e.to_string()));
        }
        span.end();
    }
}

/// The export's counts at `/metrics`: `tollgate_trace_spans_total{outcome}`.
#[derive(Debug)]
pub struct SpanCounts(Arc<ExportStats>);

impl SpanCounts {
    /// The counts of `tracing`'s export.
    pub fn of(tracing: &Tracing) -> Box<SpanCounts> {
        Box::new(SpanCounts(tracing.stats.clone()))
    }
}

impl prometheus_client::collector::Collector for SpanCounts {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::NoLabelSet;
        use std::sync::atomic::Ordering::Relaxed;
        let mut spans = encoder.encode_descriptor(
            "tollgate_trace_spans",
            "Sampled spans by outcome: exported, dropped (the export queue was full: the collector is slow or down) or failed (the export was refused or timed out)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (outcome, n) in [
            ("exported", &self.0.exported),
            ("dropped", &self.0.dropped),
            ("failed", &self.0.failed),
        ] {
            (spans.encode_family(&[("outcome", outcome)])?)
                .encode_counter::<NoLabelSet, _, u64>(&n.load(Relaxed), None)?;
        }
        Ok(())
    }
}

/// What an HTTP answer writes on its span: the status code attribute, and an error
/// from 500 up (`serve`'s calls and the proxy's requests alike).
pub fn http_answer(status: u16) -> (KeyValue, Option<String>) {
    let code = KeyValue::new("http.response.status_code", i64::from(status));
    (code, (status >= 500).then(|| format!("HTTP {status}")))
}

/// Ends the span in `cx`, with `attribute` and an error status when given.
pub fn end(cx: &Context, attribute: Option<KeyValue>, error: Option<String>) {
    let span = cx.span();
    if let Some(attribute) = attribute {
        span.set_attribute(attribute);
    }
    if let Some(error) = error {
        span.set_status(Status::error(error));
    }
    span.end();
}

thread_local! {
    /// The trace id [`Tracing::call_span`] drew for the span it builds next.
    static DRAWN: std::cell::Cell<Option<TraceId>> = const { std::cell::Cell::new(None) };
}

/// Trace ids: the one drawn for the next span on this thread ([`DRAWN`]), else a
/// random one.
#[derive(Debug)]
struct DrawnIds;

impl opentelemetry_sdk::trace::IdGenerator for DrawnIds {
    fn new_trace_id(&self) -> TraceId {
        (DRAWN.with(|d| d.take())).unwrap_or_else(|| RandomIdGenerator::default().new_trace_id())
    }

    fn new_span_id(&self) -> opentelemetry::trace::SpanId {
        RandomIdGenerator::default().new_span_id()
    }
}

/// Whether a ratio sampler keeping `share` keeps trace `id`: OpenTelemetry's rule
/// (the id's low 63 bits under `share` of 2^63), which the SDK's sampler applies
/// again to the span, and agrees.
fn kept(share: f64, id: TraceId) -> bool {
    if share >= 1.0 {
        return true;
    }
    let bound = (share.max(0.0) * (1u64 << 63) as f64) as u64;
    let low = u64::from_be_bytes(id.to_bytes()[8..].try_into().unwrap_or([0; 8]));
    (low >> 1) < bound
}

/// What sampler `kind` means: the SDK's sampler; the share of new traces it keeps
/// when it decides by trace id alone (`None`: all of them); and whether it follows
/// the caller's decision when there is one.
fn sampler(kind: SamplerKind, ratio: f64) -> (Sampler, Option<f64>, bool) {
    let (root, share) = match kind {
        SamplerKind::AlwaysOn | SamplerKind::ParentbasedAlwaysOn => (Sampler::AlwaysOn, None),
        SamplerKind::AlwaysOff | SamplerKind::ParentbasedAlwaysOff => {
            (Sampler::AlwaysOff, Some(0.0))
        }
        SamplerKind::TraceIdRatio | SamplerKind::ParentbasedTraceIdRatio => {
            (Sampler::TraceIdRatioBased(ratio), Some(ratio))
        }
    };
    let parent_based = matches!(
        kind,
        SamplerKind::ParentbasedAlwaysOn
            | SamplerKind::ParentbasedAlwaysOff
            | SamplerKind::ParentbasedTraceIdRatio
    );
    match parent_based {
        true => (Sampler::ParentBased(Box::new(root)), share, true),
        false => (root, share, false),
    }
}

/// The propagator that reads `p` from requests.
fn propagator(p: Propagator) -> Box<dyn TextMapPropagator + Send + Sync> {
    match p {
        Propagator::Tracecontext => Box::new(TraceContextPropagator::new()),
        Propagator::Baggage => Box::new(BaggagePropagator::new()),
        // Read in either form (the single `b3` header first); [`Tracing::inject`]
        // writes the one asked for.
        Propagator::B3 | Propagator::B3multi => {
            Box::new(opentelemetry_propagator_b3::Propagator::with_encoding(
                B3Encoding::SingleAndMultiHeader,
            ))
        }
    }
}

/// A lazily connected channel to a gRPC collector: plaintext, or TLS by `tls`.
fn grpc_channel(
    uri: &http::Uri,
    tls: Option<ClientTls>,
    timeout: Duration,
) -> anyhow::Result<tonic::transport::Channel> {
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri
        .port_u16()
        .unwrap_or(if tls.is_some() { 443 } else { 80 });
    let authority = uri.authority().map_or(host.clone(), |a| a.to_string());
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))?
        .connect_timeout(timeout)
        .timeout(timeout)
        .tcp_nodelay(true);
    let Some(tls) = tls else {
        return Ok(endpoint.connect_lazy());
    };
    let name = rustls::pki_types::ServerName::try_from(host.clone())
        .map_err(|_| anyhow::anyhow!("traces.endpoint: {host}: not a DNS name or IP address"))?;
    let connect = tower::service_fn(move |_: http::Uri| {
        let (tls, name, host) = (tls.clone(), name.clone(), host.clone());
        async move {
            let stream = tls.connect(name, &host, port).await?;
            std::io::Result::Ok(hyper_util::rt::TokioIo::new(stream))
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connect))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::traces::TracesConfig;
    use opentelemetry::trace::{SpanId, TraceFlags, TraceId, TraceState};

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    fn tracing(propagators: &str) -> Tracing {
        let file: TracesConfig = serde_yaml_ng::from_str(&format!(
            "enabled: true\nendpoint: http://127.0.0.1:9\npropagators: {propagators}\n"
        ))
        .unwrap();
        Tracing::start(&file.resolve(&|_| None).unwrap().unwrap()).unwrap()
    }

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    #[tokio::test]
    async fn every_format_is_written_as_its_specification_spells_it() {
        let t = tracing("[b3, tracecontext, b3multi, baggage]");
        let span = |flags| {
            let (trace, id) = (
                TraceId::from_hex(TRACE).unwrap(),
                SpanId::from_hex(SPAN).unwrap(),
            );
            SpanContext::new(trace, id, flags, false, TraceState::default())
        };
        let out = t
            .inject(&Context::new(), &span(TraceFlags::SAMPLED))
            .headers;
        let expected = [
            ("b3", format!("{TRACE}-{SPAN}-1")),
            ("traceparent", format!("00-{TRACE}-{SPAN}-01")),
            ("x-b3-traceid", TRACE.to_string()),
            ("x-b3-spanid", SPAN.to_string()),
            ("x-b3-sampled", "1".to_string()),
        ];
        assert_eq!(out, expected);
        let written = t.inject(&Context::new(), &span(TraceFlags::default()));
        for name in ["Traceparent", "tracestate", "b3", "X-B3-Sampled", "baggage"] {
            assert!(written.replaces(name), "{name}");
        }
        assert!(!written.replaces("x-b3") && !written.replaces("content-type"));
        let out = written.headers;
        assert_eq!(out[0].1, format!("{TRACE}-{SPAN}-0"));
        assert_eq!(out[1].1, format!("00-{TRACE}-{SPAN}-00"));
        assert_eq!(out[4].1, "0");
    }

    #[test]
    fn the_root_draw_is_the_samplers_own_rule() {
        use opentelemetry_sdk::trace::{SamplingDecision, ShouldSample};
        for share in [0.0, 0.01, 0.5, 0.999, 1.0] {
            let sdk = Sampler::TraceIdRatioBased(share);
            for _ in 0..20_000 {
                let id = RandomIdGenerator::default().new_trace_id();
                let r = sdk.should_sample(None, id, "x", &SpanKind::Server, &[], &[]);
                let sdk_keeps = r.decision == SamplingDecision::RecordAndSample;
                assert_eq!(kept(share, id), sdk_keeps, "{share} {id}");
            }
        }
    }

    /// Under a ratio sampler, new traces are kept in their share, each span under
    /// the id drawn for it; a caller's sampled trace is followed whatever the draw,
    /// and its unsampled one too (nothing recorded).
    #[tokio::test]
    async fn a_ratio_sampler_keeps_its_share_of_new_traces() {
        let file: TracesConfig = serde_yaml_ng::from_str(
            "enabled: true\nendpoint: http://127.0.0.1:9\nsampler: parentbased_traceidratio\nratio: 0.25\n",
        )
        .unwrap();
        let t = Tracing::start(&file.resolve(&|_| None).unwrap().unwrap()).unwrap();
        let none = http::HeaderMap::new();
        let calls = 20_000;
        let kept_calls = (0..calls)
            .filter_map(|_| t.call_span(&none, || ("call".into(), vec![])))
            .inspect(|cx| {
                let span = cx.span();
                let id = span.span_context().trace_id();
                assert!(span.is_recording() && kept(0.25, id), "{id}");
            })
            .count();
        assert!(
            (4_500..5_500).contains(&kept_calls),
            "{kept_calls} of {calls}"
        );
        assert!(DRAWN.with(|d| d.get()).is_none(), "a drawn id left unused");
        let sampled = headers(&[("traceparent", &format!("00-{TRACE}-{SPAN}-01"))]);
        let unsampled = headers(&[("traceparent", &format!("00-{TRACE}-{SPAN}-00"))]);
        for _ in 0..20 {
            let cx = t.call_span(&sampled, || ("call".into(), vec![])).unwrap();
            assert_eq!(cx.span().span_context().trace_id().to_string(), TRACE);
            assert!(t
                .call_span(&unsampled, || ("call".into(), vec![]))
                .is_none());
        }
    }

    #[tokio::test]
    async fn only_the_formats_written_replace_the_clients_headers() {
        let t = tracing("[tracecontext]");
        let written = t.inject(&Context::new(), &SpanContext::empty_context());
        assert!(written.replaces("traceparent") && written.replaces("tracestate"));
        for kept in ["b3", "x-b3-traceid", "baggage"] {
            assert!(!written.replaces(kept), "{kept}");
        }
    }

    #[tokio::test]
    async fn w3c_wins_over_b3_by_default_and_malformed_context_is_none() {
        let t = tracing("[b3multi, baggage, tracecontext]");
        let other = "a".repeat(32);
        let both = headers(&[
            ("x-b3-traceid", &other),
            ("x-b3-spanid", "1111111111111111"),
            ("traceparent", &format!("00-{TRACE}-{SPAN}-01")),
        ]);
        let cx = t.parent(&both);
        assert_eq!(cx.span().span_context().trace_id().to_string(), TRACE);
        let b3 = headers(&[("b3", &format!("{other}-{SPAN}-1"))]);
        assert_eq!(
            t.parent(&b3).span().span_context().trace_id().to_string(),
            other
        );
        for bad in [
            headers(&[("traceparent", "00-zz-yy-01")]),
            headers(&[("x-b3-traceid", "nothex"), ("x-b3-spanid", "1")]),
            headers(&[("b3", "garbage")]),
            headers(&[("content-type", "application/json")]),
        ] {
            assert!(!t.parent(&bad).span().span_context().is_valid(), "{bad:?}");
        }
    }
}
