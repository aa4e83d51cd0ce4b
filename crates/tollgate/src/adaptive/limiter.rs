//! [`AdaptiveLimiter`]: the core's [`AdaptiveGate`] behind a lock, with a waker per
//! waiter and a timer for its queueing-delay target.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tollgate_core::adaptive::{AdaptiveSpec, AdaptiveStats, Request, Shed, WaiterId};
use tollgate_core::{Clock, MonotonicClock};

use super::permit::AdaptivePermit;
use super::state::{Answer, Inner};

/// A concurrency limit that finds the service's capacity itself, sheds low-value work
/// first and, optionally, shares the limit fairly among callers (docs/adaptive.md).
///
/// With fair shares a freed permit goes to the waiting caller (of the top priority)
/// that holds the fewest permits; held permits are never taken back.
///
/// Every clone shares one limit. Each permit reports how its work ended
/// ([`AdaptivePermit::success`], [`AdaptivePermit::dropped`], or nothing: ignored);
/// the controller of the [`AdaptiveSpec`] moves the limit from those reports.
///
/// **Fairness**: waiters are served by priority, first come first served within one
/// (with fair shares, a caller waits behind callers holding fewer permits).
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

impl AdaptiveLimiter<MonotonicClock> {
    /// A limiter for `spec` on the monotonic clock.
    pub fn new(spec: AdaptiveSpec) -> Self {
        Self::with_clock(spec, false, MonotonicClock::new())
    }

    /// A limiter for `spec` that shares the limit among callers
    /// ([`Request::caller`]): under overload a freed permit goes to the waiting
    /// caller holding the fewest permits (max-min fairness); while permits are free
    /// nobody is limited.
    pub fn fair(spec: AdaptiveSpec) -> Self {
        Self::with_clock(spec, true, MonotonicClock::new())
    }
}

impl<C: Clock> AdaptiveLimiter<C> {
    /// A limiter for `spec` on `clock` (e.g. [`crate::clock::TokioClock`] in tests under
    /// `tokio::time::pause()`); `fair`: share the limit among callers.
    pub fn with_clock(spec: AdaptiveSpec, fair: bool, clock: C) -> Self {
        AdaptiveLimiter {
            inner: Arc::new(Inner::new(spec, fair, clock)),
        }
    }

    /// The spec the limiter runs.
    pub fn spec(&self) -> AdaptiveSpec {
        self.inner.spec()
    }

    /// The limit now.
    pub fn limit(&self) -> u32 {
        self.inner.stats().limit
    }

    /// The limit, permits held and waiting, baseline latency and shed counts now.
    pub fn stats(&self) -> AdaptiveStats {
        self.inner.stats()
    }

    /// A permit of normal priority now, or [`Shed::Busy`] at once.
    pub fn try_acquire(&self) -> Result<AdaptivePermit<C>, Shed> {
        self.try_acquire_with(Request::default())
    }

    /// A permit for `req` now, or [`Shed::Busy`] at once (never jumps the queue:
    /// while anyone waits, no permit is free).
    pub fn try_acquire_with(&self, req: Request) -> Result<AdaptivePermit<C>, Shed> {
        let ticket = self.inner.try_acquire(req)?;
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
        let max_wait_us = max_wait.map(|w| u64::try_from(w.as_micros()).unwrap_or(u64::MAX));
        let (id, deadline_us, rx) = match self.inner.enqueue(req, max_wait_us)? {
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
                let now = self.inner.clock.now_us();
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

/// A waiter's place in the queue: given up when dropped before an answer.
struct Waiting<'a, C: Clock> {
    inner: &'a Arc<Inner<C>>,
    id: WaiterId,
    rx: oneshot::Receiver<Answer>,
    done: bool,
}

impl<C: Clock> Drop for Waiting<'_, C> {
    fn drop(&mut self) {
        if !self.done {
            self.inner.abandon(self.id, &mut self.rx);
        }
    }
}
