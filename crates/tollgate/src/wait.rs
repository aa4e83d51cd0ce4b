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

/// Sleeps out an admitted wait, then comes back in turn: the waiters of one
/// [`Turns`] (one limiter's, one layer's) are released one at a time in admission
/// order, to the timer's resolution (a millisecond; within one, in the order they
/// took their places, which for one key is the order of admission). Dropping the future refunds through `guard` and gives up its turn.
/// Every wait of the library goes through it: the limiters' `acquire`, the tower
/// layer's paced requests and the server's `/v1/acquire`.
///
/// Tokio wakes every timer of one millisecond together and runs the last one woken
/// first (and several worker threads run them at once), so five waiters admitted for
/// one instant would come back in any order; here each is let go only after every
/// waiter ordered before it. What is ordered is the release: callers let go one after
/// the other on two threads go on at once. A waiter whose future is not being polled
/// holds the ones after it for at most [`TURN_GRACE`] past their time.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::time::Duration;
/// use tollgate::wait::{sleep_or_refund, RefundOnDrop, Turns};
/// let turns = Turns::default(); // one per limiter
/// sleep_or_refund(&turns, Duration::from_millis(2), RefundOnDrop::new(|| unreachable!())).await;
/// # });
/// ```
pub async fn sleep_or_refund<F: FnOnce()>(turns: &Turns, wait: Duration, guard: RefundOnDrop<F>) {
    let now = tokio::time::Instant::now();
    // A wait past what an instant holds (decades) ends as far away as Tokio sleeps.
    let due = (now.checked_add(wait)).unwrap_or(now + Duration::from_secs(1 << 30));
    let place = turns.take(due);
    tokio::time::sleep_until(due).await;
    place.come_back(due + TURN_GRACE).await;
    guard.disarm();
}

/// How long past its time a waiter waits for one ordered before it to come back:
/// long enough for a busy machine to run a waiter its timer woke, short enough that
/// a future left unpolled (a bug of its holder) delays the others only that much.
pub const TURN_GRACE: Duration = Duration::from_millis(50);

/// The order the waiters of one limiter come back in, by (millisecond of the
/// admission, order of reservation). See [`sleep_or_refund`].
#[derive(Default)]
pub struct Turns {
    queue: std::sync::Mutex<turns::Queue>,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns").finish_non_exhaustive()
    }
}

impl Turns {
    fn lock(&self) -> std::sync::MutexGuard<'_, turns::Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self, due: tokio::time::Instant) -> turns::Place<'_> {
        let mut q = self.lock();
        q.reserved += 1;
        // The millisecond `due` falls in (rounded up, as Tokio's timer rounds), on
        // Tokio's clock as the sleep (a paused one in tests), counted from when the
        // first wait began (no later due can be before it).
        let origin = *q.origin.get_or_insert_with(tokio::time::Instant::now);
        let us = due.saturating_duration_since(origin).as_micros();
        let millisecond = u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX);
        let turn = (millisecond, q.reserved);
        let notify = std::sync::Arc::new(tokio::sync::Notify::new());
        q.waiting.insert(turn, notify.clone());
        turns::Place {
            turns: self,
            turn,
            notify,
        }
    }
}

mod turns {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use tokio::sync::Notify;

    type Turn = (u64, u64);

    #[derive(Default)]
    pub(super) struct Queue {
        pub(super) waiting: BTreeMap<Turn, Arc<Notify>>,
        pub(super) reserved: u64,
        /// When the first wait began: milliseconds count from it.
        pub(super) origin: Option<tokio::time::Instant>,
    }

    /// A waiter's place, given up when dropped.
    pub(super) struct Place<'a> {
        pub(super) turns: &'a super::Turns,
        pub(super) turn: Turn,
        pub(super) notify: Arc<Notify>,
    }

    impl Place<'_> {
        /// Waits until every waiter ordered before this one has come back, or `until`.
        pub(super) async fn come_back(self, until: tokio::time::Instant) {
            loop {
                let first = self.turns.lock().waiting.keys().next() == Some(&self.turn);
                // A wake-up sent between the check and the wait is kept as a permit.
                if first
                    || tokio::time::timeout_at(until, self.notify.notified())
                        .await
                        .is_err()
                {
                    return;
                }
            }
        }
    }

    impl Drop for Place<'_> {
        fn drop(&mut self) {
            let mut q = self.turns.lock();
            q.waiting.remove(&self.turn);
            if let Some(next) = q.waiting.values().next() {
                next.notify_one();
            }
        }
    }
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
