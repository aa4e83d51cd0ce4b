//! The connection (one node or a Cluster) and how decision calls are sent on it:
//! `FCALL` of the Functions library or `EVALSHA` of a script, loading the code when
//! Redis lacks it. Shared by the store and its batching task.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::Value;

use super::call::{nonce, push_call, push_try, split_reply, CallOp, CheckCall, CheckReply, Form};
use super::counter::{Change, WindowCounter};
use super::module::{probe, unknown_command, ModuleNodes, ABSENT, LOADED, UNKNOWN};
use super::options::{
    CallKind, CallStats, CallTimes, RedisCalls, RedisOptions, BATCH_BOUNDS, CALL_BOUNDS_US,
};
use super::per_node::PerNode;
use super::script::{eval_script, library};
use super::sentinel::SentinelConn;
use super::topology::Topology;
use crate::Error;

#[derive(Clone)]
pub(super) enum Conn {
    Single(Arc<SingleConn>),
    /// A Cluster, reached on the first call that finds it up (each call tries until
    /// one does; the client learns the slot map then).
    Cluster(Arc<LaterCluster>),
    /// A master found through Sentinel, followed across failovers.
    Sentinel(Arc<SentinelConn>),
}

/// When a connection that stopped answering is replaced by a fresh one.
///
/// A link cut silently (packets dropped, no reset) leaves a connection waiting on
/// TCP's retransmissions, whose backoff grows while the link is down: after the link
/// is back, calls on it stay unanswered for seconds more, while a new connection is
/// answered at once. So while calls time out on a connection that has answered
/// nothing for `silent` (twice the timeout), a fresh connection is tried (at most once
/// per `every`, the timeout), each in a task of its own that connects and pings within
/// `handshake`, and the first that answers takes over (calls already sent finish or
/// time out on the old one). A Redis that is slow but answering keeps its connection;
/// a slow TLS login is never cut short by the next try.
struct Replacement {
    every: Duration,
    silent: Duration,
    handshake: Duration,
    /// When (ms on `clock`, from 1) a fresh connection was last tried.
    tried_ms: AtomicU64,
    clock: tollgate_core::MonotonicClock,
    /// The runtime fresh connections are tried on (the store's).
    runtime: Option<tokio::runtime::Handle>,
}

