//! `tollgate serve` as a real process on port 0, driven by a real HTTP client.

#[path = "support/serve.rs"]
mod serve_process;

use std::process::Command;

use serde_json::{json, Value};
use serve_process::{request, Server};

fn rules_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rules")
}

/// Starts `tollgate serve ARGS --http 127.0.0.1:0` and reads its address.
/// A client of the server's Envoy RLS gRPC API.
type RlsClient = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<tonic::transport::Channel>;

fn start(args: &[&str]) -> Server {
    serve_process::start(args, &[])
}

fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
    serve_process::start(args, env)
}

async fn post(server: &Server, path: &str, body: &str) -> (u16, http::HeaderMap, Value) {
    request(server, "POST", path, body, None).await
}

fn check_body(domain: &str, descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<Value> = descriptors
        .iter()
        .map(|entries| json!({ "entries": entries.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>() }))
        .collect();
    json!({ "domain": domain, "descriptors": descriptors }).to_string()
}

async fn check(
    server: &Server,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
) -> (u16, http::HeaderMap, Value) {
    post(server, "/v1/check", &check_body(domain, descriptors)).await
}

/// Starts a test's counting of the built-in login rule (5 a clock minute) with at
/// least 15 s of the minute left.
fn within_one_minute() {
    tollgate_testkit::clear_of_window_end(
        std::time::Duration::from_secs(60),
        std::time::Duration::from_secs(15),
    );
}

#[tokio::test]
async fn built_in_rules_limit_with_429_and_headers() {
    let server = start(&[]);
    // The login rule counts 5 a clock minute: all of this within one.
    within_one_minute();
    for i in 0..5 {
        let (status, headers, body) = check(&server, "example", &[&[("path", "/login")]]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["statuses"][0]["limit_remaining"], 4 - i);
        assert_eq!(headers["ratelimit-policy"], "\"login\";q=5;w=60");
    }
    let (status, headers, body) = check(&server, "example", &[&[("path", "/login")]]).await;
    assert_eq!(status, 429);
    assert_eq!(body["overall_code"], "OVER_LIMIT");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    // A rule set (the built-in api_key: GCRA 10/s burst 20 and 1000 per hour): every
    // policy listed, the binding one current (the GCRA has fewer left).
    let (_, headers, _) = check(&server, "example", &[&[("api_key", "h1")]]).await;
    assert_eq!(
        headers["ratelimit-policy"],
        "\"default.0\";q=20;w=2, \"default.1\";q=1000;w=3600"
    );
    assert_eq!(headers["ratelimit"], "\"default.0\";r=19;t=1");
    // Other descriptors are unaffected; an unlimited one is always OK; an unknown one
    // has no limit.
    assert_eq!(
        check(&server, "example", &[&[("path", "/static/app.js")]])
            .await
            .0,
        200
    );
    assert_eq!(
        check(&server, "example", &[&[("remote_address", "10.0.0.1")]])
            .await
            .0,
        200
    );
    let (status, _, body) = check(&server, "example", &[&[("nothing", "here")]]).await;
    assert_eq!(
        (status, body["statuses"][0].get("limit").is_none()),
        (200, true)
    );
}

#[tokio::test]
async fn envoy_documents_load_unchanged_and_behave_as_envoy() {
    let dir = rules_dir().join("envoy-examples.yaml");
    let server = start(&["--rules", dir.to_str().unwrap()]);
    let over = |n: u16| n == 429;
    // Exact value: 3 per hour.
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(check(&server, "envoy", &[&[("database", "users")]]).await.0);
    }
    assert_eq!(codes, [200, 200, 200, 429]);
    // Key only: one counter per value.
    for ip in ["1.1.1.1", "2.2.2.2"] {
        assert_eq!(
            check(&server, "envoy", &[&[("remote_address", ip)]])
                .await
                .0,
            200
        );
        assert_eq!(
            check(&server, "envoy", &[&[("remote_address", ip)]])
                .await
                .0,
            200
        );
        assert!(over(
            check(&server, "envoy", &[&[("remote_address", ip)]])
                .await
                .0
        ));
    }
    // Nested: the limit of the node the last entry matches.
    let nested: &[(&str, &str)] = &[("remote_address", "3.3.3.3"), ("path", "/expensive")];
    assert_eq!(check(&server, "envoy", &[nested]).await.0, 200);
    assert!(over(check(&server, "envoy", &[nested]).await.0));
    // An entry path with no node for its last entry has no limit.
    let unmatched: &[(&str, &str)] = &[("remote_address", "3.3.3.3"), ("path", "/cheap")];
    for _ in 0..3 {
        assert_eq!(check(&server, "envoy", &[unmatched]).await.0, 200);
    }
    // Wildcard: /api/* shares... one counter per value (the value is part of the key).
    assert_eq!(
        check(&server, "envoy", &[&[("path", "/api/a")]]).await.0,
        200
    );
    assert_eq!(
        check(&server, "envoy", &[&[("path", "/api/a")]]).await.0,
        200
    );
    assert!(over(
        check(&server, "envoy", &[&[("path", "/api/a")]]).await.0
    ));
    assert_eq!(
        check(&server, "envoy", &[&[("path", "/api/b")]]).await.0,
        200
    );
    // Unlimited.
    for _ in 0..10 {
        assert_eq!(
            check(&server, "envoy", &[&[("user", "admin")]]).await.0,
            200
        );
    }
    // Replaces: with "premium" in the same request, "standard" is skipped.
    let both: &[&[(&str, &str)]] = &[&[("plan", "standard")], &[("customer", "vip")]];
    for _ in 0..3 {
        assert_eq!(check(&server, "envoy", both).await.0, 200);
    }
    assert!(over(check(&server, "envoy", both).await.0));
    // Shadow mode: over the limit but OK, flagged.
    check(&server, "envoy", &[&[("experiment", "x")]]).await;
    let (status, _, body) = check(&server, "envoy", &[&[("experiment", "x")]]).await;
    assert_eq!(status, 200);
    assert_eq!(body["statuses"][0]["shadow_rejected"], true);
    // A rule set: gcra burst 2 rejects the third without charging the hourly window.
    let key: &[(&str, &str)] = &[("api_key", "k")];
    assert_eq!(check(&server, "envoy", &[key]).await.0, 200);
    assert_eq!(check(&server, "envoy", &[key]).await.0, 200);
    let (status, _, body) = check(&server, "envoy", &[key]).await;
    assert_eq!(status, 429, "{body}");
}

