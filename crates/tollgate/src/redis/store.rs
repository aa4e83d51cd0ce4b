//! [`RedisStore`]: a connection (single node or Cluster), how decisions are sent on it
//! (Redis Functions or `EVALSHA`, batched or not), and the decision itself.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use tollgate_core::{Op, PolicyState, RuleDecision, RuleSet};

use super::batch::Batcher;
use super::call::{push_call, push_try, split_reply, CallOp, CheckCall, CheckReply};
use super::script::{eval_script, library, parse_state};
use super::StoreError;

/// How a [`RedisStore`] talks to Redis.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// The longest a decision may take (connect, send, answer); past it the call
    /// fails with [`StoreError::Timeout`]. Default 250 ms.
    pub timeout: Duration,
    /// Added to each key's time to live, which is otherwise the time until its state
    /// is fully replenished. Default 1 s.
    pub ttl_margin: Duration,
    /// Prefix of every key (default `tollgate`); must not contain `{` or `}`.
    pub prefix: String,
    /// How the decision code is called. Default [`RedisCalls::Auto`].
    pub calls: RedisCalls,
    /// The most checks decided by one call (automatic batching; see
    /// [`RedisStore`]). 1 sends each check as its own call. Default 64.
    pub batch: usize,
    /// With batching, how many batched calls may be outstanding at once on the
    /// connection; checks arriving meanwhile wait for the next call. Default 2.
    pub in_flight: usize,
    /// With batching, a check that finds no other waiting is sent at once from its own
    /// task (no hand-off to the batching task) while fewer than this many such calls
    /// are out; past that, checks queue and ride batches. 0 queues every check.
    /// Default 8.
    pub direct_calls: usize,
}

/// Counters of a [`RedisStore`]'s decision calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Calls sent (`FCALL` or `EVALSHA`), including failed ones.
    pub calls: u64,
    /// Checks (try, acquire, peek, refund) those calls carried.
    pub checks: u64,
}

/// How a [`RedisStore`] calls its decision code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RedisCalls {
    /// Redis Functions where the server has them (Redis >= 7), `EVALSHA` otherwise.
    #[default]
    Auto,
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
        }
    }
}

#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Either connection, so that every command and the script are sent one way.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

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
/// followed).
#[derive(Clone)]
pub struct RedisStore {
    caller: Arc<Caller>,
    batcher: Option<Arc<Batcher>>,
    url: Arc<str>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("opts", &self.caller.opts)
            .finish()
    }
}

/// The entry points of the decision code (`functions.lua`, `eval.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Try,
    Batch,
    ReadOnly,
    Lease,
}

const MODE_FUNCTIONS: u8 = 0;
const MODE_EVAL: u8 = 1;

/// The connection and how decision calls are sent on it (shared with the batching task).
pub(crate) struct Caller {
    conn: Conn,
    opts: RedisOptions,
    /// `MODE_FUNCTIONS` or `MODE_EVAL`; `Auto` starts with Functions and moves to
    /// `EVALSHA` for good when the server does not know `FCALL`.
    mode: AtomicU8,
    /// Decision calls sent and checks they carried (batching's effect).
    calls: AtomicU64,
    checks: AtomicU64,
}

impl Caller {
    /// Runs `call` on a clone of the connection, bounded by the timeout.
    async fn timed<T, F>(&self, call: impl FnOnce(Conn) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = Result<T, StoreError>>,
    {
        tokio::time::timeout(self.opts.timeout, call(self.conn.clone()))
            .await
            .map_err(|_| StoreError::Timeout(self.opts.timeout))?
    }

    /// One call of the decision driver for `checks` (all in one Cluster slot).
    pub async fn send(&self, checks: &[&CheckCall]) -> Result<Vec<CheckReply>, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.checks
            .fetch_add(checks.len() as u64, Ordering::Relaxed);
        let value = self.timed(|conn| self.call(conn, checks)).await?;
        split_reply(value, checks)
    }

