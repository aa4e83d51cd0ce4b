//! Whether a Redis node is answering, as one limiter sees it: the failing/healthy transitions
//! (logged and counted), the probe schedule while failing, what a limiter decides
//! meanwhile ([`OnError`]) and its counters ([`RedisStats`]); [`NodeHealth`] keeps one
//! per node, so that a failing node's keys take the failure policy and no others.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Clock, MonotonicClock, RuleSet};

use super::per_node::PerNode;
use super::store::RedisStore;
use crate::Error;

/// What a [`RedisLimiter`](super::RedisLimiter) decides while Redis is unreachable or slow.
#[derive(Debug, Clone, Default)]
pub enum OnError {
    /// Return the error to the caller (the default: the caller decides).
    #[default]
    Error,
    /// Admit every request (availability over the limit).
    FailOpen,
    /// Reject every request (the limit over availability).
    FailClosed,
    /// Decide with an in-memory limiter of these rules, typically this instance's
    /// share of the global limit (e.g. a quarter of it with four instances).
    Local(RuleSet),
}

/// Counters of a [`RedisLimiter`](super::RedisLimiter) (for metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisStats {
    /// Decisions made by Redis.
    pub redis_decisions: u64,
    /// Calls that failed with a transient Redis error (or timeout).
    pub redis_errors: u64,
    /// Decisions made by the failure policy.
    pub fallback_decisions: u64,
    /// Rejects answered by the negative cache.
    pub negative_cache_hits: u64,
    /// Times Redis became unreachable (healthy to failing).
    pub outages: u64,
    /// Times Redis came back (failing to healthy).
    pub recoveries: u64,
    /// Whether Redis is failing now.
    pub failing: bool,
}

/// Sums counters (e.g. of every Redis limit of a service); `failing` if any is.
impl std::ops::AddAssign for RedisStats {
    fn add_assign(&mut self, o: RedisStats) {
        self.redis_decisions += o.redis_decisions;
        self.redis_errors += o.redis_errors;
        self.fallback_decisions += o.fallback_decisions;
        self.negative_cache_hits += o.negative_cache_hits;
        self.outages += o.outages;
        self.recoveries += o.recoveries;
        self.failing |= o.failing;
    }
}

/// A counter of [`RedisStats`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Decision = 0,
    Error = 1,
    Fallback = 2,
    Outage = 3,
    Recovery = 4,
}

pub(crate) struct Health {
    name: String,
    /// The node it is kept for (named in its log lines, as `/metrics` names it).
    node: Option<(RedisStore, usize)>,
    probe_interval: Duration,
    pub clock: MonotonicClock,
    failing: AtomicBool,
    /// Local time (us) after which a failing limiter tries Redis again.
    next_probe: AtomicU64,
    /// Local time (us) of the last recovery: a call sent before it that fails late
    /// (it waited out its timeout on the connection Redis dropped) is not a new outage.
    recovered_at: AtomicU64,
    /// Local time (us) the last outage began: a call sent before it that succeeds late
    /// (its answer was on the way when Redis died) is not a recovery.
    failed_at: AtomicU64,
    stats: [AtomicU64; 5],
}

impl Health {
    pub fn new(name: &str, probe_interval: Duration) -> Health {
        Health {
            name: name.into(),
            node: None,
            probe_interval,
            clock: MonotonicClock::new(),
            failing: AtomicBool::new(false),
            next_probe: AtomicU64::new(0),
            recovered_at: AtomicU64::new(0),
            failed_at: AtomicU64::new(0),
            stats: Default::default(),
        }
    }

    /// The node's name (`host:port`; a single node's redacted URL).
    fn node(&self) -> Arc<str> {
        match &self.node {
            Some((store, i)) => store.node_name(*i),
            None => Arc::from("redis"),
        }
    }

