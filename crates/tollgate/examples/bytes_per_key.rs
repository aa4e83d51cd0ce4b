//! Memory per key: RSS growth for N distinct u64 keys in a keyed GCRA limiter,
//! tollgate or governor (one per process, so neither sees the other's allocations).
//!
//! cargo run --release -p tollgate --example bytes_per_key -- tollgate 1000000
//! cargo run --release -p tollgate --example bytes_per_key -- governor 1000000

use std::num::NonZeroU32;

use tollgate::keyed::KeyedOptions;
use tollgate::{KeyedLimiter, Policy};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "tollgate".into());
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let before = rss_bytes();
    let after = match which.as_str() {
        "tollgate" => {
            let policy: Policy = "gcra:rate=1000/s,burst=50".parse().unwrap();
            let limiter: KeyedLimiter<u64, _> = KeyedLimiter::with_options(
                policy,
                // The default bound (1M keys, 64 shards), raised to twice the keys
                // where that is more (each shard's share must hold its keys).
                KeyedOptions {
                    max_keys: (n as usize * 2).max(KeyedOptions::default().max_keys),
                    ..Default::default()
                },
                // A frozen clock keeps every key live (none is swept as idle).
                std::sync::Arc::new(tollgate::clock::ManualClock::new()),
            );
            for k in 0..n {
                let _ = limiter.check(&k, 1).unwrap();
            }
            assert_eq!(limiter.len() as u64, n);
            rss_bytes()
        }
        "governor" => {
            let quota = governor::Quota::per_second(NonZeroU32::new(1000).unwrap())
                .allow_burst(NonZeroU32::new(50).unwrap());
            let limiter = governor::RateLimiter::keyed(quota);
            for k in 0..n {
                let _ = limiter.check_key(&k);
            }
            assert_eq!(limiter.len() as u64, n);
            rss_bytes()
        }
        other => panic!("unknown limiter {other} (tollgate or governor)"),
    };
    println!(
        "{which}: {n} keys, {:.1} bytes/key",
        (after - before) as f64 / n as f64
    );
}
