//! Hostile keys: 2 million distinct keys through a limiter bounded at 100k keys.
//! (Its own test binary, so the RSS it reads is its own.)

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::keyed::{KeyedOptions, OnFull};
use tollgate::policy::PolicyState;
use tollgate::{KeyedLimiter, Op, Policy};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn two_million_keys_stay_within_the_bound_and_live_keys_keep_their_state() {
    const MAX_KEYS: usize = 100_000;
    /// The stated bound on growth: 100k keys at 16 bytes plus table overhead is under
    /// 4 MB; allow 24 MB for allocator slack.
    const RSS_GROWTH_BOUND: u64 = 24 << 20;

    let clock = Arc::new(ManualClock::new());
    let spec = "gcra:rate=1/m,burst=5";
    let policy: Policy = spec.parse().unwrap();
    let limiter: KeyedLimiter<u64, _> = KeyedLimiter::with_options(
        policy.clone(),
        KeyedOptions {
            max_keys: MAX_KEYS,
            on_full: OnFull::EvictLeastRecent,
        },
        clock.clone(),
    );
    let before = rss_bytes();
    let mut hot: HashMap<u64, PolicyState> = HashMap::new();
    let mut peak = 0;
    for k in 0..2_000_000u64 {
        clock.advance(Duration::from_micros(1));
        let now = clock.now_us();
        let _ = limiter.check(&(k + 1_000), 1).unwrap();
        // 10 live keys, each used every 10k requests (well within the 100k most
        // recent): their decisions must match an unbounded reference exactly.
        if k % 1_000 == 0 {
            let h = k / 1_000 % 10;
            let state = hot.entry(h).or_insert_with(|| policy.init(now));
            let expected = policy.check(state, now, 1, Op::Try).unwrap();
            assert_eq!(
                limiter.check(&h, 1).unwrap(),
                expected,
                "hot key {h} at {now}"
            );
        }
        if k % 100_000 == 0 {
            peak = peak.max(rss_bytes());
        }
    }
    peak = peak.max(rss_bytes());
    let stats = limiter.stats();
    assert!(stats.keys <= MAX_KEYS, "{stats:?}");
    assert!(stats.evicted >= 1_800_000, "{stats:?}");
    let growth = peak.saturating_sub(before);
    assert!(growth < RSS_GROWTH_BOUND, "RSS grew by {growth} bytes");
    eprintln!(
        "2M keys, bound 100k: {stats:?}, RSS growth {} KiB",
        growth / 1024
    );
}
