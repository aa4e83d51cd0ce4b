//! One conformance suite for every store: random rule sets and request traces
//! (proptest) replayed through the memory store (the core, as `tollgate replay` runs
//! it) and through the Redis decision code on a standalone server (as Redis Functions,
//! as an `EVALSHA` script and as the tollgate module) and on a 3-master Cluster (as
//! Functions and as the module), with the trace time passed in. Every decision must be identical, field by field: tries, acquires, charges
//! after the fact (with and without `max-debt`) and Envoy's counting.
//!
//! Batching is on (the default). Events go out in groups submitted concurrently; with
//! one call in flight a group after the first rides one call in trace order, so the
//! driver's many-checks-per-call path is what decides them.

use tollgate_testkit as testkit;

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use testkit::RedisServers;
use tollgate::policy::PolicyState;
use tollgate::redis::{RedisCalls, RedisLimiter, RedisOptions, RedisStore};
use tollgate::{Op, RuleSet};

/// A policy spec with random (often awkward) parameters.
fn spec() -> impl Strategy<Value = String> {
    let rate = prop_oneof![
        Just("3/s"),
        Just("7/m"),
        Just("10/s"),
        Just("1/250ms"),
        Just("2/s"),
        Just("5/3s"),
        Just("1000/s"),
    ];
    let window = prop_oneof![Just("1s"), Just("250ms"), Just("3s"), Just("1m")];
    let max_wait = prop_oneof![
        Just(String::new()),
        Just(",max-wait=500ms".to_string()),
        Just(",max-wait=2s".to_string()),
    ];
    let alg = (rate, window, 1u64..6, 0u64..4, 0u8..14);
    let debt = prop_oneof![
        2 => Just(String::new()),
        1 => (0u64..4).prop_map(|d| format!(",max-debt={d}")),
    ];
    (alg, max_wait, any::<bool>(), debt).prop_map(
        |((rate, window, n, m, which), mw, shadow, debt)| {
            let body = match which {
                0 => format!("gcra:rate={rate},burst={n}"),
                1 => format!("token-bucket:rate={rate},capacity={n}"),
                2 => format!("leaky-bucket:rate={rate},capacity={n}"),
                3 if m == 0 => format!("fixed-window:limit={n},window={window},debt=forgive"),
                3 => format!("fixed-window:limit={n},window={window}"),
                4 => format!("fixed-window:limit={n},window={window},align=first"),
                5 => format!("sliding-log:limit={n},window={window}"),
                6 => format!(
                    "sliding-window:limit={n},window={window},buckets={}",
                    [1, 2, 4, 5][m as usize]
                ),
                7 => format!("sliding-window:limit={n},window={window},mode=weighted"),
                8 => format!("smooth-bursty:rate={rate}"),
                9 => format!("smooth-warmup:rate={rate},warmup={window}"),
                10 => format!("limit-req:rate={rate},burst={m},nodelay"),
                11 => format!("limit-req:rate={rate},burst={}", m + 1),
                12 => format!("limit-req:rate={rate},burst={},delay={m}", m + 1),
                _ => format!("shaper:rate={rate},queue={m}"),
            };
            let shadow = if shadow && which % 5 == 0 {
                ",shadow=true"
            } else {
                ""
            };
            // A policy that cannot be charged (shaper) takes no max-debt.
            let chargeable = body.parse::<tollgate::Policy>().unwrap().chargeable();
            let debt = if chargeable.is_ok() { &debt } else { "" };
            format!("{body}{mw}{shadow}{debt}")
        },
    )
}

#[derive(Debug, Clone)]
struct Event {
    gap_us: u64,
    key: u8,
    cost: u64,
    op: Op,
}

