//! Two threads hammering one key never admit more than the exact bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Clock, KeyedLimiter, KeyedOptions, Limiter, ManualClock, MonotonicClock, Policy};

const CHECKS_PER_THREAD: u64 = 500_000;

fn hammer(check: impl Fn() -> bool + Send + Sync + 'static) -> u64 {
    let check = Arc::new(check);
    let admitted = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (check, admitted) = (check.clone(), admitted.clone());
            std::thread::spawn(move || {
                for _ in 0..CHECKS_PER_THREAD {
                    if check() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

#[test]
fn frozen_clock_admits_exactly_the_burst() {
    for spec in [
        "gcra:rate=1000/s,burst=777",
        "token-bucket:rate=1000/s,capacity=777",
        "sliding-log:limit=777,window=1s",
        "fixed-window:limit=777,window=1s",
        "limit-req:rate=1000/s,burst=776,nodelay",
    ] {
        let clock = Arc::new(ManualClock::new());
        let limiter = Limiter::with_clock(spec.parse::<Policy>().unwrap(), clock);
        let l = limiter.clone();
        assert_eq!(hammer(move || l.check().unwrap().allowed), 777, "{spec}");

        let keyed: KeyedLimiter<u64, _> = KeyedLimiter::with_options(
            spec.parse::<Policy>().unwrap(),
            KeyedOptions::default(),
            Arc::new(ManualClock::new()),
        );
        assert_eq!(
            hammer(move || keyed.check(&42).unwrap().allowed),
            777,
            "keyed {spec}"
        );
    }
}

#[test]
fn real_clock_never_exceeds_burst_plus_elapsed_rate() {
    // 2 threads x 500k checks against 100k/s with a burst of 50, on the real clock:
    // admitted <= burst + rate * elapsed (+1 for the interval in progress).
    let rate = 100_000u64;
    let clock = MonotonicClock::new();
    let start = clock.now_us();
    let limiter = Limiter::with_clock(
        format!("gcra:rate={rate}/s,burst=50")
            .parse::<Policy>()
            .unwrap(),
        clock,
    );
    let l = limiter.clone();
    let admitted = hammer(move || l.check().unwrap().allowed);
    let elapsed_us = limiter.clock().now_us() - start;
    let bound = 50 + elapsed_us * rate / 1_000_000 + 1;
    assert!(
        admitted <= bound,
        "admitted {admitted} > bound {bound} over {elapsed_us}us"
    );
    assert!(
        admitted > 50,
        "the rate let more than the burst through over {elapsed_us}us"
    );

    let keyed: KeyedLimiter<&'static str> = KeyedLimiter::new(
        format!("gcra:rate={rate}/s,burst=50")
            .parse::<Policy>()
            .unwrap(),
    );
    let start = keyed.clock().now_us();
    let k = keyed.clone();
    let admitted = hammer(move || k.check(&"one").unwrap().allowed);
    let elapsed_us = keyed.clock().now_us() - start;
    let bound = 50 + elapsed_us * rate / 1_000_000 + 1;
    assert!(
        admitted <= bound,
        "keyed: admitted {admitted} > bound {bound}"
    );
}

#[test]
fn acquire_blocking_from_two_threads_is_paced() {
    // 2 threads x 20 blocking acquires at 1000/s, burst 1: 40 admissions need >= 39 ms.
    let limiter = Limiter::new("gcra:rate=1000/s,burst=1".parse::<Policy>().unwrap());
    let clock = MonotonicClock::new();
    let start = clock.now_us();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let l = limiter.clone();
            std::thread::spawn(move || (0..20).all(|_| l.acquire_blocking(1).unwrap().allowed))
        })
        .collect();
    assert!(threads.into_iter().all(|t| t.join().unwrap()));
    let elapsed = Duration::from_micros(clock.now_us() - start);
    assert!(elapsed >= Duration::from_millis(39), "{elapsed:?}");
}
