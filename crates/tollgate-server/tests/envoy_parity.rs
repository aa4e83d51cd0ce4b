//! envoyproxy/ratelimit's documented behaviour, point by point, against `tollgate
//! serve` as a real process, over gRPC (tonic's client from Envoy's protos) and
//! `/json`. Each test is one row of the parity table in docs/envoy.md; the expected
//! answers are what envoyproxy/ratelimit's README, configuration docs and tests say it
//! answers, written here in our own words.

#[path = "support/serve.rs"]
mod serve_process;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Value};
use serve_process::{request, Server};

const OK: i32 = 1;
const OVER: i32 = 2;
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;

/// A server over one rule document (domain `parity` unless the text says otherwise)
/// and a main config, written to a directory of their own.
struct Setup {
    server: Server,
    dir: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(rules: &[&str], config: &str) -> Setup {
    let dir = std::env::temp_dir().join(format!(
        "tollgate-parity-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rules")).unwrap();
    for (i, text) in rules.iter().enumerate() {
        std::fs::write(dir.join(format!("rules/{i}.yaml")), text).unwrap();
    }
    std::fs::write(dir.join("main.yaml"), format!("rules: [rules]\n{config}")).unwrap();
    let server = serve_process::start(&["--config", dir.join("main.yaml").to_str().unwrap()], &[]);
    Setup { server, dir }
}

/// Keeps a test's counting inside one clock-aligned minute: it starts (its server
/// included) with at least 15 s of it left (a test takes well under a second on a
/// quiet machine, seconds while the machine runs other test binaries beside it).
fn inside_one_minute() {
    tollgate_testkit::clear_of_window_end(Duration::from_secs(60), Duration::from_secs(15));
}

fn d(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn with_hits(mut desc: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    desc.hits_addend = Some(UInt64Value { value: hits });
    desc
}

fn with_override(mut desc: RateLimitDescriptor, n: u32, unit: i32) -> RateLimitDescriptor {
    desc.limit = Some(RateLimitOverride {
        requests_per_unit: n,
        unit,
    });
    desc
}

async fn rls(
    server: &Server,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: hits,
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn call(
    server: &Server,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    rls(server, "parity", descriptors, hits).await.unwrap()
}

/// `(code, limit_remaining, requests_per_unit)` of a status.
fn summary(s: &DescriptorStatus) -> (i32, u32, Option<u32>) {
    (
        s.code,
        s.limit_remaining,
        s.current_limit.as_ref().map(|l| l.requests_per_unit),
    )
}

async fn json_call(server: &Server, body: &str) -> (u16, http::HeaderMap, Value) {
    request(server, "POST", "/json", body, None).await
}

async fn get_text(server: &Server, path: &str) -> String {
    match request(server, "GET", path, "", None).await {
        (200, _, Value::String(s)) => s,
        other => panic!("GET {path}: {other:?}"),
    }
}

const THREE_A_MINUTE: &str = "domain: parity
descriptors:
  - key: k
    rate_limit: {name: three, unit: minute, requests_per_unit: 3}
";

#[tokio::test]
async fn request_hits_addend_zero_or_unset_counts_one() {
    inside_one_minute();
    let s = serve(&[THREE_A_MINUTE], "");
    let r = call(&s.server, vec![d(&[("k", "a")])], 0).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 2, Some(3)));
    let (status, _, v) = json_call(
        &s.server,
        r#"{"domain":"parity","descriptors":[{"entries":[{"key":"k","value":"a"}]}]}"#,
    )
    .await;
    assert_eq!(
        (status, &v["statuses"][0]["limitRemaining"]),
        (200, &json!(1))
    );
    let r = call(&s.server, vec![d(&[("k", "a")])], 2).await;
    assert_eq!(r.overall_code, OVER, "2 hits with 1 left");
}

#[tokio::test]
async fn descriptor_hits_addend_overrides_the_request_and_zero_looks_without_counting() {
    inside_one_minute();
    let s = serve(&[THREE_A_MINUTE], "");
    let r = call(&s.server, vec![with_hits(d(&[("k", "a")]), 2)], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 1, Some(3)));
    for _ in 0..2 {
        let r = call(&s.server, vec![with_hits(d(&[("k", "a")]), 0)], 5).await;
        assert_eq!(
            summary(&r.statuses[0]),
            (OK, 1, Some(3)),
            "a look counts nothing"
        );
    }
    let r = call(&s.server, vec![with_hits(d(&[("k", "fresh")]), 0)], 1).await;
    assert_eq!(
        summary(&r.statuses[0]),
        (OK, 3, Some(3)),
        "a fresh key: all 3 left"
    );
    // Spent exactly: a look reads OK with none left (count == limit is not over).
    call(&s.server, vec![d(&[("k", "a")])], 1).await;
    let r = call(&s.server, vec![with_hits(d(&[("k", "a")]), 0)], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 0, Some(3)));
    // The request over the limit is counted (INCRBY before the comparison), so the
    // key is over its limit now and a look reads OVER_LIMIT.
    let r = call(&s.server, vec![d(&[("k", "a")])], 1).await;
    assert_eq!(r.overall_code, OVER);
    let r = call(&s.server, vec![with_hits(d(&[("k", "a")]), 0)], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OVER, 0, Some(3)));
}

