//! [`RedisConcurrencyLimiter`]: at most `limit` permits held at once per key across
//! every instance, as leases that come back by themselves when their holder dies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{Script, Value};
use tollgate_core::{AnyAlgorithm, Clock, RuleSet};

use super::call::nonce;
use super::health::{Event, Health, NodeHealth, OnError, RedisStats};
use super::store::RedisStore;
use crate::concurrency::{ConcurrencyError, KeyedConcurrencyLimiter, KeyedConcurrencyPermit};
use crate::Error;

static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/concurrency.lua")));

/// Options of a [`RedisConcurrencyLimiter`].
#[derive(Debug, Clone)]
pub struct RedisConcurrencyOptions {
    /// How long permits outlive their holder's last renewal: a live permit renews its
    /// lease every third of this, so a holder that dies (or stalls for longer) loses
    /// its permits at most this long after its last renewal. Default 10 s.
    pub lease: Duration,
    /// How often a queued [`acquire`](RedisConcurrencyLimiter::acquire) asks Redis
    /// again (and so how long after a release the next waiter notices at most).
    /// Default 20 ms.
    pub poll_interval: Duration,
    /// The failure policy. `Local` takes a rule set of one `concurrency` policy: this
    /// instance's share (permits granted locally are not counted in Redis).
    pub on_error: OnError,
    /// While Redis is failing, how often one call tries it again. Default 500 ms.
    pub probe_interval: Duration,
}

impl Default for RedisConcurrencyOptions {
    fn default() -> Self {
        RedisConcurrencyOptions {
            lease: Duration::from_secs(10),
            poll_interval: Duration::from_millis(20),
            on_error: OnError::Error,
            probe_interval: Duration::from_millis(500),
        }
    }
}

pub use crate::concurrency::PermitError;

struct Inner {
    store: RedisStore,
    /// Health per Redis node: a failing Cluster node's keys take the failure policy,
    /// no other.
    health: NodeHealth,
    limit: u32,
    opts: RedisConcurrencyOptions,
    local: Option<KeyedConcurrencyLimiter<String>>,
    /// Wakes this instance's waiters when one of its permits is released (waiters of
    /// other instances notice at their next poll).
    released: tokio::sync::Notify,
}

/// Per-key concurrency limits shared through Redis: at most `limit` permits held at
/// once per key by every instance that uses the same Redis and limiter name.
///
/// Permits are **leases** (`crates/tollgate/lua/concurrency.lua`): a held
/// [`RedisPermit`] renews its lease from a background task and releases it when
/// dropped; if the holder's process dies, its permits come back when the lease
/// expires ([`RedisConcurrencyOptions::lease`], 10 s by default).
///
/// **Fairness**: waiters of one key are served first come, first served across all
/// instances (a queue in Redis, in arrival order); a waiter asking for many permits
/// holds back smaller requests behind it, and `try_acquire` fails while anyone waits.
/// Waiters poll every [`poll_interval`](RedisConcurrencyOptions::poll_interval); one
/// that stops polling (its process died) leaves the queue after a few intervals.
///
/// ```no_run
/// # async fn demo() -> Result<(), tollgate::redis::PermitError> {
/// use std::time::Duration;
/// use tollgate::redis::{RedisConcurrencyLimiter, RedisStore};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let limiter = RedisConcurrencyLimiter::new(store, "exports", 4)?;
/// let permit = limiter.acquire("tenant-7", 1, Duration::from_secs(2)).await?;
/// // ... the work: at most 4 at once for tenant-7, across every instance ...
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConcurrencyLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisConcurrencyLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConcurrencyLimiter")
            .field("name", &self.inner.health.name())
            .field("limit", &self.inner.limit)
            .finish()
    }
}

/// What one call of the lease script answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    ok: bool,
    held: u32,
    queued: u32,
}

impl RedisConcurrencyLimiter {
    /// `limit` permits per key, under the limiter `name` (no `{` or `}`).
    pub fn new(store: RedisStore, name: &str, limit: u32) -> Result<Self, Error> {
        Self::with_options(store, name, limit, RedisConcurrencyOptions::default())
    }

