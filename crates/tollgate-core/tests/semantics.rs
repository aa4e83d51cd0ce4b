//! Worked cases for every algorithm, on virtual time (microseconds).

use tollgate_core::{CheckError, Decision, Op, Policy, PolicyState};

const MS: u64 = 1_000;
const S: u64 = 1_000_000;

struct Key {
    policy: Policy,
    state: PolicyState,
}

fn key(spec: &str) -> Key {
    let policy: Policy = spec.parse().unwrap_or_else(|e| panic!("{e}"));
    let state = policy.init(0);
    Key { policy, state }
}

impl Key {
    fn try_at(&mut self, t: u64, cost: u64) -> Decision {
        self.policy
            .check(&mut self.state, t, cost, Op::Try)
            .unwrap()
    }
    fn ok(&mut self, t: u64) -> bool {
        self.try_at(t, 1).allowed
    }
    fn acquire(&mut self, t: u64, cost: u64) -> Decision {
        self.policy
            .check(&mut self.state, t, cost, Op::Acquire)
            .unwrap()
    }
    fn count(&mut self, t: u64, n: usize) -> usize {
        (0..n).filter(|_| self.ok(t)).count()
    }
}

#[test]
fn gcra_admits_exactly_the_burst_at_one_instant() {
    let mut k = key("gcra:rate=10/s,burst=5");
    assert_eq!(k.count(0, 6), 5);
    let d = k.try_at(0, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, Some(100 * MS));
    assert_eq!(d.remaining, 0);
    assert_eq!(d.reset_after_us, 500 * MS);
    assert!(k.ok(100 * MS));
}

#[test]
fn gcra_red_carpet() {
    let mut k = key("gcra:rate=1/10s,burst=3");
    assert!(k.ok(0));
    assert_eq!([k.ok(2 * S), k.ok(2 * S), k.ok(2 * S)], [true, true, false]);
    assert!(k.ok(45 * S));
}

#[test]
fn gcra_awkward_rate_never_drifts() {
    // 3/s: T = 333333.33us. Reservations land on the exact multiples, rounded up to the
    // microsecond, and after 3000 of them the schedule is still exactly 1000 s long.
    let mut k = key("gcra:rate=3/s,burst=1");
    let waits: Vec<u64> = (0..4).map(|_| k.acquire(0, 1).wait_us).collect();
    assert_eq!(waits, [0, 333_334, 666_667, 1_000_000]);
    let mut last = 0;
    for _ in 4..3000 {
        last = k.acquire(0, 1).wait_us;
    }
    assert_eq!(last, 999_666_667);
    assert_eq!(k.acquire(0, 1).wait_us, 1_000 * S);
    // A late arrival restarts the schedule from its own arrival, as GCRA must.
    let mut k = key("gcra:rate=3/s,burst=1");
    assert!(k.ok(0));
    assert!(!k.ok(333_333));
    assert!(k.ok(333_334));
    assert!(!k.ok(666_667));
    assert!(k.ok(666_668));
}

#[test]
fn fixed_window_lets_two_limits_through_a_boundary_and_sliding_log_does_not() {
    let mut fw = key("fixed-window:limit=100,window=1s");
    let mut sl = key("sliding-log:limit=100,window=1s");
    assert_eq!(fw.count(990 * MS, 100), 100);
    assert_eq!(fw.count(1010 * MS, 100), 100);
    assert_eq!(sl.count(990 * MS, 100), 100);
    assert_eq!(sl.count(1010 * MS, 100), 0);
    let d = sl.try_at(1010 * MS, 1);
    assert_eq!(d.retry_after_us, Some(980 * MS));
    assert!(sl.ok(1990 * MS));
}

