//! `tollgate serve`: load the configuration, bind the listeners, serve until SIGTERM
//! or Ctrl-C, then drain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use serde::Deserialize;
use tollgate::{KeyedOptions, OnFull};

use crate::rules::Rules;
use crate::service::DecisionService;

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
    /// Where counters live.
    #[serde(default)]
    pub store: Store,
    /// Memory bounds.
    #[serde(default)]
    pub keys: Keys,
    /// Admin endpoints.
    #[serde(default)]
    pub admin: Admin,
    /// The limiting reverse proxy (`tollgate proxy`).
    #[serde(default)]
    pub proxy: Option<crate::proxy::ProxyConfig>,
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

/// `listen:` addresses.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// The HTTP/JSON API address.
    pub http: Option<SocketAddr>,
    /// The Envoy RLS gRPC address.
    pub grpc: Option<SocketAddr>,
}

/// `store:` where counters live.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Store {
    /// `memory` (default) or `redis`.
    #[serde(default)]
    pub kind: StoreKind,
    /// For `redis`: `redis://host:port/db` or `redis+cluster://host:port,host:port`.
    pub url: Option<String>,
    /// The longest one decision may wait for Redis (default 250ms).
    #[serde(default, deserialize_with = "duration_opt")]
    pub timeout: Option<u64>,
    /// What decides while Redis fails: `error` (default: 503 / gRPC UNAVAILABLE, so
    /// the caller's own failure mode applies), `fail-open`, `fail-closed`, or `local`
    /// (an in-memory limiter with `1/local_share` of each limit).
    #[serde(default)]
    pub on_error: OnErrorDoc,
    /// For `on_error: local`: how many instances share the limit (default 1).
    pub local_share: Option<u64>,
    /// Reject keys Redis rejected until their retry time without asking it again.
    #[serde(default)]
    pub negative_cache: bool,
    /// Prefix of every Redis key (default `tollgate`).
    pub prefix: Option<String>,
    /// The most checks decided by one Redis call (automatic batching of concurrent
    /// checks; default 64; 1 sends each check alone).
    pub batch: Option<usize>,
    /// How the decision code is called: `auto` (default: Redis Functions where Redis
    /// has them, Redis >= 7, else `EVALSHA`), `functions` or `eval`.
    #[serde(default)]
    pub calls: CallsDoc,
    /// Leased quotas for every limit (hot keys decided locally from slices of their
    /// budget, never over the limit); absent: one Redis call per check.
    pub lease: Option<LeaseDoc>,
}

/// `store.lease`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseDoc {
    /// How long a slice may be spent (default 50ms).
    #[serde(default, deserialize_with = "duration_opt")]
    pub duration: Option<u64>,
    /// The most admissions one lease takes (default: a quarter of the limit's burst).
    pub max_slice: Option<u64>,
}

/// `store.calls`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallsDoc {
    /// Functions where Redis has them, `EVALSHA` otherwise.
    #[default]
    Auto,
    /// Redis Functions only (Redis >= 7).
    Functions,
    /// `EVALSHA` only.
    Eval,
}

/// `store.on_error`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnErrorDoc {
    /// Report the failure.
    #[default]
    Error,
    /// Admit.
    FailOpen,
    /// Reject.
    FailClosed,
    /// Decide locally with a share of the limit.
    Local,
}

/// A duration (`250ms`, `5s`, ...) in microseconds.
pub(crate) fn duration_opt<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    tollgate::parse_duration(&s)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

/// The store kinds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// In this process.
    #[default]
    Memory,
    /// In Redis or Redis Cluster (`url`).
    Redis,
}

impl Store {
    /// The store a `--store` flag names: `memory`, or a Redis URL (the file's other
    /// `store:` settings still apply).
    pub fn with_flag(mut self, flag: Option<&str>) -> anyhow::Result<Store> {
        match flag {
            None => {}
            Some("memory") => self.kind = StoreKind::Memory,
            Some(url) if url.starts_with("redis://") || url.starts_with("redis+cluster://") => {
                self.kind = StoreKind::Redis;
                self.url = Some(url.to_string());
            }
            Some(other) => anyhow::bail!(
                "--store {other}: expected memory, redis://host:port or redis+cluster://host:port,host:port"
            ),
        }
        if self.kind == StoreKind::Redis && self.url.is_none() {
            anyhow::bail!("store: kind redis needs url (redis://host:port or redis+cluster://...)");
        }
        if self.local_share == Some(0) {
            anyhow::bail!("store.local_share: must be at least 1");
        }
        Ok(self)
    }