    /// [`RedisConcurrencyLimiter::new`] with options.
    pub fn with_options(
        store: RedisStore,
        name: &str,
        limit: u32,
        opts: RedisConcurrencyOptions,
    ) -> Result<Self, Error> {
        if name.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "limiter name {name:?} must not contain '{{' or '}}'"
            )));
        }
        if limit == 0 {
            return Err(Error::Config("concurrency limit must be at least 1".into()));
        }
        if opts.lease < Duration::from_millis(30) || opts.poll_interval.is_zero() {
            return Err(Error::Config(format!(
                "lease {:?} must be at least 30ms and poll interval {:?} above zero",
                opts.lease, opts.poll_interval
            )));
        }
        let local = match &opts.on_error {
            OnError::Local(rules) => {
                Some(KeyedConcurrencyLimiter::new(local_limit(rules)?, 100_000))
            }
            _ => None,
        };
        Ok(RedisConcurrencyLimiter {
            inner: Arc::new(Inner {
                health: NodeHealth::new(name, opts.probe_interval, &store),
                store,
                limit,
                opts,
                local,
                released: tokio::sync::Notify::new(),
            }),
        })
    }

    /// The limit per key.
    pub fn limit(&self) -> u32 {
        self.inner.limit
    }

    /// The counters (decisions = permits granted or refused by Redis), summed over
    /// the Redis nodes (`failing`: some node that holds slots now is).
    pub fn stats(&self) -> RedisStats {
        self.inner.health.sum(&self.inner.store)
    }

    /// Its counters per Redis node that has held one of its keys, with the node's
    /// name (see [`RedisStore::node_name`]).
    pub fn node_stats(&self) -> Vec<(Arc<str>, RedisStats)> {
        self.inner.health.by_node(&self.inner.store)
    }

    /// Permits held for `key` and waiters queued, as Redis sees them now (expired
    /// leases not counted).
    pub async fn in_use(&self, key: &str) -> Result<(u32, u32), Error> {
        let a = self
            .inner
            .call(&self.keys(key), "peek", "", 1, false)
            .await?;
        Ok((a.held, a.queued))
    }

    /// `n` permits for `key` now, or an error at once (also while others wait).
    pub async fn try_acquire(&self, key: &str, n: u32) -> Result<RedisPermit, PermitError> {
        self.acquire_inner(key, n, None).await
    }

    /// `n` permits for `key`, waiting in the key's queue at most `timeout`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue (a call sent from a spawned task), and
    /// gives back a lease granted by a call that was in flight; nothing stays held
    /// beyond that call. Without a tokio runtime to send it, the queue entry lapses
    /// after a few poll intervals and such a lease after its lease time.
    pub async fn acquire(
        &self,
        key: &str,
        n: u32,
        timeout: Duration,
    ) -> Result<RedisPermit, PermitError> {
        self.acquire_inner(key, n, Some(timeout)).await
    }

    fn keys(&self, key: &str) -> Vec<String> {
        static SUFFIXES: LazyLock<Vec<String>> =
            LazyLock::new(|| vec![":leases".into(), ":book".into(), ":queue".into()]);
        self.inner
            .store
            .keys(self.inner.health.name(), key, &SUFFIXES)
    }

    async fn acquire_inner(
        &self,
        key: &str,
        n: u32,
        timeout: Option<Duration>,
    ) -> Result<RedisPermit, PermitError> {
        let limit = self.inner.limit;
        if n == 0 || n > limit {
            return Err(ConcurrencyError::InsufficientCapacity { asked: n, limit }.into());
        }
        let keys = self.keys(key);
        let (_, node) = self.inner.store.place(&keys[0]);
        let health = &self.inner.health.of(node);
        if !health.should_try() {
            return self.fallback(health, key, n, timeout, None).await;
        }
        let start = health.clock.now_us();
        let id = nonce();
        let mut leave = Leave::new(self.inner.clone(), keys.clone(), id.clone());
        loop {
            let sent = health.clock.now_us();
            match self
                .inner
                .call(&keys, "acquire", &id, n, timeout.is_some())
                .await
            {
                Ok(a) => {
                    health.healthy(sent);
                    if a.ok {
                        health.count(Event::Decision);
                        leave.disarm();
                        return Ok(RedisPermit::lease(self.inner.clone(), keys, id, n));
                    }
                    let waited = Duration::from_micros(health.clock.now_us() - start);
                    let left = timeout.and_then(|t| t.checked_sub(waited));
                    match left {
                        Some(left) if !left.is_zero() => {
                            let nap = left.min(self.inner.opts.poll_interval);
                            let _ = tokio::time::timeout(nap, self.inner.released.notified()).await;
                        }
                        _ => {
                            health.count(Event::Decision);
                            if timeout.is_some() {
                                // Leave the queue now rather than from the guard's task.
                                leave.disarm();
                                let _ = self.inner.call(&keys, "release", &id, n, false).await;
                            }
                            return Err(ConcurrencyError::Busy { limit }.into());
                        }
                    }
                }
                Err(e) if e.is_transient() => {
                    health.failed(&e, &self.inner.opts.on_error, sent);
                    self.inner.store.call_failed();
                    let waited = Duration::from_micros(health.clock.now_us() - start);
                    let left = timeout.map(|t| t.saturating_sub(waited));
                    return self.fallback(health, key, n, left, Some(e)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn fallback(
        &self,
        health: &Health,
        key: &str,
        n: u32,
        timeout: Option<Duration>,
        err: Option<Error>,
    ) -> Result<RedisPermit, PermitError> {
        let limit = self.inner.limit;
        let permit = match (&self.inner.opts.on_error, &self.inner.local) {
            (OnError::FailOpen, _) => Ok(RedisPermit { kind: Kind::Open }),
            (OnError::FailClosed, _) => Err(ConcurrencyError::Busy { limit }.into()),
            (OnError::Local(_), Some(local)) => {
                let p = match timeout {
                    None => local.try_acquire(key, n),
                    Some(t) => local.acquire(key, n, t).await,
                };
                p.map(|p| RedisPermit {
                    kind: Kind::Local(p),
                })
                .map_err(PermitError::from)
            }
            _ => {
                return Err(err
                    .unwrap_or_else(|| {
                        Error::Unavailable("redis is failing (waiting for the next probe)".into())
                    })
                    .into())
            }
        };
        health.count(Event::Fallback);
        permit
    }
}

impl Inner {
    /// One call of the lease script.
    async fn call(
        &self,
        keys: &[String],
        op: &str,
        id: &str,
        n: u32,
        wait: bool,
    ) -> Result<Answer, Error> {
        let lease = self.opts.lease.as_micros();
        // A waiter that misses a few polls (or whose process died) leaves the queue.
        let waiter = (self.opts.poll_interval * 4 + self.store.options().timeout * 2).as_micros();
        let args = [
            op.to_owned(),
            id.to_owned(),
            n.to_string(),
            self.limit.to_string(),
            lease.to_string(),
            if wait { "1" } else { "0" }.to_owned(),
            waiter.to_string(),
            self.store.options().ttl_margin.as_millis().to_string(),
        ];
        let value = self.store.eval(&SCRIPT, keys, &args).await?;
        if op == "release" {
            self.released.notify_waiters();
        }
        let bad = || Error::Store(format!("lease script reply: {value:?}"));
        let Value::Array(items) = &value else {
            return Err(bad());
        };
        let int = |i: usize| match items.get(i) {
            Some(Value::Int(v)) => u32::try_from(*v).map_err(|_| bad()),
            _ => Err(bad()),
        };
        Ok(Answer {
            ok: int(0)? == 1,
            held: int(1)?,
            queued: int(2)?,
        })
    }
}

/// The rule set of `OnError::Local` for a concurrency limiter: one `concurrency`
/// policy, whose limit is this instance's.
fn local_limit(rules: &RuleSet) -> Result<u32, Error> {
    match rules.policies() {
        [p] if matches!(p.algorithm(), AnyAlgorithm::Concurrency(_)) => {
            u32::try_from(p.limit()).map_err(|_| Error::Config("local limit too large".into()))
        }
        _ => Err(Error::Config(format!(
            "on_error local for a concurrency limiter takes one concurrency policy \
             (this instance's share), not {rules:?}"
        ))),
    }
}

/// Sends `release` for a lease id from a spawned task when dropped armed: a waiter
/// that went away leaves the queue, and a lease granted meanwhile comes back.
struct Leave {
    call: Option<(Arc<Inner>, Vec<String>, String)>,
}

impl Leave {
    fn new(inner: Arc<Inner>, keys: Vec<String>, id: String) -> Leave {
        Leave {
            call: Some((inner, keys, id)),
        }
    }

    fn disarm(&mut self) {
        self.call = None;
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        if let Some((inner, keys, id)) = self.call.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = inner.call(&keys, "release", &id, 1, false).await;
                });
            }
        }
    }
}

