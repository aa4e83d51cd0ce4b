//! [`RedisStore`]: a connection (single node or Cluster) and the decision script.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Script, Value};
use tollgate_core::{Op, PolicyState, RuleDecision, RuleSet};

use super::script::{parse_state, Wire, SCRIPT};
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
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            timeout: Duration::from_millis(250),
            ttl_margin: Duration::from_secs(1),
            prefix: "tollgate".into(),
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

/// A connection to Redis (one node, or a Cluster) that decides requests with one
/// atomic script call each.
///
/// Cheap to clone: clones share the connection. Calls from concurrent tasks go out
/// together on it (the client pipelines them), so a few connections carry many callers.
/// The script is sent by `EVALSHA` and loaded again when Redis answers `NOSCRIPT`
/// (after a restart or a `SCRIPT FLUSH`).
///
/// URLs: `redis://host:port/db` for one node; `redis+cluster://host:port,host:port`
/// for a Cluster (any reachable nodes; the rest are discovered, `MOVED` and `ASK` are
/// followed).
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    script: Arc<Script>,
    opts: Arc<RedisOptions>,
    url: Arc<str>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("opts", &self.opts)
            .finish()
    }
}

/// What one script call answered: Redis's time, the verdict the script applied, and
/// each policy's state before the call.
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
        Ok(RedisStore {
            conn,
            script: Arc::new(Script::new(SCRIPT)),
            opts: Arc::new(opts),
            url: url.into(),
        })
    }

    /// The options.
    pub fn options(&self) -> &RedisOptions {
        &self.opts
    }

    /// Runs `call` on a clone of the connection, bounded by the timeout.
    async fn timed<T, F>(&self, call: impl FnOnce(Conn) -> F) -> Result<T, StoreError>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        tokio::time::timeout(self.opts.timeout, call(self.conn.clone()))
            .await
            .map_err(|_| StoreError::Timeout(self.opts.timeout))?
            .map_err(StoreError::from)
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
            format!("{}:{name}:{{#{:016x}}}{key}", self.opts.prefix, fnv1a(key))
        } else {
            format!("{}:{name}:{{{key}}}", self.opts.prefix)
        };
        suffixes.iter().map(|s| format!("{base}{s}")).collect()
    }

    /// One script call. `now`: `None` takes Redis's `TIME`; `created`: when a key
    /// without state was created (`None`: now).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn call(
        &self,
        op: &str,
        keys: &[String],
        rules: &RuleSet,
        wire: &Wire,
        now: Option<u64>,
        created: Option<u64>,
        cost: u64,
        acquire: bool,
    ) -> Result<Reply, StoreError> {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let mut args = vec![
            op.to_owned(),
            opt(now),
            opt(created),
            cost.to_string(),
            if acquire { "1" } else { "0" }.to_owned(),
            self.opts.ttl_margin.as_millis().to_string(),
            nonce(),
        ];
        args.extend(wire.args.iter().cloned());
        let value = self.eval(&self.script, keys, &args).await?;
        parse_reply(value, rules, created)
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

    /// Decides a request against `rules` for `key` atomically in Redis.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn decide(
        &self,
        name: &str,
        key: &str,
        rules: &RuleSet,
        wire: &Wire,
        now: Option<u64>,
        created: Option<u64>,
        cost: u64,
        op: Op,
    ) -> Result<RuleDecision, StoreError> {
        wire.check_cost(rules, cost)?;
        let keys = self.keys(name, key, &wire.suffixes);
        let acquire = op == Op::Acquire;
        let mut reply = self
            .call("check", &keys, rules, wire, now, created, cost, acquire)
            .await?;
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

fn parse_reply(value: Value, rules: &RuleSet, created: Option<u64>) -> Result<Reply, StoreError> {
    let bad = |what: &str| StoreError::Protocol(format!("script reply: {what}"));
    let Value::Array(items) = value else {
        return Err(bad("not an array"));
    };
    let int = |v: &Value| match v {
        Value::Int(i) => Ok(*i),
        _ => Err(bad("expected an integer")),
    };
    if items.len() != rules.policies().len() + 2 {
        return Err(bad("wrong number of states"));
    }
    let now = u64::try_from(int(&items[0])?).map_err(|_| bad("negative time"))?;
    let admitted = int(&items[1])? == 1;
    let created = created.unwrap_or(now);
    let states = rules
        .policies()
        .iter()
        .zip(&items[2..])
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
        now,
        admitted,
        states,
    })
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
