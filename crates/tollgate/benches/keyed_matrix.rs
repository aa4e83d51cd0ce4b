#![allow(clippy::disallowed_methods)] // times itself with Instant
//! The keyed limiter next to governor, row by row, in one run: key counts 10k to 10M,
//! uniform and Zipf (s = 1.0) key popularity, a rate at which keys stay live and one
//! at which they replenish between requests, u64 / IP address / `String` keys, one and
//! two threads.
//!
//! ```text
//! cargo bench -p tollgate --bench keyed_matrix            # every row (~10 minutes)
//! cargo bench -p tollgate --bench keyed_matrix -- 1M      # rows whose label has "1M"
//! ```
//!
//! Both sides as a user would make them, on their default clocks (TSC): tollgate's
//! `KeyedLimiter` (`max_keys` raised to hold every key) and governor's
//! `RateLimiter::dashmap`. Each row first stores every key in both (the RSS growth
//! gives bytes per key), then times the same pseudo-random sequence of keys through
//! tollgate's `allow` (the admit bit, as governor's `check_key(..).is_ok()`), tollgate's
//! `check` (a full `Decision`), and governor: 3 alternating rounds, medians, in ns per
//! check (with two threads: wall time over both threads' checks). For u64 keys on one
//! thread the row also gives the floor: the latency of one dependent load from a
//! random cycle over as many bytes as tollgate's table holds (what
//! `examples/memory_latency.rs` measures).
//!
//! GCRA, burst 50 on both: `live` is 50/h (no key replenishes during the run), `replenish`
//! is 1000/s (a key is whole again 1 ms after a request, long before its next one once
//! there are more than ~20k keys).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Instant;

use governor::{Quota, RateLimiter};
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use tollgate::clock::MonotonicClock;
use tollgate::keyed::KeyedOptions;
use tollgate::{KeyedLimiter, Policy};

/// Checks timed per side and round (and the length of the key sequence): 4M, or a few
/// under `cargo test`, which runs this once as a smoke test (without `--bench`).
static CHECKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1 << 22);
const ROUNDS: usize = 3;

fn checks() -> usize {
    CHECKS.load(std::sync::atomic::Ordering::Relaxed)
}

#[derive(Clone, Copy, PartialEq)]
enum Popularity {
    Uniform,
    Zipf,
}

#[derive(Clone, Copy, PartialEq)]
enum Rate {
    Live,
    Replenish,
}

#[derive(Clone, Copy, PartialEq)]
enum KeyKind {
    U64,
    Ip,
    Str,
}

struct Row {
    keys: u32,
    popularity: Popularity,
    rate: Rate,
    kind: KeyKind,
    threads: usize,
}

impl Row {
    fn label(&self) -> String {
        let keys = match self.keys {
            k if k >= 1_000_000 => format!("{}M", k / 1_000_000),
            k => format!("{}k", k / 1_000),
        };
        format!(
            "{keys} {} {} {} {}t",
            match self.kind {
                KeyKind::U64 => "u64",
                KeyKind::Ip => "ip",
                KeyKind::Str => "string",
            },
            match self.popularity {
                Popularity::Uniform => "uniform",
                Popularity::Zipf => "zipf",
            },
            match self.rate {
                Rate::Live => "live",
                Rate::Replenish => "replenish",
            },
            self.threads
        )
    }
}

fn rows() -> Vec<Row> {
    use KeyKind::*;
    use Popularity::*;
    use Rate::*;
    let mut rows = Vec::new();
    let mut add = |keys, popularity, rate, kind, threads| {
        rows.push(Row {
            keys,
            popularity,
            rate,
            kind,
            threads,
        })
    };
    for keys in [10_000, 100_000, 1_000_000, 10_000_000] {
        for popularity in [Uniform, Zipf] {
            for rate in [Live, Replenish] {
                add(keys, popularity, rate, U64, 1);
            }
        }
    }
    for keys in [10_000, 1_000_000] {
        for rate in [Live, Replenish] {
            add(keys, Uniform, rate, U64, 2);
        }
    }
    add(1_000_000, Zipf, Live, U64, 2);
    for keys in [100_000, 1_000_000] {
        for rate in [Live, Replenish] {
            add(keys, Uniform, rate, Ip, 1);
        }
    }
    add(10_000_000, Uniform, Live, Ip, 1);
    add(1_000_000, Uniform, Live, Ip, 2);
    for keys in [10_000, 100_000, 1_000_000] {
        for rate in [Live, Replenish] {
            add(keys, Uniform, rate, Str, 1);
        }
    }
    add(100_000, Zipf, Live, Str, 1);
    add(100_000, Uniform, Live, Str, 2);
    rows
}

