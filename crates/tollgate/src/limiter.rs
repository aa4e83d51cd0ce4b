//! [`Limiter`]: one shared limit (a direct limiter, governor's `RateLimiter::direct`).

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tollgate_core::algorithms::{GcraParams, GcraState};
use tollgate_core::{
    CheckError, Clock, Decision, MonotonicClock, Op, PolicyState, RuleDecision, RuleSet,
};

use crate::fast_gcra::{Config, FastGcra};
use crate::wait::{block, sleep_or_refund, RefundOnDrop, Turns};
use crate::Error;

/// One limit shared by every clone (state behind an `Arc`): `Send + Sync`, cheap to
/// clone, for any policy or rule set.
///
/// A single GCRA policy (with a whole-microsecond interval) keeps its whole state in
/// one `AtomicU64`, updated by compare-and-swap with no lock, and its parameters in a
/// few atomics beside it, so a check reads no shared pointer. Every other policy, and
/// every rule set, keeps its state behind a mutex held only for the arithmetic.
///
/// ```
/// use tollgate::clock::ManualClock;
/// use tollgate::Limiter;
/// use std::time::Duration;
///
/// let clock = std::sync::Arc::new(ManualClock::new());
/// let limiter = Limiter::with_clock("gcra:rate=10/s,burst=2".parse::<tollgate::Policy>()?, clock.clone());
/// assert!(limiter.check(1)?.allowed);
/// assert!(limiter.check(1)?.allowed);
/// let d = limiter.check(1)?;
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.check(1)?.allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Limiter<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    clock: C,
    config: ArcSwap<Config>,
    /// A seqlock over `fast`: odd while a reconfiguration rewrites it.
    seq: AtomicU64,
    /// The fast path's parameters (see [`FastWords`]); all zero without a fast path.
    fast: [AtomicU64; FAST_WORDS],
    /// The fast path's state: GCRA's TAT.
    tat: AtomicU64,
    /// Every other configuration's state, one per policy.
    states: Mutex<Vec<PolicyState>>,
    /// The order its waiters come back in (boxed: off the decision's cache lines).
    turns: Box<Turns>,
}

const FAST_WORDS: usize = 7;

/// The fast path's parameters: GCRA's four words, then max-wait (`u64::MAX`: none)
/// shadow (0/1) and the debt cap. Copied out of the seqlock by value, so a check never sees half
/// of a reconfiguration.
#[derive(Clone, Copy)]
struct FastWords([u64; FAST_WORDS]);

impl FastWords {
    fn of(config: &Config) -> Self {
        match config.fast {
            Some(f) => FastWords([
                f.params.interval,
                f.params.tau,
                f.params.burst,
                f.params.inverse,
                f.max_wait_us.unwrap_or(u64::MAX),
                u64::from(f.shadow),
                f.debt,
            ]),
            None => FastWords([0; FAST_WORDS]),
        }
    }

    fn is_set(&self) -> bool {
        self.0[0] != 0
    }

    /// The configuration the words encode.
    #[inline(always)]
    fn gcra(&self) -> FastGcra {
        FastGcra {
            params: GcraParams {
                interval: self.0[0],
                tau: self.0[1],
                burst: self.0[2],
                inverse: self.0[3],
            },
            max_wait_us: (self.0[4] != u64::MAX).then_some(self.0[4]),
            shadow: self.0[5] != 0,
            debt: self.0[6],
        }
    }
}

impl<C: Clock> Clone for Limiter<C> {
    fn clone(&self) -> Self {
        Limiter {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Clock> std::fmt::Debug for Limiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.inner.config.load().rules)
            .finish_non_exhaustive()
    }
}

impl Limiter<MonotonicClock> {
    /// A limiter for `rules` (a [`tollgate_core::Policy`] or a [`RuleSet`]) on the
    /// monotonic clock.
    pub fn new(rules: impl Into<RuleSet>) -> Self {
        Self::with_clock(rules, MonotonicClock::new())
    }
}

