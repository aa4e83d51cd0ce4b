//! ns per decision for every algorithm, and GCRA next to the `governor` crate's direct
//! limiter in the same run.
//!
//! `cargo bench -p tollgate-core --bench decide`
//!
//! Each iteration advances the virtual clock by 1 us against a rate of one unit per
//! 2 us, so roughly half the decisions admit and half reject.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use governor::clock::{Clock as _, FakeRelativeClock};
use governor::{Quota, RateLimiter};
use tollgate_core::algorithms::Gcra;
use tollgate_core::{Algorithm, CheckMode, Clock, ManualClock, Op, Policy, Rate};

const SPECS: &[(&str, &str)] = &[
    ("fixed-window", "fixed-window:limit=50,window=100us"),
    ("sliding-log", "sliding-log:limit=50,window=100us"),
    (
        "sliding-window/buckets=10",
        "sliding-window:limit=50,window=100us,buckets=10",
    ),
    (
        "sliding-window/weighted",
        "sliding-window:limit=50,window=100us,mode=weighted",
    ),
    ("leaky-bucket", "leaky-bucket:rate=500000/s,capacity=50"),
    ("gcra", "gcra:rate=500000/s,burst=50"),
    ("token-bucket", "token-bucket:rate=500000/s,capacity=50"),
    ("smooth-bursty", "smooth-bursty:rate=500000/s"),
    ("smooth-warmup", "smooth-warmup:rate=500000/s,warmup=1ms"),
    ("limit-req", "limit-req:rate=500/s,burst=50,nodelay"),
    ("shaper", "shaper:rate=500000/s,queue=50"),
    ("concurrency", "concurrency:limit=50"),
];

fn algorithms(c: &mut Criterion) {
    let mut group = c.benchmark_group("decide");
    for (name, spec) in SPECS {
        let policy: Policy = spec.parse().unwrap();
        let mut state = policy.init(0);
        let mut now = 0u64;
        let concurrency = name.starts_with("concurrency");
        group.bench_function(*name, |b| {
            b.iter(|| {
                now += 1;
                let d = policy.check(&mut state, now, 1, Op::Try).unwrap();
                if concurrency && d.allowed && now % 2 == 0 {
                    policy.refund(&mut state, now, 1);
                }
                black_box(d.allowed)
            })
        });
    }
    group.finish();
}

fn gcra_vs_governor(c: &mut Criterion) {
    let mut group = c.benchmark_group("gcra-vs-governor");

    // The pure decision: state in a local, time passed in.
    let gcra = Gcra::new(Rate::new(500_000, 1_000_000).unwrap(), 50).unwrap();
    let mut state = gcra.init(0);
    let mut now = 0u64;
    group.bench_function("tollgate/gcra-decision", |b| {
        b.iter(|| {
            now += 1;
            black_box(
                gcra.check(&mut state, now, 1, CheckMode::Try)
                    .unwrap()
                    .allowed,
            )
        })
    });

    // The same with the time read from a (manual, atomic) clock.
    let clock = ManualClock::new();
    let mut state = gcra.init(0);
    group.bench_function("tollgate/gcra-decision+clock", |b| {
        b.iter(|| {
            clock.advance(Duration::from_micros(1));
            black_box(
                gcra.check(&mut state, clock.now_us(), 1, CheckMode::Try)
                    .unwrap()
                    .allowed,
            )
        })
    });

    // governor's direct limiter: an AtomicU64 compare-and-swap plus its clock.
    let quota = Quota::per_second(NonZeroU32::new(500_000).unwrap())
        .allow_burst(NonZeroU32::new(50).unwrap());
    let fake = FakeRelativeClock::default();
    let limiter = RateLimiter::direct_with_clock(quota, fake.clone());
    group.bench_function("governor/direct-fake-clock", |b| {
        b.iter(|| {
            fake.advance(Duration::from_micros(1));
            black_box(limiter.check().is_ok())
        })
    });
    let limiter = RateLimiter::direct(quota);
    let _ = governor::clock::DefaultClock::default().now();
    group.bench_function("governor/direct-default-clock", |b| {
        b.iter(|| black_box(limiter.check().is_ok()))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = algorithms, gcra_vs_governor
}
criterion_main!(benches);
