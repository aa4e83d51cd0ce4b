//! [`RedisStore`]: connecting (single node or Cluster), the keys a limiter's key maps
//! to, and the decision itself; how calls are sent lives in `caller.rs`, batching in
//! `batch.rs`.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use redis::{Script, Value};
use tollgate_core::{Op, PolicyState, RuleDecision, RuleSet};

use super::batch::Batchers;
use super::call::CheckCall;
use super::connect::Target;
use super::connection::{Caller, Conn, LaterCluster, SingleConn, MODE_EVAL, MODE_FUNCTIONS};
use super::options::{CallKind, CallStats, RedisCalls, RedisOptions};
use super::script::parse_state;
use super::topology::{Topology, AFTER_FAILURE_MS, MAX_AGE_MS};
use crate::Error;

/// A connection to Redis (one node, or a Cluster) that decides requests atomically with
/// tollgate's decision code, loaded once per node as a Redis Functions library (Redis
/// >= 7; `EVALSHA` of one script otherwise, see [`RedisCalls`]).
///
/// Cheap to clone: clones share the connection. Concurrent checks are batched: while
/// calls are outstanding, the checks that arrive queue up and go out together as one
/// call (per Cluster slot), each decided atomically, in order, exactly as alone;
/// a lone check is sent at once. [`RedisOptions::batch`] sets the size (1: off).
/// The code is loaded again when Redis answers that it lacks it (after a restart
/// without persistence, `FUNCTION FLUSH` or `SCRIPT FLUSH`).
///
/// URLs: `redis://host:port/db` for one node; `redis+cluster://host:port,host:port`
/// for a Cluster (any reachable nodes; the rest are discovered, `MOVED` and `ASK` are
/// followed); `redis+sentinel://host:port,host:port/master-name` for the master a set
/// of Sentinels names (followed across failovers). `rediss...` for TLS.
#[derive(Clone)]
pub struct RedisStore {
    caller: Arc<Caller>,
    batchers: Option<Arc<Batchers>>,
    url: Arc<str>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &super::connect::redacted(&self.url))
            .field("opts", &self.caller.opts)
            .finish()
    }
}
/// What one check's call answered: the time it was decided at, the verdict the driver
/// applied, and each policy's state before the call.
pub(crate) struct Reply {
    pub now: u64,
    pub admitted: bool,
    pub states: Vec<PolicyState>,
}

