//! `tollgate proxy` as a real process in front of a real upstream, driven by a real
//! HTTP client.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use axum::routing::{any, get};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

struct Proxy {
    child: Child,
    base: String,
    config: std::path::PathBuf,
    _dir: TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Requests the upstream holds (`/api/held/NAME`), by name: how many arrived, and
/// whether the test has let them go.
#[derive(Default)]
struct Held {
    arrived: std::collections::HashMap<String, usize>,
    released: std::collections::HashSet<String>,
}

static HELD: std::sync::Mutex<Option<Held>> = std::sync::Mutex::new(None);

fn held<T>(f: impl FnOnce(&mut Held) -> T) -> T {
    f(HELD.lock().unwrap().get_or_insert_with(Held::default))
}

/// Waits until `n` requests for `/api/held/NAME` have reached the upstream (each
/// holds its permits there until [`release`]).
async fn arrived(name: &str, n: usize) {
    for _ in 0..2000 {
        if held(|h| h.arrived.get(name).copied().unwrap_or(0)) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} requests for /api/held/{name} never arrived");
}

/// Sends `GET /api/held/NAME` with key `key` through `proxy` and waits until the
/// upstream holds it (its permits taken); the answer comes after [`release`].
async fn hold(
    proxy: &std::sync::Arc<Proxy>,
    name: &'static str,
    key: &'static str,
) -> tokio::task::JoinHandle<http::Response<Vec<u8>>> {
    let p = proxy.clone();
    let held =
        tokio::spawn(async move { get_as(&p, &format!("/api/held/{name}"), Some(key)).await });
    arrived(name, 1).await;
    held
}

/// Lets the requests for `/api/held/NAME` be answered: one chunk then, the rest
/// after 100 ms.
fn release(name: &str) {
    held(|h| h.released.insert(name.to_string()));
}

/// An upstream on port 0: `/echo` returns the request body and headers it saw;
/// `/slow` answers after 300 ms; `/held/NAME` sends its headers and one chunk, then
/// the rest once the test releases NAME; everything else says "up".
async fn upstream() -> String {
    let app = axum::Router::new()
        .route(
            "/api/echo",
            any(
                |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                    let xff = headers
                        .get("x-forwarded-for")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    ([("x-seen-forwarded-for", xff)], body)
                },
            ),
        )
        .route(
            "/api/stream",
            get(|| async {
                // Headers at once, then 4 chunks 100 ms apart.
                let chunks = futures::stream::unfold(0u32, |i| async move {
                    if i == 4 {
                        return None;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Some((
                        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 1000])),
                        i + 1,
                    ))
                });
                axum::body::Body::from_stream(chunks)
            }),
        )
        .route(
            "/api/big",
            get(|| async {
                // 256 MiB in 64 KiB chunks, far more than socket buffers hold.
                let chunk = bytes::Bytes::from(vec![b'b'; 64 * 1024]);
                let chunks = futures::stream::iter(
                    (0..4096).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                );
                axum::body::Body::from_stream(chunks)
            }),
        )
        .route(
            "/api/held/{name}",
            get(
                |axum::extract::Path(name): axum::extract::Path<String>| async move {
                    held(|h| *h.arrived.entry(name.clone()).or_default() += 1);
                    let chunks = futures::stream::unfold(0u32, move |i| {
                        let name = name.clone();
                        async move {
                            match i {
                                0 => {}
                                1 => {
                                    while !held(|h| h.released.contains(&name)) {
                                        tokio::time::sleep(Duration::from_millis(10)).await;
                                    }
                                }
                                _ => return None,
                            }
                            let chunk = bytes::Bytes::from(vec![b'h'; 1000]);
                            Some((Ok::<_, std::io::Error>(chunk), i + 1))
                        }
                    });
                    axum::body::Body::from_stream(chunks)
                },
            ),
        )
        .route(
            "/api/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                "slow"
            }),
        )
        .route(
            "/api/stuck",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        )
        .fallback(|| async { "up" })
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn start(config: &str) -> Proxy {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-proxy-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tollgate.yaml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "proxy",
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Proxy {
        child,
        base: format!("http://{addr}"),
        config: path,
        _dir: TempDir(dir),
    }
}

async fn send(
    proxy: &Proxy,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> http::Response<Vec<u8>> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", proxy.base));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(bytes::Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes().to_vec())
}

async fn get_as(proxy: &Proxy, path: &str, key: Option<&str>) -> http::Response<Vec<u8>> {
    let headers: Vec<(&str, &str)> = key.map(|k| vec![("x-api-key", k)]).unwrap_or_default();
    send(proxy, "GET", path, &headers, Vec::new()).await
}