/// The sequence of key indices below `n` the checks follow.
fn sequence(n: u32, popularity: Popularity) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
    match popularity {
        Popularity::Uniform => {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            (0..checks())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % u64::from(n)) as u32
                })
                .collect()
        }
        Popularity::Zipf => {
            let zipf = Zipf::new(f64::from(n), 1.0).expect("valid Zipf parameters");
            (0..checks())
                .map(|_| (zipf.sample(&mut rng) as u32).clamp(1, n) - 1)
                .collect()
        }
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// ns per check of `check` over `seq` (each of `threads` threads from its own offset).
fn time(seq: &[u32], threads: usize, check: &(impl Fn(u32) -> bool + Sync)) -> f64 {
    let n = checks();
    let per_thread = n / threads;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let offset = t * (n / 2 + 12_345);
                let mut admitted = 0u32;
                for i in 0..per_thread {
                    admitted += u32::from(check(seq[(offset + i) % n]));
                }
                black_box(admitted);
            });
        }
    });
    start.elapsed().as_nanos() as f64 / (per_thread * threads) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One dependent load's latency over a random cycle of cache lines spanning `bytes`.
fn dependent_load_ns(bytes: u64) -> f64 {
    #[repr(align(64))]
    #[derive(Clone, Copy)]
    struct Line(u32);
    let lines = (bytes / 64).max(2) as usize;
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut order: Vec<u32> = (0..lines as u32).collect();
    // Sattolo's shuffle: one cycle through every line, in an order no prefetcher guesses.
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % i as u64) as usize);
    }
    let mut table = vec![Line(0); lines];
    for w in 0..lines {
        table[order[w] as usize] = Line(order[(w + 1) % lines]);
    }
    drop(order);
    let loads = 4_000_000;
    let mut at = 0usize;
    for _ in 0..loads / 4 {
        at = table[at].0 as usize;
    }
    let start = Instant::now();
    for _ in 0..loads {
        at = table[at].0 as usize;
    }
    let ns = start.elapsed().as_nanos() as f64 / loads as f64;
    black_box(at);
    ns
}

struct Measured {
    allow: f64,
    check: f64,
    governor: f64,
}

/// The keys of a row by index, handed out by reference (as a caller holding them would).
trait Keys: Sync {
    type K: std::hash::Hash + Eq + Clone + Send + Sync;
    fn with<R>(&self, i: u32, f: impl FnOnce(&Self::K) -> R) -> R;
}

struct U64Keys;
impl Keys for U64Keys {
    type K = u64;
    #[inline(always)]
    fn with<R>(&self, i: u32, f: impl FnOnce(&u64) -> R) -> R {
        f(&u64::from(i))
    }
}

struct IpKeys;
impl Keys for IpKeys {
    type K = IpAddr;
    #[inline(always)]
    fn with<R>(&self, i: u32, f: impl FnOnce(&IpAddr) -> R) -> R {
        f(&IpAddr::V4(Ipv4Addr::from(0x0A00_0000u32.wrapping_add(i))))
    }
}

struct StringKeys(Vec<String>);
impl Keys for StringKeys {
    type K = String;
    #[inline(always)]
    fn with<R>(&self, i: u32, f: impl FnOnce(&String) -> R) -> R {
        f(&self.0[i as usize])
    }
}

/// Stores every key in both limiters, then times the three ways round-robin.
fn measure<S: Keys>(row: &Row, seq: &[u32], keys: &S) -> Measured {
    let (spec, quota) = match row.rate {
        Rate::Live => (
            "gcra:rate=50/h,burst=50",
            Quota::per_hour(NonZeroU32::new(50).unwrap()),
        ),
        Rate::Replenish => (
            "gcra:rate=1000/s,burst=50",
            Quota::per_second(NonZeroU32::new(1000).unwrap()),
        ),
    };
    let quota = quota.allow_burst(NonZeroU32::new(50).unwrap());
    let ours: KeyedLimiter<S::K> = KeyedLimiter::with_options(
        spec.parse::<Policy>().unwrap(),
        KeyedOptions {
            max_keys: (row.keys as usize * 2).max(1_000_000),
            ..Default::default()
        },
        MonotonicClock::new(),
    );
    for k in 0..row.keys {
        keys.with(k, |k| ours.allow(k).unwrap());
    }
    let gov = RateLimiter::dashmap(quota);
    for k in 0..row.keys {
        keys.with(k, |k| gov.check_key(k).is_ok());
    }
    // One pass of the sequence through both before timing: the steady state.
    time(seq, row.threads, &|i| {
        keys.with(i, |k| ours.allow(k).unwrap())
    });
    time(seq, row.threads, &|i| {
        keys.with(i, |k| gov.check_key(k).is_ok())
    });
    let warm = ours.stats();
    let (mut allow, mut check, mut governor) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        allow.push(time(seq, row.threads, &|i| {
            keys.with(i, |k| ours.allow(k).unwrap())
        }));
        check.push(time(seq, row.threads, &|i| {
            keys.with(i, |k| ours.check(k, 1).unwrap().allowed)
        }));
        governor.push(time(seq, row.threads, &|i| {
            keys.with(i, |k| gov.check_key(k).is_ok())
        }));
    }
    // On stderr: tollgate's table counters after the untimed pass and after the rounds
    // (a steady key set stores no key again: `inserted` does not move).
    eprintln!("{}: {warm:?} -> {:?}", row.label(), ours.stats());
    Measured {
        allow: median(allow),
        check: median(check),
        governor: median(governor),
    }
}