impl Replacement {
    fn new(timeout: Duration, handshake: Duration) -> Replacement {
        Replacement {
            every: timeout.max(Duration::from_millis(100)),
            silent: timeout * 2,
            handshake,
            tried_ms: AtomicU64::new(0),
            clock: tollgate_core::MonotonicClock::new(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    fn now_ms(&self) -> u64 {
        use tollgate_core::Clock;
        self.clock.now_us() / 1000 + 1
    }

    /// A call timed out on a connection last answered at `answered` (ms, 0: never):
    /// whether to try a fresh one now (and the runtime to try it on).
    fn due(&self, answered: u64) -> Option<tokio::runtime::Handle> {
        let now = self.now_ms();
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        if answered != 0 && now < answered.saturating_add(ms(self.silent)) {
            return None; // slow, not silent
        }
        let last = self.tried_ms.load(Ordering::Relaxed);
        if last != 0 && now < last.saturating_add(ms(self.every)) {
            return None;
        }
        (self.tried_ms)
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        (self.runtime.clone()).or_else(|| tokio::runtime::Handle::try_current().ok())
    }
}

/// One node's connection, replaced by a fresh one when it stops answering (see
/// [`Replacement`]).
pub(crate) struct SingleConn {
    client: redis::Client,
    config: redis::aio::ConnectionManagerConfig,
    current: arc_swap::ArcSwap<Generation>,
    replacement: Replacement,
}

/// One connection of a [`SingleConn`], and when it last answered (ms, 0: never).
struct Generation {
    manager: ConnectionManager,
    answered_ms: AtomicU64,
}

impl SingleConn {
    pub(super) fn new(
        client: redis::Client,
        config: redis::aio::ConnectionManagerConfig,
        timeout: Duration,
        handshake: Duration,
    ) -> redis::RedisResult<SingleConn> {
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(SingleConn {
            client,
            config,
            current: arc_swap::ArcSwap::from_pointee(Generation {
                manager,
                answered_ms: AtomicU64::new(0),
            }),
            replacement: Replacement::new(timeout, handshake),
        })
    }

    /// The connection in use.
    fn generation(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Sends one call on the connection in use, and notes when it is answered.
    fn send<T, F>(
        self: &Arc<Self>,
        call: impl FnOnce(ConnectionManager) -> F,
    ) -> impl std::future::Future<Output = redis::RedisResult<T>>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let (me, g) = (self.clone(), self.generation());
        let sent = call(g.manager.clone());
        async move {
            let r = sent.await;
            match &r {
                Ok(_) => (g.answered_ms).store(me.replacement.now_ms(), Ordering::Relaxed),
                // The connection manager connects again after an I/O error only: a
                // login refused as it connected again (a password rotated on Redis
                // before its file) would be its answer to every later call. A fresh
                // one logs in with what the file holds then.
                // (A RESP3 login, `HELLO 3 AUTH`, is refused as a server's WRONGPASS.)
                Err(e)
                    if e.kind() == redis::ErrorKind::AuthenticationFailed
                        || e.code() == Some("WRONGPASS") =>
                {
                    // Due as for a connection never answered: a refusal is no
                    // slow link to wait out, only the rate of tries applies.
                    if let Some(runtime) = me.replacement.due(0) {
                        me.try_fresh(runtime, "a login was refused");
                    }
                }
                Err(_) => {}
            }
            r
        }
    }

    /// A call went unanswered within its timeout: if the connection has been silent,
    /// try a fresh one.
    fn stalled(self: &Arc<Self>) {
        let answered = self.generation().answered_ms.load(Ordering::Relaxed);
        if let Some(runtime) = self.replacement.due(answered) {
            self.try_fresh(runtime, "the connection stopped answering");
        }
    }

    /// Tries a fresh connection on `runtime`: it takes over once it answers a `PING`
    /// within the handshake time (`why` says what made it tried, in the log).
    fn try_fresh(self: &Arc<Self>, runtime: tokio::runtime::Handle, why: &'static str) {
        let manager =
            match ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
            {
                Ok(m) => m,
                Err(e) => return tracing::warn!(error = %e, "redis: no new connection: {e}"),
            };
        let (me, handshake) = (self.clone(), self.replacement.handshake);
        runtime.spawn(async move {
            let mut m = manager.clone();
            let cmd = redis::cmd("PING");
            let ping = cmd.query_async::<String>(&mut m);
            if let Ok(Ok(_)) = tokio::time::timeout(handshake, ping).await {
                let fresh = Generation {
                    manager,
                    answered_ms: AtomicU64::new(me.replacement.now_ms()),
                };
                me.current.store(Arc::new(fresh));
                tracing::info!("redis: {why}; a new connection took over");
            }
        });
    }
}

impl Conn {
    /// A call on this connection to node `node` (named `name`, see `topology.rs`)
    /// went unanswered within its timeout.
    pub(super) fn stalled(&self, node: usize, name: &str) {
        match self {
            Conn::Single(s) => s.stalled(),
            Conn::Cluster(c) => c.stalled(node, name),
            Conn::Sentinel(_) => {}
        }
    }

    /// A `PING` to the node named `name`: a Cluster node (`host:port`) on a fresh
    /// connection of its own, so that a readiness check never goes through the
    /// Cluster client's routing (which reconnects every node when the one asked for
    /// has no connection); the one node of a single connection on it.
    pub(super) async fn ping_node(&self, name: &str) -> Result<(), Error> {
        let ping = redis::cmd("PING");
        let target = name.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        match (self, target) {
            (Conn::Cluster(c), Some((_, Ok(_)))) => {
                let mut conn = c.node_connection(name).await?;
                Ok(ping.query_async::<String>(&mut conn).await.map(drop)?)
            }
            (Conn::Cluster(c), _) => {
                Ok(c.get().await?.req_packed_command(&ping).await.map(drop)?)
            }
            (other, _) => Ok(ping
                .query_async::<String>(&mut other.clone())
                .await
                .map(drop)?),
        }
    }

    /// A call to node `node` was answered.
    pub(super) fn answered(&self, node: usize) {
        if let Conn::Cluster(c) = self {
            c.answered(node);
        }
    }
}

/// A Cluster client and, once reached, its connection: replaced by a fresh one (see
/// [`Replacement`]) when a node stops answering on it, since the client keeps a
/// connection whose calls time out.
pub(crate) struct LaterCluster {
    client: Arc<redis::cluster::ClusterClient>,
    /// One node's own client, for readiness pings, and how it connects.
    node_client: super::sentinel::MasterClient,
    node_config: redis::AsyncConnectionConfig,
    current: arc_swap::ArcSwapOption<ClusterConnection>,
    connecting: tokio::sync::Mutex<()>,
    /// When (ms on the replacement's clock) each node last answered a call.
    answered_ms: PerNode<AtomicU64>,
    replacement: Replacement,
}

impl LaterCluster {
    pub(super) fn new(
        client: redis::cluster::ClusterClient,
        node_client: super::sentinel::MasterClient,
        password_file: Option<super::credentials::FileCredentials>,
        timeout: Duration,
        handshake: Duration,
    ) -> LaterCluster {
        let node_config = match password_file {
            Some(file) => redis::AsyncConnectionConfig::new().set_credentials_provider(file),
            None => redis::AsyncConnectionConfig::new(),
        };
        LaterCluster {
            client: Arc::new(client),
            node_client,
            node_config,
            current: Default::default(),
            connecting: Default::default(),
            answered_ms: PerNode::default(),
            replacement: Replacement::new(timeout, handshake),
        }
    }

    /// The connection, made now if there is none yet: in a task of its own (one at a
    /// time), so that a call's timeout, shorter than a first connection to a TLS
    /// Cluster may take, does not cut it short and leave the store never connected.
    async fn get(self: &Arc<Self>) -> redis::RedisResult<ClusterConnection> {
        if let Some(conn) = self.current.load_full() {
            return Ok(ClusterConnection::clone(&conn));
        }
        let me = self.clone();
        let connecting = tokio::spawn(async move {
            let _one = me.connecting.lock().await;
            if let Some(conn) = me.current.load_full() {
                return Ok(ClusterConnection::clone(&conn));
            }
            let conn = me.client.get_async_connection().await?;
            me.current.store(Some(Arc::new(conn.clone())));
            Ok(conn)
        });
        connecting.await.map_err(|e| {
            redis::RedisError::from(std::io::Error::other(format!("connecting: {e}")))
        })?
    }

    /// A fresh connection of its own to the node named `host:port` (readiness
    /// pings, loading the library), outside the Cluster client's routing.
    async fn node_connection(
        &self,
        name: &str,
    ) -> Result<redis::aio::MultiplexedConnection, Error> {
        let (host, port) = (name.rsplit_once(':'))
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
            .ok_or_else(|| Error::Store(format!("not a node address: {name:?}")))?;
        let client = (self.node_client)(host, port)?;
        Ok((client.get_multiplexed_async_connection_with_config(&self.node_config)).await?)
    }

    fn answered(&self, node: usize) {
        let now = self.replacement.now_ms();
        self.answered_ms
            .get(node, Default::default)
            .store(now, Ordering::Relaxed);
    }

    /// A call to node `node` (`host:port`, or `cluster` while the slot map is not
    /// known) timed out: if the node has been silent, try a fresh connection and let
    /// it take over once that node answers a `PING` on it.
    fn stalled(self: &Arc<Self>, node: usize, name: &str) {
        let answered = (self.answered_ms.get(node, Default::default)).load(Ordering::Relaxed);
        let Some(runtime) = self.replacement.due(answered) else {
            return;
        };
        use redis::cluster_routing::RoutingInfo;
        let route = route_to(name);
        let (me, handshake) = (self.clone(), self.replacement.handshake);
        runtime.spawn(async move {
            let fresh = async {
                let mut conn = me.client.get_async_connection().await?;
                let ping = redis::cmd("PING");
                conn.route_command(ping, RoutingInfo::SingleNode(route))
                    .await?;
                Ok::<_, redis::RedisError>(conn)
            };
            if let Ok(Ok(conn)) = tokio::time::timeout(handshake, fresh).await {
                me.current.store(Some(Arc::new(conn)));
                me.answered(node);
                tracing::info!(
                    node,
                    "redis: a Cluster node stopped answering; a new connection took over"
                );
            }
        });
    }
}

/// Loads the Functions library on the node `conn` reaches, unless it has it.
async fn load_library(conn: &mut impl ConnectionLike) -> redis::RedisResult<()> {
    let lib = library();
    let listed: Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&lib.function)
        .query_async(conn)
        .await?;
    if matches!(&listed, Value::Array(libraries) if !libraries.is_empty()) {
        return Ok(());
    }
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&lib.source)
        .query_async::<Value>(conn)
        .await
        .map(drop)
}

/// The route to a Cluster node named `host:port` (any node for another name).
fn route_to(name: &str) -> redis::cluster_routing::SingleNodeRoutingInfo {
    use redis::cluster_routing::SingleNodeRoutingInfo;
    match name.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>())) {
        Some((host, Ok(port))) => SingleNodeRoutingInfo::ByAddress {
            host: host.to_owned(),
            port,
        },
        _ => SingleNodeRoutingInfo::Random,
    }
}