fn config(upstream: &str, route_extra: &str) -> String {
    format!(
        "proxy:\n  routes:\n    - name: api\n      match: {{ path_prefix: /api/ }}\n      upstream: {upstream}\n      key: header:X-Api-Key\n{route_extra}"
    )
}

#[tokio::test]
async fn limits_per_key_with_tiers_headers_and_problem_json() {
    let up = upstream().await;
    let proxy = start(&config(
        &up,
        "      policies: [\"limit-req:rate=1/m,burst=1,nodelay\"]\n      tiers:\n        - name: vip\n          values: [\"vip-key\"]\n          policies: [\"limit-req:rate=1/m,burst=4,nodelay\"]\n",
    ));
    let ok = get_as(&proxy, "/api/x", Some("alice")).await;
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.body(), b"up");
    assert_eq!(ok.headers()["x-ratelimit-limit"], "2");
    assert_eq!(ok.headers()["x-ratelimit-remaining"], "1");
    // nginx keeps 1/m as 16 milli-requests per second: fully drained after 63 s.
    assert_eq!(ok.headers()["ratelimit"], "\"default\";r=1;t=63");
    assert_eq!(get_as(&proxy, "/api/x", Some("alice")).await.status(), 200);
    let limited = get_as(&proxy, "/api/x", Some("alice")).await;
    assert_eq!(limited.status(), 429);
    assert_eq!(
        limited.headers()["content-type"],
        "application/problem+json"
    );
    assert!(limited.headers().contains_key("retry-after"));
    let problem: serde_json::Value = serde_json::from_slice(limited.body()).unwrap();
    assert_eq!(problem["status"], 429);
    // Another key, a VIP key (5 at once) and an empty key (never limited).
    assert_eq!(get_as(&proxy, "/api/x", Some("bob")).await.status(), 200);
    for _ in 0..5 {
        let r = get_as(&proxy, "/api/x", Some("vip-key")).await;
        assert_eq!(r.status(), 200);
        assert!(r.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .starts_with("\"vip\""));
    }
    assert_eq!(
        get_as(&proxy, "/api/x", Some("vip-key")).await.status(),
        429
    );
    for _ in 0..5 {
        assert_eq!(get_as(&proxy, "/api/x", None).await.status(), 200);
    }
    // No route: 404.
    assert_eq!(get_as(&proxy, "/other", Some("alice")).await.status(), 404);
}

#[tokio::test]
async fn dry_run_never_rejects_and_delays_are_held() {
    let up = upstream().await;
    let dry = start(&config(
        &up,
        "      policies: [\"fixed-window:limit=1,window=1h\"]\n      dry_run: true\n",
    ));
    for _ in 0..3 {
        let r = get_as(&dry, "/api/x", Some("k")).await;
        assert_eq!(r.status(), 200);
    }
    let delayed = start(&config(
        &up,
        "      policies: [\"limit-req:rate=2/s,burst=2\"]\n      status: 503\n",
    ));
    let clock = tollgate::clock::MonotonicClock::new();
    let t0 = tollgate::clock::Clock::now_us(&clock);
    assert_eq!(get_as(&delayed, "/api/x", Some("d")).await.status(), 200);
    assert_eq!(get_as(&delayed, "/api/x", Some("d")).await.status(), 200);
    let elapsed = tollgate::clock::Clock::now_us(&clock) - t0;
    assert!(
        elapsed >= 450_000,
        "the second request was held for its delay: {elapsed}us"
    );
    // Burst 2 at 2/s, four at once: excess 0, 1000 and 2000 pass (the later ones
    // held), the fourth exceeds the burst and gets the configured status (the four
    // may arrive up to 500 ms apart on a busy machine).
    let (a, b, c, d) = tokio::join!(
        get_as(&delayed, "/api/x", Some("e")),
        get_as(&delayed, "/api/x", Some("e")),
        get_as(&delayed, "/api/x", Some("e")),
        get_as(&delayed, "/api/x", Some("e"))
    );
    let mut codes = [
        a.status().as_u16(),
        b.status().as_u16(),
        c.status().as_u16(),
        d.status().as_u16(),
    ];
    codes.sort();
    assert_eq!(codes, [200, 200, 200, 503]);
}

