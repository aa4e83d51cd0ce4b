//! Quota buckets: one budget divided among clients that enforce their shares
//! themselves (the Envoys of a fleet, under Envoy's rate limit quota service). The
//! division and its ledger are the pure core's ([`QuotaBucket`], re-exported here);
//! [`QuotaLedger`] keeps the buckets in this process or in Redis, where several
//! servers share them.

pub use tollgate_core::quota::*;

use std::collections::HashMap;
use std::sync::Mutex;

use tollgate_core::{Clock, MonotonicClock};

use crate::Error;

/// Where quota buckets are kept: in this process, or in Redis for several servers
/// (each Envoy of a fleet may stream to any of them; the budget is one).
///
/// Every change is [`Self::update`]: a bucket's state as it stands, changed by the
/// core and kept, atomically — in Redis, applied again to the newer state when
/// another server changed the bucket in between, so the servers' changes are
/// applied one after another, as on one server.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// use tollgate::quota::{Budget, QuotaLedger, QuotaSettings, Usage};
///
/// let ledger = QuotaLedger::memory();
/// let budget = Budget::of(&"token-bucket:rate=1000/s,capacity=100".parse()?)
///     .map_err(tollgate::Error::Unsupported)?;
/// let usage = Usage { allowed: 0, denied: 0, elapsed_us: 0 };
/// // Envoy 7 (of server 0) subscribes: it is sent a share at once.
/// let sent = ledger
///     .update("api", budget, QuotaSettings::default(), |b, now| b.report(7, 0, usage, now))
///     .await?;
/// assert_eq!(sent.value[0].client, 7);
/// # Ok::<_, tollgate::Error>(()) }).unwrap();
/// ```
pub struct QuotaLedger {
    kept: Kept,
}

enum Kept {
    Memory {
        buckets: Mutex<HashMap<String, QuotaBucket>>,
        clock: MonotonicClock,
    },
    #[cfg(feature = "redis")]
    Redis(crate::redis::quota::RedisLedger),
}

/// What [`QuotaLedger::update`] returns: what the change returned, and how long ago
/// (in this process) the ledger's time it decided at was read. An assignment must
/// reach its client within the bucket's `grace_us` of that time; the caller drops
/// what it could not send in time (the ledger counts it all the same: dropping is
/// safe, sending late is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Updated<R> {
    /// What the change returned.
    pub value: R,
    /// Microseconds since the ledger's time was read (0 in memory: read under the
    /// bucket's lock just now).
    pub age_us: u64,
}

impl std::fmt::Debug for QuotaLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.kept {
            Kept::Memory { .. } => "QuotaLedger::Memory",
            #[cfg(feature = "redis")]
            Kept::Redis(_) => "QuotaLedger::Redis",
        })
    }
}

impl QuotaLedger {
    /// Buckets kept in this process (one server alone divides each budget).
    pub fn memory() -> Self {
        QuotaLedger {
            kept: Kept::Memory {
                buckets: Mutex::default(),
                clock: MonotonicClock::new(),
            },
        }
    }

    /// Buckets kept in Redis (or a Redis Cluster: one bucket, one slot), shared by
    /// every server on it; time is Redis' `TIME`.
    #[cfg(feature = "redis")]
    pub fn redis(store: crate::redis::RedisStore) -> Self {
        QuotaLedger {
            kept: Kept::Redis(crate::redis::quota::RedisLedger::new(store)),
        }
    }

    /// Forgets bucket `name` in this process (its division is no longer wanted, e.g.
    /// its rule changed). In Redis, where other servers may still use it, it is
    /// forgotten by itself once nobody changed it for its time to live.
    pub fn forget(&self, name: &str) {
        match &self.kept {
            Kept::Memory { buckets, .. } => {
                let mut buckets = buckets.lock().unwrap_or_else(|e| e.into_inner());
                buckets.remove(name);
            }
            #[cfg(feature = "redis")]
            Kept::Redis(_) => {}
        }
    }