    pub fn count(&self, e: Event) {
        self.stats[e as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> RedisStats {
        let s = |e: Event| self.stats[e as usize].load(Ordering::Relaxed);
        RedisStats {
            redis_decisions: s(Event::Decision),
            redis_errors: s(Event::Error),
            fallback_decisions: s(Event::Fallback),
            negative_cache_hits: 0, // counted by the limiter (a key's node is not looked up)
            outages: s(Event::Outage),
            recoveries: s(Event::Recovery),
            failing: self.failing.load(Ordering::Relaxed),
        }
    }

    /// Whether this call should go to Redis: always while healthy; while failing,
    /// one call per probe interval (the others take the failure policy at once).
    pub fn should_try(&self) -> bool {
        if !self.failing.load(Ordering::Relaxed) {
            return true;
        }
        let now = self.clock.now_us();
        let due = self.next_probe.load(Ordering::Relaxed);
        now >= due
            && self
                .next_probe
                .compare_exchange(
                    due,
                    now + self.probe_interval.as_micros() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Redis answered a call sent at `sent` (local us). An answer to a call sent
    /// before the outage began says nothing of Redis now.
    pub fn healthy(&self, sent: u64) {
        // `failed_at` is written before `failing` is set (release), so a reader that
        // sees the outage (acquire) sees when it began.
        if !self.failing.load(Ordering::Acquire) || sent < self.failed_at.load(Ordering::Relaxed) {
            return;
        }
        self.recovered_at
            .store(self.clock.now_us(), Ordering::Relaxed);
        if self.failing.swap(false, Ordering::AcqRel) {
            self.count(Event::Recovery);
            tracing::warn!(
                limiter = %self.name,
                node = %self.node(),
                "redis is back: decisions are global again"
            );
        }
    }

    /// Redis failed with `e` (transient) a call sent at `sent` (local us): the failure
    /// policy decides until a probe succeeds. A call sent before the last recovery
    /// counts as an error only: Redis has answered since.
    pub fn failed(&self, e: &Error, policy: &dyn std::fmt::Debug, sent: u64) {
        self.count(Event::Error);
        if sent < self.recovered_at.load(Ordering::Acquire) {
            return;
        }
        // The next probe is one interval after this call was sent, not after it failed:
        // a probe that times out (250 ms) must not stretch the interval, or a healed
        // Redis waits interval + timeout for its next probe.
        let probe = sent + self.probe_interval.as_micros() as u64;
        self.next_probe.store(probe, Ordering::Relaxed);
        if self.failing.load(Ordering::Acquire) {
            return;
        }
        self.failed_at.store(self.clock.now_us(), Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::AcqRel) {
            self.count(Event::Outage);
            tracing::error!(
                limiter = %self.name,
                node = %self.node(),
                error = %e,
                policy = ?policy,
                "redis is failing: the failure policy decides until it answers again"
            );
        }
    }
}

/// The health of each Redis node one limiter calls (one for a single node or a
/// Sentinel master), made on a node's first call.
pub(crate) struct NodeHealth {
    name: String,
    probe_interval: Duration,
    store: RedisStore,
    nodes: PerNode<Health>,
}

/// What a call under a node's health came to.
pub(crate) enum Guarded<T> {
    /// The node answered.
    Answered(T),
    /// The node is failing: this call failed with a transient error (given), or it
    /// was not sent (no probe due). The failure policy decides.
    Failing(Arc<Health>, Option<Error>),
}

impl NodeHealth {
    pub fn new(name: &str, probe_interval: Duration, store: &RedisStore) -> NodeHealth {
        NodeHealth {
            name: name.into(),
            probe_interval,
            store: store.clone(),
            nodes: PerNode::default(),
        }
    }

    /// The limiter's name (in logs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Node `node`'s health.
    pub fn of(&self, node: usize) -> Arc<Health> {
        (self.nodes).get(node, || Health {
            node: Some((self.store.clone(), node)),
            ..Health::new(&self.name, self.probe_interval)
        })
    }

    /// Sends `call` to node `node` unless the node is failing and no probe is due;
    /// keeps the node's health by its outcome (`policy` is logged when it fails). A
    /// call that fails for good (not transient) is the caller's error.
    pub async fn call<T>(
        &self,
        node: usize,
        policy: &(dyn std::fmt::Debug + Sync),
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<Guarded<T>, Error> {
        let health = self.of(node);
        if !health.should_try() {
            return Ok(Guarded::Failing(health, None));
        }
        let sent = health.clock.now_us();
        match call.await {
            Ok(t) => {
                health.healthy(sent);
                health.count(Event::Decision);
                Ok(Guarded::Answered(t))
            }
            Err(e) if e.is_transient() => {
                health.failed(&e, policy, sent);
                Ok(Guarded::Failing(health, Some(e)))
            }
            Err(e) => Err(e),
        }
    }

    /// Each node's counters, by index. A node that holds no slot of `store` now
    /// (one that lost them in a failover, or a Cluster's placeholder before the slot
    /// map) is not failing: no call goes there to find it back.
    fn each(&self, store: &RedisStore) -> impl Iterator<Item = (usize, RedisStats)> {
        let serving = store.serving_nodes();
        let all = self.nodes.all();
        (0..all.len()).map(move |i| {
            let mut s = all[i].stats();
            s.failing &= serving.contains(&i);
            (i, s)
        })
    }

    /// The counters summed over the nodes (`failing`: some node that holds slots now
    /// is).
    pub fn sum(&self, store: &RedisStore) -> RedisStats {
        let mut sum = RedisStats::default();
        for (_, s) in self.each(store) {
            sum += s;
        }
        sum
    }

    /// The counters of each node that has been called, with its name (see
    /// [`RedisStore::node_name`]).
    pub fn by_node(&self, store: &RedisStore) -> Vec<(Arc<str>, RedisStats)> {
        (self.each(store))
            .filter(|(_, s)| *s != RedisStats::default())
            .map(|(i, s)| (store.node_name(i), s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis dies while calls are out: one sent before the failure that is answered
    /// late is no recovery, and one sent before the recovery that fails late is no new
    /// outage; only the probe after the failure flips the state.
    #[test]
    fn late_answers_to_calls_sent_before_a_change_do_not_flip_it() {
        let health = Health::new("t", Duration::from_millis(250));
        let e = Error::Unavailable("redis: broken pipe".into());
        let before = health.clock.now_us();
        std::thread::sleep(Duration::from_millis(2));
        health.failed(&e, &OnError::FailClosed, health.clock.now_us());
        health.healthy(before);
        assert!(health.stats().failing, "a stale success is no recovery");
        std::thread::sleep(Duration::from_millis(2));
        let probe = health.clock.now_us();
        std::thread::sleep(Duration::from_millis(2));
        health.healthy(probe);
        assert!(!health.stats().failing);
        health.failed(&e, &OnError::FailClosed, before);
        let s = health.stats();
        assert_eq!((s.outages, s.recoveries, s.failing), (1, 1, false));
    }
}
