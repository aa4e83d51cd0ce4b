//! `proxy:` the limiting reverse proxy's section: listen address, trusted proxies,
//! timeouts and routes (match, upstream, key, policies, tiers, headers).

use std::net::SocketAddr;

use ipnet::IpNet;
use serde::Deserialize;
use tollgate::headers::HeaderStyle;

/// The `proxy:` section.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// Listen address (default 127.0.0.1:8000).
    #[serde(default)]
    pub listen: Option<SocketAddr>,
    /// Where `GET /metrics` answers (Prometheus text: each route's adaptive limit);
    /// none by default.
    #[serde(default)]
    pub metrics: Option<SocketAddr>,
    /// TLS on the metrics listener (as `tls`, ALPN `h2` and `http/1.1`).
    #[serde(default)]
    pub metrics_tls: Option<crate::tls::ListenerTls>,
    /// HTTPS on the listener: certificate and key (PEM), more certificates chosen by
    /// the name a client asks for (SNI), a client CA for mutual TLS; ALPN `h2` and
    /// `http/1.1`; the files are read again when they change.
    #[serde(default)]
    pub tls: Option<crate::tls::ListenerTls>,
    /// Peers whose `X-Forwarded-For` is believed.
    #[serde(default)]
    pub trusted_proxies: Vec<IpNet>,
    /// How long connecting to an upstream may take (default 5s; applied at start);
    /// past it the request gets a 504, as nginx's `proxy_connect_timeout`.
    #[serde(default, deserialize_with = "super::duration_opt")]
    pub connect_timeout: Option<u64>,
    /// How long an upstream may take to send its response headers (default 30s);
    /// past it the request gets a 504.
    #[serde(default, deserialize_with = "super::duration_opt")]
    pub upstream_timeout: Option<u64>,
    /// Routes, first match wins.
    pub routes: Vec<RouteConfig>,
}

impl ProxyConfig {
    /// `connect_timeout`, or its default of 5 s.
    pub fn connect_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.connect_timeout.unwrap_or(5_000_000))
    }
}

/// `upstream_tls:` how a route speaks TLS to its `https://` upstream. The files are
/// followed: a change is used by the next new connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// CA certificates (PEM) the upstream's certificate must chain to (default: the
    /// system's).
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate chain (PEM), for an upstream that asks for one.
    pub cert_file: Option<std::path::PathBuf>,
    /// Its private key (PEM).
    pub key_file: Option<std::path::PathBuf>,
    /// The name the upstream's certificate must carry, also sent as SNI (default: the
    /// upstream URL's host).
    pub server_name: Option<String>,
}

/// One route.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Its name (metrics, logs).
    pub name: String,
    /// What it matches.
    #[serde(rename = "match", default)]
    pub matcher: MatchConfig,
    /// Where matching requests go (`http://host:port`).
    pub upstream: String,
    /// TLS to an `https://` upstream: its CA (default: the system's), a client
    /// certificate, the name to verify (default: the upstream's host).
    #[serde(default)]
    pub upstream_tls: Option<UpstreamTlsConfig>,
    /// The limiting key: `client_ip`, `header:NAME`, `cookie:NAME`, `path`, or several
    /// joined with `+`.
    #[serde(default = "default_key")]
    pub key: String,
    /// Policy specs for the key (several = all-or-nothing).
    #[serde(default)]
    pub policies: Vec<String>,
    /// Concurrent requests per key (nginx `limit_conn`).
    #[serde(default)]
    pub limit_conn: Option<u32>,
    /// Charge each request what its response says it used (tokens of an LLM
    /// completion, ...) instead of one unit.
    #[serde(default)]
    pub cost: Option<CostConfig>,
    /// Key values with their own policies or priority.
    #[serde(default)]
    pub tiers: Vec<TierConfig>,
    /// An adaptive concurrency limit in front of the upstream (`gradient`,
    /// `gradient:min=2,max=500`, `aimd:...`, `vegas:...`): one limit per route, found
    /// from the upstream's latency and overload answers.
    #[serde(default)]
    pub adaptive: Option<String>,
    /// The priority of the route's requests under `adaptive` (critical, normal,
    /// sheddable or 0-255; default normal); a tier may set its own.
    #[serde(default)]
    pub priority: Option<String>,
    /// Under `adaptive`, share the limit fairly among the route's keys.
    #[serde(default)]
    pub fair_share: bool,
    /// Status on reject (default 429).
    #[serde(default = "default_status")]
    pub status: u16,
    /// Which rate-limit headers to send: ietf, legacy (`X-RateLimit-*`), both (the
    /// default) or none.
    #[serde(default = "both_headers", with = "super::HeaderStyleDef")]
    pub headers: HeaderStyle,
    /// Decide, log and count, never reject.
    #[serde(default)]
    pub dry_run: bool,
    /// The shape of a reject's body: `problem` (RFC 9457 problem+json, the default) or
    /// `openai` (OpenAI's error object and `x-ratelimit-*` headers, for a route in
    /// front of an OpenAI-compatible API).
    #[serde(default)]
    pub reject_format: RejectFormat,
}