impl Conn {
    /// `cmd` to the master of `slot`: a Cluster client cannot find the keys of a
    /// module's command itself, so it is routed by the slot its checks share.
    pub(super) async fn query_slot(
        &mut self,
        cmd: redis::Cmd,
        slot: u16,
    ) -> redis::RedisResult<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Conn::Cluster(l) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                l.get()
                    .await?
                    .route_command(cmd, RoutingInfo::SingleNode(route))
                    .await
            }
            other => cmd.query_async(other).await,
        }
    }
}

/// Either connection, so that every command and the script are sent one way.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(s) => {
                Box::pin(s.send(move |mut c| async move { c.req_packed_command(cmd).await }))
            }
            Conn::Cluster(l) => {
                Box::pin(async move { l.get().await?.req_packed_command(cmd).await })
            }
            Conn::Sentinel(s) => {
                Box::pin(s.send(move |mut c| async move { c.req_packed_command(cmd).await }))
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(s) => {
                Box::pin(s.send(move |mut c| async move {
                    c.req_packed_commands(cmd, offset, count).await
                }))
            }
            Conn::Cluster(l) => Box::pin(async move {
                let mut c = l.get().await?;
                c.req_packed_commands(cmd, offset, count).await
            }),
            Conn::Sentinel(s) => {
                Box::pin(s.send(move |mut c| async move {
                    c.req_packed_commands(cmd, offset, count).await
                }))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(s) => s.generation().manager.get_db(),
            Conn::Cluster(_) => 0,
            Conn::Sentinel(s) => s.db(),
        }
    }
}

