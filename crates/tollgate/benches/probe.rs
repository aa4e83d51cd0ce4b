use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::sync::Arc;
use tollgate::algorithms::{Gcra, GcraState};
use tollgate::{Algorithm, Clock, ManualClock, Mode, Policy};
fn probe(c: &mut Criterion) {
    let sw = arc_swap::ArcSwap::from_pointee(5u64);
    c.bench_function("arcswap-load", |b| b.iter(|| black_box(**sw.load())));
    let clock = Arc::new(ManualClock::new());
    c.bench_function("manual-clock", |b| b.iter(|| black_box(clock.now_us())));
    let g = Gcra::new(tollgate::Rate::new(1000, 1_000_000).unwrap(), 50).unwrap();
    let p: Policy = "gcra:rate=1000/s,burst=50".parse().unwrap();
    let mut s = GcraState { tat: 0 };
    for _ in 0..60 {
        let _ = g.check(&mut s, 0, 1, Mode::Try);
    }
    c.bench_function("gcra-check-reject", |b| {
        b.iter(|| {
            let mut x = s;
            black_box(g.check(&mut x, black_box(0), 1, Mode::Try).unwrap().allowed)
        })
    });
    c.bench_function("policy-mode-shadow", |b| {
        b.iter(|| black_box(p.shadowed(black_box(tollgate::Decision::admitted(1, 1, 1, 1)))))
    });
}
criterion_group!(benches, probe);
criterion_main!(benches);
