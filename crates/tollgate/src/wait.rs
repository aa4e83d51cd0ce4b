//! Waiting out an admitted reservation, asynchronously or by blocking the thread.

use std::time::Duration;

/// Gives a reservation back if the waiter goes away before its time (a dropped
/// future): the capacity is not lost, and waiters queued behind keep their places.
pub(crate) struct RefundOnDrop<F: FnMut()> {
    refund: Option<F>,
}

impl<F: FnMut()> RefundOnDrop<F> {
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

impl<F: FnMut()> Drop for RefundOnDrop<F> {
    fn drop(&mut self) {
        if let Some(mut refund) = self.refund.take() {
            refund();
        }
    }
}

/// Sleeps `wait` on tokio's timer; dropping the future refunds through `guard`.
pub(crate) async fn sleep_or_refund<F: FnMut()>(wait: Duration, guard: RefundOnDrop<F>) {
    tokio::time::sleep(wait).await;
    guard.disarm();
}

/// Blocks the thread for `wait`.
pub(crate) fn block(wait: Duration) {
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
}
