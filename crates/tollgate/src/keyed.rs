//! [`KeyedLimiter`]: one limit per key, for millions of keys, in bounded memory.

use std::borrow::Borrow;
use std::cell::UnsafeCell;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use arc_swap::ArcSwap;
use hashbrown::HashTable;

use crate::reader_gate::{ReaderGate, Shut};
use crate::tat_table::TatTable;
use crate::Error;
use tollgate_core::algorithms::GcraState;
use tollgate_core::{
    CheckError, Clock, Decision, MonotonicClock, Op, PolicyState, RuleDecision, RuleSet,
};

use crate::fast_gcra::{Config, FastGcra};
use crate::wait::{block, sleep_or_refund, RefundOnDrop, Turns};

/// What a full keyed limiter does with a new key (after dropping idle ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFull {
    /// Evict the least recently active keys to make room (nginx's choice). An evicted
    /// key starts afresh if it returns: its limit resets.
    #[default]
    EvictLeastRecent,
    /// Refuse new keys ([`Error::TooManyKeys`]); known keys are unaffected.
    RefuseNew,
}

/// How a [`KeyedLimiter`] keeps its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedOptions {
    /// The most keys held at once (default 1,000,000). Enforced per shard: each of the
    /// `S` shards holds at most `max_keys / S` (rounded up).
    pub max_keys: usize,
    /// What happens to a new key when the limiter is full.
    pub on_full: OnFull,
}

impl Default for KeyedOptions {
    fn default() -> Self {
        KeyedOptions {
            max_keys: 1_000_000,
            on_full: OnFull::EvictLeastRecent,
        }
    }
}

/// Counters of a keyed limiter's memory management.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyedStats {
    /// Keys held now.
    pub keys: usize,
    /// Keys stored since the limiter was made (a key that was dropped and comes back
    /// counts again): with a steady set of keys this stops growing once each is in.
    pub inserted: u64,
    /// Sweeps of a shard for idle keys (before its table grows, or when it is full).
    pub sweeps: u64,
    /// Fully replenished keys dropped by sweeps (they decided nothing).
    pub dropped_idle: u64,
    /// Live keys evicted to make room ([`OnFull::EvictLeastRecent`]).
    pub evicted: u64,
    /// New keys refused ([`OnFull::RefuseNew`]).
    pub refused: u64,
}

/// What a keyed decision is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// Decide and apply; the overall decision is enough.
    Apply,
    /// Decide and apply; report every policy.
    Detailed,
    /// Decide only; report every policy.
    Peek,
}

/// A decision, with every policy's when asked for.
enum KeyedDecision {
    One(Decision),
    Rules(RuleDecision),
}

impl KeyedDecision {
    #[inline(always)]
    fn decision(self) -> Decision {
        match self {
            KeyedDecision::One(d) => d,
            KeyedDecision::Rules(r) => r.decision,
        }
    }

    fn detailed(self) -> RuleDecision {
        match self {
            KeyedDecision::One(d) => RuleDecision::from(d),
            KeyedDecision::Rules(r) => r,
        }
    }
}

/// A shard's table grows without a sweep below this many keys.
const MIN_SWEEP: usize = 256;
/// Entries sampled to find the least recently active eighth of a full shard.
const EVICT_SAMPLE: usize = 64;
/// A shard full of live keys that refuses new ones sweeps at most this often (us).
const REFUSE_SWEEP_INTERVAL_US: u64 = 10_000;

#[repr(align(128))]
struct Padded<T>(T);

/// One shard: its lock, and the part the GCRA fast path reads.
///
/// `fast` is read with the lock held (read or write), or, for flat words (plain
/// keys), inside `gate.read` without the lock: that is the lock-free check. It is
/// changed only with the write lock held: a key goes into an empty flat slot while
/// readers probe ([`TatTable::insert_shared`]); anything else (growth, removal, sweeps,
/// migration) also shuts the gate ([`ShardCell::fast_mut`]).
struct ShardCell<K> {
    lock: RwLock<Shard<K>>,
    gate: ReaderGate,
    fast: UnsafeCell<FastShard<K>>,
}

// SAFETY: `fast` is shared and changed only as the type's doc says: readers hold the
// lock or are inside the gate, writers hold the write lock and shut the gate to
// change more than atomics and empty slots.
unsafe impl<K: Send + Sync> Sync for ShardCell<K> {}