/// Permits held; released when dropped (or by [`RedisPermit::release`]).
#[must_use = "the permits are released as soon as this is dropped"]
pub struct RedisPermit {
    kind: Kind,
}

enum Kind {
    /// A lease in Redis, renewed by `renew` until released.
    Lease {
        renew: tokio::task::JoinHandle<()>,
        lost: Arc<AtomicBool>,
        leave: Leave,
    },
    /// Granted by the local share while Redis was failing.
    Local(#[allow(dead_code)] KeyedConcurrencyPermit<String>),
    /// Granted by `fail-open` while Redis was failing.
    Open,
}

impl std::fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Lease { .. } => "lease",
            Kind::Local(_) => "local",
            Kind::Open => "open",
        };
        f.debug_struct("RedisPermit")
            .field("kind", &kind)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl RedisPermit {
    fn lease(inner: Arc<Inner>, keys: Vec<String>, id: String, n: u32) -> RedisPermit {
        let lost = Arc::new(AtomicBool::new(false));
        let every = inner.opts.lease / 3;
        let renew = {
            let (inner, keys, id, lost) = (inner.clone(), keys.clone(), id.clone(), lost.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    match inner.call(&keys, "renew", &id, n, false).await {
                        Ok(a) if !a.ok => {
                            lost.store(true, Ordering::Relaxed);
                            tracing::warn!(
                                limiter = %inner.health.name(),
                                "a concurrency lease expired before its holder renewed it"
                            );
                            return;
                        }
                        // A failed renewal is retried at the next tick; the lease
                        // lapses only if Redis stays unreachable for the lease time.
                        _ => {}
                    }
                }
            })
        };
        RedisPermit {
            kind: Kind::Lease {
                renew,
                lost,
                leave: Leave::new(inner, keys, id),
            },
        }
    }

    /// Whether the lease expired in Redis before it was renewed (the holder stalled,
    /// or Redis was unreachable for the lease time): its permits may have gone to
    /// someone else.
    pub fn is_lost(&self) -> bool {
        matches!(&self.kind, Kind::Lease { lost, .. } if lost.load(Ordering::Relaxed))
    }

    /// Releases the permits and waits for Redis to confirm it (dropping the permit
    /// releases them from a spawned task instead).
    pub async fn release(mut self) -> Result<(), Error> {
        if let Kind::Lease { renew, leave, .. } = &mut self.kind {
            renew.abort();
            if let Some((inner, keys, id)) = leave.call.take() {
                inner.call(&keys, "release", &id, 1, false).await?;
            }
        }
        Ok(())
    }
}

impl Drop for RedisPermit {
    fn drop(&mut self) {
        if let Kind::Lease { renew, .. } = &self.kind {
            renew.abort();
        }
        // An armed `Leave` releases the lease as it drops.
    }
}