#[tokio::test]
async fn limit_conn_bounds_concurrent_requests_per_key() {
    let up = upstream().await;
    let proxy = std::sync::Arc::new(start(&config(&up, "      limit_conn: 1\n")));
    // One request of the key held at the upstream: a second one is refused.
    let first = hold(&proxy, "conn", "c").await;
    assert_eq!(get_as(&proxy, "/api/x", Some("c")).await.status(), 429);
    release("conn");
    assert_eq!(first.await.unwrap().status(), 200);
    // Another key is not affected, and once done the key may go again.
    let (x, y) = tokio::join!(
        get_as(&proxy, "/api/slow", Some("c")),
        get_as(&proxy, "/api/slow", Some("other"))
    );
    assert_eq!((x.status().as_u16(), y.status().as_u16()), (200, 200));
}

#[tokio::test]
async fn bodies_stream_through_byte_identical_and_forwarding_headers_are_set() {
    let up = upstream().await;
    let proxy = start(&config(&up, ""));
    let body: Vec<u8> = (0..5_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let r = send(
        &proxy,
        "POST",
        "/api/echo",
        &[("x-api-key", "k"), ("x-forwarded-for", "203.0.113.9")],
        body.clone(),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.body() == &body, "5 MB echoed byte-identical");
    // The peer (127.0.0.1) is not a trusted proxy: its claimed X-Forwarded-For is
    // replaced by the peer address.
    assert_eq!(r.headers()["x-seen-forwarded-for"], "127.0.0.1");
}

#[tokio::test]
async fn upstream_down_is_a_502_and_no_config_is_a_clear_error() {
    let proxy = start(&config("http://127.0.0.1:9", ""));
    let r = get_as(&proxy, "/api/x", Some("k")).await;
    assert_eq!(r.status(), 502);
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("proxy")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs --config FILE with a proxy: section")
    );
}