/// What the fast path reads of a shard.
struct FastShard<K> {
    /// The configuration the shard's entries are kept for.
    config: Arc<Config>,
    version: u64,
    /// GCRA fast path: one TAT per key, updated by compare-and-swap.
    tats: TatTable<K>,
}

/// The rest of a shard, behind its lock.
struct Shard<K> {
    /// Every configuration but a single GCRA policy: one state per policy.
    states: HashTable<(K, Vec<PolicyState>)>,
    sweep: Sweep,
}

/// The fast part of a shard, exclusively (the gate shut for flat words).
struct FastMut<'a, K> {
    fast: &'a mut FastShard<K>,
    _shut: Option<Shut<'a>>,
}

impl<K> ShardCell<K> {
    /// The fast part, shared.
    ///
    /// # Safety
    /// The caller holds `lock`, or is inside `gate.read` and the words are flat.
    #[inline(always)]
    unsafe fn fast(&self) -> &FastShard<K> {
        // SAFETY: no `FastMut` exists meanwhile: it needs the write lock and, for
        // flat words, a shut gate.
        unsafe { &*self.fast.get() }
    }

    /// The fast part, exclusively: shuts the gate (flat words) until the result drops.
    ///
    /// # Safety
    /// The caller holds `lock` for writing and no reference from [`Self::fast`].
    unsafe fn fast_mut(&self) -> FastMut<'_, K> {
        let shut = TatTable::<K>::FLAT.then(|| self.gate.shut());
        FastMut {
            // SAFETY: other lock holders are excluded by the write lock, gate readers
            // by the shut gate (hashbrown words have none).
            fast: unsafe { &mut *self.fast.get() },
            _shut: shut,
        }
    }
}

/// When a shard last swept.
#[derive(Default)]
struct Sweep {
    /// When the shard's table last grew (us; 0 for a new shard): a sweep before it
    /// grows again drops the keys that were already idle then and not asked for since.
    grown_at: u64,
    /// While refusing new keys, no sweep before this time (us).
    not_before: u64,
}

struct Inner<K, C> {
    clock: C,
    config: ArcSwap<Config>,
    version: AtomicU64,
    shards: Box<[Padded<ShardCell<K>>]>,
    /// `shards - 1`: a shard is picked by hash bits 32.. (hashbrown takes its bucket
    /// from the low bits and its tag from the top seven, which must stay varied
    /// within a shard).
    shard_mask: usize,
    /// foldhash's quality variant: the fast one leaves bits 32.. uneven for
    /// sequential integers under some process seeds (40,000 sequential ids put up to
    /// 1.7 times the mean in one shard in 2 processes of 400), and a shard fills at
    /// `max_keys / shards`. No measurable cost on the keyed benches.
    hasher: foldhash::quality::RandomState,
    per_shard: usize,
    options: KeyedOptions,
    inserted: AtomicU64,
    sweeps: AtomicU64,
    dropped_idle: AtomicU64,
    evicted: AtomicU64,
    refused: AtomicU64,
    /// The order its waiters come back in (boxed: off the decision's cache lines).
    turns: Box<Turns>,
}

/// One limit per key: any `Hash + Eq` key, including compound keys such as
/// `(route, user_id)`. `Send + Sync`, cheap to clone (every clone shares the state).
///
/// Keys live in a sharded hash map. A single GCRA policy keeps one u64 per key; for
/// plain keys (at most 32 bytes, owning no memory: integers, IP addresses, small
/// tuples) each key sits beside its word in one flat array, so a check reads one cache
/// line, takes no lock (one compare-and-swap on the word; threads writing nothing
/// shared otherwise) and an entry is 16 bytes for a u64 key (the array is 53-80 %
/// full). Other keys (`String`) take the shard's read lock for the same
/// compare-and-swap; other policies and rule sets keep their states per key under the
/// shard's lock.
/// Memory is bounded by [`KeyedOptions::max_keys`]: fully replenished keys (which decide
/// nothing) are dropped by a sweep of one shard at a time, before its table grows
/// (only keys already idle at the previous sweep: a key that replenishes between
/// requests but comes back stays) or when it is full (every idle key); if it is still
/// full, the least recently active eighth of the shard is evicted, or new keys are
/// refused ([`OnFull`]).
///
/// ```
/// use tollgate::{KeyedLimiter, Policy};
/// let limiter: KeyedLimiter<String> = KeyedLimiter::new("gcra:rate=1/s,burst=2".parse::<Policy>()?);
/// assert!(limiter.check("alice", 1)?.allowed);
/// assert!(limiter.check("alice", 1)?.allowed);
/// assert!(!limiter.check("alice", 1)?.allowed);
/// assert!(limiter.check("bob", 1)?.allowed); // every key has its own limit
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLimiter<K, C: Clock = MonotonicClock> {
    inner: Arc<Inner<K, C>>,
}

