#![allow(clippy::disallowed_methods)] // benchmarks time themselves with Instant
//! tollgate's limiters next to governor's, in one run.
//!
//! `cargo bench -p tollgate --bench limiters`
//!
//! Both sides use their fake clocks (an atomic read), GCRA at 1000/s with a burst of
//! 50, and keys drawn from a fixed pseudo-random sequence. Every loop consumes the
//! admit bit only (`Decision::allowed`, governor's `is_ok()`): handing the whole
//! 56-byte `Decision` to `black_box` costs tollgate about 5 ns more per check.
//! `tollgate-allow` is the admit-only call (`allow()`), governor's `check().is_ok()`
//! in kind.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use tollgate::clock::{ManualClock, MonotonicClock};
use tollgate::keyed::KeyedOptions;
use tollgate::{KeyedLimiter, Limiter, Policy};

const SPEC: &str = "gcra:rate=1000/s,burst=50";

fn quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1000).unwrap()).allow_burst(NonZeroU32::new(50).unwrap())
}

fn policy() -> Policy {
    SPEC.parse().unwrap()
}

/// A fixed pseudo-random sequence of indices below `n` (xorshift).
fn sequence(n: u64, len: usize) -> Vec<u64> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        })
        .collect()
}

fn direct(c: &mut Criterion) {
    let mut g = c.benchmark_group("direct");
    let limiter = Limiter::with_clock(policy(), Arc::new(ManualClock::new()));
    g.bench_function("tollgate/fake-clock", |b| {
        b.iter(|| black_box(limiter.check(1).unwrap().allowed))
    });
    g.bench_function("tollgate-allow/fake-clock", |b| {
        b.iter(|| black_box(limiter.allow().unwrap()))
    });
    let gov = RateLimiter::direct_with_clock(quota(), FakeRelativeClock::default());
    g.bench_function("governor/fake-clock", |b| {
        b.iter(|| black_box(gov.check().is_ok()))
    });
    let limiter = Limiter::with_clock(policy(), MonotonicClock::new());
    g.bench_function("tollgate/default-clock", |b| {
        b.iter(|| black_box(limiter.check(1).unwrap().allowed))
    });
    g.bench_function("tollgate-allow/default-clock", |b| {
        b.iter(|| black_box(limiter.allow().unwrap()))
    });
    let gov = RateLimiter::direct(quota());
    g.bench_function("governor/default-clock", |b| {
        b.iter(|| black_box(gov.check().is_ok()))
    });
    g.finish();
}

fn keyed_u64(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed-u64");
    for live in [10_000u64, 1_000_000] {
        let keys = sequence(live, 1 << 20);
        let limiter: KeyedLimiter<u64, _> = KeyedLimiter::with_options(
            policy(),
            KeyedOptions {
                max_keys: 2_000_000,
                ..Default::default()
            },
            Arc::new(ManualClock::new()),
        );
        let gov = RateLimiter::dashmap_with_clock(quota(), FakeRelativeClock::default());
        for k in 0..live {
            let _ = limiter.check(&k, 1).unwrap();
            let _ = gov.check_key(&k);
        }
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("tollgate", live), &live, |b, _| {
            b.iter(|| {
                i = (i + 1) & ((1 << 20) - 1);
                black_box(limiter.check(&keys[i], 1).unwrap().allowed)
            })
        });
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("governor", live), &live, |b, _| {
            b.iter(|| {
                i = (i + 1) & ((1 << 20) - 1);
                black_box(gov.check_key(&keys[i]).is_ok())
            })
        });
    }
    g.finish();
}

fn keyed_string(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed-string-10k");
    let names: Vec<String> = (0..10_000)
        .map(|i| format!("user-{i:06}@example.com"))
        .collect();
    let order = sequence(10_000, 1 << 16);
    let limiter: KeyedLimiter<String, _> = KeyedLimiter::with_options(
        policy(),
        KeyedOptions::default(),
        Arc::new(ManualClock::new()),
    );
    let gov = RateLimiter::dashmap_with_clock(quota(), FakeRelativeClock::default());
    for n in &names {
        let _ = limiter.check(n.as_str(), 1).unwrap();
        let _ = gov.check_key(n);
    }
    let mut i = 0;
    g.bench_function("tollgate", |b| {
        b.iter(|| {
            i = (i + 1) & ((1 << 16) - 1);
            black_box(
                limiter
                    .check(names[order[i] as usize].as_str(), 1)
                    .unwrap()
                    .allowed,
            )
        })
    });
    let mut i = 0;
    g.bench_function("governor", |b| {
        b.iter(|| {
            i = (i + 1) & ((1 << 16) - 1);
            black_box(gov.check_key(&names[order[i] as usize]).is_ok())
        })
    });
    g.finish();
}

