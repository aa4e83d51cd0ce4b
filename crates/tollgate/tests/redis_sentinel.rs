//! Redis behind Sentinel: a master, its replica and three Sentinels, all real
//! (`redis-server --sentinel`). The store finds the master by name, follows a failover
//! under load, and names each way connecting can go wrong.
#![allow(clippy::disallowed_methods)] // tests time real servers

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::redis::{
    OnError, Password, RedisLimiter, RedisLimiterOptions, RedisOptions, RedisStore, RedisTls,
};
use tollgate::{RateLimiter, RuleSet};
use tollgate_testkit::{rt, Pki, SentinelSetup, Sentinels};

#[path = "support/connect.rs"]
mod connect;

use connect::{config_error, three_of_a_burst_of_two};

const PASSWORD: &str = "p/a+s=s@w:rd";
const SENTINEL_PASSWORD: &str = "s3nt/+=inel";

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn tls_sentinels_with_passwords_of_their_own_find_the_master_and_each_mistake_is_named() {
    let pki = Pki::new();
    let sentinels = Sentinels::start(
        "orders",
        SentinelSetup {
            tls: Some(&pki),
            password: Some(PASSWORD),
            sentinel_password: Some(SENTINEL_PASSWORD),
            ..Default::default()
        },
    );
    let url = sentinels.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let opts = RedisOptions {
        tls: Some(RedisTls {
            ca_file: Some(pki.path("ca.pem")),
            ..Default::default()
        }),
        password: Some(Password::new(PASSWORD)),
        sentinel_password: Some(Password::new(SENTINEL_PASSWORD)),
        timeout: Duration::from_secs(2),
        ..Default::default()
    };
    rt().block_on(async {
        let ok = three_of_a_burst_of_two(&url, opts.clone()).await;
        assert_eq!(ok.unwrap(), [true, true, false]);
        // The state is on the master the Sentinels name (server 0), replicated.
        assert!(sentinels.data.cli(0, &["dbsize"]).trim() != "0");

        let unknown = url.replace("/orders", "/invoices");
        let e = config_error(three_of_a_burst_of_two(&unknown, opts.clone()).await);
        assert!(e.contains("no Sentinel knows this master name"), "{e}");
        assert!(e.contains("invoices"), "{e}");

        let wrong_sentinel_password = RedisOptions {
            sentinel_password: Some(Password::new("nope")),
            ..opts.clone()
        };
        let e = config_error(three_of_a_burst_of_two(&url, wrong_sentinel_password).await);
        assert!(e.contains("a Sentinel refused the login"), "{e}");

        let no_master_password = RedisOptions {
            password: None,
            ..opts.clone()
        };
        let e = config_error(three_of_a_burst_of_two(&url, no_master_password).await);
        assert!(e.contains("Redis requires a login"), "{e}");

        let other_ca = RedisOptions {
            tls: Some(RedisTls {
                ca_file: Some(pki.path("other-ca.pem")),
                ..Default::default()
            }),
            ..opts.clone()
        };
        let e = config_error(three_of_a_burst_of_two(&url, other_ca).await);
        assert!(e.contains("certificate does not verify"), "{e}");
        assert!(
            !e.contains(PASSWORD) && !e.contains(SENTINEL_PASSWORD),
            "{e}"
        );

        // No Sentinel reachable: transient, and a store made to connect later works
        // once one answers (here: never; it keeps answering "unavailable").
        let nowhere = "rediss+sentinel://127.0.0.1:1,127.0.0.1:2/orders";
        let e = three_of_a_burst_of_two(nowhere, opts.clone())
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(RedisStore::connect_later(nowhere, opts.clone()).is_ok());
    });
}

/// What one call saw: when it started and how long it took.
struct Call {
    started: Instant,
    took: Duration,
}