/// The RSS growth of storing `n` live keys of `kind` in one limiter (`tollgate` or
/// `governor`), measured in a child process of its own (this binary again), so that no
/// earlier row's freed memory is reused.
fn bytes_per_key(which: &str, kind: KeyKind, n: u32) -> f64 {
    let kind = match kind {
        KeyKind::U64 => "u64",
        KeyKind::Ip => "ip",
        KeyKind::Str => "string",
    };
    let out = std::process::Command::new(std::env::current_exe().expect("own path"))
        .env("KEYED_MATRIX_BYTES", format!("{which} {kind} {n}"))
        .output()
        .expect("child run");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse::<f64>().unwrap_or(f64::NAN) / f64::from(n)
}

/// The child of [`bytes_per_key`]: stores the keys (a frozen clock for tollgate, so
/// none is idle; governor keeps every key anyway) and prints the RSS growth.
fn store_keys(spec: &str) {
    let mut words = spec.split_whitespace();
    let (which, kind) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let n: u32 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    fn fill<S: Keys>(which: &str, n: u32, keys: &S) -> u64 {
        let before = rss_bytes();
        if which == "tollgate" {
            let limiter: KeyedLimiter<S::K, _> = KeyedLimiter::with_options(
                "gcra:rate=50/h,burst=50".parse::<Policy>().unwrap(),
                KeyedOptions {
                    max_keys: (n as usize * 2).max(1_000_000),
                    ..Default::default()
                },
                std::sync::Arc::new(tollgate::clock::ManualClock::new()),
            );
            for k in 0..n {
                keys.with(k, |k| limiter.allow(k).unwrap());
            }
            assert_eq!(limiter.len(), n as usize);
            let after = rss_bytes();
            black_box(&limiter);
            after - before
        } else {
            let quota = Quota::per_hour(NonZeroU32::new(50).unwrap())
                .allow_burst(NonZeroU32::new(50).unwrap());
            let limiter = RateLimiter::dashmap(quota);
            for k in 0..n {
                keys.with(k, |k| limiter.check_key(k).is_ok());
            }
            assert_eq!(limiter.len(), n as usize);
            let after = rss_bytes();
            black_box(&limiter);
            after - before
        }
    }
    let bytes = match kind {
        "u64" => fill(which, n, &U64Keys),
        "ip" => fill(which, n, &IpKeys),
        // The caller's strings are made before the baseline; each limiter's own copies
        // of them count.
        _ => fill(which, n, &StringKeys(string_keys(n))),
    };
    println!("{bytes}");
}

fn string_keys(n: u32) -> Vec<String> {
    (0..n).map(|i| format!("user-{i:08}@example.com")).collect()
}

fn main() {
    if let Ok(spec) = std::env::var("KEYED_MATRIX_BYTES") {
        return store_keys(&spec);
    }
    // `cargo bench` passes `--bench`; anything else is a filter on the row labels.
    // Without it (`cargo test`), one small row with few checks shows the harness runs.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut filter: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .collect();
    if !args.iter().any(|a| a == "--bench") {
        CHECKS.store(1 << 12, std::sync::atomic::Ordering::Relaxed);
        filter = vec!["10k u64 uniform live 1t".into()];
    }
    println!(
        "| row | tollgate allow ns | tollgate check ns | governor ns | allow / governor | \
         bytes/key tollgate | bytes/key governor | load floor ns | allow / floor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut bytes = std::collections::HashMap::new();
    for row in rows() {
        let label = row.label();
        if !filter.is_empty() && !filter.iter().any(|f| label.contains(f.as_str())) {
            continue;
        }
        let seq = sequence(row.keys, row.popularity);
        let m = match row.kind {
            KeyKind::U64 => measure(&row, &seq, &U64Keys),
            KeyKind::Ip => measure(&row, &seq, &IpKeys),
            KeyKind::Str => measure(&row, &seq, &StringKeys(string_keys(row.keys))),
        };
        let (ours, theirs) = *bytes.entry((row.kind as u8, row.keys)).or_insert_with(|| {
            (
                bytes_per_key("tollgate", row.kind, row.keys),
                bytes_per_key("governor", row.kind, row.keys),
            )
        });
        let floor = (row.kind == KeyKind::U64 && row.threads == 1)
            .then(|| dependent_load_ns((ours * f64::from(row.keys)) as u64));
        println!(
            "| {label} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {} | {} |",
            m.allow,
            m.check,
            m.governor,
            m.allow / m.governor,
            ours,
            theirs,
            floor.map_or("-".into(), |f| format!("{f:.1}")),
            floor.map_or("-".into(), |f| format!("{:.2}", m.allow / f)),
        );
    }
}
