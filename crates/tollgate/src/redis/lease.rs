//! [`LeasedLimiter`]: hot keys decided locally from slices of their budget leased from
//! Redis, never admitting more than the unleased algorithm would.
//!
//! A lease gives this instance `n` admissions of a key that it may decide locally until
//! a deadline, with the key's states as they were (the snapshot). Redis charges the key
//! as if the `n` admissions happened at the deadline (`lua/lease.lua` says why), so
//! every other instance is decided against a budget that already counts the whole
//! slice. Locally, each request is decided by the exact algorithm (the core, as the
//! memory store runs it) on the snapshot plus this instance's own admissions, and only
//! while slice units remain. The next lease call ends the previous one: if nobody else
//! touched the key meanwhile, the local states replace Redis's (the key is left as if
//! there had been no lease: a single instance decides exactly like the unleased
//! algorithm); otherwise the unspent units are refunded if the lease's deadline has
//! not passed by Redis's clock (after it, refills may have absorbed them: they stay
//! charged and come back as the key refills).
//!
//! The cost is under-admission, never over-admission: while a slice is out, other
//! instances see the key charged up to the slice's deadline; a holder that dies keeps
//! its slice charged until the key refills.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tollgate_core::{Clock, Decision, MonotonicClock, Op, PolicyState, RuleDecision, RuleSet};

use super::call::{push_one, push_times};
use super::health::Guarded;
use super::script::{encode_state, leasable, parse_state, Wire};
use super::store::RedisStore;
use crate::Error;
use crate::RateLimiter;

/// How a [`LeasedLimiter`] leases.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// How long a slice may be spent after it is granted. Shorter wastes less of the
    /// budget when the key is not saturated (Redis counts a slice as spent at its
    /// deadline); longer asks Redis less often. Default 50 ms.
    pub duration: Duration,
    /// The most admissions one lease takes; the slice grows (doubling) toward it while
    /// this instance uses its slices up, and shrinks to what it used when it does not.
    /// At most the smallest limit of the rule set (a slice must fit at once). Default:
    /// a quarter of that limit, at least 1.
    pub max_slice: Option<u64>,
    /// Lease calls, and what is not leased, as a [`RedisLimiter`](super::RedisLimiter)
    /// makes them: the failure policy, the probe interval and the negative cache.
    /// While the node that holds a key fails, a try that needs a new lease takes the
    /// failure policy at once (one call per probe interval asks again), as `acquire`
    /// and `charge` do; other nodes' keys lease as usual. `peek`, `refund` and `reset`
    /// go to Redis without a failure policy and answer the store's error.
    pub redis: super::RedisLimiterOptions,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            duration: Duration::from_millis(50),
            max_slice: None,
            redis: super::RedisLimiterOptions::default(),
        }
    }
}

/// Counters of a [`LeasedLimiter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Leases granted.
    pub leases_taken: u64,
    /// Admissions granted in those leases.
    pub units_taken: u64,
    /// Leases ended by this instance (at the next lease, by a sweep, or on release).
    pub leases_returned: u64,
    /// Admissions left unspent when leases ended (given back when nobody else decided
    /// the key since, or when the lease's deadline had not passed; else they come back
    /// as the key refills).
    pub units_returned: u64,
    /// Leases whose deadline passed with admissions unspent.
    pub leases_expired: u64,
    /// Requests decided locally, without a round trip.
    pub local_decisions: u64,
    /// Lease calls to Redis.
    pub redis_calls: u64,
}

/// Sums counters (e.g. of every leased limit of a service).
impl std::ops::AddAssign for LeaseStats {
    fn add_assign(&mut self, o: LeaseStats) {
        self.leases_taken += o.leases_taken;
        self.units_taken += o.units_taken;
        self.leases_returned += o.leases_returned;
        self.units_returned += o.units_returned;
        self.leases_expired += o.leases_expired;
        self.local_decisions += o.local_decisions;
        self.redis_calls += o.redis_calls;
    }
}

