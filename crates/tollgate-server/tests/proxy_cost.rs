//! The proxy charging what responses report (`cost:`), end to end: an upstream the
//! test starts answers OpenAI-shaped chat completions (a JSON body with `usage`, or a
//! `stream: true` server-sent event stream whose last event carries it), and
//! `tollgate proxy` processes in front of it keep a budget of 10,000 tokens a minute
//! per API key, in memory and, with two processes, in Redis. (Windows open at a key's
//! first request, `align=first`, so that no window boundary falls inside a test.)

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Response};
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_testkit::{distinct_ports, Killed, RedisServers};

const BUDGET: u64 = 10_000;

/// The upstream: POST /v1/chat/completions. The request body is JSON with `stream`
/// and `tokens` (the usage to report); header `x-usage` says how to report it:
/// `json` (default), `header`, `string`, `huge`, `negative` or `none`; `slow`
/// reports in JSON with 300 ms between events; `linger` reports in JSON and ends the
/// stream 300 ms after its `[DONE]`.
async fn upstream() -> String {
    async fn completion(headers: HeaderMap, body: Bytes) -> Response<Body> {
        let req: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let tokens = req["tokens"].as_u64().unwrap();
        let stream = req["stream"].as_bool().unwrap_or(false);
        let how = headers
            .get("x-usage")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("json")
            .to_string();
        let usage = match how.as_str() {
            "string" => r#","usage":{"total_tokens":"lots"}"#.to_string(),
            "huge" => r#","usage":{"total_tokens":1e400}"#.to_string(),
            "negative" => r#","usage":{"total_tokens":-5}"#.to_string(),
            "none" | "header" => String::new(),
            _ => format!(
                r#","usage":{{"prompt_tokens":10,"completion_tokens":{},"total_tokens":{tokens}}}"#,
                tokens.saturating_sub(10)
            ),
        };
        let mut response = if stream {
            // A few content deltas, then the usage in the last event, then [DONE],
            // each event its own chunk, a little apart.
            let mut events: Vec<String> = (0..3)
                .map(|i| {
                    format!(
                        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"word{i} \"}}}}]}}\n\n"
                    )
                })
                .collect();
            events.push(format!("data: {{\"choices\":[]{usage}}}\n\n"));
            events.push("data: [DONE]\n\n".into());
            let gap = Duration::from_millis(if how == "slow" { 300 } else { 2 });
            let linger = how == "linger";
            let chunks = futures::stream::iter(events).then(move |e| async move {
                tokio::time::sleep(gap).await;
                Ok::<_, std::io::Error>(Bytes::from(e))
            });
            // With `linger`, the stream ends 300 ms after its last event.
            let end = futures::stream::iter(linger.then_some(())).then(|()| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, std::io::Error>(Bytes::new())
            });
            let chunks = chunks.chain(end);
            let mut r = Response::new(Body::from_stream(chunks));
            r.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            r
        } else {
            let text =
                format!(r#"{{"id":"c1","choices":[{{"message":{{"content":"hi"}}}}]{usage}}}"#);
            let mut r = Response::new(Body::from(text));
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            r
        };
        if how == "header" {
            response
                .headers_mut()
                .insert("x-usage-total-tokens", tokens.to_string().parse().unwrap());
        }
        response
    }
    use futures::StreamExt;
    let app = axum::Router::new().route("/v1/chat/completions", post(completion));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

struct Proxy {
    _process: Killed,
    addr: String,
    metrics: String,
}

/// A `tollgate proxy` process in front of `upstream` with `store` (a `store:` section
/// or nothing).
fn proxy(dir: &std::path::Path, upstream: &str, store: &str, policy: &str) -> Proxy {
    let ports = distinct_ports(2);
    let config = dir.join(format!("proxy-{}.yaml", ports[0]));
    std::fs::write(
        &config,
        format!(
            "{store}proxy:
  listen: 127.0.0.1:{px}
  metrics: 127.0.0.1:{mx}
  routes:
    - name: llm
      match: {{path_prefix: /v1/}}
      upstream: {upstream}
      key: header:authorization
      policies: [\"{policy}\"]
      cost:
        from: [header:x-usage-total-tokens, json:usage.total_tokens]
        estimate: 50
",
            px = ports[0],
            mx = ports[1],
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["proxy", "--config", config.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("proxy"), "{line}");
    Proxy {
        _process: Killed(child),
        addr: format!("http://127.0.0.1:{}", ports[0]),
        metrics: format!("http://127.0.0.1:{}/metrics", ports[1]),
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// One completion through `proxy` for `key`: (status, headers, body).
async fn complete(
    c: &HttpClient,
    proxy: &Proxy,
    key: &str,
    tokens: u64,
    stream: bool,
    how: &str,
) -> (u16, HeaderMap, String) {
    let req = http::Request::post(format!("{}/v1/chat/completions", proxy.addr))
        .header("authorization", key)
        .header("x-usage", how)
        .body(Full::new(Bytes::from(format!(
            r#"{{"model":"m","stream":{stream},"tokens":{tokens}}}"#
        ))))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status.as_u16(),
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-cost-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Spends `key`'s budget through `proxies` in turn with completions of 1,500 tokens
/// (JSON and streamed alternately) until one is refused: returns the tokens served.
/// Every response served is charged before it ends, so a caller waiting for its
/// answers overspends by at most one response.
async fn spend(c: &HttpClient, proxies: &[&Proxy], key: &str) -> u64 {
    let mut served = 0;
    for i in 0..20 {
        let proxy = proxies[i % proxies.len()];
        let (status, headers, body) = complete(c, proxy, key, 1500, i % 2 == 1, "json").await;
        if status == 429 {
            let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=3600).contains(&retry), "{retry}");
            assert!(body.contains("rate limit"), "{body}");
            return served;
        }
        assert_eq!(status, 200, "{body}");
        served += 1500;
    }
    panic!("never refused after {served} tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_holds_within_one_response_and_bad_usage_is_charged_the_estimate() {
    let up = upstream().await;
    let dir = temp_dir("memory");
    let p = proxy(
        &dir,
        &up,
        "",
        "fixed-window:limit=10000,window=1m,align=first",
    );
    let c = client();
    // JSON and streamed completions: served tokens stay within the budget plus one
    // response (the overdraft a check before the work cannot prevent).
    let served = spend(&c, &[&p], "key-a").await;
    assert!(
        served > BUDGET - 1500 && served <= BUDGET + 1500,
        "{served}"
    );
    // In debt: a look shows nothing left, and it stays refused for the window.
    let (status, headers, _) = complete(&c, &p, "key-a", 10, false, "json").await;
    assert_eq!(status, 429);
    assert!(headers["ratelimit"].to_str().unwrap().contains("r=0"));
    // The usage in a header counts as well.
    // (9,960 used: 40 left, less than the 50 an admission takes.)
    let (status, headers, _) = complete(&c, &p, "key-h", 9_960, false, "header").await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-usage-total-tokens"], "9960");
    assert_eq!(complete(&c, &p, "key-h", 1, false, "json").await.0, 429);
    // A usage that is not one (a string, 1e400, a negative number, none at all) is
    // charged the estimate of 50, never nothing: 200 such responses spend the budget.
    // (An hour's budget: these loops take longer than a minute's margin.)
    let p = proxy(
        &dir,
        &up,
        "",
        "fixed-window:limit=10000,window=1h,align=first",
    );
    for how in ["string", "huge", "negative", "none"] {
        let key = format!("key-{how}");
        let mut ok = 0;
        for (stream, n) in [(false, 100), (true, 101)] {
            for _ in 0..n {
                if complete(&c, &p, &key, 1000, stream, how).await.0 == 200 {
                    ok += 1;
                }
            }
        }
        assert_eq!(ok, BUDGET / 50, "{how}: {ok} served");
    }
    // A client that goes away mid-stream is charged: here before the usage event,
    // so the estimate (50 of the 9,000 it would have reported).
    let req = http::Request::post(format!("{}/v1/chat/completions", p.addr))
        .header("authorization", "key-gone")
        .header("x-usage", "slow")
        .body(Full::new(Bytes::from(r#"{"stream":true,"tokens":9000}"#)))
        .unwrap();
    let resp = c.request(req).await.unwrap();
    let mut body = resp.into_body();
    let _first = body.frame().await;
    drop(body);
    // Charged once the proxy has seen the client go (counted as disconnected).
    let gone = "tollgate_proxy_cost_responses_total{route=\"llm\",outcome=\"disconnected\"} 1";
    for _ in 0..300 {
        if reqwest_text(&c, &p.metrics).await.contains(gone) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, headers, _) = complete(&c, &p, "key-gone", 100, false, "json").await;
    assert_eq!(status, 200);
    assert!(
        headers["ratelimit"].to_str().unwrap().contains("r=9900"),
        "{headers:?}"
    );
    // Every answer of this proxy's route by status: the budget's 200s (and the two
    // of key-gone), the rest of the 804 refused; each 200 timed upstream. A request
    // is counted once the proxy has finished it, which may be after its client has
    // read the last byte (or, for key-gone's stream, seen it go): read the figures
    // once they are all in, or as they stand after 10 s.
    let served = 4 * BUDGET / 50 + 2;
    let lines = [
        "tollgate_proxy_cost_responses_total{route=\"llm\",outcome=\"invalid\"} 600".into(),
        "tollgate_proxy_cost_responses_total{route=\"llm\",outcome=\"missing\"} 200".into(),
        "tollgate_proxy_cost_responses_total{route=\"llm\",outcome=\"disconnected\"} 1".into(),
        format!("tollgate_proxy_requests_total{{route=\"llm\",code=\"200\"}} {served}"),
        format!(
            "tollgate_proxy_requests_total{{route=\"llm\",code=\"429\"}} {}",
            804 - 4 * BUDGET / 50
        ),
        format!("tollgate_proxy_upstream_duration_seconds_count{{route=\"llm\"}} {served}"),
    ];
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = reqwest_text(&c, &p.metrics).await;
        if lines.iter().all(|l| metrics.contains(l.as_str())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for line in &lines {
        assert!(metrics.contains(line.as_str()), "{line} not in\n{metrics}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --all-features"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_on_redis_keep_one_token_budget() {
    let redis = RedisServers::standalone();
    let up = upstream().await;
    let dir = temp_dir("redis");
    let store = format!("store:\n  kind: redis\n  url: {}\n", redis.url());
    let policy = "fixed-window:limit=10000,window=1m,align=first";
    let (a, b) = (
        proxy(&dir, &up, &store, policy),
        proxy(&dir, &up, &store, policy),
    );
    let c = client();
    let served = spend(&c, &[&a, &b], "key-r").await;
    assert!(
        served > BUDGET - 1500 && served <= BUDGET + 1500,
        "{served}"
    );
    // Both processes refuse the key now.
    assert_eq!(complete(&c, &a, "key-r", 1, false, "json").await.0, 429);
    assert_eq!(complete(&c, &b, "key-r", 1, false, "json").await.0, 429);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A token bucket pays a debt back at its rate: blocked until then, admitted after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_blocks_the_key_until_it_is_paid_back() {
    let up = upstream().await;
    let dir = temp_dir("payback");
    // 10,000 a minute refills 1,000 tokens in 6 s.
    let p = proxy(&dir, &up, "", "token-bucket:rate=10000/m,capacity=10000");
    let c = client();
    let (status, ..) = complete(&c, &p, "key-p", 11_000, false, "json").await;
    assert_eq!(status, 200);
    let (status, headers, _) = complete(&c, &p, "key-p", 1, false, "json").await;
    assert_eq!(status, 429);
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    // 1,000 tokens of debt plus the 50 of an admission: about 6.3 s.
    assert!((6..=8).contains(&retry), "{retry}");
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(complete(&c, &p, "key-p", 1, false, "json").await.0, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn reqwest_text(c: &HttpClient, url: &str) -> String {
    let resp = c
        .request(
            http::Request::get(url)
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap()
}

/// A `cost:` that cannot work is refused before anything starts, naming the field.
#[test]
fn cost_settings_that_cannot_work_are_refused_by_check_config() {
    let dir = temp_dir("config");
    let route = |extra: &str| {
        format!(
            "proxy:\n  routes:\n    - name: llm\n      upstream: http://127.0.0.1:9\n      key: header:authorization\n{extra}"
        )
    };
    for (extra, expected) in [
        (
            "      policies: ['shaper:rate=1/s,queue=2']\n      cost: {from: 'json:usage.total_tokens'}\n",
            "proxy.routes[0].cost: shaper:rate=1/s,queue=2: shaper cannot be charged",
        ),
        (
            "      policies: ['sliding-window:limit=100,window=1m']\n      cost: {from: 'json:usage.total_tokens'}\n",
            "proxy.routes[0].cost: sliding-window:limit=100,window=1m,mode=weighted: forgets a charge's debt when its window moves on",
        ),
        (
            "      policies: ['fixed-window:limit=100,window=1m,debt=forgive']\n      cost: {from: 'json:usage.total_tokens'}\n",
            "proxy.routes[0].cost: fixed-window:limit=100,window=1m,debt=forgive: forgets a charge's debt",
        ),
        (
            "      policies: ['fixed-window:limit=100,window=1m']\n      cost: {from: 'json:usage.total_tokens', estimate: 500}\n",
            "proxy.routes[0].cost.estimate: fixed-window:limit=100,window=1m: cost 500 can never be admitted",
        ),
        (
            "      cost: {from: 'json:usage.total_tokens'}\n",
            "proxy.routes[0].cost: needs policies to charge",
        ),
        (
            "      policies: ['gcra:rate=10/s']\n      cost: {from: 'body:usage'}\n",
            "proxy.routes[0].cost.from: 'body:usage' is not header:NAME or json:PATH",
        ),
        (
            "      policies: ['gcra:rate=10/s']\n      cost: {from: 'json:usage..total'}\n",
            "proxy.routes[0].cost.from: 'json:usage..total' is not header:NAME or json:PATH",
        ),
        (
            "      policies: ['gcra:rate=10/s']\n      cost: {from: 'json:usage.total_tokens', max_body: 0}\n",
            "proxy.routes[0].cost.max_body: must be at least 1 byte",
        ),
        (
            "      policies: ['gcra:rate=10/s']\n      cost: {from: 'json:usage.total_tokens', requests: ['concurrency:limit=2']}\n",
            "proxy.routes[0].cost.requests: concurrency:limit=2: concurrency cannot be charged",
        ),
        (
            "      policies: ['gcra:rate=10/s']\n      cost: {from: 'json:usage.total_tokens', requests: ['gcra:rate=0/s']}\n",
            "proxy.routes[0].cost.requests: invalid policy 'gcra:rate=0/s'",
        ),
        (
            "      policies: ['gcra:rate=10/s']\n      cost: {from: 'json:usage.total_tokens', ask_usage: always}\n",
            "unknown variant `always`, expected `openai` or `none`",
        ),
    ] {
        let file = dir.join("bad.yaml");
        std::fs::write(&file, route(extra)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check-config", "--config", file.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra}");
        assert!(err.contains(expected), "{extra}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shadow policy beside the budget (one that would reject, and only reports) does
/// not stop the usage being charged to the policies that enforce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_does_not_stop_the_charge() {
    let up = upstream().await;
    let dir = temp_dir("shadow");
    let p = proxy(
        &dir,
        &up,
        "",
        "fixed-window:limit=10000,window=1h,align=first\", \"fixed-window:limit=100,window=1h,align=first,shadow=true",
    );
    let c = client();
    let served = spend(&c, &[&p], "key-s").await;
    assert!(
        served > BUDGET - 1500 && served <= BUDGET + 1500,
        "{served}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each request reserves the bound it declares (`max_tokens`) plus its prompt at
/// admission: 20 concurrent slow streams of one key, each declaring and producing 300
/// tokens, against a budget of 1,000: only those whose reservations fit together are
/// admitted, so the upstream never produces more than the budget (without the
/// reservation, each took the estimate of 50 and all 20 passed: 6,000 tokens). A
/// stream that reports no usage is charged its reservation, not the estimate, over
/// HTTP/1.1 and HTTP/2 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_reserve_what_they_declare() {
    let up = upstream().await;
    let dir = temp_dir("reserve");
    let px = proxy(&dir, &up, "", "token-bucket:rate=1000/h,capacity=1000");
    let c = client();
    let body = r#"{"model":"m","stream":true,"tokens":300,"max_tokens":300}"#;
    // HTTP/2 (prior knowledge) is served by hyper, HTTP/1.1 by the fast path.
    let h2: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let send = |key: &'static str, how: &'static str| {
        let c = if key.starts_with("h2-") {
            h2.clone()
        } else {
            c.clone()
        };
        let url = format!("{}/v1/chat/completions", px.addr);
        async move {
            let req = http::Request::post(url)
                .header("authorization", key)
                .header("x-usage", how)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let resp = c.request(req).await.unwrap();
            let status = resp.status().as_u16();
            resp.into_body().collect().await.unwrap();
            status
        }
    };
    let statuses = futures::future::join_all((0..20).map(|_| send("k-parallel", "slow"))).await;
    let admitted = statuses.iter().filter(|s| **s == 200).count() as u64;
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    let reservation = 300 + (body.len() as u64).div_ceil(4);
    assert!(admitted >= 1, "{statuses:?}");
    assert!(
        admitted * reservation <= 1000,
        "{admitted} admitted at once, {} tokens produced against a budget of 1000",
        admitted * 300
    );
    // A stream without usage pays what it reserved (315 of a fresh key's 1,000), not
    // the estimate (50, which would let 20 through): three fit, the fourth does not.
    for _ in 0..3 {
        assert_eq!(send("k-missing", "none").await, 200);
    }
    assert_eq!(send("k-missing", "none").await, 429);
    for _ in 0..3 {
        assert_eq!(send("h2-missing", "none").await, 200);
    }
    assert_eq!(send("h2-missing", "none").await, 429);
    // A body that comes after its head (the fast path reads it before admission):
    // declaring 900, reporting no usage, it pays 900 and its prompt; a request
    // reserving 315 then finds too little left.
    let split = r#"{"model":"m","stream":false,"tokens":900,"max_tokens":900}"#;
    let addr = px.addr.trim_start_matches("http://").to_string();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: k-split\r\n\
         x-usage: none\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        split.len()
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tcp.write_all(head.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    tcp.write_all(split.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tcp.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(tcp);
    assert_eq!(send("k-split", "json").await, 429);
    std::fs::remove_dir_all(&dir).ok();
}

/// A `cost:` route reads a request's body before admission (to see what it
/// declares): an upload that stalls there is answered `408` one body timeout later,
/// over HTTP/2 (hyper's path) as over HTTP/1.1 (the fast path), not taken for a bad
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_before_admission_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = upstream().await;
    let dir = temp_dir("stall");
    let bounds = "connections: {body_timeout: 1s}\n";
    let px = proxy(&dir, &up, bounds, "token-bucket:rate=1000/h,capacity=1000");
    let addr = px.addr.trim_start_matches("http://").to_string();
    let first_bytes = Bytes::from_static(br#"{"model":"m","max_tokens":"#);
    // HTTP/2: a head declaring 1,000 bytes, then a few, then nothing.
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let head = http::Request::post(format!("{}/v1/chat/completions", px.addr))
        .header("authorization", "k-stall-h2")
        .header("content-length", "1000")
        .body(())
        .unwrap();
    let (answer, mut body) = client.send_request(head, false).unwrap();
    body.send_data(first_bytes.clone(), false).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), answer).await;
    assert_eq!(answer.unwrap().unwrap().status(), 408);
    // HTTP/1.1: the same.
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: k-stall-h1\r\n\
                content-length: 1000\r\n\r\n";
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&first_bytes).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer[..n.unwrap().unwrap()]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

/// A client that stops reading an event stream at its `[DONE]` (the openai package
/// closes the response there) and asks again at once finds the usage charged: the
/// charge lands before `[DONE]` is passed on, not at the body's end (here 300 ms
/// later), over HTTP/1.1 (the fast path) and HTTP/2 (hyper's path) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_at_done_asks_again_after_the_charge() {
    let up = upstream().await;
    let dir = temp_dir("done");
    let px = proxy(&dir, &up, "", "token-bucket:rate=1000/h,capacity=1000");
    let h2: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for (c, key) in [(client(), "k-done"), (h2, "h2-done")] {
        let send = || {
            let url = format!("{}/v1/chat/completions", px.addr);
            let req = http::Request::post(url)
                .header("authorization", key)
                .header("x-usage", "linger")
                .body(Full::new(Bytes::from(
                    r#"{"model":"m","stream":true,"tokens":1000}"#,
                )))
                .unwrap();
            c.request(req)
        };
        // The whole budget, used by the first stream (admitted on the estimate).
        let resp = send().await.unwrap();
        assert_eq!(resp.status(), 200, "{key}");
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("[DONE]") {
            let frame = body.frame().await.expect("a frame").unwrap();
            seen.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d));
        }
        drop(body);
        let again = send().await.unwrap();
        assert_eq!(
            again.status(),
            429,
            "{key}: admitted before the first was charged"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
