//! [`AdaptivePermit`]: a held permit that reports how its work ended.

use std::sync::Arc;
use std::time::Duration;

use tollgate_core::adaptive::{Outcome, Ticket};
use tollgate_core::{Clock, MonotonicClock};

use super::state::Inner;

/// A permit of an [`AdaptiveLimiter`](super::AdaptiveLimiter), held while the work
/// runs. End it with [`success`](Self::success) (its latency is a sample for the
/// controller), [`dropped`](Self::dropped) (the service was overloaded: a timeout, a
/// 503) or [`ignore`](Self::ignore); dropping it without a report is `ignore`.
#[must_use = "the permit is released as soon as it is dropped"]
#[derive(Debug)]
pub struct AdaptivePermit<C: Clock = MonotonicClock> {
    inner: Arc<Inner<C>>,
    ticket: Option<Ticket>,
}

impl<C: Clock> AdaptivePermit<C> {
    pub(super) fn new(inner: Arc<Inner<C>>, ticket: Ticket) -> Self {
        AdaptivePermit {
            inner,
            ticket: Some(ticket),
        }
    }

    /// How long the permit has been held.
    pub fn elapsed(&self) -> Duration {
        let admitted = self.ticket.map_or(0, |t| t.admitted_us());
        Duration::from_micros(self.inner.clock.now_us().saturating_sub(admitted))
    }

    /// The work succeeded; its latency is the time the permit was held.
    pub fn success(self) {
        let latency_us = u64::try_from(self.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.finish(Outcome::Success { latency_us });
    }

    /// The work succeeded and took `latency` (measured by the caller, e.g. the
    /// upstream's own time without the response's transfer).
    pub fn success_with(self, latency: Duration) {
        let latency_us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.finish(Outcome::Success { latency_us });
    }

    /// The work failed for lack of capacity: the limit comes down.
    pub fn dropped(self) {
        self.finish(Outcome::Dropped);
    }

    /// The outcome says nothing about capacity (a client error, a cancellation).
    pub fn ignore(self) {
        self.finish(Outcome::Ignored);
    }

    /// Ends the permit with `outcome`.
    pub fn finish(mut self, outcome: Outcome) {
        if let Some(ticket) = self.ticket.take() {
            self.inner.release(ticket, outcome);
        }
    }
}

impl<C: Clock> Drop for AdaptivePermit<C> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.inner.release(ticket, Outcome::Ignored);
        }
    }
}
