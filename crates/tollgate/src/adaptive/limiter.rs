//! [`AdaptiveLimiter`]: the core's [`AdaptiveGate`] behind a lock, with a waker per
//! waiter and a timer for its queueing-delay target.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tollgate_core::adaptive::{
    AdaptiveGate, AdaptiveSpec, AdaptiveStats, Enqueued, GateEvent, Outcome, Request, Shed, Ticket,
    WaiterId,
};
use tollgate_core::{Clock, MonotonicClock};

use super::permit::AdaptivePermit;

/// A concurrency limit that finds the service's capacity itself, sheds low-value work
/// first and, optionally, shares the limit fairly among callers (docs/adaptive.md).
///
/// Every clone shares one limit. Each permit reports how its work ended
/// ([`AdaptivePermit::success`], [`AdaptivePermit::dropped`], or nothing: ignored);
/// the controller of the [`AdaptiveSpec`] moves the limit from those reports.
///
/// **Fairness**: waiters are served by priority, first come first served within one
/// (with fair shares, a caller holding its share waits behind callers holding less).
/// A waiter is shed when its wait passes the queueing-delay target or its own
/// `max_wait`, when the queue is full of work at least as important, or — sheddable
/// work — as soon as more important work has to wait.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::adaptive::{AdaptiveLimiter, Priority, Request};
///
/// let limiter = AdaptiveLimiter::new("gradient:min=2,max=200".parse()?);
/// let permit = limiter
///     .acquire_with(Request::new(Priority::CRITICAL).caller("tenant-7"), Some(Duration::from_millis(50)))
///     .await?;
/// // ... call the service ...
/// permit.success(); // its latency is a sample for the controller
/// assert_eq!(limiter.stats().in_flight, 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct AdaptiveLimiter<C: Clock = MonotonicClock> {
    pub(super) inner: Arc<Inner<C>>,
}

impl<C: Clock> Clone for AdaptiveLimiter<C> {
    fn clone(&self) -> Self {
        AdaptiveLimiter {
            inner: self.inner.clone(),
        }
    }
}

type Answer = Result<Ticket, Shed>;

#[derive(Debug)]
pub(super) struct Inner<C> {
    pub(super) clock: C,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    gate: AdaptiveGate,
    waiters: HashMap<WaiterId, oneshot::Sender<Answer>>,
}

impl AdaptiveLimiter<MonotonicClock> {
    /// A limiter for `spec` on the monotonic clock.
    pub fn new(spec: AdaptiveSpec) -> Self {
        Self::with_clock(spec, false, MonotonicClock::new())
    }

    /// A limiter for `spec` that shares the limit among callers
    /// ([`Request::caller`]): under overload no caller holds more than its share
    /// while others wait; while permits are free nobody is limited.
    pub fn fair(spec: AdaptiveSpec) -> Self {
        Self::with_clock(spec, true, MonotonicClock::new())
    }
}

impl<C: Clock> AdaptiveLimiter<C> {
    /// A limiter for `spec` on `clock` (e.g. [`crate::TokioClock`] in tests under
    /// `tokio::time::pause()`); `fair`: share the limit among callers.
    pub fn with_clock(spec: AdaptiveSpec, fair: bool, clock: C) -> Self {
        AdaptiveLimiter {
            inner: Arc::new(Inner {
                clock,
                state: Mutex::new(State {
                    gate: AdaptiveGate::new(spec, fair),
                    waiters: HashMap::new(),
                }),
            }),
        }
    }

    /// The spec the limiter runs.
    pub fn spec(&self) -> AdaptiveSpec {
        *self.inner.lock().gate.spec()
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.inner.lock().gate.limit()
    }

    /// The limit, permits held and waiting, baseline latency and shed counts now.
    pub fn stats(&self) -> AdaptiveStats {
        self.inner.lock().gate.stats()
    }

    /// A permit of normal priority now, or [`Shed::Busy`] at once.
    pub fn try_acquire(&self) -> Result<AdaptivePermit<C>, Shed> {
        self.try_acquire_with(Request::default())
    }

    /// A permit for `req` now, or [`Shed::Busy`] at once (never jumps the queue:
    /// while anyone waits, no permit is free).
    pub fn try_acquire_with(&self, req: Request) -> Result<AdaptivePermit<C>, Shed> {
        let now = self.inner.clock.now_us();
        let ticket = self.inner.lock().gate.try_acquire(now, req)?;
        Ok(AdaptivePermit::new(self.inner.clone(), ticket))
    }

    /// A permit of normal priority, waiting for it up to the queueing-delay target.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the place in the queue; a permit granted in the
    /// meantime is given back (as an ignored outcome).
    pub async fn acquire(&self) -> Result<AdaptivePermit<C>, Shed> {
        self.acquire_with(Request::default(), None).await
    }