/// The entry points of the decision code (`functions.lua`, `eval.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    Try,
    Charge,
    Batch,
    ReadOnly,
    Lease,
}

pub(super) const MODE_FUNCTIONS: u8 = 0;
pub(super) const MODE_EVAL: u8 = 1;

/// The connection and how decision calls are sent on it (shared with the batching task).
pub(crate) struct Caller {
    pub(super) conn: Conn,
    /// Which node holds each key.
    pub(super) topology: Arc<Topology>,
    /// The runtime the store was made on: its own tasks (batching, slot maps, fresh
    /// connections) run there, not on whichever worker's runtime made a call first.
    pub(super) runtime: Option<tokio::runtime::Handle>,
    pub(super) opts: RedisOptions,
    /// `MODE_FUNCTIONS` or `MODE_EVAL`; `Auto` starts with Functions and moves to
    /// `EVALSHA` for good when the server does not know `FCALL`.
    pub(super) mode: AtomicU8,
    /// Which nodes decide with the tollgate module (`module.rs`).
    pub(super) modules: ModuleNodes,
    /// Decision calls sent and checks they carried (batching's effect).
    pub(super) calls: AtomicU64,
    pub(super) checks: AtomicU64,
    /// Decision calls by checks carried, and every call's time by kind.
    pub(super) times: CallCounters,
    /// Each node's clock, for the window counters' keys.
    pub(super) clocks: super::redis_time::RedisClocks,
    /// Window counters' keys known to have their time to live.
    pub(super) expiring: super::counter::Expiring,
}

/// The atomic counters behind [`CallStats`]' batches and times.
#[derive(Default)]
pub(super) struct CallCounters {
    batches: [AtomicU64; BATCH_BOUNDS.len() + 1],
    kinds: [KindCounters; 3],
    paths: [AtomicU64; 4],
}

#[derive(Default)]
struct KindCounters {
    calls: AtomicU64,
    errors: AtomicU64,
    sum_us: AtomicU64,
    buckets: [AtomicU64; CALL_BOUNDS_US.len() + 1],
}