const TOKENS: &str = "domain: parity
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 10000}
";

/// The two-call token pattern of AI gateways (Envoy's `apply_on_stream_done`):
/// before the request a look (hits 0) or one hit asks whether any budget is left;
/// when the stream ends, a second call reports the tokens used as its hits. An
/// overspend is counted, so the caller is blocked until the window pays it back.
#[tokio::test]
async fn the_two_call_token_pattern_counts_usage_reported_after_the_stream() {
    inside_one_minute();
    let s = serve(&[TOKENS], "");
    let key = || d(&[("api_key", "alice")]);
    // gRPC: pre-check with hits 0, then a 12,000-token completion reported after.
    let pre = call(&s.server, vec![with_hits(key(), 0)], 1).await;
    assert_eq!(summary(&pre.statuses[0]), (OK, 10000, Some(10000)));
    let used = call(&s.server, vec![with_hits(key(), 12000)], 1).await;
    assert_eq!(used.overall_code, OVER, "12,000 of 10,000");
    // The next pre-check, over gRPC and over /json, finds the key over its limit.
    let pre = call(&s.server, vec![with_hits(key(), 0)], 1).await;
    assert_eq!(summary(&pre.statuses[0]), (OVER, 0, Some(10000)));
    let body = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"api_key","value":"alice"}],"hitsAddend":"0"}]}"#;
    let (status, _, v) = json_call(&s.server, body).await;
    assert_eq!(
        (status, &v["overallCode"]),
        (429, &json!("OVER_LIMIT")),
        "{v}"
    );
    // /json: the same pattern for another key, with a pre-check of one hit.
    let pre = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"api_key","value":"bob"}]}],"hitsAddend":1}"#;
    let (status, _, v) = json_call(&s.server, pre).await;
    assert_eq!(
        (status, &v["statuses"][0]["limitRemaining"]),
        (200, &json!(9999))
    );
    let used = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"api_key","value":"bob"}],"hitsAddend":"9999"}]}"#;
    let (status, _, v) = json_call(&s.server, used).await;
    assert_eq!(
        (status, &v["overallCode"]),
        (200, &json!("OK")),
        "exactly spent: {v}"
    );
    let (status, _, v) = json_call(&s.server, pre).await;
    assert_eq!((status, &v["overallCode"]), (429, &json!("OVER_LIMIT")));
    // That rejected hit counted too: bob is over now, and a look says so.
    let look = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"api_key","value":"bob"}],"hitsAddend":"0"}]}"#;
    let (_, _, v) = json_call(&s.server, look).await;
    assert_eq!(v["statuses"][0]["code"], json!("OVER_LIMIT"), "{v}");
}

/// `rejected_hits: not_counted` (per descriptor, or for the whole service) keeps
/// tollgate's all-or-nothing: a rejected request takes nothing.
#[tokio::test]
async fn rejected_hits_can_be_left_uncounted_per_descriptor_or_for_the_service() {
    inside_one_minute();
    for (rules, config) in [
        (
            "domain: parity\ndescriptors:\n  - key: k\n    rejected_hits: not_counted\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
            "",
        ),
        (THREE_A_MINUTE, "service: {rejected_hits: not_counted}\n"),
    ] {
        let s = serve(&[rules], config);
        let r = call(&s.server, vec![d(&[("k", "a")])], 3).await;
        assert_eq!(r.overall_code, OK);
        let r = call(&s.server, vec![d(&[("k", "a")])], 1).await;
        assert_eq!(r.overall_code, OVER);
        let r = call(&s.server, vec![with_hits(d(&[("k", "a")]), 0)], 1).await;
        assert_eq!(summary(&r.statuses[0]), (OK, 0, Some(3)), "{config}");
    }
}

/// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: when one
/// descriptor of a request goes over, only the descriptors over their limit count
/// the hits; by default every descriptor counts them.
#[tokio::test]
async fn stop_increment_when_over_limit_spares_the_other_descriptors() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 10}
";
    for (config, big_left) in [
        ("", 8),
        ("service: {stop_increment_when_over_limit: true}\n", 9),
    ] {
        let s = serve(&[rules], config);
        let both = || vec![d(&[("small", "x")]), d(&[("big", "x")])];
        assert_eq!(call(&s.server, both(), 1).await.overall_code, OK);
        let r = call(&s.server, both(), 1).await;
        assert_eq!(r.overall_code, OVER);
        let look = call(&s.server, vec![with_hits(d(&[("big", "x")]), 0)], 1).await;
        assert_eq!(
            summary(&look.statuses[0]),
            (OK, big_left, Some(10)),
            "{config:?}"
        );
        let look = call(&s.server, vec![with_hits(d(&[("small", "x")]), 0)], 1).await;
        assert_eq!(
            look.statuses[0].code, OVER,
            "the over-limit hit counted: {config:?}"
        );
    }
}

