//! [`RedisLimiter`]: per-key limits shared through Redis, with a failure policy and
//! an optional local negative cache.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tollgate_core::{Clock, Decision, Op, RuleDecision, RuleSet};

use super::call::{CallOp, CheckCall};
use super::health::{Event, Guarded, Health, NodeHealth, OnError, RedisStats};
use super::script::Wire;
use super::store::RedisStore;
use crate::Error;
use crate::{KeyedLimiter, RateLimiter};

/// Options of a [`RedisLimiter`].
#[derive(Debug, Clone)]
pub struct RedisLimiterOptions {
    /// The failure policy.
    pub on_error: OnError,
    /// While Redis is failing, how often one call tries it again (the others take the
    /// failure policy at once, without waiting for a timeout). Default 500 ms.
    pub probe_interval: Duration,
    /// Once Redis rejects a key until some instant, reject it locally until then
    /// without a round trip. Never rejects what Redis would admit: under every
    /// algorithm the script runs, other clients' traffic can only move that instant
    /// later. The one exception is a refund made by another instance, which frees
    /// room this instance only sees once the cached instant has passed (stricter, not
    /// looser). A refund through this limiter clears the key's entry. Envoy's counting
    /// (`Op::Count`) uses it too: a count on a key cached as rejected is answered
    /// locally and not counted, as envoyproxy/ratelimit's local cache skips its
    /// `INCRBY`. Default off.
    pub negative_cache: bool,
    /// The most keys the negative cache holds (it is cleared when full). Default 100k.
    pub negative_cache_keys: usize,
    /// Keep a rule set that is one `fixed-window` with `align=clock` and
    /// `debt=forgive` (and no `max-debt`) as envoyproxy/ratelimit keeps its counters:
    /// one integer key per window, counted with plain `INCRBY` and `PEXPIRE`
    /// (pipelined, no script), so Envoy's counting costs Redis what it costs
    /// envoyproxy/ratelimit. Decisions are the same; what changes: the keys (a limiter
    /// switching either way starts its windows afresh), the window is cut by Redis's
    /// clock as this process follows it (each node's `TIME`, read every 10 s: within
    /// half a round trip of where a script would cut it, not at each command), and
    /// [`RateLimiter::acquire`] (which reserves later windows) is refused. Other
    /// rule sets are kept as always. Default off (`tollgate serve` turns it on for its
    /// descriptors, see `store.window_counters`).
    pub window_counters: bool,
}

impl Default for RedisLimiterOptions {
    fn default() -> Self {
        RedisLimiterOptions {
            on_error: OnError::Error,
            probe_interval: Duration::from_millis(500),
            negative_cache: false,
            negative_cache_keys: 100_000,
            window_counters: false,
        }
    }
}

struct Compiled {
    rules: RuleSet,
    wire: Arc<Wire>,
    local: Option<KeyedLimiter<String>>,
}

struct Cached {
    /// The reject as Redis gave it, at `at` (local monotonic us).
    decision: Decision,
    at: u64,
    cost: u64,
}

struct Inner {
    name: String,
    store: RedisStore,
    opts: RedisLimiterOptions,
    compiled: ArcSwap<Compiled>,
    /// Health per Redis node (one for a single node): a Cluster node that fails
    /// sends its own keys to the failure policy, and no other.
    health: NodeHealth,
    /// The negative cache's clock, and its hits.
    clock: tollgate_core::MonotonicClock,
    cache_hits: std::sync::atomic::AtomicU64,
    negative: Mutex<HashMap<String, Cached>>,
    /// The order this process's waiters come back in.
    turns: crate::wait::Turns,
}

/// Per-key limits kept in Redis: every instance that uses the same Redis, limiter name
/// and rules shares one limit per key.
///
/// Cheap to clone (an `Arc` inside). Keys are strings; each key's policies live in one
/// Cluster slot. See [`crate::redis`] for an example.
#[derive(Clone)]
pub struct RedisLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("name", &self.inner.name)
            .field("rules", &self.inner.compiled.load().rules)
            .finish()
    }
}

