//! The main configuration file (`--config FILE`, YAML) that `serve` and `proxy` read:
//! its types, defaults and validation. Nothing here binds a port; the `store:`
//! section also knows how to connect ([`store::StoreConfig::connect`]).

pub mod envoy_env;
pub mod proxy;
pub mod store;
pub mod traces;
pub mod xds;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;
pub use tollgate::headers::HeaderStyle;
use tollgate::keyed::{KeyedOptions, OnFull};

/// The default HTTP listener (Envoy's ratelimit service uses 8080 too).
pub const DEFAULT_HTTP: &str = "127.0.0.1:8080";
/// The default gRPC listener (Envoy's ratelimit service uses 8081 too).
pub const DEFAULT_GRPC: &str = "127.0.0.1:8081";

/// The main configuration file (YAML). Every field is optional; flags override it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MainConfig {
    /// Listeners.
    #[serde(default)]
    pub listen: Listen,
    /// Rule files or directories.
    #[serde(default)]
    pub rules: Vec<PathBuf>,
    /// Rules from an xDS server instead of files.
    #[serde(default)]
    pub xds: Option<xds::XdsConfig>,
    /// Where counters live.
    #[serde(default)]
    pub store: store::StoreConfig,
    /// Memory bounds.
    #[serde(default)]
    pub keys: Keys,
    /// Bounds on one decision request.
    #[serde(default)]
    pub requests: Requests,
    /// Bounds on Envoy's quota streams (RLQS).
    #[serde(default)]
    pub quota: QuotaLimits,
    /// Bounds on client connections (serve's HTTP and gRPC listeners, the proxy's).
    #[serde(default)]
    pub connections: Connections,
    /// Admin endpoints.
    #[serde(default)]
    pub admin: Admin,
    /// How `serve` answers beyond its rules: headers, shadow mode, statistics.
    #[serde(default)]
    pub service: ServiceSettings,
    /// The limiting reverse proxy (`tollgate proxy`).
    #[serde(default)]
    pub proxy: Option<proxy::ProxyConfig>,
    /// OpenTelemetry traces (off unless asked for, here or by `OTEL_*` variables).
    #[serde(default)]
    pub traces: traces::TracesConfig,
    /// The live console in the browser (off unless this section is given).
    #[serde(default)]
    pub console: Option<ConsoleConfig>,
}

/// `console:` the live console in the browser (docs/console.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Which listener serves it: `http` (serve's HTTP listener, its default) or
    /// `metrics` (the metrics listener; the proxy's only choice).
    #[serde(default)]
    pub listener: Option<ConsoleListener>,
    /// Its path (default `/console`).
    #[serde(default = "default_console_path")]
    pub path: String,
    /// How far back its charts go (default `5m`, at most `1h`).
    #[serde(default = "default_console_history", deserialize_with = "duration_us")]
    pub history: u64,
    /// Rows in each of the keys page's tables (default 20, at most 500).
    #[serde(default = "default_console_top_keys")]
    pub top_keys: usize,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            listener: None,
            path: default_console_path(),
            history: default_console_history(),
            top_keys: default_console_top_keys(),
        }
    }
}

impl ConsoleConfig {
    /// Checks the path and bounds.
    pub fn validate(&self) -> anyhow::Result<()> {
        let p = &self.path;
        if !p.starts_with('/')
            || p.len() < 2
            || p.ends_with('/')
            || p.contains(['?', '#', '{', '}', '*', ' '])
        {
            anyhow::bail!("console.path {p:?}: a path such as /console (starting with /, not ending with it, no ? # {{ }} * or spaces)");
        }
        if let Some(taken) = self.clashes_with(&[
            "/v1",
            "/json",
            "/metrics",
            "/healthz",
            "/readyz",
            "/healthcheck",
            "/rlconfig",
        ]) {
            anyhow::bail!("console.path {p:?}: {taken} answers there already; choose another path");
        }
        if !(1_000_000..=3_600_000_000).contains(&self.history) {
            anyhow::bail!("console.history: between 1s and 1h");
        }
        if !(1..=500).contains(&self.top_keys) {
            anyhow::bail!(
                "console.top_keys: {} is not between 1 and 500",
                self.top_keys
            );
        }
        Ok(())
    }
}

