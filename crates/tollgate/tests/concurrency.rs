//! Concurrency limiters: RAII permits, FIFO waiting, timeouts, per-key tracking.

use std::time::Duration;

use tollgate::concurrency::{ConcurrencyError, ConcurrencyLimiter, KeyedConcurrencyLimiter};

#[tokio::test(start_paused = true)]
async fn permits_are_released_on_drop_and_waiters_served_in_order() {
    let limiter = ConcurrencyLimiter::new(2);
    let a = limiter.try_acquire().unwrap();
    let b = limiter.try_acquire().unwrap();
    assert_eq!(limiter.in_flight(), 2);
    assert_eq!(
        limiter.try_acquire().unwrap_err(),
        ConcurrencyError::Busy { limit: 2 }
    );
    assert_eq!(
        limiter.try_acquire_n(3).unwrap_err(),
        ConcurrencyError::InsufficientCapacity { asked: 3, limit: 2 }
    );

    // Two waiters queue in order; the first asks for 2 permits and blocks the second.
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let l1 = limiter.clone();
    let tx1 = order_tx.clone();
    let w1 = tokio::spawn(async move {
        let p = l1.acquire_n(2).await.unwrap();
        tx1.send("big").unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(p);
    });
    tokio::task::yield_now().await;
    let l2 = limiter.clone();
    let w2 = tokio::spawn(async move {
        let _p = l2.acquire().await.unwrap();
        order_tx.send("small").unwrap();
    });
    tokio::task::yield_now().await;
    drop(a); // one permit free: not enough for "big", and "small" may not overtake it
    tokio::task::yield_now().await;
    assert!(
        limiter.try_acquire().is_err(),
        "try_acquire never jumps the queue"
    );
    drop(b);
    w1.await.unwrap();
    w2.await.unwrap();
    assert_eq!(order_rx.recv().await, Some("big"));
    assert_eq!(order_rx.recv().await, Some("small"));
    assert_eq!(limiter.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn acquire_with_a_timeout() {
    let limiter = ConcurrencyLimiter::new(1);
    let held = limiter.acquire().await.unwrap();
    let start = tokio::time::Instant::now();
    let r = limiter.acquire_timeout(1, Duration::from_millis(50)).await;
    assert_eq!(r.unwrap_err(), ConcurrencyError::Busy { limit: 1 });
    assert_eq!(
        tokio::time::Instant::now() - start,
        Duration::from_millis(50)
    );
    drop(held);
    assert!(limiter
        .acquire_timeout(1, Duration::from_millis(50))
        .await
        .is_ok());
}

#[tokio::test(start_paused = true)]
async fn keyed_permits_per_key_and_keys_forgotten_when_unused() {
    let limiter: KeyedConcurrencyLimiter<String> = KeyedConcurrencyLimiter::new(1, 2);
    let a = limiter.try_acquire("a", 1).unwrap();
    assert!(limiter.try_acquire("a", 1).is_err());
    let b = limiter.try_acquire("b", 1).unwrap();
    assert_eq!(limiter.len(), 2);
    // A third key while two hold permits: refused, and nothing is leaked.
    assert_eq!(
        limiter.try_acquire("c", 1).unwrap_err(),
        ConcurrencyError::TooManyKeys { max: 2 }
    );
    // A waiter on "a" gets the permit when it is released.
    let l = limiter.clone();
    let waiter =
        tokio::spawn(async move { l.acquire("a", 1, Duration::from_secs(1)).await.map(|_| ()) });
    tokio::task::yield_now().await;
    drop(a);
    waiter.await.unwrap().unwrap();
    drop(b);
    assert!(
        limiter.is_empty(),
        "keys with no permit held or awaited are forgotten"
    );
    assert!(limiter.try_acquire("c", 1).is_ok());
}

#[test]
fn concurrent_threads_never_exceed_the_limit() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    let limiter = ConcurrencyLimiter::new(3);
    let inside = Arc::new(AtomicU32::new(0));
    let max_seen = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (l, inside, max_seen) = (limiter.clone(), inside.clone(), max_seen.clone());
            std::thread::spawn(move || {
                for _ in 0..100_000 {
                    if let Ok(p) = l.try_acquire_n(2) {
                        let now = inside.fetch_add(2, Ordering::SeqCst) + 2;
                        max_seen.fetch_max(now, Ordering::SeqCst);
                        inside.fetch_sub(2, Ordering::SeqCst);
                        drop(p);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(max_seen.load(Ordering::SeqCst) <= 3);
}