impl RedisLimiter {
    /// A limiter named `name` (part of every Redis key; no `{` or `}`) on `store`.
    pub fn new(
        store: RedisStore,
        name: &str,
        rules: impl Into<RuleSet>,
    ) -> Result<RedisLimiter, Error> {
        RedisLimiter::with_options(store, name, rules, RedisLimiterOptions::default())
    }

    /// [`RedisLimiter::new`] with options.
    pub fn with_options(
        store: RedisStore,
        name: &str,
        rules: impl Into<RuleSet>,
        opts: RedisLimiterOptions,
    ) -> Result<RedisLimiter, Error> {
        if name.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "limiter name {name:?} must not contain '{{' or '}}'"
            )));
        }
        let compiled = compile(rules.into(), &opts, &store)?;
        Ok(RedisLimiter {
            inner: Arc::new(Inner {
                name: name.into(),
                health: NodeHealth::new(name, opts.probe_interval, &store),
                store,
                clock: tollgate_core::MonotonicClock::new(),
                cache_hits: Default::default(),
                opts,
                compiled: ArcSwap::from_pointee(compiled),
                negative: Mutex::new(HashMap::new()),
                turns: Default::default(),
            }),
        })
    }

    /// The rule set in force now (a copy; [`RedisLimiter::set_rules`] changes it).
    pub fn rules(&self) -> RuleSet {
        self.inner.compiled.load().rules.clone()
    }

    /// Replaces the rules. Each policy keeps the state Redis holds for it when its
    /// algorithm is unchanged (the state is read under the new parameters, as the
    /// memory store's carry-over does for most algorithms); a policy whose algorithm
    /// changed starts afresh. The negative cache is cleared.
    pub fn set_rules(&self, rules: impl Into<RuleSet>) -> Result<(), Error> {
        let compiled = compile(rules.into(), &self.inner.opts, &self.inner.store)?;
        self.inner.compiled.store(Arc::new(compiled));
        lock(&self.inner.negative).clear();
        Ok(())
    }

    /// Whether its rules are kept as window counters now (see
    /// [`RedisLimiterOptions::window_counters`]): then an acquire is refused.
    pub fn keeps_window_counters(&self) -> bool {
        self.inner.compiled.load().wire.counter.is_some()
    }

    /// The store this limiter decides in.
    pub fn store(&self) -> &RedisStore {
        &self.inner.store
    }

    /// Its counters now: decisions, errors, fallbacks, negative-cache hits, outages,
    /// summed over the Redis nodes (`failing`: some node that holds slots now is).
    pub fn stats(&self) -> RedisStats {
        let hits = (self.inner.cache_hits).load(std::sync::atomic::Ordering::Relaxed);
        RedisStats {
            negative_cache_hits: hits,
            ..self.inner.health.sum(&self.inner.store)
        }
    }

    /// Its counters per Redis node that has held one of its keys, with the node's
    /// name (`host:port`; see [`RedisStore::node_name`]).
    pub fn node_stats(&self) -> Vec<(std::sync::Arc<str>, RedisStats)> {
        self.inner.health.by_node(&self.inner.store)
    }

    /// The name of the Redis node that holds `key`'s state, as the store knows the
    /// Cluster's slots now (see [`RedisStore::node_name`]).
    pub fn node_of(&self, key: &str) -> std::sync::Arc<str> {
        let compiled = self.inner.compiled.load();
        let keys = self.keys(key, &compiled.wire);
        let (_, node) = self.inner.store.place(&keys[0]);
        self.inner.store.node_name(node)
    }

    /// Sends `call` (a call to node `node`) under that node's health (see
    /// `NodeHealth::call`); a transient failure has the slot map fetched again soon.
    /// A leased limiter's calls go through its unleased one's.
    pub(crate) async fn guarded<T>(
        &self,
        node: usize,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<Guarded<T>, Error> {
        let on_error = &self.inner.opts.on_error;
        let g = self.inner.health.call(node, on_error, call).await?;
        if matches!(g, Guarded::Failing(_, Some(_))) {
            self.inner.store.call_failed();
        }
        Ok(g)
    }

    /// The failure policy's decision of `op` for `key` at `cost` while `health`'s
    /// node fails (`err`: the call's error, if one was sent).
    pub(crate) fn fallback_of(
        &self,
        health: &Health,
        key: &str,
        cost: u64,
        op: Op,
        err: Option<Error>,
    ) -> Result<RuleDecision, Error> {
        self.fallback(&self.inner.compiled.load(), health, key, cost, op, err)
    }

    /// Decides at a time the caller gives (us since the Unix epoch, or a trace's
    /// virtual time), for a key that, when it has no state, was created at `created`:
    /// what `tollgate replay --store redis` runs. No failure policy, no cache.
    pub async fn check_at(
        &self,
        key: &str,
        now: u64,
        created: u64,
        cost: u64,
        op: Op,
    ) -> Result<RuleDecision, Error> {
        let compiled = self.inner.compiled.load_full();
        refuse_acquire(&compiled, op)?;
        let check = self.check_call(&compiled, op.into(), key, Some(now), Some(created), cost);
        (self.inner.store)
            .decide(key, check, &compiled.rules, op)
            .await
    }

    /// The call of `op` for `key` under `compiled` (`now`/`created`: `None` for Redis's
    /// time).
    fn check_call(
        &self,
        compiled: &Compiled,
        op: CallOp,
        key: &str,
        now: Option<u64>,
        created: Option<u64>,
        cost: u64,
    ) -> CheckCall {
        let keys = self.keys(key, &compiled.wire);
        let (slot, node) = self.inner.store.place(&keys[0]);
        CheckCall {
            op,
            keys,
            slot,
            node,
            wire: compiled.wire.clone(),
            now,
            created,
            cost,
        }
    }

    /// The command an unbatched try (or with `charge`, a charge) of `cost` for `key`
    /// sends as `calls` sends it (`FCALL` of the one-check function; `EVALSHA` with
    /// [`RedisCalls::Eval`](super::RedisCalls::Eval); `TOLLGATE.TRY` or `TOLLGATE.CHARGE` with
    /// [`RedisCalls::Module`](super::RedisCalls::Module), `None` for a rule set the module does not decide), as
    /// words, for tools that drive the decision code themselves, e.g.
    /// `redis-benchmark` as a ceiling (the nonce is fixed).
    pub fn script_call(
        &self,
        key: &str,
        cost: u64,
        calls: super::RedisCalls,
        charge: bool,
    ) -> Option<Vec<String>> {
        let compiled = self.inner.compiled.load();
        let op = if charge { CallOp::Charge } else { CallOp::Try };
        let check = self.check_call(&compiled, op, key, None, None, cost);
        let lib = super::script::library();
        let (form, function) = if charge {
            ("c", &lib.function_charge)
        } else {
            ("t", &lib.function_try)
        };
        let cmd = match calls {
            super::RedisCalls::Eval => {
                let mut cmd = ::redis::cmd("EVALSHA");
                cmd.arg(&super::script::eval_script(compiled.wire.families).sha1);
                super::call::push_try(&mut cmd, &check, "bench", super::call::Form::Eval(form));
                cmd
            }
            super::RedisCalls::Module => {
                compiled.wire.module.as_ref()?;
                let mut cmd = ::redis::cmd(if charge {
                    "TOLLGATE.CHARGE"
                } else {
                    "TOLLGATE.TRY"
                });
                super::call::push_try(&mut cmd, &check, "bench", super::call::Form::Module);
                cmd
            }
            _ => {
                let mut cmd = ::redis::cmd("FCALL");
                cmd.arg(function);
                super::call::push_try(&mut cmd, &check, "bench", super::call::Form::Function);
                cmd
            }
        };
        Some(
            cmd.args_iter()
                .map(|a| match a {
                    ::redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                })
                .collect(),
        )
    }

    async fn peek_inner(
        &self,
        key: &str,
        now: Option<u64>,
        created: Option<u64>,
        cost: u64,
    ) -> Result<RuleDecision, Error> {
        let compiled = self.inner.compiled.load_full();
        // A cost of 0 looks at the states as they stand; the script only reads them.
        if cost > 0 {
            compiled.wire.check_cost(&compiled.rules, cost)?;
        }
        let check = self.check_call(&compiled, CallOp::Peek, key, now, created, cost.max(1));
        let reply = self.inner.store.call(check, &compiled.rules).await?;
        Ok(compiled.rules.peek(&reply.states, reply.now, cost)?)
    }

    /// [`RateLimiter::peek`] at a time the caller gives (see [`RedisLimiter::check_at`]).
    pub async fn peek_at(
        &self,
        key: &str,
        now: u64,
        created: u64,
        cost: u64,
    ) -> Result<RuleDecision, Error> {
        self.peek_inner(key, Some(now), Some(created), cost).await
    }

    /// The Redis keys of `key`'s states.
    fn keys(&self, key: &str, wire: &Wire) -> Vec<String> {
        (self.inner.store).keys(&self.inner.name, key, &wire.suffixes)
    }

    fn fallback(
        &self,
        compiled: &Compiled,
        health: &Health,
        key: &str,
        cost: u64,
        op: Op,
        err: Option<Error>,
    ) -> Result<RuleDecision, Error> {
        let limit = compiled.rules.policies()[0].limit();
        let probe_us = self.inner.opts.probe_interval.as_micros() as u64;
        let d = match (&self.inner.opts.on_error, &compiled.local) {
            (OnError::FailOpen, _) => Ok(RuleDecision::from(Decision::admitted(limit, 0, 0, 0))),
            // Retry when Redis is next asked.
            (OnError::FailClosed, _) => Ok(RuleDecision::from(Decision::rejected(
                limit,
                0,
                0,
                Some(probe_us),
            ))),
            (OnError::Local(_), Some(local)) => {
                local.check_rules(key, cost, op).map_err(|e| match e {
                    crate::Error::Check(c) => Error::Check(c),
                    other => Error::Unsupported(other.to_string()),
                })
            }
            _ => {
                return Err(err.unwrap_or_else(|| {
                    Error::Unavailable("redis is failing (waiting for the next probe)".into())
                }))
            }
        };
        health.count(Event::Fallback);
        d
    }

    fn cached(&self, key: &str, cost: u64) -> Option<Decision> {
        let now = self.inner.clock.now_us();
        let mut map = lock(&self.inner.negative);
        let c = map.get(key)?;
        let elapsed = now.saturating_sub(c.at);
        let retry = c.decision.retry_after_us?;
        if elapsed >= retry {
            map.remove(key);
            return None;
        }
        if cost < c.cost {
            return None;
        }
        (self.inner.cache_hits).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(Decision {
            retry_after_us: Some(retry - elapsed),
            reset_after_us: c.decision.reset_after_us.saturating_sub(elapsed),
            ..c.decision
        })
    }

    fn remember(&self, key: &str, cost: u64, d: Decision) {
        if d.retry_after_us.is_none() {
            return;
        }
        let mut map = lock(&self.inner.negative);
        if map.len() >= self.inner.opts.negative_cache_keys {
            map.clear();
        }
        map.insert(
            key.to_owned(),
            Cached {
                decision: d,
                at: self.inner.clock.now_us(),
                cost,
            },
        );
    }
}