/// One key's lease, as this instance holds it.
struct Held {
    /// Admissions of the slice not spent yet.
    left: u64,
    /// Local time (us) from which the slice must not be spent.
    deadline: u64,
    /// The deadline by Redis's time (its unspent part may be refunded until then).
    redis_deadline: u64,
    /// Redis time minus local time, as a lower bound (local decisions never run ahead).
    offset: i64,
    /// The key's states from the snapshot, with this instance's admissions applied.
    states: Vec<PolicyState>,
    /// The states the lease left in Redis (to tell whether anyone decided since).
    charged: Vec<String>,
    /// The size asked for and granted, and whether the slice ran out before its
    /// deadline.
    want: u64,
    granted: u64,
    ran_out: bool,
}

/// What this instance knows of one key.
#[derive(Default)]
struct Key {
    held: Option<Held>,
    /// After a lease was denied: until when (local us) a try of at least this cost is
    /// rejected without asking (other instances can only make that instant later).
    blocked: Option<(u64, u64)>,
    /// The slice size asked for last.
    want: u64,
}

type Cell = Arc<tokio::sync::Mutex<Key>>;

struct Inner {
    store: RedisStore,
    name: String,
    rules: RuleSet,
    wire: Arc<Wire>,
    keys: Mutex<HashMap<String, Cell>>,
    /// The same limit without leases (the same keys), for what is not leased.
    unleased: super::RedisLimiter,
    duration_us: u64,
    max_slice: u64,
    clock: MonotonicClock,
    stats: [AtomicU64; 7],
}

/// Per-key limits kept in Redis, with hot keys decided locally from leased slices (see
/// the module documentation). Shares its keys with a [`RedisLimiter`](super::RedisLimiter)
/// of the same name and rules, so leased and unleased instances keep one limit.
///
/// Cheap to clone. Keys are strings. Only `try` is leased: `acquire`, `peek` go to
/// Redis as [`RedisLimiter`](super::RedisLimiter) does.
#[derive(Clone)]
pub struct LeasedLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LeasedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("name", &self.inner.name)
            .field("rules", &self.inner.rules)
            .finish()
    }
}

enum Stat {
    Taken = 0,
    UnitsTaken = 1,
    Returned = 2,
    UnitsReturned = 3,
    Expired = 4,
    Local = 5,
    Calls = 6,
}

/// What a lease call answered.
enum Answer {
    Granted(Grant),
    Denied { retry_us: u64 },
}

/// A slice Redis granted: at Redis time `now`, `granted` units until `deadline`, with
/// each policy's state (`snapshots`) and what the slice charged (`charged`).
struct Grant {
    now: u64,
    granted: u64,
    deadline: u64,
    snapshots: Vec<String>,
    charged: Vec<String>,
}

impl LeasedLimiter {
    /// A leased limiter named `name` on `store`. Refuses rules a lease cannot keep
    /// exactly (algorithms other than gcra, token-bucket, leaky-bucket, fixed-window
    /// and sliding-window; shadow policies) and a slice larger than the smallest limit.
    pub fn new(
        store: RedisStore,
        name: &str,
        rules: impl Into<RuleSet>,
        opts: LeaseOptions,
    ) -> Result<LeasedLimiter, Error> {
        let rules = rules.into();
        if opts.redis.window_counters {
            return Err(Error::Config(
                "a leased limiter keeps its states for the lease script: window_counters must be off".into(),
            ));
        }
        // Checks the name, and the rules against the store.
        let unleased =
            super::RedisLimiter::with_options(store.clone(), name, rules.clone(), opts.redis)?;
        for p in rules.policies() {
            leasable(p).map_err(Error::Unsupported)?;
        }
        let burst = smallest_limit(&rules);
        let max_slice = opts.max_slice.unwrap_or((burst / 4).max(1));
        if max_slice == 0 || max_slice > burst {
            return Err(Error::Config(format!(
                "lease slice {max_slice} must be between 1 and the smallest limit of the rules ({burst}): a slice must fit at once"
            )));
        }
        let duration_us = u64::try_from(opts.duration.as_micros()).unwrap_or(u64::MAX);
        if duration_us == 0 {
            return Err(Error::Config("lease duration must be positive".into()));
        }
        let wire = Arc::new(Wire::new(&rules, store.options().ttl_margin, false)?);
        let limiter = LeasedLimiter {
            inner: Arc::new(Inner {
                unleased,
                store,
                name: name.to_owned(),
                rules,
                wire,
                keys: Mutex::new(HashMap::new()),
                duration_us,
                max_slice,
                clock: MonotonicClock::new(),
                stats: Default::default(),
            }),
        };
        limiter.start_sweeper();
        Ok(limiter)
    }

