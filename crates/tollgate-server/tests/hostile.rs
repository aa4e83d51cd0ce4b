//! Hostile clients against `tollgate serve` as a real process: every abuse gets a
//! clear status naming what is wrong (or the limit's own answer), the server stays
//! up, and other keys' counts are untouched.

#[path = "support/serve.rs"]
mod serve_process;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use serve_process::{request, Server};

fn check_body(value: &str, hits: Option<&str>) -> String {
    let hits = hits
        .map(|h| format!(",\"hits_addend\":{h}"))
        .unwrap_or_default();
    format!(
        r#"{{"domain":"example","descriptors":[{{"entries":[{{"key":"api_key","value":"{value}"}}]}}]{hits}}}"#
    )
}

async fn check(server: &Server, value: &str) -> (u16, Value) {
    let (status, _, v) = request(server, "POST", "/v1/check", &check_body(value, None), None).await;
    (status, v)
}

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

/// The remaining count of the bystander key: what every abuse must leave alone.
async fn bystander(server: &Server) -> u64 {
    let (status, v) = check(server, "bystander").await;
    assert_eq!(status, 200, "{v}");
    v["statuses"][0]["limit_remaining"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abusive_requests_get_clear_errors_and_leave_other_keys_alone() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rules/hostile.yaml");
    let server = serve_process::start(&["--rules", rules], &[]);
    let before = bystander(&server).await;

    // A key longer than requests.max_key_bytes (1024): refused, naming the bound.
    let (status, _, v) = request(
        &server,
        "POST",
        "/v1/check",
        &check_body(&"k".repeat(5_000), None),
        None,
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("requests.max_key_bytes"),
        "{v}"
    );

    // Deeply nested JSON: the decoder's depth limit, a 400 that says where.
    let nested = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    let (status, _, v) = request(&server, "POST", "/v1/check", &nested, None).await;
    assert_eq!(status, 400, "{v}");

    // Huge costs: beyond any capacity is an error, not a silent reject; a negative or
    // fractional cost does not decode.
    for hits in ["18446744073709551615", "1e30", "-1", "0.5"] {
        let (status, _, v) = request(
            &server,
            "POST",
            "/v1/check",
            &check_body("costly", Some(hits)),
            None,
        )
        .await;
        assert!(status == 400 || status == 429, "hits {hits}: {status} {v}");
    }

    // A body over 64 KiB: 413 before it is read whole.
    let (status, _, _) = request(
        &server,
        "POST",
        "/v1/check",
        &check_body(&"v".repeat(100_000), None),
        None,
    )
    .await;
    assert_eq!(status, 413);
    let (status, _, v) = request(
        &server,
        "POST",
        "/json",
        &check_body(&"v".repeat(100_000), None),
        None,
    )
    .await;
    assert_eq!(status, 413, "{v}");
    assert!(v["error"].as_str().unwrap().contains("length limit"), "{v}");

    // gRPC: 10,000 descriptors in one request, beyond requests.max_descriptors (256).
    let mut grpc = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let many = RateLimitRequest {
        domain: "example".into(),
        descriptors: (0..10_000)
            .map(|i| descriptor("api_key", &format!("many-{i}")))
            .collect(),
        hits_addend: 1,
    };
    let status = grpc.should_rate_limit(many).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(
        status.message().contains("requests.max_descriptors"),
        "{status}"
    );
    // A huge hits_addend over gRPC: over the limit, as Envoy's service answers a cost
    // beyond the limit (and nothing is counted).
    let huge = RateLimitRequest {
        domain: "example".into(),
        descriptors: vec![descriptor("api_key", "huge")],
        hits_addend: u32::MAX,
    };
    let r = grpc.should_rate_limit(huge).await.unwrap().into_inner();
    assert_eq!(r.overall_code, 2, "{r:?}");

    // Malformed protobuf in a well-formed gRPC frame: a gRPC error status, no crash.
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let garbage: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x80];
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(garbage.len() as u32).to_be_bytes());
    frame.extend_from_slice(garbage);
    let req = http::Request::post(format!(
        "{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        server.grpc
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(bytes::Bytes::from(frame)))
    .unwrap();
    let resp = client.request(req).await.unwrap();
    let headers = resp.headers().clone();
    let collected = resp.into_body().collect().await.unwrap();
    let code = collected
        .trailers()
        .and_then(|t| t.get("grpc-status").cloned())
        .or_else(|| headers.get("grpc-status").cloned())
        .expect("a grpc-status");
    assert_ne!(code, "0", "garbage decoded as a request");

    // Still up, and the bystander lost exactly its own one unit per check.
    assert_eq!(bystander(&server).await, before - 1);
}

