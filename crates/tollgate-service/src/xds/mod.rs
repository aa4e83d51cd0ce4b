//! Rules over xDS: an ADS stream (State of the World) to a management server, asking
//! for envoyproxy/ratelimit's `RateLimitConfig` resources (what Envoy Gateway serves
//! its rate limit backend). Each version received is applied as a reload is
//! ([`DecisionService::apply_xds`]: the same validation, unchanged limits keep their
//! counters) and ACKed; a version that does not load is NACKed with the error in
//! `error_detail`, and the last good rules stay in force. When the stream ends or
//! cannot be opened, the client waits (exponential backoff with jitter) and opens
//! another, asking for everything the server holds (see `Session::run`);
//! decisions go on with the last good rules meanwhile.

pub mod rls_conf;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use tokio::sync::mpsc;

use crate::DecisionService;
use rls_conf::{RateLimitConfig, TYPE_URL};
use tollgate_runtime::config::xds::XdsConfig;
use tollgate_runtime::tls::ClientTls;

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// A stream that stayed open this long was a working one: the next wait starts
/// over from `backoff_initial`. (A server that has nothing new for a client asking
/// with the version it holds sends nothing, so a working stream may carry no
/// response at all.)
const STREAM_WORKED: Duration = Duration::from_secs(10);

/// Keeps the rules of `service` in step with the xDS server of `config` until
/// `stop` completes; `tls` ([`client_tls`]) when the server is `https://`.
pub async fn run(
    config: XdsConfig,
    tls: Option<ClientTls>,
    service: Arc<DecisionService>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        () = follow(&config, tls.as_ref(), &service) => {}
        () = stop => {}
    }
}

async fn follow(config: &XdsConfig, tls: Option<&ClientTls>, service: &DecisionService) {
    let mut backoff = Backoff::new(config);
    loop {
        let mut session = Session::default();
        let started = tokio::time::Instant::now();
        let ended = session.run(config, tls, service).await;
        if session.versions > 0 || started.elapsed() >= STREAM_WORKED {
            backoff.reset();
        }
        let wait = backoff.next();
        match ended {
            Ok(()) => tracing::warn!(
                server = %config.server,
                "xds: the server closed the stream; the rules in force (if any) stay, connecting again in {wait:?}"
            ),
            Err(e) => tracing::warn!(
                server = %config.server,
                error = %format!("{e:#}"),
                "xds: no stream; the rules in force (if any) stay, connecting again in {wait:?}"
            ),
        }
        tokio::time::sleep(wait).await;
    }
}

/// One stream's life.
#[derive(Default)]
struct Session {
    /// Versions received on it (applied or not).
    versions: u64,
}

impl Session {
    /// Connects, opens the stream, and answers each response until the stream ends
    /// (`Ok`) or fails.
    async fn run(
        &mut self,
        config: &XdsConfig,
        tls: Option<&ClientTls>,
        service: &DecisionService,
    ) -> anyhow::Result<()> {
        let channel = connect(config, tls).await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(config.max_message_bytes);
        // Connected (TCP, TLS, HTTP/2): the stream is up from here until this ends,
        // whether or not the server answers (it may have nothing new to send).
        tracing::info!(server = %config.server, node = %config.node_id, "xds: connected, opening the stream");
        service.xds_stream(true);
        let _down = StreamDown(service);
        let node = node(config);
        let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
        // The first request names no version, so the server sends what it holds
        // now, even when its name is the one in force: a server that numbers its
        // versions from 1 again after a restart (Envoy Gateway's does) could
        // otherwise hold back other rules under a name this client already has.
        // Taking the same rules again keeps every limit's counters.
        let in_force = String::new();
        let request = |version_info: String, response_nonce: String, error: Option<String>| {
            DiscoveryRequest {
                version_info,
                node: Some(node.clone()),
                type_url: TYPE_URL.into(),
                response_nonce,
                error_detail: error.map(|message| RpcStatus {
                    code: INVALID_ARGUMENT,
                    message,
                    details: Vec::new(),
                }),
                ..Default::default()
            }
        };
        tx.send(request(in_force, String::new(), None)).await?;
        let outgoing =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        let mut call = tonic::Request::new(outgoing);
        for (name, value) in &config.headers {
            let name = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())?;
            call.metadata_mut().insert(name, value.parse()?);
        }
        let mut incoming = client.stream_aggregated_resources(call).await?.into_inner();
        while let Some(response) = incoming.message().await? {
            let nonce = response.nonce.clone();
            let version = response.version_info.clone();
            let type_url = response.type_url.clone();
            if type_url == TYPE_URL {
                self.versions += 1;
            }
            let applied = apply(service, response);
            service.xds_answered(applied.is_ok());
            let answer = match applied {
                Ok(()) => {
                    tracing::info!(version, "xds: rules of version {version} in force");
                    request(version, nonce, None)
                }
                Err(e) => {
                    tracing::error!(
                        version,
                        error = %e,
                        "xds: version {version} refused (NACK); the rules in force stay"
                    );
                    let kept = service
                        .xds_version()
                        .and_then(|(_, v)| v)
                        .unwrap_or_default();
                    let mut nack = request(kept, nonce, Some(e));
                    // Nonces are per type: a NACK answers the response's own.
                    nack.type_url = type_url;
                    nack
                }
            };
            // The stream's sender ends only with the stream.
            tx.send(answer).await?;
        }
        Ok(())
    }
}

