//! `KeyedLimiter`: per-key limits, bounded memory, reconfiguration.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::clock::{Clock, ManualClock};
use tollgate::keyed::{KeyedOptions, OnFull};
use tollgate::policy::PolicyState;
use tollgate::{Error, KeyedLimiter, Op, Policy, RuleSet};

fn keyed<K: std::hash::Hash + Eq>(
    spec: &str,
    options: KeyedOptions,
) -> (KeyedLimiter<K, Arc<ManualClock>>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new());
    let rules: RuleSet = spec.parse::<Policy>().unwrap().into();
    (
        KeyedLimiter::with_options(rules, options, clock.clone()),
        clock,
    )
}

proptest! {
    /// `allow` decides as `check(..).allowed` and leaves the same states: two limiters
    /// on one clock, one asked with each, agree on every request.
    #[test]
    fn allow_is_the_admit_bit_of_check(
        spec in prop::sample::select(&["gcra:rate=1000/s,burst=3", "gcra:rate=3/s,burst=2", "gcra:rate=10/s,burst=1,shadow=true", "fixed-window:limit=2,window=1s"][..]),
        trace in prop::collection::vec((prop_oneof![Just(0u64), 0..3_000u64, 0..400_000u64], 0..4u64), 1..200),
    ) {
        let (by_allow, clock) = keyed::<u64>(spec, KeyedOptions::default());
        let rules: RuleSet = spec.parse::<Policy>().unwrap().into();
        let by_check = KeyedLimiter::with_options(rules, KeyedOptions::default(), clock.clone());
        for (gap, key) in trace {
            clock.advance(Duration::from_micros(gap));
            let expected = by_check.check(&key, 1).unwrap().allowed;
            prop_assert_eq!(by_allow.allow(&key).unwrap(), expected, "key {} at {}", key, clock.now_us());
        }
    }

    /// Each key decides exactly as the pure core does for that key alone: tries,
    /// acquires, charges and counts, on the GCRA fast path and the general one.
    #[test]
    fn keyed_matches_the_core_per_key(
        spec in prop::sample::select(&[
            "gcra:rate=3/s,burst=2", "gcra:rate=10/s,burst=3,max-debt=2",
            "gcra:rate=1000/s,burst=2,shadow=true", "sliding-window:limit=3,window=1s,buckets=4",
            "limit-req:rate=5/s,burst=1", "token-bucket:rate=3/s,capacity=2,max-debt=1",
        ][..]),
        trace in prop::collection::vec((0..300_000u64, 0..4u8, 0..6u64, 0..4u8), 1..150),
    ) {
        let (limiter, clock) = keyed::<u8>(spec, KeyedOptions::default());
        let policy: Policy = spec.parse().unwrap();
        let mut states: std::collections::HashMap<u8, PolicyState> = Default::default();
        for (gap, key, cost, op) in trace {
            clock.advance(Duration::from_micros(gap));
            let now = clock.now_us();
            let op = [Op::Try, Op::Acquire, Op::Charge, Op::Count][usize::from(op)];
            let state = states.entry(key).or_insert_with(|| policy.init(now));
            let expected = policy.check(state, now, cost, op).map_err(Error::from);
            prop_assert_eq!(limiter.check_rules(&key, cost, op).map(|d| d.decision), expected);
        }
    }
}

#[test]
fn compound_and_borrowed_keys() {
    let (limiter, _) = keyed::<(String, u64)>("gcra:rate=1/s,burst=1", KeyedOptions::default());
    assert!(
        limiter
            .check(&("GET /a".to_string(), 7), 1)
            .unwrap()
            .allowed
    );
    assert!(
        !limiter
            .check(&("GET /a".to_string(), 7), 1)
            .unwrap()
            .allowed
    );
    assert!(
        limiter
            .check(&("GET /a".to_string(), 8), 1)
            .unwrap()
            .allowed
    );
    let (strings, _) = keyed::<String>("token-bucket:rate=1/s,capacity=1", KeyedOptions::default());
    assert!(strings.check("alice", 1).unwrap().allowed);
    assert!(!strings.check("alice", 1).unwrap().allowed);
    assert_eq!(strings.len(), 1);
    strings.reset("alice");
    assert!(strings.check("alice", 1).unwrap().allowed);
}