impl ConsoleConfig {
    /// The first of `paths` that the console's path would overlap (the same path, or
    /// one inside the other).
    pub fn clashes_with<'a>(&self, paths: &[&'a str]) -> Option<&'a str> {
        let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        (paths.iter().copied()).find(|p| inside(&self.path, p) || inside(p, &self.path))
    }
}

/// The listener that serves the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsoleListener {
    /// serve's HTTP listener (beside the API).
    Http,
    /// The metrics listener.
    Metrics,
}

fn default_console_path() -> String {
    "/console".into()
}

fn default_console_history() -> u64 {
    300_000_000
}

fn default_console_top_keys() -> usize {
    20
}

/// `admin:`. Admin endpoints (`/v1/reset`, `/v1/reload`) need `Authorization: Bearer
/// TOKEN` when a token is set (here or in `TOLLGATE_ADMIN_TOKEN`); without one they
/// answer only on a loopback listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    /// The bearer token.
    pub token: Option<String>,
}

/// `service:` how `serve` answers beyond its rules (fixed at start; a reload keeps
/// them). Each has an envoyproxy/ratelimit setting it stands for (docs/envoy.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSettings {
    /// The rate-limit headers in responses (default `ietf`).
    #[serde(default)]
    pub headers: Headers,
    /// Global shadow mode: every request's overall code is OK, whatever its
    /// descriptors say (they still report their own codes); counted in
    /// `tollgate_global_shadow_mode_total` (Envoy's `SHADOW_MODE`).
    #[serde(default)]
    pub shadow_mode: bool,
    /// Admitted hits past this share of a limit count as `near_limit` in
    /// `tollgate_rate_limit_hits_total` (default 0.8; Envoy's `NEAR_LIMIT_RATIO`).
    #[serde(default = "default_near_limit_ratio")]
    pub near_limit_ratio: f32,
    /// Rule documents naming a domain already loaded add their descriptors to it
    /// instead of being refused (Envoy's `MERGE_DOMAIN_CONFIG`).
    #[serde(default)]
    pub merge_domains: bool,
    /// Whether the hits of a rejected request count, for descriptors with Envoy's
    /// `rate_limit` that do not say (`rejected_hits` on the descriptor): `counted`
    /// (default, as envoyproxy/ratelimit, whose `INCRBY` comes before the
    /// comparison: a caller over its limit stays over it until the window has paid
    /// the debt back) or `not_counted` (tollgate's all-or-nothing). Descriptors with
    /// `policies:` default to `not_counted`.
    #[serde(default)]
    pub rejected_hits: RejectedHits,
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when a
    /// request's hits would take one of its descriptors over its limit, only the
    /// descriptors over their limit count them (those that count rejected hits);
    /// the others are looked at, not counted. Default false.
    #[serde(default)]
    pub stop_increment_when_over_limit: bool,
    /// envoyproxy/ratelimit's metric names beside tollgate's at `/metrics`
    /// (`ratelimit_service_rate_limit_total_hits{domain,key1,key2}`, ...), named as its
    /// Prometheus sink names its statistics: through its built-in mappings, or
    /// `envoy_metrics_mapping`'s. Default off (`USE_PROMETHEUS` under `--envoy-env`).
    #[serde(default)]
    pub envoy_metrics: bool,
    /// A statsd mapping file (statsd_exporter's format, Envoy's
    /// `PROMETHEUS_MAPPER_YAML`) for `envoy_metrics`, in place of the built-in one.
    #[serde(default)]
    pub envoy_metrics_mapping: Option<std::path::PathBuf>,
    /// Set by `--envoy-env`, not by the file: a mapping file that cannot be read or
    /// parsed is a warning and the built-in mappings stand in (envoyproxy/ratelimit
    /// ignores such a file, and Envoy Gateway mounts its own as optional), and
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` leaves the built-in response time in
    /// milliseconds.
    #[serde(skip)]
    pub envoy_env_metrics: Option<EnvoyEnvMetrics>,
    /// The debug line of each decision (see [`DecisionLog`]).
    #[serde(default)]
    pub decision_log: DecisionLog,
}

/// `service.decision_log:` the line each decision writes at debug (log target
/// `tollgate::decisions`: `RUST_LOG=tollgate::decisions=debug`, or `LOG_LEVEL=debug`
/// under `--envoy-env`), bounded so that it can be left on for a while in
/// production.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionLog {
    /// Lines a second at most (default 100; 0 writes none); the decisions past it are
    /// counted, and the next line says how many went unlogged.
    #[serde(default = "default_decision_lines")]
    pub per_second: u64,
    /// Descriptor values written as they are; by default each is replaced by a
    /// digest of it (`#1a2b3c4d`), as the console shows them: a value may be an API
    /// key.
    #[serde(default)]
    pub reveal_values: bool,
}