#[tokio::test]
async fn a_limit_override_applies_in_a_known_domain_even_to_an_unmatched_descriptor() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: k
    shadow_mode: true
    rate_limit: {name: wide, unit: minute, requests_per_unit: 100}
";
    let s = serve(&[rules], "");
    // The override replaces the configured limit, and brings no shadow mode or name.
    let over = |desc| with_override(desc, 2, MINUTE);
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = call(&s.server, vec![over(d(&[("k", "a")]))], 1).await;
        let limit = r.statuses[0].current_limit.clone().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("", 2, MINUTE)
        );
        codes.push(r.statuses[0].code);
    }
    assert_eq!(codes, [OK, OK, OVER]);
    // A descriptor no rule matches is limited by its override, per descriptor.
    let r = call(&s.server, vec![over(d(&[("nothing", "x")]))], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 1, Some(2)));
    // In an unknown domain the override does nothing.
    let r = rls(&s.server, "elsewhere", vec![over(d(&[("k", "a")]))], 1)
        .await
        .unwrap();
    assert_eq!(summary(&r.statuses[0]), (OK, 0, None));
}

#[tokio::test]
async fn a_replaced_limit_is_skipped_and_answers_ok_without_a_limit() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: route
    rate_limit: {name: general, unit: minute, requests_per_unit: 1}
  - key: vip
    rate_limit: {unit: minute, requests_per_unit: 10, replaces: [{name: general}]}
";
    let s = serve(&[rules], "");
    for _ in 0..3 {
        let r = call(&s.server, vec![d(&[("route", "r")]), d(&[("vip", "v")])], 1).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(summary(&r.statuses[0]), (OK, 0, None), "replaced: skipped");
        assert_eq!(r.statuses[0].duration_until_reset, None);
    }
    // Alone, the replaced limit applies again (and was not counted meanwhile).
    let r = call(&s.server, vec![d(&[("route", "r")])], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 0, Some(1)));
    let r = call(&s.server, vec![d(&[("route", "r")])], 1).await;
    assert_eq!(r.overall_code, OVER);
}