impl<K, C: Clock> Clone for KeyedLimiter<K, C> {
    fn clone(&self) -> Self {
        KeyedLimiter {
            inner: self.inner.clone(),
        }
    }
}

impl<K, C: Clock> std::fmt::Debug for KeyedLimiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("rules", &self.inner.config.load().rules)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq> KeyedLimiter<K, MonotonicClock> {
    /// A keyed limiter for `rules` with default options, on the monotonic clock.
    pub fn new(rules: impl Into<RuleSet>) -> Self {
        Self::with_options(rules, KeyedOptions::default(), MonotonicClock::new())
    }
}

impl<K: Hash + Eq, C: Clock> KeyedLimiter<K, C> {
    /// A keyed limiter for `rules` with default options on `clock` (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests), as
    /// [`Limiter::with_clock`](crate::Limiter::with_clock) is for one key.
    pub fn with_clock(rules: impl Into<RuleSet>, clock: C) -> Self {
        Self::with_options(rules, KeyedOptions::default(), clock)
    }
}

impl<K: Hash + Eq, C: Clock> KeyedLimiter<K, C> {
    /// A keyed limiter for `rules` with `options` on `clock`.
    ///
    /// # Panics
    ///
    /// When `options.max_keys` is 0 (a limiter that can hold no key limits nothing).
    pub fn with_options(rules: impl Into<RuleSet>, options: KeyedOptions, clock: C) -> Self {
        assert!(
            options.max_keys > 0,
            "KeyedOptions::max_keys must be at least 1: a limiter that can hold no key limits nothing"
        );
        let max_keys = options.max_keys;
        // About 4096 keys per shard, between 1 and 64 shards (a power of two).
        let wanted = (max_keys / 4096).clamp(1, 64);
        let shards = 1usize << (usize::BITS - 1 - wanted.leading_zeros());
        let per_shard = max_keys.div_ceil(shards);
        let config = Arc::new(Config::new(rules.into()));
        let shard_vec = (0..shards)
            .map(|_| {
                Padded(ShardCell {
                    lock: RwLock::new(Shard {
                        states: HashTable::new(),
                        sweep: Sweep::default(),
                    }),
                    gate: ReaderGate::new(),
                    fast: UnsafeCell::new(FastShard {
                        config: config.clone(),
                        version: 0,
                        tats: TatTable::default(),
                    }),
                })
            })
            .collect();
        KeyedLimiter {
            inner: Arc::new(Inner {
                clock,
                config: ArcSwap::new(config),
                version: AtomicU64::new(0),
                shards: shard_vec,
                shard_mask: shards - 1,
                hasher: foldhash::quality::RandomState::default(),
                per_shard,
                options: KeyedOptions {
                    max_keys,
                    ..options
                },
                inserted: AtomicU64::new(0),
                sweeps: AtomicU64::new(0),
                dropped_idle: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                turns: Box::default(),
            }),
        }
    }

    /// The clock decisions are read from (a `ManualClock` in tests).
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// The rule set in force.
    pub fn rules(&self) -> RuleSet {
        self.inner.config.load().rules.clone()
    }