    /// On a Tokio runtime, a task that ends expired leases and forgets idle keys every
    /// `max(4 x duration, 1 s)` while the limiter lives (without one, call
    /// [`LeasedLimiter::release_expired`] yourself).
    fn start_sweeper(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let every = Duration::from_micros(self.inner.duration_us.saturating_mul(4))
            .max(Duration::from_secs(1));
        let weak = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                let _ = LeasedLimiter { inner }.release_expired().await;
            }
        });
    }

    /// Its counters now: leases taken and returned, units taken, returned and expired, local decisions, Redis calls.
    pub fn stats(&self) -> LeaseStats {
        let s = |i: Stat| self.inner.stats[i as usize].load(Ordering::Relaxed);
        LeaseStats {
            leases_taken: s(Stat::Taken),
            units_taken: s(Stat::UnitsTaken),
            leases_returned: s(Stat::Returned),
            units_returned: s(Stat::UnitsReturned),
            leases_expired: s(Stat::Expired),
            local_decisions: s(Stat::Local),
            redis_calls: s(Stat::Calls),
        }
    }

    /// The counters of its calls to Redis (leases, and what is not leased), summed
    /// over the nodes, as [`RedisLimiter::stats`](super::RedisLimiter::stats) counts
    /// them: answered, failed, decided by the failure policy.
    pub fn redis_stats(&self) -> super::RedisStats {
        self.unleased().stats()
    }

    /// [`LeasedLimiter::redis_stats`] by Redis node (see
    /// [`RedisLimiter::node_stats`](super::RedisLimiter::node_stats)).
    pub fn node_stats(&self) -> Vec<(Arc<str>, super::RedisStats)> {
        self.unleased().node_stats()
    }

    /// The rule set the leases are taken for.
    pub fn rules(&self) -> RuleSet {
        self.inner.rules.clone()
    }

    fn count(&self, stat: Stat, n: u64) {
        self.inner.stats[stat as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn cell(&self, key: &str) -> Cell {
        let mut keys = self.inner.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.entry(key.to_owned()).or_default().clone()
    }

    /// A try at a time the caller gives (us; the same time
    /// base for Redis and local decisions, as `tollgate replay` and tests use).
    pub async fn check_at(&self, key: &str, now: u64, cost: u64) -> Result<RuleDecision, Error> {
        self.decide(key, cost, Some(now)).await
    }

    async fn decide(&self, key: &str, cost: u64, at: Option<u64>) -> Result<RuleDecision, Error> {
        self.inner.wire.check_cost(&self.inner.rules, cost)?;
        let rules = &self.inner.rules;
        let cell = self.cell(key);
        let mut entry = cell.lock().await;
        let Key {
            held,
            blocked,
            want,
        } = &mut *entry;
        let local_now = at.unwrap_or_else(|| self.inner.clock.now_us());
        if let Some(h) = held.as_mut() {
            if local_now < h.deadline && h.left >= cost {
                let now = redis_time(local_now, h.offset);
                let d = rules.check(&mut h.states, now, cost, Op::Try)?;
                if d.decision.allowed {
                    h.left -= cost;
                }
                self.count(Stat::Local, 1);
                return Ok(d);
            }
            h.ran_out = local_now < h.deadline;
        }
        match *blocked {
            Some((until, c)) if local_now < until && cost >= c => {
                self.count(Stat::Local, 1);
                return Ok(self.rejected(until - local_now));
            }
            _ => *blocked = None,
        }
        // A new lease: it ends the one held (if any) in the same call. Slow start:
        // double while slices run out early, else what the last one used.
        *want = match held.as_ref() {
            Some(h) if h.ran_out => (h.want * 2).min(self.inner.max_slice),
            Some(h) => (h.granted - h.left).clamp(1, self.inner.max_slice),
            None => (*want).clamp(1, self.inner.max_slice),
        }
        .max(cost);
        let sent = self.inner.clock.now_us();
        let answer = match self.call(key, held.as_ref(), *want, cost, at).await? {
            Guarded::Answered(answer) => answer,
            // The key's node is failing: the failure policy decides (the slice held,
            // if any, is ended once the node answers again).
            Guarded::Failing(health, err) => {
                return self
                    .unleased()
                    .fallback_of(&health, key, cost, Op::Try, err)
            }
        };
        if let Some(h) = held.take() {
            self.ended(&h, local_now);
        }
        match answer {
            Answer::Denied { retry_us } => {
                *blocked = Some((at.unwrap_or(sent).saturating_add(retry_us), cost));
                Ok(self.rejected(retry_us))
            }
            Answer::Granted(grant) => {
                self.count(Stat::Taken, 1);
                self.count(Stat::UnitsTaken, grant.granted);
                let (mut h, now) = self.held(grant, at, sent, *want)?;
                let d = rules.check(&mut h.states, now, cost, Op::Try)?;
                if d.decision.allowed {
                    h.left = h.left.saturating_sub(cost);
                }
                *held = Some(h);
                Ok(d)
            }
        }
    }

    /// The slice `grant` as this instance holds it: its states, and its deadline and
    /// clock offset in local time (`at`: replay time, which is Redis time; `sent`: the
    /// local instant the call went out), with the Redis time it was granted at.
    fn held(
        &self,
        grant: Grant,
        at: Option<u64>,
        sent: u64,
        want: u64,
    ) -> Result<(Held, u64), Error> {
        let received = self.inner.clock.now_us();
        let Grant {
            now,
            granted,
            deadline,
            snapshots,
            charged,
        } = grant;
        let states = (self.inner.rules.policies().iter())
            .zip(&snapshots)
            .map(|(p, s)| parse_state(p, s, now))
            .collect::<Result<Vec<_>, _>>()?;
        let (offset, local_deadline) = match at {
            Some(_) => (0, deadline),
            // Redis granted at `now`, after `sent` and before `received`: the slice
            // ends by the local clock no later than by Redis's, and local decisions
            // never see a later time than Redis would.
            None => (
                now as i64 - received as i64,
                sent.saturating_add(deadline.saturating_sub(now)),
            ),
        };
        let held = Held {
            left: granted,
            deadline: local_deadline,
            redis_deadline: deadline,
            offset,
            states,
            charged,
            want,
            granted,
            ran_out: false,
        };
        Ok((held, now))
    }

    /// A reject with nothing left until `retry_us` from now.
    fn rejected(&self, retry_us: u64) -> RuleDecision {
        let rules = &self.inner.rules;
        let limit = smallest_limit(rules);
        let d = Decision::rejected(limit, 0, retry_us, Some(retry_us));
        RuleDecision {
            decision: d,
            binding: 0,
            policies: vec![d; rules.policies().len()],
        }
    }

    /// Counts a lease ended by a call.
    fn ended(&self, h: &Held, local_now: u64) {
        self.count(Stat::Returned, 1);
        self.count(Stat::UnitsReturned, h.left);
        if h.left > 0 && local_now >= h.deadline {
            self.count(Stat::Expired, 1);
        }
    }

    /// Ends every lease this instance holds (e.g. at shutdown), giving unspent
    /// admissions back. Keys being decided meanwhile are skipped.
    pub async fn release_all(&self) -> Result<(), Error> {
        self.sweep(true).await
    }

    /// Ends the leases whose deadline has passed (their unspent admissions go back
    /// where that is safe) and forgets the keys that hold none; a background task runs
    /// it when the limiter is made on a Tokio runtime.
    pub async fn release_expired(&self) -> Result<(), Error> {
        self.sweep(false).await
    }

    async fn sweep(&self, all: bool) -> Result<(), Error> {
        let cells: Vec<(String, Cell)> = {
            let keys = self.inner.keys.lock().unwrap_or_else(|e| e.into_inner());
            keys.iter().map(|(k, c)| (k.clone(), c.clone())).collect()
        };
        let now = self.inner.clock.now_us();
        let mut first_error = None;
        for (key, cell) in cells {
            let Ok(mut entry) = cell.try_lock() else {
                continue;
            };
            let due = match entry.held.as_ref() {
                Some(h) => all || now >= h.deadline,
                None => entry.blocked.is_none_or(|(until, _)| now >= until),
            };
            if !due {
                continue;
            }
            if let Some(h) = entry.held.as_ref() {
                // A key whose node fails is ended at a later sweep (the other keys'
                // nodes may answer); its failure is said, not hidden.
                let failed = match self.call(&key, Some(h), 0, 0, None).await {
                    Ok(Guarded::Answered(_)) => None,
                    Ok(Guarded::Failing(_, Some(e))) | Err(e) => Some(e),
                    Ok(Guarded::Failing(_, None)) if all => Some(Error::Unavailable(format!(
                        "the lease of a key on node {} was not ended: the node is failing",
                        self.inner.store.node_name(self.node(&key))
                    ))),
                    Ok(Guarded::Failing(_, None)) => continue,
                };
                if let Some(e) = failed {
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            if let Some(h) = entry.held.take() {
                self.ended(&h, now);
            }
            drop(entry);
            let mut keys = self.inner.keys.lock().unwrap_or_else(|e| e.into_inner());
            // Forget the key unless someone took its cell meanwhile.
            if keys.get(&key).is_some_and(|c| Arc::strong_count(c) <= 2) {
                keys.remove(&key);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One lease call: ends `held` (if any) and asks for `want` (at least `need`).
    /// Sent under the health of the key's node: not sent while it fails and no probe
    /// is due.
    async fn call(
        &self,
        key: &str,
        held: Option<&Held>,
        want: u64,
        need: u64,
        at: Option<u64>,
    ) -> Result<Guarded<Answer>, Error> {
        let inner = &self.inner;
        let keys = inner.store.keys(&inner.name, key, &inner.wire.suffixes);
        let mine: Vec<String> = match held {
            Some(h) => (inner.rules.policies().iter())
                .zip(&h.states)
                .map(|(p, s)| encode_state(p, s))
                .collect::<Result<_, _>>()?,
            None => Vec::new(),
        };
        let unspent = held.map_or(0, |h| h.left);
        let wire = &inner.wire;
        let push = |cmd: &mut redis::Cmd, form: super::call::Form| {
            push_one(cmd, &keys, wire, form);
            cmd.arg(want)
                .arg(need)
                .arg(inner.duration_us)
                .arg(unspent)
                .arg(held.map_or(0, |h| h.redis_deadline));
            push_times(cmd, at, at);
            match held {
                Some(h) => {
                    for (charged, mine) in h.charged.iter().zip(&mine) {
                        cmd.arg(charged.as_str()).arg(mine.as_str());
                    }
                }
                None => {
                    for _ in &keys {
                        cmd.arg("").arg("");
                    }
                }
            }
        };
        let (_, node) = inner.store.place(&keys[0]);
        let lease = async {
            self.count(Stat::Calls, 1);
            let value = (inner.store.caller())
                .lease(node, wire.families, &push)
                .await?;
            parse_answer(value, keys.len())
        };
        self.unleased().guarded(node, lease).await
    }
}

/// The smallest headline limit of `rules`: the most one slice can hold.
fn smallest_limit(rules: &RuleSet) -> u64 {
    rules
        .policies()
        .iter()
        .map(|p| p.limit())
        .min()
        .unwrap_or(1)
}

fn redis_time(local: u64, offset: i64) -> u64 {
    (local as i64).saturating_add(offset).max(0) as u64
}

fn parse_answer(value: Value, n: usize) -> Result<Answer, Error> {
    let bad = |what: &str| Error::Store(format!("lease reply: {what}"));
    let Value::Array(items) = value else {
        return Err(bad("not an array"));
    };
    let int = |v: &Value| match v {
        Value::Int(i) => u64::try_from(*i).map_err(|_| bad("negative number")),
        _ => Err(bad("expected an integer")),
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| bad("not UTF-8")),
        _ => Err(bad("expected a state string")),
    };
    if items.len() < 3 {
        return Err(bad("too short"));
    }
    let now = int(&items[0])?;
    let granted = int(&items[1])?;
    if granted == 0 {
        return Ok(Answer::Denied {
            retry_us: int(&items[2])?,
        });
    }
    if items.len() != 3 + 2 * n {
        return Err(bad("wrong number of states"));
    }
    let mut snapshots = Vec::with_capacity(n);
    let mut charged = Vec::with_capacity(n);
    for pair in items[3..].chunks(2) {
        snapshots.push(text(&pair[0])?);
        charged.push(text(&pair[1])?);
    }
    Ok(Answer::Granted(Grant {
        now,
        granted,
        deadline: int(&items[2])?,
        snapshots,
        charged,
    }))
}

/// The leased store behind the one limiter interface: tries are decided locally from
/// the key's slice while it lasts, else with a new lease (which ends the previous
/// one); acquire, charge, peek, refund and reset go to Redis (a held slice of the key
/// is ended first).
impl RateLimiter for LeasedLimiter {
    async fn check_rules(&self, key: &str, cost: u64, op: Op) -> Result<RuleDecision, Error> {
        match op {
            Op::Try => self.decide(key, cost, None).await,
            _ => {
                self.end(key).await?;
                self.unleased().check_rules(key, cost, op).await
            }
        }
    }

    /// Without the trait's pacing refusal, which reads (clones) the rules on every
    /// call: a lease keeps no algorithm that paces (`new` refuses them).
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        Ok(self.check_rules(key, cost, Op::Try).await?.decision)
    }

    async fn peek(&self, key: &str, cost: u64) -> Result<RuleDecision, Error> {
        self.unleased().peek(key, cost).await
    }

    async fn refund(&self, key: &str, cost: u64) -> Result<(), Error> {
        self.end(key).await?;
        self.unleased().refund(key, cost).await
    }

    async fn reset(&self, key: &str) -> Result<(), Error> {
        let cell = self.cell(key);
        *cell.lock().await = Key::default();
        self.unleased().reset(key).await
    }

    async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.end(key).await?;
        self.unleased().acquire(key, cost).await
    }

    fn rules(&self) -> RuleSet {
        LeasedLimiter::rules(self)
    }

    fn set_rules(&self, _rules: RuleSet) -> Result<(), Error> {
        Err(Error::Unsupported(
            "a leased limiter keeps its rules; make a new one".into(),
        ))
    }
}

crate::rate_limiter::string_keys!(LeasedLimiter);

impl LeasedLimiter {
    fn unleased(&self) -> &super::RedisLimiter {
        &self.inner.unleased
    }

    /// The index of the node that holds `key`.
    fn node(&self, key: &str) -> usize {
        let inner = &self.inner;
        let keys = inner.store.keys(&inner.name, key, &inner.wire.suffixes);
        inner.store.place(&keys[0]).1
    }

    /// Ends `key`'s lease, if this instance holds one.
    async fn end(&self, key: &str) -> Result<(), Error> {
        let cell = self.cell(key);
        let mut entry = cell.lock().await;
        entry.blocked = None;
        if let Some(h) = entry.held.as_ref() {
            // While the key's node fails, the slice stays held (it is ended at the
            // next call that reaches the node); what follows takes the failure policy.
            if let Guarded::Answered(_) = self.call(key, Some(h), 0, 0, None).await? {
                let h = entry.held.take().expect("checked above");
                self.ended(&h, self.inner.clock.now_us());
            }
        }
        Ok(())
    }
}