#[tokio::test]
async fn envoy_json_endpoint_and_hits_addend() {
    let server = start(&[
        "--rules",
        rules_dir().join("envoy-examples.yaml").to_str().unwrap(),
    ]);
    let body = json!({"domain": "envoy", "descriptors": [{"entries": [{"key": "database", "value": "users"}]}], "hitsAddend": 2});
    let (status, _, v) = post(&server, "/json", &body.to_string()).await;
    assert_eq!(status, 200);
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(
        v["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 3, "unit": "HOUR"})
    );
    assert_eq!(v["statuses"][0]["limitRemaining"], 1);
    // A per-descriptor hits_addend of 0 looks without counting: the remaining count as
    // it stands (as envoyproxy/ratelimit's INCRBY 0), on a used key and on a fresh one.
    let peek = json!({"domain": "envoy", "descriptors": [{"entries": [{"key": "database", "value": "users"}], "hits_addend": 0}]});
    for _ in 0..2 {
        let (status, _, v) = post(&server, "/json", &peek.to_string()).await;
        assert_eq!((status, v["overallCode"].as_str()), (200, Some("OK")));
        assert_eq!(v["statuses"][0]["limitRemaining"], 1, "2 of 3 used: {v}");
    }
    let fresh = json!({"domain": "envoy", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}], "hits_addend": 0}]});
    let (_, _, v) = post(&server, "/json", &fresh.to_string()).await;
    assert_eq!(
        v["statuses"][0]["limitRemaining"], 2,
        "a fresh key, 2 a minute: {v}"
    );
    let (status, _, v) = post(&server, "/json", &body.to_string()).await;
    assert_eq!(
        (status, v["overallCode"].as_str()),
        (429, Some("OVER_LIMIT"))
    );
}

#[tokio::test]
async fn bad_requests_get_400_naming_the_problem() {
    let server = start(&[]);
    let (status, _, v) = post(&server, "/v1/check", "{not json").await;
    assert_eq!(status, 400);
    assert!(v["error"].as_str().unwrap().contains("line 1"), "{v}");
    let (status, _, v) = post(
        &server,
        "/v1/check",
        r#"{"domain":"example","descriptors":[{"entries":[]}]}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(v["error"], "descriptors[0].entries: must not be empty");
    let (status, _, v) = post(
        &server,
        "/v1/check",
        r#"{"domain":"example","descriptors":[],"extra":1}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("unknown field `extra`"),
        "{v}"
    );
    let huge = format!(
        r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"k","value":"{}"}}]}}]}}"#,
        "x".repeat(100_000)
    );
    assert_eq!(post(&server, "/v1/check", &huge).await.0, 413);
    // The server is still up and deciding.
    assert_eq!(
        check(&server, "example", &[&[("api_key", "z")]]).await.0,
        200
    );
}

