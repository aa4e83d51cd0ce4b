//! `Limiter`: the direct limiter, against the core's reference decisions.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::{Clock, ManualClock, TokioClock};
use tollgate::{Limiter, Op, Policy, RuleSet};

fn manual() -> Arc<ManualClock> {
    Arc::new(ManualClock::new())
}

proptest! {
    /// The limiter (lock-free GCRA, or mutex + rule set) decides exactly as the pure
    /// core does, for try, acquire, charge and Envoy's counting.
    #[test]
    fn limiter_matches_the_core(
        spec in prop::sample::select(&[
            "gcra:rate=3/s,burst=2", "gcra:rate=10/s,burst=5,max-wait=300ms",
            "token-bucket:rate=7/m,capacity=3", "sliding-log:limit=3,window=1s",
            "limit-req:rate=10/s,burst=2", "fixed-window:limit=2,window=500ms",
            "gcra:rate=10/s,burst=3,max-debt=4", "gcra:rate=100/s,burst=2,shadow=true",
        ][..]),
        trace in prop::collection::vec((0..400_000u64, 0..6u64, 0..4u8), 1..100),
    ) {
        let policy: Policy = spec.parse().unwrap();
        let clock = manual();
        let limiter = Limiter::with_clock(policy.clone(), clock.clone());
        let mut state = policy.init(0);
        for (gap, cost, op) in trace {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now_us();
            let op = [Op::Try, Op::Acquire, Op::Charge, Op::Count][usize::from(op)];
            let expected = policy.check(&mut state, now, cost, op).map_err(tollgate::Error::from);
            let got = limiter.check_rules(cost, op).map(|d| d.decision);
            prop_assert_eq!(got, expected);
        }
    }
}

#[test]
fn clones_share_one_limit() {
    let clock = manual();
    let a = Limiter::with_clock(
        "gcra:rate=1/s,burst=3".parse::<Policy>().unwrap(),
        clock.clone(),
    );
    let b = a.clone();
    assert!(a.check(1).unwrap().allowed);
    assert!(b.check(1).unwrap().allowed);
    assert!(a.check(1).unwrap().allowed);
    assert!(!b.check(1).unwrap().allowed);
}

#[test]
fn peek_refund_and_reset() {
    for spec in ["gcra:rate=1/s,burst=2", "token-bucket:rate=1/s,capacity=2"] {
        let limiter = Limiter::with_clock(spec.parse::<Policy>().unwrap(), manual());
        assert_eq!(limiter.peek(1).unwrap().decision.remaining, 1);
        assert!(limiter.check(2).unwrap().allowed);
        assert!(!limiter.peek(1).unwrap().decision.allowed);
        limiter.refund(1);
        assert!(limiter.check(1).unwrap().allowed, "{spec}");
        assert!(!limiter.check(1).unwrap().allowed, "{spec}");
        limiter.reset();
        assert!(limiter.check(2).unwrap().allowed, "{spec}");
    }
}

#[test]
fn reconfiguration_carries_state_where_it_has_a_meaning() {
    let clock = manual();
    let limiter = Limiter::with_clock(
        "gcra:rate=1/s,burst=2".parse::<Policy>().unwrap(),
        clock.clone(),
    );
    assert!(limiter.check(2).unwrap().allowed);
    // GCRA to GCRA: the TAT (debt) carries over, now with a larger burst.
    limiter.set_rules("gcra:rate=1/s,burst=3".parse::<Policy>().unwrap());
    assert!(limiter.check(1).unwrap().allowed);
    assert!(!limiter.check(1).unwrap().allowed);
    // To another algorithm: fresh.
    limiter.set_rules("fixed-window:limit=1,window=1s".parse::<Policy>().unwrap());
    assert!(limiter.check(1).unwrap().allowed);
    assert!(!limiter.check(1).unwrap().allowed);
    // Same window, new limit: the count carries over.
    limiter.set_rules("fixed-window:limit=2,window=1s".parse::<Policy>().unwrap());
    assert!(limiter.check(1).unwrap().allowed);
    assert!(!limiter.check(1).unwrap().allowed);
    // Back to GCRA from a rule set: a fresh TAT (nothing to carry).
    limiter.set_rules(RuleSet::parse(&["gcra:rate=1/s,burst=1"]).unwrap());
    assert!(limiter.check(1).unwrap().allowed);
    assert_eq!(
        limiter.rules().policies()[0].to_string(),
        "gcra:rate=1/s,burst=1"
    );
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_in_fifo_order_on_tokio_time() {
    let limiter = Limiter::with_clock(
        "gcra:rate=10/s,burst=1".parse::<Policy>().unwrap(),
        TokioClock::new(),
    );
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..4u64 {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move {
            // Arrive in order, 1 ms apart.
            tokio::time::sleep(Duration::from_millis(i)).await;
            let _ = l.acquire(1).await.unwrap();
            tokio::time::Instant::now() - start
        }));
    }
    let mut done = Vec::new();
    for t in tasks {
        done.push(t.await.unwrap());
    }
    assert_eq!(done, [0, 100, 200, 300].map(Duration::from_millis));
}