#[tokio::test]
#[allow(clippy::disallowed_methods)] // times a real proxy
async fn slow_upstreams_get_a_504_after_the_configured_timeouts() {
    // Answers after 30 s: far past an upstream_timeout of 500 ms (a busy machine
    // cannot make the timeout miss it, nor the answer arrive first).
    let up = upstream().await;
    let slow = start(&config(&up, "").replace("proxy:\n", "proxy:\n  upstream_timeout: 500ms\n"));
    let t = std::time::Instant::now();
    let r = get_as(&slow, "/api/stuck", Some("k")).await;
    assert_eq!(r.status(), 504);
    assert!(String::from_utf8_lossy(r.body()).contains("timed out"));
    assert!(
        t.elapsed() >= Duration::from_millis(500) && t.elapsed() < Duration::from_secs(10),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(get_as(&slow, "/api/x", Some("k")).await.status(), 200);

    // Never accepts: once its backlog is full, connecting hangs (SYNs are dropped).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut fillers = Vec::new();
    while let Ok(Ok(s)) = tokio::time::timeout(
        Duration::from_millis(200),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    {
        fillers.push(s);
        assert!(fillers.len() < 64, "the backlog never filled");
    }
    let blackhole = start(
        &config(&format!("http://{addr}"), "")
            .replace("proxy:\n", "proxy:\n  connect_timeout: 300ms\n"),
    );
    let t = std::time::Instant::now();
    let r = get_as(&blackhole, "/api/x", Some("k")).await;
    assert_eq!(r.status(), 504, "{}", String::from_utf8_lossy(r.body()));
    assert!(String::from_utf8_lossy(r.body()).contains("timed out (connect)"));
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    drop(listener);
}

#[tokio::test]
async fn the_proxy_section_reloads_keeping_unchanged_routes() {
    let up = upstream().await;
    let v1 = config(
        &up,
        "      policies: [\"fixed-window:limit=1,window=1h\"]\n",
    );
    let proxy = start(&v1);
    assert_eq!(get_as(&proxy, "/api/x", Some("k")).await.status(), 200);
    assert_eq!(get_as(&proxy, "/api/x", Some("k")).await.status(), 429);
    // Add a route; the unchanged one keeps its counter.
    let v2 = format!(
        "{v1}    - name: open\n      match: {{ path_prefix: /open/ }}\n      upstream: {up}\n"
    );
    std::fs::write(&proxy.config, &v2).unwrap();
    let mut reloaded = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if get_as(&proxy, "/open/x", None).await.status() == 200 {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "the new route appeared");
    assert_eq!(
        get_as(&proxy, "/api/x", Some("k")).await.status(),
        429,
        "counter kept"
    );
    // A bad file is rejected: both routes stay.
    std::fs::write(&proxy.config, "proxy:\n  routes: []\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get_as(&proxy, "/open/x", None).await.status(), 200);
    assert_eq!(get_as(&proxy, "/api/x", Some("k")).await.status(), 429);
}

#[tokio::test]
async fn limit_conn_holds_the_permit_until_the_response_body_ends() {
    let up = upstream().await;
    let proxy = std::sync::Arc::new(start(&config(&up, "      limit_conn: 1\n")));
    let first = hold(&proxy, "body", "s").await;
    // The first response's headers and first chunk are sent, but its body is still
    // streaming.
    assert_eq!(get_as(&proxy, "/api/x", Some("s")).await.status(), 429);
    release("body");
    let first = first.await.unwrap();
    assert_eq!((first.status().as_u16(), first.body().len()), (200, 2000));
    assert_eq!(get_as(&proxy, "/api/x", Some("s")).await.status(), 200);
}

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --features external-servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_on_one_redis_share_limit_req_and_limit_conn() {
    let mut redis = tollgate_testkit::RedisServers::standalone();
    let up = upstream().await;
    let cfg = format!(
        "store:\n  kind: redis\n  url: {}\n  timeout: 200ms\n{}",
        redis.url(),
        config(
            &up,
            "      policies: [\"limit-req:rate=1/m,burst=2,nodelay\"]\n      limit_conn: 1\n"
        )
    );
    // A's figures on a metrics listener of its own.
    let mx = tollgate_testkit::free_port();
    let cfg_a = cfg.replacen(
        "proxy:\n",
        &format!("proxy:\n  metrics: 127.0.0.1:{mx}\n"),
        1,
    );
    let (a, b) = (start(&cfg_a), start(&cfg));
    let mut codes = Vec::new();
    for i in 0..6 {
        let p = if i % 2 == 0 { &a } else { &b };
        codes.push(get_as(p, "/api/x", Some("k")).await.status().as_u16());
    }
    // 1 + burst 2 for the key, whichever proxy is asked (limit_req: nodelay).
    assert_eq!(codes, [200, 200, 200, 429, 429, 429]);
    // One request in flight per key across both proxies: one held at the upstream
    // through A, another through B refused.
    let (a, b) = (std::sync::Arc::new(a), b);
    let x = hold(&a, "two", "c").await;
    let y = get_as(&b, "/api/x", Some("c")).await;
    assert_eq!(y.status(), 429);
    let busy = String::from_utf8_lossy(y.body()).into_owned();
    assert!(busy.contains("too many concurrent requests"), "{busy}");
    release("two");
    assert_eq!(x.await.unwrap().status(), 200);
    // The permit came back when the response ended (released in one round trip from
    // a spawned task): once Redis holds no permit, the key may go again.
    let held_in_redis = || {
        let n = redis.cli(
            0,
            &[
                "EVAL",
                "local n = 0 for _, k in ipairs(redis.call('KEYS', '*:book')) do \
                 n = n + tonumber(redis.call('HGET', k, 'n') or '0') end return n",
                "0",
            ],
        );
        n.trim().parse::<u64>().unwrap()
    };
    for _ in 0..500 {
        if held_in_redis() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held_in_redis(), 0, "the permit never came back");
    assert_eq!(get_as(&b, "/api/slow", Some("c")).await.status(), 200);
    // Redis down under `on_error: error` (the default): 503 naming the store.
    redis.stop(0);
    let down = get_as(&a, "/api/x", Some("other")).await;
    assert_eq!(down.status(), 503);
    assert!(String::from_utf8_lossy(down.body()).contains("rate limit store unavailable"));
    // /metrics says which node: limit_req's decisions and limit_conn's permits by
    // node, the node failing now.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let uri = format!("http://127.0.0.1:{mx}/metrics").parse().unwrap();
    let body = client.get(uri).await.unwrap().into_body().collect().await;
    let node_events = String::from_utf8(body.unwrap().to_bytes().to_vec()).unwrap();
    let node = format!("node=\"{}\"", redis.url());
    let event = |family: &str, name: &str| {
        (node_events.lines())
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&node))
            .find(|l| l.contains(&format!("event=\"{name}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert!(
        event("tollgate_redis_store_node_events_total", "decisions").is_some_and(|n| n >= 4)
            && event("tollgate_redis_node_events", "failing") == Some(1),
        "{node}: {node_events}"
    );
}

/// A Redis `limit_conn` permit is back in Redis before the response's last bytes
/// reach the client, over HTTP/1.1 (the fast path) and HTTP/2 (hyper) alike, HEAD
/// included. Proxy A
/// reaches Redis through a relay that holds every chunk 50 ms, proxy B directly: a
/// client that has A's whole answer and asks B at once finds its key free. (Were
/// A's permit given back after the response, its release would still be on the way
/// and B would refuse.)
#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts redis-server: run scripts/test.sh, or cargo test --features external-servers"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_limit_conn_permit_is_back_before_the_response_ends() {
    let redis = tollgate_testkit::RedisServers::standalone();
    let direct = redis.url();
    let target = direct.trim_start_matches("redis://").trim_end_matches('/');
    let relay = tollgate_testkit::DelayRelay::start(target.parse().unwrap()).await;
    let up = upstream().await;
    let cfg = |url: &str| {
        format!(
            "store:\n  kind: redis\n  url: {url}\n  timeout: 2s\n{}",
            config(&up, "      limit_conn: 1\n")
        )
    };
    let (slow, fast) = (
        start(&cfg(&format!("redis://{}/", relay.addr))),
        start(&cfg(&direct)),
    );
    relay.set_delay(Duration::from_millis(50));
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let mut codes = Vec::new();
    for _ in 0..3 {
        for p in [&slow, &fast] {
            // HTTP/1.1 (the fast path)...
            codes.push(get_as(p, "/api/x", Some("k")).await.status().as_u16());
        }
        // ... and HTTP/2 (hyper), with a body and without one (HEAD: hyper sends
        // the head alone and never reads the body).
        for method in ["GET", "HEAD"] {
            for p in [&slow, &fast] {
                let req = http::Request::builder()
                    .method(method)
                    .uri(format!("{}/api/x", p.base))
                    .header("x-api-key", "k")
                    .body(Full::new(bytes::Bytes::new()))
                    .unwrap();
                let resp = h2.request(req).await.unwrap();
                assert_eq!(resp.version(), http::Version::HTTP_2);
                codes.push(resp.status().as_u16());
                let _ = resp.into_body().collect().await;
            }
        }
    }
    // HTTP/1.0 goes through hyper too, whose HTTP/1 side never polls a body it
    // knows to be empty (HEAD).
    for _ in 0..3 {
        let head = b"HEAD /api/x HTTP/1.0\r\nHost: a\r\nX-Api-Key: k\r\n\r\n";
        let answer = raw_exchange(&slow, head).await;
        codes.push(answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0));
        codes.push(get_as(&fast, "/api/x", Some("k")).await.status().as_u16());
    }
    assert_eq!(codes, [200; 24]);
}

/// Writes `raw` on a new connection and reads what comes back until the proxy closes
/// it or 3 s pass: the status codes of every response, in order.
async fn raw_statuses(proxy: &Proxy, raw: &[u8]) -> Vec<u16> {
    let addr = proxy.base.trim_start_matches("http://").parse().unwrap();
    let limit = Duration::from_secs(3);
    tollgate_testkit::dribble(addr, raw, &[], limit, limit)
        .await
        .statuses()
}

/// An upstream that answers every connection with bytes that are not HTTP.
async fn garbage_upstream() -> String {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let _ = conn.write_all(b"\x00\x01garbage, not HTTP\r\n\r\n").await;
        }
    });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_requests_get_clear_statuses_and_the_proxy_stays_up() {
    let up = upstream().await;
    let proxy = start(&config(&up, ""));
    // Conflicting Content-Length and Transfer-Encoding: refused, or framed by the
    // chunked encoding alone (the body re-framed for the upstream: no desync).
    let smuggle = b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let codes = raw_statuses(&proxy, smuggle).await;
    eprintln!("CL+TE: {codes:?}");
    assert!(matches!(codes.first(), Some(400) | Some(200)), "{codes:?}");
    // obs-fold (a header continued on the next line): 400.
    let folded = b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\n  folded\r\n\r\n";
    assert_eq!(raw_statuses(&proxy, folded).await.first(), Some(&400));
    // Two Host headers: a clear answer, not a crash.
    let hosts = b"GET /api/x HTTP/1.1\r\nHost: a\r\nHost: b\r\nX-Api-Key: k\r\n\r\n";
    let codes = raw_statuses(&proxy, hosts).await;
    eprintln!("two Hosts: {codes:?}");
    assert!(matches!(codes.first(), Some(400) | Some(200)), "{codes:?}");
    // 500 headers, and one header of 1 MB: refused (431 or 400) or the connection
    // closed, never forwarded.
    let mut many = b"GET /api/x HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 0..500 {
        many.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let codes = raw_statuses(&proxy, &many).await;
    eprintln!("500 headers: {codes:?}");
    assert!(codes.iter().all(|&c| c == 431 || c == 400), "{codes:?}");
    let mut big = b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: ".to_vec();
    big.extend_from_slice(&vec![b'x'; 1 << 20]);
    big.extend_from_slice(b"\r\n\r\n");
    let codes = raw_statuses(&proxy, &big).await;
    eprintln!("1 MB header: {codes:?}");
    assert!(codes.iter().all(|&c| c == 431 || c == 400), "{codes:?}");
    // Still up and limiting.
    assert_eq!(get_as(&proxy, "/api/x", Some("k")).await.status(), 200);

    // An upstream that answers garbage: 502, problem+json.
    let bad = start(&config(&garbage_upstream().await, ""));
    let r = get_as(&bad, "/api/x", Some("k")).await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

/// Slow and absent readers against the proxy's `connections:` bounds: headers a byte
/// at a time are cut off at the header timeout, a stalled upload gets a 408 at the
/// body timeout, and a client that stops reading a large download is dropped at the
/// send timeout, its `limit_conn` permit returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_and_absent_readers_are_cut_off_and_release_their_permits() {
    use tokio::io::AsyncWriteExt;
    let up = upstream().await;
    let proxy = start(&format!(
        "connections: {{header_timeout: 1s, body_timeout: 1s, send_timeout: 1s}}\n{}",
        config(&up, "      limit_conn: 1\n")
    ));
    let addr: std::net::SocketAddr = proxy.base.trim_start_matches("http://").parse().unwrap();
    let byte = Duration::from_millis(100);
    let (low, high) = (Duration::from_millis(900), Duration::from_secs(4));

    let head = b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Slow: ";
    let slow_headers =
        tollgate_testkit::dribble(addr, head, &[b'a'; 100], byte, Duration::from_secs(8)).await;
    slow_headers.assert_ended_within(low, high, "slow headers");
    // The upload stalls after 10 bytes: 408 one body timeout later (between reads).
    // Its limit_conn permit goes back with the answer, while the proxy still reads
    // what the client might send before closing.
    let head = b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: up\r\nContent-Length: 1000\r\n\r\n0123456789";
    let stalled = tollgate_testkit::dribble(addr, head, &[], byte, Duration::from_secs(8));
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(1600)).await;
        get_as(&proxy, "/api/x", Some("up")).await.status()
    };
    let (stalled, meanwhile) = tokio::join!(stalled, meanwhile);
    assert_eq!(stalled.statuses(), vec![408], "{stalled:?}");
    assert_eq!(meanwhile, 200, "the permit was held past the 408");
    // A steady upload slower than the bound in total but not between reads passes:
    // 30 bytes over 3 s.
    let head = b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: up2\r\nContent-Length: 30\r\nConnection: close\r\n\r\n";
    let steady =
        tollgate_testkit::dribble(addr, head, &[b's'; 30], byte, Duration::from_secs(8)).await;
    assert_eq!(steady.statuses(), vec![200], "{steady:?}");

    // A 256 MiB download under limit_conn 1, never read past the first bytes.
    let fds_before = tollgate_testkit::open_fds(proxy.child.id());
    let mut reader = tokio::net::TcpStream::connect(addr).await.unwrap();
    reader
        .write_all(b"GET /api/big HTTP/1.1\r\nHost: a\r\nX-Api-Key: hog\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile the key's one connection is taken.
    assert_eq!(get_as(&proxy, "/api/x", Some("hog")).await.status(), 429);
    // After the send timeout the proxy has dropped it, and the permit with it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(get_as(&proxy, "/api/x", Some("hog")).await.status(), 200);
    let ended = tollgate_testkit::read_until_closed(
        &mut reader,
        tokio::time::Instant::now(),
        Duration::from_secs(10),
    )
    .await;
    assert!(
        ended.after.is_some(),
        "the proxy kept the unread download open"
    );
    assert!(
        ended.answer.len() < 256 << 20,
        "all {} bytes were sent",
        ended.answer.len()
    );
    drop(reader);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fds_after = tollgate_testkit::open_fds(proxy.child.id());
    assert!(fds_after <= fds_before + 2, "{fds_before} -> {fds_after}");
}