/// Every key type and policy path: a reset key decides as a new one.
#[test]
fn reset_makes_a_key_new_again() {
    for spec in ["gcra:rate=1/h,burst=3", "token-bucket:rate=1/h,capacity=3"] {
        let (flat, clock) = keyed::<u64>(spec, KeyedOptions::default());
        let (strings, _) = keyed::<String>(spec, KeyedOptions::default());
        for _ in 0..3 {
            assert!(flat.check(&9, 1).unwrap().allowed);
            assert!(strings.check("nine", 1).unwrap().allowed);
        }
        assert!(!flat.check(&9, 1).unwrap().allowed);
        assert!(!strings.check("nine", 1).unwrap().allowed);
        flat.reset(&9);
        strings.reset("nine");
        flat.reset(&10); // unknown keys: nothing to forget
        assert_eq!(
            flat.peek(&9, 1).unwrap(),
            flat.peek(&11, 1).unwrap(),
            "{spec}"
        );
        clock.advance(Duration::from_secs(1));
        for _ in 0..3 {
            assert!(flat.check(&9, 1).unwrap().allowed, "{spec}");
            assert!(strings.check("nine", 1).unwrap().allowed, "{spec}");
        }
        assert!(!flat.check(&9, 1).unwrap().allowed);
        assert!(!strings.check("nine", 1).unwrap().allowed);
    }
}

/// A peek of cost 0 on the GCRA fast path (one GCRA policy: a TAT word per key) and
/// on the general path reports the state as it stands, stores nothing, and agrees with
/// the single-limit `Limiter`.
#[test]
fn a_peek_of_cost_zero_is_the_state_as_it_stands_on_every_path() {
    for spec in ["gcra:rate=1/s,burst=3", "token-bucket:rate=1/s,capacity=3"] {
        let (limiter, clock) = keyed::<u64>(spec, KeyedOptions::default());
        let look = |k| {
            let d = limiter.peek(&k, 0).unwrap();
            assert!(
                d.decision.allowed && d.decision.retry_after_us.is_none(),
                "{spec}: {d:?}"
            );
            d.decision.remaining
        };
        assert_eq!(look(1), 3, "{spec}: a new key");
        assert!(limiter.is_empty(), "{spec}: a look stored a key");
        let _ = limiter.check(&1, 2).unwrap();
        assert_eq!(look(1), 1, "{spec}");
        assert_eq!(look(1), 1, "{spec}: a look counts nothing");
        let _ = limiter.check(&1, 1).unwrap();
        assert_eq!(look(1), 0, "{spec}: spent");
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(look(1), 1, "{spec}: one back after 1 s");
        let single = tollgate::Limiter::with_clock(spec.parse::<Policy>().unwrap(), clock.clone());
        assert_eq!(single.peek(0).unwrap().decision.remaining, 3, "{spec}");
        let _ = single.check(1).unwrap();
        assert_eq!(single.peek(0).unwrap().decision.remaining, 2, "{spec}");
    }
}

#[test]
fn peek_does_not_store_a_key_and_refund_gives_back() {
    let (limiter, _) = keyed::<u64>("gcra:rate=1/s,burst=2", KeyedOptions::default());
    assert!(limiter.peek(&1, 1).unwrap().decision.allowed);
    assert!(limiter.is_empty());
    assert!(limiter.check(&1, 2).unwrap().allowed);
    assert!(!limiter.check(&1, 1).unwrap().allowed);
    limiter.refund(&1, 1);
    assert!(limiter.check(&1, 1).unwrap().allowed);
}

#[test]
fn full_limiter_evicts_the_least_recently_active_keys() {
    let options = KeyedOptions {
        max_keys: 1000,
        on_full: OnFull::EvictLeastRecent,
    };
    let (limiter, clock) = keyed::<u64>("gcra:rate=1/m,burst=3", options);
    for k in 0..10_000u64 {
        clock.advance(Duration::from_micros(10));
        assert!(limiter.check(&k, 1).unwrap().allowed);
        // Key 1_000_000 is used all along: it is never the least recently active.
        if k % 50 == 0 {
            let _ = limiter.check(&1_000_000, 1).unwrap();
        }
    }
    let stats = limiter.stats();
    assert!(stats.keys <= 1000, "{stats:?}");
    assert!(stats.evicted >= 9000 - 1000, "{stats:?}");
    assert_eq!(stats.dropped_idle, 0, "nothing was idle: {stats:?}");
    // The hot key kept its state: its burst of 3 is spent, so it is still limited.
    assert!(!limiter.check(&1_000_000, 1).unwrap().allowed);
    // The most recent keys are still known (their burst is partly used).
    assert_eq!(limiter.peek(&9_999, 1).unwrap().decision.remaining, 1);
}

#[test]
fn full_limiter_can_refuse_new_keys_instead() {
    let options = KeyedOptions {
        max_keys: 100,
        on_full: OnFull::RefuseNew,
    };
    let (limiter, clock) = keyed::<u64>("fixed-window:limit=2,window=1s", options);
    for k in 0..100 {
        assert!(limiter.check(&k, 1).unwrap().allowed);
    }
    assert_eq!(limiter.check(&100, 1), Err(Error::TooManyKeys { max: 100 }));
    assert!(
        limiter.check(&5, 1).unwrap().allowed,
        "known keys are unaffected"
    );
    assert!(!limiter.check(&5, 1).unwrap().allowed);
    assert_eq!(limiter.stats().refused, 1);
    // Once the windows have ended, the old keys are idle and make room.
    clock.advance(Duration::from_secs(1));
    assert!(limiter.check(&100, 1).unwrap().allowed);
    assert!(limiter.stats().dropped_idle >= 1);
}