impl CallCounters {
    /// Counts a decision call of `checks` checks.
    fn batch(&self, checks: usize) {
        let i = BATCH_BOUNDS.partition_point(|b| *b < checks as u64);
        self.batches[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a decision call answered by path `i` of [`CallStats::PATHS`].
    pub(super) fn path(&self, i: usize) {
        self.paths[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a call of `kind` that took `us` and succeeded or not.
    fn call(&self, kind: CallKind, us: u64, ok: bool) {
        let k = &self.kinds[kind as usize];
        k.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            k.errors.fetch_add(1, Ordering::Relaxed);
        }
        k.sum_us.fetch_add(us, Ordering::Relaxed);
        let i = CALL_BOUNDS_US.partition_point(|b| *b < us);
        k.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Fills `stats`' batches and times.
    pub(super) fn read_into(&self, stats: &mut CallStats) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        stats.batches = std::array::from_fn(|i| load(&self.batches[i]));
        stats.paths = std::array::from_fn(|i| load(&self.paths[i]));
        stats.kinds = std::array::from_fn(|k| {
            let c = &self.kinds[k];
            CallTimes {
                calls: load(&c.calls),
                errors: load(&c.errors),
                sum_us: load(&c.sum_us),
                buckets: std::array::from_fn(|i| load(&c.buckets[i])),
            }
        });
    }
}

impl Caller {
    /// Starts `task` on the store's runtime (the current one if it had none).
    pub(super) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        match &self.runtime {
            Some(rt) => drop(rt.spawn(task)),
            None => drop(tokio::spawn(task)),
        }
    }

    /// Runs `call` on a clone of the connection, bounded by the timeout; counts it
    /// as a call of `kind` to node `node` with its time and outcome.
    pub(super) async fn timed<T, F>(
        &self,
        kind: CallKind,
        node: usize,
        call: impl FnOnce(Conn) -> F,
    ) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, Error>>,
    {
        let started = tokio::time::Instant::now();
        let result = tokio::time::timeout(self.opts.timeout, call(self.conn.clone()))
            .await
            .map_err(|_| {
                self.conn.stalled(node, &self.topology.name(node));
                super::timeout(self.opts.timeout)
            })
            .and_then(|r| r);
        if result.is_ok() {
            self.conn.answered(node);
        }
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.times.call(kind, us, result.is_ok());
        result
    }

    /// Loads the Functions library now where a node lacks it (each master of a
    /// Cluster, on a connection of its own), so that a store made at start does not
    /// have its first decision on a node pay for `FUNCTION LOAD` (68 KB of Lua to
    /// compile) within the decision's timeout. Best effort, within `limit` per node:
    /// a failure here leaves the load to the first call, as it always could.
    pub(super) async fn preload(&self, limit: Duration) {
        self.find_modules(limit).await;
        if self.mode.load(Ordering::Relaxed) != MODE_FUNCTIONS {
            return;
        }
        let loaded = match &self.conn {
            Conn::Cluster(c) => {
                let mut all = Ok(());
                for (_, name) in self.topology.serving() {
                    let load = async {
                        let mut conn = c.node_connection(&name).await?;
                        Ok::<_, Error>(load_library(&mut conn).await?)
                    };
                    all = all.and(
                        tokio::time::timeout(limit, load)
                            .await
                            .unwrap_or_else(|_| Err(super::timeout(limit))),
                    );
                }
                all
            }
            other => {
                let mut conn = other.clone();
                let load = load_library(&mut conn);
                match tokio::time::timeout(limit, load).await {
                    Ok(r) => r.map_err(Error::from),
                    Err(_) => Err(super::timeout(limit)),
                }
            }
        };
        if let Err(e) = loaded {
            tracing::debug!(error = %e, "redis: the decision code is loaded on the first call");
        }
    }

    /// Asks each node (each master of a Cluster, on a connection of its own) whether it
    /// has the tollgate module, so that the banner and the first calls know. Best
    /// effort, within `limit` per node: a node not answered is asked on its first call.
    async fn find_modules(&self, limit: Duration) {
        if !matches!(self.opts.calls, RedisCalls::Auto | RedisCalls::Module) {
            return;
        }
        let bounded = |answer: Result<redis::RedisResult<Value>, _>| {
            answer.unwrap_or_else(|_| {
                Err(redis::RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                )))
            })
        };
        match &self.conn {
            Conn::Cluster(c) => {
                for (node, name) in self.topology.serving() {
                    let ask = async {
                        match c.node_connection(&name).await {
                            Ok(mut conn) => probe().query_async::<Value>(&mut conn).await,
                            Err(e) => Err(std::io::Error::other(e.to_string()).into()),
                        }
                    };
                    let answer = bounded(tokio::time::timeout(limit, ask).await);
                    self.modules.found(node, &name, answer);
                }
            }
            other => {
                let mut conn = other.clone();
                let answer = bounded(
                    tokio::time::timeout(limit, probe().query_async::<Value>(&mut conn)).await,
                );
                self.modules.found(0, &self.topology.name(0), answer);
            }
        }
    }