/// A raw HTTP/1.1 upstream on port 0 that answers every request with the request head
/// it read (as its body, with an `X-RateLimit-Limit: 999` of its own) and counts the
/// connections it accepted; with `close_after`,
/// it closes each connection after one response without saying so (as an upstream
/// whose keep-alive timeout is shorter than the proxy's reuse).
async fn head_echo_upstream(
    close_after: bool,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let mut chunk = [0u8; 4096];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        let mut out = format!(
                            "HTTP/1.1 200 OK\r\nx-ratelimit-limit: 999\r\ncontent-length: {}\r\n\r\n",
                            head.len()
                        )
                        .into_bytes();
                        out.extend_from_slice(&head);
                        if s.write_all(&out).await.is_err() || close_after {
                            return;
                        }
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), accepted)
}

#[tokio::test]
async fn upstream_connections_are_kept_and_one_closed_while_idle_is_replaced() {
    let (up, accepted) = head_echo_upstream(false).await;
    let proxy = start(&config(&up, ""));
    for _ in 0..6 {
        let r = send(
            &proxy,
            "GET",
            "/api/x?q=1",
            &[("x-api-key", "k"), ("forwarded", "for=203.0.113.9")],
            Vec::new(),
        )
        .await;
        assert_eq!(r.status(), 200);
        let head = String::from_utf8_lossy(r.body()).to_lowercase();
        // Origin-form, the client's Host, the peer as the client.
        assert!(head.starts_with("get /api/x?q=1 http/1.1\r\n"), "{head}");
        assert!(
            head.contains(&format!("host: {}\r\n", &proxy.base[7..])),
            "{head}"
        );
        assert!(head.contains("x-forwarded-for: 127.0.0.1\r\n"), "{head}");
        assert!(head.contains("forwarded: for=127.0.0.1\r\n"), "{head}");
        // The peer is not a trusted proxy: what it claims of earlier hops goes.
        assert!(!head.contains("203.0.113.9"), "{head}");
    }
    // One connection per proxy worker (one per CPU) at most: sequential requests
    // reuse them.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        (1..=workers.min(6)).contains(&n),
        "{n} upstream connections for 6 requests"
    );

    // An upstream that closes every connection after one response: each request
    // finds its kept connection closed and opens a new one, never a 502.
    let (up, accepted) = head_echo_upstream(true).await;
    let proxy = start(&config(&up, ""));
    for i in 0..6 {
        if i % 2 == 1 {
            // Also when the close has surely been seen.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r = get_as(&proxy, "/api/x", Some("k")).await;
        assert_eq!(r.status(), 200, "{}", String::from_utf8_lossy(r.body()));
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 6);
}