impl Default for DecisionLog {
    fn default() -> Self {
        DecisionLog {
            per_second: default_decision_lines(),
            reveal_values: false,
        }
    }
}

fn default_decision_lines() -> u64 {
    100
}

/// How `--envoy-env` asks for envoyproxy/ratelimit's metric names (see
/// [`ServiceSettings::envoy_env_metrics`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct EnvoyEnvMetrics {
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`.
    pub response_time_ms: bool,
}

/// Whether a rejected request's hits count (see [`ServiceSettings::rejected_hits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectedHits {
    /// Counted even when over the limit (envoyproxy/ratelimit's counting).
    #[default]
    Counted,
    /// Not counted: a rejected request consumes nothing (all-or-nothing).
    NotCounted,
}

impl Default for ServiceSettings {
    fn default() -> Self {
        ServiceSettings {
            headers: Headers::default(),
            shadow_mode: false,
            near_limit_ratio: default_near_limit_ratio(),
            merge_domains: false,
            rejected_hits: RejectedHits::default(),
            stop_increment_when_over_limit: false,
            envoy_metrics: false,
            envoy_metrics_mapping: None,
            envoy_env_metrics: None,
            decision_log: DecisionLog::default(),
        }
    }
}

fn default_near_limit_ratio() -> f32 {
    0.8
}

/// `service.headers`: which rate-limit headers `serve` adds (to `/v1/check` and
/// `/v1/acquire` responses, and to gRPC's `response_headers_to_add`, which Envoy adds
/// to the client's response, also shown in `/json`'s `responseHeadersToAdd`).
/// `Retry-After` comes with every reject on the HTTP API, whatever this says.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Headers {
    /// `ietf` (`RateLimit-Policy` and `RateLimit`, the default), `draft03` or
    /// `legacy` (the `RateLimit-Limit` / `-Remaining` / `-Reset` trio
    /// envoyproxy/ratelimit adds with `LIMIT_RESPONSE_HEADERS_ENABLED`, named below),
    /// `both`, or `none`.
    #[serde(default, with = "HeaderStyleDef")]
    pub style: HeaderStyle,
    /// draft-03 header names (Envoy's `LIMIT_LIMIT_HEADER`, ...).
    #[serde(default = "default_limit_header")]
    pub limit: String,
    /// See `limit` (`LIMIT_REMAINING_HEADER`).
    #[serde(default = "default_remaining_header")]
    pub remaining: String,
    /// See `limit` (`LIMIT_RESET_HEADER`).
    #[serde(default = "default_reset_header")]
    pub reset: String,
}

impl Default for Headers {
    fn default() -> Self {
        Headers {
            style: HeaderStyle::default(),
            limit: default_limit_header(),
            remaining: default_remaining_header(),
            reset: default_reset_header(),
        }
    }
}

fn default_limit_header() -> String {
    "RateLimit-Limit".into()
}

fn default_remaining_header() -> String {
    "RateLimit-Remaining".into()
}

fn default_reset_header() -> String {
    "RateLimit-Reset".into()
}

/// How the configs spell a [`HeaderStyle`] (`service.headers.style`, a proxy route's
/// `headers`): `ietf`, `legacy` (also `draft03`, envoyproxy/ratelimit's name for the
/// three-field set), `both`, `none`.
#[derive(Deserialize)]
#[serde(remote = "HeaderStyle", rename_all = "lowercase")]
pub(crate) enum HeaderStyleDef {
    Ietf,
    #[serde(alias = "draft03")]
    Legacy,
    Both,
    None,
}