#[test]
fn fixed_window_first_alignment_opens_at_the_first_request() {
    let mut k = key("fixed-window:limit=2,window=1s,align=first");
    assert!(k.ok(700 * MS));
    assert!(k.ok(1200 * MS));
    assert!(!k.ok(1699 * MS));
    assert!(k.ok(1700 * MS));
    let mut clock = key("fixed-window:limit=2,window=1s");
    assert!(clock.ok(700 * MS));
    assert!(clock.ok(900 * MS));
    assert!(clock.ok(1000 * MS));
}

#[test]
fn limit_req_without_burst_rejects_a_request_sooner_than_one_interval() {
    let mut k = key("limit-req:rate=1/s,burst=0");
    assert!(k.ok(0));
    let d = k.try_at(500 * MS, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, Some(500 * MS));
    assert!(k.ok(1000 * MS));
}

#[test]
fn limit_req_burst_and_delay_follow_nginx() {
    // rate=10r/s burst=5: excess grows by 1000 per request at one instant.
    let mut k = key("limit-req:rate=10/s,burst=5");
    let waits: Vec<u64> = (0..7)
        .map(|_| k.try_at(0, 1))
        .map(|d| if d.allowed { d.wait_us } else { u64::MAX })
        .collect();
    // excess 0,1000,...,5000 -> delay excess*1000/10000 ms = 0,100,...,500 ms; 7th rejected.
    assert_eq!(
        waits,
        [0, 100_000, 200_000, 300_000, 400_000, 500_000, u64::MAX]
    );
    let mut k = key("limit-req:rate=10/s,burst=5,nodelay");
    assert!((0..6).all(|_| {
        let d = k.try_at(0, 1);
        d.allowed && d.wait_us == 0
    }));
    assert!(!k.ok(0));
    let mut k = key("limit-req:rate=10/s,burst=5,delay=2");
    let waits: Vec<u64> = (0..6).map(|_| k.try_at(0, 1).wait_us).collect();
    assert_eq!(waits, [0, 0, 0, 100_000, 200_000, 300_000]);
}

#[test]
fn limit_req_uses_nginx_integer_drain() {
    // 30/m = 500 milli-requests per second: one request per 2 s.
    let mut k = key("limit-req:rate=30/m,burst=1,nodelay");
    assert!(k.ok(0));
    assert!(k.ok(0)); // excess 1000 <= burst 1000
    assert!(!k.ok(1999 * MS)); // drained 999 -> excess 1001 + 1000 > 1000
    assert!(k.ok(2000 * MS)); // drained 1000 -> excess 1000
}

#[test]
fn token_bucket_starts_full_and_refills_continuously() {
    let mut k = key("token-bucket:rate=3/s,capacity=3");
    assert_eq!(k.count(0, 4), 3);
    // Fractional refill is kept: one token after exactly 333333.33us, so at 333334us.
    assert!(!k.ok(333_333));
    assert!(k.ok(333_334));
}

#[test]
fn leaky_bucket_meter_drains_continuously() {
    let mut k = key("leaky-bucket:rate=2/s,capacity=2");
    assert_eq!(k.count(0, 3), 2);
    assert!(!k.ok(499_999));
    assert!(k.ok(500_000));
}

#[test]
fn sliding_window_buckets_and_weighted() {
    let mut k = key("sliding-window:limit=4,window=1s,buckets=4");
    assert_eq!(k.count(100 * MS, 4), 4);
    // Bucket [0,250ms) leaves the window when the bucket starting at 1s begins.
    let d = k.try_at(999 * MS, 1);
    assert_eq!(d.retry_after_us, Some(MS));
    assert!(k.ok(1000 * MS));

    let mut w = key("sliding-window:limit=10,window=1s,mode=weighted");
    assert_eq!(w.count(500 * MS, 10), 10);
    // At 1.25s: estimate = 10 * 0.75 + 0 = 7.5 -> 2 more fit (9.5), not 3.
    assert_eq!(w.count(1250 * MS, 3), 2);
    let d = w.try_at(1250 * MS, 1);
    // 10*(1s - e) + 3*1s <= 10*1s  <=>  e >= 300ms
    assert_eq!(d.retry_after_us, Some(50 * MS));
}