#[tokio::test]
async fn acquire_waits_for_the_slot() {
    let server = start(&[]);
    // api_key is gcra 10/s with bursts of 20: take the whole burst, then acquire 5
    // more, which must wait about half a second.
    let burst = r#"{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"w"}]}],"cost":20}"#;
    let clock = tollgate::clock::MonotonicClock::new();
    let burst_us = tollgate::clock::Clock::now_us(&clock);
    assert_eq!(post(&server, "/v1/check", burst).await.0, 200);
    let five = r#"{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"w"}]}],"cost":5}"#;
    let start_us = tollgate::clock::Clock::now_us(&clock);
    let (status, _, v) = post(&server, "/v1/acquire", five).await;
    let waited = tollgate::clock::Clock::now_us(&clock) - start_us;
    assert_eq!(status, 200, "{v}");
    let wait_ms = v["statuses"][0]["wait_ms"].as_u64().expect("a wait");
    // Half a second after the burst, less the time between the two decisions: at most
    // from sending the burst to the acquire's answer less its wait (milliseconds on a
    // quiet machine, more on a busy one).
    let between_ms = (start_us + waited).saturating_sub(burst_us + wait_ms * 1000) / 1000;
    assert!(
        wait_ms <= 500 && wait_ms + between_ms + 1 >= 500,
        "{v} ({between_ms} ms between the calls)"
    );
    assert!(
        waited + 2_000 >= wait_ms * 1000,
        "answered after {waited}us, before the {wait_ms}ms wait"
    );
}

#[test]
fn check_config_names_file_line_and_field() {
    let bad = rules_dir().join("bad.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--rules", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml"), "{err}");
    assert!(err.contains("line 5"), "{err}");
    assert!(err.contains("unknown parameter 'brust'"), "{err}");
    let good = rules_dir().join("envoy-examples.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--rules", good.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn envoy_rls_grpc_is_wire_compatible() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let server = start(&[
        "--rules",
        rules_dir().join("envoy-examples.yaml").to_str().unwrap(),
    ]);
    let mut client = RlsClient::connect(server.grpc.clone()).await.unwrap();
    let descriptor = |key: &str, value: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    };
    let request = |descriptors: Vec<RateLimitDescriptor>, hits: u32| RateLimitRequest {
        domain: "envoy".into(),
        descriptors,
        hits_addend: hits,
    };
    // hits_addend 2 against 3 per hour.
    let r = client
        .should_rate_limit(request(vec![descriptor("database", "users")], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1, "OK");
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (3, 3), "3 per HOUR");
    assert_eq!(s.limit_remaining, 1);
    assert!(s.duration_until_reset.as_ref().unwrap().seconds <= 3600);
    assert!(r
        .response_headers_to_add
        .iter()
        .any(|h| h.key == "ratelimit" && h.value.contains("r=1")));
    // A per-descriptor hits_addend of 0 checks without counting.
    let mut peek = descriptor("database", "users");
    peek.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let r = client
        .should_rate_limit(request(vec![peek], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (1, 1),
        "the count as it stands: 2 of 3 used"
    );
    // Unset hits_addend means 1: the third unit is admitted, the fourth is not.
    let r = client
        .should_rate_limit(request(vec![descriptor("database", "users")], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1);
    let r = client
        .should_rate_limit(request(vec![descriptor("database", "users")], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, r.statuses[0].code), (2, 2), "OVER_LIMIT");
    assert!(r
        .response_headers_to_add
        .iter()
        .any(|h| h.key == "retry-after"));
    // The request's own limit override applies instead of the configuration.
    let mut over = descriptor("anything", "x");
    over.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 2,
    });
    let r = client
        .should_rate_limit(request(vec![over.clone()], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1);
    assert_eq!(
        r.statuses[0].current_limit.as_ref().map(|l| l.unit),
        Some(2),
        "MINUTE: {r:?}"
    );
    let r = client
        .should_rate_limit(request(vec![over], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 2);
    // A bad request is INVALID_ARGUMENT, and the server keeps serving.
    let err = client
        .should_rate_limit(RateLimitRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let r = client
        .should_rate_limit(request(vec![descriptor("user", "admin")], 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1);
}

/// Connections are spread over the worker threads in turn; they count on one set of
/// counters: six gRPC connections and an HTTP one, one hit each against 3 per hour,
/// are admitted exactly three times.
#[tokio::test]
async fn connections_on_different_workers_share_the_counts() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let rules = rules_dir().join("envoy-examples.yaml");
    // Spread: each new connection on the next worker, so the six calls cross all three.
    let server = start(&[
        "--workers",
        "3",
        "--balance",
        "spread",
        "--rules",
        rules.to_str().unwrap(),
    ]);
    assert!(
        server.banner.contains("3 worker(s), spread"),
        "{}",
        server.banner
    );
    let request = RateLimitRequest {
        domain: "envoy".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "database".into(),
                value: "users".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let mut codes = Vec::new();
    for _ in 0..6 {
        let mut client = RlsClient::connect(server.grpc.clone()).await.unwrap();
        let r = client.should_rate_limit(request.clone()).await.unwrap();
        codes.push(r.into_inner().overall_code);
    }
    assert_eq!(codes, [1, 1, 1, 2, 2, 2], "OK three times, then OVER_LIMIT");
    let (status, _, v) = post(
        &server,
        "/json",
        r#"{"domain":"envoy","descriptors":[{"entries":[{"key":"database","value":"users"}]}]}"#,
    )
    .await;
    assert_eq!(
        (status, v["overallCode"].as_str()),
        (429, Some("OVER_LIMIT")),
        "{v}"
    );

    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--workers", "0"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--workers"), "{stderr}");
}

/// CPU ticks (user + system) of each `tg-worker-N` thread of `pid`, by N.
fn worker_ticks(pid: u32, workers: usize) -> Vec<u64> {
    let mut ticks = vec![0; workers];
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let Some(n) = comm.trim().strip_prefix("tg-worker-") else {
            continue;
        };
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: utime and stime are the
        // 12th and 13th.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after.split(' ').collect();
        ticks[n.parse::<usize>().unwrap()] =
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    ticks
}

/// The value of the metric line that starts with `series` at `/metrics`.
async fn metric(server: &Server, series: &str) -> f64 {
    let (_, _, v) = request(server, "GET", "/metrics", "", None).await;
    let text = v.as_str().unwrap().to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{series} in {text}"))
        .parse()
        .unwrap()
}

/// `n` gRPC connections to the server's Envoy RLS API.
async fn rls_clients(server: &Server, n: usize) -> Vec<RlsClient> {
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(RlsClient::connect(server.grpc.clone()).await.unwrap());
    }
    clients
}

/// Held by a test that loads a server heavily: two at once would crowd each other's
/// CPUs, which the workers' balancing reads.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// 16 gRPC calls in flight over the clients' connections until stopped, each asking
/// for `descriptors` decisions.
struct HeavyLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    callers: Vec<tokio::task::JoinHandle<()>>,
}

impl HeavyLoad {
    fn start(clients: &[RlsClient], descriptors: usize) -> HeavyLoad {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let callers = (0..16)
            .map(|i| {
                let mut client = clients[i % clients.len()].clone();
                let stop = stop.clone();
                let keys: Vec<String> =
                    (0..descriptors).map(|d| format!("heavy-{i}-{d}")).collect();
                tokio::spawn(async move {
                    let entries: Vec<[(&str, &str); 1]> =
                        keys.iter().map(|k| [("api_key", k.as_str())]).collect();
                    let asked: Vec<&[(&str, &str)]> = entries.iter().map(|e| &e[..]).collect();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        rls(&mut client, "example", &asked, 0).await;
                    }
                })
            })
            .collect();
        HeavyLoad { stop, callers }
    }

    async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for c in self.callers {
            c.await.unwrap();
        }
    }
}

