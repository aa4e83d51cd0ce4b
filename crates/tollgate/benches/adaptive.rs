//! The adaptive limiter's cost per permit (acquire, then release with an outcome),
//! next to the plain concurrency limiter (tokio's semaphore) and tower's
//! `ConcurrencyLimit`, in one run.
//!
//! `cargo bench -p tollgate --features tower --bench adaptive`
//!
//! Every side takes a free permit and gives it back, on one thread: the fast path
//! every request pays. `adaptive/success` also hands a latency sample to the
//! controller (a window closes every 10 samples here, its limit capped at 10).

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::adaptive::{AdaptiveLimiter, Outcome, Priority, Request};
use tollgate::clock::ManualClock;
use tollgate::concurrency::ConcurrencyLimiter;
use tower::{Service, ServiceExt};

/// Polls a future that is ready at once (a free permit never waits).
fn now<F: Future>(f: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(f).poll(&mut cx) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the permit should have been free"),
    }
}

fn permits(c: &mut Criterion) {
    let mut g = c.benchmark_group("permit");
    let spec = "gradient:max=10,initial=10".parse().unwrap();
    let adaptive = AdaptiveLimiter::with_clock(spec, false, ManualClock::new());
    g.bench_function("adaptive/ignored", |b| {
        b.iter(|| black_box(adaptive.try_acquire().unwrap()).ignore())
    });
    g.bench_function("adaptive/success", |b| {
        b.iter(|| {
            let p = adaptive.try_acquire().unwrap();
            p.finish(Outcome::Success { latency_us: 20_000 })
        })
    });
    g.bench_function("adaptive/acquire-critical-fair", |b| {
        let fair = AdaptiveLimiter::with_clock(spec, true, ManualClock::new());
        b.iter(|| {
            let req = Request::new(Priority::CRITICAL).caller("tenant-7");
            now(fair.acquire_with(req, None)).unwrap().success()
        })
    });
    let plain = ConcurrencyLimiter::new(10);
    g.bench_function("concurrency/try_acquire", |b| {
        b.iter(|| drop(black_box(plain.try_acquire().unwrap())))
    });
    let mut svc = tower::limit::ConcurrencyLimit::new(
        tower::service_fn(|x: u32| async move { Ok::<_, Infallible>(x) }),
        10,
    );
    g.bench_function("tower/ConcurrencyLimit", |b| {
        b.iter(|| {
            let ready = now(svc.ready()).unwrap();
            black_box(now(ready.call(1)).unwrap())
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2));
    targets = permits
}
criterion_main!(benches);