#[test]
fn smooth_bursty_pays_the_previous_debt() {
    let mut k = key("smooth-bursty:rate=2/s");
    // Guava: the first acquire of 10 permits is free, the next waits 5 s.
    assert_eq!(k.acquire(0, 10).wait_us, 0);
    assert_eq!(k.acquire(0, 1).wait_us, 5 * S);
    // try with timeout 0 fails while nextFree > now.
    let d = k.try_at(S, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, Some(4_500 * MS));
}

#[test]
fn smooth_warmup_starts_cold() {
    // Guava's javadoc: create(2.0, 4, SECONDS): cold interval 1.5s... first waits ramp down.
    let mut k = key("smooth-warmup:rate=2/s,warmup=4s");
    let mut waits = Vec::new();
    let mut t = 0;
    for _ in 0..8 {
        let d = k.acquire(t, 1);
        waits.push(d.wait_us);
        t += d.wait_us;
    }
    assert_eq!(waits[0], 0);
    assert!(
        waits[1] > waits[4],
        "cold start: early waits are longer: {waits:?}"
    );
    assert_eq!(
        *waits.last().unwrap(),
        500 * MS,
        "stable at 1/rate: {waits:?}"
    );
}

#[test]
fn shaper_schedules_and_bounds_the_queue() {
    let mut k = key("shaper:rate=10/s,queue=2");
    let d: Vec<(bool, u64)> = (0..4)
        .map(|_| k.try_at(0, 1))
        .map(|d| (d.allowed, d.wait_us))
        .collect();
    assert_eq!(
        d,
        [(true, 0), (true, 100 * MS), (true, 200 * MS), (false, 0)]
    );
    let d = k.try_at(0, 1);
    assert_eq!(d.retry_after_us, Some(100 * MS));
    // At 100ms the first queued request is released: a place is free again.
    let d = k.try_at(100 * MS, 1);
    assert!(d.allowed);
    assert_eq!(d.wait_us, 200 * MS);
}

#[test]
fn concurrency_holds_and_releases() {
    let policy: Policy = "concurrency:limit=2".parse().unwrap();
    let mut s = policy.init(0);
    let hold = |s: &mut PolicyState, t, h| policy.check_hold(s, t, 1, Some(h), Op::Try).unwrap();
    assert!(hold(&mut s, 0, 100).allowed);
    assert!(hold(&mut s, 10, 50).allowed);
    let d = hold(&mut s, 20, 10);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, Some(40));
    assert!(hold(&mut s, 60, 10).allowed);
    // Acquire waits for the earliest release.
    let d = policy
        .check_hold(&mut s, 61, 1, Some(5), Op::Acquire)
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.wait_us, 9);
    // Open permits are released by refund.
    let mut s = policy.init(0);
    assert!(policy.check(&mut s, 0, 2, Op::Try).unwrap().allowed);
    assert!(!policy.check(&mut s, 0, 1, Op::Try).unwrap().allowed);
    assert_eq!(
        policy.check(&mut s, 0, 1, Op::Try).unwrap().retry_after(),
        None
    );
    policy.refund(&mut s, 0, 1);
    assert!(policy.check(&mut s, 0, 1, Op::Try).unwrap().allowed);
}

