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
