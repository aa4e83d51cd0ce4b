//! `store:` where counters live (memory, Redis or Redis Cluster), and how the commands
//! connect to it and build limiters on it.

use serde::Deserialize;

use super::duration_opt;

/// `store:` where counters live.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `memory` (default) or `redis`.
    #[serde(default)]
    pub kind: StoreKind,
    /// For `redis`: `redis://host:port/db`, `rediss://` (TLS),
    /// `redis+cluster://host:port,host:port` (`rediss+cluster://` over TLS), or
    /// `redis+sentinel://host:port,host:port/master-name[/db]` (`rediss+sentinel://`
    /// over TLS, to the Sentinels and the master alike). A password in the URL is
    /// percent-encoded; better kept out of it (`password_file`).
    pub url: Option<String>,
    /// The ACL user to log in as (Redis 6+), when it is not in the URL.
    pub username: Option<String>,
    /// A file holding the password (a mounted Kubernetes secret); one trailing
    /// newline is ignored. Followed as it rotates: each new connection logs in with
    /// what it holds then, and open connections log in again when it changes
    /// (looked at every 2 s). With it, the ACL user goes in `username`.
    pub password_file: Option<std::path::PathBuf>,
    /// An environment variable holding the password (a secret exposed as env).
    pub password_env: Option<String>,
    /// TLS settings for a `rediss://` URL.
    pub tls: Option<RedisTlsDoc>,
    /// A password given by `--envoy-env` (`REDIS_AUTH`); not a config file key.
    #[serde(skip)]
    pub password: Option<tollgate::redis::Password>,
    /// With Sentinel: the ACL user to log in to the Sentinels as (`username` and the
    /// URL's user log in to the master).
    pub sentinel_username: Option<String>,
    /// With Sentinel: a file holding the Sentinels' password (their `requirepass`).
    pub sentinel_password_file: Option<std::path::PathBuf>,
    /// With Sentinel: an environment variable holding the Sentinels' password.
    pub sentinel_password_env: Option<String>,
    /// A Sentinels' password given by `--envoy-env` (`REDIS_SENTINEL_AUTH`).
    #[serde(skip)]
    pub sentinel_password: Option<tollgate::redis::Password>,
    /// The longest one decision may wait for Redis (default 250ms).
    #[serde(default, deserialize_with = "duration_opt")]
    pub timeout: Option<u64>,
    /// The longest connecting may take: TCP, TLS and the login (default 2s).
    #[serde(default, deserialize_with = "duration_opt")]
    pub connect_timeout: Option<u64>,
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
    /// With batching, the most batched calls out at once to one Redis node (default 2);
    /// checks arriving meanwhile wait for the next call.
    pub in_flight: Option<usize>,
    /// With batching, how many lone checks (nobody else waiting) may go out at once as
    /// calls of their own. Default 0 here (the library's default is 8): every check
    /// is queued for the next call, so concurrent requests share calls and Redis pays
    /// less per decision; a request already crossed the network, and the queue's
    /// hand-off adds about 5 us to it.
    pub direct_calls: Option<usize>,
    /// How the decision code is called: `auto` (default: Redis Functions where Redis
    /// has them, Redis >= 7, else `EVALSHA`; the tollgate module before both where a
    /// node has loaded it), `module`, `functions` or `eval`.
    #[serde(default)]
    pub calls: CallsDoc,
    /// `serve` only: keep each limit that is one clock-aligned `fixed-window` whose
    /// debt is forgiven (Envoy's `rate_limit` entries) as envoyproxy/ratelimit keeps
    /// its counters, one integer key per window counted by plain `INCRBY` and
    /// `PEXPIRE` (default `true`): counting costs Redis what it costs
    /// envoyproxy/ratelimit, under half the script's. `false` keeps them as the other
    /// limits (needed only for `POST /v1/acquire` on such a limit). `true` with
    /// `lease:` is refused (a lease keeps its states for the lease script).
    pub window_counters: Option<bool>,
    /// Leased quotas for every limit (hot keys decided locally from slices of their
    /// budget, never over the limit); absent: one Redis call per check.
    pub lease: Option<LeaseDoc>,
    /// A second Redis for the per-second limits (every policy of the limit forgets
    /// within a second: Envoy's `unit: second`), as envoyproxy/ratelimit's
    /// `REDIS_PERSECOND` keeps them apart from the longer ones. `serve` only.
    pub per_second: Option<PerSecondStore>,
}