#[test]
fn cost_that_never_fits_is_an_error_not_a_reject() {
    for spec in [
        "gcra:rate=10/s,burst=5",
        "token-bucket:rate=10/s,capacity=5",
        "leaky-bucket:rate=10/s,capacity=5",
        "fixed-window:limit=5,window=1s",
        "sliding-log:limit=5,window=1s",
        "sliding-window:limit=5,window=1s,buckets=5",
        "sliding-window:limit=5,window=1s",
        "limit-req:rate=10/s,burst=4",
        "concurrency:limit=5",
    ] {
        let mut k = key(spec);
        assert_eq!(
            k.policy.check(&mut k.state, 0, 6, Op::Try),
            Err(CheckError::InsufficientCapacity {
                cost: 6,
                capacity: 5
            }),
            "{spec}"
        );
        assert_eq!(
            k.policy
                .check(&mut k.state, 0, u64::MAX, Op::Acquire)
                .unwrap_err(),
            CheckError::InsufficientCapacity {
                cost: u64::MAX,
                capacity: 5
            }
        );
        assert_eq!(
            k.policy.check(&mut k.state, 0, 0, Op::Try),
            Err(CheckError::ZeroCost)
        );
        assert!(k.ok(0), "{spec}: state untouched by the errors");
    }
}

#[test]
fn huge_costs_and_times_saturate_instead_of_panicking() {
    for spec in [
        "smooth-bursty:rate=1/d",
        "smooth-warmup:rate=1/d,warmup=1d",
        "shaper:rate=1/d,queue=1",
    ] {
        let mut k = key(spec);
        for t in [0, u64::MAX / 2, u64::MAX - 1] {
            let _ = k.acquire(t, u64::MAX);
            let _ = k.try_at(t, u64::MAX);
        }
    }
    let mut k = key("gcra:rate=1000000/s,burst=1099511627776");
    assert!(k.try_at(u64::MAX / 2, 1099511627776).allowed);
    // Times past MAX_TIME_US are clamped to it: still the same instant, burst spent.
    let d = k.try_at(u64::MAX, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, Some(1));
}

#[test]
fn acquire_reserves_in_fifo_order_and_respects_max_wait() {
    let mut k = key("gcra:rate=10/s,burst=1,max-wait=250ms");
    assert_eq!(k.acquire(0, 1).wait_us, 0);
    assert_eq!(k.acquire(0, 1).wait_us, 100 * MS);
    assert_eq!(k.acquire(0, 1).wait_us, 200 * MS);
    let d = k.acquire(0, 1);
    assert!(!d.allowed, "300ms > max-wait");
    assert_eq!(d.retry_after_us, Some(300 * MS));
    // The rejected acquire reserved nothing.
    assert_eq!(k.acquire(50 * MS, 1).wait_us, 250 * MS);
    // A try cannot overtake the reservations.
    assert!(!k.ok(299 * MS));
}

#[test]
fn peek_changes_nothing_and_refund_gives_back() {
    let mut k = key("gcra:rate=10/s,burst=2");
    let before = k.state.clone();
    let d = k.policy.peek(&k.state, 0, 1).unwrap();
    assert!(d.allowed && d.remaining == 1);
    assert_eq!(k.state, before);
    assert_eq!(k.count(0, 3), 2);
    k.policy.refund(&mut k.state, 0, 1);
    assert!(k.ok(0));
    // Reset forgets everything.
    assert!(!k.ok(0));
    k.policy.reset(&mut k.state, 0);
    assert_eq!(k.count(0, 3), 2);
    // Never beyond full capacity.
    let mut k = key("gcra:rate=10/s,burst=2");
    k.policy.refund(&mut k.state, 0, 5);
    assert_eq!(k.count(0, 3), 2);
}

#[test]
fn shadow_mode_reports_but_never_rejects() {
    let mut k = key("fixed-window:limit=1,window=1s,shadow=true");
    assert!(k.ok(0));
    let d = k.try_at(0, 1);
    assert!(d.allowed && d.shadow_rejected);
}

#[test]
fn a_state_from_another_policy_is_replaced() {
    let gcra: Policy = "gcra:rate=1/s,burst=1".parse().unwrap();
    let fw: Policy = "fixed-window:limit=1,window=1s".parse().unwrap();
    let mut s = gcra.init(0);
    assert!(fw.check(&mut s, 0, 1, Op::Try).unwrap().allowed);
    assert!(matches!(s, PolicyState::FixedWindow(_)));
}