    /// One call of the decision driver for `checks` (all in one Cluster slot).
    pub async fn send(&self, checks: &[&CheckCall]) -> Result<Vec<CheckReply>, Error> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.checks
            .fetch_add(checks.len() as u64, Ordering::Relaxed);
        self.times.batch(checks.len());
        let node = checks.first().map_or(0, |c| c.node);
        (self.timed(CallKind::Decide, node, |conn| self.decide(conn, checks))).await
    }

    /// Decides `checks` (all on window counters, or none: see `batch.rs`): by plain
    /// commands (`counter.rs`), or by the decision code.
    async fn decide(&self, conn: Conn, checks: &[&CheckCall]) -> Result<Vec<CheckReply>, Error> {
        if !checks.iter().any(|c| c.wire.counter.is_some()) {
            return split_reply(self.call(conn, checks).await?, checks);
        }
        if !checks.iter().all(|c| c.wire.counter.is_some()) {
            return Err(Error::Store(
                "a call mixing window counters and the decision code (a bug)".into(),
            ));
        }
        let (node, slot) = (checks[0].node, checks[0].slot);
        let now = match checks.iter().any(|c| c.now.is_none()) {
            true => self.redis_now(&conn, node, slot).await?,
            false => 0,
        };
        let atomic = matches!(conn, Conn::Cluster(_));
        let replies = send_counters(self, conn, checks, (now, atomic)).await?;
        self.times.path(3);
        Ok(replies)
    }

    /// Node `node`'s time (us since the epoch): its `TIME`, read again when due (see
    /// `redis_time.rs`), through `conn` to the master of `slot`.
    /// A failed read falls back on the last offset, if there is one.
    pub(super) async fn redis_now(
        &self,
        conn: &Conn,
        node: usize,
        slot: u16,
    ) -> Result<u64, Error> {
        let (last, due) = self.clocks.now(node);
        if !due {
            return Ok(last.unwrap_or_default());
        }
        let sent = self.clocks.local_us();
        let read = async {
            let answer = conn.clone().query_slot(redis::cmd("TIME"), slot).await?;
            super::redis_time::time_us(&answer)
                .ok_or_else(|| Error::Store(format!("TIME answered {answer:?}")))
        };
        match (read.await, last) {
            (Ok(redis_us), _) => {
                let received = self.clocks.local_us();
                Ok(self.clocks.learn(node, sent, received, redis_us))
            }
            (Err(_), Some(last)) => Ok(last),
            (Err(e), None) => Err(e),
        }
    }

    async fn call(&self, conn: Conn, checks: &[&CheckCall]) -> Result<Value, Error> {
        let nonce = nonce();
        let families = checks.iter().fold(0, |m, c| m | c.wire.families);
        let entry = if checks.iter().all(|c| c.op == CallOp::Peek) {
            Entry::ReadOnly
        } else if checks.len() == 1 && checks[0].op == CallOp::Try {
            Entry::Try
        } else if checks.len() == 1 && checks[0].op == CallOp::Charge {
            Entry::Charge
        } else {
            Entry::Batch
        };
        if let Some(answer) = self.module_call(&conn, checks, entry, &nonce).await {
            return answer;
        }
        self.invoke(conn, families, entry, &|cmd, form| match entry {
            Entry::Try | Entry::Charge => push_try(cmd, checks[0], &nonce, form),
            _ => push_call(cmd, checks, &nonce, form),
        })
        .await
    }

    /// Decides `checks` with the module when it takes them: `None` when they go to
    /// the Functions library or `EVALSHA` instead.
    pub(super) async fn module_call(
        &self,
        conn: &Conn,
        checks: &[&CheckCall],
        entry: Entry,
        nonce: &str,
    ) -> Option<Result<Value, Error>> {
        let wanted = matches!(self.opts.calls, RedisCalls::Auto | RedisCalls::Module);
        if !wanted || entry == Entry::Lease || checks.iter().any(|c| c.wire.module.is_none()) {
            return None;
        }
        let (node, slot) = (checks[0].node, checks[0].slot);
        if self.modules.state(node) == UNKNOWN {
            let answer = conn.clone().query_slot(probe(), slot).await;
            let failed = answer.as_ref().err().map(|e| Error::from(e.clone()));
            self.modules.found(node, &self.topology.name(node), answer);
            if let (UNKNOWN, Some(e)) = (self.modules.state(node), failed) {
                // No answer from the node: this call fails as any call to it would.
                return Some(Err(e));
            }
        }
        if self.modules.state(node) != LOADED {
            return self.absent(node);
        }
        let mut cmd = redis::cmd(match entry {
            Entry::Try => "TOLLGATE.TRY",
            Entry::Charge => "TOLLGATE.CHARGE",
            Entry::ReadOnly => "TOLLGATE.PEEK",
            Entry::Batch | Entry::Lease => "TOLLGATE.BATCH",
        });
        match entry {
            Entry::Try | Entry::Charge => push_try(&mut cmd, checks[0], nonce, Form::Module),
            _ => push_call(&mut cmd, checks, nonce, Form::Module),
        }
        match conn.clone().query_slot(cmd, slot).await {
            Err(e) if unknown_command(&e) => {
                self.modules.set(node, ABSENT);
                self.absent(node)
            }
            answer => {
                if answer.is_ok() {
                    self.times.path(0);
                }
                Some(answer.map_err(Error::from))
            }
        }
    }

    /// A node without the module: the call goes on to Functions, or with
    /// [`RedisCalls::Module`] fails.
    fn absent(&self, node: usize) -> Option<Result<Value, Error>> {
        (self.opts.calls == RedisCalls::Module).then(|| {
            Err(Error::Unsupported(format!(
                "redis node {} has not loaded the tollgate module (calls: module)",
                self.topology.name(node)
            )))
        })
    }

    /// One lease call (`lease.lua`) to node `node`, within the timeout; `push` appends
    /// its KEYS count, KEYS and ARGV after the function name or the EVALSHA form.
    pub async fn lease(
        &self,
        node: usize,
        families: u8,
        push: &(dyn Fn(&mut redis::Cmd, Form) + Sync),
    ) -> Result<Value, Error> {
        self.timed(CallKind::Lease, node, |conn| {
            self.invoke(conn, families, Entry::Lease, push)
        })
        .await
    }

    /// Sends a call to one entry point of the decision code, by `FCALL` or `EVALSHA`,
    /// loading the code when Redis lacks it and moving to `EVALSHA` for good when `Auto`
    /// finds no Functions.
    async fn invoke(
        &self,
        mut conn: Conn,
        families: u8,
        entry: Entry,
        push: &(dyn Fn(&mut redis::Cmd, Form) + Sync),
    ) -> Result<Value, Error> {
        let mut loaded = false;
        loop {
            let functions = self.mode.load(Ordering::Relaxed) == MODE_FUNCTIONS;
            let lib = library();
            let mut cmd = if functions {
                let (command, function) = match entry {
                    Entry::ReadOnly => ("FCALL_RO", &lib.function_ro),
                    Entry::Try => ("FCALL", &lib.function_try),
                    Entry::Charge => ("FCALL", &lib.function_charge),
                    Entry::Batch => ("FCALL", &lib.function),
                    Entry::Lease => ("FCALL", &lib.function_lease),
                };
                let mut cmd = redis::cmd(command);
                cmd.arg(function);
                cmd
            } else {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&eval_script(families).sha1);
                cmd
            };
            let form = match entry {
                Entry::Try => "t",
                Entry::Charge => "c",
                Entry::Lease => "l",
                Entry::Batch | Entry::ReadOnly => "b",
            };
            push(
                &mut cmd,
                if functions {
                    Form::Function
                } else {
                    Form::Eval(form)
                },
            );
            let err = match cmd.query_async::<Value>(&mut conn).await {
                Ok(v) => {
                    if entry != Entry::Lease {
                        self.times.path(if functions { 1 } else { 2 });
                    }
                    return Ok(v);
                }
                Err(e) => e,
            };
            let text = err.to_string().to_ascii_lowercase();
            if err.is_cluster_error() {
                // A slot being resharded answers TRYAGAIN to a call whose keys are split
                // between two nodes (and ASK/MOVED once the client's retries are spent):
                // try again until it settles, within the one timeout.
                tokio::time::sleep(Duration::from_millis(2)).await;
            } else if functions && text.contains("unknown command") && self.auto() {
                self.use_eval();
            } else if functions && text.contains("function not found") && !loaded {
                loaded = true;
                let load = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&lib.source)
                    .query_async::<Value>(&mut conn)
                    .await;
                match load {
                    Err(e)
                        if e.to_string().to_ascii_lowercase().contains("unknown")
                            && self.auto() =>
                    {
                        self.use_eval()
                    }
                    r => drop(r?),
                }
            } else if !functions
                && err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
                && !loaded
            {
                loaded = true;
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(&eval_script(families).source)
                    .query_async::<Value>(&mut conn)
                    .await?;
            } else {
                return Err(err.into());
            }
        }
    }

    fn auto(&self) -> bool {
        self.opts.calls == RedisCalls::Auto
    }

    pub(super) fn use_eval(&self) {
        tracing::info!("tollgate: this Redis has no Functions (Redis < 7): deciding with EVALSHA");
        self.mode.store(MODE_EVAL, Ordering::Relaxed);
    }
}

