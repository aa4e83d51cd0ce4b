//! The Redis store across a link that is cut and healed: redis-server in a network
//! namespace of the test's own, reached over a veth pair, the link cut by dropping
//! every packet inside the namespace (iptables), so that nothing is refused or reset:
//! calls simply go unanswered, as when a switch, a node or a security group fails.
//! Needs root and iproute2 and iptables (`scripts/test.sh` runs as root and installs
//! them).
#![allow(clippy::disallowed_methods)] // tests time real servers

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::quota::{Budget, QuotaBucket, QuotaLedger, QuotaSettings, Usage};
use tollgate::redis::{
    LeaseOptions, LeasedLimiter, OnError, PermitError, RedisConcurrencyLimiter,
    RedisConcurrencyOptions, RedisLimiter, RedisLimiterOptions, RedisOptions, RedisStore,
};
use tollgate::{RateLimiter, RuleSet};
use tollgate_testkit as testkit;

/// What each call saw: (ms since the start, admitted (Redis decided) or not (the
/// failure policy), ms it took).
type Trace = Vec<(u64, bool, u64)>;

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server in a network namespace: run scripts/test.sh (as root)"
)]
#[test]
fn decisions_are_back_within_a_second_of_a_cut_link_healing() {
    let _serial = testkit::timing_sensitive();
    let ns = testkit::Namespace::new(1);
    let redis = testkit::RedisServers::standalone_in(&ns);
    let url = redis.url();
    back_within_a_second_of_a_heal(&url, &|cut| ns.cut(None, cut));
}

/// A Sentinel-managed master's link cut for every client (the Sentinels too, but
/// they wait 60 s before they call it down: no failover) and healed: the store gives
/// up the silent connection, finds the master again through the Sentinels, and
/// decides within a second of the heal.
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server and Sentinels, and cuts a port with iptables: run scripts/test.sh (as root)"
)]
#[test]
fn a_sentinel_master_is_back_within_a_second_of_a_cut_link_healing() {
    let _serial = testkit::timing_sensitive();
    let setup = testkit::SentinelSetup {
        down_after_ms: 60_000,
        ..Default::default()
    };
    let sentinels = testkit::Sentinels::start("cut", setup);
    let master = sentinels.data.ports[0];
    // Every packet to the master's port on the loopback interface dropped while cut
    // (the rule is removed by the guard, however the test ends).
    struct Rule(String);
    impl Rule {
        fn set(&self, on: bool) {
            let op = if on { "-I" } else { "-D" };
            let args = [
                "INPUT", "-i", "lo", "-p", "tcp", "--dport", &self.0, "-j", "DROP",
            ];
            let out = Command::new("iptables")
                .arg(op)
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "iptables {op}: {out:?}");
        }
    }
    impl Drop for Rule {
        fn drop(&mut self) {
            let args = [
                "-D", "INPUT", "-i", "lo", "-p", "tcp", "--dport", &self.0, "-j", "DROP",
            ];
            let _ = Command::new("iptables").args(args).output();
        }
    }
    let rule = Rule(master.to_string());
    back_within_a_second_of_a_heal(&sentinels.url(), &|cut| rule.set(cut));
}