/// `listen:` addresses.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// The HTTP/JSON API address.
    pub http: Option<SocketAddr>,
    /// The Envoy RLS gRPC address.
    pub grpc: Option<SocketAddr>,
    /// `serve`: how long, after SIGTERM or Ctrl-C, the server goes on serving with its
    /// health checks (`/healthcheck`, `/readyz`) failing, so that load balancers move
    /// traffic away first (default 0s: it stops accepting at once); then it drains.
    #[serde(default, deserialize_with = "duration_opt")]
    pub drain_delay: Option<u64>,
    /// `serve`: how many threads serve connections, each on its own single-threaded
    /// runtime (default: one per CPU, as nginx's `worker_processes auto`).
    pub workers: Option<usize>,
    /// `serve`: how connections are shared among the workers (default `pack`).
    #[serde(default)]
    pub balance: Balance,
    /// `serve`: TLS on the HTTP listener (HTTP/1.1 and HTTP/2 by ALPN).
    pub http_tls: Option<crate::tls::ListenerTls>,
    /// `serve`: TLS on the gRPC listener (ALPN `h2`).
    pub grpc_tls: Option<crate::tls::ListenerTls>,
    /// `serve`: a listener of its own for the metrics (Prometheus scrapes it; the HTTP
    /// listener's `/metrics` stays), as envoyproxy/ratelimit's `PROMETHEUS_ADDR`.
    pub metrics: Option<SocketAddr>,
    /// The path the metrics listener serves them on (default `/metrics`).
    pub metrics_path: Option<String>,
    /// TLS on the metrics listener.
    pub metrics_tls: Option<crate::tls::ListenerTls>,
}

/// How `serve` shares connections among its workers (`listen.balance`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Balance {
    /// As few workers as the load needs: new connections fill the workers in order,
    /// and connections move to an idle worker when one is busy, and back when the
    /// load has gone (fewer threads awake: less CPU per request).
    #[default]
    Pack,
    /// Each new connection to the next worker in turn, where it stays.
    Spread,
}

impl Balance {
    /// As the banner says it.
    pub fn describe(self) -> &'static str {
        match self {
            Balance::Pack => "packed",
            Balance::Spread => "spread",
        }
    }
}

/// `keys:` memory bounds per rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Keys {
    /// The most counters one rule keeps (default 1,000,000).
    #[serde(default = "default_max_keys")]
    pub max: usize,
    /// `evict` (least recently active, the default) or `refuse` new keys when full.
    #[serde(default)]
    pub on_full: OnFullDoc,
}

impl Default for Keys {
    fn default() -> Self {
        Keys {
            max: default_max_keys(),
            on_full: OnFullDoc::Evict,
        }
    }
}

fn default_max_keys() -> usize {
    1_000_000
}

/// `requests:` bounds on one decision request (HTTP or gRPC), so that a hostile client
/// cannot make a request cost more than a few ordinary ones or store huge keys.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requests {
    /// The most descriptors one request may carry (default 256; Envoy sends a few).
    #[serde(default = "default_max_descriptors")]
    pub max_descriptors: usize,
    /// The longest key one descriptor may make, in bytes: its domain and entries'
    /// keys and values together (default 1024). Counters are kept per key, so this
    /// bounds the memory a key can take.
    #[serde(default = "default_max_key_bytes")]
    pub max_key_bytes: usize,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            max_descriptors: default_max_descriptors(),
            max_key_bytes: default_max_key_bytes(),
        }
    }
}

fn default_max_descriptors() -> usize {
    256
}

fn default_max_key_bytes() -> usize {
    1024
}

/// `quota:` bounds on Envoy's rate limit quota streams (RLQS), so that a hostile or
/// broken client cannot make the server keep unbounded state. Past a bound, the
/// stream that crossed it ends (`RESOURCE_EXHAUSTED`, or `DEADLINE_EXCEEDED` for a
/// silent stream); the other streams and buckets are untouched.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// The most buckets the server keeps in all (default 100000).
    #[serde(default = "default_quota_buckets")]
    pub max_buckets: usize,
    /// The most buckets one stream may report on (default 10000).
    #[serde(default = "default_quota_buckets_per_stream")]
    pub max_buckets_per_stream: usize,
    /// How long a stream may go without sending a report, its first included
    /// (default 5m; an Envoy reports every `reporting_interval`, and opens its
    /// stream again when it next has something to report).
    #[serde(default = "default_stream_idle", deserialize_with = "duration_us")]
    pub stream_idle: u64,
}

