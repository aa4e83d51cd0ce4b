//! Waiting out an admitted reservation, asynchronously or by blocking the thread.

use std::time::Duration;

/// Gives a reservation back if the waiter goes away before its time (a dropped
/// future): the capacity is not lost, and waiters queued behind keep their places.
/// The one refund-on-drop guard: the limiters, the tower layer and the server's
/// `/v1/acquire` all wait behind it.
///
/// ```
/// let refunded = std::cell::Cell::new(false);
/// drop(tollgate::wait::RefundOnDrop::new(|| refunded.set(true))); // the waiter went away
/// assert!(refunded.get());
/// let kept = tollgate::wait::RefundOnDrop::new(|| unreachable!());
/// kept.disarm(); // the wait completed: the reservation stands
/// ```
pub struct RefundOnDrop<F: FnOnce()> {
    refund: Option<F>,
}

impl<F: FnOnce()> RefundOnDrop<F> {
    /// A guard that calls `refund` when dropped armed.
    pub fn new(refund: F) -> Self {
        RefundOnDrop {
            refund: Some(refund),
        }
    }

    /// The wait completed: keep the reservation.
    pub fn disarm(mut self) {
        self.refund = None;
    }
}

impl<F: FnOnce()> Drop for RefundOnDrop<F> {
    fn drop(&mut self) {
        if let Some(refund) = self.refund.take() {
            refund();
        }
    }
}

/// A random extra delay after an admitted wait, of up to `max` (governor's
/// `Jitter`): callers admitted for the same instant spread out instead of reaching
/// the service together. Jitter only ever adds: a request never starts before the
/// slot its limiter admitted, so no limit is exceeded.
///
/// ```
/// use std::time::Duration;
/// use tollgate::wait::Jitter;
/// let jitter = Jitter::up_to(Duration::from_millis(50));
/// assert!((0..100).all(|_| jitter.draw() < Duration::from_millis(50)));
/// assert_eq!(Jitter::default().draw(), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Jitter {
    max: Duration,
}

impl Jitter {
    /// Up to `max` more, drawn uniformly for each wait.
    pub fn up_to(max: Duration) -> Self {
        Jitter { max }
    }

    /// One delay, uniform in `[0, max)` (zero without a `max`).
    pub fn draw(&self) -> Duration {
        use std::hash::BuildHasher;
        use std::sync::atomic::{AtomicU64, Ordering};
        static DRAWS: AtomicU64 = AtomicU64::new(0);
        let max = self.max.as_nanos().min(u128::from(u64::MAX)) as u64;
        if max == 0 {
            return Duration::ZERO;
        }
        // A process-random hash of a counter: uniform enough to spread waiters, no
        // generator to share.
        let n = DRAWS.fetch_add(1, Ordering::Relaxed);
        let r = std::collections::hash_map::RandomState::new().hash_one(n);
        Duration::from_nanos(((u128::from(r) * u128::from(max)) >> 64) as u64)
    }
}

/// Sleeps `wait` on tokio's timer; dropping the future refunds through `guard`.
pub(crate) async fn sleep_or_refund<F: FnOnce()>(wait: Duration, guard: RefundOnDrop<F>) {
    tokio::time::sleep(wait).await;
    guard.disarm();
}

/// Blocks the thread for `wait`.
pub(crate) fn block(wait: Duration) {
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
}

#[cfg(any(feature = "tower", feature = "redis"))]
/// Gives `cost` back to `key` from where nothing can wait (a drop, a response on its
/// way out): at once when the store answers at once (memory), else on a task of the
/// current Tokio runtime (none: the units come back when the state replenishes).
pub(crate) fn refund_detached<L, K>(limiter: &L, key: &K, cost: u64)
where
    L: crate::RateLimiter<K> + Clone + 'static,
    K: Clone + Send + Sync + 'static,
{
    use std::future::Future;
    use std::task::{Context, Waker};
    let (limiter, key) = (limiter.clone(), key.clone());
    let mut refund = Box::pin(async move {
        let _ = limiter.refund(&key, cost).await;
    });
    if refund
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_pending()
    {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(refund);
        }
    }
}