impl<C: Clock> Limiter<C> {
    /// A limiter for `rules` on `clock`.
    pub fn with_clock(rules: impl Into<RuleSet>, clock: C) -> Self {
        let rules = rules.into();
        let config = Config::new(rules);
        let words = FastWords::of(&config);
        let states = if words.is_set() {
            Vec::new()
        } else {
            config.rules.init(clock.now_us())
        };
        Limiter {
            inner: Arc::new(Inner {
                clock,
                config: ArcSwap::from_pointee(config),
                seq: AtomicU64::new(0),
                fast: words.0.map(AtomicU64::new),
                tat: AtomicU64::new(0),
                states: Mutex::new(states),
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

    /// Tries `cost` units now. Refused with [`Error::Paces`] for rules that pace (a
    /// `shaper`, a delaying `limit-req`), whose admitted tries carry a wait to sleep
    /// before the work: [`Limiter::acquire`] sleeps it (or [`Limiter::check_rules`]
    /// with `Op::Try` reports it).
    #[inline]
    pub fn check(&self, cost: u64) -> Result<Decision, Error> {
        if let Some(words) = self.fast() {
            let now = self.inner.clock.now_us();
            return Ok(self.gcra(words, now, cost, Op::Try)?);
        }
        self.try_locked(cost)
    }

    /// Tries one unit now and says only whether it is admitted: the same decision as
    /// [`Limiter::check`]`(1)?.allowed`, with the same effect on the state (and the same
    /// refusal of rules that pace).
    ///
    /// For a single GCRA policy it is decided from the state word alone, with none of
    /// the arithmetic of `remaining`, `reset_after` and `retry_after` (governor's
    /// `check().is_ok()` is the like of it). Use [`Limiter::check`] when the caller
    /// reports headers or waits.
    ///
    /// ```
    /// use tollgate::{Limiter, Policy, Rate};
    /// let limiter = Limiter::new(Policy::gcra(Rate::per_second(1)?, 2)?);
    /// assert!(limiter.allow()?);
    /// assert!(limiter.allow()?);
    /// assert!(!limiter.allow()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn allow(&self) -> Result<bool, Error> {
        if let Some(words) = self.fast() {
            let now = self.inner.clock.now_us();
            return Ok(words.gcra().admit_word(&self.inner.tat, now));
        }
        Ok(self.try_locked(1)?.allowed)
    }

    /// Decides `cost` units with `op` (see [`RateLimiter::check_rules`](crate::RateLimiter::check_rules)),
    /// reporting every policy of the rule set.
    pub fn check_rules(&self, cost: u64, op: Op) -> Result<RuleDecision, Error> {
        Ok(self.rules_decision(cost, op)?)
    }

    fn rules_decision(&self, cost: u64, op: Op) -> Result<RuleDecision, CheckError> {
        if let Some(words) = self.fast() {
            let now = self.inner.clock.now_us();
            return self.gcra(words, now, cost, op).map(RuleDecision::from);
        }
        let (mut states, now) = self.locked();
        // Read under the lock: a reconfiguration swaps config and states together.
        let config = self.inner.config.load();
        config.rules.check(&mut states, now, cost, op)
    }

    #[inline(always)]
    /// Decides `cost` units with `op` (an acquire's reservation without the sleep).
    pub(crate) fn decide(&self, cost: u64, op: Op) -> Result<Decision, CheckError> {
        if let Some(words) = self.fast() {
            let now = self.inner.clock.now_us();
            return self.gcra(words, now, cost, op);
        }
        let (mut states, now) = self.locked();
        let config = self.inner.config.load();
        config.rules.decide(&mut states, now, cost, op)
    }

    /// A try off the fast path: refused for rules that pace (see [`Limiter::check`]).
    fn try_locked(&self, cost: u64) -> Result<Decision, Error> {
        let (mut states, now) = self.locked();
        let config = self.inner.config.load();
        Error::refuse_pacing(&config.rules)?;
        Ok(config.rules.decide(&mut states, now, cost, Op::Try)?)
    }

    /// The fast path's words, read consistently (a seqlock), if the configuration has
    /// one.
    #[inline(always)]
    fn fast(&self) -> Option<FastWords> {
        let inner = &*self.inner;
        loop {
            let seq = inner.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let words = FastWords(std::array::from_fn(|i| {
                    inner.fast[i].load(Ordering::Relaxed)
                }));
                fence(Ordering::Acquire);
                if inner.seq.load(Ordering::Relaxed) == seq {
                    return words.is_set().then_some(words);
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Publishes a configuration's fast-path words (with the states lock held).
    fn publish(&self, words: FastWords) {
        let inner = &*self.inner;
        inner.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        for (slot, w) in inner.fast.iter().zip(words.0) {
            slot.store(w, Ordering::Relaxed);
        }
        inner.seq.fetch_add(1, Ordering::Release);
    }

    /// One lock-free GCRA decision: a compare-and-swap on the TAT word.
    #[inline(always)]
    fn gcra(&self, words: FastWords, now: u64, cost: u64, op: Op) -> Result<Decision, CheckError> {
        let fast = words.gcra();
        let mut tat = self.inner.tat.load(Ordering::Acquire);
        loop {
            let (new, d) = fast.decide(tat, now, cost, op)?;
            if new == tat {
                return Ok(d);
            }
            match self.inner.tat.compare_exchange_weak(
                tat,
                new,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(d),
                Err(actual) => tat = actual,
            }
        }
    }

    /// The states, locked, and the time read under the lock: decisions then see time
    /// in the order they are made (read before it, a thread could decide after a
    /// later reading had been applied, and find a window or a limit-req node ahead of
    /// its `now`: a false reject).
    fn locked(&self) -> (MutexGuard<'_, Vec<PolicyState>>, u64) {
        // A panic elsewhere cannot leave a state half-written (updates are whole
        // assignments), so a poisoned lock is still usable.
        let states = self.inner.states.lock().unwrap_or_else(|e| e.into_inner());
        (states, self.inner.clock.now_us())
    }

    /// The decision a try of `cost` would get now, changing nothing; a cost of 0 is the
    /// state as it stands (admitted, `remaining` and `reset_after` of now).
    pub fn peek(&self, cost: u64) -> Result<RuleDecision, Error> {
        if let Some(words) = self.fast() {
            let now = self.inner.clock.now_us();
            let tat = self.inner.tat.load(Ordering::Acquire);
            return Ok(words.gcra().peek(tat, now, cost)?.1.into());
        }
        let (states, now) = self.locked();
        let config = self.inner.config.load();
        Ok(config.rules.peek(&states, now, cost)?)
    }

    /// Charges `cost` units of work already done: no limit test, so the limiter may
    /// go into debt, up to each policy's `max-debt` (see
    /// [`tollgate_core::Policy::charge`]). Always admitted.
    pub fn charge(&self, cost: u64) -> Result<RuleDecision, Error> {
        self.check_rules(cost, Op::Charge)
    }

    /// Gives back `cost` units admitted earlier (never beyond full capacity).
    pub fn refund(&self, cost: u64) {
        if let Some(words) = self.fast() {
            let now = self.inner.clock.now_us();
            let fast = words.gcra();
            let _ = self
                .inner
                .tat
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                    Some(fast.refunded(tat, now, cost))
                });
            return;
        }
        let (mut states, now) = self.locked();
        let config = self.inner.config.load();
        config.rules.refund(&mut states, now, cost);
    }

    /// Forgets all state: the limiter is as new.
    pub fn reset(&self) {
        let (mut states, now) = self.locked();
        let config = self.inner.config.load();
        *states = if self.fast().is_some() {
            Vec::new()
        } else {
            config.rules.init(now)
        };
        self.inner.tat.store(0, Ordering::Release);
    }

    /// Replaces the policy or rule set at run time, for every clone. State carries
    /// over where it keeps its meaning ([`RuleSet::carry_over`]: GCRA keeps its TAT, a
    /// window its count, a concurrency limit its held permits); otherwise it starts
    /// fresh. A check racing the change is decided under either configuration.
    pub fn set_rules(&self, rules: impl Into<RuleSet>) {
        let rules = rules.into();
        let (mut states, now) = self.locked();
        let old = self.inner.config.load_full();
        let current = match old.fast {
            Some(_) if states.is_empty() => vec![PolicyState::Gcra(GcraState {
                tat: self.inner.tat.load(Ordering::Acquire),
            })],
            _ => std::mem::take(&mut *states),
        };
        let mut carried = rules.carry_over(&old.rules, current, now);
        let config = Config::new(rules);
        let words = FastWords::of(&config);
        if words.is_set() {
            if let Some(PolicyState::Gcra(g)) = carried.first() {
                self.inner.tat.store(g.tat, Ordering::Release);
            }
            carried.clear();
        }
        *states = carried;
        self.inner.config.store(Arc::new(config));
        self.publish(words);
    }

    /// Waits for `cost` units: reserves the earliest instant at which they fit, behind
    /// every earlier reservation (FIFO), and sleeps until then. If the wait would
    /// exceed the policy's `max-wait`, returns at once with a rejected decision and
    /// reserves nothing. Unbounded when the policy has no `max-wait`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while it sleeps gives the reservation back (as
    /// [`Limiter::refund`]), so no capacity is lost; waiters queued behind keep their
    /// places, and a later arrival may take the freed slot.
    pub async fn acquire(&self, cost: u64) -> Result<Decision, Error> {
        let d = self.decide(cost, Op::Acquire)?;
        if d.allowed && d.wait_us > 0 {
            let guard = RefundOnDrop::new(|| self.refund(cost));
            sleep_or_refund(&self.inner.turns, d.wait(), guard).await;
        }
        Ok(d)
    }

    /// [`Limiter::acquire`], then a random extra delay of up to the jitter's bound
    /// when admitted after a wait (governor's `until_ready_with_jitter`): spreads
    /// out callers that waited for the same instant; one admitted at once goes at
    /// once. The decision's `wait` is the limiter's; the jitter comes on top of it.
    pub async fn acquire_with_jitter(
        &self,
        cost: u64,
        jitter: crate::wait::Jitter,
    ) -> Result<Decision, Error> {
        let d = self.acquire(cost).await?;
        // As governor: only a caller that had to wait is spread out.
        if d.allowed && !d.wait().is_zero() {
            tokio::time::sleep(jitter.draw()).await;
        }
        Ok(d)
    }

    /// [`Limiter::acquire`] for synchronous code: blocks the thread for the wait.
    pub fn acquire_blocking(&self, cost: u64) -> Result<Decision, Error> {
        let d = self.decide(cost, Op::Acquire)?;
        if d.allowed {
            block(d.wait());
        }
        Ok(d)
    }
}