/// Sends `checks` (all on window counters, see `counter.rs`) as one pipeline, and
/// makes each reply what the decision driver would have answered.
/// A check without a time of its own decides at `now` (the node's clock). `atomic`
/// (a Cluster): one `MULTI`/`EXEC`, because the Cluster client sends a pipeline again
/// whole when a command of it is redirected (a slot being moved), which would count
/// the commands already run a second time; a transaction that meets a redirection
/// runs nothing, so sending it again is safe. A count of a key known to have its
/// time to live (`Caller::expiring`) sends no `PEXPIRE` (see [`Unexpired`]).
async fn send_counters(
    caller: &Caller,
    mut conn: Conn,
    checks: &[&CheckCall],
    (now, atomic): (u64, bool),
) -> Result<Vec<CheckReply>, Error> {
    let mut pipe = redis::pipe();
    if atomic {
        pipe.atomic();
    }
    let parts: Vec<_> = checks.iter().map(|c| counter_part(c, now)).collect();
    let keys: Vec<String> = (checks.iter().zip(&parts))
        .map(|(c, &(counter, _, now))| counter.key(&c.keys[0], now))
        .collect();
    let known = caller.expiring.known(&keys, now);
    let mut unexpired = Unexpired {
        caller,
        conn: conn.clone(),
        keys: Vec::new(),
        answered: false,
    };
    for ((c, &(counter, change, now)), (key, &known)) in
        checks.iter().zip(&parts).zip(keys.iter().zip(&known))
    {
        counter.push(&mut pipe, key, (change, c.cost, now), !known);
        if known && change.increments(c.cost) {
            unexpired.keys.push((key.clone(), *counter, now));
        }
    }
    let values: Vec<Value> = loop {
        match pipe.query_async(&mut conn).await {
            // A slot being moved: nothing of the transaction ran; again until it
            // settles, within the call's one timeout (as the scripts' calls do).
            Err(e)
                if atomic
                    && (e.is_cluster_error()
                        || e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::ExecAbort)) =>
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            r => break r?,
        }
    };
    if values.len() != checks.len() {
        return Err(Error::Store(format!(
            "window counters: {} replies to {} checks",
            values.len(),
            checks.len()
        )));
    }
    let mut made_again = Vec::new();
    let replies = (checks.iter().zip(parts).zip(values))
        .zip(keys.into_iter().zip(known))
        .map(|(((c, (counter, change, now)), v), (key, known))| {
            let (admitted, before, state) = counter.reply(change, c.cost, now, v)?;
            if change.increments(c.cost) {
                match known {
                    // It sent its PEXPIRE.
                    false => caller.expiring.learn(key, counter.end(now), now),
                    // Nothing counted before a count that sent no PEXPIRE: the key
                    // was made again (deleted, evicted) and has no time to live yet.
                    true if before == 0 => made_again.push((key, *counter, now)),
                    true => {}
                }
            }
            Ok(CheckReply {
                now,
                admitted,
                states: vec![state],
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    unexpired.keys = made_again;
    unexpired.answered = true;
    Ok(replies)
}

/// The keys of one window-counter call whose counts sent no `PEXPIRE`, each with its
/// counter and time. When the call ends, those the answers show were made again get
/// their `PEXPIRE` from a task of their own; and if it ends without its answers read
/// (an error, the timeout), every one of them does (a lost answer may hide a key made
/// again), and the store forgets every key it knew to have its time to live (a
/// failover or a restart may have lost a `PEXPIRE` Redis had answered), so that
/// their next counts send it again.
struct Unexpired<'a> {
    caller: &'a Caller,
    conn: Conn,
    keys: Vec<(String, WindowCounter, u64)>,
    answered: bool,
}

impl Drop for Unexpired<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.caller.expiring.clear();
        }
        if !self.keys.is_empty() {
            let keys = std::mem::take(&mut self.keys);
            self.caller.spawn(expire(self.conn.clone(), keys));
        }
    }
}

