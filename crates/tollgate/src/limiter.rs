//! [`Limiter`]: one shared limit (a direct limiter, governor's `RateLimiter::direct`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tollgate_core::algorithms::GcraState;
use tollgate_core::{
    CheckError, Clock, Decision, MonotonicClock, Op, Policy, PolicyState, RuleDecision, RuleSet,
};

use crate::config::{gcra_step, single, Config};
use crate::wait::{block, sleep_or_refund, RefundOnDrop};

/// One limit shared by every clone (state behind an `Arc`): `Send + Sync`, cheap to
/// clone, for any policy or rule set.
///
/// A single GCRA policy keeps its whole state in one `AtomicU64`, updated by
/// compare-and-swap with no lock; every other policy (and every rule set) keeps its
/// state behind a mutex held only for the arithmetic.
///
/// ```
/// use tollgate::{Limiter, ManualClock};
/// use std::time::Duration;
///
/// let clock = std::sync::Arc::new(ManualClock::new());
/// let limiter = Limiter::with_clock("gcra:rate=10/s,burst=2".parse::<tollgate::Policy>()?, clock.clone());
/// assert!(limiter.check()?.allowed);
/// assert!(limiter.check()?.allowed);
/// let d = limiter.check()?;
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after(), Some(Duration::from_millis(100)));
/// clock.advance(Duration::from_millis(100));
/// assert!(limiter.check()?.allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Limiter<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    clock: C,
    config: ArcSwap<Config>,
    /// The GCRA fast path's state (used iff `config.gcra` is set).
    tat: AtomicU64,
    /// Every other configuration's state, one per policy.
    states: Mutex<Vec<PolicyState>>,
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
    /// A limiter for `rules` (a [`Policy`] or a [`RuleSet`]) on the monotonic clock.
    pub fn new(rules: impl Into<RuleSet>) -> Self {
        Self::with_clock(rules, MonotonicClock::new())
    }
}

impl<C: Clock> Limiter<C> {
    /// A limiter for `rules` on `clock`.
    pub fn with_clock(rules: impl Into<RuleSet>, clock: C) -> Self {
        let rules = rules.into();
        let now = clock.now_us();
        let states = rules.init(now);
        let config = Config::new(rules);
        Limiter {
            inner: Arc::new(Inner {
                clock,
                config: ArcSwap::from_pointee(config),
                tat: AtomicU64::new(0),
                states: Mutex::new(states),
            }),
        }
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.inner.clock
    }

    /// The rule set in force.
    pub fn rules(&self) -> RuleSet {
        self.inner.config.load().rules.clone()
    }

    /// Tries one unit now.
    pub fn check(&self) -> Result<Decision, CheckError> {
        self.check_n(1)
    }