/// Marks the stream down when dropped.
struct StreamDown<'a>(&'a DecisionService);

impl Drop for StreamDown<'_> {
    fn drop(&mut self) {
        self.0.xds_stream(false);
    }
}

/// Decodes a response's resources and applies them.
fn apply(service: &DecisionService, response: DiscoveryResponse) -> Result<(), String> {
    let version = &response.version_info;
    if response.type_url != TYPE_URL {
        return Err(format!(
            "version {version}: type_url {:?}: this client asks only for {TYPE_URL}",
            response.type_url
        ));
    }
    if response.version_info.is_empty() {
        // An empty version is what a client that has none sends: kept, it would ask
        // for everything again on the next stream.
        return Err("version_info is empty: every version needs a name".into());
    }
    let mut configs = Vec::with_capacity(response.resources.len());
    for (i, any) in response.resources.into_iter().enumerate() {
        if any.type_url != TYPE_URL {
            return Err(format!(
                "version {version}: resources[{i}]: type_url {:?}, expected {TYPE_URL}",
                any.type_url
            ));
        }
        let config = RateLimitConfig::decode(&any.value[..]).map_err(|e| {
            format!("version {version}: resources[{i}]: not a RateLimitConfig: {e}")
        })?;
        configs.push(config);
    }
    service.apply_xds(configs, &response.version_info)
}

/// The node this client speaks as.
fn node(config: &XdsConfig) -> Node {
    let fields = (config.node_metadata.iter())
        .map(|(k, v)| {
            let value = Value {
                kind: Some(Kind::StringValue(v.clone())),
            };
            (k.clone(), value)
        })
        .collect();
    Node {
        id: config.node_id.clone(),
        metadata: (!config.node_metadata.is_empty()).then_some(Struct { fields }),
        user_agent_name: "tollgate".into(),
        ..Default::default()
    }
}

/// A channel to the server: plaintext, or TLS built by [`tollgate_runtime::tls::client_config`]
/// from files read now (a rotated client certificate is used from the next
/// connection on).
async fn connect(
    config: &XdsConfig,
    client: Option<&ClientTls>,
) -> anyhow::Result<tonic::transport::Channel> {
    let (tls, host, port) = config.endpoint()?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    // TCP keepalive finds a dead peer; HTTP/2 pings are not sent: gRPC servers
    // close a stream that pings more often than every 5 minutes while they have
    // nothing to send (GOAWAY too_many_pings), which a quiet stream is.
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))?
        .connect_timeout(Duration::from_micros(config.connect_timeout))
        .tcp_nodelay(true)
        .tcp_keepalive(Some(Duration::from_secs(60)));
    if !tls {
        return Ok(endpoint.connect().await?);
    }
    let Some(client) = client else {
        anyhow::bail!("xds: TLS without a configuration");
    };
    let name = (config.tls.as_ref())
        .and_then(|t| t.server_name.clone())
        .unwrap_or_else(|| host.clone());
    let server_name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|_| {
        anyhow::anyhow!("xds.tls.server_name {name:?}: not a DNS name or IP address")
    })?;
    let client = client.clone();
    let connect = tower::service_fn(move |_: http::Uri| {
        let (client, server_name, host) = (client.clone(), server_name.clone(), host.clone());
        async move {
            let tls = client.connect(server_name, &host, port).await?;
            std::io::Result::Ok(hyper_util::rt::TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector(connect).await?)
}

/// The TLS to the server, when it is TLS: its files read now (an error names the
/// setting and the file), and again when they change.
pub fn client_tls(config: &XdsConfig) -> anyhow::Result<Option<ClientTls>> {
    if !config.endpoint()?.0 {
        return Ok(None);
    }
    let files = config.tls.clone().unwrap_or_default();
    let identity = match (&files.cert_file, &files.key_file) {
        (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
        _ => None,
    };
    ClientTls::load("xds.tls", files.ca_file.as_deref(), identity, &[b"h2"]).map(Some)
}

/// Exponential backoff with up to half of each wait random.
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    seed: u64,
}

impl Backoff {
    fn new(config: &XdsConfig) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let initial = Duration::from_micros(config.backoff_initial);
        Backoff {
            initial,
            max: Duration::from_micros(config.backoff_max),
            next: initial,
            seed: h.finish() | 1,
        }
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }

    /// The next wait: between half and all of the current step, which then doubles.
    fn next(&mut self) -> Duration {
        // xorshift64: jitter, not secrecy.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let step = self.next;
        self.next = (self.next * 2).min(self.max);
        let share = 0.5 + (self.seed % 1000) as f64 / 2000.0;
        step.mul_f64(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_to_its_bound_with_jitter_and_starts_over() {
        let mut config = XdsConfig::new("h:1");
        config.backoff_initial = 1_000_000;
        config.backoff_max = 4_000_000;
        let mut b = Backoff::new(&config);
        let steps = [1.0, 2.0, 4.0, 4.0, 4.0];
        for step in steps {
            let w = b.next().as_secs_f64();
            assert!(w >= step / 2.0 && w <= step, "{w} for a step of {step}");
        }
        b.reset();
        assert!(b.next() <= Duration::from_secs(1));
    }
}