/// Sends the `PEXPIRE` of each of `keys` (a window counter's key, its counter and the
/// time it was counted at), again every 100 ms until Redis answers, for as long as
/// the longest of their times to live.
async fn expire(mut conn: Conn, keys: Vec<(String, WindowCounter, u64)>) {
    let mut pipe = redis::pipe();
    let mut longest = 0;
    for (key, counter, now) in &keys {
        counter.push_expire(&mut pipe, key, *now);
        longest = longest.max(counter.ttl_ms(*now));
    }
    let until = tokio::time::Instant::now() + Duration::from_millis(longest);
    loop {
        let sent = tokio::time::timeout(Duration::from_secs(1), pipe.query_async::<()>(&mut conn));
        let e = match sent.await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 1 s".to_string(),
        };
        if tokio::time::Instant::now() >= until {
            tracing::warn!(error = %e, keys = keys.len(), "window counters: keys made again may keep no time to live (PEXPIRE failed until their windows ended)");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A window counter's check: its counter, what it does, and its time (its own, else
/// `now`).
fn counter_part(c: &CheckCall, now: u64) -> (&WindowCounter, Change, u64) {
    let counter = c.wire.counter.as_ref().expect("a window counter's check");
    let change = match c.op {
        CallOp::Charge => Change::Add,
        CallOp::Try => Change::Try,
        CallOp::Refund => Change::Refund,
        // Acquire is refused before a call is made (`RedisLimiter::check_rules`).
        CallOp::Peek | CallOp::Acquire => Change::Read,
    };
    (counter, change, c.now.unwrap_or(now))
}