/// `reject_format:` of a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RejectFormat {
    /// `application/problem+json` (RFC 9457).
    #[default]
    Problem,
    /// OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`).
    Openai,
}

fn default_key() -> String {
    "client_ip".into()
}

fn default_status() -> u16 {
    429
}

/// `cost:`: a request's cost read from its response.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostConfig {
    /// Where the usage is: `header:NAME` (e.g. `header:x-usage-total-tokens`) or
    /// `json:PATH` (e.g. `json:usage.total_tokens`: the JSON body's field, or for a
    /// `text/event-stream` response the last `data:` event that has it); one source
    /// or a list, the first that reports wins.
    #[serde(deserialize_with = "one_or_many")]
    pub from: Vec<String>,
    /// Units a request must find left and takes at admission, and is charged when
    /// its response reports no usable one (default 1).
    #[serde(default = "one")]
    pub estimate: u64,
    /// The most bytes of a JSON body, or of one event, read for the usage (default
    /// 1 MiB); the body itself streams through whatever its size.
    #[serde(default = "default_max_body")]
    pub max_body: usize,
    /// What a request takes at admission: `declared` (the default) takes the bound a
    /// JSON request body states (`max_tokens`, `max_completion_tokens` or
    /// `max_output_tokens`, as OpenAI-compatible APIs take them) plus an estimate of
    /// its prompt (a unit per 4 bytes of the body), and `estimate` for a request
    /// that states none; `estimate` always takes `estimate`.
    #[serde(default)]
    pub reserve: Reserve,
    /// Whether a stream that does not ask for its usage is made to: `openai` (the
    /// default) sends an OpenAI-shaped streaming request (`"stream": true` to a path
    /// ending in `/chat/completions` or `/completions`) upstream with
    /// `stream_options.include_usage`, and takes the usage out of what its client
    /// receives; `none` sends every request as it came.
    #[serde(default)]
    pub ask_usage: AskUsage,
    /// Policies that count each request once (requests per minute), beside the
    /// route's `policies:`, which count its cost (tokens per minute): a request must
    /// pass both, and one refused by either is counted by neither.
    #[serde(default)]
    pub requests: Vec<String>,
}

/// `cost.ask_usage` (see [`CostConfig::ask_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AskUsage {
    /// OpenAI's `stream_options.include_usage`, on OpenAI-shaped streams.
    #[default]
    Openai,
    /// Never.
    None,
}

/// What a `cost:` request takes at admission (see [`CostConfig::reserve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reserve {
    /// The request's own bound and prompt, when it states one.
    #[default]
    Declared,
    /// `estimate`, always.
    Estimate,
}

fn one() -> u64 {
    1
}

fn default_max_body() -> usize {
    1 << 20
}

/// A string or a list of strings.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// `match:`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchConfig {
    /// Path prefix.
    pub path_prefix: Option<String>,
    /// Exact path.
    pub path: Option<String>,
    /// Host header.
    pub host: Option<String>,
}

/// A tier: key values with their own policies and/or priority.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// Its name.
    pub name: String,
    /// The key values in it.
    pub values: Vec<String>,
    /// Its policies (none: the route's).
    #[serde(default)]
    pub policies: Vec<String>,
    /// Its priority under the route's `adaptive` limit (none: the route's).
    #[serde(default)]
    pub priority: Option<String>,
}

fn both_headers() -> HeaderStyle {
    HeaderStyle::Both
}