/// Four callers of a fail-closed limiter on `url` (timeout 250 ms), each a call every
/// 5 ms for 14 s; `cut(true)` at 2 s, `cut(false)` at 10 s (long enough for TCP's
/// retransmissions on the old connection to back off by seconds: before connections
/// were replaced, decisions came back more than 4 s after the heal): every call is
/// answered within the timeout, and decisions are back within a second of the heal.
fn back_within_a_second_of_a_heal(url: &str, cut_link: &dyn Fn(bool)) {
    let rt = testkit::rt();
    let timeout = Duration::from_millis(250);
    let limiter = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        let opts = RedisOptions {
            timeout,
            ..Default::default()
        };
        let store = loop {
            match RedisStore::connect_with(url, opts.clone()).await {
                Ok(store) => break store,
                Err(e) => assert!(Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let rules = RuleSet::parse(&["fixed-window:limit=1000000000,window=1h"]).unwrap();
        let opts = RedisLimiterOptions {
            on_error: OnError::FailClosed,
            ..Default::default()
        };
        RedisLimiter::with_options(store, "link", rules, opts).unwrap()
    });
    let start = Instant::now();
    let ms = move || start.elapsed().as_millis() as u64;
    let load = {
        let limiter = limiter.clone();
        std::thread::spawn(move || {
            rt.block_on(async {
                let tasks: Vec<_> = (0..4)
                    .map(|i| {
                        let limiter = limiter.clone();
                        tokio::spawn(async move {
                            let mut trace = Trace::new();
                            while ms() < 14_000 {
                                let t0 = ms();
                                let allowed = match limiter.check(&format!("k{i}"), 1).await {
                                    Ok(d) => d.allowed,
                                    Err(e) => panic!("the failure policy answers: {e}"),
                                };
                                trace.push((t0, allowed, ms() - t0));
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                            trace
                        })
                    })
                    .collect();
                let mut all = Trace::new();
                for t in tasks {
                    all.extend(t.await.unwrap());
                }
                all.sort();
                all
            })
        })
    };
    std::thread::sleep(Duration::from_millis(2000));
    cut_link(true);
    let cut = ms();
    std::thread::sleep(Duration::from_millis(8000));
    let healing = ms();
    cut_link(false);
    let trace = load.join().unwrap();
    let stats = limiter.stats();
    let before = trace.iter().filter(|e| e.0 + e.2 < cut).count();
    let first_ok_after = |at: u64| trace.iter().find(|e| e.1 && e.0 >= at).map(|e| e.0);
    let back = first_ok_after(healing).expect("decisions not back within 4 s of the heal");
    let slowest = trace.iter().map(|e| e.2).max().unwrap();
    let during: Vec<_> = trace
        .iter()
        .filter(|e| e.0 >= cut + 300 && e.0 + e.2 < healing)
        .collect();
    println!(
        "{} calls ({before} before the cut); cut at {cut} ms, healed at {healing} ms; \
         decisions back {} ms after the heal; {} calls during the cut, slowest call \
         {slowest} ms; {stats:?}",
        trace.len(),
        back - healing,
        during.len()
    );
    assert!(before > 100, "{before} calls before the cut");
    // While cut, the failure policy answers (fail-closed: rejects), within the timeout.
    assert!(!during.is_empty() && during.iter().all(|e| !e.1));
    assert!(
        slowest <= 250 + 250,
        "a call took {slowest} ms (timeout 250 ms)"
    );
    // Back within a second of the heal: no waiting on the old connection's
    // retransmissions.
    assert!(
        back - healing <= 1000,
        "decisions back {} ms after the heal",
        back - healing
    );
    // The cut is an outage and the heal its recovery (a busy machine's slow call
    // elsewhere may add a short one of its own).
    assert!(
        stats.outages >= 1 && stats.recoveries == stats.outages && !stats.failing,
        "{stats:?}"
    );
}

/// One call of the Cluster tests: ms since the start, which of the checks it was,
/// whether its key is on the node at fault, whether Redis decided (fail-closed: a
/// reject is the failure policy), and how long it took (us).
struct Call {
    at_ms: u64,
    kind: usize,
    on_fault: bool,
    ok: bool,
    took_us: u64,
}

/// A check of one key the callers make: whether Redis decided it (`false`: the
/// failure policy did).
type Check = Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, bool> + Send + Sync>;

/// A fail-closed limiter's try as a [`Check`] (Redis admits every try: a reject is
/// the failure policy's).
fn try_of<L: RateLimiter + Clone + Send + Sync + 'static>(limiter: &L) -> Check {
    let limiter = limiter.clone();
    Arc::new(move |key: String| {
        let limiter = limiter.clone();
        Box::pin(async move {
            let d = limiter.check(&key, 1).await;
            d.unwrap_or_else(|e| panic!("the failure policy answers: {e}"))
                .allowed
        })
    })
}

/// The 99th percentile of `v` (us).
fn p99(v: Vec<u64>) -> u64 {
    percentile(v, 99)
}

/// The `p`th percentile of `v` (us).
fn percentile(mut v: Vec<u64>, p: usize) -> u64 {
    assert!(!v.is_empty());
    v.sort_unstable();
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// A fail-closed limiter with `timeout` on `servers`' Cluster, and 300 keys, each
/// with whether it is on the node `fault` names.
fn cluster_limiter(
    rt: &tokio::runtime::Runtime,
    servers: &testkit::RedisServers,
    fault: &str,
    timeout: Duration,
) -> (RedisLimiter, Vec<(String, bool)>) {
    let limiter = rt.block_on(async {
        let opts = RedisOptions {
            timeout,
            ..Default::default()
        };
        let store = RedisStore::connect_with(&servers.url(), opts)
            .await
            .unwrap();
        let rules = RuleSet::parse(&["fixed-window:limit=1000000000,window=1h"]).unwrap();
        let opts = RedisLimiterOptions {
            on_error: OnError::FailClosed,
            ..Default::default()
        };
        RedisLimiter::with_options(store, "fault", rules, opts).unwrap()
    });
    let keys: Vec<(String, bool)> = (0..300)
        .map(|i| {
            let key = format!("k{i}");
            let on_fault = *limiter.node_of(&key) == *fault;
            (key, on_fault)
        })
        .collect();
    let n = keys.iter().filter(|k| k.1).count();
    assert!(
        (50..250).contains(&n),
        "{n} of 300 keys on {fault}: the slot map was not learned"
    );
    (limiter, keys)
}

/// Eight callers, each a call every 2 ms over `keys` in turn (and over `checks` in
/// turn), until `ms()` reaches `until_ms`: every call, in the order they were made.
fn drive(
    rt: tokio::runtime::Runtime,
    checks: Vec<Check>,
    keys: &[(String, bool)],
    ms: impl Fn() -> u64 + Copy + Send + Sync + 'static,
    until_ms: u64,
) -> std::thread::JoinHandle<Vec<Call>> {
    let keys = keys.to_vec();
    std::thread::spawn(move || {
        rt.block_on(async {
            let tasks: Vec<_> = (0..8)
                .map(|t| {
                    let (checks, keys) = (checks.clone(), keys.clone());
                    tokio::spawn(async move {
                        let mut calls = Vec::new();
                        let mut n = t * 37;
                        while ms() < until_ms {
                            // Each key in turn, once by each check.
                            let kind = n % checks.len();
                            let (key, on_fault) = &keys[(n / checks.len()) % keys.len()];
                            n += 1;
                            let (at_ms, t0) = (ms(), Instant::now());
                            let ok = checks[kind](key.clone()).await;
                            calls.push(Call {
                                at_ms,
                                kind,
                                on_fault: *on_fault,
                                ok,
                                took_us: t0.elapsed().as_micros() as u64,
                            });
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                        calls
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.unwrap());
            }
            all.sort_by_key(|c| c.at_ms);
            all
        })
    })
}

/// The latencies (us) of the calls made within `[from, to)` (ms) that ended by `to`,
/// on the node at fault (`on_fault`) or on the others.
fn took(calls: &[Call], from: u64, to: u64, on_fault: bool) -> Vec<u64> {
    (calls.iter())
        .filter(|c| c.on_fault == on_fault && c.at_ms >= from && c.at_ms + c.took_us / 1000 < to)
        .map(|c| c.took_us)
        .collect()
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts a Redis Cluster in a network namespace: run scripts/test.sh (as root)"
)]
#[test]
fn one_cut_off_cluster_node_costs_only_its_own_keys() {
    let _serial = testkit::timing_sensitive();
    let ns = testkit::Namespace::new(3);
    let servers = testkit::RedisServers::cluster_in(&ns);
    let (cut_node, cut_host) = (servers.addresses()[2].clone(), servers.hosts[2].clone());
    let rt = testkit::rt();
    let (limiter, keys) = cluster_limiter(&rt, &servers, &cut_node, Duration::from_millis(250));
    let on_cut = keys.iter().filter(|k| k.1).count();
    // For 14 s; the third master's link cut from 3 s to 11 s (the masters still see
    // one another: no failover, the Cluster stays up).
    let start = Instant::now();
    let ms = move || start.elapsed().as_millis() as u64;
    let load = drive(rt, vec![try_of(&limiter)], &keys, ms, 14_000);
    std::thread::sleep(Duration::from_millis(3000));
    ns.cut(Some(&cut_host), true);
    let cut = ms();
    std::thread::sleep(Duration::from_millis(4000));
    // A readiness check sees which node is away (`/readyz`: degraded, not down).
    let pings = testkit::rt().block_on(limiter.store().ping_nodes());
    std::thread::sleep(Duration::from_millis(cut + 8000 - ms()));
    let healing = ms();
    ns.cut(Some(&cut_host), false);
    let calls = load.join().unwrap();
    let healthy_before = took(&calls, 1000, cut, false);
    let during: Vec<&Call> = (calls.iter())
        .filter(|c| c.at_ms >= cut + 300 && c.at_ms + c.took_us / 1000 < healing)
        .collect();
    let healthy_during = took(&calls, cut + 300, healing, false);
    let ok_during = during.iter().filter(|c| c.ok).count();
    let healthy_ok = during.iter().filter(|c| !c.on_fault && c.ok).count();
    let back = (calls.iter())
        .find(|c| c.on_fault && c.ok && c.at_ms >= healing)
        .map(|c| c.at_ms - healing);
    let slowest = calls.iter().map(|c| c.took_us).max().unwrap() / 1000;
    let (p99_before, p99_during) = (p99(healthy_before.clone()), p99(healthy_during.clone()));
    println!(
        "{} calls, {on_cut} of 300 keys on the cut node {cut_node}; during the cut: \
         {ok_during} of {} OK, healthy keys {healthy_ok} of {} OK, their p99 {p99_during} us \
         (before: {p99_before} us of {} calls); slowest call {slowest} ms; the cut node's \
         keys back {back:?} ms after the heal; {:?}",
        calls.len(),
        during.len(),
        healthy_during.len(),
        healthy_before.len(),
        limiter.node_stats()
    );
    assert!(healthy_before.len() > 200, "too few calls before the cut");
    // The healthy two thirds of the slots decide as usual, at their usual latency.
    assert!(
        ok_during * 100 >= during.len() * 60,
        "{ok_during} of {} OK during the cut",
        during.len()
    );
    assert!(
        healthy_ok * 100 >= healthy_during.len() * 99,
        "healthy keys: {healthy_ok} of {} OK",
        healthy_during.len()
    );
    assert!(
        p99_during <= 2 * p99_before.max(5_000),
        "healthy keys' p99 {p99_during} us during the cut, {p99_before} us before"
    );
    // Nothing hangs past the timeout, and the cut node's keys are back within a second.
    assert!(
        slowest <= 250 + 250,
        "a call took {slowest} ms (timeout 250 ms)"
    );
    let back = back.expect("the cut node's keys not back by the end");
    assert!(
        back <= 1000,
        "the cut node's keys back {back} ms after the heal"
    );
    let away: Vec<&str> = (pings.iter())
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| &**n)
        .collect();
    assert_eq!((pings.len(), away), (3, vec![&*cut_node]), "{pings:?}");
    let stats = limiter.node_stats();
    let cut_stats = stats.iter().find(|(n, _)| **n == *cut_node).unwrap().1;
    assert!(
        cut_stats.outages >= 1 && !cut_stats.failing,
        "{cut_stats:?}"
    );
}

/// A fail-closed concurrency limiter's `try_acquire` as a [`Check`] (Redis grants
/// every permit: the limit is far above the callers; the permit is released at once).
fn permit_of(permits: &RedisConcurrencyLimiter) -> Check {
    let permits = permits.clone();
    Arc::new(move |key: String| {
        let permits = permits.clone();
        Box::pin(async move {
            match permits.try_acquire(&key, 1).await {
                Ok(_released_as_it_drops) => true,
                Err(PermitError::Denied(_)) => false,
                Err(e) => panic!("fail-closed answers: {e}"),
            }
        })
    })
}

/// A quota bucket's update (one Envoy reporting) in `ledger` as a [`Check`]: `false`
/// when it failed (as RLQS then answers with its failure policy).
fn bucket_of(ledger: &Arc<QuotaLedger>) -> Check {
    let ledger = ledger.clone();
    let budget = Budget::of(
        &"token-bucket:rate=1000000/s,capacity=1000000"
            .parse()
            .unwrap(),
    );
    let budget = budget.unwrap();
    Arc::new(move |key: String| {
        let ledger = ledger.clone();
        Box::pin(async move {
            let report = |b: &mut QuotaBucket, now| b.report(1, 0, Usage::default(), now);
            match ledger
                .update(&key, budget, QuotaSettings::default(), report)
                .await
            {
                Ok(_) => true,
                Err(tollgate::Error::Unavailable(_)) => false,
                Err(e) => panic!("a bucket update failed for good: {e}"),
            }
        })
    })
}

/// The other calls a Cluster node's fault must not spread from: leased limits,
/// concurrency permits and RLQS quota buckets, every key by each in turn, the third
/// master's link cut for 8 s. For each: the other nodes' keys are served as usual
/// (none waits on the cut node), the cut node's get the failure policy without
/// waiting out a timeout each, and they are back within a second of the heal.
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts a Redis Cluster in a network namespace: run scripts/test.sh (as root)"
)]
#[test]
fn leases_permits_and_quota_buckets_on_a_cut_cluster_node_cost_only_their_own_keys() {
    let _serial = testkit::timing_sensitive();
    let ns = testkit::Namespace::new(3);
    let servers = testkit::RedisServers::cluster_in(&ns);
    let (cut_node, cut_host) = (servers.addresses()[2].clone(), servers.hosts[2].clone());
    let rt = testkit::rt();
    // Where each key lives: every limiter's Redis keys of a key share its hash tag.
    let (placed, keys) = cluster_limiter(&rt, &servers, &cut_node, Duration::from_millis(250));
    let store = placed.store().clone();
    let (leased, permits, ledger) = rt.block_on(async {
        let rules = RuleSet::parse(&["gcra:rate=1000000/s,burst=1000000"]).unwrap();
        let lease = LeaseOptions {
            redis: RedisLimiterOptions {
                on_error: OnError::FailClosed,
                ..Default::default()
            },
            ..Default::default()
        };
        let leased = LeasedLimiter::new(store.clone(), "leased", rules, lease).unwrap();
        let opts = RedisConcurrencyOptions {
            on_error: OnError::FailClosed,
            ..Default::default()
        };
        let permits =
            RedisConcurrencyLimiter::with_options(store.clone(), "permits", 1000, opts).unwrap();
        (leased, permits, Arc::new(QuotaLedger::redis(store.clone())))
    });
    const KINDS: [&str; 3] = ["leased try", "permit", "quota bucket"];
    let checks = vec![try_of(&leased), permit_of(&permits), bucket_of(&ledger)];
    let start = Instant::now();
    let ms = move || start.elapsed().as_millis() as u64;
    let load = drive(rt, checks, &keys, ms, 14_000);
    std::thread::sleep(Duration::from_millis(3000));
    ns.cut(Some(&cut_host), true);
    let cut = ms();
    std::thread::sleep(Duration::from_millis(8000));
    let healing = ms();
    ns.cut(Some(&cut_host), false);
    let calls = load.join().unwrap();
    let slowest = calls.iter().map(|c| c.took_us).max().unwrap() / 1000;
    let mut failed = Vec::new();
    for (kind, what) in KINDS.iter().enumerate() {
        let of_kind: Vec<&Call> = calls.iter().filter(|c| c.kind == kind).collect();
        let took = |from: u64, to: u64, on_fault: bool| -> Vec<u64> {
            (of_kind.iter())
                .filter(|c| c.on_fault == on_fault && c.at_ms >= from)
                .filter(|c| c.at_ms + c.took_us / 1000 < to)
                .map(|c| c.took_us)
                .collect()
        };
        let before = took(1000, cut, false);
        let healthy = took(cut + 300, healing, false);
        let in_cut = |c: &&&Call| c.at_ms >= cut + 300 && c.at_ms + c.took_us / 1000 < healing;
        let healthy_ok = (of_kind.iter().filter(in_cut)).filter(|c| !c.on_fault && c.ok);
        let cut_keys = (of_kind.iter().filter(in_cut)).filter(|c| c.on_fault);
        let (cut_calls, cut_ok) =
            cut_keys.fold((0, 0), |(n, ok), c| (n + 1, ok + usize::from(c.ok)));
        // Calls of the cut node's keys that waited out the timeout (250 ms): the
        // probes (one per 500 ms) and the calls already sent when the link was cut.
        let cut_waited = took(cut + 300, healing, true)
            .iter()
            .filter(|t| **t >= 200_000)
            .count();
        let healthy_waited = healthy.iter().filter(|t| **t >= 200_000).count();
        let back = (of_kind.iter())
            .find(|c| c.on_fault && c.ok && c.at_ms >= healing)
            .map(|c| c.at_ms - healing);
        let (p50_before, p50) = (
            percentile(before.clone(), 50),
            percentile(healthy.clone(), 50),
        );
        let healthy_ok = healthy_ok.count();
        println!(
            "{what}: {} calls; during the cut the other keys {healthy_ok} of {} OK, their \
             median {p50} us (before {p50_before} us), {healthy_waited} waited 200 ms or \
             more; the cut node's keys {cut_ok} of {cut_calls} OK, {cut_waited} waited \
             200 ms or more; back {back:?} ms after the heal",
            of_kind.len(),
            healthy.len(),
        );
        let mut check = |ok: bool, why: String| {
            if !ok {
                failed.push(format!("{what}: {why}"));
            }
        };
        check(
            before.len() > 100,
            format!("{} calls before the cut", before.len()),
        );
        check(
            healthy_ok * 100 >= healthy.len() * 99,
            format!("the other keys {healthy_ok} of {} OK", healthy.len()),
        );
        check(
            healthy_waited * 100 <= healthy.len(),
            format!(
                "{healthy_waited} of the other keys' {} calls waited",
                healthy.len()
            ),
        );
        check(
            p50 <= 2 * p50_before.max(5_000),
            format!("the other keys' median {p50} us, {p50_before} us before"),
        );
        // Failing at once, not after a timeout each: about 16 probes in 8 s, each
        // check's own (a few more for calls that were out when the link was cut).
        check(
            cut_calls > 200 && cut_ok * 2 < cut_calls,
            format!("cut keys {cut_ok} of {cut_calls} OK"),
        );
        check(
            cut_waited <= 40,
            format!("{cut_waited} calls of the cut node's keys waited"),
        );
        check(
            back.is_some_and(|b| b <= 1000),
            format!("back {back:?} ms after the heal"),
        );
    }
    println!(
        "slowest call {slowest} ms; leases {:?}; permits {:?}; buckets {:?}",
        leased.node_stats(),
        permits.node_stats(),
        ledger.node_stats()
    );
    assert!(failed.is_empty(), "{failed:#?}");
    assert!(
        slowest <= 250 + 250,
        "a call took {slowest} ms (timeout 250 ms)"
    );
    for (what, stats) in [
        ("leases", leased.node_stats()),
        ("permits", permits.node_stats()),
        ("buckets", ledger.node_stats()),
    ] {
        let cut_stats = stats.iter().find(|(n, _)| **n == *cut_node).map(|s| s.1);
        assert!(
            cut_stats.is_some_and(|s| s.outages >= 1 && s.recoveries >= 1 && !s.failing),
            "{what}: {stats:?}"
        );
        let others_failed = (stats.iter()).any(|(n, s)| **n != *cut_node && s.outages > 0);
        assert!(!others_failed, "{what}: {stats:?}");
    }
}

/// Sends `DEBUG SLEEP secs` to the Redis at `addr` back to back until `until` (ms
/// on `ms`): the node answers every call late, by up to `secs`, and is never down.
fn slow_down(addr: &str, secs: &str, ms: impl Fn() -> u64, until: u64) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let cmd = format!(
        "*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${}\r\n{secs}\r\n",
        secs.len()
    );
    let mut ok = [0u8; 5];
    while ms() < until {
        conn.write_all(cmd.as_bytes()).unwrap();
        conn.read_exact(&mut ok).unwrap();
        assert_eq!(&ok, b"+OK\r\n");
    }
}