/// The Redis store behind the one limiter interface. Time is Redis's; when Redis
/// fails, the limiter's failure policy ([`OnError`]) decides.
impl RateLimiter for RedisLimiter {
    /// Decides a request of `cost` for `key` (try, or acquire: reserve the earliest
    /// admission, returned as `wait`, without waiting for it), with each policy's
    /// decision. Time is Redis's. When Redis fails, the failure policy decides.
    async fn check_rules(&self, key: &str, cost: u64, op: Op) -> Result<RuleDecision, Error> {
        let compiled = self.inner.compiled.load_full();
        refuse_acquire(&compiled, op)?;
        if matches!(op, Op::Try | Op::Count) && self.inner.opts.negative_cache {
            if let Some(d) = self.cached(key, cost) {
                return Ok(RuleDecision::from(d));
            }
        }
        let check = self.check_call(&compiled, op.into(), key, None, None, cost);
        let node = check.node;
        let decide = self.inner.store.decide(key, check, &compiled.rules, op);
        match self.guarded(node, decide).await? {
            Guarded::Answered(d) => {
                if matches!(op, Op::Try | Op::Count)
                    && self.inner.opts.negative_cache
                    && !d.decision.allowed
                {
                    self.remember(key, cost, d.decision);
                }
                Ok(d)
            }
            Guarded::Failing(health, err) => self.fallback(&compiled, &health, key, cost, op, err),
        }
    }

