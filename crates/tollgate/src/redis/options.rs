//! The options of a [`RedisStore`](super::RedisStore): how it talks to Redis, and the
//! counters of what it sent. Below the store and its caller, so both can read them.

use std::time::Duration;

/// How a [`RedisStore`](super::RedisStore) talks to Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The longest a decision may take (connect, send, answer); past it the call
    /// fails with a transient [`Error::Unavailable`](crate::Error::Unavailable). Default 250 ms.
    pub timeout: Duration,
    /// Added to each key's time to live, which is otherwise the time until its state
    /// is fully replenished. Default 1 s.
    pub ttl_margin: Duration,
    /// Prefix of every key (default `tollgate`); must not contain `{` or `}`.
    pub prefix: String,
    /// How the decision code is called. Default [`RedisCalls::Auto`].
    pub calls: RedisCalls,
    /// The most checks decided by one call (automatic batching; see
    /// [`RedisStore`](super::RedisStore)). 1 sends each check as its own call. Default 64.
    pub batch: usize,
    /// With batching, how many batched calls may be outstanding at once on the
    /// connection; checks arriving meanwhile wait for the next call. Default 2.
    pub in_flight: usize,
    /// With batching, a check that finds no other waiting is sent at once from its own
    /// task (no hand-off to the batching task) while fewer than this many such calls
    /// are out; past that, checks queue and ride batches. 0 queues every check (fewer,
    /// larger calls: less Redis CPU per decision, about 5 us more for a lone check;
    /// `serve` and the proxy default to 0). Default 8.
    pub direct_calls: usize,
    /// The longest connecting may take: TCP, the TLS handshake and the login, and the
    /// first `PING` of [`RedisStore::connect_with`](super::RedisStore::connect_with).
    /// Longer than `timeout`, so that a slow handshake to a distant managed Redis is
    /// not mistaken for an unreachable one. Default 2 s.
    pub connect_timeout: Duration,
    /// The ACL user to log in as (Redis 6+), when it is not in the URL.
    pub username: Option<String>,
    /// The password, when it is not in the URL (read from a file or the environment:
    /// the usual shapes of a Kubernetes secret). Wins over one in the URL.
    pub password: Option<Password>,
    /// A file holding the password (a mounted Kubernetes secret), followed as it
    /// rotates: each new connection logs in with what it holds then, and each open
    /// connection logs in again when it changes (looked at every 2 s). Wins over
    /// [`RedisOptions::password`].
    pub password_file: Option<std::path::PathBuf>,
    /// TLS settings for a `rediss://` or `rediss+cluster://` URL (`None`: the system's
    /// roots, no client certificate). Given with a plain URL, connecting is refused.
    pub tls: Option<RedisTls>,
    /// With a `redis+sentinel://` URL: the ACL user to log in to the Sentinels as
    /// (the URL's user and [`RedisOptions::username`] log in to the master).
    pub sentinel_username: Option<String>,
    /// With a `redis+sentinel://` URL: the Sentinels' password (`requirepass` in
    /// their config), when they ask for one.
    pub sentinel_password: Option<Password>,
    /// With a `redis+sentinel://` URL: a file holding the Sentinels' password (a
    /// mounted Kubernetes secret), read again for each new connection to a Sentinel,
    /// so that it rotates without a restart. Wins over
    /// [`RedisOptions::sentinel_password`].
    pub sentinel_password_file: Option<std::path::PathBuf>,
}

/// TLS to Redis (rustls; TLS 1.2 and 1.3): whom to trust and who we are. Every Cluster
/// node, seeds and discovered ones alike, is reached with the same settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// PEM file of the CA certificates that sign the server's certificate (a managed
    /// service's server CA); `None`: the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate (chain), for mutual TLS (`tls-auth-clients yes`).
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<std::path::PathBuf>,
    /// Verify the certificate chain but not that it names the host in the URL (a
    /// server reached by IP address with a certificate for its DNS name). Insecure: a
    /// warning is logged when connecting.
    pub insecure_skip_hostname_verification: bool,
    /// Verify nothing: any certificate is accepted (encryption without
    /// authentication). Insecure: a warning is logged when connecting.
    pub insecure_skip_verify: bool,
}

impl RedisTls {
    /// Whether a setting turns a check off.
    pub fn insecure(&self) -> bool {
        self.insecure_skip_hostname_verification || self.insecure_skip_verify
    }
}