/// `store.per_second`: how to reach the Redis of the per-second limits; everything
/// else (failure policy, prefix, batching, leases) is `store:`'s.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerSecondStore {
    /// Its URL (every form `store.url` takes).
    pub url: String,
    /// As `store.username`.
    pub username: Option<String>,
    /// As `store.password_file`.
    pub password_file: Option<std::path::PathBuf>,
    /// As `store.password_env`.
    pub password_env: Option<String>,
    /// As `store.sentinel_username`.
    pub sentinel_username: Option<String>,
    /// As `store.sentinel_password_file`.
    pub sentinel_password_file: Option<std::path::PathBuf>,
    /// As `store.sentinel_password_env`.
    pub sentinel_password_env: Option<String>,
    /// As `store.tls` (not inherited: a per-second Redis may be reached otherwise).
    pub tls: Option<RedisTlsDoc>,
    /// As `store.timeout` (default: `store.timeout`).
    #[serde(default, deserialize_with = "duration_opt")]
    pub timeout: Option<u64>,
    /// As `store.connect_timeout` (default: `store.connect_timeout`).
    #[serde(default, deserialize_with = "duration_opt")]
    pub connect_timeout: Option<u64>,
    /// Passwords given by `--envoy-env` (`REDIS_PERSECOND_AUTH`,
    /// `REDIS_PERSECOND_SENTINEL_AUTH`); not config file keys.
    #[serde(skip)]
    pub password: Option<tollgate::redis::Password>,
    /// See `password`.
    #[serde(skip)]
    pub sentinel_password: Option<tollgate::redis::Password>,
}

/// The password `{prefix}password_file` or `{prefix}password_env` gives, if either
/// is set (one trailing newline of a file is ignored).
fn secret(
    prefix: &str,
    file: &Option<std::path::PathBuf>,
    env: &Option<String>,
) -> anyhow::Result<Option<tollgate::redis::Password>> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!(
                "store.{prefix}password_file {}: cannot read it: {e}",
                path.display()
            )
        })?;
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        return Ok(Some(tollgate::redis::Password::new(password)));
    }
    if let Some(var) = env {
        let password = std::env::var(var).map_err(|_| {
            anyhow::anyhow!("store.{prefix}password_env: the environment variable {var} is not set")
        })?;
        return Ok(Some(tollgate::redis::Password::new(password)));
    }
    Ok(None)
}

/// The URL schemes of a Redis store.
const REDIS_SCHEMES: [&str; 6] = [
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
];

/// `store.tls`: whom to trust and who we are, over TLS to Redis.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsDoc {
    /// PEM CA certificates of the server (default: the system's roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate, for mutual TLS.
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<std::path::PathBuf>,
    /// Check the chain but not the host name (a server reached by IP). Warned at start.
    #[serde(default)]
    pub insecure_skip_hostname_verification: bool,
    /// Check nothing (encryption without authentication). Warned at start.
    #[serde(default)]
    pub insecure_skip_verify: bool,
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
    /// The tollgate module on each node that has loaded it, else Functions where
    /// Redis has them, else `EVALSHA`.
    #[default]
    Auto,
    /// The tollgate module: a node without it fails its calls (rule sets the module
    /// does not decide still go to Functions).
    Module,
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

impl OnErrorDoc {
    /// Its name in the config (`store.on_error`).
    pub fn name(self) -> &'static str {
        match self {
            OnErrorDoc::Error => "error",
            OnErrorDoc::FailOpen => "fail-open",
            OnErrorDoc::FailClosed => "fail-closed",
            OnErrorDoc::Local => "local",
        }
    }
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

impl StoreKind {
    /// `memory` or `redis`.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Redis => "redis",
        }
    }
}