    /// Tries `cost` units for `key` now. Refused with [`Error::Paces`] for rules that
    /// pace (a `shaper`, a delaying `limit-req`), whose admitted tries carry a wait to
    /// sleep before the work: [`KeyedLimiter::acquire`] sleeps it (or
    /// [`KeyedLimiter::check_rules`] with `Op::Try` reports it).
    #[inline]
    pub fn check<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, cost, Op::Try, Asked::Apply)
            .map(KeyedDecision::decision)
    }

    /// Tries one unit for `key` now and says only whether it is admitted: the same
    /// decision as [`KeyedLimiter::check`]`(key, 1)?.allowed`, with the same effect on the
    /// key's state.
    ///
    /// For a single GCRA policy, a key already held is decided from its word alone, with
    /// none of the arithmetic of `remaining`, `reset_after` and `retry_after`: the check
    /// is then little more than the memory access that finds the key, and a loop of
    /// checks over many keys lets one key's cache miss overlap the next one's (governor's
    /// `check_key(..).is_ok()` is the like of it). Use [`KeyedLimiter::check`] when the
    /// caller reports headers or waits.
    ///
    /// ```
    /// use tollgate::{KeyedLimiter, Policy};
    /// let limiter: KeyedLimiter<u64> = KeyedLimiter::new("gcra:rate=1/s,burst=2".parse::<Policy>()?);
    /// assert!(limiter.allow(&7)?);
    /// assert!(limiter.allow(&7)?);
    /// assert!(!limiter.allow(&7)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn allow<Q>(&self, key: &Q) -> Result<bool, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.inner.clock.now_us();
        let hash = self.inner.hasher.hash_one(key);
        let known = |f: &FastShard<K>| {
            let fast = f.config.fast?;
            let tat = f.tats.find(hash, |k| k.borrow() == key)?;
            Some(fast.admit_word(tat, now))
        };
        if let Some(admitted) = self.quick(hash, known) {
            return Ok(admitted);
        }
        Ok(self
            .decide(key, 1, Op::Try, Asked::Apply)?
            .decision()
            .allowed)
    }

    /// Decides a request of `cost` for `key` with `op` (see [`RateLimiter::check_rules`](crate::RateLimiter::check_rules)),
    /// reporting every policy of the rule set.
    pub fn check_rules<Q>(&self, key: &Q, cost: u64, op: Op) -> Result<RuleDecision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, cost, op, Asked::Detailed)
            .map(KeyedDecision::detailed)
    }

    /// Charges `cost` units of work already done to `key` (LLM tokens, bytes, rows):
    /// no limit test, so the key may go into debt, up to each policy's `max-debt`.
    /// Always admitted; `remaining` is 0 while in debt and `retry_after` says when a
    /// unit request fits again (see [`tollgate_core::Policy::charge`]). A cost of 0
    /// changes nothing; `shaper` and `concurrency` refuse.
    ///
    /// ```
    /// use tollgate::{KeyedLimiter, Policy};
    /// let tokens = KeyedLimiter::<String>::new("fixed-window:limit=10000,window=1m".parse::<Policy>()?);
    /// // Before the completion: is any budget left?
    /// assert!(tokens.check("api-key-1", 1)?.allowed);
    /// // After it: charge what it used, 12,000 tokens (less the 1 of the check).
    /// let d = tokens.charge("api-key-1", 11_999)?.decision;
    /// assert_eq!(d.remaining, 0);
    /// assert!(!tokens.check("api-key-1", 1)?.allowed); // in debt until the window ends
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge<Q>(&self, key: &Q, cost: u64) -> Result<RuleDecision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_rules(key, cost, Op::Charge)
    }

    /// The decision a try of `cost` would get now for `key`, changing nothing (an
    /// unknown key is not stored; cost 0: the states as they stand).
    pub fn peek<Q>(&self, key: &Q, cost: u64) -> Result<RuleDecision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.decide(key, cost, Op::Try, Asked::Peek)
            .map(KeyedDecision::detailed)
    }

    /// Gives back `cost` units admitted earlier for `key`.
    pub fn refund<Q>(&self, key: &Q, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.inner.clock.now_us();
        let hash = self.inner.hasher.hash_one(key);
        // Checks compare-and-swap the word without the lock: so does a refund.
        let refund_word = |f: &FastShard<K>| {
            let fast = f.config.fast?;
            if let Some(tat) = f.tats.find(hash, |k| k.borrow() == key) {
                let _ = tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    Some(fast.refunded(t, now, cost))
                });
            }
            Some(())
        };
        if self.quick(hash, refund_word).is_some() {
            return;
        }
        let (cell, mut shard, now) = self.shard(hash);
        // SAFETY: the write lock is held.
        let f = unsafe { cell.fast() };
        if refund_word(f).is_none() {
            if let Some((_, states)) = shard.states.find_mut(hash, |(k, _)| k.borrow() == key) {
                f.config.rules.refund(states, now, cost);
            }
        }
    }

    /// Forgets `key`'s state: its next decision is a new key's. (A plain key under a
    /// single GCRA policy stays counted in [`Self::len`], fully replenished, until a
    /// sweep drops it.)
    pub fn reset<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.inner.hasher.hash_one(key);
        let (cell, mut shard, _) = self.shard(hash);
        let hasher = &self.inner.hasher;
        if TatTable::<K>::FLAT {
            // A flat word is not removed (that moves entries, which shuts readers
            // out): it is set fully replenished, deciding exactly as a new key, and
            // the next sweep drops it as idle.
            // SAFETY: the write lock is held.
            if let Some(tat) = unsafe { cell.fast() }
                .tats
                .find(hash, |k| k.borrow() == key)
            {
                tat.store(0, Ordering::Release);
            }
        } else {
            // SAFETY: the write lock is held; hashbrown words have no gate readers.
            unsafe { cell.fast_mut() }.fast.tats.remove(
                hash,
                |k| k.borrow() == key,
                |k| hasher.hash_one(k),
            );
        }
        if let Ok(e) = shard.states.find_entry(hash, |(k, _)| k.borrow() == key) {
            e.remove();
        }
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|cell| {
                let shard = read(&cell.0.lock);
                // SAFETY: the read lock is held.
                unsafe { cell.0.fast() }.tats.len() + shard.states.len()
            })
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Memory-management counters.
    pub fn stats(&self) -> KeyedStats {
        KeyedStats {
            keys: self.len(),
            inserted: self.inner.inserted.load(Ordering::Relaxed),
            sweeps: self.inner.sweeps.load(Ordering::Relaxed),
            dropped_idle: self.inner.dropped_idle.load(Ordering::Relaxed),
            evicted: self.inner.evicted.load(Ordering::Relaxed),
            refused: self.inner.refused.load(Ordering::Relaxed),
        }
    }

    /// Replaces the policy or rule set at run time, for every key and clone. Each
    /// key's state carries over where it keeps its meaning ([`RuleSet::carry_over`]);
    /// shards convert lazily, on their next use.
    pub fn set_rules(&self, rules: impl Into<RuleSet>) {
        let config = Arc::new(Config::new(rules.into()));
        // Publish the config before the version, so a shard that sees the new version
        // also sees the new config.
        self.inner.config.store(config);
        self.inner.version.fetch_add(1, Ordering::AcqRel);
    }

    fn shard_index(&self, hash: u64) -> usize {
        (hash >> 32) as usize & self.inner.shard_mask
    }

    /// Write-locks the shard of `hash`, bringing it to the current configuration.
    fn shard(&self, hash: u64) -> (&ShardCell<K>, RwLockWriteGuard<'_, Shard<K>>, u64) {
        let cell = &self.inner.shards[self.shard_index(hash)].0;
        let mut shard = write(&cell.lock);
        // Read under the lock, so a key's decisions see time in the order they are
        // made: read before, a thread could decide after a later reading had been
        // applied, and a window or a limit-req node would be ahead of its `now` (a
        // false reject). GCRA's word takes any order (`max(tat, now)`).
        let now = self.inner.clock.now_us();
        let version = self.inner.version.load(Ordering::Acquire);
        // SAFETY: the write lock is held.
        if unsafe { cell.fast() }.version != version {
            let config = self.inner.config.load_full();
            // SAFETY: the write lock is held and the shared reference above is gone.
            let fast = unsafe { cell.fast_mut() };
            migrate(
                &mut shard,
                fast.fast,
                config,
                version,
                now,
                &self.inner.hasher,
            );
        }
        (cell, shard, now)
    }

    /// Runs `f` on the fast part of the shard of `hash` when that shard is at the
    /// current configuration: without a lock for flat words (inside the gate), under
    /// the read lock otherwise. `None` when it could not run or `f` said `None`.
    #[inline(always)]
    fn quick<R>(&self, hash: u64, f: impl FnOnce(&FastShard<K>) -> Option<R>) -> Option<R> {
        let cell = &self.inner.shards[self.shard_index(hash)].0;
        let version = self.inner.version.load(Ordering::Acquire);
        let run = |fast: &FastShard<K>| (fast.version == version).then(|| f(fast)).flatten();
        if TatTable::<K>::FLAT {
            // SAFETY: inside the gate, and the words are flat.
            cell.gate.read(|| run(unsafe { cell.fast() })).flatten()
        } else {
            let _shard = read(&cell.lock);
            // SAFETY: the read lock is held.
            run(unsafe { cell.fast() })
        }
    }

    #[inline]
    fn decide<Q>(&self, key: &Q, cost: u64, op: Op, mode: Asked) -> Result<KeyedDecision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.inner.hasher.hash_one(key);
        let peek = mode == Asked::Peek;
        // The GCRA fast path for a known key: one compare-and-swap, and no lock for
        // plain keys (or a read lock). Time is read there only when there is a word
        // to decide on; the locked path reads it under the lock.
        let known = |f: &FastShard<K>| {
            f.config.fast?;
            decide_known(f, key, hash, self.inner.clock.now_us(), cost, op, peek)
        };
        if let Some(done) = self.quick(hash, known) {
            return done;
        }
        let (cell, mut shard, now) = self.shard(hash);
        let Shard { states, sweep } = &mut *shard;
        let hasher = &self.inner.hasher;
        // SAFETY: the write lock is held (`f` is not used after a `fast_mut`).
        let f = unsafe { cell.fast() };
        // The key may have been inserted by another thread meanwhile.
        if let Some(done) = decide_known(f, key, hash, now, cost, op, peek) {
            return done;
        }
        if let Some(fast) = f.config.fast {
            // `known` said: a new key, admitted or reserving, to store.
            let (new, d) = fast.decide(0, now, cost, op)?;
            self.inner.inserted.fetch_add(1, Ordering::Relaxed);
            if self.room_needed(&f.tats) {
                let load = |t: &AtomicU64| t.load(Ordering::Relaxed);
                // SAFETY: the write lock is held; `f` is not used again.
                let words = &mut unsafe { cell.fast_mut() }.fast.tats;
                self.make_room(words, sweep, now, |t, at| load(t) <= at, load)?;
            }
            // SAFETY: the write lock is held: no other writer.
            let shared = unsafe { cell.fast().tats.insert_shared(hash, key.to_owned(), new) };
            if let Err(key) = shared {
                // SAFETY: as above; the shared reference is gone.
                let words = &mut unsafe { cell.fast_mut() }.fast.tats;
                words.insert_unique(hash, key, new, |k| hasher.hash_one(k));
            }
            return Ok(KeyedDecision::One(d));
        }
        let rules = &f.config.rules;
        if mode == Asked::Apply && op == Op::Try {
            // `check` and `allow` answer "allowed?": refused where that paces nothing.
            Error::refuse_pacing(rules)?;
        }
        let run = |st: &mut Vec<PolicyState>| -> Result<KeyedDecision, CheckError> {
            Ok(match mode {
                Asked::Peek => KeyedDecision::Rules(rules.peek(st, now, cost)?),
                Asked::Apply => KeyedDecision::One(rules.decide(st, now, cost, op)?),
                Asked::Detailed => KeyedDecision::Rules(rules.check(st, now, cost, op)?),
            })
        };
        if let Some((_, st)) = states.find_mut(hash, |(k, _)| k.borrow() == key) {
            return Ok(run(st)?);
        }
        let mut fresh = rules.init(now);
        let d = run(&mut fresh)?;
        if !peek && !rules.idle(&fresh, now) {
            self.inner.inserted.fetch_add(1, Ordering::Relaxed);
            self.make_room(
                states,
                sweep,
                now,
                |s, at| rules.idle(s, at),
                |s| rules.last_active(s),
            )?;
            states.insert_unique(hash, (key.to_owned(), fresh), |(k, _)| hasher.hash_one(k));
        }
        Ok(d)
    }

    /// Whether [`Self::make_room`] has work on `table`: the shard is full, or its
    /// table would have to grow for one more key.
    fn room_needed<S>(&self, table: &impl SweepTable<K, S>) -> bool {
        let len = table.len();
        len >= self.inner.per_shard || (len >= MIN_SWEEP && table.at_capacity())
    }

    /// Makes room for one more key in `table` (the shard's table in use).
    ///
    /// Before the table grows, keys that were already idle when it last grew go: none
    /// was asked for during the whole time the table took to fill, while a key that
    /// replenishes between requests but comes back stays (dropping it on every sweep
    /// only to store it again is churn). If that frees less than a quarter, the table
    /// grows, so sweeps stay amortized; if not, the next sweep looks back further (to
    /// the same growth), so a table smaller than the keys in use soon grows. When the shard is full, every idle key goes;
    /// then, if it is still full, the least recently active eighth is evicted, or the
    /// new key refused.
    fn make_room<S>(
        &self,
        table: &mut impl SweepTable<K, S>,
        sweep: &mut Sweep,
        now: u64,
        idle: impl Fn(&S, u64) -> bool,
        last_active: impl Fn(&S) -> u64,
    ) -> Result<(), Error> {
        let hasher = &self.inner.hasher;
        if !self.room_needed(table) {
            return Ok(());
        }
        let len = table.len();
        let full = len >= self.inner.per_shard;
        let refusing = self.inner.options.on_full == OnFull::RefuseNew;
        if !full {
            // Idle now too: a state updated after `since` is never judged there alone.
            let since = sweep.grown_at;
            self.sweep(table, |s| idle(s, since) && idle(s, now));
            if table.len() * 4 > len * 3 {
                table.grow(hasher);
                sweep.grown_at = now;
            }
            return Ok(());
        }
        if !refusing || now >= sweep.not_before {
            self.sweep(table, |s| idle(s, now));
        }
        if table.len() < self.inner.per_shard {
            return Ok(());
        }
        if refusing {
            sweep.not_before = now.saturating_add(REFUSE_SWEEP_INTERVAL_US);
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
            let max = self.inner.options.max_keys;
            return Err(Error::TooManyKeys { max });
        }
        // Entries sit at hash-determined places, so the first few are a fair sample.
        let mut sample: Vec<u64> = table.first(EVICT_SAMPLE).map(&last_active).collect();
        sample.sort_unstable();
        let cutoff = sample[(sample.len() / 8).min(sample.len() - 1)];
        let target = (table.len() / 8).max(1);
        let mut evicted = 0;
        table.keep(
            |s| {
                let evict = evicted < target && last_active(s) <= cutoff;
                evicted += usize::from(evict);
                !evict
            },
            hasher,
        );
        self.inner
            .evicted
            .fetch_add(evicted as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the keys whose state `idle` says is idle, counting them.
    fn sweep<S>(&self, table: &mut impl SweepTable<K, S>, idle: impl Fn(&S) -> bool) {
        let len = table.len();
        table.keep(|s| !idle(s), &self.inner.hasher);
        self.inner.sweeps.fetch_add(1, Ordering::Relaxed);
        self.inner
            .dropped_idle
            .fetch_add((len - table.len()) as u64, Ordering::Relaxed);
    }

    /// Waits for `cost` units for `key` (see [`crate::Limiter::acquire`]: FIFO per
    /// key, bounded by `max-wait`, and the same cancel safety: a dropped future gives
    /// its reservation back).
    pub async fn acquire<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let d = self
            .decide(key, cost, Op::Acquire, Asked::Apply)?
            .decision();
        if d.allowed && d.wait_us > 0 {
            let guard = RefundOnDrop::new(|| self.refund(key, cost));
            sleep_or_refund(&self.inner.turns, d.wait(), guard).await;
        }
        Ok(d)
    }

    /// [`KeyedLimiter::acquire`], then a random extra delay of up to the jitter's
    /// bound when admitted after a wait (see [`crate::Limiter::acquire_with_jitter`]).
    pub async fn acquire_with_jitter<Q>(
        &self,
        key: &Q,
        cost: u64,
        jitter: crate::wait::Jitter,
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let d = self.acquire(key, cost).await?;
        // As governor: only a caller that had to wait is spread out.
        if d.allowed && !d.wait().is_zero() {
            tokio::time::sleep(jitter.draw()).await;
        }
        Ok(d)
    }

    /// [`KeyedLimiter::acquire`] for synchronous code: blocks the thread for the wait.
    pub fn acquire_blocking<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let d = self
            .decide(key, cost, Op::Acquire, Asked::Apply)?
            .decision();
        if d.allowed {
            block(d.wait());
        }
        Ok(d)
    }
}