/// A password that never prints: `Debug` and `Display` show `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps `password`.
    pub fn new(password: impl Into<String>) -> Password {
        Password(password.into())
    }

    /// The password itself, to send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Counters of a [`RedisStore`](super::RedisStore)'s calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CallStats {
    /// Decision calls sent (`FCALL` or `EVALSHA`), including failed ones.
    pub calls: u64,
    /// Checks (try, acquire, peek, refund) those calls carried.
    pub checks: u64,
    /// Decision calls by the checks they carried: `batches[i]` counts those that
    /// carried at most [`BATCH_BOUNDS`]`[i]` (and more than the bound before); the
    /// last, those past every bound.
    pub batches: [u64; BATCH_BOUNDS.len() + 1],
    /// Every call's time and outcome, by [`CallKind`] (indexed `kind as usize`).
    pub kinds: [CallTimes; 3],
    /// Decision calls by the code that decided them, in [`CallStats::PATHS`]' order:
    /// the module, Functions, `EVALSHA`, plain commands (window counters, see
    /// [`RedisLimiterOptions::window_counters`](super::RedisLimiterOptions::window_counters)).
    pub paths: [u64; 4],
}

impl CallStats {
    /// The names of [`CallStats::paths`]: `module`, `functions`, `eval`, `commands`.
    pub const PATHS: [&'static str; 4] = ["module", "functions", "eval", "commands"];
}

/// What a store's calls to Redis are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// Deciding checks (the decision driver, batched or not).
    Decide,
    /// Taking or returning a lease of quota (leased limiters).
    Lease,
    /// Anything else: resets, deletes, the quota buckets' ledger, scripts of their own.
    Other,
}

impl CallKind {
    /// Every kind, in [`CallStats::kinds`]' order.
    pub const ALL: [CallKind; 3] = [CallKind::Decide, CallKind::Lease, CallKind::Other];

    /// Its name (`decide`, `lease`, `other`).
    pub fn name(self) -> &'static str {
        match self {
            CallKind::Decide => "decide",
            CallKind::Lease => "lease",
            CallKind::Other => "other",
        }
    }
}

/// The times of one kind of call, from sending it to its answer (or to the error, or
/// the timeout), in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallTimes {
    /// Calls made.
    pub calls: u64,
    /// Those that failed: an error from Redis or the connection, or no answer within
    /// the timeout.
    pub errors: u64,
    /// Their times added up.
    pub sum_us: u64,
    /// Calls by time: `buckets[i]` counts those that took at most
    /// [`CALL_BOUNDS_US`]`[i]` (and more than the bound before); the last, the rest.
    pub buckets: [u64; CALL_BOUNDS_US.len() + 1],
}

/// The upper bounds of [`CallTimes::buckets`], in microseconds: 50 us to 1 s.
pub const CALL_BOUNDS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// The upper bounds of [`CallStats::batches`]: checks per decision call.
pub const BATCH_BOUNDS: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// How a [`RedisStore`](super::RedisStore) calls its decision code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedisCalls {
    /// The tollgate module on each node that has loaded it (`TOLLGATE.*` commands;
    /// see `crates/tollgate-redis-module`), else Redis Functions where the server has
    /// them (Redis >= 7), else `EVALSHA`.
    #[default]
    Auto,
    /// The tollgate module, as `Auto` chooses it, but a node that has not loaded it
    /// fails its calls with [`Error::Unsupported`](crate::Error::Unsupported) instead
    /// of moving on to Functions: a missing `loadmodule` is found, not hidden. Rule sets
    /// with an algorithm the module does not decide (sliding-log) still go to Functions.
    Module,
    /// Redis Functions: the library is loaded once per node (`FUNCTION LOAD`) and each
    /// call runs only the algorithms it names (`FCALL`; `FCALL_RO` for peeks).
    Functions,
    /// `EVALSHA` of one script that defines every algorithm on each call (loaded with
    /// `SCRIPT LOAD` when Redis does not know it).
    Eval,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            timeout: Duration::from_millis(250),
            ttl_margin: Duration::from_secs(1),
            prefix: "tollgate".into(),
            calls: RedisCalls::Auto,
            batch: 64,
            in_flight: 2,
            direct_calls: 8,
            connect_timeout: Duration::from_secs(2),
            username: None,
            password: None,
            password_file: None,
            tls: None,
            sentinel_username: None,
            sentinel_password: None,
            sentinel_password_file: None,
        }
    }
}