/// Slow is not down: one master answering up to 50 ms late keeps deciding its keys
/// (no outage, every decision Redis's); one answering up to 500 ms late, past the
/// timeout, has its keys answered by the failure policy when it fails to answer in
/// time, never later; the other masters' keys decide as usual, at their usual
/// latency, throughout. Slow seconds alternate with normal ones, so that the
/// machine's own noise falls on both sides of the comparison.
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts a Redis Cluster: run scripts/test.sh"
)]
#[test]
fn a_slow_cluster_node_slows_only_its_own_keys() {
    let _serial = testkit::timing_sensitive();
    let servers = testkit::RedisServers::cluster_of(0, &["--enable-debug-command", "yes"]);
    let slow_node = servers.addresses()[2].clone();
    let rt = testkit::rt();
    // A timeout well above 50 ms (a busy machine adds its own delays), below 500 ms.
    let timeout = Duration::from_millis(400);
    let (limiter, keys) = cluster_limiter(&rt, &servers, &slow_node, timeout);
    // For 17 s: from 1 s, four rounds of a normal second, a second with the third
    // master up to 50 ms late, a normal second, and a second with it up to 500 ms late.
    let start = Instant::now();
    let ms = move || start.elapsed().as_millis() as u64;
    let load = drive(rt, vec![try_of(&limiter)], &keys, ms, 17_000);
    let rounds: Vec<u64> = (0..4).map(|r| 1000 + r * 4000).collect();
    for &round in &rounds {
        for (second, late) in [(1000, "0.05"), (3000, "0.5")] {
            std::thread::sleep(Duration::from_millis((round + second).saturating_sub(ms())));
            slow_down(&slow_node, late, ms, round + second + 1000);
        }
    }
    let calls = load.join().unwrap();
    let stats = limiter.node_stats();
    // Calls of a second from its first 100 ms on (a slowdown's first calls overlap the
    // second before), on the other nodes or on the slow one.
    let of = |second: u64, on_fault: bool| -> Vec<u64> {
        (rounds.iter())
            .flat_map(|&r| took(&calls, r + second + 100, r + second + 1000, on_fault))
            .collect()
    };
    let normal: Vec<u64> = [of(0, false), of(2000, false)].concat();
    let (at_50, slow_50, at_500) = (of(1000, false), of(1000, true), of(3000, false));
    let healthy_failed = (calls.iter())
        .filter(|c| !c.on_fault && !c.ok && c.at_ms >= 1000)
        .count();
    let in_50 = |c: &&Call| {
        let r = rounds.iter().rev().find(|&&r| r <= c.at_ms);
        r.is_some_and(|r| (r + 1100..r + 2000).contains(&c.at_ms))
    };
    let slow_50_failed = (calls.iter())
        .filter(|c| c.on_fault && !c.ok)
        .filter(in_50)
        .count();
    let slowest = calls.iter().map(|c| c.took_us).max().unwrap() / 1000;
    let median = |v: &Vec<u64>| percentile(v.clone(), 50);
    let (m_normal, m_50, m_500) = (median(&normal), median(&at_50), median(&at_500));
    let (p_normal, p_50, p_500) = (p99(normal.clone()), p99(at_50), p99(at_500));
    let slow_p99_50 = p99(slow_50.clone());
    println!(
        "{} calls; other keys' median {m_normal} / {m_50} / {m_500} us; their p99 \
         {p_normal} us in normal seconds, {p_50} us while a \
         node was up to 50 ms late, {p_500} us while it was up to 500 ms late; \
         {healthy_failed} of theirs failed; the slow node's keys at 50 ms: \
         {slow_50_failed} failed, p99 {slow_p99_50} us; \
         slowest call {slowest} ms; {stats:?}",
        calls.len(),
    );
    assert!(normal.len() > 500, "too few calls in normal seconds");
    // The other masters' keys do not notice (a busy machine may time out one of
    // their calls now and then, as it may at any time).
    let healthy_calls = calls
        .iter()
        .filter(|c| !c.on_fault && c.at_ms >= 1000)
        .count();
    assert!(
        healthy_failed * 100 <= healthy_calls,
        "{healthy_failed} of {healthy_calls} calls of the other keys failed"
    );
    // Their median: the p99 of a few seconds of calls is the machine's noise on a
    // busy two-core box (it is printed above, and docs/redis.md gives it).
    for (m, what) in [(m_50, "50 ms"), (m_500, "500 ms")] {
        assert!(
            m <= 2 * m_normal.max(2_000),
            "other keys' median {m} us while a node was up to {what} late, {m_normal} us otherwise"
        );
    }
    // 50 ms late is slow, not down: Redis decides every key, later.
    assert_eq!(slow_50_failed, 0);
    assert!(
        slow_p99_50 >= 20_000,
        "the slow node's keys were not slowed"
    );
    // 500 ms late is past the timeout: its keys get the failure policy, in time.
    assert!(
        slowest <= 400 + 250,
        "a call took {slowest} ms (timeout 400 ms)"
    );
    let slow_stats = stats.iter().find(|(n, _)| **n == *slow_node).unwrap().1;
    assert!(slow_stats.outages >= 1, "{slow_stats:?}");
}
