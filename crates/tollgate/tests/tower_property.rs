//! The rate-limit layer never forwards early: for random policies and arrival times,
//! its k-th forwarded request reaches the inner service no earlier than the k-th
//! admission of the same trace decided by the limiter alone (what `tollgate replay`
//! prints: admitted at arrival plus its wait), and it forwards no more of them. So in
//! no window does the layer let through more than the policy admits. Run under
//! tokio's paused clock: every run is exact and fast.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::{ManualClock, TokioClock};
use tollgate::tower::{OnLimit, RateLimitLayer};
use tollgate::{KeyedLimiter, Limiter, Op, Policy};
use tower::{Layer, Service, ServiceExt};

const POLICIES: [&str; 7] = [
    "gcra:rate=5/s,burst=3",
    "token-bucket:rate=3/s,capacity=2",
    "fixed-window:limit=4,window=1s,align=first",
    "sliding-log:limit=3,window=1s",
    "limit-req:rate=4/s,burst=3",
    "limit-req:rate=4/s,burst=2,nodelay",
    "shaper:rate=5/s,queue=4",
];

/// The admission times (us after the start) the limiter alone gives the trace.
fn reference(spec: &str, arrivals: &[u64]) -> Vec<u64> {
    let clock = Arc::new(ManualClock::new());
    let limiter = Limiter::with_clock(spec.parse::<Policy>().unwrap(), clock.clone());
    let mut admitted: Vec<u64> = arrivals
        .iter()
        .filter_map(|&t| {
            clock.set_us(t);
            let d = limiter.check_rules(1, Op::Try).unwrap().decision;
            d.allowed.then_some(t + d.wait_us)
        })
        .collect();
    admitted.sort_unstable();
    admitted
}

/// The times (us after the start) the layer forwards the trace to its inner service.
fn through_the_layer(spec: &str, arrivals: &[u64], mode: OnLimit) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let start = tokio::time::Instant::now();
        let limiter: KeyedLimiter<u8, TokioClock> =
            KeyedLimiter::with_clock(spec.parse::<Policy>().unwrap(), TokioClock::new());
        let forwarded = Arc::new(Mutex::new(Vec::new()));
        let seen = forwarded.clone();
        let inner = tower::service_fn(move |_req: http::Request<()>| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap()
                    .push(start.elapsed().as_micros() as u64);
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }
        });
        let layer = RateLimitLayer::new(limiter, |_: &http::Request<()>| Some(0u8)).on_limit(mode);
        let service = layer.layer(inner);
        let mut tasks = Vec::new();
        for &t in arrivals {
            tokio::time::sleep_until(start + Duration::from_micros(t)).await;
            let mut service = service.clone();
            tasks.push(tokio::spawn(async move {
                let service = service.ready().await.unwrap();
                service.call(http::Request::new(())).await.unwrap().status()
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        let mut times = forwarded.lock().unwrap().clone();
        times.sort_unstable();
        times
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_layer_never_forwards_more_or_sooner_than_the_policy_admits(
        policy in 0..POLICIES.len(),
        gaps in prop::collection::vec(prop_oneof![Just(0u64), 1u64..50_000, 50_000u64..600_000], 1..40),
    ) {
        let spec = POLICIES[policy];
        let arrivals: Vec<u64> = gaps
            .iter()
            .scan(0u64, |t, g| {
                // Whole milliseconds: nginx's limit_req keeps a millisecond clock.
                *t += g / 1000 * 1000;
                Some(*t)
            })
            .collect();
        let admitted = reference(spec, &arrivals);
        // Reject mode decides as `replay --op try` does: the same admissions, each
        // forwarded at its time (a pacing policy's wait slept first).
        let forwarded = through_the_layer(spec, &arrivals, OnLimit::Reject);
        prop_assert!(forwarded.len() <= admitted.len(), "{spec}: {forwarded:?} vs {admitted:?}");
        for (k, (f, r)) in forwarded.iter().zip(&admitted).enumerate() {
            prop_assert!(f >= r, "{spec}: forward {k} at {f} us, before the admission at {r} us");
        }
        prop_assert_eq!(forwarded.len(), admitted.len(), "{}", spec);
    }
}
