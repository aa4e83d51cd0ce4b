//! Quota buckets in Redis (the ledger `QuotaLedger::redis` keeps): each bucket's state
//! in one key, changed by one server at a time (`crates/tollgate/lua/quota.lua`: load,
//! apply with the core, store if nobody stored in between, else apply again to the
//! newer state). Time is Redis' `TIME`, so servers with skewed clocks agree.

use std::sync::LazyLock;

use redis::{Script, Value};
use tollgate_core::quota::{Budget, QuotaBucket, QuotaSettings};
use tollgate_core::{Clock, MonotonicClock};

use super::health::{Guarded, NodeHealth, RedisStats};
use super::RedisStore;
use crate::Error;

static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/quota.lua")));

/// How many times a change is applied again to a state another server stored first
/// before the update gives up (as [`Error::Unavailable`]: the bucket is too busy).
const MAX_ATTEMPTS: usize = 32;

/// A bucket as the script answers: whether it stored, Redis' time, the version, and
/// the state (none for a new bucket, or after a store).
struct Reply {
    stored: bool,
    now: u64,
    version: i64,
    state: Option<Vec<u8>>,
}

/// The buckets in Redis, with the health of each node: while the node that holds a
/// bucket fails, its updates fail at once (one per probe interval asks again), and
/// the other nodes' buckets do not wait behind them.
pub(crate) struct RedisLedger {
    store: RedisStore,
    clock: MonotonicClock,
    health: NodeHealth,
}

impl RedisLedger {
    pub fn new(store: RedisStore) -> RedisLedger {
        RedisLedger {
            health: NodeHealth::new("quota", std::time::Duration::from_millis(500), &store),
            store,
            clock: MonotonicClock::new(),
        }
    }

    /// The counters per node (decisions: updates answered).
    pub fn node_stats(&self) -> Vec<(std::sync::Arc<str>, RedisStats)> {
        self.health.by_node(&self.store)
    }

    /// Applies `f` to bucket `name` at Redis' time, as `QuotaLedger::update` says;
    /// also returns how long ago (on `clock`) the call that read that time was sent.
    pub async fn update<R>(
        &self,
        name: &str,
        budget: Budget,
        settings: QuotaSettings,
        f: impl FnMut(&mut QuotaBucket, u64) -> R,
    ) -> Result<(R, u64), Error> {
        let keys = self.store.keys("quota", name, &[String::new()]);
        let (_, node) = self.store.place(&keys[0]);
        let policy = &"the caller's (the update fails)";
        let update = update(&self.store, &self.clock, &keys, name, budget, settings, f);
        match self.health.call(node, policy, update).await? {
            Guarded::Answered(r) => Ok(r),
            Guarded::Failing(_, Some(e)) => {
                self.store.call_failed();
                Err(e)
            }
            Guarded::Failing(_, None) => Err(Error::Unavailable(format!(
                "quota bucket {name:?}: its Redis node {} is failing (asked again within 500 ms)",
                self.store.node_name(node)
            ))),
        }
    }
}

async fn update<R>(
    store: &RedisStore,
    clock: &MonotonicClock,
    keys: &[String],
    name: &str,
    budget: Budget,
    settings: QuotaSettings,
    mut f: impl FnMut(&mut QuotaBucket, u64) -> R,
) -> Result<(R, u64), Error> {
    let mut sent = clock.now_us();
    let mut reply = call(store, keys, &[b"load".as_slice()]).await?;
    for _ in 0..MAX_ATTEMPTS {
        let now = reply.now;
        let mut bucket = match &reply.state {
            Some(bytes) => QuotaBucket::decode(budget, settings, bytes)
                .map_err(|e| Error::Store(format!("quota bucket {name:?}: {e}")))?,
            None => QuotaBucket::new(budget, settings, now),
        };
        let r = f(&mut bucket, now);
        let state = if bucket.is_idle(now) {
            Vec::new()
        } else {
            bucket.encode()
        };
        // Unchanged that long, it would be idle anyway (with a second to spare).
        let ttl_ms = bucket.forgettable_after() / 1000 + 1000;
        let version = reply.version.to_string();
        let ttl = ttl_ms.to_string();
        let args = [
            b"store".as_slice(),
            version.as_bytes(),
            &state,
            ttl.as_bytes(),
        ];
        let read = sent;
        sent = clock.now_us();
        reply = call(store, keys, &args).await?;
        if reply.stored {
            return Ok((r, clock.now_us().saturating_sub(read)));
        }
    }
    Err(Error::Unavailable(format!(
        "quota bucket {name:?}: changed by other servers {MAX_ATTEMPTS} times in a row"
    )))
}

async fn call(store: &RedisStore, keys: &[String], args: &[&[u8]]) -> Result<Reply, Error> {
    let value = store.eval(&SCRIPT, keys, args).await?;
    let bad = || Error::Store(format!("quota script reply: {value:?}"));
    let Value::Array(items) = &value else {
        return Err(bad());
    };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        _ => Err(bad()),
    };
    let state = match items.get(3) {
        Some(Value::BulkString(b)) => Some(b.clone()),
        Some(Value::Nil) => None,
        _ => return Err(bad()),
    };
    Ok(Reply {
        stored: int(0)? == 1,
        now: u64::try_from(int(1)?).map_err(|_| bad())?,
        version: int(2)?,
        state,
    })
}