impl StoreConfig {
    /// The store a `--store` flag names: `memory`, or a Redis URL (the file's other
    /// `store:` settings still apply).
    pub fn with_flag(mut self, flag: Option<&str>) -> anyhow::Result<StoreConfig> {
        match flag {
            None => {}
            Some("memory") => self.kind = StoreKind::Memory,
            Some(url) if REDIS_SCHEMES.iter().any(|s| url.starts_with(s)) => {
                self.kind = StoreKind::Redis;
                self.url = Some(url.to_string());
            }
            Some(other) => anyhow::bail!(
                "--store {}: expected memory, redis://host:port, rediss://host:port (TLS), \
                 redis+cluster://host:port,host:port (rediss+cluster:// over TLS) or \
                 redis+sentinel://host:port,host:port/master-name (rediss+sentinel://)",
                tollgate::redis::redacted(other)
            ),
        }
        if self.kind == StoreKind::Redis && self.url.is_none() {
            anyhow::bail!("store: kind redis needs url (redis://host:port or redis+cluster://...)");
        }
        if self.password_file.is_some() && self.password_env.is_some() {
            anyhow::bail!("store: password_file and password_env are both set: keep one");
        }
        if self.sentinel_password_file.is_some() && self.sentinel_password_env.is_some() {
            anyhow::bail!(
                "store: sentinel_password_file and sentinel_password_env are both set: keep one"
            );
        }
        if self.local_share == Some(0) {
            anyhow::bail!("store.local_share: must be at least 1");
        }
        if let Some(second) = self.per_second_config() {
            if self.kind != StoreKind::Redis {
                anyhow::bail!("store.per_second: needs kind: redis (a Redis for the other limits)");
            }
            second
                .with_flag(None)
                .map_err(|e| anyhow::anyhow!("store.per_second: {e}"))?;
        }
        Ok(self)
    }

    /// The store config of the per-second Redis, if there is one: this one's settings
    /// with `per_second`'s connection.
    pub fn per_second_config(&self) -> Option<StoreConfig> {
        let p = self.per_second.as_ref()?;
        let mut c = self.clone();
        c.per_second = None;
        c.url = Some(p.url.clone());
        c.username = p.username.clone();
        c.password_file = p.password_file.clone();
        c.password_env = p.password_env.clone();
        c.password = p.password.clone();
        c.sentinel_username = p.sentinel_username.clone();
        c.sentinel_password_file = p.sentinel_password_file.clone();
        c.sentinel_password_env = p.sentinel_password_env.clone();
        c.sentinel_password = p.sentinel_password.clone();
        c.tls = p.tls.clone();
        c.timeout = p.timeout.or(self.timeout);
        c.connect_timeout = p.connect_timeout.or(self.connect_timeout);
        Some(c)
    }

    /// Whether a limit of `rules` goes to the per-second Redis (when there is one):
    /// every policy forgets within a second.
    pub fn is_per_second(rules: &tollgate::RuleSet) -> bool {
        rules
            .policies()
            .iter()
            .all(|p| (1..=1_000_000).contains(&p.window_us()))
    }