#[test]
fn idle_keys_are_swept_as_the_map_grows() {
    let (limiter, clock) = keyed::<u64>("gcra:rate=10/s,burst=1", KeyedOptions::default());
    for k in 0..40_000u64 {
        let _ = limiter.check(&k, 1).unwrap();
    }
    assert_eq!(limiter.len(), 40_000);
    // All are idle 100 ms later; new keys trigger sweeps shard by shard where each
    // one's table would grow (no pass over the whole map, no cleanup thread). A
    // sweep drops only keys already idle when the table last grew, so each shard
    // must grow once after the clock moved and sweep again: 120,000 new keys make
    // every shard cross two growths whatever its share of the first 40,000 (the
    // first version, 60,000, failed one run in a few hundred where a shard's share
    // came near a growth).
    clock.advance(Duration::from_millis(100));
    for k in 40_000..160_000u64 {
        let _ = limiter.check(&k, 1).unwrap();
    }
    let stats = limiter.stats();
    assert_eq!(stats.dropped_idle, 40_000, "{stats:?}");
    assert_eq!(stats.keys, 120_000, "{stats:?}");
}

/// 10k keys drawn at random, one check per microsecond: each key comes back about
/// every 10 ms, long after its 1 ms interval has replenished it (the normal state of a
/// per-user limit whose users stay under it). Once every key is in, none is dropped
/// and stored again, and no shard sweeps: `inserted` and `sweeps` stop moving.
fn replenishing_keys_are_not_stored_again<K: std::hash::Hash + Eq + Clone>(
    spec: &str,
    key: impl Fn(u64) -> K,
) {
    // 8 shards of up to 5000 keys: ~1250 keys each, enough to sweep.
    let options = KeyedOptions {
        max_keys: 40_000,
        ..Default::default()
    };
    let (limiter, clock) = keyed::<K>(spec, options);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut run = |checks: usize| {
        for _ in 0..checks {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            clock.advance(Duration::from_micros(1));
            assert!(limiter.check(&key(x % 10_000), 1).unwrap().allowed);
        }
        limiter.stats()
    };
    let warm = run(300_000);
    assert_eq!(warm.keys, 10_000, "{warm:?}");
    let after = run(500_000);
    assert_eq!(after.keys, 10_000, "{after:?}");
    assert_eq!(
        after.inserted, warm.inserted,
        "keys stored again: {warm:?} -> {after:?}"
    );
    assert_eq!(after.sweeps, warm.sweeps, "{warm:?} -> {after:?}");
}

#[test]
fn keys_that_replenish_between_requests_stay_in_the_table() {
    // The GCRA words (flat for u64, hashbrown for String) and the general states.
    replenishing_keys_are_not_stored_again("gcra:rate=1000/s,burst=50", |k| k);
    replenishing_keys_are_not_stored_again("gcra:rate=1000/s,burst=50", |k| format!("user-{k}"));
    replenishing_keys_are_not_stored_again("token-bucket:rate=1000/s,capacity=50", |k| k);
}

#[test]
fn reconfiguration_migrates_every_key_lazily() {
    let (limiter, _) = keyed::<u64>("gcra:rate=1/s,burst=2", KeyedOptions::default());
    for k in 0..100 {
        let _ = limiter.check(&k, 2).unwrap();
    }
    // GCRA -> GCRA: debts carry over.
    limiter.set_rules("gcra:rate=1/s,burst=3".parse::<Policy>().unwrap());
    assert!(limiter.check(&7, 1).unwrap().allowed);
    assert!(!limiter.check(&7, 1).unwrap().allowed);
    // GCRA -> a rule set: fresh states for every key (other algorithms).
    limiter.set_rules(
        RuleSet::parse(&["sliding-log:limit=1,window=1s", "gcra:rate=1/s,burst=5"]).unwrap(),
    );
    assert!(limiter.check(&7, 1).unwrap().allowed);
    assert!(!limiter.check(&7, 1).unwrap().allowed);
    assert_eq!(limiter.rules().policies().len(), 2);
    assert_eq!(limiter.len(), 100);
}