#[tokio::test]
async fn packed_workers_serve_light_load_on_one_spread_heavy_load_and_gather_after() {
    use std::time::Duration;

    let _heavy = HEAVY.lock().await;
    let server = start(&["--workers", "2"]);
    assert!(
        server.banner.contains("2 worker(s), packed"),
        "{}",
        server.banner
    );
    let mut clients = rls_clients(&server, 4).await;
    // Light load, one call at a time: every connection stays on the first worker.
    // (Light enough that the worker's busy share stays low even when a busy machine
    // holds it off the CPU mid-call: the share is of wall-clock time.)
    async fn light(clients: &mut [RlsClient], round: u32) {
        for i in 0..200 {
            let client = &mut clients[i % 4];
            let key = format!("light-{round}-{i}");
            let (code, _, _) = rls(client, "example", &[&[("api_key", key.as_str())]], 0).await;
            assert_eq!(code, 1, "OK");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let before = worker_ticks(server.pid(), 2);
    light(&mut clients, 1).await;
    let after = worker_ticks(server.pid(), 2);
    assert!(
        after[0] > before[0],
        "worker 0 served: {before:?} -> {after:?}"
    );
    assert_eq!(
        after[1], before[1],
        "worker 1 stayed asleep: {before:?} -> {after:?}"
    );
    let on = |w: u8| format!("tollgate_worker_connections{{worker=\"{w}\"}}");
    // Four gRPC connections, and the HTTP one asking.
    assert_eq!(metric(&server, &on(0)).await, 5.0);
    assert_eq!(metric(&server, &on(1)).await, 0.0);

    // Heavy load, 16 calls in flight: the first worker is busy, so connections move
    // to the second, which serves from then on.
    let load = HeavyLoad::start(&clients, 1);
    let before = worker_ticks(server.pid(), 2);
    let mut spread = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if worker_ticks(server.pid(), 2)[1] > before[1] + 5 {
            spread = true;
            break;
        }
    }
    load.stop().await;
    assert!(
        spread,
        "worker 1 never served: {before:?} -> {:?}",
        worker_ticks(server.pid(), 2)
    );
    let moved = |w: u8| format!("tollgate_worker_moves_in{{worker=\"{w}\"}}");
    assert!(metric(&server, &moved(1)).await >= 1.0);

    // Quiet again: the connections are gathered back onto the first worker.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = worker_ticks(server.pid(), 2);
    light(&mut clients, 2).await;
    let after = worker_ticks(server.pid(), 2);
    assert_eq!(
        after[1], before[1],
        "gathered on worker 0: {before:?} -> {after:?}"
    );
    assert_eq!(metric(&server, &on(1)).await, 0.0, "all back on worker 0");
    assert!(metric(&server, &moved(0)).await >= 1.0);
}

/// Two workers on one CPU under heavy load: the first is busy, so a spread wakes the
/// second, on trial, which then either pays or goes back (which of the two depends on
/// what else the machine runs on that CPU: the unit tests of `workers` hold the
/// verdict to its inputs); either way the trial ends and the metrics count it. The
/// /metrics requests' own connections, placed on the idle worker, do not make it
/// awake.
#[tokio::test]
async fn a_spread_onto_a_sleeping_worker_is_tried_and_judged() {
    use std::time::Duration;

    let _heavy = HEAVY.lock().await;
    let server = start(&["--workers", "2"]);
    // The first CPU this process may use (not always CPU 0).
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    let cpu = allowed.trim().split([',', '-']).next().unwrap().to_string();
    let pid = server.pid().to_string();
    let pinned = std::process::Command::new("taskset")
        .args(["-a", "-c", "-p", &cpu, &pid])
        .output()
        .unwrap();
    assert!(pinned.status.success(), "{pinned:?}");
    let clients = rls_clients(&server, 4).await;
    let tried = "tollgate_worker_spreads_tried{worker=\"1\"}";
    let sent_back = "tollgate_worker_spreads_sent_back{worker=\"1\"}";
    let on = |w: u8| format!("tollgate_worker_connections{{worker=\"{w}\"}}");
    // 20 decisions a call: the server's CPU, not the client's, sets the pace.
    let load = HeavyLoad::start(&clients, 20);
    let mut ran = false;
    for _ in 0..200 {
        if metric(&server, tried).await >= 1.0 {
            ran = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ran, "no spread was tried in 10 s of heavy load");
    // The verdict, once the trial's 300 ms are over: back on the first worker, and
    // counted, or kept (the second worker still serving the connections it took).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut judged = false;
    for _ in 0..40 {
        let back = metric(&server, sent_back).await >= 1.0 && metric(&server, &on(1)).await == 0.0;
        let kept = metric(&server, sent_back).await == 0.0 && metric(&server, &on(1)).await >= 1.0;
        if back || kept {
            judged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    load.stop().await;
    assert!(judged, "the trial never ended");
}

#[tokio::test]
async fn hot_reload_keeps_unchanged_rules_and_rejects_bad_files() {
    let dir = std::env::temp_dir().join(format!("tollgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("rules.yaml");
    let v1 = "domain: live\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    std::fs::write(&file, v1).unwrap();
    let server = start(&["--rules", dir.to_str().unwrap()]);
    let user: &[(&str, &str)] = &[("user", "u")];
    assert_eq!(check(&server, "live", &[user]).await.0, 200);
    assert_eq!(check(&server, "live", &[user]).await.0, 429);

    // A new rule appears; the unchanged one keeps its counter (still over the limit).
    let v2 = format!("{v1}  - key: team\n    policies: [\"fixed-window:limit=1,window=1h\"]\n");
    std::fs::write(&file, &v2).unwrap();
    // The watcher looks once a second.
    let mut reloaded = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let (_, _, cfg) = request(&server, "GET", "/v1/config", "", None).await;
        if cfg["domains"][0]["limits"]
            .as_array()
            .map_or(0, |l| l.len())
            == 2
        {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the file change was picked up");
    assert_eq!(
        check(&server, "live", &[user]).await.0,
        429,
        "state of the unchanged rule kept"
    );
    assert_eq!(check(&server, "live", &[&[("team", "t")]]).await.0, 200);

    // A bad file is rejected; the previous rules stay in force.
    std::fs::write(
        &file,
        "domain: live\ndescriptors:\n  - key: user\n    policies: [\"nope\"]\n",
    )
    .unwrap();
    let (status, _, v) = request(&server, "POST", "/v1/reload", "", None).await;
    assert_eq!(status, 422);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("unknown algorithm 'nope'"),
        "{v}"
    );
    assert_eq!(check(&server, "live", &[user]).await.0, 429);
    assert_eq!(check(&server, "live", &[&[("team", "t")]]).await.0, 429);
    let sample = |text: &str, series: &str| -> f64 {
        (text.lines())
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in {text}"))
    };
    let (_, _, metrics) = request(&server, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap().to_string();
    assert_eq!(sample(&text, "tollgate_config_last_reload_successful"), 0.0);
    assert!(sample(&text, "tollgate_config_reloads_total{result=\"failed\"}") >= 1.0);

    // SIGHUP reloads too (the good file again).
    std::fs::write(&file, &v2).unwrap();
    let pid = server.pid().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    // Reloaded once the signal has been handled (a busy machine takes a while).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let text = loop {
        let (_, _, metrics) = request(&server, "GET", "/metrics", "", None).await;
        let text = metrics.as_str().unwrap().to_string();
        if sample(&text, "tollgate_config_last_reload_successful") == 1.0 {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not reloaded: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(sample(&text, "tollgate_config_reloads_total{result=\"ok\"}") >= 2.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn metrics_count_decisions_and_keys() {
    let server = start(&[]);
    check(&server, "example", &[&[("path", "/login")]]).await;
    check(&server, "example", &[&[("api_key", "a")]]).await;
    check(&server, "example", &[&[("api_key", "b")]]).await;
    let (status, _, v) = request(&server, "GET", "/metrics", "", None).await;
    assert_eq!(status, 200);
    let text = v.as_str().unwrap();
    assert!(text.contains("tollgate_decisions_total{domain=\"example\",rule=\"example/path=/login\",outcome=\"allowed\"} 1"), "{text}");
    assert!(
        text.contains("tollgate_keys{domain=\"example\",rule=\"example/api_key\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_decision_duration_seconds_count 3"),
        "{text}"
    );
}

#[tokio::test]
async fn admin_endpoints_need_the_token_when_one_is_set() {
    let reset = r#"{"domain":"example","entries":[{"key":"path","value":"/login"}]}"#;
    let open = start(&[]);
    assert_eq!(
        request(&open, "POST", "/v1/reset", reset, None).await.0,
        200,
        "loopback, no token"
    );
    let guarded = start_with_env(&[], &[("TOLLGATE_ADMIN_TOKEN", "s3cret")]);
    within_one_minute();
    assert_eq!(
        request(&guarded, "POST", "/v1/reset", reset, None).await.0,
        401
    );
    assert_eq!(
        request(&guarded, "POST", "/v1/reset", reset, Some("wrong"))
            .await
            .0,
        401
    );
    for _ in 0..5 {
        check(&guarded, "example", &[&[("path", "/login")]]).await;
    }
    assert_eq!(
        check(&guarded, "example", &[&[("path", "/login")]]).await.0,
        429
    );
    assert_eq!(
        request(&guarded, "POST", "/v1/reset", reset, Some("s3cret"))
            .await
            .0,
        200
    );
    assert_eq!(
        check(&guarded, "example", &[&[("path", "/login")]]).await.0,
        200,
        "reset forgot the counter"
    );
}

/// Sends one descriptor over gRPC with `hits`; returns (overall code, remaining,
/// requests_per_unit).
async fn rls(
    client: &mut RlsClient,
    domain: &str,
    descriptors: &[&[(&str, &str)]],
    hits: u32,
) -> (i32, Vec<u32>, Vec<u32>) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: hits,
    };
    let r = client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner();
    (
        r.overall_code,
        r.statuses.iter().map(|s| s.limit_remaining).collect(),
        r.statuses
            .iter()
            .map(|s| s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit))
            .collect(),
    )
}

#[tokio::test]
async fn the_envoy_documentation_examples_behave_as_documented() {
    const OK: i32 = 1;
    const OVER: i32 = 2;
    let dir = rules_dir().join("envoy-docs");
    let server = start(&["--rules", dir.to_str().unwrap()]);
    let mut c = RlsClient::connect(server.grpc.clone()).await.unwrap();

    // 1: exact values, 500 per second.
    let (code, remaining, per_unit) =
        rls(&mut c, "mongo_cps", &[&[("database", "users")]], 1).await;
    assert_eq!((code, remaining, per_unit), (OK, vec![499], vec![500]));

    // 2: five marketing messages per number per day; the overall per-number limit
    // counts separately; another number has its own counters.
    let marketing: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2061111111")];
    let number: &[(&str, &str)] = &[("to_number", "2061111111")];
    assert_eq!(
        rls(&mut c, "messaging", &[marketing, number], 5).await.0,
        OK
    );
    let (code, remaining, _) = rls(&mut c, "messaging", &[marketing, number], 1).await;
    assert_eq!(
        (code, remaining),
        (OVER, vec![0, 94]),
        "the logical OR of both decisions"
    );
    let other: &[(&str, &str)] = &[("message_type", "marketing"), ("to_number", "2062222222")];
    assert_eq!(rls(&mut c, "messaging", &[other], 1).await.0, OK);

    // 3: the value match comes before the bare key; 0 requests per unit blocks.
    assert_eq!(
        rls(
            &mut c,
            "edge_proxy_per_ip",
            &[&[("remote_address", "50.0.0.1")]],
            1
        )
        .await
        .0,
        OK
    );
    assert_eq!(
        rls(
            &mut c,
            "edge_proxy_per_ip",
            &[&[("remote_address", "50.0.0.5")]],
            1
        )
        .await
        .0,
        OVER
    );

    // 4: a two-entry descriptor matches only the nested configuration.
    let two: &[(&str, &str)] = &[("key", "value"), ("subkey", "subvalue")];
    let (_, _, per_unit) = rls(&mut c, "example4_flat", &[two], 1).await;
    assert_eq!(per_unit, vec![0], "no limit applies");
    let (_, _, per_unit) = rls(&mut c, "example4_nested", &[two], 1).await;
    assert_eq!(per_unit, vec![300]);

    // 5: unlimited answers OK with the largest remaining.
    let (code, remaining, _) = rls(&mut c, "internal", &[&[("ldap", "x")]], 1000).await;
    assert_eq!((code, remaining), (OK, vec![u32::MAX]));
    assert_eq!(
        rls(&mut c, "internal", &[&[("azure", "x")]], 100).await.0,
        OK
    );
    assert_eq!(
        rls(&mut c, "internal", &[&[("azure", "x")]], 1).await.0,
        OVER
    );

    // 6: user-a is never limited (shadow mode); user-b is.
    let a: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-a")];
    let b: &[(&str, &str)] = &[("service", "auth-service"), ("user", "user-b")];
    assert_eq!(rls(&mut c, "example6", &[a], 30).await.0, OK);
    assert_eq!(rls(&mut c, "example6", &[a], 1).await.0, OK);
    assert_eq!(
        rls(&mut c, "example6", &[b], 30).await.0,
        OVER,
        "30 > 20 per second"
    );

    // 7: with both descriptors, the replaced 5/s limit does not apply (10/s does);
    // with the first alone, 5/s applies.
    let one: &[(&str, &str)] = &[("key_1", "value_1"), ("user", "bkthomps")];
    let two: &[(&str, &str)] = &[("key_2", "value_2"), ("user", "bkthomps")];
    let (code, _, per_unit) = rls(&mut c, "example7", &[one, two], 8).await;
    assert_eq!(
        (code, per_unit),
        (OK, vec![0, 10]),
        "specific_limit was replaced"
    );
    assert_eq!(
        rls(&mut c, "example7", &[one], 6).await.0,
        OVER,
        "alone, 5/s applies"
    );

    // 8: key1=value1 has 20/min, other values 10/min each.
    assert_eq!(
        rls(&mut c, "example8", &[&[("key1", "value1")]], 1).await.2,
        vec![20]
    );
    assert_eq!(
        rls(&mut c, "example8", &[&[("key1", "other")]], 1).await.2,
        vec![10]
    );

    // 9: value* matches value_1 and value_2, each with its own 20/min.
    assert_eq!(
        rls(&mut c, "example9", &[&[("key1", "value_1")]], 20)
            .await
            .0,
        OK
    );
    assert_eq!(
        rls(&mut c, "example9", &[&[("key1", "value_1")]], 1)
            .await
            .0,
        OVER
    );
    assert_eq!(
        rls(&mut c, "example9", &[&[("key1", "value_2")]], 1)
            .await
            .0,
        OK
    );
    assert_eq!(
        rls(&mut c, "example9", &[&[("key1", "nope")]], 1).await.2,
        vec![0]
    );
}

/// Envoy ratelimit's `/healthcheck`: `OK` while serving; after SIGTERM, with
/// `listen.drain_delay`, it fails (and `/readyz` too) while decisions are still
/// answered for the delay, then the server stops.
#[tokio::test]
async fn healthcheck_fails_while_draining_then_the_server_stops() {
    let dir = std::env::temp_dir().join(format!("tollgate-drain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("tollgate.yaml");
    std::fs::write(&config, "listen:\n  drain_delay: 4s\n").unwrap();
    let server = start(&["--config", config.to_str().unwrap()]);
    let (status, _, body) = request(&server, "GET", "/healthcheck", "", None).await;
    assert_eq!((status, body.as_str()), (200, Some("OK\n")));
    assert_eq!(grpc_health(&server).await, 1, "gRPC health: SERVING");
    let pid = server.pid().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    // Draining once the signal has been handled.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let (status, _, body) = request(&server, "GET", "/healthcheck", "", None).await;
        if status != 200 {
            assert_eq!((status, body.as_str()), (500, Some("draining\n")));
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never draining");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(grpc_health(&server).await, 2, "gRPC health: NOT_SERVING");
    assert_eq!(request(&server, "GET", "/readyz", "", None).await.0, 503);
    // Still deciding during the delay.
    assert_eq!(
        check(&server, "example", &[&[("path", "/login")]]).await.0,
        200
    );
    // Then gone (a zombie until the test reaps it).
    let state = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
            .unwrap_or(true)
    };
    let mut exited = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if state() {
            exited = true;
            break;
        }
    }
    assert!(
        exited,
        "still running 10 s after SIGTERM with a 4 s drain delay"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `grpc.health.v1.Health/Check` for the server (`service: ""`) over HTTP/2: the
/// status (1 SERVING, 2 NOT_SERVING).
async fn grpc_health(server: &Server) -> u8 {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    // One empty message: the 5-byte prefix of a 0-byte HealthCheckRequest.
    let req = http::Request::post(format!("{}/grpc.health.v1.Health/Check", server.grpc))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(bytes::Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let collected = resp.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
    let body = collected.to_bytes();
    // The response: prefix, then field 1 (varint) = the status.
    assert_eq!(&body[..], &[0, 0, 0, 0, 2, 0x08, body[6]]);
    body[6]
}

/// `tollgate bench` against a running server takes the address as the banner prints
/// it (`http://host:port`) or bare, and refuses another scheme by name.
#[tokio::test]
async fn bench_takes_the_address_the_banner_prints() {
    let server = start(&[]);
    for (protocol, target) in [("http", &server.base), ("grpc", &server.grpc)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["bench", protocol, "--target", target])
            .args(["--duration", "300ms", "--concurrency", "2", "--keys", "50"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{protocol}: {stdout}");
        assert!(stdout.contains("errors: 0"), "{protocol}: {stdout}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["bench", "grpc", "--target", "https://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--target https://127.0.0.1:1"), "{stderr}");
}

/// `POST /v1/charge`: the usage of work already done, charged into debt; the next
/// check is refused until the budget has paid it back. A limit that cannot be
/// charged is a 400 naming the descriptor.
#[tokio::test]
async fn charge_takes_usage_after_the_fact_into_debt() {
    let dir = std::env::temp_dir().join(format!("tollgate-charge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tokens.yaml"),
        "domain: llm\ndescriptors:\n  - key: api_key\n    policies: ['token-bucket:rate=1000/m,capacity=1000']\n  - key: queue\n    policies: ['shaper:rate=1/s,queue=5']\n",
    )
    .unwrap();
    let server = start(&["--rules", dir.to_str().unwrap()]);
    let body = |cost: u64| {
        format!(
            r#"{{"domain":"llm","descriptors":[{{"entries":[{{"key":"api_key","value":"a"}}]}}],"cost":{cost}}}"#
        )
    };
    let (status, _, v) = post(&server, "/v1/check", &body(1)).await;
    assert_eq!(
        (status, &v["statuses"][0]["limit_remaining"]),
        (200, &json!(999))
    );
    // 1,500 tokens used: 500 past the budget (with the 1 of the check).
    let (status, _, v) = post(&server, "/v1/charge", &body(1499)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["overall_code"], "OK");
    assert_eq!(v["statuses"][0]["limit_remaining"], 0);
    let (status, headers, v) = post(&server, "/v1/check", &body(1)).await;
    assert_eq!(status, 429, "{v}");
    // 501 tokens to refill at 1000 a minute: about 30 s.
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((29..=31).contains(&retry), "{retry}");
    // A charge of 0 changes nothing.
    let (status, _, _) = post(&server, "/v1/charge", &body(0)).await;
    assert_eq!(status, 200);
    let queue =
        r#"{"domain":"llm","descriptors":[{"entries":[{"key":"queue","value":"q"}]}],"cost":3}"#;
    let (status, _, v) = post(&server, "/v1/charge", queue).await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("descriptors[0]: shaper cannot be charged"),
        "{v}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The whole app in-process: listeners bound by the test on port 0 and passed in, the
/// same routes as the binary, and a drain when the test's shutdown future completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_serves_in_process_on_listeners_passed_in() {
    use tollgate_server::serve::{serve_on, Listeners, Settings};
    let settings = Settings::resolve(None, &[], None, None, None, false).unwrap();
    let listeners = Listeners {
        http: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        grpc: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        metrics: None,
    };
    let base = format!("http://{}", listeners.http.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = tokio::spawn(serve_on(settings, listeners, async {
        let _ = stopped.await;
    }));
    let body = check_body("example", &[&[("path", "/login")]]);
    let (status, headers, v) =
        serve_process::request_to(&base, "POST", "/v1/check", &body, None).await;
    assert_eq!((status, &v["overall_code"]), (200, &json!("OK")), "{v}");
    assert_eq!(headers["ratelimit-policy"], "\"login\";q=5;w=60");
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), app)
        .await
        .expect("the app stops when its shutdown future completes")
        .unwrap()
        .unwrap();
}

/// Scrapes at once (Prometheus in pairs) each see every rule's limit: a scrape sets
/// the rule limits it encodes, and one must never encode another's half-set ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_scrapes_each_see_every_rule_limit() {
    let server = std::sync::Arc::new(start(&[]));
    let limits = |text: &str| {
        (text.lines())
            .filter(|l| l.starts_with("tollgate_rule_limit{"))
            .count()
    };
    let (_, _, first) = request(&server, "GET", "/metrics", "", None).await;
    let expected = limits(first.as_str().unwrap());
    assert!(expected >= 2, "{first}");
    let scrapers: Vec<_> = (0..6)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                for _ in 0..150 {
                    let (_, _, text) = request(&server, "GET", "/metrics", "", None).await;
                    assert_eq!(limits(text.as_str().unwrap()), expected);
                }
            })
        })
        .collect();
    for s in scrapers {
        s.await.unwrap();
    }
}