    /// Connects to the configured Redis. A setting that can never work (a refused
    /// login, a bad database index, a certificate that does not verify, an unreadable
    /// file) is an error naming it, so the command refuses to start; a Redis that is
    /// not reachable yet is not: the store connects when it answers (the failure policy
    /// decides meanwhile and `/readyz` says why), and a warning says so.
    pub async fn connect(&self) -> anyhow::Result<tollgate::redis::RedisStore> {
        let url = self.url.as_deref().unwrap_or_default();
        let opts = self.options()?;
        match tollgate::redis::RedisStore::connect_with(url, opts.clone()).await {
            Ok(store) => Ok(store),
            Err(e) if e.is_transient() => {
                tracing::warn!(
                    url = %tollgate::redis::redacted(url),
                    error = %e,
                    "redis does not answer yet: starting anyway; the failure policy decides \
                     until it does (/readyz answers 503 meanwhile)"
                );
                Ok(tollgate::redis::RedisStore::connect_later(url, opts)?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The store options: timeouts, prefix, batching, credentials and TLS.
    pub fn options(&self) -> anyhow::Result<tollgate::redis::RedisOptions> {
        let mut opts = tollgate::redis::RedisOptions::default();
        if let Some(t) = self.timeout {
            opts.timeout = std::time::Duration::from_micros(t);
        }
        if let Some(t) = self.connect_timeout {
            opts.connect_timeout = std::time::Duration::from_micros(t);
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
        if let Some(n) = self.in_flight {
            anyhow::ensure!(n >= 1, "store.in_flight: must be at least 1");
            opts.in_flight = n;
        }
        opts.direct_calls = self.direct_calls.unwrap_or(0);
        opts.calls = match self.calls {
            CallsDoc::Auto => tollgate::redis::RedisCalls::Auto,
            CallsDoc::Module => tollgate::redis::RedisCalls::Module,
            CallsDoc::Functions => tollgate::redis::RedisCalls::Functions,
            CallsDoc::Eval => tollgate::redis::RedisCalls::Eval,
        };
        opts.username = self.username.clone();
        opts.password =
            secret("", &self.password_file, &self.password_env)?.or_else(|| self.password.clone());
        // Followed as it rotates (read now too: a file that cannot be read is an error
        // at start).
        opts.password_file = self.password_file.clone();
        opts.sentinel_username = self.sentinel_username.clone();
        opts.sentinel_password = secret(
            "sentinel_",
            &self.sentinel_password_file,
            &self.sentinel_password_env,
        )?
        .or_else(|| self.sentinel_password.clone());
        // Followed as it rotates, as password_file is.
        opts.sentinel_password_file = self.sentinel_password_file.clone();
        opts.tls = self.tls.as_ref().map(|t| tollgate::redis::RedisTls {
            ca_file: t.ca_file.clone(),
            cert_file: t.cert_file.clone(),
            key_file: t.key_file.clone(),
            insecure_skip_hostname_verification: t.insecure_skip_hostname_verification,
            insecure_skip_verify: t.insecure_skip_verify,
        });
        Ok(opts)
    }

    /// The Redis limiter of `rules` named `name` on `store`, with the failure policy
    /// and negative cache: leased when `lease:` is set (an error names what a lease
    /// cannot keep).
    /// `window_counters`: whether the caller keeps window counters (`serve` does
    /// unless `window_counters: false`; see [`StoreConfig::window_counters`]).
    pub fn limiter(
        &self,
        store: &tollgate::redis::RedisStore,
        name: &str,
        rules: tollgate::RuleSet,
        window_counters: bool,
    ) -> Result<tollgate::AnyLimiter, tollgate::Error> {
        if self.window_counters == Some(true) && self.lease.is_some() {
            return Err(tollgate::Error::Config(
                "store.window_counters: true cannot go with store.lease (a lease keeps its states for the lease script)".into(),
            ));
        }
        Ok(match &self.lease {
            Some(lease) => {
                let mut opts = tollgate::redis::LeaseOptions {
                    max_slice: lease.max_slice,
                    redis: self.limiter_options(&rules)?,
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
                let opts = tollgate::redis::RedisLimiterOptions {
                    window_counters,
                    ..self.limiter_options(&rules)?
                };
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
    ) -> Result<tollgate::redis::RedisLimiterOptions, tollgate::Error> {
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
    ) -> Result<tollgate::redis::OnError, tollgate::Error> {
        use tollgate::redis::OnError;
        use tollgate::Error;
        Ok(match self.on_error {
            OnErrorDoc::Error => OnError::Error,
            OnErrorDoc::FailOpen => OnError::FailOpen,
            OnErrorDoc::FailClosed => OnError::FailClosed,
            OnErrorDoc::Local => OnError::Local(
                rules
                    .share(self.local_share.unwrap_or(1))
                    .map_err(Error::Unsupported)?,
            ),
        })
    }

    /// A short description for the start-up banner.
    pub fn describe(&self) -> String {
        match self.kind {
            StoreKind::Memory => "memory store".into(),
            StoreKind::Redis => format!(
                "redis store at {}{}, on error: {}",
                tollgate::redis::redacted(self.url.as_deref().unwrap_or("")),
                match &self.per_second {
                    Some(p) => format!(
                        " (per-second limits at {})",
                        tollgate::redis::redacted(&p.url)
                    ),
                    None => String::new(),
                },
                self.on_error.name()
            ),
        }
    }
}
