//! Differential test: the same request trace through real nginx `limit_req` and
//! `tollgate proxy`, both on one frozen clock that the test steps (libfaketime, from
//! Debian's `faketime` package; scripts/test.sh installs it and nginx). Every request
//! arrives at exactly the same instant for both, so every decision must agree.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate_testkit::{free_port, FrozenClock, Killed, Nginx};

const BASE_S: u64 = 1_767_225_600; // 2026-01-01T00:00:00Z

/// (nginx location + zone, nginx rate, limit_req options, tollgate spec)
const ZONES: &[(&str, &str, &str, &str)] = &[
    (
        "z1",
        "10r/s",
        "burst=5 nodelay",
        "limit-req:rate=10/s,burst=5,nodelay",
    ),
    ("z2", "2r/s", "", "limit-req:rate=2/s,nodelay"),
    (
        "z3",
        "30r/m",
        "burst=3 nodelay",
        "limit-req:rate=30/m,burst=3,nodelay",
    ),
    (
        "z4",
        "7r/m",
        "burst=2 nodelay",
        "limit-req:rate=7/m,burst=2,nodelay",
    ),
];

#[cfg_attr(
    not(feature = "external-servers"),
    ignore = "starts nginx on libfaketime: run scripts/test.sh, or cargo test --features external-servers"
)]
#[tokio::test]
async fn tollgate_proxy_decides_exactly_as_nginx_limit_req() {
    // The upstream (real time): answers 200 to everything.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = upstream.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(upstream, axum::Router::new().fallback(|| async { "up" }))
            .await
            .unwrap()
    });

    let dir = std::env::temp_dir().join(format!("tollgate-nginx-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let clock = FrozenClock::new(&dir, BASE_S);
    let tg_port = free_port();

    let zones: String = ZONES
        .iter()
        .map(|(z, rate, _, _)| format!("  limit_req_zone $http_x_key zone={z}:1m rate={rate};\n"))
        .collect();
    let locations: String = ZONES
        .iter()
        .map(|(z, _, opts, _)| {
            format!("    location /{z}/ {{ limit_req zone={z} {opts}; proxy_pass http://{up}; }}\n")
        })
        .collect();
    let http = format!(
        "  access_log off;\n  limit_req_status 429;\n{zones}  server {{\n    listen 127.0.0.1:{{port}};\n{locations}  }}\n"
    );
    let nginx = Nginx::start(&dir, &http, Some(&clock));
    let ng_port = nginx.port;
    let routes: String = ZONES
        .iter()
        .map(|(z, _, _, spec)| {
            format!("    - name: {z}\n      match: {{ path_prefix: /{z}/ }}\n      upstream: http://{up}\n      key: header:X-Key\n      policies: [\"{spec}\"]\n      headers: none\n")
        })
        .collect();
    std::fs::write(
        dir.join("tollgate.yaml"),
        format!("proxy:\n  routes:\n{routes}"),
    )
    .unwrap();

    let mut tg = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    tg.args([
        "proxy",
        "--config",
        dir.join("tollgate.yaml").to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{tg_port}"),
    ]);
    clock.apply(&mut tg);
    let log = dir.join("tollgate.log");
    tg.stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut tollgate = Killed(tg.spawn().unwrap());
    let mut line = String::new();
    BufReader::new(tollgate.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening"), "{line}");

    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Empty<bytes::Bytes>>();
    let status = |port: u16, zone: &str, key: &str| {
        let req = http::Request::get(format!("http://127.0.0.1:{port}/{zone}/x"))
            .header("x-key", key)
            .body(Empty::new())
            .unwrap();
        let client = client.clone();
        async move {
            let resp = client.request(req).await.unwrap();
            let code = resp.status().as_u16();
            let _ = resp.into_body().collect().await;
            code
        }
    };

    // A deterministic trace per zone: arrivals a few ms to a few seconds apart.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut t = 0u64;
    let (mut agreed, mut rejected) = (0, 0);
    for (zone, _, _, spec) in ZONES {
        t += 200_000_000; // every zone starts long after the previous one
        for i in 0..120 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += match x % 4 {
                0 => 0,
                1 => x % 50_000,
                2 => x % 600_000,
                _ => x % 4_000_000,
            };
            let key = ["a", "b", "c"][(x >> 20) as usize % 3];
            clock.set(t);
            let n = status(ng_port, zone, key).await;
            let g = status(tg_port, zone, key).await;
            // A 5xx is the proxy failing, not a decision: say so, with its log.
            assert!(
                g < 500,
                "request {i} of {spec}: tollgate answered {g}; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            assert_eq!(
                g, n,
                "request {i} of {spec} (key {key}, t={t}us): tollgate {g}, nginx {n}"
            );
            agreed += 1;
            rejected += usize::from(n == 429);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        rejected > 40 && rejected < agreed - 40,
        "the trace exercises both outcomes: {rejected} of {agreed} rejected"
    );
    eprintln!("{agreed} requests, {rejected} rejected by both, all decisions equal");
}