    /// Connects to the configured Redis (a single node lazily; a Cluster must answer).
    pub async fn connect(&self) -> anyhow::Result<tollgate::redis::RedisStore> {
        let url = self.url.as_deref().unwrap_or_default();
        let mut opts = tollgate::redis::RedisOptions::default();
        if let Some(t) = self.timeout {
            opts.timeout = std::time::Duration::from_micros(t);
        }
        if let Some(p) = &self.prefix {
            opts.prefix = p.clone();
        }
        if let Some(b) = self.batch {
            anyhow::ensure!(
                b >= 1,
                "store.batch: must be at least 1 (1 turns batching off)"
            );
            opts.batch = b;
        }
        opts.calls = match self.calls {
            CallsDoc::Auto => tollgate::redis::RedisCalls::Auto,
            CallsDoc::Functions => tollgate::redis::RedisCalls::Functions,
            CallsDoc::Eval => tollgate::redis::RedisCalls::Eval,
        };
        Ok(tollgate::redis::RedisStore::connect_with(url, opts).await?)
    }

    /// The Redis limiter of `rules` named `name` on `store`: leased when `lease:` is
    /// set (an error names what a lease cannot keep), else with the failure policy and
    /// negative cache.
    pub fn limiter(
        &self,
        store: &tollgate::redis::RedisStore,
        name: &str,
        rules: tollgate::RuleSet,
    ) -> Result<tollgate::AnyLimiter, tollgate::redis::StoreError> {
        Ok(match &self.lease {
            Some(lease) => {
                let mut opts = tollgate::redis::LeaseOptions {
                    max_slice: lease.max_slice,
                    ..Default::default()
                };
                if let Some(us) = lease.duration {
                    opts.duration = std::time::Duration::from_micros(us);
                }
                tollgate::AnyLimiter::Leased(tollgate::redis::LeasedLimiter::new(
                    store.clone(),
                    name,
                    rules,
                    opts,
                )?)
            }
            None => {
                let opts = self.limiter_options(&rules)?;
                tollgate::AnyLimiter::Redis(tollgate::redis::RedisLimiter::with_options(
                    store.clone(),
                    name,
                    rules,
                    opts,
                )?)
            }
        })
    }

    /// The options of the Redis limiter of `rules`: failure policy and negative cache.
    pub fn limiter_options(
        &self,
        rules: &tollgate::RuleSet,
    ) -> Result<tollgate::redis::RedisLimiterOptions, tollgate::redis::StoreError> {
        Ok(tollgate::redis::RedisLimiterOptions {
            on_error: self.on_error(rules)?,
            negative_cache: self.negative_cache,
            ..Default::default()
        })
    }

    /// The failure policy of a limit of `rules` (`local`: its `1/local_share`).
    pub fn on_error(
        &self,
        rules: &tollgate::RuleSet,
    ) -> Result<tollgate::redis::OnError, tollgate::redis::StoreError> {
        use tollgate::redis::{OnError, StoreError};
        Ok(match self.on_error {
            OnErrorDoc::Error => OnError::Error,
            OnErrorDoc::FailOpen => OnError::FailOpen,
            OnErrorDoc::FailClosed => OnError::FailClosed,
            OnErrorDoc::Local => OnError::Local(
                rules
                    .share(self.local_share.unwrap_or(1))
                    .map_err(StoreError::Unsupported)?,
            ),
        })
    }