/// The wall clock jumps (libfaketime moves `CLOCK_REALTIME`, as an operator or NTP
/// step would; the monotonic clock runs on): an exhausted key is not released by a
/// jump forward, a fresh key is not blocked by a jump back, and counts continue. Both
/// clock sources (`TOLLGATE_CLOCK` unset: the TSC; `os`: `CLOCK_MONOTONIC`).
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "runs tollgate under libfaketime: run scripts/test.sh, or cargo test --features external-servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_jumps_neither_release_nor_block_traffic() {
    for source in ["tsc", "os"] {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-clock-jump-{}-{source}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let rules = dir.join("rules.yaml");
        std::fs::write(
            &rules,
            "domain: example\ndescriptors:\n  - key: api_key\n    policies: [\"gcra:rate=3/h,burst=3\", \"fixed-window:limit=5,window=1d\"]\n",
        )
        .unwrap();
        let clock = tollgate_testkit::FrozenClock::new(&dir, 1_767_225_600); // 2026-01-01
        let day = 86_400_000_000;
        clock.set(day);
        let file = dir.join("frozen-time");
        let mut env = vec![
            ("LD_PRELOAD", tollgate_testkit::LIBFAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", file.to_str().unwrap()),
            ("FAKETIME_NO_CACHE", "1"),
            ("DONT_FAKE_MONOTONIC", "1"),
        ];
        if source == "os" {
            env.push(("TOLLGATE_CLOCK", "os"));
        }
        let server = serve_process::start(&["--rules", rules.to_str().unwrap()], &env);
        for _ in 0..3 {
            assert_eq!(check(&server, "spent").await.0, 200, "{source}");
        }
        assert_eq!(check(&server, "spent").await.0, 429, "{source}");
        // Two hours forward (GCRA would have refilled, a day window rolled over if
        // they followed the wall clock): still exhausted.
        clock.set(day + 2 * 3_600_000_000);
        assert_eq!(
            check(&server, "spent").await.0,
            429,
            "{source}: a jump forward released"
        );
        // A day back: a fresh key is admitted; the exhausted one stays exhausted.
        clock.set(0);
        let (status, v) = check(&server, "fresh").await;
        assert_eq!(
            status, 200,
            "{source}: a jump back blocked a fresh key: {v}"
        );
        assert_eq!(v["statuses"][0]["limit_remaining"], 2, "{source}: {v}");
        assert_eq!(check(&server, "spent").await.0, 429, "{source}");
        drop(server);
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Admin endpoints on a listener that is not loopback: refused without a configured
/// token (403), refused with a missing or wrong token (401), allowed with the right
/// one; decisions unaffected. Runs in a private network namespace (`unshare -n`, root)
/// whose loopback device also carries 192.0.2.1 (TEST-NET-1, a documentation address):
/// a non-loopback listener that no traffic from outside the namespace can reach.
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "needs root for a private network namespace: run scripts/test.sh, or cargo test --features external-servers"
)]
#[test]
fn admin_endpoints_on_a_non_loopback_listener_need_a_token() {
    let script = r#"
set -u
ip link set lo up && ip addr add 192.0.2.1/32 dev lo || { echo "NETNS-FAILED"; exit 1; }
reset='{"domain":"example","entries":[{"key":"api_key","value":"k"}]}'
check='{"domain":"example","descriptors":[{"entries":[{"key":"api_key","value":"k"}]}]}'
code() { # path body [token]
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST "http://192.0.2.1:18080$1" \
    -H 'content-type: application/json' ${3:+-H "authorization: Bearer $3"} -d "$2"
}
run() { # label, then env for the server
  label=$1; shift
  env "$@" "$BIN" serve --rules "$RULES" --http 192.0.2.1:18080 --grpc 127.0.0.1:18081 >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -s -o /dev/null --max-time 1 http://192.0.2.1:18080/healthz && break; sleep 0.1; done
  echo "$label check $(code /v1/check "$check")"
  echo "$label reset-none $(code /v1/reset "$reset")"
  echo "$label reset-wrong $(code /v1/reset "$reset" wrong)"
  echo "$label reset-right $(code /v1/reset "$reset" s3cret)"
  echo "$label reload-none $(code /v1/reload '')"
  kill $pid; wait $pid 2>/dev/null
}
run open TOLLGATE_ADMIN_TOKEN=
run guarded TOLLGATE_ADMIN_TOKEN=s3cret
"#;
    let out = std::process::Command::new("unshare")
        .args(["-n", "bash", "-c", script])
        .env("BIN", env!("CARGO_BIN_EXE_tollgate"))
        .env(
            "RULES",
            concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rules/hostile.yaml"),
        )
        .output()
        .expect("unshare (util-linux) runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("NETNS-FAILED"),
        "no private network namespace (root needed): {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected = [
        "open check 200",
        // No token configured on a non-loopback listener: admin is off.
        "open reset-none 403",
        "open reset-wrong 403",
        "open reset-right 403",
        "open reload-none 403",
        "guarded check 200",
        "guarded reset-none 401",
        "guarded reset-wrong 401",
        "guarded reset-right 200",
        "guarded reload-none 401",
    ];
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, expected, "{stdout}");
}
