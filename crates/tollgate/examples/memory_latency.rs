#![allow(clippy::disallowed_methods)] // times itself with Instant
//! The floor under a keyed check at scale: the latency of one dependent load from a
//! working set of each size (a pointer chase through a random cycle of cache lines).
//! Where a keyed limiter's table outgrows the cache, every check of a random key pays
//! about this once; governor's pays it too, plus its tag-byte access.
//!
//! cargo run --release -p tollgate --example memory_latency

use std::time::Instant;

/// One cache line: the index of the next line to visit.
#[repr(align(64))]
#[derive(Clone, Copy)]
struct Line(usize);

fn main() {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = move |bound: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % bound as u64) as usize
    };
    for mb in [1usize, 2, 4, 8, 16, 32, 64] {
        let lines = (mb << 20) / 64;
        // A random cyclic order of all lines (Sattolo's shuffle), so the prefetcher
        // cannot guess the next address.
        let mut order: Vec<usize> = (0..lines).collect();
        for i in (1..lines).rev() {
            order.swap(i, random(i));
        }
        let mut table = vec![Line(0); lines];
        for w in 0..lines {
            table[order[w]] = Line(order[(w + 1) % lines]);
        }
        let loads = 4_000_000;
        let mut at = 0;
        for _ in 0..loads / 4 {
            at = table[at].0;
        }
        let start = Instant::now();
        for _ in 0..loads {
            at = table[at].0;
        }
        let ns = start.elapsed().as_nanos() as f64 / loads as f64;
        println!("{mb:>3} MB: {ns:6.1} ns per dependent load");
        std::hint::black_box(at);
    }
}