/// What a sweep needs of a shard's table (the GCRA words or the states).
trait SweepTable<K, S> {
    fn len(&self) -> usize;
    /// Whether one more key would make the table grow.
    fn at_capacity(&self) -> bool;
    /// Grows the table by about half (no entry is lost).
    fn grow(&mut self, hasher: &foldhash::quality::RandomState);
    /// Keeps the entries whose state `keep` says yes to.
    fn keep(&mut self, keep: impl FnMut(&S) -> bool, hasher: &foldhash::quality::RandomState);
    /// The states of the first `n` entries (slots follow the hash: a fair sample).
    fn first<'a>(&'a self, n: usize) -> impl Iterator<Item = &'a S>
    where
        S: 'a;
}

impl<K: Hash, S> SweepTable<K, S> for HashTable<(K, S)> {
    fn len(&self) -> usize {
        HashTable::len(self)
    }

    fn at_capacity(&self) -> bool {
        HashTable::len(self) == self.capacity()
    }

    fn grow(&mut self, hasher: &foldhash::quality::RandomState) {
        self.reserve(HashTable::len(self) / 2 + 1, |(k, _)| hasher.hash_one(k));
    }

    fn keep(&mut self, mut keep: impl FnMut(&S) -> bool, _: &foldhash::quality::RandomState) {
        self.retain(|(_, s)| keep(s));
    }