#[tokio::test]
async fn shadow_mode_per_rule_and_global_answer_ok_and_are_counted() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: enforced
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    // Per rule: the rule's status is OK, with nothing remaining.
    let s = serve(&[rules], "");
    call(&s.server, vec![d(&[("shadowed", "a")])], 1).await;
    let r = call(&s.server, vec![d(&[("shadowed", "a")])], 1).await;
    assert_eq!(
        (r.overall_code, summary(&r.statuses[0])),
        (OK, (OK, 0, Some(1)))
    );
    let metrics = get_text(&s.server, "/metrics").await;
    assert!(
        metrics.contains(r#"tollgate_rate_limit_hits_total{domain="parity",rule="parity/shadowed",stat="shadow_mode"} 1"#),
        "{metrics}"
    );
    drop(s);
    // Global: the overall code is OK, the descriptor still says OVER_LIMIT.
    let s = serve(&[rules], "service: {shadow_mode: true}\n");
    call(&s.server, vec![d(&[("enforced", "a")])], 1).await;
    let r = call(&s.server, vec![d(&[("enforced", "a")])], 1).await;
    assert_eq!((r.overall_code, r.statuses[0].code), (OK, OVER));
    let (status, _, v) = json_call(
        &s.server,
        r#"{"domain":"parity","descriptors":[{"entries":[{"key":"enforced","value":"a"}]}]}"#,
    )
    .await;
    assert_eq!((status, &v["overallCode"]), (200, &json!("OK")));
    let metrics = get_text(&s.server, "/metrics").await;
    assert!(
        metrics.contains("tollgate_global_shadow_mode_total 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn wildcards_match_anywhere_and_share_threshold_shares_one_counter() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: path
    value: /users/*/orders
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: file
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: file
    value: docs/*
    rate_limit: {unit: minute, requests_per_unit: 1}
";
    let s = serve(&[rules], "");
    // A * in the middle: each value its own counter.
    for user in ["1", "2"] {
        let p = format!("/users/{user}/orders");
        let r = call(&s.server, vec![d(&[("path", &p)])], 1).await;
        assert_eq!(summary(&r.statuses[0]), (OK, 0, Some(1)), "{p}");
    }
    let r = call(&s.server, vec![d(&[("path", "/users/1/profile")])], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 0, None), "no match");
    // share_threshold: files/a and files/b count on one counter of 2.
    let mut codes = Vec::new();
    for f in ["files/a", "files/b", "files/c"] {
        codes.push(
            call(&s.server, vec![d(&[("file", f)])], 1)
                .await
                .overall_code,
        );
    }
    assert_eq!(codes, [OK, OK, OVER]);
    // Without it, docs/a and docs/b have a counter each.
    for f in ["docs/a", "docs/b"] {
        assert_eq!(
            call(&s.server, vec![d(&[("file", f)])], 1)
                .await
                .overall_code,
            OK
        );
    }
}

#[tokio::test]
async fn an_empty_value_matches_the_rule_without_a_value() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: user
    value: admin
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let s = serve(&[rules], "");
    let r = call(&s.server, vec![d(&[("user", "")])], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 1, Some(2)));
}

#[tokio::test]
async fn nested_descriptors_match_only_at_the_depth_the_request_reaches() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
";
    let s = serve(&[rules], "");
    let per = |r: &RateLimitResponse| summary(&r.statuses[0]).2;
    let r = call(&s.server, vec![d(&[("tenant", "t")])], 1).await;
    assert_eq!(per(&r), Some(10), "one entry: the parent's limit");
    let r = call(&s.server, vec![d(&[("tenant", "t"), ("user", "u")])], 1).await;
    assert_eq!(per(&r), Some(2), "two entries: the child's");
    let r = call(
        &s.server,
        vec![d(&[("tenant", "t"), ("user", "u"), ("extra", "x")])],
        1,
    )
    .await;
    assert_eq!(
        summary(&r.statuses[0]),
        (OK, 0, None),
        "deeper than the rules: none"
    );
    let r = call(&s.server, vec![d(&[("user", "u")])], 1).await;
    assert_eq!(
        summary(&r.statuses[0]),
        (OK, 0, None),
        "the child alone: none"
    );
}

#[tokio::test]
async fn unknown_domains_and_unmatched_descriptors_are_ok_without_a_limit() {
    let s = serve(&[THREE_A_MINUTE], "");
    let r = rls(&s.server, "nowhere", vec![d(&[("k", "a")])], 1)
        .await
        .unwrap();
    assert_eq!(
        (r.overall_code, summary(&r.statuses[0])),
        (OK, (OK, 0, None))
    );
    let r = call(&s.server, vec![d(&[("other", "a")])], 1).await;
    assert_eq!(
        (r.overall_code, summary(&r.statuses[0])),
        (OK, (OK, 0, None))
    );
    assert_eq!(r.statuses[0].duration_until_reset, None);
}

#[tokio::test]
async fn an_empty_domain_or_descriptor_list_is_an_error_and_an_entryless_descriptor_matches_nothing(
) {
    let s = serve(&[THREE_A_MINUTE], "");
    let e = rls(&s.server, "", vec![d(&[("k", "a")])], 1)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("domain"), "{e:?}");
    let e = rls(&s.server, "parity", vec![], 1).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("descriptors"), "{e:?}");
    let (status, _, v) = json_call(
        &s.server,
        r#"{"domain":"","descriptors":[{"entries":[{"key":"k"}]}]}"#,
    )
    .await;
    assert_eq!(status, 400, "{v}");
    let (status, _, v) = json_call(&s.server, r#"{"domain":"parity","descriptors":[]}"#).await;
    assert_eq!(status, 400, "{v}");
    let r = call(&s.server, vec![d(&[])], 1).await;
    assert_eq!(
        (r.overall_code, summary(&r.statuses[0])),
        (OK, (OK, 0, None))
    );
}

#[tokio::test]
async fn duration_until_reset_is_the_time_to_the_end_of_the_units_window() {
    let rules = "domain: parity
descriptors:
  - key: s
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: m
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: g
    policies: ['gcra:rate=10/s,burst=5']
";
    let s = serve(&[rules], "");
    let reset = |r: &RateLimitResponse| r.statuses[0].duration_until_reset.unwrap();
    let r = call(&s.server, vec![d(&[("s", "a")])], 1).await;
    assert_eq!(
        (reset(&r).seconds, reset(&r).nanos),
        (1, 0),
        "whole seconds, as Envoy"
    );
    let now = (tollgate::clock::Clock::now_us(&tollgate::clock::MonotonicClock::new()) / 1_000_000)
        as i64;
    let r = call(&s.server, vec![d(&[("m", "a")])], 1).await;
    let expected = 60 - now % 60;
    assert!(
        (reset(&r).seconds - expected).abs() <= 1 && reset(&r).nanos == 0,
        "{:?} vs {expected}s",
        reset(&r)
    );
    // tollgate's policies: to the microsecond (1 of 5 used refills in 100ms).
    let r = call(&s.server, vec![d(&[("g", "a")])], 1).await;
    assert_eq!((reset(&r).seconds, reset(&r).nanos), (0, 100_000_000));
}

/// A rule set's reset is its binding policy's: on OVER_LIMIT when this request would
/// pass (not when the hour's window beside it ends), on OK when the policy nearest its
/// limit is replenished; over gRPC and `/json` alike.
#[tokio::test]
async fn a_rule_sets_reset_is_the_binding_policys() {
    let rules = "domain: parity
descriptors:
  - key: both
    policies: ['gcra:rate=1/s,burst=2', 'fixed-window:limit=1000,window=1h']
";
    let s = serve(&[rules], "");
    let reset_us = |r: &RateLimitResponse| {
        let d = r.statuses[0].duration_until_reset.unwrap();
        d.seconds as u64 * 1_000_000 + d.nanos as u64 / 1000
    };
    // OK: the GCRA binds (1, then 0 left against the hour's 999, 998).
    let r = call(&s.server, vec![d(&[("both", "a")])], 1).await;
    assert_eq!(r.overall_code, OK);
    assert!(reset_us(&r) <= 1_000_000, "{r:?}");
    let r = call(&s.server, vec![d(&[("both", "a")])], 1).await;
    assert!(
        reset_us(&r) > 1_000_000 && reset_us(&r) <= 2_000_000,
        "{r:?}"
    );
    // OVER_LIMIT: the third within a second passes within a second.
    let r = call(&s.server, vec![d(&[("both", "a")])], 1).await;
    assert_eq!(r.overall_code, OVER);
    assert!(reset_us(&r) > 0 && reset_us(&r) <= 1_000_000, "{r:?}");
    let body = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"both","value":"a"}]}]}"#;
    let (status, _, v) = json_call(&s.server, body).await;
    assert_eq!(status, 429, "{v}");
    let text = v["statuses"][0]["durationUntilReset"].as_str().unwrap();
    let seconds: f64 = text.trim_end_matches('s').parse().unwrap();
    assert!(seconds > 0.0 && seconds <= 1.0, "{v}");
}

#[tokio::test]
async fn current_limit_names_the_rule_its_unit_and_requests_per_unit() {
    let rules = "domain: parity
descriptors:
  - key: named
    rate_limit: {name: per_user, unit: second, requests_per_unit: 7}
  - key: policy
    policies: ['gcra:rate=10/s,burst=4']
  - key: hour
    policies: ['fixed-window:limit=1000,window=1h']
  - key: slow
    policies: ['sliding-window:limit=5,window=10s']
  - key: both
    policies: ['gcra:rate=1/s,burst=2', 'fixed-window:limit=1000,window=1h']
";
    let s = serve(&[rules], "");
    let keys = ["named", "policy", "hour", "slow", "both"];
    let r = call(&s.server, keys.map(|k| d(&[(k, "a")])).to_vec(), 1).await;
    let limits: Vec<_> = (r.statuses.iter())
        .map(|s| s.current_limit.clone().unwrap())
        .map(|l| (l.name, l.requests_per_unit, l.unit))
        .collect();
    // A policy states its binding policy's rate in the unit that describes it (never
    // UNKNOWN): its window's own unit, else the shortest in which the rate is whole.
    let named = |n: &str| n.to_string();
    assert_eq!(
        limits,
        [
            (named("per_user"), 7, SECOND),
            (named(""), 10, SECOND), // a burst of 4 refilled at 10/s
            (named(""), 1000, HOUR), // the window is an hour
            (named(""), 30, MINUTE), // 5 per 10 s
            (named(""), 1, SECOND),  // the GCRA binds: 2 per 2 s
        ]
    );
    // The same over /json.
    let body = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"both","value":"a"}]}]}"#;
    let (_, _, v) = json_call(&s.server, body).await;
    assert_eq!(
        v["statuses"][0]["currentLimit"],
        json!({"requestsPerUnit": 1, "unit": "SECOND"}),
        "{v}"
    );
}

#[tokio::test]
async fn json_answers_in_proto3_json_with_envoys_status_codes() {
    inside_one_minute();
    // envoyproxy/ratelimit adds no headers unless asked: the same here, for the
    // exact shape.
    let s = serve(&[THREE_A_MINUTE], "service: {headers: {style: none}}\n");
    let body = r#"{"domain":"parity","descriptors":[{"entries":[{"key":"k","value":"a"}],"hitsAddend":"2"},{"entries":[{"key":"none"}]}]}"#;
    let (status, headers, v) = json_call(&s.server, body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "application/json");
    let reset = v["statuses"][0]["durationUntilReset"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(reset.ends_with('s') && !reset.contains('.'), "{reset}");
    assert_eq!(
        v,
        json!({"overallCode": "OK", "statuses": [
            {"code": "OK", "currentLimit": {"name": "three", "requestsPerUnit": 3, "unit": "MINUTE"},
             "limitRemaining": 1, "durationUntilReset": reset},
            {"code": "OK"}
        ]})
    );
    // Over the limit: 429, and no limitRemaining (0 is left out, as protojson does).
    let (status, _, v) = json_call(&s.server, body).await;
    assert_eq!(status, 429);
    assert_eq!(v["overallCode"], "OVER_LIMIT");
    assert_eq!(v["statuses"][0].get("limitRemaining"), None, "{v}");
    // A limit override in JSON (enum by name), as Envoy's /json takes it.
    let (status, _, v) = json_call(
        &s.server,
        r#"{"domain":"parity","descriptors":[{"entries":[{"key":"k","value":"o"}],"limit":{"requestsPerUnit":9,"unit":"SECOND"}}]}"#,
    )
    .await;
    assert_eq!(
        (status, &v["statuses"][0]["currentLimit"]),
        (200, &json!({"requestsPerUnit": 9, "unit": "SECOND"}))
    );
    // A body that is not a RateLimitRequest: 400 naming the problem.
    for bad in [
        "{",
        r#"{"domain":"parity","colour":1}"#,
        r#"{"domain":"parity","hitsAddend":-1}"#,
    ] {
        let (status, _, v) = json_call(&s.server, bad).await;
        assert_eq!(status, 400, "{bad}: {v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
}

#[tokio::test]
async fn quota_mode_fails_the_request_only_when_every_quota_descriptor_is_over() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let s = serve(&[rules], "");
    let both = || vec![d(&[("q1", "a")]), d(&[("q2", "a")])];
    assert_eq!(call(&s.server, both(), 1).await.overall_code, OK);
    let r = call(&s.server, both(), 1).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code, r.statuses[1].code),
        (OK, OVER, OK)
    );
    let r = call(&s.server, both(), 1).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].code, r.statuses[1].code),
        (OVER, OVER, OVER)
    );
}

#[tokio::test]
async fn draft03_headers_as_envoy_adds_them_beside_the_ietf_ones() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: narrow
    rate_limit: {unit: minute, requests_per_unit: 3}
";
    let pairs = |r: &RateLimitResponse| {
        r.response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect::<Vec<_>>()
    };
    let s = serve(
        &[rules],
        "service:\n  headers: {style: draft03, reset: X-Reset-In}\n",
    );
    let r = call(
        &s.server,
        vec![d(&[("wide", "a")]), d(&[("narrow", "a")])],
        1,
    )
    .await;
    let reset = r.statuses[1]
        .duration_until_reset
        .unwrap()
        .seconds
        .to_string();
    // The descriptor with the fewest remaining: narrow, 2 of 3.
    assert_eq!(
        pairs(&r),
        [
            ("RateLimit-Limit".to_string(), "3".to_string()),
            ("RateLimit-Remaining".into(), "2".into()),
            ("X-Reset-In".into(), reset.clone())
        ]
    );
    for _ in 0..2 {
        call(&s.server, vec![d(&[("narrow", "a")])], 1).await;
    }
    let r = call(
        &s.server,
        vec![d(&[("narrow", "a")]), d(&[("wide", "a")])],
        1,
    )
    .await;
    assert_eq!(r.overall_code, OVER);
    assert_eq!(
        pairs(&r)[..2],
        [
            ("RateLimit-Limit".to_string(), "3".to_string()),
            ("RateLimit-Remaining".into(), "0".into())
        ]
    );
    // The HTTP API carries the same, with Retry-After on a reject.
    let (status, headers, _) = request(
        &s.server,
        "POST",
        "/v1/check",
        r#"{"domain":"parity","descriptors":[{"entries":[{"key":"narrow","value":"a"}]}]}"#,
        None,
    )
    .await;
    assert_eq!(
        (
            status,
            &headers["ratelimit-limit"],
            &headers["ratelimit-remaining"]
        ),
        (429, &"3".parse().unwrap(), &"0".parse().unwrap())
    );
    assert!(headers.contains_key("retry-after") && !headers.contains_key("ratelimit-policy"));
    drop(s);
    // none: no headers at all (envoyproxy/ratelimit's default); ietf: tollgate's.
    let s = serve(&[rules], "service:\n  headers: {style: none}\n");
    assert!(pairs(&call(&s.server, vec![d(&[("wide", "a")])], 1).await).is_empty());
    drop(s);
    let s = serve(&[rules], "");
    let keys: Vec<String> = pairs(&call(&s.server, vec![d(&[("wide", "a")])], 1).await)
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(keys, ["ratelimit-policy", "ratelimit"]);
}

#[tokio::test]
async fn per_descriptor_statistics_count_hits_as_envoy_does() {
    inside_one_minute();
    let rules = "domain: parity
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
";
    let s = serve(&[rules], "service: {near_limit_ratio: 0.6}\n");
    // 2 + 2 admitted (threshold floor(5 x 0.6) = 3: the 4th hit is near), 1 more near,
    // then 3 over.
    for hits in [2, 2, 1, 3] {
        call(&s.server, vec![with_hits(d(&[("k", "a")]), hits)], 1).await;
    }
    call(&s.server, vec![d(&[("detailed", "v1")])], 1).await;
    let metrics = get_text(&s.server, "/metrics").await;
    for (stat, n) in [
        ("total_hits", 8),
        ("within_limit", 5),
        ("near_limit", 2),
        ("over_limit", 3),
        ("shadow_mode", 0),
    ] {
        let line = format!(
            r#"tollgate_rate_limit_hits_total{{domain="parity",rule="parity/k",stat="{stat}"}} {n}"#
        );
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
    assert!(
        metrics.contains(r#"tollgate_rate_limit_hits_total{domain="parity",rule="parity/detailed=v1",stat="total_hits"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn negative_hits_give_back_what_was_taken() {
    inside_one_minute();
    let s = serve(&[THREE_A_MINUTE], "");
    call(&s.server, vec![with_hits(d(&[("k", "a")]), 3)], 1).await;
    let mut back = with_hits(d(&[("k", "a")]), 2);
    back.is_negative_hits = true;
    let r = call(&s.server, vec![back.clone()], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 2, Some(3)), "2 given back");
    // Never past the whole budget.
    call(&s.server, vec![back], 1).await;
    let r = call(&s.server, vec![with_hits(d(&[("k", "a")]), 0)], 1).await;
    assert_eq!(summary(&r.statuses[0]), (OK, 3, Some(3)));
}

#[tokio::test]
async fn the_config_dump_lists_every_limit_as_envoy_prints_it() {
    let rules = "domain: parity
descriptors:
  - key: k
    value: v
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: inner
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 9}
  - key: p
    policies: ['gcra:rate=1/s,burst=2']
";
    let s = serve(&[rules], "");
    let dump = get_text(&s.server, "/rlconfig").await;
    assert_eq!(
        dump,
        "parity.k_v: unit=MINUTE requests_per_unit=3, shadow_mode: true, quota_mode: false\n\
         parity.k_v.inner: unit=HOUR requests_per_unit=9, shadow_mode: false, quota_mode: true\n\
         parity.p: policies=[gcra:rate=1/s,burst=2], shadow_mode: false, quota_mode: false\n"
    );
}

#[tokio::test]
async fn documents_of_one_domain_merge_with_merge_domains() {
    let one = "domain: parity\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let two = "domain: parity\ndescriptors:\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";
    let s = serve(&[one, two], "service: {merge_domains: true}\n");
    let r = call(&s.server, vec![d(&[("a", "x")]), d(&[("b", "x")])], 1).await;
    assert_eq!(
        (summary(&r.statuses[0]).2, summary(&r.statuses[1]).2),
        (Some(1), Some(2))
    );
    drop(s);
    // Without it, the second document is refused at start.
    let dir = std::env::temp_dir().join(format!("tollgate-parity-refused-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("1.yaml"), one).unwrap();
    std::fs::write(dir.join("2.yaml"), two).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--rules", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("already defined"),
        "{err}"
    );
}

#[tokio::test]
async fn envoys_environment_settings_run_unchanged_with_envoy_env() {
    inside_one_minute();
    let dir = std::env::temp_dir().join(format!("tollgate-parity-env-{}", std::process::id()));
    let rules = dir.join("srv/ratelimit/config");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("parity.yaml"), THREE_A_MINUTE).unwrap();
    let root = dir.join("srv");
    let server = serve_process::start(
        &["--envoy-env"],
        &[
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("SHADOW_MODE", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("USE_STATSD", "false"),
            ("LOG_FORMAT", "json"),
        ],
    );
    let r = call(&server, vec![with_hits(d(&[("k", "a")]), 4)], 1).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (r.overall_code, r.statuses[0].code),
        (OK, OVER),
        "SHADOW_MODE"
    );
    let keys: Vec<&str> = r
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
    );
}

/// What operators read besides the decisions: every call by API, method and code
/// (gRPC status names as gRPC's libraries give them), its time, each rule's limit,
/// the build.
#[tokio::test]
async fn calls_are_counted_by_api_method_and_code_and_rules_show_their_limits() {
    let s = serve(&[THREE_A_MINUTE], "");
    for _ in 0..4 {
        call(&s.server, vec![d(&[("k", "a")])], 1).await;
    }
    let refused = rls(&s.server, "", vec![d(&[("k", "a")])], 1).await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    let (status, _, _) = json_call(
        &s.server,
        r#"{"domain":"parity","descriptors":[{"entries":[{"key":"k","value":"a"}]}]}"#,
    )
    .await;
    assert_eq!(status, 429);
    let metrics = get_text(&s.server, "/metrics").await;
    for line in [
        // Over the limit is still an answered call: OK.
        r#"tollgate_requests_total{api="grpc",method="ShouldRateLimit",code="OK"} 4"#,
        r#"tollgate_requests_total{api="grpc",method="ShouldRateLimit",code="InvalidArgument"} 1"#,
        r#"tollgate_request_duration_seconds_count{api="grpc",method="ShouldRateLimit"} 5"#,
        r#"tollgate_requests_total{api="http",method="/json",code="429"} 1"#,
        r#"tollgate_rule_limit{domain="parity",rule="parity/k",policy="fixed-window:limit=3,window=1m,debt=forgive"} 3"#,
        r#"tollgate_rule_window_seconds{domain="parity",rule="parity/k",policy="fixed-window:limit=3,window=1m,debt=forgive"} 60.0"#,
        "process_resident_memory_bytes ",
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    // The build: the commit the binary names in --version (its own build script
    // reads it; the runtime is told at start).
    let version = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).into_owned();
    let commit = (version.split("(commit ").nth(1))
        .and_then(|c| c.split(')').next())
        .unwrap_or_else(|| panic!("{version}"));
    let build = format!(
        r#"tollgate_build_info{{version="{}",commit="{commit}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(metrics.contains(&build), "{build} in {metrics}");
}

/// `service.envoy_metrics`: envoyproxy/ratelimit's metric names beside tollgate's,
/// through its built-in mappings (one key level by glob, two or more by regex, the
/// server's calls and their times, failed calls, loads), and through a mapping file
/// of the user's (here Envoy Gateway's way: the response time unscaled, so in ms).
#[tokio::test]
async fn envoyproxy_ratelimit_metric_names_come_through_its_statsd_mapping() {
    let rules = "domain: parity
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 100}
";
    let s = serve(&[rules], "service: {envoy_metrics: true}\n");
    for _ in 0..4 {
        call(&s.server, vec![d(&[("k", "1")])], 1).await;
    }
    call(&s.server, vec![d(&[("a", "x"), ("b", "y")])], 2).await;
    let refused = rls(&s.server, "", vec![d(&[("k", "1")])], 1).await;
    assert_eq!(refused.unwrap_err().code(), tonic::Code::InvalidArgument);
    // A gRPC health check (its messages read as empty: only the call matters here).
    let channel = tonic::transport::Endpoint::from_shared(s.server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/Check");
    let codec = tonic_prost::ProstCodec::<(), ()>::default();
    grpc.unary(tonic::Request::new(()), path, codec)
        .await
        .unwrap();
    let metrics = get_text(&s.server, "/metrics").await;
    for line in [
        r#"ratelimit_service_total_requests{grpc_method="Check"} 1"#,
        r#"ratelimit_service_response_time_seconds_count{grpc_method="Check"} 1"#,
        "# TYPE ratelimit_service_rate_limit_total_hits unknown",
        r#"ratelimit_service_rate_limit_total_hits{domain="parity",key1="k"} 4"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="parity",key1="k"} 3"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="parity",key1="k"} 1"#,
        r#"ratelimit_service_rate_limit_near_limit{domain="parity",key1="k"} 1"#,
        r#"ratelimit_service_rate_limit_total_hits{domain="parity",key1="a_x",key2="b"} 2"#,
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 6"#,
        r#"ratelimit_service_should_rate_limit_error{err_type="service_error"} 1"#,
        "ratelimit_service_config_load_success 1",
        "# TYPE ratelimit_service_response_time_seconds histogram",
        r#"ratelimit_service_response_time_seconds_bucket{grpc_method="ShouldRateLimit",le="+Inf"} 6"#,
        r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 6"#,
        // tollgate's own are still there, and the end marker is last.
        r#"tollgate_requests_total{api="grpc",method="ShouldRateLimit",code="OK"} 5"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
    // The buckets are cumulative and end at the count (the times themselves depend
    // on the machine's load).
    let bucket = |le: &str| -> u64 {
        let series = format!(
            "ratelimit_service_response_time_seconds_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{le}\"}} "
        );
        (metrics.lines())
            .find_map(|l| l.strip_prefix(series.as_str())?.parse().ok())
            .unwrap_or_else(|| panic!("{series} in {metrics}"))
    };
    let les = ["0.005", "0.01", "0.1", "1.0", "10.0", "+Inf"];
    let counts: Vec<u64> = les.iter().map(|le| bucket(le)).collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert_eq!(counts.last(), Some(&6));
    // One family per name: a gRPC health check times into the same histogram.
    assert_eq!(
        metrics
            .matches("# TYPE ratelimit_service_response_time_seconds histogram")
            .count(),
        1
    );
    drop(s);

    // A mapping file of the user's: the time in ms, the hits under a name of its own.
    let dir = std::env::temp_dir().join(format!("tollgate-parity-mapping-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mapping = dir.join("conf.yaml");
    std::fs::write(
        &mapping,
        r#"mappings:
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels: {grpc_method: "$1"}
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "hits"
    labels: {domain: "$1", rule: "$2"}
"#,
    )
    .unwrap();
    let s = serve(
        &[rules],
        &format!(
            "service: {{envoy_metrics_mapping: {}}}\n",
            mapping.display()
        ),
    );
    call(&s.server, vec![d(&[("k", "1")])], 1).await;
    let metrics = get_text(&s.server, "/metrics").await;
    for line in [
        r#"hits{domain="parity",rule="k"} 1"#,
        // Unmapped: its own name, escaped, no labels.
        "ratelimit_service_rate_limit_parity_k_within_limit 1",
        r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    drop(s);
    // A mapping file that does not parse stops the start, naming the file and the entry.
    std::fs::write(&mapping, "mappings: [{match: 'a.b*', name: x}]\n").unwrap();
    std::fs::write(
        dir.join("main.yaml"),
        format!(
            "service: {{envoy_metrics_mapping: {}}}\n",
            mapping.display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("main.yaml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("service.envoy_metrics_mapping")
            && err.contains("mappings[0] (match \"a.b*\"): not a glob"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
