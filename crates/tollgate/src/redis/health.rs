//! Whether Redis is answering, as one limiter sees it: the failing/healthy transitions
//! (logged and counted), the probe schedule while failing, and the limiter's counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tollgate_core::{Clock, MonotonicClock};

use super::limiter::{OnError, RedisStats};
use super::StoreError;

/// A counter of [`RedisStats`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Decision = 0,
    Error = 1,
    Fallback = 2,
    CacheHit = 3,
    Outage = 4,
    Recovery = 5,
}

pub(crate) struct Health {
    name: String,
    probe_interval: Duration,
    pub clock: MonotonicClock,
    failing: AtomicBool,
    /// Local time (us) after which a failing limiter tries Redis again.
    next_probe: AtomicU64,
    /// Local time (us) of the last recovery: a call sent before it that fails late
    /// (it waited out its timeout on the connection Redis dropped) is not a new outage.
    recovered_at: AtomicU64,
    stats: [AtomicU64; 6],
}

impl Health {
    pub fn new(name: &str, probe_interval: Duration) -> Health {
        Health {
            name: name.into(),
            probe_interval,
            clock: MonotonicClock::new(),
            failing: AtomicBool::new(false),
            next_probe: AtomicU64::new(0),
            recovered_at: AtomicU64::new(0),
            stats: Default::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
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
            negative_cache_hits: s(Event::CacheHit),
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

    /// Redis answered.
    pub fn healthy(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            self.recovered_at
                .store(self.clock.now_us(), Ordering::Relaxed);
            self.count(Event::Recovery);
            tracing::warn!(limiter = %self.name, "redis is back: decisions are global again");
        }
    }

    /// Redis failed with `e` (transient) a call sent at `sent` (local us): the failure
    /// policy decides until a probe succeeds. A call sent before the last recovery
    /// counts as an error only: Redis has answered since.
    pub fn failed(&self, e: &StoreError, policy: &OnError, sent: u64) {
        self.count(Event::Error);
        if sent < self.recovered_at.load(Ordering::Relaxed) {
            return;
        }
        let probe = self.clock.now_us() + self.probe_interval.as_micros() as u64;
        self.next_probe.store(probe, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            self.count(Event::Outage);
            tracing::error!(
                limiter = %self.name,
                error = %e,
                policy = ?policy,
                "redis is failing: the failure policy decides until it answers again"
            );
        }
    }
}