    /// A permit for `req`, waiting by priority (FIFO within one) up to the
    /// queueing-delay target and `max_wait` (cancel safe like [`Self::acquire`]).
    pub async fn acquire_with(
        &self,
        req: Request,
        max_wait: Option<Duration>,
    ) -> Result<AdaptivePermit<C>, Shed> {
        let now = self.inner.clock.now_us();
        let max_wait_us = max_wait.map(|w| u64::try_from(w.as_micros()).unwrap_or(u64::MAX));
        let (id, deadline_us, rx) = match self.inner.enqueue(now, req, max_wait_us)? {
            Ok(ticket) => return Ok(AdaptivePermit::new(self.inner.clone(), ticket)),
            Err(waiting) => waiting,
        };
        let mut waiting = Waiting {
            inner: &self.inner,
            id,
            rx,
            done: false,
        };
        let answer = match deadline_us {
            None => (&mut waiting.rx).await,
            Some(deadline) => {
                let wait = Duration::from_micros(deadline.saturating_sub(now));
                match tokio::time::timeout(wait, &mut waiting.rx).await {
                    Ok(answer) => answer,
                    Err(_) => match self.inner.shed_waiter(id) {
                        Some(shed) => {
                            waiting.done = true;
                            return Err(shed);
                        }
                        // Granted or shed just now: the answer is on its way.
                        None => (&mut waiting.rx).await,
                    },
                }
            }
        };
        waiting.done = true;
        match answer {
            Ok(Ok(ticket)) => Ok(AdaptivePermit::new(self.inner.clone(), ticket)),
            Ok(Err(shed)) => Err(shed),
            // Senders are dropped only after sending; should one ever not, say busy.
            Err(_) => Err(Shed::Busy {
                limit: self.limit(),
            }),
        }
    }
}

impl<C: Clock> Inner<C> {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves the gate consistent (every method finishes
        // its bookkeeping before it can panic), so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A permit now, or a place in the queue with its deadline and answer, or shed.
    #[allow(clippy::type_complexity)]
    fn enqueue(
        &self,
        now: u64,
        req: Request,
        max_wait_us: Option<u64>,
    ) -> Result<Result<Ticket, (WaiterId, Option<u64>, oneshot::Receiver<Answer>)>, Shed> {
        let mut state = self.lock();
        match state.gate.enqueue(now, req, max_wait_us) {
            Enqueued::Granted(t) => Ok(Ok(t)),
            Enqueued::Rejected(shed) => Err(shed),
            Enqueued::Waiting { id, deadline_us } => {
                let (tx, rx) = oneshot::channel();
                state.waiters.insert(id, tx);
                // The arrival may have shed sheddable waiters: tell them.
                self.settle(state);
                Ok(Err((id, deadline_us, rx)))
            }
        }
    }

    /// Sheds a waiter at its deadline; `None` if it was answered meanwhile.
    fn shed_waiter(&self, id: WaiterId) -> Option<Shed> {
        let mut state = self.lock();
        let shed = state.gate.shed_waiter(self.clock.now_us(), id)?;
        state.waiters.remove(&id);
        Some(shed)
    }

    /// Ends a permit and answers the waiters it frees.
    pub(super) fn release(&self, ticket: Ticket, outcome: Outcome) {
        let mut state = self.lock();
        state.gate.release(self.clock.now_us(), ticket, outcome);
        self.settle(state);
    }

    /// Answers the waiters the gate granted or shed, after letting go of the lock; a
    /// grant whose waiter went away meanwhile is released again.
    fn settle<'a>(&'a self, mut state: MutexGuard<'a, State>) {
        loop {
            let events: Vec<GateEvent> = state.gate.drain_events().collect();
            if events.is_empty() {
                return;
            }
            let answers: Vec<(oneshot::Sender<Answer>, Answer)> = events
                .into_iter()
                .filter_map(|e| {
                    let (id, answer) = match e {
                        GateEvent::Granted { id, ticket } => (id, Ok(ticket)),
                        GateEvent::Shed { id, reason } => (id, Err(reason)),
                    };
                    Some((state.waiters.remove(&id)?, answer))
                })
                .collect();
            drop(state);
            let orphans: Vec<Ticket> = answers
                .into_iter()
                .filter_map(|(tx, answer)| match tx.send(answer) {
                    Err(Ok(ticket)) => Some(ticket),
                    _ => None,
                })
                .collect();
            if orphans.is_empty() {
                return;
            }
            state = self.lock();
            let now = self.clock.now_us();
            for t in orphans {
                state.gate.release(now, t, Outcome::Ignored);
            }
        }
    }
}

/// A waiter's place in the queue: given up when dropped before an answer.
struct Waiting<'a, C: Clock> {
    inner: &'a Arc<Inner<C>>,
    id: WaiterId,
    rx: oneshot::Receiver<Answer>,
    done: bool,
}

impl<C: Clock> Drop for Waiting<'_, C> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut state = self.inner.lock();
        if state.gate.cancel(self.id) {
            state.waiters.remove(&self.id);
        } else if let Ok(Ok(ticket)) = self.rx.try_recv() {
            // Granted but never taken: give the permit back. (A grant still on its
            // way comes back to its sender, which releases it.)
            state
                .gate
                .release(self.inner.clock.now_us(), ticket, Outcome::Ignored);
            self.inner.settle(state);
        }
    }
}
