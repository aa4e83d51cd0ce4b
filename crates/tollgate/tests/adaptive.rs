//! AdaptiveLimiter: permits and their outcomes, cancel safety, the queueing-delay
//! target, concurrency stress, and closed-loop runs against a modelled upstream under
//! tokio's paused clock (deterministic time).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::adaptive::{AdaptiveLimiter, Priority, Request, Shed};
use tollgate::clock::TokioClock;

fn limiter(spec: &str) -> AdaptiveLimiter<TokioClock> {
    AdaptiveLimiter::with_clock(spec.parse().unwrap(), false, TokioClock::new())
}

#[tokio::test(start_paused = true)]
async fn a_permit_dropped_without_a_report_is_ignored() {
    let l = limiter("gradient:initial=2,min=1");
    for _ in 0..50 {
        let p = l.acquire().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(p);
    }
    let s = l.stats();
    assert_eq!((s.limit, s.in_flight, s.windows, s.admitted), (2, 0, 0, 50));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_gives_up_its_place_and_a_grant_it_missed() {
    let l = limiter("aimd:initial=1,queue-delay=10s");
    let held = l.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let l = l.clone();
        async move { l.acquire().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(l.stats().queued, 1);
    waiter.abort();
    let _ = waiter.await;
    assert_eq!(l.stats().queued, 0);
    drop(held);
    // The permit is free again: nobody holds it, nobody waits.
    assert_eq!(l.stats().in_flight, 0);
    assert!(l.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_shed_when_its_wait_passes_the_target() {
    let l = limiter("gradient:initial=1,queue-delay=30ms");
    let _held = l.try_acquire().unwrap();
    let start = tokio::time::Instant::now();
    let err = l.acquire().await.unwrap_err();
    assert_eq!(err, Shed::QueueDelay { waited_us: 30_000 });
    assert_eq!(start.elapsed(), Duration::from_millis(30));
    let err = l
        .acquire_with(Request::default(), Some(Duration::from_millis(5)))
        .await
        .unwrap_err();
    assert_eq!(err, Shed::MaxWait { waited_us: 5_000 });
    assert_eq!(l.stats().shed.queue_delay, 1);
}

#[tokio::test(start_paused = true)]
async fn critical_work_is_served_before_normal_and_sheddable_work_gives_way() {
    let l = limiter("aimd:initial=1,min=1,max=1,queue-delay=10s");
    let held = l.try_acquire().unwrap();
    let spawn = |p: Priority| {
        let l = l.clone();
        tokio::spawn(async move {
            let permit = l.acquire_with(Request::new(p), None).await?;
            let at = tokio::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(10)).await;
            permit.success();
            Ok::<_, Shed>(at)
        })
    };
    let shed = spawn(Priority::SHEDDABLE);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let normal = spawn(Priority::NORMAL);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let critical = spawn(Priority::CRITICAL);
    tokio::time::sleep(Duration::from_millis(1)).await;
    drop(held);
    assert_eq!(shed.await.unwrap().unwrap_err(), Shed::Outranked);
    let (normal, critical) = (
        normal.await.unwrap().unwrap(),
        critical.await.unwrap().unwrap(),
    );
    assert!(critical < normal);
}

fn two_threads() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn two_threads_never_hold_more_than_the_limit() {
    two_threads().block_on(async {
        let l = AdaptiveLimiter::new(
            "aimd:min=3,max=3,initial=3,queue-delay=10s"
                .parse()
                .unwrap(),
        );
        let held = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (l, held, most) = (l.clone(), held.clone(), most.clone());
                tokio::spawn(async move {
                    for n in 0..300 {
                        let permit = if (i + n) % 3 == 0 {
                            match l.try_acquire() {
                                Ok(p) => p,
                                Err(_) => continue,
                            }
                        } else {
                            l.acquire().await.unwrap()
                        };
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        held.fetch_sub(1, Ordering::SeqCst);
                        permit.success();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert_eq!(l.stats().in_flight, 0);
        assert_eq!(l.stats().queued, 0);
    });
}

#[test]
fn waiters_cancelled_as_they_are_granted_never_leak_a_permit() {
    two_threads().block_on(async {
        let l = AdaptiveLimiter::new(
            "aimd:min=1,max=1,initial=1,queue-delay=10s"
                .parse()
                .unwrap(),
        );
        let tasks: Vec<_> = (0..8u64)
            .map(|i| {
                let l = l.clone();
                tokio::spawn(async move {
                    for n in 0..400u64 {
                        // Give up after 0-49 us: often just as the permit is granted.
                        let patience = Duration::from_micros((i * 7 + n * 13) % 50);
                        if let Ok(Ok(permit)) = tokio::time::timeout(patience, l.acquire()).await {
                            tokio::task::yield_now().await;
                            permit.success();
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let s = l.stats();
        assert_eq!((s.in_flight, s.queued), (0, 0), "{s:?}");
        assert!(l.try_acquire().is_ok());
    });
}

/// An upstream of capacity `c` whose service time grows with the requests in flight
/// past it: `service x max(1, n / c)`, `n` counted as a request arrives (a processor
/// shared by all requests in flight).
#[derive(Clone)]
struct Upstream {
    capacity: Arc<AtomicU32>,
    in_flight: Arc<AtomicU32>,
    service: Duration,
}

impl Upstream {
    fn new(capacity: u32, service: Duration) -> Self {
        Upstream {
            capacity: Arc::new(AtomicU32::new(capacity)),
            in_flight: Arc::new(AtomicU32::new(0)),
            service,
        }
    }

    async fn call(&self) {
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let c = self.capacity.load(Ordering::SeqCst);
        tokio::time::sleep(self.service * n.max(c) / c).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    fn set_capacity(&self, c: u32) {
        self.capacity.store(c, Ordering::SeqCst);
    }
}

struct Tally {
    start: tokio::time::Instant,
    ok: AtomicU64,
    shed: AtomicU64,
    /// (ms since the start at the answer, latency in us, wait included) of admitted
    /// requests.
    latencies: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Tally {
    fn new() -> Arc<Self> {
        Arc::new(Tally {
            start: tokio::time::Instant::now(),
            ok: AtomicU64::new(0),
            shed: AtomicU64::new(0),
            latencies: Default::default(),
        })
    }

    /// Admitted requests answered in `[from_ms, to_ms)` and their p99 latency in us.
    fn between(&self, from_ms: u64, to_ms: u64) -> (usize, u64) {
        let mut l: Vec<u64> = self
            .latencies
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| (from_ms..to_ms).contains(t))
            .map(|&(_, us)| us)
            .collect();
        l.sort_unstable();
        (l.len(), l.get(l.len() * 99 / 100).copied().unwrap_or(0))
    }

    fn p99_us(&self) -> u64 {
        self.between(0, u64::MAX).1
    }
}

/// `clients` callers that send, wait for the answer (or the rejection, then 1 ms),
/// and send again, until `until`.
fn closed_loop(
    limiter: &AdaptiveLimiter<TokioClock>,
    upstream: &Upstream,
    clients: usize,
    priority: Priority,
    until: tokio::time::Instant,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    caller_loop(limiter, upstream, "anyone", clients, priority, until, tally)
}

/// `closed_loop` for the clients of one caller.
fn caller_loop(
    limiter: &AdaptiveLimiter<TokioClock>,
    upstream: &Upstream,
    caller: &'static str,
    clients: usize,
    priority: Priority,
    until: tokio::time::Instant,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|_| {
            let (l, up, tally) = (limiter.clone(), upstream.clone(), tally.clone());
            tokio::spawn(async move {
                while tokio::time::Instant::now() < until {
                    let start = tokio::time::Instant::now();
                    match l
                        .acquire_with(Request::new(priority).caller(&caller), None)
                        .await
                    {
                        Ok(permit) => {
                            up.call().await;
                            permit.success();
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                            let us = start.elapsed().as_micros() as u64;
                            let at = tally.start.elapsed().as_millis() as u64;
                            tally.latencies.lock().unwrap().push((at, us));
                        }
                        Err(_) => {
                            tally.shed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    }
                }
            })
        })
        .collect()
}

/// Samples the limit every 100 ms until `until`.
fn sample_limits(
    limiter: &AdaptiveLimiter<TokioClock>,
    until: tokio::time::Instant,
) -> tokio::task::JoinHandle<Vec<u32>> {
    let l = limiter.clone();
    tokio::spawn(async move {
        let mut limits = Vec::new();
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
            limits.push(l.limit());
        }
        limits
    })
}

fn median(v: &[u32]) -> u32 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

#[tokio::test(start_paused = true)]
async fn gradient_finds_a_capacity_of_8_under_4x_overload_follows_it_down_and_back() {
    let l = limiter("gradient");
    let up = Upstream::new(8, Duration::from_millis(20));
    let t0 = tokio::time::Instant::now();
    let end = t0 + Duration::from_secs(15);
    let tally = Tally::new();
    let clients = closed_loop(&l, &up, 32, Priority::NORMAL, end, tally.clone());
    let limits = sample_limits(&l, end);
    // Capacity 8 for 5 s, 4 for 5 s, 8 again.
    tokio::time::sleep_until(t0 + Duration::from_secs(5)).await;
    up.set_capacity(4);
    tokio::time::sleep_until(t0 + Duration::from_secs(10)).await;
    up.set_capacity(8);
    for c in clients {
        c.await.unwrap();
    }
    let limits = limits.await.unwrap();
    // Settled within 20 % of the capacity well within 5 s, in each phase.
    let (first, halved, back) = (&limits[20..50], &limits[70..100], &limits[120..]);
    assert!((7..=10).contains(&median(first)), "{first:?}");
    assert!((3..=5).contains(&median(halved)), "{halved:?}");
    assert!((7..=10).contains(&median(back)), "{back:?}");
    // Once settled (from 1 s after each change): goodput at least 95 % of the
    // capacity (C / 20 ms), p99 of admitted requests at most 2x the unloaded 20 ms.
    for (from, to, c) in [(1_000, 5_000, 8), (6_000, 10_000, 4), (11_000, 15_000, 8)] {
        let (ok, p99) = tally.between(from, to);
        let capacity = f64::from(c) * 50.0 * (to - from) as f64 / 1000.0;
        assert!(
            ok as f64 >= 0.95 * capacity,
            "{ok} in [{from}, {to}) ms at C = {c}"
        );
        assert!(p99 <= 40_000, "p99 {p99} us in [{from}, {to}) ms");
    }
}

#[tokio::test(start_paused = true)]
async fn below_capacity_nothing_is_shed_and_the_limit_stays_above_the_demand() {
    let l = limiter("gradient");
    let up = Upstream::new(8, Duration::from_millis(20));
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let tally = Tally::new();
    let clients = closed_loop(&l, &up, 6, Priority::NORMAL, end, tally.clone());
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(tally.shed.load(Ordering::Relaxed), 0);
    assert_eq!(l.stats().shed_by_class, [0, 0, 0]);
    assert!(l.limit() >= 6);
}

#[tokio::test(start_paused = true)]
async fn at_3x_overload_critical_work_keeps_its_latency_while_sheddable_work_is_shed() {
    let l = limiter("gradient");
    let up = Upstream::new(8, Duration::from_millis(20));
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let critical = Tally::new();
    let sheddable = Tally::new();
    let mut clients = closed_loop(&l, &up, 4, Priority::CRITICAL, end, critical.clone());
    clients.extend(closed_loop(
        &l,
        &up,
        20,
        Priority::SHEDDABLE,
        end,
        sheddable.clone(),
    ));
    for c in clients {
        c.await.unwrap();
    }
    let (ok, shed) = (
        critical.ok.load(Ordering::Relaxed),
        critical.shed.load(Ordering::Relaxed),
    );
    assert!(
        shed as f64 <= 0.01 * (ok + shed) as f64,
        "critical: {ok} ok, {shed} shed"
    );
    assert!(
        critical.p99_us() <= 40_000,
        "critical p99 {} us",
        critical.p99_us()
    );
    assert!(sheddable.shed.load(Ordering::Relaxed) > 0);
}

/// Runs one greedy caller (20 clients) beside three quiet ones (2 clients each) for
/// 10 s; returns the quiet callers' tally.
async fn greedy_beside_quiet(fair: bool) -> Arc<Tally> {
    let l = AdaptiveLimiter::with_clock("gradient".parse().unwrap(), fair, TokioClock::new());
    let up = Upstream::new(8, Duration::from_millis(20));
    let end = tokio::time::Instant::now() + Duration::from_secs(10);
    let (greedy, quiet) = (Tally::new(), Tally::new());
    let mut clients = caller_loop(&l, &up, "greedy", 20, Priority::NORMAL, end, greedy.clone());
    for caller in ["a", "b", "c"] {
        clients.extend(caller_loop(
            &l,
            &up,
            caller,
            2,
            Priority::NORMAL,
            end,
            quiet.clone(),
        ));
    }
    for c in clients {
        c.await.unwrap();
    }
    quiet
}

#[tokio::test(start_paused = true)]
async fn with_fair_shares_a_greedy_caller_does_not_crowd_out_the_quiet_ones() {
    let fair = greedy_beside_quiet(true).await;
    let unfair = greedy_beside_quiet(false).await;
    let shed_share = |t: &Tally| {
        let (ok, shed) = (t.ok.load(Ordering::Relaxed), t.shed.load(Ordering::Relaxed));
        shed as f64 / (ok + shed) as f64
    };
    // Without shares the quiet callers queue behind the greedy one and are shed
    // like it; with shares they pass it and keep their unloaded latency.
    assert!(shed_share(&unfair) > 0.2, "unfair: {}", shed_share(&unfair));
    assert!(shed_share(&fair) < 0.01, "fair: {}", shed_share(&fair));
    let (_, p99) = fair.between(1_000, 10_000);
    eprintln!(
        "quiet callers shed: {:.3} unfair, {:.4} fair; p99 {} us unfair, {p99} us fair",
        shed_share(&unfair),
        shed_share(&fair),
        unfair.between(1_000, 10_000).1
    );
    assert!(p99 <= 40_000, "quiet callers' p99 {p99} us");
}