impl RedisStore {
    /// Connects with default options (see [`RedisStore::connect_with`]).
    pub async fn connect(url: &str) -> Result<RedisStore, Error> {
        RedisStore::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to `url` now and checks the login: `Ok` once Redis has answered a
    /// `PING` within the timeout. A refused login, an unknown ACL user, a bad database
    /// index, a certificate that does not verify or TLS spoken to a plain port is
    /// [`Error::Config`] (waiting will not help); an unreachable server is
    /// [`Error::Unavailable`] (to start before Redis does, use
    /// [`RedisStore::connect_later`]). Afterwards the connection is kept up by itself:
    /// a lost connection is made again on the next call.
    ///
    /// URLs: `redis://[user:password@]host:port[/db]` for one node, `rediss://...` for
    /// one node over TLS; `redis+cluster://host:port,host:port` (or `rediss+cluster://`)
    /// for a Cluster (any reachable nodes; the rest are discovered, `MOVED` and `ASK`
    /// are followed); `redis+sentinel://host:port,host:port/master-name[/db]` (or
    /// `rediss+sentinel://`) for the master the Sentinels name, found again after a
    /// failover (the Sentinels' own login: [`RedisOptions::sentinel_password`]); an
    /// unknown master name is [`Error::Config`]. A password in a URL is percent-encoded (`/` as `%2F`, `+` as
    /// `%2B`, `=` as `%3D`); [`RedisOptions::password`] takes it unencoded.
    pub async fn connect_with(url: &str, opts: RedisOptions) -> Result<RedisStore, Error> {
        let tls = url.starts_with("rediss");
        let first = opts.connect_timeout.max(opts.timeout);
        let store = RedisStore::connect_later(url, opts)?;
        match store.ping_within(first).await {
            Ok(()) => {
                fetch_map(&store.caller, first).await;
                store.caller.preload(first).await;
                Ok(store)
            }
            Err(Ok(e)) => Err(super::connect::first_contact(url, tls, e)),
            Err(Err(timeout)) => Err(timeout),
        }
    }

    /// A store for `url` that connects on its first call, so that a service can start
    /// while Redis (or every Cluster seed) is down: until Redis answers, each call
    /// fails as [`Error::Unavailable`] (a limiter's failure policy decides), and every
    /// call tries again. Only what can be checked without Redis is checked here: the
    /// URL, the TLS files, the options. Use [`RedisStore::ping`] to see whether Redis
    /// answers (a readiness check).
    pub fn connect_later(url: &str, opts: RedisOptions) -> Result<RedisStore, Error> {
        if opts.prefix.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "key prefix {:?} must not contain '{{' or '}}' (they would move the hash tag)",
                opts.prefix
            )));
        }
        if let Some(tls) = opts.tls.as_ref().filter(|t| t.insecure()) {
            tracing::warn!(
                url = %super::connect::redacted(url),
                skip_hostname_verification = tls.insecure_skip_hostname_verification,
                skip_verify = tls.insecure_skip_verify,
                "redis tls: certificate checks are off (insecure): anyone on the path can pose as Redis"
            );
        }
        let handshake = opts.connect_timeout.max(opts.timeout);
        let conn = match super::connect::target(url, &opts)? {
            Target::Cluster(client, node_client) => {
                // A fresh Cluster connection connects to the seeds, then to every
                // master, each bounded by the connect timeout, then pings.
                let handshake = handshake * 2 + opts.timeout;
                let file = super::credentials::of(&opts);
                let later = LaterCluster::new(client, node_client, file, opts.timeout, handshake);
                Conn::Cluster(Arc::new(later))
            }
            Target::Sentinel(sentinels) => Conn::Sentinel(Arc::new(sentinels)),
            Target::Single(client) => {
                // The call's own timeout (below) fires first and retires a connection
                // whose calls go unanswered; this one only bounds a call past it.
                let mut config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(opts.connect_timeout.max(opts.timeout)))
                    .set_response_timeout(Some(opts.timeout * 2))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(100));
                if let Some(file) = super::credentials::of(&opts) {
                    config = config.set_credentials_provider(file);
                }
                let single =
                    SingleConn::new(client, config, opts.timeout, handshake).map_err(|e| {
                        Error::Config(format!("{}: {e}", super::connect::redacted(url)))
                    })?;
                Conn::Single(Arc::new(single))
            }
        };
        let topology = Arc::new(match conn {
            Conn::Cluster(_) => Topology::cluster(),
            _ => Topology::single(&super::connect::redacted(url)),
        });
        let mode = match opts.calls {
            RedisCalls::Eval => MODE_EVAL,
            RedisCalls::Auto | RedisCalls::Module | RedisCalls::Functions => MODE_FUNCTIONS,
        };
        let (batch, in_flight, direct) = (opts.batch, opts.in_flight, opts.direct_calls);
        let caller = Arc::new(Caller {
            conn,
            topology,
            runtime: tokio::runtime::Handle::try_current().ok(),
            opts,
            mode: AtomicU8::new(mode),
            modules: Default::default(),
            calls: AtomicU64::new(0),
            checks: AtomicU64::new(0),
            times: Default::default(),
            clocks: Default::default(),
            expiring: Default::default(),
        });
        let batchers =
            (batch > 1).then(|| Arc::new(Batchers::new(caller.clone(), batch, in_flight, direct)));
        Ok(RedisStore {
            caller,
            batchers,
            url: url.into(),
        })
    }

    /// The options it was connected with.
    pub fn options(&self) -> &RedisOptions {
        &self.caller.opts
    }

    /// Whether decisions are sent by `EVALSHA` (configured, or `Auto` found a Redis
    /// without Functions) rather than `FCALL`.
    pub fn uses_eval(&self) -> bool {
        self.caller.mode.load(Ordering::Relaxed) == MODE_EVAL
    }

    /// Which code decides, as found so far (the banner's words): `the tollgate
    /// module`, `the tollgate module on 2 of 3 nodes, Redis Functions on the others`,
    /// `Redis Functions` or `EVALSHA scripts`. Rule sets the module does not decide
    /// (sliding-log) go to Functions wherever it is.
    pub fn decided_by(&self) -> String {
        let code = if self.uses_eval() {
            "EVALSHA scripts"
        } else {
            "Redis Functions"
        };
        if !matches!(
            self.caller.opts.calls,
            RedisCalls::Auto | RedisCalls::Module
        ) {
            return code.into();
        }
        let nodes = self.caller.topology.serving();
        let with = (nodes.iter())
            .filter(|(i, _)| self.caller.modules.has(*i))
            .count();
        match with {
            0 => code.into(),
            n if n == nodes.len() => "the tollgate module".into(),
            n => format!(
                "the tollgate module on {n} of {} nodes, {code} on the others",
                nodes.len()
            ),
        }
    }

    /// The connection and call machinery (for the lease client).
    pub(crate) fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Decision calls sent so far and the checks they carried (more checks than
    /// calls: batching at work), and every call's time and outcome by kind.
    pub fn call_stats(&self) -> CallStats {
        let mut stats = CallStats {
            calls: self.caller.calls.load(Ordering::Relaxed),
            checks: self.caller.checks.load(Ordering::Relaxed),
            ..CallStats::default()
        };
        self.caller.times.read_into(&mut stats);
        stats
    }

    /// Runs `call` for the keys of node `node` on a clone of the connection, bounded
    /// by the timeout.
    async fn timed<T, F>(&self, node: usize, call: impl FnOnce(Conn) -> F) -> Result<T, Error>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        (self.caller)
            .timed(CallKind::Other, node, |c| async move {
                call(c).await.map_err(Error::from)
            })
            .await
    }

    /// Whether Redis answers a `PING` within the timeout.
    pub async fn ping(&self) -> Result<(), Error> {
        self.ping_within(self.caller.opts.timeout)
            .await
            .map_err(|e| e.map_or_else(|e| e, Error::from))
    }

    /// Whether each node that holds keys answers a `PING` within the timeout, by name:
    /// the one node, or every master of the Cluster's slot map (all at once). For a
    /// readiness check that tells a Cluster with some nodes away (degraded: their keys
    /// get the failure policy, the others decide as usual) from one with none left.
    pub async fn ping_nodes(&self) -> Vec<(Arc<str>, Result<(), Error>)> {
        let mut pings = tokio::task::JoinSet::new();
        for (i, name) in self.caller.topology.serving() {
            let caller = self.caller.clone();
            pings.spawn(async move {
                let ping = |conn: Conn| {
                    let name = name.clone();
                    async move { conn.ping_node(&name).await }
                };
                let r = caller.timed(CallKind::Other, i, ping).await;
                (i, name, r)
            });
        }
        let mut all = pings.join_all().await;
        all.sort_by_key(|(i, _, _)| *i);
        all.into_iter().map(|(_, name, r)| (name, r)).collect()
    }

    /// A `PING` within `limit`: Redis's error as it came (`Err(Ok)`), or no answer in
    /// time (`Err(Err)`).
    async fn ping_within(&self, limit: Duration) -> Result<(), Result<redis::RedisError, Error>> {
        let mut conn = self.caller.conn.clone();
        let ping = async move { redis::cmd("PING").query_async::<String>(&mut conn).await };
        match tokio::time::timeout(limit, ping).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Ok(e)),
            Err(_) => {
                self.caller.conn.stalled(0, &self.caller.topology.name(0));
                Err(Err(super::timeout(limit)))
            }
        }
    }

    /// The Redis keys of `key`'s states under a limiter `name`: one per policy, all
    /// with one hash tag (one Cluster slot).
    pub(crate) fn keys(&self, name: &str, key: &str, suffixes: &[String]) -> Vec<String> {
        let base = if key.is_empty() || key.contains(['{', '}']) {
            // The tag is a hash of the key; the key itself follows, so that keys stay
            // distinct.
            format!(
                "{}:{name}:{{#{:016x}}}{key}",
                self.caller.opts.prefix,
                fnv1a(key)
            )
        } else {
            format!("{}:{name}:{{{key}}}", self.caller.opts.prefix)
        };
        suffixes.iter().map(|s| format!("{base}{s}")).collect()
    }

    /// The Cluster slot of a check whose first state key is `redis_key`, and the index
    /// of the node that holds it (0 for one node); fetches the slot map again when it
    /// is old.
    pub(crate) fn place(&self, redis_key: &str) -> (u16, usize) {
        self.refresh_map(MAX_AGE_MS);
        let t = &self.caller.topology;
        let slot = t.slot(redis_key);
        (slot, t.node_of(slot))
    }

    /// Fetches the Cluster's slot map again, in a task of its own, if it is older
    /// than `max_age_ms`.
    fn refresh_map(&self, max_age_ms: u64) {
        if !self.caller.topology.due(max_age_ms) {
            return;
        }
        let (caller, timeout) = (self.caller.clone(), self.caller.opts.timeout);
        self.caller
            .spawn(async move { fetch_map(&caller, timeout).await });
    }

    /// A call failed: the slot map is fetched again soon (a failover or a reshard may
    /// have moved the key).
    pub(crate) fn call_failed(&self) {
        self.refresh_map(AFTER_FAILURE_MS);
    }

    /// The indexes of the nodes that hold slots now (see [`RedisStore::node_name`]).
    pub(crate) fn serving_nodes(&self) -> Vec<usize> {
        (self.caller.topology.serving().into_iter())
            .map(|(i, _)| i)
            .collect()
    }

    /// The name of node `i` (`host:port`; for one node, its redacted URL; `cluster` for
    /// a Cluster's keys while the slot map is not known yet).
    pub fn node_name(&self, i: usize) -> Arc<str> {
        self.caller.topology.name(i)
    }

    /// One check by the decision driver, batched with others for the same node when
    /// batching is on.
    pub(crate) async fn call(&self, check: CheckCall, rules: &RuleSet) -> Result<Reply, Error> {
        let created = check.created;
        let reply = match &self.batchers {
            Some(b) => {
                (b.of(check.node))
                    .submit(check, self.caller.opts.timeout)
                    .await?
            }
            None => self.caller.send(&[&check]).await?.remove(0),
        };
        let created = created.unwrap_or(reply.now);
        let bad = |what: &str| Error::Store(format!("script reply: {what}"));
        let states = rules
            .policies()
            .iter()
            .zip(&reply.states)
            .map(|(p, v)| match v {
                Value::BulkString(b) => {
                    let s = std::str::from_utf8(b).map_err(|_| bad("state is not UTF-8"))?;
                    parse_state(p, s, created)
                }
                Value::Nil => Ok(p.init(created)),
                _ => Err(bad("state is not a string")),
            })
            .collect::<Result<_, _>>()?;
        Ok(Reply {
            now: reply.now,
            admitted: reply.admitted,
            states,
        })
    }

    /// Runs `script` (EVALSHA, loading it on NOSCRIPT) within the timeout.
    pub(crate) async fn eval<A: redis::ToRedisArgs>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[A],
    ) -> Result<Value, Error> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let inv = &inv;
        let node = keys.first().map_or(0, |k| self.place(k).1);
        // A slot being resharded answers TRYAGAIN to a script whose keys are split
        // between the two nodes (and ASK/MOVED once the client's retries are spent):
        // try again until it settles, within the one timeout.
        self.timed(node, |mut c| async move {
            loop {
                match inv.invoke_async::<Value>(&mut c).await {
                    Err(e) if e.is_cluster_error() => {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    r => return r,
                }
            }
        })
        .await
    }

    /// Node `node`'s time (us since the epoch; see `redis_time.rs`), within the
    /// timeout; `slot` is one the node holds.
    pub(crate) async fn redis_now(&self, node: usize, slot: u16) -> Result<u64, Error> {
        let caller = &self.caller;
        let limit = caller.opts.timeout;
        tokio::time::timeout(limit, caller.redis_now(&caller.conn, node, slot))
            .await
            .map_err(|_| super::timeout(limit))?
    }

    /// Deletes `keys`.
    pub(crate) async fn delete(&self, keys: &[String]) -> Result<(), Error> {
        let mut cmd = redis::cmd("DEL");
        for k in keys {
            cmd.arg(k);
        }
        let node = keys.first().map_or(0, |k| self.place(k).1);
        self.timed(
            node,
            |mut c| async move { cmd.query_async::<i64>(&mut c).await },
        )
        .await?;
        Ok(())
    }

    /// Decides `check` (a try or an acquire of `key`) against `rules` atomically in
    /// Redis.
    pub(crate) async fn decide(
        &self,
        key: &str,
        check: CheckCall,
        rules: &RuleSet,
        op: Op,
    ) -> Result<RuleDecision, Error> {
        let cost = check.cost;
        let mut check = check;
        if op.charges() {
            check.wire.check_charge(rules)?;
            check.cost = cost.min(super::script::MAX_CHARGE_SENT);
        } else {
            check.wire.check_cost(rules, cost)?;
        }
        let mut reply = self.call(check, rules).await?;
        // The script applied its verdict; the core derives the numbers from the
        // states it started from, with the same code as the memory store (for a
        // charge or a count, the verdict too: the script only charges).
        let d = rules.check(&mut reply.states, reply.now, cost, op)?;
        if !op.charges() && d.decision.allowed != reply.admitted {
            tracing::error!(
                key,
                script = reply.admitted,
                core = d.decision.allowed,
                "tollgate: the Redis script and the core disagree; the script's verdict stands"
            );
            return Err(Error::Store(format!(
                "script and core disagree on key {key:?} (script admitted: {})",
                reply.admitted
            )));
        }
        Ok(d)
    }
}

/// Fetches a Cluster's slot map now (`CLUSTER SLOTS`), within `timeout`; a failure
/// leaves the map it had.
async fn fetch_map(caller: &Caller, timeout: Duration) {
    if !caller.topology.is_cluster() {
        return;
    }
    let mut conn = caller.conn.clone();
    let mut cmd = redis::cmd("CLUSTER");
    let slots = cmd.arg("SLOTS").query_async::<Value>(&mut conn);
    match tokio::time::timeout(timeout, slots).await {
        Ok(Ok(reply)) => caller.topology.learn(&reply),
        Ok(Err(e)) => tracing::debug!(error = %e, "redis: CLUSTER SLOTS failed"),
        Err(_) => tracing::debug!("redis: CLUSTER SLOTS unanswered"),
    }
}

/// 64-bit FNV-1a: a hash tag for keys that cannot be their own (stable across
/// processes, unlike the std hasher).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}
