//! Wire compatibility checked by clients no one here wrote: Python's grpcio, with the
//! stubs `xds-protos` generates from Envoy's published protos, calls
//! `ShouldRateLimit`, and protobuf's own proto3 JSON writer and reader talk to `/json`
//! (tests/python/envoy_clients.py); Python's http.client, httpx and the `openai`
//! package go through `tollgate proxy` to an upstream on Python's http.server
//! (tests/python/proxy_clients.py). `scripts/test.sh` installs `grpcio`,
//! `xds-protos`, `httpx` and `openai` from the Python package index.

#[path = "support/python.rs"]
mod python;
#[path = "support/serve.rs"]
mod serve_process;

use python::run_python;

/// Starts `serve` on a rule file of `rules` and runs `tests/python/SCRIPT` with its
/// gRPC address (and its HTTP base when `with_http`).
fn python_checks(name: &str, rules: &str, script: &str, with_http: bool) {
    let dir = std::env::temp_dir().join(format!("tollgate-foreign-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rules.yaml");
    std::fs::write(&path, rules).unwrap();
    let server = serve_process::start(&["--rules", path.to_str().unwrap()], &[]);
    let mut args = vec![server.grpc.trim_start_matches("http://").to_string()];
    if with_http {
        args.push(server.base.clone());
    }
    run_python(script, &args);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tollgate proxy` before an OpenAI-shaped upstream on Python's http.server:
/// http.client connections kept across 429s on a `cost:` route never meet a close
/// the answer did not announce (an unread body, a 404, HTTP/1.0), httpx's pool sees
/// no transport error, and the `openai` package's completions (plain and streamed)
/// are charged their usage until the key's budget refuses one; 20 openai clients of
/// one key at once (half streaming without asking for usage) are held to the budget
/// by what each declared, the rest refused with `RateLimitError`, and a stream goes
/// through byte for byte.
#[test]
fn python_http_clients_and_openai_go_through_the_proxy() {
    run_python(
        "proxy_clients.py",
        &[env!("CARGO_BIN_EXE_tollgate").to_string()],
    );
}

/// docs/llm.md's recipe run as written (tests/python/llm_recipe.py): its route in
/// front of an OpenAI-compatible upstream, the `openai` package as the client:
/// requests per minute and tokens per minute per API key, streams that do not ask
/// for their usage charged it, and each refusal a `RateLimitError` naming its limit.
#[test]
fn python_openai_clients_meet_the_llm_recipe_as_written() {
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/llm.md");
    run_python(
        "llm_recipe.py",
        &[
            env!("CARGO_BIN_EXE_tollgate").to_string(),
            docs.display().to_string(),
        ],
    );
}

/// OpenTelemetry traces into OTLP collectors on Python's http.server and grpcio
/// (tests/python/otlp_traces.py): the caller's trace and parent from B3 and W3C
/// context over gRPC and HTTP, the decision's attributes, sampling that follows the
/// caller, malformed context, and collectors that are down or never answer.
#[test]
fn python_otlp_collectors_receive_spans_in_the_callers_traces() {
    run_python(
        "otlp_traces.py",
        &[env!("CARGO_BIN_EXE_tollgate").to_string()],
    );
}

#[test]
fn python_grpcio_and_protobuf_json_clients_get_envoys_answers() {
    python_checks(
        "rls",
        "domain: py\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, unit: minute, requests_per_unit: 3}\n",
        "envoy_clients.py",
        true,
    );
}

/// The rate limit quota stream (RLQS) from grpcio with the `xds-protos` stubs
/// (tests/python/rlqs_client.py): subscription, shares within the budget, an unknown
/// bucket, a `deny_all` bucket, refused reports.
#[test]
fn python_grpcio_streams_rate_limit_quota_reports() {
    python_checks(
        "rlqs",
        "domain: py\nquota_buckets:\n  - bucket: { name: api }\n    policy: \"gcra:rate=100/s,burst=20\"\n  - bucket: { name: blocked }\n    blanket: deny_all\n",
        "rlqs_client.py",
        false,
    );
}
