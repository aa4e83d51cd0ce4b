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