fn event() -> impl Strategy<Value = Event> {
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0u64..2_000,
        4 => 0u64..400_000,
        1 => 0u64..5_000_000,
    ];
    (
        gap,
        0u8..2,
        prop_oneof![6 => Just(1u64), 1 => 2u64..4, 1 => 0u64..30],
        prop_oneof![
            6 => Just(Op::Try),
            3 => Just(Op::Acquire),
            2 => Just(Op::Charge),
            1 => Just(Op::Count),
        ],
    )
        .prop_map(|(gap_us, key, cost, op)| Event {
            gap_us,
            key,
            cost,
            op,
        })
}

fn case() -> impl Strategy<Value = (Vec<String>, bool, Vec<Event>, usize)> {
    (
        prop::collection::vec(spec(), 1..4),
        any::<bool>(),
        prop::collection::vec(event(), 1..40),
        1usize..6,
    )
}

static CASE: AtomicU64 = AtomicU64::new(0);

/// Runs one trace through the memory store and each Redis store.
async fn conform(
    stores: &[(&str, RedisStore)],
    specs: &[String],
    epoch: bool,
    events: &[Event],
    group: usize,
) -> Result<(), TestCaseError> {
    let rules = RuleSet::parse(specs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let name = format!("conf{}", CASE.fetch_add(1, Ordering::Relaxed));
    let limiters: Vec<(&str, RedisLimiter)> = stores
        .iter()
        .enumerate()
        .map(|(i, (label, s))| {
            // Stores on one server keep apart by name.
            let name = format!("{name}s{i}");
            (
                *label,
                RedisLimiter::new(s.clone(), &name, rules.clone()).unwrap(),
            )
        })
        .collect();
    // Replay semantics: one limiter per key, created at t = 0 (the trace's start).
    let mut memory: Vec<Vec<PolicyState>> = vec![rules.init(0), rules.init(0)];
    // Times near today's epoch-anchored microseconds exercise the large numbers.
    let mut t: u64 = if epoch { 1_763_000_000_000_000 } else { 0 };
    let mut timed = Vec::with_capacity(events.len());
    for e in events {
        t += e.gap_us;
        timed.push((t, e));
    }
    for (gi, group) in timed.chunks(group).enumerate() {
        let want: Vec<_> = group
            .iter()
            .map(|(t, e)| rules.check(&mut memory[e.key as usize], *t, e.cost, e.op))
            .collect();
        for (label, limiter) in &limiters {
            let got = futures::future::join_all(group.iter().map(|(t, e)| {
                let key = format!("k{}", e.key);
                async move { limiter.check_at(&key, *t, 0, e.cost, e.op).await }
            }))
            .await;
            for (i, (want, got)) in want.iter().zip(got).enumerate() {
                let (t, e) = group[i];
                match (want, got) {
                    (Ok(w), Ok(g)) => prop_assert_eq!(
                        w,
                        &g,
                        "{} differs at event {} of group {} (t={}, {:?}) for {:?}",
                        label,
                        i,
                        gi,
                        t,
                        e,
                        specs
                    ),
                    (Err(w), Err(tollgate::Error::Check(g))) => {
                        prop_assert_eq!(w, &g)
                    }
                    (w, g) => {
                        prop_assert!(false, "{label} at event {i}: memory {w:?}, redis {g:?}")
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn memory_redis_and_cluster_decide_identically() {
    let module = testkit::with_module();
    let module: Vec<&str> = module.iter().map(String::as_str).collect();
    let single = RedisServers::standalone_with(&module);
    let cluster = RedisServers::cluster_of(0, &module);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Replayed traces set their own time: keys must outlive the run, not the trace.
    // One call in flight and every check queued: a group's later checks queue behind
    // the first and ride the next call together, in order.
    let opts = RedisOptions {
        ttl_margin: std::time::Duration::from_secs(3600),
        timeout: std::time::Duration::from_secs(5),
        in_flight: 1,
        direct_calls: 0,
        ..RedisOptions::default()
    };
    let eval = RedisOptions {
        calls: RedisCalls::Eval,
        ..opts.clone()
    };
    let functions = RedisOptions {
        calls: RedisCalls::Functions,
        ..opts.clone()
    };
    let module = RedisOptions {
        calls: RedisCalls::Module,
        ..opts.clone()
    };
    let stores = rt.block_on(async {
        let connect = |url: String, opts: RedisOptions| async move {
            RedisStore::connect_with(&url, opts).await.unwrap()
        };
        let stores = vec![
            (
                "redis functions",
                connect(single.url(), functions.clone()).await,
            ),
            ("redis evalsha", connect(single.url(), eval).await),
            ("redis module", connect(single.url(), module.clone()).await),
            ("cluster functions", connect(cluster.url(), functions).await),
            ("cluster module", connect(cluster.url(), module).await),
        ];
        assert!(!stores[0].1.uses_eval() && stores[1].1.uses_eval());
        stores
    });
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&case(), |(specs, epoch, events, group)| {
            rt.block_on(conform(&stores, &specs, epoch, &events, group))
        })
        .unwrap();
    for (label, store) in &stores {
        let s = store.call_stats();
        assert!(
            s.checks > s.calls,
            "{label}: batching never happened ({s:?})"
        );
        // Every decision call is in the batch sizes and timed as one; the times'
        // buckets add up to the calls, and a batch of more than one check was seen.
        let decide = s.kinds[tollgate::redis::CallKind::Decide as usize];
        assert_eq!(s.batches.iter().sum::<u64>(), s.calls, "{label}: {s:?}");
        assert_eq!(decide.calls, s.calls, "{label}: {s:?}");
        assert_eq!(
            decide.buckets.iter().sum::<u64>(),
            decide.calls,
            "{label}: {s:?}"
        );
        assert!(
            decide.sum_us > 0 && s.batches[0] < s.calls,
            "{label}: {s:?}"
        );
        // Each call was decided by the code the store was told to use (the module
        // store's rule sets with a sliding-log go to Functions).
        let [module, functions, eval, commands] = s.paths;
        assert_eq!(commands, 0, "{label}: no window counters asked for: {s:?}");
        assert_eq!(module + functions + eval, s.calls, "{label}: {s:?}");
        match *label {
            "redis evalsha" => assert_eq!(eval, s.calls, "{label}: {s:?}"),
            l if l.ends_with("functions") => assert_eq!(functions, s.calls, "{label}: {s:?}"),
            _ => assert!(module > 0 && eval == 0, "{label}: {s:?}"),
        }
    }
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn redis_keeps_every_promise_on_random_traffic() {
    // A sample of the algorithms, deciding in Redis (time passed in): the units
    // admitted in any window, by admission time, stay within Policy::envelope (the
    // memory store is held to it by tollgate-core's property test on every algorithm).
    let single = RedisServers::standalone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let opts = RedisOptions {
        ttl_margin: std::time::Duration::from_secs(3600),
        ..RedisOptions::default()
    };
    let store = rt.block_on(async { RedisStore::connect_with(&single.url(), opts).await.unwrap() });
    let specs = prop::sample::select(
        &[
            "gcra:rate=3/s,burst=4",
            "fixed-window:limit=5,window=250ms",
            "sliding-window:limit=4,window=300ms,buckets=3",
            "limit-req:rate=7/s,burst=2,nodelay",
            "smooth-bursty:rate=5/s",
            "token-bucket:rate=5/250ms,capacity=3",
        ][..],
    );
    let gaps = prop::collection::vec(
        (
            prop_oneof![2 => Just(0u64), 3 => 0u64..20_000, 1 => 0u64..400_000],
            any::<bool>(),
        ),
        1..150,
    );
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&(specs, gaps), |(spec, gaps)| {
            let policy: tollgate::Policy = spec.parse().unwrap();
            let name = format!("env{}", CASE.fetch_add(1, Ordering::Relaxed));
            let limiter = RedisLimiter::new(store.clone(), &name, policy.clone()).unwrap();
            let mut admitted = Vec::new();
            let mut t = 0;
            for (gap, acquire) in gaps {
                t += gap;
                let op = if acquire { Op::Acquire } else { Op::Try };
                let d = rt.block_on(limiter.check_at("k", t, 0, 1, op)).unwrap();
                if d.decision.allowed {
                    admitted.push((t + d.decision.wait_us, 1u64));
                }
            }
            admitted.sort_unstable();
            let own = policy.window_us().max(1);
            for w in [
                1,
                999,
                1000,
                1001,
                own - 1,
                own,
                own + 1,
                2 * own,
                1_000_000,
            ] {
                let envelope = policy.envelope(w).unwrap();
                let seen = tollgate::policy::densest_window(&admitted, w).0;
                prop_assert!(
                    seen <= envelope,
                    "{spec}: {seen} in {w} us, envelope {envelope}"
                );
            }
            Ok(())
        })
        .unwrap();
}

/// A window counter's trace: Envoy's counting, charges, tries and looks.
#[derive(Debug, Clone)]
struct CounterEvent {
    gap_us: u64,
    key: u8,
    cost: u64,
    /// `None`: a peek.
    op: Option<Op>,
}

fn counter_case() -> impl Strategy<Value = (u64, &'static str, bool, Vec<CounterEvent>, usize)> {
    let event = (
        prop_oneof![3 => Just(0u64), 4 => 0u64..2_000, 4 => 0u64..400_000, 1 => 0u64..3_000_000],
        0u8..2,
        prop_oneof![6 => Just(1u64), 1 => 2u64..4, 1 => 0u64..12],
        prop_oneof![
            4 => Just(Some(Op::Count)),
            2 => Just(Some(Op::Try)),
            1 => Just(Some(Op::Charge)),
            1 => Just(None),
        ],
    )
        .prop_map(|(gap_us, key, cost, op)| CounterEvent {
            gap_us,
            key,
            cost,
            op,
        });
    (
        1u64..8,
        prop::sample::select(&["1s", "250ms", "1m"][..]),
        any::<bool>(),
        prop::collection::vec(event, 1..60),
        1usize..6,
    )
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn window_counters_decide_as_the_memory_store_does() {
    // Envoy's rules (a clock-aligned fixed window whose debt is forgiven) kept as one
    // integer key per window and counted by plain commands: every decision, look and
    // error is the memory store's, on one node and on a Cluster, batched.
    use tollgate::redis::RedisLimiterOptions;
    let (single, cluster) = (RedisServers::standalone(), RedisServers::cluster_of(0, &[]));
    let rt = testkit::rt();
    let opts = RedisOptions {
        timeout: std::time::Duration::from_secs(5),
        in_flight: 1,
        direct_calls: 0,
        ..RedisOptions::default()
    };
    let stores = rt.block_on(async {
        vec![
            (
                "redis",
                RedisStore::connect_with(&single.url(), opts.clone())
                    .await
                    .unwrap(),
            ),
            (
                "cluster",
                RedisStore::connect_with(&cluster.url(), opts)
                    .await
                    .unwrap(),
            ),
        ]
    });
    let counters = RedisLimiterOptions {
        window_counters: true,
        ..RedisLimiterOptions::default()
    };
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&counter_case(), |(limit, window, shadow, events, group)| {
            let shadow = if shadow { ",shadow=true" } else { "" };
            let spec = format!("fixed-window:limit={limit},window={window},debt=forgive{shadow}");
            let rules = RuleSet::parse(&[spec.as_str()]).unwrap();
            let case = CASE.fetch_add(1, Ordering::Relaxed);
            // Times near today's: the keys live from now on, as a service's would.
            let mut t: u64 = 1_763_000_000_000_000;
            let timed: Vec<(u64, &CounterEvent)> = events
                .iter()
                .map(|e| {
                    t += e.gap_us;
                    (t, e)
                })
                .collect();
            for (label, store) in &stores {
                let name = format!("win{case}{label}");
                let limiter = RedisLimiter::with_options(
                    store.clone(),
                    &name,
                    rules.clone(),
                    counters.clone(),
                )
                .unwrap();
                let mut memory = [rules.init(0), rules.init(0)];
                for group in timed.chunks(group) {
                    let want: Vec<_> = group
                        .iter()
                        .map(|(t, e)| {
                            let states = &mut memory[e.key as usize];
                            match e.op {
                                Some(op) => rules.check(states, *t, e.cost, op),
                                None => rules.peek(states, *t, e.cost),
                            }
                        })
                        .collect();
                    let got = rt.block_on(futures::future::join_all(group.iter().map(|(t, e)| {
                        let (limiter, key) = (&limiter, format!("k{}", e.key));
                        async move {
                            match e.op {
                                Some(op) => limiter.check_at(&key, *t, 0, e.cost, op).await,
                                None => limiter.peek_at(&key, *t, 0, e.cost).await,
                            }
                        }
                    })));
                    for ((t, e), (want, got)) in group.iter().zip(want.iter().zip(got)) {
                        match (want, got) {
                            (Ok(w), Ok(g)) => {
                                prop_assert_eq!(w, &g, "{} {} at t={} {:?}", label, spec, t, e)
                            }
                            (Err(w), Err(tollgate::Error::Check(g))) => prop_assert_eq!(w, &g),
                            (w, g) => prop_assert!(
                                false,
                                "{label} {spec} {e:?}: memory {w:?}, redis {g:?}"
                            ),
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    for (label, store) in &stores {
        let s = store.call_stats();
        let [module, functions, eval, commands] = s.paths;
        assert_eq!((module, functions, eval), (0, 0, 0), "{label}: {s:?}");
        assert!(commands > 0 && s.checks > s.calls, "{label}: {s:?}");
    }
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn window_counters_are_plain_integer_keys_that_refunds_resets_and_acquires_respect() {
    use tollgate::redis::RedisLimiterOptions;
    use tollgate::RateLimiter;
    let single = RedisServers::standalone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = RedisStore::connect(&single.url()).await.unwrap();
        let rules = RuleSet::parse(&["fixed-window:limit=3,window=1h,debt=forgive"]).unwrap();
        let opts = RedisLimiterOptions {
            window_counters: true,
            ..RedisLimiterOptions::default()
        };
        let limiter =
            RedisLimiter::with_options(store.clone(), "plain", rules, opts.clone()).unwrap();
        // Envoy's counting: a plain integer under the window's key, with a TTL.
        for _ in 0..4 {
            let _ = limiter.check_rules("k", 1, Op::Count).await.unwrap();
        }
        let mut conn = redis::Client::open(single.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("tollgate:plain:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        let hour = 3_600_000_000u64;
        // `...@<window length>/<window start>`, in us.
        let start: u64 = keys[0].rsplit('/').next().unwrap().parse().unwrap();
        assert!(keys[0].contains(&format!("@{hour}/")), "{keys:?}");
        assert_eq!(start % hour, 0, "{keys:?}");
        let count: u64 = redis::cmd("GET")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(count, 4);
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 1000 && ttl <= 3_600_000 + 1001, "{ttl}");
        // Over the limit: a look says so; a try is refused and counts nothing.
        let look = limiter.peek("k", 0).await.unwrap();
        assert_eq!(look.decision.remaining, 0);
        assert!(!limiter.check("k", 1).await.unwrap().allowed);
        // A refund takes back what it can, never below 0.
        limiter.refund("k", 2).await.unwrap();
        let count: u64 = redis::cmd("GET")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(count, 2);
        assert!(limiter.check("k", 1).await.unwrap().allowed);
        limiter.refund("k", 10).await.unwrap();
        let count: u64 = redis::cmd("GET")
            .arg(&keys[0])
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(count, 0);
        // A reset forgets the window.
        let _ = limiter.check_rules("k", 3, Op::Count).await.unwrap();
        limiter.reset("k").await.unwrap();
        assert_eq!(limiter.peek("k", 0).await.unwrap().decision.remaining, 3);
        // Acquire would reserve a later window: refused, naming why.
        let e = limiter.acquire("k", 1).await.unwrap_err();
        assert!(e.to_string().contains("window counters"), "{e}");
        // A rule set that does not qualify is kept by the scripts as always.
        let gcra = RuleSet::parse(&["gcra:rate=1/s,burst=1"]).unwrap();
        let other = RedisLimiter::with_options(store.clone(), "scripted", gcra, opts).unwrap();
        assert!(other.check("k", 1).await.unwrap().allowed);
        let s = store.call_stats();
        assert!(
            s.paths[3] > 0 && s.paths[0] + s.paths[1] + s.paths[2] > 0,
            "{s:?}"
        );
    });
}

/// A key counted again and again in its window sends its `PEXPIRE` once (the first
/// count), where envoyproxy/ratelimit sends one a hit; a key deleted meanwhile is made
/// again by the `INCRBY` alone, and gets its time to live right after; so does one
/// made again by a count whose answer never came (Redis paused past the timeout).
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn a_window_counter_sets_its_time_to_live_once_a_window_and_again_when_made_again() {
    use tollgate::redis::RedisLimiterOptions;
    use tollgate::RateLimiter;
    let single = RedisServers::standalone();
    let hour = std::time::Duration::from_secs(3600);
    testkit::clear_of_window_end(hour, std::time::Duration::from_secs(60));
    testkit::rt().block_on(async {
        let store = RedisStore::connect(&single.url()).await.unwrap();
        let rules = RuleSet::parse(&["fixed-window:limit=100,window=1h,debt=forgive"]).unwrap();
        let opts = RedisLimiterOptions {
            window_counters: true,
            ..RedisLimiterOptions::default()
        };
        let limiter =
            RedisLimiter::with_options(store, "hot", rules.clone(), opts.clone()).unwrap();
        let calls = |name: &str| -> u64 {
            let stats = single.cli(0, &["INFO", "commandstats"]);
            let line = stats
                .lines()
                .find(|l| l.starts_with(&format!("cmdstat_{name}:")));
            line.and_then(|l| l.split(['=', ',']).nth(1)?.parse().ok())
                .unwrap_or(0)
        };
        let key_ttl = |name: &str| -> (String, i64) {
            let key = single.cli(0, &["--scan", "--pattern", &format!("tollgate:{name}:*")]);
            let key = key.trim().to_string();
            let ttl = single.cli(0, &["PTTL", &key]).trim().parse().unwrap();
            (key, ttl)
        };
        // The state asserted, waited for: the key there with its time to live (5 s at
        // most).
        let ttl_set = |name: &str| -> (String, i64) {
            for _ in 0..500 {
                let (key, ttl) = key_ttl(name);
                if ttl >= 0 {
                    return (key, ttl);
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            key_ttl(name)
        };
        single.cli(0, &["CONFIG", "RESETSTAT"]);
        for i in 0..20 {
            let d = limiter.check_rules("k", 1, Op::Count).await.unwrap();
            assert_eq!(d.decision.remaining, 100 - (i + 1), "count {i}");
        }
        assert_eq!((calls("incrby"), calls("pexpire")), (20, 1));
        let (key, ttl) = key_ttl("hot");
        assert!(ttl > 1000 && ttl <= 3_600_000 + 1001, "{key}: {ttl}");
        // Deleted (as an eviction would): made again, and given its time to live.
        single.cli(0, &["DEL", &key]);
        let d = limiter.check_rules("k", 1, Op::Count).await.unwrap();
        assert_eq!(d.decision.remaining, 99);
        let (again, ttl) = ttl_set("hot");
        assert_eq!(again, key);
        assert!(ttl > 1000 && ttl <= 3_600_000 + 1001, "{key}: {ttl}");
        assert_eq!((calls("incrby"), calls("pexpire")), (21, 2));
        for i in 0..5 {
            let d = limiter.check_rules("k", 1, Op::Count).await.unwrap();
            assert_eq!(d.decision.remaining, 98 - i);
        }
        assert_eq!((calls("incrby"), calls("pexpire")), (26, 2));
        // A count whose answer is lost: the key deleted, Redis's writes paused past the
        // store's timeout; the INCRBY runs after the pause, and the PEXPIRE behind it.
        let store = RedisStore::connect_with(
            &single.url(),
            RedisOptions {
                timeout: std::time::Duration::from_millis(100),
                ..RedisOptions::default()
            },
        )
        .await
        .unwrap();
        let paused = RedisLimiter::with_options(store, "lost", rules, opts).unwrap();
        let first = paused.check_rules("k", 1, Op::Count).await.unwrap();
        assert_eq!(first.decision.remaining, 99);
        let (key, _) = key_ttl("lost");
        single.cli(0, &["DEL", &key]);
        single.cli(0, &["CLIENT", "PAUSE", "400", "WRITE"]);
        assert!(paused.check_rules("k", 1, Op::Count).await.is_err());
        let (again, ttl) = ttl_set("lost");
        assert_eq!(again, key);
        assert!(ttl > 1000 && ttl <= 3_600_000 + 1001, "{key}: {ttl}");
        assert_eq!(single.cli(0, &["GET", &key]).trim(), "1");
        // And the store counts as before once it decides again (after its next probe):
        // what it knew was forgotten, so the next count sends its PEXPIRE again.
        let before = calls("pexpire");
        let mut counted = paused.check_rules("k", 1, Op::Count).await;
        for _ in 0..500 {
            if counted.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            counted = paused.check_rules("k", 1, Op::Count).await;
        }
        assert_eq!(counted.unwrap().decision.remaining, 98);
        assert_eq!(calls("pexpire"), before + 1);
    });
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn window_counters_and_scripted_limits_on_one_store_never_share_a_call() {
    // Every check queued: a batch holds both kinds, and each kind goes out as a call
    // of its own (each succeeds or fails whole), on one node and on a Cluster.
    use tollgate::redis::RedisLimiterOptions;
    use tollgate::RateLimiter;
    let (single, cluster) = (RedisServers::standalone(), RedisServers::cluster_of(0, &[]));
    let rt = testkit::rt();
    let opts = RedisOptions {
        in_flight: 1,
        direct_calls: 0,
        ..RedisOptions::default()
    };
    let counters = RedisLimiterOptions {
        window_counters: true,
        ..RedisLimiterOptions::default()
    };
    rt.block_on(async {
        for url in [single.url(), cluster.url()] {
            let store = RedisStore::connect_with(&url, opts.clone()).await.unwrap();
            let window = RuleSet::parse(&["fixed-window:limit=50,window=1h,debt=forgive"]).unwrap();
            let gcra = RuleSet::parse(&["gcra:rate=50/h,burst=50"]).unwrap();
            let a = RedisLimiter::with_options(store.clone(), "mixa", window, counters.clone())
                .unwrap();
            let b =
                RedisLimiter::with_options(store.clone(), "mixb", gcra, counters.clone()).unwrap();
            assert!(a.keeps_window_counters() && !b.keeps_window_counters());
            // 80 of each kind on one key each, interleaved: exactly 50 of each admitted.
            let calls = (0..160).map(|i| {
                let (a, b) = (&a, &b);
                async move {
                    let limiter = if i % 2 == 0 { a } else { b };
                    limiter.check_rules("k", 1, Op::Try).await.unwrap()
                }
            });
            let got = futures::future::join_all(calls).await;
            let admitted = |parity: usize| {
                (got.iter().enumerate())
                    .filter(|(i, d)| i % 2 == parity && d.decision.allowed)
                    .count()
            };
            assert_eq!((admitted(0), admitted(1)), (50, 50), "{url}");
            let s = store.call_stats();
            let [module, functions, eval, commands] = s.paths;
            assert_eq!(
                module + functions + eval + commands,
                s.calls,
                "{url}: {s:?}"
            );
            assert!(
                commands > 0 && functions > 0 && s.checks > s.calls,
                "{url}: {s:?}"
            );
        }
    });
}