impl Default for QuotaLimits {
    fn default() -> Self {
        QuotaLimits {
            max_buckets: default_quota_buckets(),
            max_buckets_per_stream: default_quota_buckets_per_stream(),
            stream_idle: default_stream_idle(),
        }
    }
}

fn default_quota_buckets() -> usize {
    100_000
}

fn default_quota_buckets_per_stream() -> usize {
    10_000
}

fn default_stream_idle() -> u64 {
    300_000_000
}

/// `connections:` bounds on client connections, so that slow or idle clients cannot
/// hold a server's sockets, tasks and memory: each listener holds at most `max`
/// connections (past it, accepting waits for one to close: new clients queue in the
/// kernel's backlog), and every phase in which the server waits on a client has a
/// deadline. A reload keeps the bounds the server started with.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Connections {
    /// The most client connections one listener holds at once (default 4096; `serve`
    /// has two listeners, HTTP and gRPC; the proxy one, shared by its workers). Each
    /// takes a file descriptor: the process's open-file limit must be above the sum
    /// (the server warns at start when it is not).
    #[serde(default = "default_max_connections")]
    pub max: usize,
    /// HTTP/1: how long a client may take to send a request's headers, counted from
    /// the first wait for them, so it also closes a keep-alive connection idle that
    /// long; HTTP/2 (gRPC): how long a new connection may take to send its first bytes
    /// (default 30s; nginx's `client_header_timeout` is 60s).
    #[serde(default = "default_header_timeout", deserialize_with = "duration_us")]
    pub header_timeout: u64,
    /// How long a request body may take (default 30s): in `serve`, the whole body (a
    /// decision request is small; over gRPC, the request message; the decision then
    /// waits on the store at most `store.timeout`); in the proxy, the
    /// longest wait between two reads, as nginx's `client_body_timeout`, so a large
    /// upload at a steady pace passes. Past it: 408 (a gRPC call: DEADLINE_EXCEEDED).
    #[serde(default = "default_body_timeout", deserialize_with = "duration_us")]
    pub body_timeout: u64,
    /// The longest a response write may stall on a client that does not read (default
    /// 30s; nginx's `send_timeout`): past it the connection is closed.
    #[serde(default = "default_send_timeout", deserialize_with = "duration_us")]
    pub send_timeout: u64,
    /// The most HTTP/2 streams (gRPC calls) open at once on one connection (default
    /// 1024); a client past it waits for a stream to end, as HTTP/2 says.
    #[serde(default = "default_max_streams")]
    pub max_streams: u32,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            max: default_max_connections(),
            header_timeout: default_header_timeout(),
            body_timeout: default_body_timeout(),
            send_timeout: default_send_timeout(),
            max_streams: default_max_streams(),
        }
    }
}

fn default_max_connections() -> usize {
    4096
}

fn default_max_streams() -> u32 {
    1024
}

fn default_header_timeout() -> u64 {
    30_000_000
}

fn default_body_timeout() -> u64 {
    30_000_000
}

fn default_send_timeout() -> u64 {
    30_000_000
}

/// `keys.on_full`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnFullDoc {
    /// Evict the least recently active keys.
    #[default]
    Evict,
    /// Refuse new keys (their requests are over the limit).
    Refuse,
}