#[tokio::test(start_paused = true)]
async fn keyed_acquire_is_fifo_per_key() {
    let limiter: KeyedLimiter<String, tollgate::clock::TokioClock> = KeyedLimiter::with_options(
        "gcra:rate=10/s,burst=1".parse::<Policy>().unwrap(),
        KeyedOptions::default(),
        tollgate::clock::TokioClock::new(),
    );
    let start = tokio::time::Instant::now();
    let (a, b, c) = tokio::join!(
        limiter.acquire("k", 1),
        limiter.acquire("k", 1),
        limiter.acquire("other", 1)
    );
    assert_eq!(a.unwrap().wait(), Duration::ZERO);
    assert_eq!(b.unwrap().wait(), Duration::from_millis(100));
    assert_eq!(c.unwrap().wait(), Duration::ZERO);
    assert_eq!(
        tokio::time::Instant::now() - start,
        Duration::from_millis(100)
    );
}

#[test]
fn a_plain_check_of_rules_that_pace_is_refused_and_acquire_paces_them() {
    for spec in ["shaper:rate=10/s,queue=5", "limit-req:rate=10/s,burst=5"] {
        let policy: Policy = spec.parse().unwrap();
        let clock = Arc::new(ManualClock::new());
        let keyed: KeyedLimiter<String, _> =
            KeyedLimiter::with_options(policy.clone(), KeyedOptions::default(), clock.clone());
        let e = keyed.check("k", 1).unwrap_err();
        assert!(matches!(e, Error::Paces(_)), "{spec}: {e}");
        assert!(keyed.allow("k").is_err(), "{spec}");
        // Nothing was taken by the refusals: the try reports the wait to sleep.
        let first = keyed.check_rules("k", 1, Op::Try).unwrap().decision;
        let second = keyed.check_rules("k", 1, Op::Try).unwrap().decision;
        assert_eq!((first.wait_us, second.wait_us), (0, 100_000), "{spec}");
        let single = tollgate::Limiter::with_clock(policy, clock);
        assert!(matches!(single.check(1), Err(Error::Paces(_))), "{spec}");
        assert_eq!(single.acquire_blocking(1).unwrap().wait_us, 0, "{spec}");
    }
    // nodelay answers at once: nothing to sleep, so a check is the right call.
    let nodelay: KeyedLimiter<String> = KeyedLimiter::new(
        "limit-req:rate=10/s,burst=5,nodelay"
            .parse::<Policy>()
            .unwrap(),
    );
    assert!(nodelay.check("k", 1).unwrap().allowed);
}

/// What a plain check cannot do is refused by name: `concurrency` (its permits would
/// never come back: the key would lock out after `limit` answers).
#[test]
fn a_plain_check_of_a_concurrency_policy_is_refused_by_name() {
    let l: KeyedLimiter<String> =
        KeyedLimiter::new("concurrency:limit=2".parse::<Policy>().unwrap());
    for _ in 0..3 {
        let e = l.check("k", 1).unwrap_err();
        assert!(matches!(e, Error::HoldsPermits(_)), "{e}");
        assert!(e.to_string().contains("KeyedConcurrencyLimiter"), "{e}");
    }
    let single = tollgate::Limiter::new("concurrency:limit=2".parse::<Policy>().unwrap());
    assert!(matches!(single.check(1), Err(Error::HoldsPermits(_))));
}

/// A rule set writes itself as its specs joined by AND, which parse back; a keyed
/// limiter runs on a clock the test drives; no key at all is refused at construction.
#[test]
fn rule_sets_display_and_keyed_limiters_take_a_clock() {
    let rules = RuleSet::parse(&[
        "gcra:rate=10/s,burst=10",
        "fixed-window:limit=500,window=1m",
    ])
    .unwrap();
    let text = rules.to_string();
    let parts: Vec<&str> = text.split(" AND ").collect();
    assert_eq!(parts.len(), 2, "{text}");
    assert_eq!(RuleSet::parse(&parts).unwrap(), rules);

    let clock = Arc::new(ManualClock::new());
    let l: KeyedLimiter<u64, Arc<ManualClock>> = KeyedLimiter::with_clock(
        "gcra:rate=1/s,burst=1".parse::<Policy>().unwrap(),
        clock.clone(),
    );
    assert!(l.check(&7, 1).unwrap().allowed);
    assert!(!l.check(&7, 1).unwrap().allowed);
    clock.advance(Duration::from_secs(1));
    assert!(l.check(&7, 1).unwrap().allowed);

    let zero = std::panic::catch_unwind(|| {
        let options = KeyedOptions {
            max_keys: 0,
            ..KeyedOptions::default()
        };
        KeyedLimiter::<u64, ManualClock>::with_options(
            "gcra:rate=1/s,burst=1".parse::<Policy>().unwrap(),
            options,
            ManualClock::new(),
        )
    });
    let message = *zero.unwrap_err().downcast::<&str>().unwrap();
    assert!(message.contains("max_keys must be at least 1"), "{message}");
}
