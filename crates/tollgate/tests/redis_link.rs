//! The Redis store across a link that is cut and healed: redis-server in a network
//! namespace of the test's own, reached over a veth pair, the link cut by dropping
//! every packet inside the namespace (iptables), so that nothing is refused or reset:
//! calls simply go unanswered, as when a switch, a node or a security group fails.
//! Needs root and iproute2 and iptables (`scripts/test.sh` runs as root and installs
//! them).
#![allow(clippy::disallowed_methods)] // tests time real servers

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::redis::{OnError, RedisLimiter, RedisLimiterOptions, RedisOptions, RedisStore};
use tollgate::{RateLimiter, RuleSet};
use tollgate_testkit as testkit;

/// Runs a command that must succeed.
fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| {
            panic!("{args:?}: {e} (the test needs iproute2 and iptables, and root)")
        });
    assert!(out.status.success(), "{args:?}: {out:?}");
}

/// A network namespace with one end of a veth pair (`addr`), the other end on the
/// host (`host`); deleted (with the pair) on drop.
struct Namespace {
    name: String,
    addr: String,
}

impl Namespace {
    fn new() -> Namespace {
        let id = std::process::id() % 60_000;
        let name = format!("tgl{id}");
        let (host_if, ns_if) = (format!("tglh{id}"), format!("tgln{id}"));
        let net = format!("10.{}.{}", 200 + id / 10_000, (id / 40) % 250);
        let last = (id % 40) * 4;
        let (host, addr) = (format!("{net}.{}", last + 1), format!("{net}.{}", last + 2));
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        let ns = Namespace {
            name: name.clone(),
            addr: addr.clone(),
        };
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]);
        run(&["ip", "link", "set", &ns_if, "netns", &name]);
        run(&["ip", "addr", "add", &format!("{host}/30"), "dev", &host_if]);
        run(&["ip", "link", "set", &host_if, "up"]);
        ns.exec(&["ip", "addr", "add", &format!("{addr}/30"), "dev", &ns_if]);
        ns.exec(&["ip", "link", "set", &ns_if, "up"]);
        ns
    }

    fn exec(&self, args: &[&str]) {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend(args);
        run(&all);
    }

    /// Every packet into the namespace dropped (`true`), or none.
    fn cut(&self, cut: bool) {
        let op = if cut { "-I" } else { "-D" };
        self.exec(&["iptables", op, "INPUT", "-j", "DROP"]);
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

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
    let ns = Namespace::new();
    let port = testkit::free_port();
    let server = Command::new("ip")
        .args(["netns", "exec", &ns.name, &testkit::server_binary()])
        .args(["--port", &port.to_string(), "--bind", &ns.addr])
        .args(["--protected-mode", "no", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = testkit::Killed(server);
    let url = format!("redis://{}:{port}/", ns.addr);
    let rt = testkit::rt();
    let timeout = Duration::from_millis(250);
    let limiter = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(20);
        let opts = RedisOptions {
            timeout,
            ..Default::default()
        };
        let store = loop {
            match RedisStore::connect_with(&url, opts.clone()).await {
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
    // Four callers, each a call every 5 ms, for 14 s; the link cut from 2 s to 10 s
    // (long enough for TCP's retransmissions on the old connection to back off by
    // seconds: before connections were replaced, decisions came back more than 4 s
    // after the heal).
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
    ns.cut(true);
    let cut = ms();
    std::thread::sleep(Duration::from_millis(8000));
    let healing = ms();
    ns.cut(false);
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