/// On the default clock, `acquire` comes back no earlier than its admission: the
/// limiter's own clock, read when it returns, is at least the wait past a reading
/// taken before the call (the admission is at or after that reading). Sliding-log
/// waiters: five admitted at once, then five at each window's turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_returns_no_earlier_than_its_admission_on_the_default_clock() {
    let limiter = Limiter::new(
        "sliding-log:limit=5,window=200ms"
            .parse::<Policy>()
            .unwrap(),
    );
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move {
                let before = l.clock().now_us();
                let d = l.acquire(1).await.unwrap();
                (l.clock().now_us() - before, d.wait_us)
            })
        })
        .collect();
    let mut waited = 0;
    for t in tasks {
        let (back, wait) = t.await.unwrap();
        assert!(
            back >= wait,
            "back after {back} us, admitted after {wait} us"
        );
        waited += u64::from(wait > 0);
    }
    assert!(waited > 0, "none of 20 waited: the test proved nothing");
}

/// Waiters admitted for one turn of a window come back one at a time, in the order
/// they reserved (Tokio wakes every timer of a millisecond together, and two worker
/// threads would run them in any order; even one worker runs the last one woken
/// first, from its LIFO slot): the order `acquire` returns is the order of admission.
/// One worker thread, so that what a caller does after its return (here, noting it)
/// is not raced by the next caller on another thread: release is what is ordered.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn waiters_admitted_for_one_turn_come_back_in_the_order_they_reserved() {
    use std::sync::Mutex;
    // The limiter's clock stands still: the first eight pass at 0, and each of the
    // next eight is admitted at 100 ms exactly, a wait Tokio sleeps in real time.
    let policy = "sliding-log:limit=8,window=100ms"
        .parse::<Policy>()
        .unwrap();
    let limiter = Limiter::with_clock(policy, manual());
    for _ in 0..8 {
        assert_eq!(limiter.acquire(1).await.unwrap().wait_us, 0);
    }
    let back: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut reserved = None;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (l, back) = (limiter.clone(), back.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let after = reserved.replace(rx);
        tasks.push(tokio::spawn(async move {
            if let Some(previous) = after {
                previous.await.unwrap(); // the one before has reserved
            }
            let mut turn = std::pin::pin!(l.acquire(1));
            assert!(
                futures::poll!(turn.as_mut()).is_pending(),
                "waits for the window"
            );
            tx.send(()).unwrap();
            assert_eq!(turn.await.unwrap().wait_us, 100_000);
            back.lock().unwrap().push(i);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*back.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

#[tokio::test(start_paused = true)]
async fn acquire_respects_max_wait_and_reserves_nothing_on_reject() {
    let limiter = Limiter::with_clock(
        "gcra:rate=10/s,burst=1,max-wait=150ms"
            .parse::<Policy>()
            .unwrap(),
        TokioClock::new(),
    );
    // Three arrive together: waits of 0 and 100 ms; the third's 200 ms exceeds max-wait.
    let (a, b, c) = tokio::join!(limiter.acquire(1), limiter.acquire(1), limiter.acquire(1));
    assert!(a.unwrap().allowed);
    let b = b.unwrap();
    assert!(b.allowed && b.wait() == Duration::from_millis(100));
    let c = c.unwrap();
    assert!(!c.allowed);
    assert_eq!(c.retry_after(), Some(Duration::from_millis(200)));
    // The rejected acquire reserved nothing: at 100 ms the next slot is at 200 ms.
    let d = limiter.acquire(1).await.unwrap();
    assert_eq!(d.wait(), Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_gives_its_reservation_back() {
    for spec in ["gcra:rate=10/s,burst=1", "sliding-log:limit=1,window=100ms"] {
        let limiter = Limiter::with_clock(spec.parse::<Policy>().unwrap(), TokioClock::new());
        let _ = limiter.acquire(1).await.unwrap();
        // Reserve the slot at 100 ms, then give up after 10 ms.
        let waiting = tokio::time::timeout(Duration::from_millis(10), limiter.acquire(1)).await;
        assert!(waiting.is_err(), "{spec}: still waiting");
        // The slot was given back: the next waiter gets it at 100 ms, not 200 ms.
        let d = limiter.acquire(1).await.unwrap();
        assert_eq!(d.wait(), Duration::from_millis(90), "{spec}");
    }
}

#[test]
fn acquire_blocking_sleeps_for_the_wait() {
    let limiter = Limiter::new("gcra:rate=50/s,burst=1".parse::<Policy>().unwrap());
    let clock = tollgate::clock::MonotonicClock::new();
    let start = clock.now_us();
    let _ = limiter.acquire_blocking(1).unwrap();
    let d = limiter.acquire_blocking(1).unwrap();
    let took = Duration::from_micros(clock.now_us() - start);
    assert!(d.allowed);
    // At most the 20 ms interval; less by however long the machine took between the
    // two calls, and none only if that was the whole interval.
    assert!(d.wait() <= Duration::from_millis(20), "{d:?}");
    assert!(
        d.wait() > Duration::ZERO || took >= Duration::from_millis(20),
        "{d:?} after {took:?}"
    );
    // After blocking for the wait, the limiter's clock has passed the reservation.
    assert!(
        limiter
            .peek(1)
            .unwrap()
            .decision
            .retry_after()
            .unwrap_or_default()
            <= Duration::from_millis(20)
    );
}

#[test]
fn rule_sets_decide_all_or_nothing() {
    let limiter = Limiter::with_clock(
        RuleSet::parse(&["gcra:rate=10/s,burst=2", "fixed-window:limit=3,window=1m"]).unwrap(),
        manual(),
    );
    assert!(limiter.check(1).unwrap().allowed);
    assert!(limiter.check(1).unwrap().allowed);
    let d = limiter.check_rules(1, Op::Try).unwrap();
    assert!(!d.decision.allowed);
    assert_eq!(d.policies[1].remaining, 1, "the window was not charged");
}

/// The habit of other limiters, `is_err()` on the check, works through
/// `into_result` (a `Decision` is `#[must_use]`: a bare `check()?;` warns).
#[test]
fn into_result_turns_a_reject_into_an_error() {
    let clock = manual();
    let limiter = Limiter::with_clock(
        "gcra:rate=1/s,burst=1".parse::<Policy>().unwrap(),
        clock.clone(),
    );
    let mut passed = 0;
    for _ in 0..10 {
        if limiter.check(1).unwrap().into_result().is_err() {
            continue;
        }
        passed += 1;
    }
    assert_eq!(passed, 1);
    let e = limiter.check(1).unwrap().into_result().unwrap_err();
    assert_eq!(e.retry_after_us, Some(1_000_000));
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check(1).unwrap().into_result().is_ok());
}

/// Jitter comes on top of the limiter's wait, never before it, and only after a wait
/// (as governor): the first request of a 1/s limit goes at once, the second between
/// 1 s and 1.1 s after it.
#[tokio::test(start_paused = true)]
async fn jitter_adds_to_the_wait_and_never_shortens_it() {
    let limiter = Limiter::with_clock(
        "gcra:rate=1/s,burst=1".parse::<Policy>().unwrap(),
        tollgate::clock::TokioClock::new(),
    );
    let jitter = tollgate::wait::Jitter::up_to(Duration::from_millis(100));
    let start = tokio::time::Instant::now();
    assert!(
        limiter
            .acquire_with_jitter(1, jitter)
            .await
            .unwrap()
            .allowed
    );
    let first = start.elapsed();
    let d = limiter.acquire_with_jitter(1, jitter).await.unwrap();
    assert!(d.allowed);
    let second = start.elapsed();
    assert_eq!(first, Duration::ZERO, "no wait, no jitter");
    assert!(
        second >= Duration::from_secs(1) && second < Duration::from_millis(1_200),
        "{second:?}"
    );
}