    /// Tries a request of `cost` for `key` now: the overall decision (refused for
    /// rules that pace, see [`Error::Paces`]).
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        Error::refuse_pacing(&self.inner.compiled.load().rules)?;
        Ok(self.check_rules(key, cost, Op::Try).await?.decision)
    }

    /// The decision a try of `cost` would get now, changing nothing (cost 0: the
    /// state as it stands, see `RuleSet::peek`).
    async fn peek(&self, key: &str, cost: u64) -> Result<RuleDecision, Error> {
        self.peek_inner(key, None, None, cost).await
    }

    /// Gives back `cost` units admitted earlier to every policy of `key`.
    async fn refund(&self, key: &str, cost: u64) -> Result<(), Error> {
        let compiled = self.inner.compiled.load_full();
        lock(&self.inner.negative).remove(key);
        let check = self.check_call(&compiled, CallOp::Refund, key, None, None, cost);
        self.inner.store.call(check, &compiled.rules).await?;
        Ok(())
    }

    /// Forgets `key`'s state in Redis.
    async fn reset(&self, key: &str) -> Result<(), Error> {
        let compiled = self.inner.compiled.load_full();
        let mut keys = self.keys(key, &compiled.wire);
        if let Some(counter) = &compiled.wire.counter {
            // Only the current window counts (earlier ones are forgiven, later ones
            // are never reserved), by the clock of the node that holds it.
            let (slot, node) = self.inner.store.place(&keys[0]);
            let now = self.inner.store.redis_now(node, slot).await?;
            keys[0] = counter.key(&keys[0], now);
        }
        lock(&self.inner.negative).remove(key);
        self.inner.store.delete(&keys).await
    }

    /// Acquires `cost` for `key`: reserves the earliest admission in Redis (FIFO per
    /// key across every instance) and waits for it. Rejected at once when the wait
    /// would exceed a policy's `max-wait`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it waits gives the reservation back (a refund sent
    /// to Redis from a spawned task), so the capacity is not lost.
    async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let d = self.check_rules(key, cost, Op::Acquire).await?.decision;
        if d.allowed && d.wait_us > 0 {
            let guard = crate::wait::RefundOnDrop::new(|| {
                crate::wait::refund_detached(self, &key.to_owned(), cost)
            });
            crate::wait::sleep_or_refund(&self.inner.turns, d.wait(), guard).await;
        }
        Ok(d)
    }

    fn rules(&self) -> RuleSet {
        RedisLimiter::rules(self)
    }

    fn set_rules(&self, rules: RuleSet) -> Result<(), Error> {
        RedisLimiter::set_rules(self, rules)
    }
}

crate::rate_limiter::string_keys!(RedisLimiter);

fn compile(
    rules: RuleSet,
    opts: &RedisLimiterOptions,
    store: &RedisStore,
) -> Result<Compiled, Error> {
    let margin = store.options().ttl_margin;
    let wire = Arc::new(Wire::new(&rules, margin, opts.window_counters)?);
    let local = match &opts.on_error {
        OnError::Local(local) => Some(KeyedLimiter::new(local.clone())),
        _ => None,
    };
    Ok(Compiled { rules, wire, local })
}

/// An acquire reserves later windows, which window counters do not keep.
fn refuse_acquire(compiled: &Compiled, op: Op) -> Result<(), Error> {
    match (&compiled.wire.counter, op) {
        (Some(_), Op::Acquire) => Err(Error::Unsupported(format!(
            "acquire: {} is kept as window counters (RedisLimiterOptions::window_counters, \
             store.window_counters in a config), which reserve no later window",
            compiled.rules
        ))),
        _ => Ok(()),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