    /// Tries `cost` units now.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, CheckError> {
        self.decide(cost, Op::Try)
    }

    /// Like [`Limiter::check_n`] with `op`, reporting every policy of the rule set.
    pub fn check_rules(&self, cost: u64, op: Op) -> Result<RuleDecision, CheckError> {
        let now = self.inner.clock.now_us();
        let config = self.inner.config.load();
        if let Some((gcra, policy)) = &config.gcra {
            return self.gcra(gcra, policy, now, cost, op).map(single);
        }
        drop(config);
        let mut states = self.states();
        let config = self.inner.config.load();
        config.rules.check(&mut states, now, cost, op)
    }

    #[inline]
    fn decide(&self, cost: u64, op: Op) -> Result<Decision, CheckError> {
        let now = self.inner.clock.now_us();
        let config = self.inner.config.load();
        if let Some((gcra, policy)) = &config.gcra {
            return self.gcra(gcra, policy, now, cost, op);
        }
        drop(config);
        let mut states = self.states();
        // Read under the lock: a reconfiguration swaps config and states together.
        let config = self.inner.config.load();
        Ok(config.rules.check(&mut states, now, cost, op)?.decision)
    }

    #[inline]
    fn gcra(
        &self,
        gcra: &tollgate_core::algorithms::Gcra,
        policy: &Policy,
        now: u64,
        cost: u64,
        op: Op,
    ) -> Result<Decision, CheckError> {
        let mut tat = self.inner.tat.load(Ordering::Acquire);
        loop {
            let (new, d) = gcra_step(gcra, policy, tat, now, cost, op)?;
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

    fn states(&self) -> MutexGuard<'_, Vec<PolicyState>> {
        // A panic elsewhere cannot leave a state half-written (updates are whole
        // assignments), so a poisoned lock is still usable.
        self.inner.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The decision a try of `cost` would get now, changing nothing.
    pub fn peek(&self, cost: u64) -> Result<Decision, CheckError> {
        let now = self.inner.clock.now_us();
        let config = self.inner.config.load();
        if let Some((gcra, policy)) = &config.gcra {
            let tat = self.inner.tat.load(Ordering::Acquire);
            return gcra_step(gcra, policy, tat, now, cost, Op::Try).map(|(_, d)| d);
        }
        let states = self.states();
        let config = self.inner.config.load();
        Ok(config.rules.peek(&states, now, cost)?.decision)
    }

    /// Gives back `cost` units admitted earlier (never beyond full capacity).
    pub fn refund(&self, cost: u64) {
        let now = self.inner.clock.now_us();
        let config = self.inner.config.load();
        if let Some((_, policy)) = &config.gcra {
            let _ = self
                .inner
                .tat
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tat| {
                    let mut s = PolicyState::Gcra(GcraState { tat });
                    policy.refund(&mut s, now, cost);
                    match s {
                        PolicyState::Gcra(g) => Some(g.tat),
                        _ => None,
                    }
                });
            return;
        }
        let mut states = self.states();
        let config = self.inner.config.load();
        config.rules.refund(&mut states, now, cost);
    }

    /// Forgets all state: the limiter is as new.
    pub fn reset(&self) {
        let now = self.inner.clock.now_us();
        let mut states = self.states();
        let config = self.inner.config.load();
        *states = config.rules.init(now);
        self.inner.tat.store(0, Ordering::Release);
    }

    /// Replaces the policy or rule set at run time, for every clone. State carries
    /// over where it keeps its meaning ([`RuleSet::carry_over`]: GCRA keeps its TAT, a
    /// window its count, a concurrency limit its held permits); otherwise it starts
    /// fresh. A check racing the change is decided under either configuration.
    pub fn set_rules(&self, rules: impl Into<RuleSet>) {
        let rules = rules.into();
        let now = self.inner.clock.now_us();
        let mut states = self.states();
        let old = self.inner.config.load_full();
        let current = match &old.gcra {
            Some(_) => vec![PolicyState::Gcra(GcraState {
                tat: self.inner.tat.load(Ordering::Acquire),
            })],
            None => std::mem::take(&mut *states),
        };
        let mut carried = rules.carry_over(&old.rules, current, now);
        let config = Config::new(rules);
        if config.gcra.is_some() {
            if let Some(PolicyState::Gcra(g)) = carried.first() {
                self.inner.tat.store(g.tat, Ordering::Release);
            }
            carried.clear();
        }
        *states = carried;
        self.inner.config.store(Arc::new(config));
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
    pub async fn acquire(&self, cost: u64) -> Result<Decision, CheckError> {
        let d = self.decide(cost, Op::Acquire)?;
        if d.allowed && d.wait_us > 0 {
            let guard = RefundOnDrop::new(|| self.refund(cost));
            sleep_or_refund(d.wait(), guard).await;
        }
        Ok(d)
    }

    /// [`Limiter::acquire`] for synchronous code: blocks the thread for the wait.
    pub fn acquire_blocking(&self, cost: u64) -> Result<Decision, CheckError> {
        let d = self.decide(cost, Op::Acquire)?;
        if d.allowed {
            block(d.wait());
        }
        Ok(d)
    }
}