/// Writes `raw` on a new connection and returns all the proxy sends until it closes
/// the connection (or 3 s pass).
async fn raw_exchange(proxy: &Proxy, raw: &[u8]) -> String {
    raw_trickle(proxy, raw, &[]).await
}

/// [`raw_exchange`] writing `head` at once and `then` a byte every millisecond.
async fn raw_trickle(proxy: &Proxy, head: &[u8], then: &[u8]) -> String {
    let addr = proxy.base.trim_start_matches("http://").parse().unwrap();
    let (every, limit) = (Duration::from_millis(1), Duration::from_secs(3));
    let ended = tollgate_testkit::dribble(addr, head, then, every, limit).await;
    String::from_utf8_lossy(&ended.answer).into_owned()
}

/// HTTP/1.1 takes the proxy's fast path; what it does not take (HTTP/1.0, HTTP/2)
/// goes through hyper. Either way a client gets the same answers, framed right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_http_1_1_message_and_http_2_are_proxied() {
    let up = upstream().await;
    let proxy = start(&config(
        &up,
        "      policies: [\"fixed-window:limit=8,window=1h\"]\n      headers: none\n",
    ));
    // Pipelined: two requests in one write, two answers in order; a HEAD's answer
    // has no body and the connection goes on after it.
    let two = raw_exchange(
        &proxy,
        b"GET /api/a HTTP/1.1\r\nHost: a\r\nX-Api-Key: p\r\n\r\nHEAD /api/b HTTP/1.1\r\nHost: a\r\nX-Api-Key: p\r\n\r\nGET /api/c HTTP/1.1\r\nHost: a\r\nX-Api-Key: p\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(two.matches("HTTP/1.1 200 OK").count(), 3, "{two}");
    assert_eq!(two.matches("\r\n\r\nup").count(), 2, "{two}");
    assert!(two.contains("content-length: 2"), "{two}");
    // A chunked upload passes as it is, with its trailers; 100-continue is answered
    // by the proxy before the body comes.
    let chunked = raw_trickle(
        &proxy,
        b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: q\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        b"5\r\nhello\r\n6\r\n world\r\n0\r\nx-t: 1\r\n\r\n",
    )
    .await;
    assert!(
        chunked.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK"),
        "{chunked}"
    );
    assert!(chunked.ends_with("\r\n\r\nhello world"), "{chunked}");
    // HTTP/1.0 goes to hyper, also in the middle of a connection.
    let old = raw_exchange(
        &proxy,
        b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: r\r\n\r\nGET /api/y HTTP/1.0\r\nX-Api-Key: r\r\n\r\n",
    )
    .await;
    let (first, second) = old.split_once("\r\n\r\nup").unwrap_or_default();
    assert!(first.starts_with("HTTP/1.1 200 OK"), "{old}");
    assert!(
        second.starts_with("HTTP/1.0 200 OK") && second.ends_with("up"),
        "{old}"
    );
    // Over the limit on both paths: the same problem+json.
    for _ in 0..8 {
        get_as(&proxy, "/api/x", Some("s")).await;
    }
    let fast = raw_exchange(
        &proxy,
        b"GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: s\r\nConnection: close\r\n\r\n",
    )
    .await;
    let slow = raw_exchange(
        &proxy,
        b"GET /api/x HTTP/1.0\r\nHost: a\r\nX-Api-Key: s\r\n\r\n",
    )
    .await;
    let body = |text: &str| text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    assert!(
        fast.starts_with("HTTP/1.1 429 Too Many Requests\r\n"),
        "{fast}"
    );
    assert!(
        slow.starts_with("HTTP/1.0 429 Too Many Requests\r\n"),
        "{slow}"
    );
    assert_eq!(body(&fast), body(&slow));
    for text in [&fast, &slow] {
        let lower = text.to_lowercase();
        assert!(
            lower.contains("content-type: application/problem+json"),
            "{text}"
        );
        assert!(lower.contains("retry-after: "), "{text}");
        assert!(lower.contains("date: "), "{text}");
    }
    // A rejected upload is answered, and its connection closed (its body unread).
    let refused = raw_exchange(
        &proxy,
        b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: s\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(refused.contains("connection: close"), "{refused}");
    // Bad framing on the fast path: a clear status.
    let coding = raw_exchange(
        &proxy,
        b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: t\r\nTransfer-Encoding: gzip\r\n\r\n",
    )
    .await;
    assert!(coding.starts_with("HTTP/1.1 501"), "{coding}");

    // HTTP/2 with prior knowledge (through hyper), a streamed answer included.
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<bytes::Bytes>>();
    let req = http::Request::get(format!("{}/api/stream", proxy.base))
        .header("x-api-key", "h2")
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 4000);
}