/// Eight tasks checking one key of `limiter` (every call must answer and admit) until
/// stopped.
struct Load {
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(limiter: &Arc<RedisLimiter>, key: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (limiter, key, stop, calls) = (
                limiter.clone(),
                key.to_string(),
                stop.clone(),
                calls.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let d = limiter.check(&key, 1).await.expect("fail-open answers");
                    assert!(d.allowed);
                    mine.push(Call {
                        started,
                        took: started.elapsed(),
                    });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                calls.lock().unwrap().extend(mine);
            }));
        }
        Load { stop, calls, tasks }
    }

    async fn stop(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

/// A fail-open limiter of a huge daily fixed window (every call admitted; the count
/// in Redis is the admissions Redis made) on the Sentinels' master.
async fn fail_open_limiter(url: &str, timeout: Duration) -> Arc<RedisLimiter> {
    let opts = RedisOptions {
        timeout,
        ..Default::default()
    };
    let store = RedisStore::connect_with(url, opts).await.unwrap();
    let rules = RuleSet::parse(&[&format!("fixed-window:limit={HUGE},window=1d")]).unwrap();
    let options = RedisLimiterOptions {
        on_error: OnError::FailOpen,
        ..Default::default()
    };
    Arc::new(RedisLimiter::with_options(store, "failover", rules, options).unwrap())
}

const HUGE: u64 = 1_000_000_000;

/// Polls until `done` holds, every 5 ms, at most 60 s: how long it took.
async fn until(since: Instant, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    while !done() {
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "{what}: not within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    since.elapsed()
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn a_failover_under_load_is_followed_and_its_cost_is_counted() {
    let _quiet = tollgate_testkit::timing_sensitive();
    let mut sentinels = Sentinels::start("limits", SentinelSetup::default());
    let url = sentinels.url();
    let replica_port = sentinels.data.ports[1];
    // Far above a call's time on a busy machine: the one outage is the failover's.
    let timeout = Duration::from_millis(1000);
    rt().block_on(async {
        let limiter = fail_open_limiter(&url, timeout).await;
        let key = format!("failover-{}", std::process::id());
        let load = Load::start(&limiter, &key);
        until(Instant::now(), "Redis decides under the load", || {
            limiter.stats().redis_decisions > 50
        })
        .await;

        let killed = Instant::now();
        sentinels.data.stop(0);
        // Once the calls out at the kill have failed, Redis decisions stop until the
        // store reaches the promoted replica.
        tokio::time::sleep(timeout + Duration::from_millis(100)).await;
        let stalled = limiter.stats().redis_decisions;
        let switched = until(killed, "the Sentinels promote the replica", || {
            tokio::task::block_in_place(|| sentinels.master_port(0)) == Some(replica_port)
        })
        .await;
        let resumed = until(killed, "decisions on the new master", || {
            limiter.stats().redis_decisions > stalled
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let calls = load.stop().await;
        let stats = limiter.stats();
        let used = HUGE - limiter.peek(&key, 0).await.unwrap().decision.remaining;
        let slowest = calls.iter().map(|c| c.took).max().unwrap();
        let during = calls
            .iter()
            .filter(|c| c.started >= killed && c.started < killed + resumed)
            .count();
        let lost = stats.redis_decisions as i64 - used as i64;
        println!(
            "failover: {} calls by 8 tasks; the Sentinels switched {switched:?} after the kill; \
             decisions resumed on the new master {resumed:?} after it; {during} calls meanwhile, \
             answered by the failure policy; slowest call {slowest:?} (timeout {timeout:?}); \
             Redis admitted {}, the new master holds {used}: {lost} admissions lost with the \
             old master (replication is asynchronous); stats {stats:?}",
            calls.len(),
            stats.redis_decisions,
        );
        // Every call answered within the timeout (and scheduling on a loaded machine).
        assert!(
            slowest < timeout + Duration::from_millis(750),
            "{slowest:?}"
        );
        // The store followed the Sentinels promptly: within a probe interval (500 ms)
        // and a search, plus slack for a loaded machine.
        assert!(
            resumed <= switched + Duration::from_secs(2),
            "resumed {resumed:?}, switched {switched:?}"
        );
        assert!(during > 0 && stats.fallback_decisions > 0, "{stats:?}");
        assert_eq!(stats.outages, 1, "{stats:?}");
        // The new master holds what was replicated: never more than Redis admitted,
        // give or take calls that failed after Redis applied them (their answer was
        // lost with the connection).
        assert!(
            used <= stats.redis_decisions + stats.redis_errors,
            "{used} > {stats:?}"
        );
        assert!(used > 0);
    });
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[test]
fn a_manual_failover_is_followed_as_soon_as_the_sentinels_announce_it() {
    let _quiet = tollgate_testkit::timing_sensitive();
    let sentinels = Sentinels::start("limits", SentinelSetup::default());
    let url = sentinels.url();
    let replica_port = sentinels.data.ports[1];
    rt().block_on(async {
        let limiter = fail_open_limiter(&url, Duration::from_millis(250)).await;
        let key = format!("switch-{}", std::process::id());
        let load = Load::start(&limiter, &key);
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The old master stays up, a master still, until the Sentinels reconfigure it
        // (seconds after the switch): the store must leave it when the switch is
        // announced, not when it is demoted.
        let asked = Instant::now();
        let at_ask = limiter.stats().redis_decisions;
        let ok =
            tokio::task::block_in_place(|| sentinels.cli(0, &["SENTINEL", "FAILOVER", "limits"]));
        assert!(ok.contains("OK"), "{ok}");
        let switched = until(asked, "the Sentinels promote the replica", || {
            tokio::task::block_in_place(|| sentinels.master_port(0)) == Some(replica_port)
        })
        .await;
        let at_switch = limiter.stats().redis_decisions;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let calls = load.stop().await;
        let stats = limiter.stats();
        // Once the old master is a replica of the new one, what it admitted after the
        // promotion is gone: had the store stayed on it, that would be everything
        // since the switch.
        let demoted = until(asked, "the old master becomes a replica", || {
            let info = sentinels.data.cli(0, &["info", "replication"]);
            info.contains("role:slave") && info.contains("master_link_status:up")
        })
        .await;
        let used = HUGE - limiter.peek(&key, 0).await.unwrap().decision.remaining;
        let lost = stats.redis_decisions as i64 - used as i64;
        let window = at_switch - at_ask;
        println!(
            "manual failover: {} calls; the Sentinels switched {switched:?} after asking and \
             demoted the old master {demoted:?} after; Redis admitted {}, {window} of them \
             between asking and the switch; the new master holds {used}: {lost} lost with \
             the old master; stats {stats:?}",
            calls.len(),
            stats.redis_decisions
        );
        // Only admissions made before the switch was announced can be lost (Sentinel
        // promotes first and announces after), give or take the calls out when it was.
        assert!(lost <= window as i64 + 100, "lost {lost}, window {window}");
        assert!(used > at_switch - at_ask, "{used}");
    });
}
