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
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_propagator_b3::B3Encoding;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::resource::EnvResourceDetector;
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider, SpanExporter as _};
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
    queue: Queue,
    stats: Arc<ExportStats>,
    /// What the start banner says (no secrets).
    summary: String,
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
        let resource = Resource::builder_empty()
            .with_detector(Box::new(EnvResourceDetector::new()))
            .with_attributes((s.resource.iter()).map(|(k, v)| KeyValue::new(k.clone(), v.clone())))
            .with_service_name(s.service_name.clone())
            .build();
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
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue.clone())
            .with_sampler(sampler(s.sampler, s.ratio))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("tollgate");
        let propagator = TextMapCompositePropagator::new(
            (s.propagators.iter()).map(|p| propagator(*p)).collect(),
        );
        let summary = format!(
            "{} {:?}, sampler {:?} {}, service {}",
            s.endpoint, s.protocol, s.sampler, s.ratio, s.service_name
        );
        Ok(Tracing {
            provider,
            tracer,
            propagator,
            queue,
            stats,
            summary,
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
        self.propagator
            .extract(&opentelemetry_http::HeaderExtractor(headers))
    }

    /// The caller's context from headers parsed without a map (the proxy's fast path).
    pub fn parent_from(&self, headers: &dyn Extractor) -> Context {
        self.propagator.extract(headers)
    }

    /// A span of `kind`, child of `parent`: the context holding it (not recording
    /// when the sampler left it out).
    pub fn span(
        &self,
        parent: &Context,
        kind: SpanKind,
        name: impl Into<Cow<'static, str>>,
        attributes: Vec<KeyValue>,
    ) -> Context {
        let span = (self.tracer.span_builder(name))
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        parent.with_span(span)
    }

    /// A server span for a call whose request carried `headers`: the context holding
    /// it, or `None` when the sampler left it out (nothing is recorded then).
    pub fn call_span(
        &self,
        headers: &http::HeaderMap,
        name: impl Into<Cow<'static, str>>,
        attributes: Vec<KeyValue>,
    ) -> Option<Context> {
        let cx = self.span(&self.parent(headers), SpanKind::Server, name, attributes);
        cx.span().is_recording().then_some(cx)
    }

    /// A child span of the current context's span (a client call: Redis, the
    /// upstream), or `None` when that span is not recording.
    pub fn child_span(&self, parent: &Context, name: &'static str, kind: SpanKind) -> Option<Span> {
        if !parent.span().is_recording() {
            return None;
        }
        let builder = self.tracer.span_builder(name).with_kind(kind);
        Some(builder.start_with_context(&self.tracer, parent))
    }

    /// A client span for a call to the store (Redis), child of the current context's
    /// span, or `None` when that is not recording.
    pub fn store_span(&self) -> Option<Span> {
        let mut span = Context::map_current(|cx| self.child_span(cx, "redis", SpanKind::Client))?;
        span.set_attribute(KeyValue::new("db.system.name", "redis"));
        Some(span)
    }

    /// Writes `cx`'s trace context into outgoing headers, in every configured format.
    pub fn inject(&self, cx: &Context, headers: &mut dyn Injector) {
        self.propagator.inject_context(cx, headers);
    }

    /// The header names the formats use (the proxy replaces a client's own).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        self.propagator.fields()
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

/// Ends the span in `cx` with an error status when `error` is given.
pub fn end(cx: &Context, attribute: KeyValue, error: Option<String>) {
    let span = cx.span();
    span.set_attribute(attribute);
    if let Some(error) = error {
        span.set_status(Status::error(error));
    }
    span.end();
}

fn sampler(kind: SamplerKind, ratio: f64) -> Sampler {
    let parent_based = |root| Sampler::ParentBased(Box::new(root));
    match kind {
        SamplerKind::AlwaysOn => Sampler::AlwaysOn,
        SamplerKind::AlwaysOff => Sampler::AlwaysOff,
        SamplerKind::TraceIdRatio => Sampler::TraceIdRatioBased(ratio),
        SamplerKind::ParentbasedAlwaysOn => parent_based(Sampler::AlwaysOn),
        SamplerKind::ParentbasedAlwaysOff => parent_based(Sampler::AlwaysOff),
        SamplerKind::ParentbasedTraceIdRatio => parent_based(Sampler::TraceIdRatioBased(ratio)),
    }
}

fn propagator(p: Propagator) -> Box<dyn TextMapPropagator + Send + Sync> {
    match p {
        Propagator::Tracecontext => Box::new(TraceContextPropagator::new()),
        Propagator::Baggage => Box::new(BaggagePropagator::new()),
        Propagator::B3 => Box::new(B3::writing(B3Encoding::SingleHeader)),
        Propagator::B3multi => Box::new(B3::writing(B3Encoding::MultipleHeader)),
    }
}

/// B3 read in either form (the single `b3` header first), written in one.
#[derive(Debug)]
struct B3 {
    read: opentelemetry_propagator_b3::Propagator,
    write: opentelemetry_propagator_b3::Propagator,
}

impl B3 {
    fn writing(encoding: B3Encoding) -> B3 {
        B3 {
            read: opentelemetry_propagator_b3::Propagator::with_encoding(
                B3Encoding::SingleAndMultiHeader,
            ),
            write: opentelemetry_propagator_b3::Propagator::with_encoding(encoding),
        }
    }
}

impl TextMapPropagator for B3 {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        self.write.inject_context(cx, injector);
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        self.read.extract_with_context(cx, extractor)
    }

    fn fields(&self) -> opentelemetry::propagation::text_map_propagator::FieldIter<'_> {
        self.read.fields()
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