    /// Forgets, in this process, every bucket that may be forgotten
    /// ([`QuotaBucket::is_idle`]): those nobody updates any more. In Redis, keys
    /// expire by themselves.
    pub fn sweep(&self) {
        match &self.kept {
            Kept::Memory { buckets, clock } => {
                let now = clock.now_us();
                let mut buckets = buckets.lock().unwrap_or_else(|e| e.into_inner());
                buckets.retain(|_, b| !b.is_idle(now));
            }
            #[cfg(feature = "redis")]
            Kept::Redis(_) => {}
        }
    }

    /// Its calls to Redis by node (`host:port`): updates answered, failed, and the
    /// failing/healthy transitions; nothing in memory. While a node fails, updates
    /// of its buckets fail at once (one per 500 ms asks it again).
    #[cfg(feature = "redis")]
    pub fn node_stats(&self) -> Vec<(std::sync::Arc<str>, crate::redis::RedisStats)> {
        match &self.kept {
            Kept::Memory { .. } => Vec::new(),
            Kept::Redis(ledger) => ledger.node_stats(),
        }
    }

    /// Applies `f` to bucket `name` at the ledger's time (microseconds, passed to
    /// `f`), the bucket created dividing `budget` when nobody holds it; returns what
    /// `f` returns, and how old the time it decided at is. A bucket that may be
    /// forgotten ([`QuotaBucket::is_idle`]) is.
    ///
    /// `f` may run more than once (in Redis, once more each time another server
    /// changed the bucket first): only its last result counts, so it must not act
    /// on the bucket's answers itself — send the assignments it returns once this
    /// returns.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when Redis does not answer in time, or the bucket was
    /// changed by others too often in a row; [`Error::Store`] for a state this
    /// version cannot read.
    pub async fn update<R>(
        &self,
        name: &str,
        budget: Budget,
        settings: QuotaSettings,
        mut f: impl FnMut(&mut QuotaBucket, u64) -> R,
    ) -> Result<Updated<R>, Error> {
        match &self.kept {
            Kept::Memory { buckets, clock } => {
                let mut buckets = buckets.lock().unwrap_or_else(|e| e.into_inner());
                // Read under the lock: time spent waiting for it must not eat the grace.
                let now = clock.now_us();
                let bucket = buckets
                    .entry(name.to_string())
                    .or_insert_with(|| QuotaBucket::new(budget, settings, now));
                let value = f(bucket, now);
                if bucket.is_idle(now) {
                    buckets.remove(name);
                }
                Ok(Updated { value, age_us: 0 })
            }
            #[cfg(feature = "redis")]
            Kept::Redis(ledger) => {
                let (value, age_us) = ledger.update(name, budget, settings, f).await?;
                Ok(Updated { value, age_us })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(ledger: &QuotaLedger) -> usize {
        match &ledger.kept {
            Kept::Memory { buckets, .. } => buckets.lock().unwrap().len(),
            #[cfg(feature = "redis")]
            Kept::Redis(_) => unreachable!(),
        }
    }

    #[tokio::test]
    async fn a_bucket_nobody_updates_is_swept_once_idle_not_before() {
        let ledger = QuotaLedger::memory();
        let budget = Budget::of(&"gcra:rate=1000/s,burst=2".parse().unwrap()).unwrap();
        let settings = QuotaSettings {
            ttl_us: 200_000,
            grace_us: 0,
            stale_us: 200_000,
            ..QuotaSettings::default()
        };
        let report = |b: &mut QuotaBucket, now| {
            b.report(1, 0, Usage::default(), now);
            b.leave(1, now);
        };
        ledger.update("b", budget, settings, report).await.unwrap();
        ledger.sweep();
        // Its share is still in force.
        assert_eq!(kept(&ledger), 1);
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        ledger.sweep();
        assert_eq!(kept(&ledger), 0);
    }
}