    async fn call(&self, conn: Conn, checks: &[&CheckCall]) -> Result<Value, StoreError> {
        let nonce = nonce();
        let families = checks.iter().fold(0, |m, c| m | c.wire.families);
        let entry = if checks.iter().all(|c| c.op == CallOp::Peek) {
            Entry::ReadOnly
        } else if checks.len() == 1 && checks[0].op == CallOp::Try {
            Entry::Try
        } else {
            Entry::Batch
        };
        self.invoke(conn, families, entry, &|cmd, form| match entry {
            Entry::Try => push_try(cmd, checks[0], &nonce, form),
            _ => push_call(cmd, checks, &nonce, form),
        })
        .await
    }

    /// One lease call (`lease.lua`), within the timeout; `push` appends its KEYS count,
    /// KEYS and ARGV after the function name or the EVALSHA form.
    pub async fn lease(
        &self,
        families: u8,
        push: &(dyn Fn(&mut redis::Cmd, Option<&str>) + Sync),
    ) -> Result<Value, StoreError> {
        self.timed(|conn| self.invoke(conn, families, Entry::Lease, push))
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
        push: &(dyn Fn(&mut redis::Cmd, Option<&str>) + Sync),
    ) -> Result<Value, StoreError> {
        let mut loaded = false;
        loop {
            let functions = self.mode.load(Ordering::Relaxed) == MODE_FUNCTIONS;
            let lib = library();
            let mut cmd = if functions {
                let (command, function) = match entry {
                    Entry::ReadOnly => ("FCALL_RO", &lib.function_ro),
                    Entry::Try => ("FCALL", &lib.function_try),
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
                Entry::Lease => "l",
                Entry::Batch | Entry::ReadOnly => "b",
            };
            push(&mut cmd, (!functions).then_some(form));
            let err = match cmd.query_async::<Value>(&mut conn).await {
                Ok(v) => return Ok(v),
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

    fn use_eval(&self) {
        tracing::info!("tollgate: this Redis has no Functions (Redis < 7): deciding with EVALSHA");
        self.mode.store(MODE_EVAL, Ordering::Relaxed);
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
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::connect_with(url, RedisOptions::default()).await
    }

    /// Connects to `url`. A single node is connected lazily (so a service can start
    /// while Redis is down, and reconnects by itself); a Cluster needs one reachable
    /// node now to learn the slot map.
    pub async fn connect_with(url: &str, opts: RedisOptions) -> Result<RedisStore, StoreError> {
        if opts.prefix.contains(['{', '}']) {
            return Err(StoreError::Config(format!(
                "key prefix {:?} must not contain '{{' or '}}' (they would move the hash tag)",
                opts.prefix
            )));
        }
        let conn = if let Some(nodes) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = nodes
                .trim_end_matches('/')
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(StoreError::Config(format!(
                    "{url}: expected redis+cluster://host:port[,host:port...]"
                )));
            }
            let client = redis::cluster::ClusterClientBuilder::new(nodes)
                .connection_timeout(opts.timeout)
                .response_timeout(opts.timeout)
                .retries(2)
                .build()
                .map_err(|e| StoreError::Config(format!("{url}: {e}")))?;
            let conn = tokio::time::timeout(opts.timeout * 4, client.get_async_connection())
                .await
                .map_err(|_| StoreError::Timeout(opts.timeout * 4))??;
            Conn::Cluster(conn)
        } else {
            let client =
                redis::Client::open(url).map_err(|e| StoreError::Config(format!("{url}: {e}")))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(opts.timeout))
                .set_response_timeout(Some(opts.timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(100));
            Conn::Single(ConnectionManager::new_lazy_with_config(client, config)?)
        };
        let cluster = matches!(conn, Conn::Cluster(_));
        let mode = match opts.calls {
            RedisCalls::Eval => MODE_EVAL,
            RedisCalls::Auto | RedisCalls::Functions => MODE_FUNCTIONS,
        };
        let (batch, in_flight, direct) = (opts.batch, opts.in_flight, opts.direct_calls);
        let caller = Arc::new(Caller {
            conn,
            opts,
            mode: AtomicU8::new(mode),
            calls: AtomicU64::new(0),
            checks: AtomicU64::new(0),
        });
        let batcher = (batch > 1).then(|| {
            Arc::new(Batcher::start(
                caller.clone(),
                batch,
                in_flight,
                direct,
                cluster,
            ))
        });
        Ok(RedisStore {
            caller,
            batcher,
            url: url.into(),
        })
    }

    /// The options.
    pub fn options(&self) -> &RedisOptions {
        &self.caller.opts
    }

    /// Whether decisions are sent by `EVALSHA` (configured, or `Auto` found a Redis
    /// without Functions) rather than `FCALL`.
    pub fn uses_eval(&self) -> bool {
        self.caller.mode.load(Ordering::Relaxed) == MODE_EVAL
    }

    /// The connection and call machinery (for the lease client).
    pub(crate) fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Decision calls sent so far, and the checks they carried (more checks than
    /// calls: batching at work).
    pub fn call_stats(&self) -> CallStats {
        CallStats {
            calls: self.caller.calls.load(Ordering::Relaxed),
            checks: self.caller.checks.load(Ordering::Relaxed),
        }
    }

    /// Runs `call` on a clone of the connection, bounded by the timeout.
    async fn timed<T, F>(&self, call: impl FnOnce(Conn) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        (self.caller)
            .timed(|c| async move { call(c).await.map_err(StoreError::from) })
            .await
    }

    /// Whether Redis answers a `PING` within the timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let cmd = redis::cmd("PING");
        self.timed(|mut c| async move { cmd.query_async::<String>(&mut c).await })
            .await?;
        Ok(())
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

    /// One check by the decision driver, batched with others when batching is on.
    pub(crate) async fn call(
        &self,
        check: CheckCall,
        rules: &RuleSet,
    ) -> Result<Reply, StoreError> {
        let created = check.created;
        let reply = match &self.batcher {
            Some(b) => {
                let timeout = self.caller.opts.timeout;
                tokio::time::timeout(timeout, b.submit(check))
                    .await
                    .map_err(|_| StoreError::Timeout(timeout))??
            }
            None => self.caller.send(&[&check]).await?.remove(0),
        };
        let created = created.unwrap_or(reply.now);
        let bad = |what: &str| StoreError::Protocol(format!("script reply: {what}"));
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
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[String],
        args: &[String],
    ) -> Result<Value, StoreError> {
        let mut inv = script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let inv = &inv;
        // A slot being resharded answers TRYAGAIN to a script whose keys are split
        // between the two nodes (and ASK/MOVED once the client's retries are spent):
        // try again until it settles, within the one timeout.
        self.timed(|mut c| async move {
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

    /// Deletes `keys`.
    pub(crate) async fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("DEL");
        for k in keys {
            cmd.arg(k);
        }
        self.timed(|mut c| async move { cmd.query_async::<i64>(&mut c).await })
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
    ) -> Result<RuleDecision, StoreError> {
        check.wire.check_cost(rules, check.cost)?;
        let cost = check.cost;
        let mut reply = self.call(check, rules).await?;
        // The script applied its verdict; the core derives the numbers from the
        // states it started from, with the same code as the memory store.
        let d = rules.check(&mut reply.states, reply.now, cost, op)?;
        if d.decision.allowed != reply.admitted {
            tracing::error!(
                key,
                script = reply.admitted,
                core = d.decision.allowed,
                "tollgate: the Redis script and the core disagree; the script's verdict stands"
            );
            return Err(StoreError::Protocol(format!(
                "script and core disagree on key {key:?} (script admitted: {})",
                reply.admitted
            )));
        }
        Ok(d)
    }
}

/// 64-bit FNV-1a: a hash tag for keys that cannot be their own (stable across
/// processes, unlike the std hasher).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// A nonce unique to this call: sliding-log members never collide, even for two
/// callers admitted at the same microsecond.
pub(crate) fn nonce() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let process = *PROCESS.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // A per-process random seed (std's RandomState) mixed with the process id.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{process:x}-{n:x}")
}