impl MainConfig {
    /// Reads and validates a main configuration file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // Rule paths are relative to the config file.
        let base = path.parent().unwrap_or(Path::new("."));
        MainConfig::parse(&text, base).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates a main configuration's text; rule paths are taken
    /// relative to `base`.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Self> {
        let config: MainConfig = serde_yaml_ng::from_str(text)?;
        config.validate()?;
        Ok(MainConfig {
            rules: config.rules.iter().map(|r| base.join(r)).collect(),
            ..config
        })
    }

    /// Checks what the types alone cannot (also after `--envoy-env` changed it).
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(x) = &self.xds {
            if !self.rules.is_empty() {
                anyhow::bail!(
                    "rules and xds: the rules come from files or from an xDS server, not both"
                );
            }
            x.validate()?;
        }
        if self.listen.workers == Some(0) {
            anyhow::bail!("listen.workers: must be at least 1");
        }
        if self.keys.max == 0 {
            anyhow::bail!("keys.max: must be at least 1 (a limiter holding no key limits nothing)");
        }
        if self.connections.max == 0 || self.connections.max_streams == 0 {
            anyhow::bail!("connections.max and connections.max_streams: must be at least 1");
        }
        let q = &self.quota;
        if q.max_buckets == 0 || q.max_buckets_per_stream == 0 {
            anyhow::bail!(
                "quota.max_buckets and quota.max_buckets_per_stream: must be at least 1 \
                 (0 would end every stream at its first report)"
            );
        }
        if let Some(c) = &self.console {
            c.validate()?;
        }
        let ratio = self.service.near_limit_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            anyhow::bail!("service.near_limit_ratio: {ratio} is not between 0 and 1");
        }
        let h = &self.service.headers;
        for (field, name) in [
            ("limit", &h.limit),
            ("remaining", &h.remaining),
            ("reset", &h.reset),
        ] {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                anyhow::bail!("service.headers.{field}: '{name}' is not a valid header name");
            }
        }
        Ok(())
    }

    /// The keyed-limiter options.
    pub fn key_options(&self) -> KeyedOptions {
        KeyedOptions {
            max_keys: self.keys.max,
            on_full: match self.keys.on_full {
                OnFullDoc::Evict => OnFull::EvictLeastRecent,
                OnFullDoc::Refuse => OnFull::RefuseNew,
            },
        }
    }
}

/// A duration (`250ms`, `5s`, ...) in microseconds.
pub(crate) fn duration_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    tollgate::policy::parse_duration(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// A required duration (`250ms`, `5s`, ...) in microseconds; zero is refused (a
/// bound of nothing would refuse every client).
fn duration_us<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    match tollgate::policy::parse_duration(&s) {
        Ok(0) => Err(serde::de::Error::custom("a timeout must be longer than 0")),
        Ok(us) => Ok(us),
        Err(e) => Err(serde::de::Error::custom(e)),
    }
}

/// A duration on the command line (`250ms`, `10s`; the policy spec's syntax).
pub fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    tollgate::policy::parse_duration(s).map(std::time::Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_bad_values_are_named() {
        let e = serde_yaml_ng::from_str::<MainConfig>("store:\n  kind: redis\n  batchh: 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("batchh"), "{e}");
        let e = serde_yaml_ng::from_str::<MainConfig>("store:\n  timeout: soon\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon") || e.contains("duration"), "{e}");
        let e = serde_yaml_ng::from_str::<MainConfig>("keys:\n  on_full: drop\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("drop"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        for (text, named) in [
            ("listen:\n  workers: 0\n", "listen.workers"),
            ("connections:\n  max: 0\n", "connections.max"),
            ("quota:\n  max_buckets: 0\n", "quota.max_buckets"),
            (
                "service:\n  near_limit_ratio: 1.5\n",
                "service.near_limit_ratio",
            ),
        ] {
            let config: MainConfig = serde_yaml_ng::from_str(text).unwrap();
            let e = config.validate().unwrap_err().to_string();
            assert!(e.contains(named), "{text}: {e}");
        }
        let config: MainConfig = serde_yaml_ng::from_str("listen:\n  workers: 3\n").unwrap();
        config.validate().unwrap();
        assert_eq!(config.listen.workers, Some(3));
    }

    #[test]
    fn rule_paths_are_relative_to_the_config_file() {
        let dir = std::env::temp_dir().join(format!("tollgate-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("main.yaml");
        std::fs::write(
            &path,
            "rules: [rules/a.yaml]\nkeys: {max: 5, on_full: refuse}\n",
        )
        .unwrap();
        let config = MainConfig::load(&path).unwrap();
        assert_eq!(config.rules, vec![dir.join("rules/a.yaml")]);
        assert_eq!(config.key_options().max_keys, 5);
        assert_eq!(config.key_options().on_full, OnFull::RefuseNew);
        let missing = MainConfig::load(&dir.join("absent.yaml")).unwrap_err();
        assert!(missing.to_string().contains("absent.yaml"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