    fn first<'a>(&'a self, n: usize) -> impl Iterator<Item = &'a S>
    where
        S: 'a,
    {
        self.iter().take(n).map(|(_, s)| s)
    }
}

impl<K: Hash> SweepTable<K, AtomicU64> for TatTable<K> {
    fn len(&self) -> usize {
        TatTable::len(self)
    }

    fn at_capacity(&self) -> bool {
        TatTable::at_capacity(self)
    }

    fn grow(&mut self, hasher: &foldhash::quality::RandomState) {
        TatTable::grow(self, |k| hasher.hash_one(k));
    }

    fn keep(
        &mut self,
        keep: impl FnMut(&AtomicU64) -> bool,
        hasher: &foldhash::quality::RandomState,
    ) {
        self.retain(keep, |k| hasher.hash_one(k));
    }

    fn first<'a>(&'a self, n: usize) -> impl Iterator<Item = &'a AtomicU64>
    where
        AtomicU64: 'a,
    {
        self.sample(n)
    }
}

// Updates are whole assignments: a panic elsewhere leaves no torn state, so a
// poisoned lock is still usable.
fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// The GCRA fast path's decision on a shard's fast part: `None` when it cannot decide
/// there (not a single GCRA policy) or the key is new and must be stored.
#[inline(always)]
fn decide_known<K, Q>(
    f: &FastShard<K>,
    key: &Q,
    hash: u64,
    now: u64,
    cost: u64,
    op: Op,
    peek: bool,
) -> Option<Result<KeyedDecision, Error>>
where
    K: Borrow<Q>,
    Q: Eq + ?Sized,
{
    let fast = f.config.fast?;
    if let Some(tat) = f.tats.find(hash, |k| k.borrow() == key) {
        let d = decide_word(&fast, tat, now, cost, op, peek);
        return Some(d.map(KeyedDecision::One).map_err(Error::from));
    }
    let fresh = if peek {
        fast.peek(0, now, cost)
    } else {
        fast.decide(0, now, cost, op)
    };
    match fresh {
        Err(e) => Some(Err(e.into())),
        // Nothing to store for a peek, or for a reject of a fresh key.
        Ok((new, d)) if peek || new == 0 => Some(Ok(KeyedDecision::One(d))),
        Ok(_) => None,
    }
}