/// What a client says about framing never decides where a body ends for the
/// upstream: a `Connection` header naming `Content-Length`, chunk syntax another
/// parser reads otherwise. The upstream sees the body as the proxy read it, or the
/// request is refused: no request of the client's making reaches the upstream
/// unrouted and unlimited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framing_tricks_do_not_smuggle_a_request_past_the_proxy() {
    let up = upstream().await;
    let proxy = start(&config(&up, ""));
    let inner = b"GET /admin/secret HTTP/1.1\r\nHost: internal\r\n\r\n";
    let mut raw = format!(
        "POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\nConnection: keep-alive, content-length, host\r\nContent-Length: {}\r\n\r\n",
        inner.len()
    )
    .into_bytes();
    raw.extend_from_slice(inner);
    raw.extend_from_slice(
        b"GET /api/after HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\nConnection: close\r\n\r\n",
    );
    let answer = raw_exchange(&proxy, &raw).await;
    // The inner request came back as the body it was, then the next request's "up".
    assert_eq!(answer.matches("HTTP/1.1 200 OK").count(), 2, "{answer}");
    assert!(
        answer.contains("GET /admin/secret HTTP/1.1\r\nHost: internal"),
        "{answer}"
    );
    assert!(answer.ends_with("\r\n\r\nup"), "{answer}");
    // A bare LF in a chunk extension: refused, and the connection closed.
    let chunk = raw_exchange(
        &proxy,
        b"POST /api/echo HTTP/1.1\r\nHost: a\r\nX-Api-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n4c;\nxx\r\n0\r\n\r\nGET /admin/chunk HTTP/1.1\r\nHost: internal\r\n\r\n",
    )
    .await;
    assert!(chunk.starts_with("HTTP/1.1 400"), "{chunk}");
    assert_eq!(chunk.matches("HTTP/1.1").count(), 1, "{chunk}");

    // A fragment is not sent on, and the route's rate-limit headers replace the
    // upstream's of the same name.
    let (up, _) = head_echo_upstream(false).await;
    let proxy = start(&config(
        &up,
        "      policies: [\"fixed-window:limit=50,window=1h\"]\n      headers: legacy\n",
    ));
    let answer = raw_exchange(
        &proxy,
        b"GET /api/x#frag?q HTTP/1.1\r\nHost: a\r\nX-Api-Key: f\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        answer.contains("\r\n\r\nGET /api/x HTTP/1.1\r\n"),
        "{answer}"
    );
    let lower = answer.to_lowercase();
    assert_eq!(lower.matches("x-ratelimit-limit:").count(), 1, "{answer}");
    assert!(lower.contains("x-ratelimit-limit: 50\r\n"), "{answer}");
}