/// Time per check with 2 threads checking at once (total wall time / total checks);
/// `check` gets the thread's index and the iteration.
fn two_threads_indexed(iters: u64, check: impl Fn(u64, u64) + Send + Sync) -> Duration {
    let per_thread = iters.div_ceil(2);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2 {
            let check = &check;
            s.spawn(move || {
                for i in 0..per_thread {
                    check(t, i);
                }
            });
        }
    });
    start.elapsed()
}

fn two_threads(iters: u64, check: impl Fn() + Send + Sync) -> Duration {
    two_threads_indexed(iters, |_, _| check())
}

fn contention(c: &mut Criterion) {
    let mut g = c.benchmark_group("two-threads");
    let limiter = Limiter::with_clock(policy(), Arc::new(ManualClock::new()));
    g.bench_function("tollgate/direct", |b| {
        b.iter_custom(|n| {
            two_threads(n, || {
                black_box(limiter.check(1).unwrap().allowed);
            })
        })
    });
    let gov = RateLimiter::direct_with_clock(quota(), FakeRelativeClock::default());
    g.bench_function("governor/direct", |b| {
        b.iter_custom(|n| {
            two_threads(n, || {
                black_box(gov.check().is_ok());
            })
        })
    });
    let keyed: KeyedLimiter<u64, _> = KeyedLimiter::with_options(
        policy(),
        KeyedOptions::default(),
        Arc::new(ManualClock::new()),
    );
    g.bench_function("tollgate/one-key", |b| {
        b.iter_custom(|n| {
            two_threads(n, || {
                black_box(keyed.check(&7, 1).unwrap().allowed);
            })
        })
    });
    let gov_keyed = RateLimiter::dashmap_with_clock(quota(), FakeRelativeClock::default());
    g.bench_function("governor/one-key", |b| {
        b.iter_custom(|n| {
            two_threads(n, || {
                black_box(gov_keyed.check_key(&7u64).is_ok());
            })
        })
    });
    // Disjoint keys: each thread cycles through its own 5000 keys.
    g.bench_function("tollgate/disjoint-keys", |b| {
        b.iter_custom(|n| {
            two_threads_indexed(n, |t, i| {
                black_box(keyed.check(&(t * 5_000 + i % 5_000), 1).unwrap().allowed);
            })
        })
    });
    g.bench_function("governor/disjoint-keys", |b| {
        b.iter_custom(|n| {
            two_threads_indexed(n, |t, i| {
                black_box(gov_keyed.check_key(&(t * 5_000 + i % 5_000)).is_ok());
            })
        })
    });
    g.finish();
}

fn first_touch(c: &mut Criterion) {
    let mut g = c.benchmark_group("first-touch");
    g.bench_function("tollgate", |b| {
        b.iter_custom(|n| {
            let limiter: KeyedLimiter<u64, _> = KeyedLimiter::with_options(
                policy(),
                KeyedOptions {
                    max_keys: n as usize + 1,
                    ..Default::default()
                },
                Arc::new(ManualClock::new()),
            );
            let start = Instant::now();
            for k in 0..n {
                black_box(limiter.check(&k, 1).unwrap().allowed);
            }
            start.elapsed()
        })
    });
    g.bench_function("governor", |b| {
        b.iter_custom(|n| {
            let gov = RateLimiter::dashmap_with_clock(quota(), FakeRelativeClock::default());
            let start = Instant::now();
            for k in 0..n {
                black_box(gov.check_key(&k).is_ok());
            }
            start.elapsed()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = direct, keyed_u64, keyed_string, contention, first_touch
}
criterion_main!(benches);