/// One GCRA decision on a key's TAT word: a compare-and-swap loop (a load for peek).
#[inline(always)]
fn decide_word(
    fast: &FastGcra,
    tat: &AtomicU64,
    now: u64,
    cost: u64,
    op: Op,
    peek: bool,
) -> Result<Decision, CheckError> {
    let mut current = tat.load(Ordering::Acquire);
    if peek {
        return Ok(fast.peek(current, now, cost)?.1);
    }
    loop {
        let (new, d) = fast.decide(current, now, cost, op)?;
        if new == current {
            return Ok(d);
        }
        match tat.compare_exchange_weak(current, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(d),
            Err(actual) => current = actual,
        }
    }
}

/// Converts a shard's entries to `config`, carrying each key's state over.
fn migrate<K: Hash + Eq>(
    shard: &mut Shard<K>,
    fast: &mut FastShard<K>,
    config: Arc<Config>,
    version: u64,
    now: u64,
    hasher: &foldhash::quality::RandomState,
) {
    let old = std::mem::replace(&mut fast.config, config.clone());
    let mut entries: Vec<(K, Vec<PolicyState>)> = fast
        .tats
        .drain()
        .into_iter()
        .map(|(k, tat)| (k, vec![PolicyState::Gcra(GcraState { tat })]))
        .chain(shard.states.drain())
        .collect();
    for (_, states) in entries.iter_mut() {
        *states = config
            .rules
            .carry_over(&old.rules, std::mem::take(states), now);
    }
    for (k, states) in entries {
        let hash = hasher.hash_one(&k);
        match (&config.fast, states.first()) {
            (Some(_), Some(PolicyState::Gcra(g))) => {
                fast.tats
                    .insert_unique(hash, k, g.tat, |k| hasher.hash_one(k));
            }
            (Some(_), _) => {}
            (None, _) => {
                shard
                    .states
                    .insert_unique(hash, (k, states), |(k, _)| hasher.hash_one(k));
            }
        }
    }
    fast.version = version;
}