    /// A short description for the start-up banner.
    pub fn describe(&self) -> String {
        match self.kind {
            StoreKind::Memory => "memory store".into(),
            StoreKind::Redis => format!(
                "redis store at {}, on error: {:?}",
                self.url.as_deref().unwrap_or(""),
                self.on_error
            ),
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
        let config: MainConfig = serde_yaml_ng::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        // Rule paths are relative to the config file.
        let base = path.parent().unwrap_or(Path::new("."));
        Ok(MainConfig {
            rules: config.rules.iter().map(|r| base.join(r)).collect(),
            ..config
        })
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

/// What `serve` runs with, after flags are applied to the file.
pub struct Settings {
    /// The HTTP address.
    pub http: SocketAddr,
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// Counter bounds.
    pub options: KeyedOptions,
    /// The rules.
    pub rules: Rules,
    /// Where the rules came from.
    pub rules_source: String,
    /// The rule files (empty: built-in), for reloads.
    pub rule_paths: Vec<PathBuf>,
    /// The bearer token that guards admin endpoints, if any.
    pub admin_token: Option<String>,
    /// Where counters live.
    pub store: Store,
}

impl Settings {
    /// Loads everything, binding nothing: errors surface before any port is taken.
    pub fn resolve(
        config: Option<&Path>,
        rules: &[PathBuf],
        http: Option<SocketAddr>,
        grpc: Option<SocketAddr>,
        store: Option<&str>,
    ) -> anyhow::Result<Self> {
        let main = match config {
            Some(p) => MainConfig::load(p)?,
            None => MainConfig::default(),
        };
        let store = main.store.clone().with_flag(store)?;
        let paths = if rules.is_empty() {
            main.rules.clone()
        } else {
            rules.to_vec()
        };
        let options = main.key_options();
        let (rules, rules_source) = if paths.is_empty() {
            (
                Rules::built_in(options),
                "the built-in example rules".to_string(),
            )
        } else {
            let list = paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ");
            (Rules::load(&paths, options)?, list)
        };
        let http = http
            .or(main.listen.http)
            .unwrap_or_else(|| DEFAULT_HTTP.parse().expect("valid default"));
        let grpc = grpc
            .or(main.listen.grpc)
            .unwrap_or_else(|| DEFAULT_GRPC.parse().expect("valid default"));
        let admin_token = std::env::var("TOLLGATE_ADMIN_TOKEN")
            .ok()
            .or(main.admin.token.clone())
            .filter(|t| !t.is_empty());
        Ok(Settings {
            http,
            grpc,
            options,
            rules,
            rules_source,
            rule_paths: paths,
            admin_token,
            store,
        })
    }
}

/// Serves until a shutdown signal.
pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let http_listener = tokio::net::TcpListener::bind(settings.http)
        .await
        .with_context(|| format!("cannot listen on {} (HTTP)", settings.http))?;
    let grpc_listener = tokio::net::TcpListener::bind(settings.grpc)
        .await
        .with_context(|| format!("cannot listen on {} (gRPC)", settings.grpc))?;
    let (http, grpc) = (http_listener.local_addr()?, grpc_listener.local_addr()?);
    let mut service = DecisionService::new(
        settings.rules,
        settings.rule_paths.clone(),
        settings.options,
    );
    if settings.store.kind == StoreKind::Redis {
        service = service.with_redis(&settings.store).await?;
    }
    let service = Arc::new(service);
    let admin = crate::http::Admin {
        token: settings.admin_token.clone(),
        loopback: http.ip().is_loopback(),
    };
    let mut domains: Vec<String> = service
        .rules()
        .domains()
        .map(|(d, _)| d.to_string())
        .collect();
    domains.sort();
    println!(
        "tollgate serve: HTTP on http://{http} and Envoy RLS gRPC on {grpc} ({}) with {}",
        settings.store.describe(),
        settings.rules_source
    );
    println!("  domains: {}", domains.join(", "));
    println!("  try: curl -s http://{http}/v1/check -H 'content-type: application/json' -d '{{\"domain\":\"example\",\"descriptors\":[{{\"entries\":[{{\"key\":\"api_key\",\"value\":\"k1\"}}]}}]}}'");
    println!("  rules in force: curl -s http://{http}/v1/config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    tokio::spawn(watch_rules(service.clone(), stop_rx.clone()));
    let http_server = axum::serve(http_listener, crate::http::router(service.clone(), admin))
        .with_graceful_shutdown(stopped(stop_rx.clone()));
    let grpc_server = tonic::transport::Server::builder()
        .add_service(crate::grpc::Grpc::server(service))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc_listener),
            stopped(stop_rx),
        );
    let (h, g) = tokio::join!(http_server, grpc_server);
    h?;
    g?;
    println!("tollgate serve: stopped");
    Ok(())
}

/// Reloads the rules on SIGHUP and when a rule file changes (checked every second).
async fn watch_rules(service: Arc<DecisionService>, mut stop: tokio::sync::watch::Receiver<bool>) {
    if service.sources().is_empty() {
        return;
    }
    let paths = service.sources().to_vec();
    let reload = |reason: &str| match service.reload() {
        Ok(()) => eprintln!("tollgate serve: rules reloaded ({reason})"),
        Err(e) => {
            eprintln!("tollgate serve: reload rejected, the previous rules stay in force: {e}")
        }
    };
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    crate::reload::watch(paths, reload, stopped).await;
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
